//! AMD HIP through `libamdhip64.so`, loaded at run time (as cudarc loads libcuda): the crate
//! builds and runs without ROCm, and says clearly when asked for a HIP GPU that is not there.
//!
//! # Loading
//!
//! `dlopen` tries `libamdhip64.so`, then the sonames of ROCm 7, 6 and 5 (`.so.7`, `.so.6`,
//! `.so.5`); `UGDS_HIP_LIBRARY=/path/to/libamdhip64.so` loads that file instead (a test and
//! debugging hook: the host tests point it at a fake runtime built from
//! `userlib/tests/fake_hip/fake_hip.c`). Symbols are looked up once into [`Api`], a struct of
//! typed function pointers, through `crate::dl` (which says why plain `dlopen`). A loaded
//! runtime is never unloaded: its own threads run, and our host-function trampolines are
//! called from them, for the rest of the process. `hip-sys`
//! is not an option: its build script needs ROCm's headers.
//!
//! # Where the declarations come from
//!
//! Every signature below restates the C declaration in HIP's `include/hip/hip_runtime_api.h`
//! of ROCm 6.x (the header with `hipGetDevicePropertiesR0600`); those functions have the same
//! parameters in ROCm 5.x's header (ROCm/HIP, the `hipMemoryType` without
//! `hipMemoryTypeUnregistered`), apart from `const` on some pointers, which does not change the
//! ABI. `hipError_t`, `hipMemoryType` and `hipMemRangeHandleType` are C enums (`int`);
//! `hipStream_t` is `struct ihipStream_t *`; `hipDeviceptr_t` is `void *`; `hipDevice_t` is
//! `int`; `hipHostFn_t` is `void (*)(void *)`. Flag and enum values are the header's `#define`s
//! and enumerators (ROCm 6.x and, for `hipMemRangeHandleType`, ROCm 7.0):
//!
//! | name | value |
//! | --- | --- |
//! | `hipSuccess` | 0 |
//! | `hipStreamNonBlocking` | 0x01 |
//! | `hipHostMallocPortable` / `Mapped` / `Coherent` | 0x1 / 0x2 / 0x4000_0000 |
//! | `hipStreamWaitValueGte` / `Eq` | 0x0 / 0x1 |
//! | `hipMemRangeHandleTypeDmaBufFd` | 0x1 |
//! | `hipMemRangeFlagDmaBufMappingTypePcie` | 0x1 |
//! | `hipMemoryTypeDevice`, ROCm 6.0 and later (`Unregistered` 0, `Host` 1, `Device` 2, `Managed` 3, `Array` 10, `Unified` 11) | 2 |
//! | `hipMemoryTypeDevice`, ROCm 5.x (`Host` 0, `Device` 1, `Array` 2, `Unified` 3) | 1 |
//!
//! The memory-type numbering changed in ROCm 6.0, so [`Hip::new`] asks `hipRuntimeGetVersion`
//! (`major * 10_000_000 + minor * 100_000 + patch`) which one the loaded runtime uses.
//! `hipMemGetHandleForAddressRange` is looked up but optional (older runtimes lack it): without
//! it, dma-buf export is reported unsupported and GPU memory takes the fallback path.
//!
//! # Not verified on AMD hardware
//!
//! No AMD GPU was available. The host tests (`userlib/tests/hip_fake.rs`) run this module
//! against a fake `libamdhip64.so` that implements the same symbols over host memory; they check
//! the calls, their order and their arguments, not what a real GPU does. Known questions for a
//! first run on ROCm: whether `hipStreamWaitValue32` accepts the device address of
//! `hipHostMalloc(hipHostMallocMapped)` memory (HIP documents memory from
//! `hipExtMallocWithFlags(hipMallocSignalMemory)`; the ROCm implementation looks the pointer up
//! as any memory object), and whether the amdgpu kernel driver exports VRAM dma-bufs that an
//! NVMe device can map peer-to-peer.

use super::stream::{CompletionWord, HostFn, Stream};
use super::{CopyQueue, Gpu, Runtime, Vendor};
use crate::dl::Library;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

/// The environment variable naming the HIP runtime library to load (tests, debugging).
pub const LIBRARY_ENV: &str = "UGDS_HIP_LIBRARY";

/// The names tried, in order, when [`LIBRARY_ENV`] is not set.
const CANDIDATES: [&str; 4] = ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"];

/// `hipError_t` (a C enum).
type HipError = c_int;
/// `hipStream_t` (`struct ihipStream_t *`).
type HipStreamT = *mut c_void;
/// `hipHostFn_t`.
type HipHostFnT = Option<unsafe extern "C" fn(*mut c_void)>;

const HIP_SUCCESS: HipError = 0;
const STREAM_NON_BLOCKING: c_uint = 0x01;
const HOST_MALLOC_PORTABLE: c_uint = 0x1;
const HOST_MALLOC_MAPPED: c_uint = 0x2;
const HOST_MALLOC_COHERENT: c_uint = 0x4000_0000;
const WAIT_VALUE_GTE: c_uint = 0x0;
const WAIT_VALUE_EQ: c_uint = 0x1;
const MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 0x1;
const MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE: c_ulonglong = 0x1;
/// `hipMemoryTypeDevice` from ROCm 6.0 on.
const MEMORY_TYPE_DEVICE_V6: c_int = 2;
/// `hipMemoryTypeDevice` in ROCm 5.x.
const MEMORY_TYPE_DEVICE_V5: c_int = 1;
/// The first `hipRuntimeGetVersion` value of ROCm 6 (6.0.0).
const FIRST_ROCM6_VERSION: c_int = 60_000_000;

/// `hipPointerAttribute_t` (ROCm 5 names the first field `memoryType`, ROCm 6 `type`; the
/// layout is the same).
#[repr(C)]
#[derive(Debug)]
struct PointerAttribute {
    memory_type: c_int,
    device: c_int,
    device_pointer: *mut c_void,
    host_pointer: *mut c_void,
    is_managed: c_int,
    allocation_flags: c_uint,
}

/// The HIP functions this module calls, resolved from one loaded library.
///
/// # Invariants
///
/// Every pointer is the library's function of the name in its comment, and has the C
/// signature written there (checked against the header, see the module docs). The library is
/// never unloaded, so the pointers stay valid for the life of the process.
#[derive(Debug)]
pub struct Api {
    /// Where it was loaded from.
    path: String,
    /// `hipError_t hipInit(unsigned int flags)`.
    init: unsafe extern "C" fn(c_uint) -> HipError,
    /// `hipError_t hipRuntimeGetVersion(int *runtimeVersion)`.
    runtime_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// `hipError_t hipGetDeviceCount(int *count)`.
    get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// `hipError_t hipSetDevice(int deviceId)`.
    set_device: unsafe extern "C" fn(c_int) -> HipError,
    /// `hipError_t hipGetDevice(int *deviceId)`.
    get_device: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// `hipError_t hipDeviceGet(hipDevice_t *device, int ordinal)`.
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> HipError,
    /// `hipError_t hipDeviceGetName(char *name, int len, hipDevice_t device)`.
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    /// `const char *hipGetErrorName(hipError_t hip_error)`.
    get_error_name: unsafe extern "C" fn(HipError) -> *const c_char,
    /// `hipError_t hipMalloc(void **ptr, size_t size)`.
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    /// `hipError_t hipFree(void *ptr)`.
    free: unsafe extern "C" fn(*mut c_void) -> HipError,
    /// `hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags)`.
    host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError,
    /// `hipError_t hipHostFree(void *ptr)`.
    host_free: unsafe extern "C" fn(*mut c_void) -> HipError,
    /// `hipError_t hipHostGetDevicePointer(void **devPtr, void *hstPtr, unsigned int flags)`.
    host_get_device_pointer: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint) -> HipError,
    /// `hipError_t hipPointerGetAttributes(hipPointerAttribute_t *attributes, const void *ptr)`.
    pointer_get_attributes: unsafe extern "C" fn(*mut PointerAttribute, *const c_void) -> HipError,
    /// `hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags)`.
    stream_create_with_flags: unsafe extern "C" fn(*mut HipStreamT, c_uint) -> HipError,
    /// `hipError_t hipStreamDestroy(hipStream_t stream)`.
    stream_destroy: unsafe extern "C" fn(HipStreamT) -> HipError,
    /// `hipError_t hipStreamSynchronize(hipStream_t stream)`.
    stream_synchronize: unsafe extern "C" fn(HipStreamT) -> HipError,
    /// `hipError_t hipMemcpyHtoDAsync(hipDeviceptr_t dst, const void *src, size_t sizeBytes,
    /// hipStream_t stream)` (ROCm 5 declares `src` without `const`).
    memcpy_htod_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, HipStreamT) -> HipError,
    /// `hipError_t hipMemcpyDtoHAsync(void *dst, hipDeviceptr_t src, size_t sizeBytes,
    /// hipStream_t stream)`.
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, HipStreamT) -> HipError,
    /// `hipError_t hipLaunchHostFunc(hipStream_t stream, hipHostFn_t fn, void *userData)`.
    launch_host_func: unsafe extern "C" fn(HipStreamT, HipHostFnT, *mut c_void) -> HipError,
    /// `hipError_t hipStreamWaitValue32(hipStream_t stream, void *ptr, uint32_t value,
    /// unsigned int flags, uint32_t mask)`.
    stream_wait_value32: unsafe extern "C" fn(HipStreamT, *mut c_void, u32, c_uint, u32) -> HipError,
    /// `hipError_t hipMemGetHandleForAddressRange(void *handle, hipDeviceptr_t dptr, size_t size,
    /// hipMemRangeHandleType handleType, unsigned long long flags)`; absent in older runtimes.
    mem_get_handle_for_address_range:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, c_ulonglong) -> HipError>,
    /// `hipError_t hipStreamGetDevice(hipStream_t stream, hipDevice_t *device)`; absent in
    /// older runtimes.
    stream_get_device: Option<unsafe extern "C" fn(HipStreamT, *mut c_int) -> HipError>,
}

// SAFETY: the struct holds function pointers into a library that is never unloaded, and a
// string; HIP's API is thread-safe.
unsafe impl Send for Api {}
// SAFETY: as above; nothing in it is mutated after loading.
unsafe impl Sync for Api {}

/// Resolves a required symbol as the function type `$ty` (or returns the missing name).
macro_rules! required {
    ($lib:expr, $name:literal, $ty:ty) => {
        // SAFETY: the symbol is HIP's function of this name and `$ty` restates its C
        // signature (see the field's comment); the library is never closed once resolved.
        match unsafe { $lib.function::<$ty>($name) } {
            Some(f) => f,
            None => return Err($name.to_string_lossy().into_owned()),
        }
    };
}

impl Api {
    /// Resolves every symbol from the library `lib` (loaded from `path`); the name of the first
    /// missing required symbol on failure.
    fn resolve(lib: &Library, path: &str) -> std::result::Result<Api, String> {
        // SAFETY: `hipError_t hipMemGetHandleForAddressRange(void *handle, hipDeviceptr_t ptr,
        // size_t size, hipMemRangeHandleType type, unsigned long long flags)` (optional: ROCm
        // 6.2+); the library is never closed once resolved.
        let get_handle = unsafe {
            lib.function::<unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, c_ulonglong) -> HipError>(
                c"hipMemGetHandleForAddressRange",
            )
        };
        // SAFETY: `hipError_t hipStreamGetDevice(hipStream_t stream, hipDevice_t *device)`
        // (optional: ROCm 5.6+); the library is never closed once resolved.
        let stream_get_device =
            unsafe { lib.function::<unsafe extern "C" fn(HipStreamT, *mut c_int) -> HipError>(c"hipStreamGetDevice") };
        Ok(Api {
            path: path.to_string(),
            stream_get_device,
            init: required!(lib, c"hipInit", unsafe extern "C" fn(c_uint) -> HipError),
            runtime_get_version: required!(lib, c"hipRuntimeGetVersion", unsafe extern "C" fn(*mut c_int) -> HipError),
            get_device_count: required!(lib, c"hipGetDeviceCount", unsafe extern "C" fn(*mut c_int) -> HipError),
            set_device: required!(lib, c"hipSetDevice", unsafe extern "C" fn(c_int) -> HipError),
            get_device: required!(lib, c"hipGetDevice", unsafe extern "C" fn(*mut c_int) -> HipError),
            device_get: required!(lib, c"hipDeviceGet", unsafe extern "C" fn(*mut c_int, c_int) -> HipError),
            device_get_name: required!(
                lib,
                c"hipDeviceGetName",
                unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError
            ),
            get_error_name: required!(lib, c"hipGetErrorName", unsafe extern "C" fn(HipError) -> *const c_char),
            malloc: required!(lib, c"hipMalloc", unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError),
            free: required!(lib, c"hipFree", unsafe extern "C" fn(*mut c_void) -> HipError),
            host_malloc: required!(
                lib,
                c"hipHostMalloc",
                unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError
            ),
            host_free: required!(lib, c"hipHostFree", unsafe extern "C" fn(*mut c_void) -> HipError),
            host_get_device_pointer: required!(
                lib,
                c"hipHostGetDevicePointer",
                unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint) -> HipError
            ),
            pointer_get_attributes: required!(
                lib,
                c"hipPointerGetAttributes",
                unsafe extern "C" fn(*mut PointerAttribute, *const c_void) -> HipError
            ),
            stream_create_with_flags: required!(
                lib,
                c"hipStreamCreateWithFlags",
                unsafe extern "C" fn(*mut HipStreamT, c_uint) -> HipError
            ),
            stream_destroy: required!(lib, c"hipStreamDestroy", unsafe extern "C" fn(HipStreamT) -> HipError),
            stream_synchronize: required!(lib, c"hipStreamSynchronize", unsafe extern "C" fn(HipStreamT) -> HipError),
            memcpy_htod_async: required!(
                lib,
                c"hipMemcpyHtoDAsync",
                unsafe extern "C" fn(*mut c_void, *const c_void, usize, HipStreamT) -> HipError
            ),
            memcpy_dtoh_async: required!(
                lib,
                c"hipMemcpyDtoHAsync",
                unsafe extern "C" fn(*mut c_void, *mut c_void, usize, HipStreamT) -> HipError
            ),
            launch_host_func: required!(
                lib,
                c"hipLaunchHostFunc",
                unsafe extern "C" fn(HipStreamT, HipHostFnT, *mut c_void) -> HipError
            ),
            stream_wait_value32: required!(
                lib,
                c"hipStreamWaitValue32",
                unsafe extern "C" fn(HipStreamT, *mut c_void, u32, c_uint, u32) -> HipError
            ),
            mem_get_handle_for_address_range: get_handle,
        })
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Turns a HIP status into a result naming the call and the status.
    fn check(&self, op: &'static str, r: HipError) -> Result<()> {
        if r == HIP_SUCCESS {
            return Ok(());
        }
        // SAFETY: hipGetErrorName takes any value and returns NULL or a static string.
        let name = unsafe { (self.get_error_name)(r) };
        let reason = if name.is_null() {
            format!("hipError_t {r}")
        } else {
            // SAFETY: a NUL-terminated static string from the runtime.
            format!("{} ({r})", unsafe { CStr::from_ptr(name) }.to_string_lossy())
        };
        Err(Error::Gpu { op, reason })
    }
}

/// Libraries loaded so far, by the name they were asked for (never unloaded: see [`Api`]).
static LOADED: Mutex<Vec<(String, &'static Api)>> = Mutex::new(Vec::new());

/// Loads the HIP runtime: the file [`LIBRARY_ENV`] names, or the first of the usual sonames
/// that loads. Failures are not remembered, so a later call may succeed.
pub fn api() -> Result<&'static Api> {
    let names: Vec<String> = match std::env::var(LIBRARY_ENV) {
        Ok(p) if !p.is_empty() => vec![p],
        _ => CANDIDATES.iter().map(|s| s.to_string()).collect(),
    };
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    let mut why = Vec::new();
    for name in &names {
        if let Some((_, api)) = loaded.iter().find(|(n, _)| n == name) {
            return Ok(api);
        }
        let lib = match Library::open(name) {
            Ok(lib) => lib,
            Err(e) => {
                why.push(e);
                continue;
            }
        };
        match Api::resolve(&lib, name) {
            Ok(api) => {
                // INVARIANT: the library stays loaded (never dlclose'd) from here on.
                let api: &'static Api = Box::leak(Box::new(api));
                loaded.push((name.clone(), api));
                return Ok(api);
            }
            Err(sym) => {
                why.push(format!("{name} has no {sym} (not a HIP runtime, or too old)"));
                // SAFETY: `resolve` failed, so no pointer from this library was kept.
                unsafe { lib.close() };
            }
        }
    }
    Err(Error::Unsupported {
        what: "HIP",
        why: format!("the HIP runtime library (libamdhip64.so) could not be loaded: {}", why.join("; ")),
        fix: "install ROCm's HIP runtime and put its lib directory (e.g. /opt/rocm/lib) on the loader path, \
              or set UGDS_HIP_LIBRARY to the library's path",
    })
}

/// Whether a HIP runtime library can be loaded here.
pub fn runtime_present() -> bool {
    api().is_ok()
}

/// One HIP device of one loaded runtime.
#[derive(Debug)]
pub struct Dev {
    api: &'static Api,
    ordinal: c_int,
    /// `hipRuntimeGetVersion`.
    version: c_int,
    /// The value of `hipMemoryTypeDevice` in this runtime's numbering.
    device_type: c_int,
}

impl Dev {
    /// Makes the device current on this thread, and leaves it so (for callers that launch their
    /// own work on it; the library's own operations use [`Dev::enter`]).
    pub fn bind(&self) -> Result<()> {
        // SAFETY: plain runtime call; the ordinal was checked in `Hip::new`.
        self.api.check("hipSetDevice", unsafe { (self.api.set_device)(self.ordinal) })
    }

    /// Makes the device current for one operation: HIP's current device is per thread, and the
    /// caller's (`hipSetDevice(N)` of the application's own) is current again when the result
    /// is dropped. Costs one `hipGetDevice` where this device is current already.
    pub fn enter(&self) -> Result<CallerDevice> {
        let mut prev: c_int = -1;
        // SAFETY: out-pointer to a local.
        let known = unsafe { (self.api.get_device)(&mut prev) } == HIP_SUCCESS && prev >= 0;
        if known && prev == self.ordinal {
            return Ok(CallerDevice(None));
        }
        self.bind()?;
        Ok(CallerDevice(known.then_some((self.api, prev))))
    }
}

/// The calling thread's current HIP device, put back when this is dropped (see [`Dev::enter`]).
#[must_use = "the caller's device is put back when this is dropped"]
pub struct CallerDevice(Option<(&'static Api, c_int)>);

impl Drop for CallerDevice {
    fn drop(&mut self) {
        if let Some((api, d)) = self.0 {
            // SAFETY: plain runtime call with the device the thread had on entry.
            unsafe { (api.set_device)(d) };
        }
    }
}

/// Every HIP device's [`Gpu`] so far, by ordinal (one staging pool and one identity per device).
static DEVICES: Mutex<Vec<(i32, Hip, Arc<Gpu>)>> = Mutex::new(Vec::new());

/// Device `ordinal` of the HIP runtime with its [`Gpu`] (one per device in the process).
pub fn device_runtime(ordinal: i32) -> Result<(Hip, Arc<Gpu>)> {
    let mut all = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, h, g)) = all.iter().find(|(o, _, _)| *o == ordinal) {
        return Ok((h.clone(), g.clone()));
    }
    let h = Hip::new(ordinal)?;
    let g = Gpu::with_runtime(Arc::new(h.clone()));
    all.push((ordinal, h.clone(), g.clone()));
    Ok((h, g))
}

/// The [`Gpu`] of HIP device `ordinal`.
pub fn device_gpu(ordinal: i32) -> Result<Arc<Gpu>> {
    device_runtime(ordinal).map(|(_, g)| g)
}

/// The calling thread's current HIP device (`hipGetDevice`: what `hipSetDevice` selected on this
/// thread; 0 where it selected none).
pub fn current_device() -> Result<i32> {
    let api = api()?;
    let mut d: c_int = 0;
    // SAFETY: plain runtime calls; out-pointer to a local.
    unsafe {
        api.check("hipInit", (api.init)(0))?;
        api.check("hipGetDevice", (api.get_device)(&mut d))?;
    }
    Ok(d)
}

/// The [`Gpu`] of the calling thread's current HIP device (see [`current_device`]), as the CUDA
/// side serves the thread's current context.
pub fn current_gpu() -> Result<Arc<Gpu>> {
    device_gpu(current_device()?)
}

/// The [`Gpu`] whose device memory `ptr` is, on whichever HIP device holds it; `None` for
/// memory that is not HIP device memory, or when no HIP runtime loads.
pub fn gpu_of_pointer(ptr: u64) -> Result<Option<Arc<Gpu>>> {
    if ptr == 0 || !runtime_present() {
        return Ok(None);
    }
    // A HIP library without a device (an NVIDIA machine's, say) holds no memory.
    let Ok((h0, _)) = device_runtime(0) else { return Ok(None) };
    match h0.device_of(ptr) {
        Some(d) => Ok(Some(device_gpu(d)?)),
        None => Ok(None),
    }
}

/// The HIP device a stream belongs to (`hipStreamGetDevice`), with its runtime; `None` where
/// the runtime lacks the call (the caller decides by the memory then).
pub fn stream_runtime(stream: usize) -> Result<Option<(Hip, Arc<Gpu>)>> {
    let (h0, _) = device_runtime(0)?;
    let Some(get) = h0.d.api.stream_get_device else { return Ok(None) };
    let mut dev: c_int = -1;
    // SAFETY: the caller's stream handle (or a default-stream value); out-pointer to a local.
    h0.d.api.check("hipStreamGetDevice", unsafe { get(stream as HipStreamT, &mut dev) })?;
    device_runtime(dev).map(Some)
}

/// A HIP device as a [`Runtime`].
#[derive(Debug, Clone)]
pub struct Hip {
    d: Arc<Dev>,
}

impl Hip {
    /// Device `ordinal` of the HIP runtime (loads the library; a clear error when there is none).
    pub fn new(ordinal: i32) -> Result<Hip> {
        let api = api()?;
        let mut count = 0;
        let mut version = 0;
        // SAFETY: plain runtime calls with out-pointers to locals.
        unsafe {
            api.check("hipInit", (api.init)(0))?;
            api.check("hipRuntimeGetVersion", (api.runtime_get_version)(&mut version))?;
            // hipGetDeviceCount fails with hipErrorNoDevice when there is none.
            let r = (api.get_device_count)(&mut count);
            if r != HIP_SUCCESS {
                count = 0;
            }
        }
        if ordinal < 0 || ordinal >= count {
            return Err(Error::Unsupported {
                what: "HIP",
                why: format!("{} has no device {ordinal} ({count} found)", api.path),
                fix: "check that the amdgpu driver is loaded and that /dev/kfd and /dev/dri are accessible",
            });
        }
        let device_type = if version >= FIRST_ROCM6_VERSION { MEMORY_TYPE_DEVICE_V6 } else { MEMORY_TYPE_DEVICE_V5 };
        let h = Hip { d: Arc::new(Dev { api, ordinal, version, device_type }) };
        // The device must be selectable; the caller's stays current.
        drop(h.d.enter()?);
        Ok(h)
    }

    /// The device whose (unmanaged) device memory `ptr` is, on any device of this runtime.
    pub fn device_of(&self, ptr: u64) -> Option<i32> {
        if ptr == 0 {
            return None;
        }
        let mut a = PointerAttribute {
            memory_type: -1,
            device: -1,
            device_pointer: std::ptr::null_mut(),
            host_pointer: std::ptr::null_mut(),
            is_managed: 0,
            allocation_flags: 0,
        };
        // SAFETY: `a` is a hipPointerAttribute_t the runtime fills; any pointer value may be
        // asked about (unknown ones give an error, or hipMemoryTypeUnregistered in ROCm 6).
        let r = unsafe { (self.d.api.pointer_get_attributes)(&mut a, ptr as *const c_void) };
        (r == HIP_SUCCESS && a.memory_type == self.d.device_type && a.is_managed == 0).then_some(a.device)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> i32 {
        self.d.ordinal
    }

    /// The runtime's version (`major * 10_000_000 + minor * 100_000 + patch`).
    pub fn runtime_version(&self) -> i32 {
        self.d.version
    }

    /// Where the runtime library was loaded from.
    pub fn library_path(&self) -> &str {
        self.d.api.path()
    }

    /// Wraps an existing `hipStream_t` of this device (not destroyed on drop).
    ///
    /// # Safety
    ///
    /// `raw` must be a stream of this device that outlives the result.
    pub unsafe fn wrap_stream(&self, raw: usize) -> Arc<HipStream> {
        Arc::new(HipStream { d: self.d.clone(), raw: raw as HipStreamT, owned: false })
    }

    /// A new non-blocking stream.
    pub fn stream(&self) -> Result<Arc<HipStream>> {
        let raw = self.create_stream()?;
        Ok(Arc::new(HipStream { d: self.d.clone(), raw, owned: true }))
    }

    fn create_stream(&self) -> Result<HipStreamT> {
        let _dev = self.d.enter()?;
        let mut s = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the device is current.
        self.d.api.check("hipStreamCreateWithFlags", unsafe {
            (self.d.api.stream_create_with_flags)(&mut s, STREAM_NON_BLOCKING)
        })?;
        Ok(s)
    }
}

impl Runtime for Hip {
    fn vendor(&self) -> Vendor {
        Vendor::Hip
    }

    fn device_name(&self) -> String {
        let api = self.d.api;
        let mut dev = 0;
        let mut buf = [0 as c_char; 256];
        // SAFETY: out-pointer to a local, and the buffer's length is passed (one byte is kept
        // for the terminator, which the buffer's last byte always is).
        let ok = unsafe {
            (api.device_get)(&mut dev, self.d.ordinal) == HIP_SUCCESS
                && (api.device_get_name)(buf.as_mut_ptr(), 255, dev) == HIP_SUCCESS
        };
        if !ok {
            return "unknown HIP device".into();
        }
        // SAFETY: NUL-terminated: the runtime writes at most 255 bytes, and buf[255] is 0.
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }

    fn alloc(&self, len: usize) -> Result<u64> {
        let _dev = self.d.enter()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the device is current.
        self.d.api.check("hipMalloc", unsafe { (self.d.api.malloc)(&mut p, len) })?;
        Ok(p as u64)
    }

    fn free(&self, ptr: u64, _len: usize) {
        if let Ok(_dev) = self.d.enter() {
            // SAFETY: `ptr` came from hipMalloc and is no longer used.
            unsafe { (self.d.api.free)(ptr as *mut c_void) };
        }
    }

    fn is_device_memory(&self, ptr: u64) -> bool {
        self.device_of(ptr) == Some(self.d.ordinal)
    }

    fn alloc_pinned(&self, len: usize) -> Result<*mut u8> {
        let _dev = self.d.enter()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the device is current.
        self.d.api.check("hipHostMalloc", unsafe { (self.d.api.host_malloc)(&mut p, len, HOST_MALLOC_PORTABLE) })?;
        Ok(p as *mut u8)
    }

    fn free_pinned(&self, ptr: *mut u8, _len: usize) {
        if let Ok(_dev) = self.d.enter() {
            // SAFETY: `ptr` came from hipHostMalloc and is no longer used.
            unsafe { (self.d.api.host_free)(ptr as *mut c_void) };
        }
    }

    fn copy_queue(&self) -> Result<Box<dyn CopyQueue>> {
        let stream = self.create_stream()?;
        Ok(Box::new(HipCopyQueue { d: self.d.clone(), stream }))
    }

    fn export_dmabuf(&self, ptr: u64, len: usize) -> Result<OwnedFd> {
        let export = self.d.api.mem_get_handle_for_address_range.ok_or_else(|| Error::Unsupported {
            what: "dma-buf export of HIP memory",
            why: self.dmabuf_support().err().unwrap_or_default(),
            fix: "use a ROCm release whose libamdhip64 has hipMemGetHandleForAddressRange, or allow the fallback path",
        })?;
        if !ptr.is_multiple_of(4096) || !len.is_multiple_of(4096) {
            return Err(Error::invalid("ptr", "dma-buf export needs a page-aligned address and length"));
        }
        let _dev = self.d.enter()?;
        let mut fd: c_int = -1;
        // Ask for a PCIe mapping first, which peer devices can reach; runtimes that do not know
        // the flag get the default.
        let mut r = Err(Error::invalid("flags", "unreachable"));
        for flags in [MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE, 0] {
            // SAFETY: `fd` is an out-pointer to an int, as the dma-buf handle type requires;
            // the range is the caller's device memory (checked by the runtime).
            r = self.d.api.check("hipMemGetHandleForAddressRange", unsafe {
                export(
                    &mut fd as *mut c_int as *mut c_void,
                    ptr as *mut c_void,
                    len,
                    MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    flags,
                )
            });
            if r.is_ok() {
                break;
            }
        }
        r?;
        if fd < 0 {
            return Err(Error::Gpu { op: "hipMemGetHandleForAddressRange", reason: format!("returned fd {fd}") });
        }
        // SAFETY: the runtime returned a new dma-buf fd that the caller now owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn dmabuf_support(&self) -> std::result::Result<(), String> {
        match self.d.api.mem_get_handle_for_address_range {
            Some(_) => Ok(()),
            None => Err(format!("{} has no hipMemGetHandleForAddressRange (too old a ROCm)", self.d.api.path)),
        }
    }

    fn new_stream(&self) -> Result<Arc<dyn Stream>> {
        Ok(self.stream()?)
    }
}

/// A HIP stream used for staging copies.
#[derive(Debug)]
struct HipCopyQueue {
    d: Arc<Dev>,
    stream: HipStreamT,
}

// SAFETY: HIP streams may be used from any thread; each call makes the device current first.
unsafe impl Send for HipCopyQueue {}

impl CopyQueue for HipCopyQueue {
    unsafe fn to_device(&mut self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        let _dev = self.d.enter()?;
        // SAFETY: the caller guarantees both ranges until `wait`; the stream is ours.
        self.d.api.check("hipMemcpyHtoDAsync", unsafe {
            (self.d.api.memcpy_htod_async)(dst as *mut c_void, src as *const c_void, len, self.stream)
        })
    }

    unsafe fn to_host(&mut self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        let _dev = self.d.enter()?;
        // SAFETY: as above.
        self.d.api.check("hipMemcpyDtoHAsync", unsafe {
            (self.d.api.memcpy_dtoh_async)(dst as *mut c_void, src as *mut c_void, len, self.stream)
        })
    }

    fn wait(&mut self) -> Result<()> {
        let _dev = self.d.enter()?;
        // SAFETY: the stream is ours and live.
        self.d.api.check("hipStreamSynchronize", unsafe { (self.d.api.stream_synchronize)(self.stream) })
    }
}

impl Drop for HipCopyQueue {
    fn drop(&mut self) {
        if let Ok(_dev) = self.d.enter() {
            // SAFETY: the stream is ours; queued copies finish before it is destroyed.
            unsafe {
                (self.d.api.stream_synchronize)(self.stream);
                (self.d.api.stream_destroy)(self.stream);
            }
        }
    }
}

/// A HIP stream as a [`Stream`].
#[derive(Debug)]
pub struct HipStream {
    d: Arc<Dev>,
    raw: HipStreamT,
    owned: bool,
}

// SAFETY: HIP streams may be used from any thread; each call makes the device current first.
unsafe impl Send for HipStream {}
// SAFETY: as above; HIP's API is thread-safe.
unsafe impl Sync for HipStream {}

/// Pinned, device-mapped host memory holding a completion word; freed with the word.
struct PinnedWord {
    d: Arc<Dev>,
    ptr: *mut c_void,
}

// SAFETY: the pointer is only freed on drop; the word in it is accessed atomically.
unsafe impl Send for PinnedWord {}
// SAFETY: as above.
unsafe impl Sync for PinnedWord {}

impl Drop for PinnedWord {
    fn drop(&mut self) {
        if let Ok(_dev) = self.d.enter() {
            // SAFETY: `ptr` came from hipHostMalloc and the word that used it is gone.
            unsafe { (self.d.api.host_free)(self.ptr) };
        }
    }
}

/// Runs a boxed host function queued by `Stream::host_fn`.
unsafe extern "C" fn run_host_fn(data: *mut c_void) {
    // SAFETY: `data` is the Box<HostFn> leaked by `host_fn`, run exactly once by the runtime.
    let f = unsafe { Box::from_raw(data as *mut HostFn) };
    // A panic must not unwind into the runtime.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

impl HipStream {
    fn wait_value(&self, addr: u64, value: u32, flags: c_uint, mask: u32) -> Result<()> {
        // SAFETY: `addr` is the device address of a mapped pinned word that outlives the wait
        // (the caller keeps the word until the stream has passed it).
        self.d.api.check("hipStreamWaitValue32", unsafe {
            (self.d.api.stream_wait_value32)(self.raw, addr as *mut c_void, value, flags, mask)
        })
    }
}

impl Stream for HipStream {
    fn completion_word(&self) -> Result<CompletionWord> {
        let _dev = self.d.enter()?;
        let mut p = std::ptr::null_mut();
        // Coherent (fine-grained): the device polls a word the CPU writes.
        let flags = HOST_MALLOC_PORTABLE | HOST_MALLOC_MAPPED | HOST_MALLOC_COHERENT;
        // SAFETY: out-pointer to a local; the device is current.
        self.d.api.check("hipHostMalloc", unsafe { (self.d.api.host_malloc)(&mut p, 64, flags) })?;
        if p.is_null() || !(p as usize).is_multiple_of(4) {
            return Err(Error::Gpu { op: "hipHostMalloc", reason: format!("returned {p:?}") });
        }
        let owner = PinnedWord { d: self.d.clone(), ptr: p };
        let mut dev = std::ptr::null_mut();
        // SAFETY: `p` is mapped pinned memory (hipHostMallocMapped) of this device.
        self.d.api.check("hipHostGetDevicePointer", unsafe { (self.d.api.host_get_device_pointer)(&mut dev, p, 0) })?;
        let word = p as *const AtomicU32;
        // SAFETY: fresh, 4-byte-aligned (checked) pinned memory of 64 bytes, zeroed here before
        // first use, owned by `owner`, which the word keeps.
        unsafe {
            (*word).store(0, std::sync::atomic::Ordering::Release);
            Ok(CompletionWord::new(word, dev as u64, Box::new(owner)).mapped_by(Vendor::Hip))
        }
    }

    fn host_fn(&self, f: HostFn) -> Result<()> {
        let _dev = self.d.enter()?;
        let data = Box::into_raw(Box::new(f)) as *mut c_void;
        // SAFETY: `run_host_fn` takes back the box exactly once.
        let r = self
            .d
            .api
            .check("hipLaunchHostFunc", unsafe { (self.d.api.launch_host_func)(self.raw, Some(run_host_fn), data) });
        if r.is_err() {
            // SAFETY: the runtime did not take the function: free it here.
            drop(unsafe { Box::from_raw(data as *mut HostFn) });
        }
        r
    }

    /// HIP's `hipStreamWaitValueGte` compares without wrapping (`*ptr >= value`), where the
    /// trait asks for CUDA's cyclic `>=`. They agree while the word and `value` are within
    /// 2^31 of each other and no wrap lies between them, which holds for any `value` in the
    /// upper half. For a `value` in the lower half the word may still be in the upper half,
    /// before the wrap: the stream first waits for the word's top bit to clear (`Eq` under the
    /// mask 0x8000_0000), then for `>= value`.
    fn wait_word(&self, word: &CompletionWord, value: u32) -> Result<()> {
        let _dev = self.d.enter()?;
        let addr = word.device_addr();
        if value < 0x8000_0000 {
            self.wait_value(addr, 0, WAIT_VALUE_EQ, 0x8000_0000)?;
        }
        self.wait_value(addr, value, WAIT_VALUE_GTE, u32::MAX)
    }

    fn synchronize(&self) -> Result<()> {
        let _dev = self.d.enter()?;
        // SAFETY: a live stream.
        self.d.api.check("hipStreamSynchronize", unsafe { (self.d.api.stream_synchronize)(self.raw) })
    }

    fn raw(&self) -> usize {
        self.raw as usize
    }
}

impl Drop for HipStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Ok(_dev) = self.d.enter() {
            // SAFETY: a stream we created; its queued work finishes before it is destroyed.
            unsafe {
                (self.d.api.stream_synchronize)(self.raw);
                (self.d.api.stream_destroy)(self.raw);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_attribute_has_the_headers_layout() {
        assert_eq!(std::mem::size_of::<PointerAttribute>(), 32);
        assert_eq!(std::mem::offset_of!(PointerAttribute, memory_type), 0);
        assert_eq!(std::mem::offset_of!(PointerAttribute, device), 4);
        assert_eq!(std::mem::offset_of!(PointerAttribute, device_pointer), 8);
        assert_eq!(std::mem::offset_of!(PointerAttribute, host_pointer), 16);
        assert_eq!(std::mem::offset_of!(PointerAttribute, is_managed), 24);
        assert_eq!(std::mem::offset_of!(PointerAttribute, allocation_flags), 28);
    }
}

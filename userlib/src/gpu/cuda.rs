//! CUDA through the driver API, loaded at run time (cudarc's dynamic loading): the crate builds
//! and runs without CUDA, and says so clearly when asked for a GPU that is not there.

use super::stream::{CompletionWord, HostFn, Stream};
use super::{CopyQueue, Runtime, ToDevice, Vendor};
use crate::error::{Error, Result};
use cudarc::driver::sys as cu;
use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

mod ctx;
pub use ctx::{
    context_of_stream, current_context_id, current_gpu, current_runtime, device_gpu, device_runtime, gpu_of_pointer,
    place_of_pointer, stream_runtime, wrap_stream, CallerContext, Ctx, PointerPlace,
};

/// Turns a driver status into a result naming the call and the status.
fn check(op: &'static str, r: cu::CUresult) -> Result<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string (or leaves it null).
    unsafe { cu::cuGetErrorName(r, &mut name) };
    let reason = if name.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: a NUL-terminated static string from the driver.
        unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()
    };
    Err(Error::Gpu { op, reason })
}

/// Whether the CUDA driver library can be loaded here.
pub fn driver_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: only tries to open the library (once; the answer does not change).
    *PRESENT.get_or_init(|| unsafe { cu::is_culib_present() })
}

/// A CUDA context (a device's primary context, or one the application created) as a
/// [`Runtime`]: everything it does binds that context first.
#[derive(Debug, Clone)]
pub struct Cuda {
    c: Arc<Ctx>,
}

impl Cuda {
    /// Retains the primary context of device `ordinal` and makes it current. Most callers want
    /// [`device_gpu`], [`current_gpu`] or [`gpu_of_pointer`] instead: one [`crate::Gpu`] per
    /// context in the process.
    pub fn new(ordinal: i32) -> Result<Cuda> {
        let c = Cuda::from_ctx(Arc::new(Ctx::primary(ordinal)?));
        c.bind()?;
        Ok(c)
    }

    /// The runtime of a context.
    pub(crate) fn from_ctx(c: Arc<Ctx>) -> Cuda {
        Cuda { c }
    }

    /// Makes the context current on this thread, and leaves it so (for callers that launch
    /// their own work in it).
    pub fn bind(&self) -> Result<()> {
        self.c.bind()
    }

    /// Makes the context current for one operation: the caller's comes back on drop.
    fn enter(&self) -> Result<CallerContext> {
        self.c.enter()
    }

    /// The context (for callers that launch their own work).
    pub fn context(&self) -> &Arc<Ctx> {
        &self.c
    }

    /// A device attribute.
    pub fn attribute(&self, a: cu::CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: out-pointer to a local.
        check("cuDeviceGetAttribute", unsafe { cu::cuDeviceGetAttribute(&mut v, a, self.c.dev()) })?;
        Ok(v)
    }

    /// The driver's version (e.g. 13000).
    pub fn driver_version() -> Result<i32> {
        let mut v = 0;
        // SAFETY: out-pointer to a local.
        check("cuDriverGetVersion", unsafe { cu::cuDriverGetVersion(&mut v) })?;
        Ok(v)
    }

    /// The device's PCI address (domain:bus:device.function).
    pub fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as std::ffi::c_char; 32];
        // SAFETY: the buffer's length is passed.
        check("cuDeviceGetPCIBusId", unsafe { cu::cuDeviceGetPCIBusId(buf.as_mut_ptr(), 32, self.c.dev()) })?;
        // SAFETY: the driver NUL-terminates within the length.
        Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().to_lowercase())
    }

    /// Wraps an existing `CUstream` of this context (not destroyed on drop).
    ///
    /// # Safety
    ///
    /// `raw` must be a stream of this context (or a default-stream value, used with this
    /// context current) that outlives the result.
    pub unsafe fn wrap_stream(&self, raw: usize) -> Arc<CudaStream> {
        Arc::new(CudaStream { cuda: self.c.clone(), raw: raw as cu::CUstream, owned: false })
    }

    /// A new non-blocking stream.
    pub fn stream(&self) -> Result<Arc<CudaStream>> {
        let _ctx = self.c.enter()?;
        let mut s = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the context is current.
        check("cuStreamCreate", unsafe {
            cu::cuStreamCreate(&mut s, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Arc::new(CudaStream { cuda: self.c.clone(), raw: s, owned: true }))
    }
}

impl Runtime for Cuda {
    fn vendor(&self) -> Vendor {
        Vendor::Cuda
    }

    fn device_name(&self) -> String {
        let mut buf = [0 as std::ffi::c_char; 128];
        // SAFETY: the buffer's length is passed; the driver NUL-terminates.
        if unsafe { cu::cuDeviceGetName(buf.as_mut_ptr(), 128, self.c.dev()) } != cu::CUresult::CUDA_SUCCESS {
            return "unknown CUDA device".into();
        }
        // SAFETY: NUL-terminated by the driver.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }

    fn alloc(&self, len: usize) -> Result<u64> {
        let _ctx = self.enter()?;
        let mut p = 0;
        // SAFETY: out-pointer to a local; the context is current.
        check("cuMemAlloc", unsafe { cu::cuMemAlloc_v2(&mut p, len) })?;
        Ok(p)
    }

    fn free(&self, ptr: u64, _len: usize) {
        if let Ok(_ctx) = self.enter() {
            // SAFETY: `ptr` came from cuMemAlloc and is no longer used.
            unsafe { cu::cuMemFree_v2(ptr) };
        }
    }

    fn is_device_memory(&self, ptr: u64) -> bool {
        // Device memory of this context; memory the driver names no context for (the virtual
        // memory API) belongs to its device's primary context.
        match place_of_pointer(ptr) {
            Ok(PointerPlace::Device { context: 0, device }) => self.c.is_primary() && device == self.c.device(),
            Ok(PointerPlace::Device { context, .. }) => context == self.c.raw(),
            _ => false,
        }
    }

    fn alloc_pinned(&self, len: usize) -> Result<*mut u8> {
        let _ctx = self.enter()?;
        let mut p = std::ptr::null_mut();
        let flags = cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: out-pointer to a local; the context is current.
        check("cuMemHostAlloc", unsafe { cu::cuMemHostAlloc(&mut p, len, flags) })?;
        Ok(p as *mut u8)
    }

    fn free_pinned(&self, ptr: *mut u8, _len: usize) {
        if let Ok(_ctx) = self.enter() {
            // SAFETY: `ptr` came from cuMemHostAlloc and is no longer used.
            unsafe { cu::cuMemFreeHost(ptr as *mut c_void) };
        }
    }

    fn copy_queue(&self) -> Result<Box<dyn CopyQueue>> {
        let _ctx = self.enter()?;
        let mut s = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the context is current.
        check("cuStreamCreate", unsafe {
            cu::cuStreamCreate(&mut s, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Box::new(CudaCopyQueue { ctx: self.c.clone(), stream: s, batch: Default::default() }))
    }

    fn export_dmabuf(&self, ptr: u64, len: usize) -> Result<OwnedFd> {
        self.dmabuf_support().map_err(|why| Error::Unsupported {
            what: "dma-buf export of CUDA memory",
            why,
            fix: "use NVIDIA's open kernel modules (nvidia-open) with CUDA 11.7+, or allow the fallback path",
        })?;
        if !ptr.is_multiple_of(4096) || !len.is_multiple_of(4096) {
            return Err(Error::invalid("ptr", "dma-buf export needs a page-aligned address and length"));
        }
        let _ctx = self.enter()?;
        let ty = cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
        let mut fd: i32 = -1;
        // Ask for a PCIe (BAR) mapping first, which peer devices can reach; older drivers only
        // know the default flags.
        let pcie = cu::CUmemRangeFlags::CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE as u64;
        let mut r = Err(Error::invalid("flags", "unreachable"));
        for flags in [pcie, 0] {
            // SAFETY: `fd` is an out-pointer to an int, as the dma-buf handle type requires.
            r = check("cuMemGetHandleForAddressRange", unsafe {
                cu::cuMemGetHandleForAddressRange(&mut fd as *mut i32 as *mut c_void, ptr, len, ty, flags)
            });
            if r.is_ok() {
                break;
            }
        }
        r?;
        // SAFETY: the driver returned a new dma-buf fd that the caller now owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn dmabuf_support(&self) -> std::result::Result<(), String> {
        match self.attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) {
            Ok(1) => Ok(()),
            Ok(_) => {
                Err("the driver reports no dma-buf support (the proprietary kernel module does not export dma-bufs)"
                    .into())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn new_stream(&self) -> Result<Arc<dyn Stream>> {
        Ok(self.stream()?)
    }
}

/// A CUDA stream used for staging copies.
#[derive(Debug)]
struct CudaCopyQueue {
    ctx: Arc<Ctx>,
    stream: cu::CUstream,
    /// Argument arrays of `cuMemcpyBatchAsync`, kept to avoid allocating per call.
    batch: (Vec<cu::CUdeviceptr>, Vec<cu::CUdeviceptr>, Vec<usize>),
}

/// `cuMemcpyBatchAsync` of CUDA 13 (`_v2`) or of CUDA 12.8/12.9 (which takes `failIdx` before
/// the stream), whichever the driver exports; neither on older drivers.
#[derive(Clone, Copy)]
enum BatchCopy {
    V2(
        unsafe extern "C" fn(
            *mut cu::CUdeviceptr,
            *mut cu::CUdeviceptr,
            *mut usize,
            usize,
            *mut cu::CUmemcpyAttributes,
            *mut usize,
            usize,
            cu::CUstream,
        ) -> cu::CUresult,
    ),
    V1(
        unsafe extern "C" fn(
            *mut cu::CUdeviceptr,
            *mut cu::CUdeviceptr,
            *mut usize,
            usize,
            *mut cu::CUmemcpyAttributes,
            *mut usize,
            usize,
            *mut usize,
            cu::CUstream,
        ) -> cu::CUresult,
    ),
}

/// The driver's batch copy, looked up once (cudarc's wrapper would panic where the symbol is
/// missing, so it is resolved here, where missing means "one call per copy").
fn batch_copy() -> Option<BatchCopy> {
    static F: std::sync::OnceLock<Option<BatchCopy>> = std::sync::OnceLock::new();
    *F.get_or_init(|| {
        // The library cudarc loaded already: dlopen hands back the same one.
        let lib = crate::dl::Library::open("libcuda.so.1").ok()?;
        // SAFETY: the declarations of cuMemcpyBatchAsync_v2 (cuda.h, CUDA 13) and
        // cuMemcpyBatchAsync (CUDA 12.8) that the variants restate; libcuda is never unloaded.
        unsafe {
            lib.function(c"cuMemcpyBatchAsync_v2")
                .map(BatchCopy::V2)
                .or_else(|| lib.function(c"cuMemcpyBatchAsync").map(BatchCopy::V1))
        }
    })
}

// SAFETY: CUDA streams may be used from any thread with their context current.
unsafe impl Send for CudaCopyQueue {}

impl CudaCopyQueue {
    /// Makes the queue's context current for one operation (see [`Ctx::enter`]).
    fn enter(&self) -> Result<CallerContext> {
        self.ctx.enter()
    }
}

impl CopyQueue for CudaCopyQueue {
    unsafe fn to_device(&mut self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        let _ctx = self.enter()?;
        // SAFETY: the caller guarantees the ranges; the stream is ours.
        check("cuMemcpyHtoDAsync", unsafe { cu::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, self.stream) })
    }

    unsafe fn to_device_many(&mut self, copies: &[ToDevice]) -> Result<()> {
        let f = match (copies, batch_copy()) {
            ([], _) => return Ok(()),
            (_, Some(f)) if copies.len() > 1 => f,
            // SAFETY: the caller's promise.
            _ => return unsafe { super::to_device_each(self, copies) },
        };
        let _ctx = self.enter()?;
        let (dsts, srcs, sizes) = &mut self.batch;
        dsts.clear();
        srcs.clear();
        sizes.clear();
        for c in copies {
            dsts.push(c.dst);
            // CAST: a host address, as the driver takes it (unified addressing).
            srcs.push(c.src as usize as cu::CUdeviceptr);
            sizes.push(c.len);
        }
        // One attribute for all: the source (pinned staging the caller leaves alone until the
        // stream reports the copies done) is read in stream order.
        // SAFETY: plain data; all-zero is a valid value of every field, set below.
        let mut attr: cu::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
        attr.srcAccessOrder = cu::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        let mut attr_idx = 0usize;
        let n = copies.len();
        // SAFETY: three arrays of `n` entries, one attribute applying from copy 0; the caller
        // guarantees each copy's ranges; the stream is ours (never the legacy stream, which
        // the call refuses) and its context is current.
        let r = unsafe {
            match f {
                BatchCopy::V2(f) => f(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    n,
                    &mut attr,
                    &mut attr_idx,
                    1,
                    self.stream,
                ),
                BatchCopy::V1(f) => {
                    let mut fail = 0usize;
                    f(
                        dsts.as_mut_ptr(),
                        srcs.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        n,
                        &mut attr,
                        &mut attr_idx,
                        1,
                        &mut fail,
                        self.stream,
                    )
                }
            }
        };
        check("cuMemcpyBatchAsync", r)
    }

    unsafe fn to_host(&mut self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        let _ctx = self.enter()?;
        // SAFETY: the caller guarantees the ranges; the stream is ours.
        check("cuMemcpyDtoHAsync", unsafe { cu::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, self.stream) })
    }

    fn wait(&mut self) -> Result<()> {
        let _ctx = self.enter()?;
        // SAFETY: the stream is ours.
        check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(self.stream) })
    }

    fn poll(&mut self) -> Result<bool> {
        let _ctx = self.enter()?;
        // SAFETY: the stream is ours and its context is current.
        match unsafe { cu::cuStreamQuery(self.stream) } {
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check("cuStreamQuery", r).map(|()| true),
        }
    }

    fn signal(&mut self, word: &CompletionWord, value: u32) -> Result<bool> {
        // Pinned by CUDA (not a CPU stream's plain word), at one address in every context (the
        // stream's context may not be this queue's).
        if !word.device_writable_by(Vendor::Cuda) {
            return Ok(false);
        }
        let _ctx = self.enter()?;
        let flags = cu::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: the word is mapped pinned memory at the same address in every context; its
        // owner keeps it until the stream waiting on it has passed (which this store lets it).
        check("cuStreamWriteValue32", unsafe {
            cu::cuStreamWriteValue32_v2(self.stream, word.device_addr(), value, flags)
        })?;
        Ok(true)
    }
}

impl Drop for CudaCopyQueue {
    fn drop(&mut self) {
        if let Ok(_ctx) = self.enter() {
            // SAFETY: the stream is ours; pending work finishes before it is destroyed.
            unsafe { cu::cuStreamDestroy_v2(self.stream) };
        }
    }
}

/// A CUDA stream as a [`Stream`].
#[derive(Debug)]
pub struct CudaStream {
    cuda: Arc<Ctx>,
    raw: cu::CUstream,
    owned: bool,
}

// SAFETY: CUDA streams may be used from any thread with their context current.
unsafe impl Send for CudaStream {}
// SAFETY: as above; the driver API is thread-safe.
unsafe impl Sync for CudaStream {}

/// Pinned host memory holding a completion word; freed with the word.
struct PinnedWord {
    cuda: Arc<Ctx>,
    ptr: *mut c_void,
}

// SAFETY: the pointer is only freed on drop; the word is accessed atomically.
unsafe impl Send for PinnedWord {}
// SAFETY: as above.
unsafe impl Sync for PinnedWord {}

impl Drop for PinnedWord {
    fn drop(&mut self) {
        if let Ok(_ctx) = self.cuda.enter() {
            // SAFETY: `ptr` came from cuMemHostAlloc and the word using it is gone.
            unsafe { cu::cuMemFreeHost(self.ptr) };
        }
    }
}

/// A stream's wait for the 32-bit word at device address `addr` to reach `value` (cyclic `>=`),
/// as an entry of [`batch_mem_ops`].
fn wait_op(addr: cu::CUdeviceptr, value: u32) -> cu::CUstreamBatchMemOpParams {
    // SAFETY: plain data for which all-zero is valid; the fields are set below.
    let mut p: cu::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
    p.waitValue.operation = cu::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WAIT_VALUE_32;
    p.waitValue.address = addr;
    p.waitValue.__bindgen_anon_1.value = value;
    p.waitValue.flags = cu::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    p
}

/// A stream's store of `value` into the 32-bit word at device address `addr`, as an entry of
/// [`batch_mem_ops`].
fn write_op(addr: cu::CUdeviceptr, value: u32) -> cu::CUstreamBatchMemOpParams {
    // SAFETY: as in `wait_op`.
    let mut p: cu::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
    p.writeValue.operation = cu::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32;
    p.writeValue.address = addr;
    p.writeValue.__bindgen_anon_1.value = value;
    p.writeValue.flags = cu::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    p
}

/// Set once the driver refused a batch of memory operations: later callers queue them one by
/// one without asking again.
static BATCH_MEM_OPS_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Queues `ops` on `stream` as one batch (`cuStreamBatchMemOp`); false, with nothing queued,
/// where the driver does not take batches or rejects this one (the caller queues them one by
/// one). The stream's
/// context must be current.
///
/// # Safety
///
/// Every address in `ops` must stay valid until the stream has run the operation.
unsafe fn batch_mem_ops(stream: cu::CUstream, ops: &mut [cu::CUstreamBatchMemOpParams]) -> Result<bool> {
    if BATCH_MEM_OPS_REFUSED.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(false);
    }
    // CAST: a handful of operations.
    let n = ops.len() as std::ffi::c_uint;
    // SAFETY: `n` filled entries; the caller keeps the addresses valid.
    match unsafe { cu::cuStreamBatchMemOp_v2(stream, n, ops.as_mut_ptr(), 0) } {
        cu::CUresult::CUDA_ERROR_NOT_SUPPORTED => {
            BATCH_MEM_OPS_REFUSED.store(true, std::sync::atomic::Ordering::Relaxed);
            Ok(false)
        }
        // A batch the driver rejects queues nothing: the operations one by one say why, if
        // they fail too.
        cu::CUresult::CUDA_ERROR_INVALID_VALUE => Ok(false),
        r => check("cuStreamBatchMemOp", r).map(|()| true),
    }
}

/// Runs a boxed host function queued by `Stream::host_fn`.
unsafe extern "C" fn run_host_fn(data: *mut c_void) {
    // SAFETY: `data` is the Box<HostFn> leaked by `host_fn`, run exactly once by the driver.
    let f = unsafe { Box::from_raw(data as *mut HostFn) };
    // A panic must not unwind into the driver.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

impl Stream for CudaStream {
    fn bind_thread(&self) -> Result<()> {
        self.cuda.bind()
    }

    fn completion_word(&self) -> Result<CompletionWord> {
        let _ctx = self.cuda.enter()?;
        let mut p = std::ptr::null_mut();
        let flags = cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: out-pointer to a local; the context is current.
        check("cuMemHostAlloc", unsafe { cu::cuMemHostAlloc(&mut p, 64, flags) })?;
        let owner = PinnedWord { cuda: self.cuda.clone(), ptr: p };
        let mut dev = 0;
        // SAFETY: `p` is device-mapped pinned memory (DEVICEMAP) from this context.
        check("cuMemHostGetDevicePointer", unsafe { cu::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) })?;
        let word = p as *const AtomicU32;
        // SAFETY: fresh, page-aligned pinned memory, zeroed here before first use, owned by
        // `owner` which the word keeps.
        unsafe {
            (*word).store(0, std::sync::atomic::Ordering::Release);
            Ok(CompletionWord::new(word, dev, Box::new(owner)).mapped_by(Vendor::Cuda))
        }
    }

    fn host_fn(&self, f: HostFn) -> Result<()> {
        let _ctx = self.cuda.enter()?;
        let data = Box::into_raw(Box::new(f)) as *mut c_void;
        // SAFETY: `run_host_fn` takes back the box exactly once.
        let r = check("cuLaunchHostFunc", unsafe { cu::cuLaunchHostFunc(self.raw, Some(run_host_fn), data) });
        if r.is_err() {
            // SAFETY: the driver did not take the function: free it here.
            drop(unsafe { Box::from_raw(data as *mut HostFn) });
        }
        r
    }

    fn wait_word(&self, word: &CompletionWord, value: u32) -> Result<()> {
        let _ctx = self.cuda.enter()?;
        let geq = cu::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: the word's device address is mapped pinned memory that outlives the wait
        // (the caller keeps the word until the stream is synchronized).
        check("cuStreamWaitValue32", unsafe { cu::cuStreamWaitValue32_v2(self.raw, word.device_addr(), value, geq) })
    }

    fn write_word(&self, word: &CompletionWord, value: u32) -> Result<()> {
        let _ctx = self.cuda.enter()?;
        let flags = cu::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: the word's device address is mapped pinned memory that outlives the write
        // (its owner keeps the word until it has seen the value, i.e. the write is done).
        check("cuStreamWriteValue32", unsafe {
            cu::cuStreamWriteValue32_v2(self.raw, word.device_addr(), value, flags)
        })
    }

    fn waits_then_write(&self, waits: &[(&CompletionWord, u32)], out: &CompletionWord, stored: u32) -> Result<()> {
        {
            let _ctx = self.cuda.enter()?;
            let mut ops: Vec<_> = waits.iter().map(|(w, v)| wait_op(w.device_addr(), *v)).collect();
            ops.push(write_op(out.device_addr(), stored));
            // SAFETY: every word is mapped pinned memory its owner keeps until the stream has
            // passed the operations (as for `wait_word` and `write_word`).
            if unsafe { batch_mem_ops(self.raw, &mut ops) }? {
                return Ok(());
            }
        }
        for &(w, v) in waits {
            self.wait_word(w, v)?;
        }
        self.write_word(out, stored)
    }

    fn synchronize(&self) -> Result<()> {
        let _ctx = self.cuda.enter()?;
        // SAFETY: a live stream.
        check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(self.raw) })
    }

    fn is_idle(&self) -> bool {
        // cuda.h's CU_STREAM_LEGACY and CU_STREAM_PER_THREAD handles.
        const LEGACY: usize = 0x1;
        const PER_THREAD: usize = 0x2;
        let raw = self.raw as usize;
        // The legacy default stream's next work waits for every blocking stream of the
        // context, which no query reaches; the per-thread default stream is one handle for
        // every thread's own stream, so whose it is cannot be told here.
        if raw == 0 || raw == LEGACY || raw == PER_THREAD {
            return false;
        }
        let Ok(_ctx) = self.cuda.enter() else { return false };
        let idle = |s: cu::CUstream| {
            // A query of a stream being captured into a graph (or of the legacy stream while a
            // stream it would wait for is) is refused and spoils the capture; asking whether it
            // is capturing is allowed.
            let mut capture = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            // SAFETY: out-pointer to a local; a live stream handle (or a default stream's).
            let r = unsafe { cu::cuStreamIsCapturing(s, &mut capture) };
            r == cu::CUresult::CUDA_SUCCESS
                && capture == cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
                // SAFETY: as above, queried only.
                && unsafe { cu::cuStreamQuery(s) } == cu::CUresult::CUDA_SUCCESS
        };
        // A blocking stream's next work also waits for the legacy default stream's.
        let blocking = {
            let mut flags = 0;
            // SAFETY: out-pointer to a local; a live stream.
            let r = unsafe { cu::cuStreamGetFlags(self.raw, &mut flags) };
            r != cu::CUresult::CUDA_SUCCESS || flags & cu::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32 == 0
        };
        idle(self.raw) && (!blocking || idle(LEGACY as cu::CUstream))
    }

    fn raw(&self) -> usize {
        self.raw as usize
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Ok(_ctx) = self.cuda.enter() {
            // SAFETY: a stream we created.
            unsafe {
                cu::cuStreamSynchronize(self.raw);
                cu::cuStreamDestroy_v2(self.raw);
            }
        }
    }
}

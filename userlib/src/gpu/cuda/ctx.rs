//! CUDA contexts: which context a pointer or a stream belongs to, and one [`Gpu`] per context in
//! the process. Every GPU operation of the library runs in the context of the memory or the
//! stream it serves (`cuPointerGetAttribute`, `cuStreamGetCtx`), or, with neither, in the calling
//! thread's current context, as the CUDA runtime's per-thread `cudaSetDevice` makes it; device
//! 0's primary context only where the thread has none. The caller's current context is put back
//! by [`CallerContext`].

use super::{check, driver_present, Cuda, CudaStream};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use cudarc::driver::sys as cu;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The calling thread's current CUDA context, put back when this is dropped. Every operation
/// binds its context through [`Ctx::enter`], which returns one; entry points that ask the driver
/// about pointers and streams in other contexts take one too, so the application's own current
/// context (say, device 3's) is the same after the call.
#[must_use = "the caller's context is put back when this is dropped"]
pub struct CallerContext(Option<cu::CUcontext>);

impl CallerContext {
    /// Records the current context (nothing when the CUDA driver is absent or not loaded).
    pub fn keep() -> CallerContext {
        if !driver_present() {
            return CallerContext(None);
        }
        CallerContext(current_raw())
    }
}

impl Drop for CallerContext {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            // SAFETY: the context the thread had on entry (or null: none), restored as it was.
            unsafe { cu::cuCtxSetCurrent(c) };
        }
    }
}

/// The thread's current context (`Some(null)` when none is current, `None` when the driver
/// refuses the question, e.g. before `cuInit`).
fn current_raw() -> Option<cu::CUcontext> {
    let mut c: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: writes the thread's current context (or null) into a local.
    let ok = unsafe { cu::cuCtxGetCurrent(&mut c) } == cu::CUresult::CUDA_SUCCESS;
    ok.then_some(c)
}

/// A CUDA context the library works in: a device's primary context (retained here, released on
/// drop; what the CUDA runtime, PyTorch and CuPy use) or a context the application created with
/// `cuCtxCreate` (borrowed: the application keeps it alive while its memory and streams are in
/// use, as CUDA requires anyway).
///
/// # Invariants
///
/// `ctx` is a context of device `dev` whose process-unique id (`cuCtxGetId`) is `id`; when
/// `primary`, this value holds one retain of `dev`'s primary context, which `ctx` is.
#[derive(Debug)]
pub struct Ctx {
    dev: cu::CUdevice,
    ctx: cu::CUcontext,
    id: u64,
    primary: bool,
}

// SAFETY: a CUcontext may be made current on any thread; every use binds it first.
unsafe impl Send for Ctx {}
// SAFETY: as above; the driver API is thread-safe.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Retains the primary context of device `ordinal`.
    pub(crate) fn primary(ordinal: i32) -> Result<Ctx> {
        init()?;
        let mut dev = 0;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: plain driver calls with out-pointers to locals.
        unsafe {
            check("cuDeviceGet", cu::cuDeviceGet(&mut dev, ordinal))?;
            check("cuDevicePrimaryCtxRetain", cu::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
        }
        let id = match context_id(ctx) {
            Ok(id) => id,
            Err(e) => {
                // SAFETY: the retain just made.
                unsafe { cu::cuDevicePrimaryCtxRelease_v2(dev) };
                return Err(e);
            }
        };
        // INVARIANT: `ctx` is `dev`'s primary context, retained once above.
        Ok(Ctx { dev, ctx, id, primary: true })
    }

    /// The context `raw` (a live context the driver handed out: of a pointer, a stream, or the
    /// thread): its device's primary context when it is that, else borrowed.
    fn of_raw(raw: cu::CUcontext) -> Result<Ctx> {
        if raw.is_null() {
            return Err(Error::invalid("context", "a null CUDA context"));
        }
        let id = context_id(raw)?;
        let dev = {
            let _caller = CallerContext::keep();
            let mut dev = 0;
            // SAFETY: `raw` is a live context; it is current only until `_caller` restores the
            // caller's.
            unsafe {
                check("cuCtxSetCurrent", cu::cuCtxSetCurrent(raw))?;
                check("cuCtxGetDevice", cu::cuCtxGetDevice(&mut dev))?;
            }
            dev
        };
        let p = Ctx::primary(dev)?;
        if p.id == id {
            return Ok(p);
        }
        drop(p);
        // INVARIANT: `raw` is a live context of `dev` with id `id`; nothing is retained.
        Ok(Ctx { dev, ctx: raw, id, primary: false })
    }

    /// Makes the context current on this thread, and leaves it so (for callers that launch
    /// their own work in it; the library's own operations use [`Ctx::enter`]).
    pub fn bind(&self) -> Result<()> {
        // SAFETY: a live context (see the type's invariants).
        check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.ctx) })
    }

    /// Makes the context current for one operation: the thread's previous context is current
    /// again when the result is dropped, so an application's own current context (another
    /// device's, or one it created) survives every call of the library. Costs one
    /// `cuCtxGetCurrent` where this context is current already.
    pub fn enter(&self) -> Result<CallerContext> {
        let prev = current_raw();
        if prev == Some(self.ctx) {
            return Ok(CallerContext(None));
        }
        // A failed bind drops `prev`'s guard, which puts back what was current anyway.
        let prev = CallerContext(prev);
        self.bind()?;
        Ok(prev)
    }

    /// The device's ordinal.
    pub fn device(&self) -> i32 {
        self.dev
    }

    /// The driver's device handle.
    pub(crate) fn dev(&self) -> cu::CUdevice {
        self.dev
    }

    /// The context's process-unique id (`cuCtxGetId`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether this is the device's primary context.
    pub fn is_primary(&self) -> bool {
        self.primary
    }

    /// The raw `CUcontext`.
    pub fn raw(&self) -> usize {
        self.ctx as usize
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        if self.primary {
            // SAFETY: releases the retain this value holds (see the type's invariants).
            unsafe { cu::cuDevicePrimaryCtxRelease_v2(self.dev) };
        }
    }
}

/// `cuInit`, with the driver's absence said by name.
fn init() -> Result<()> {
    if !driver_present() {
        return Err(Error::Unsupported {
            what: "CUDA",
            why: "the CUDA driver library (libcuda.so) is not installed".into(),
            fix: "install the NVIDIA driver, or use the CPU runtime",
        });
    }
    // SAFETY: plain driver call.
    check("cuInit", unsafe { cu::cuInit(0) })
}

/// The process-unique id of a live context.
fn context_id(raw: cu::CUcontext) -> Result<u64> {
    let mut id = 0u64;
    // SAFETY: `raw` is a live context; out-pointer to a local.
    check("cuCtxGetId", unsafe { cu::cuCtxGetId(raw, &mut id) })?;
    Ok(id)
}

/// Where a pointer lives, as CUDA reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointerPlace {
    /// Not device memory of any CUDA context (host memory, pinned or not, or unknown).
    Host,
    /// Device memory, allocated in (or mapped into) `context` on device `device`. `context` is
    /// 0 where the driver names no context (memory of the virtual memory API, `cuMemCreate`):
    /// then the device's primary context serves it.
    Device {
        /// The raw `CUcontext`, or 0.
        context: usize,
        /// The device's ordinal.
        device: i32,
    },
}

/// Where `ptr` lives: the one place that asks CUDA whose memory a pointer is.
pub fn place_of_pointer(ptr: u64) -> Result<PointerPlace> {
    if ptr == 0 || !driver_present() {
        return Ok(PointerPlace::Host);
    }
    init()?;
    let mut ty: u32 = 0;
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    let mut ordinal: i32 = -1;
    let mut attrs = [
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    ];
    let mut data = [
        &mut ty as *mut u32 as *mut c_void,
        &mut ctx as *mut cu::CUcontext as *mut c_void,
        &mut ordinal as *mut i32 as *mut c_void,
    ];
    // SAFETY: three attributes, each with an out-pointer of the type the driver writes for it
    // (unsigned int, CUcontext, int); an unknown pointer leaves them as they are or fails.
    let r = unsafe { cu::cuPointerGetAttributes(3, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr) };
    if r != cu::CUresult::CUDA_SUCCESS || ty != cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        return Ok(PointerPlace::Host);
    }
    Ok(PointerPlace::Device { context: ctx as usize, device: ordinal })
}

/// The context a stream belongs to (`cuStreamGetCtx`). The legacy and per-thread default
/// streams (0, 1, 2) belong to the calling thread's current context.
pub fn context_of_stream(stream: usize) -> Result<usize> {
    init()?;
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: the caller passes a stream handle of this process (or a default-stream value);
    // out-pointer to a local.
    check("cuStreamGetCtx", unsafe { cu::cuStreamGetCtx(stream as cu::CUstream, &mut ctx) })?;
    Ok(ctx as usize)
}

/// One entry per context the library has worked in.
struct Entry {
    id: u64,
    cuda: Cuda,
    gpu: Arc<Gpu>,
}

/// Every context's [`Gpu`], so that one context has one staging pool and one identity.
static CONTEXTS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// The entry of a context: found by its id, or made (and kept for the life of the process).
fn entry_of(make: impl FnOnce() -> Result<Ctx>, id: Option<u64>) -> Result<(Cuda, Arc<Gpu>)> {
    let mut all = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = id.and_then(|id| all.iter().find(|e| e.id == id)) {
        return Ok((e.cuda.clone(), e.gpu.clone()));
    }
    let ctx = make()?;
    if let Some(e) = all.iter().find(|e| e.id == ctx.id) {
        return Ok((e.cuda.clone(), e.gpu.clone()));
    }
    let id = ctx.id;
    let cuda = Cuda::from_ctx(Arc::new(ctx));
    let gpu = Gpu::with_runtime(Arc::new(cuda.clone()));
    all.push(Entry { id, cuda: cuda.clone(), gpu: gpu.clone() });
    Ok((cuda, gpu))
}

/// The runtime and [`Gpu`] of the live context `raw` (0: none).
fn of_context(raw: usize) -> Result<(Cuda, Arc<Gpu>)> {
    let raw = raw as cu::CUcontext;
    let id = context_id(raw)?;
    entry_of(|| Ctx::of_raw(raw), Some(id))
}

/// The [`Gpu`] of device `ordinal`'s primary context (the one the CUDA runtime, PyTorch and
/// CuPy use for that device).
pub fn device_gpu(ordinal: i32) -> Result<Arc<Gpu>> {
    device_runtime(ordinal).map(|(_, g)| g)
}

/// [`device_gpu`] with its runtime.
pub fn device_runtime(ordinal: i32) -> Result<(Cuda, Arc<Gpu>)> {
    let _caller = CallerContext::keep();
    entry_of(|| Ctx::primary(ordinal), None)
}

/// The [`Gpu`] of the calling thread's current context: what `cudaSetDevice(N)` selected on
/// this thread, or a context the application made current; device 0's primary context when the
/// thread has none (the CUDA runtime's default device).
pub fn current_gpu() -> Result<Arc<Gpu>> {
    current_runtime().map(|(_, g)| g)
}

/// [`current_gpu`] with its runtime.
pub fn current_runtime() -> Result<(Cuda, Arc<Gpu>)> {
    init()?;
    let _caller = CallerContext::keep();
    match current_raw() {
        Some(c) if !c.is_null() => of_context(c as usize),
        _ => entry_of(|| Ctx::primary(0), None),
    }
}

/// The [`Gpu`] whose device memory `ptr` is (its own context; a virtual-memory allocation's
/// device's primary context), or `None` for memory that is not CUDA device memory.
pub fn gpu_of_pointer(ptr: u64) -> Result<Option<Arc<Gpu>>> {
    let _caller = CallerContext::keep();
    match place_of_pointer(ptr)? {
        PointerPlace::Host => Ok(None),
        PointerPlace::Device { context: 0, device } => Ok(Some(device_runtime(device)?.1)),
        PointerPlace::Device { context, .. } => Ok(Some(of_context(context)?.1)),
    }
}

/// The runtime and [`Gpu`] of the context `stream` belongs to (for a default stream, the calling
/// thread's current one, or device 0's primary context when it has none).
pub fn stream_runtime(stream: usize) -> Result<(Cuda, Arc<Gpu>)> {
    let _caller = CallerContext::keep();
    if stream <= 2 && current_raw().is_none_or(|c| c.is_null()) {
        // A default stream with no current context: the runtime's device 0, made current so the
        // stream has a context to belong to.
        let (cuda, gpu) = device_runtime(0)?;
        return Ok((cuda, gpu));
    }
    of_context(context_of_stream(stream)?)
}

/// Wraps the application's `stream` in the context it belongs to (not destroyed on drop), with
/// that context's [`Gpu`].
///
/// # Safety
///
/// `stream` must be a live stream of this process (or a default-stream value) that outlives the
/// result's use.
pub unsafe fn wrap_stream(stream: usize) -> Result<(Arc<Gpu>, Arc<CudaStream>)> {
    let (cuda, gpu) = stream_runtime(stream)?;
    // SAFETY: the stream belongs to `cuda`'s context (asked of the driver above); the caller
    // keeps it alive.
    Ok((gpu, unsafe { cuda.wrap_stream(stream) }))
}

/// The identity of the calling thread's current context (0 when none is current): what keys the
/// library's state for a default stream, whose context depends on the calling thread.
pub fn current_context_id() -> u64 {
    match current_raw() {
        Some(c) if !c.is_null() => context_id(c).unwrap_or(0),
        _ => 0,
    }
}

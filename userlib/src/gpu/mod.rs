//! GPU runtimes behind one trait: device memory, pinned host memory, asynchronous copies,
//! dma-buf export and ordered streams ([`stream`]).
//!
//! [`cuda`] loads the CUDA driver at run time (cudarc's dynamic loading), so everything builds
//! and the host tests run without CUDA. [`hip`] loads AMD's HIP runtime (`libamdhip64.so`) at
//! run time the same way, with `dlopen`. [`cpu`] is a runtime whose "device memory" is host
//! memory backed by a memfd: the VM tests use it to drive the staging pipeline, the stream
//! ordering and the dma-buf registration path (its export is a real udmabuf) without a GPU.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
// Public only for the C face's `ugdsxBufRegisterDmabuf` (`c-abi/`): its core, not a Rust API
// (Rust code registers a dma-buf with `Storage::register_dmabuf`).
#[doc(hidden)]
pub mod dmabuf;
/// The CUDA backend is not built (feature `cuda` off): what the rest of the crate asks of it.
#[cfg(not(feature = "cuda"))]
pub mod cuda {
    /// No CUDA in this build.
    pub fn driver_present() -> bool {
        false
    }

    /// Nothing to keep: this build never binds a CUDA context.
    pub struct CallerContext;

    impl CallerContext {
        /// A no-op.
        pub fn keep() -> CallerContext {
            CallerContext
        }
    }

    /// No CUDA memory in this build.
    pub fn gpu_of_pointer(_ptr: u64) -> crate::Result<Option<std::sync::Arc<super::Gpu>>> {
        Ok(None)
    }
}
pub mod hip;
pub mod stream;

use crate::error::{Error, Result};
use crate::inflight::{Failed, InFlight, IoResult, Why};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use stream::Stream;

/// Which runtime a [`Gpu`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// NVIDIA CUDA.
    Cuda,
    /// AMD HIP (ROCm).
    Hip,
    /// Host memory standing in for a GPU (tests, machines without one).
    Cpu,
    /// Memory another driver exported as a dma-buf (a device's BAR, an accelerator's memory),
    /// registered with [`crate::Storage::register_dmabuf`].
    Dmabuf,
}

/// Pinned (page-locked) host memory, for staging copies. The library's own DMA memory:
/// `MADV_DONTFORK`, so a forked child does not inherit it (and leaks it when dropped there).
#[derive(Debug)]
pub struct PinnedHost {
    ptr: *mut u8,
    len: usize,
    owner: Arc<dyn Runtime>,
    born: crate::fork::Born,
}

// SAFETY: the pointer is a private allocation this value owns; it is only accessed through
// `&self`/`&mut self` methods, so Rust's aliasing rules apply to it as to a Vec.
unsafe impl Send for PinnedHost {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// The memory's address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if self.born.in_child() {
            // Not inherited, and the runtime that would free it is the parent's.
            return;
        }
        self.owner.free_pinned(self.ptr, self.len);
    }
}

/// An ordered queue of asynchronous copies between pinned host memory and device memory.
pub trait CopyQueue: Send + std::fmt::Debug {
    /// Starts copying `len` bytes from host `src` to device address `dst`.
    ///
    /// # Safety
    ///
    /// `src` must stay valid and unwritten until [`CopyQueue::wait`] returns; `dst..dst+len`
    /// must be device memory of this runtime.
    unsafe fn to_device(&mut self, dst: u64, src: *const u8, len: usize) -> Result<()>;
    /// Starts every copy of `copies` (host to device), in one call where the runtime has one
    /// (CUDA 12.8+: `cuMemcpyBatchAsync`). On an error some of them may have started.
    ///
    /// # Safety
    ///
    /// As [`CopyQueue::to_device`], for each copy.
    unsafe fn to_device_many(&mut self, copies: &[ToDevice]) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { to_device_each(self, copies) }
    }
    /// Starts copying `len` bytes from device address `src` to host `dst`.
    ///
    /// # Safety
    ///
    /// `dst` must stay valid and untouched until [`CopyQueue::wait`] returns.
    unsafe fn to_host(&mut self, dst: *mut u8, src: u64, len: usize) -> Result<()>;
    /// Waits until every copy started so far is complete.
    fn wait(&mut self) -> Result<()>;
    /// Whether every copy started so far is complete, without waiting (runtimes without a
    /// query wait instead).
    fn poll(&mut self) -> Result<bool> {
        self.wait().map(|()| true)
    }
    /// Queues a store of `value` into `word`, made once every copy started so far is done
    /// (by the device, where the runtime can: no host thread waits for the copies); false when
    /// this queue cannot, and the caller waits for the copies and stores the value itself.
    fn signal(&mut self, _word: &stream::CompletionWord, _value: u32) -> Result<bool> {
        Ok(false)
    }
}

/// [`CopyQueue::to_device_many`] as one [`CopyQueue::to_device`] per copy (the default, and a
/// runtime's fallback when it has no batch call).
///
/// # Safety
///
/// As [`CopyQueue::to_device`], for each copy.
pub(crate) unsafe fn to_device_each<Q: CopyQueue + ?Sized>(q: &mut Q, copies: &[ToDevice]) -> Result<()> {
    for c in copies {
        // SAFETY: the caller's promise, copy by copy.
        unsafe { q.to_device(c.dst, c.src, c.len)? };
    }
    Ok(())
}

/// One host-to-device copy of [`CopyQueue::to_device_many`].
#[derive(Debug, Clone, Copy)]
pub struct ToDevice {
    /// Device address of the destination.
    pub dst: u64,
    /// Host source.
    pub src: *const u8,
    /// Bytes.
    pub len: usize,
}

/// How the staging pipeline waits for its copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyWait {
    /// Busy-poll transfers of at most [`SMALL_COPY`] bytes, block on larger ones (default).
    #[default]
    Auto,
    /// Always the runtime's synchronize (which may yield or sleep).
    Block,
    /// Always busy-poll the queue: lowest latency, one core spins.
    Poll,
}

/// Transfers up to this size are polled under [`CopyWait::Auto`]: their copy takes a few
/// microseconds, less than a blocking synchronize's own cost.
pub const SMALL_COPY: usize = 256 << 10;

/// What a GPU runtime must provide. Implementations are small FFI layers; the logic that uses
/// them (staging, stream ordering, registration) is written once, above this trait.
pub trait Runtime: Send + Sync + std::fmt::Debug {
    /// Which runtime this is.
    fn vendor(&self) -> Vendor;
    /// The device's name.
    fn device_name(&self) -> String;
    /// Allocates `len` bytes of device memory; returns its device address.
    fn alloc(&self, len: usize) -> Result<u64>;
    /// Frees device memory from [`Runtime::alloc`].
    fn free(&self, ptr: u64, len: usize);
    /// Whether `ptr` is device memory of this runtime (the C ABI tells GPU from host
    /// pointers with it).
    fn is_device_memory(&self, ptr: u64) -> bool;
    /// Allocates pinned host memory.
    fn alloc_pinned(&self, len: usize) -> Result<*mut u8>;
    /// Frees pinned host memory.
    fn free_pinned(&self, ptr: *mut u8, len: usize);
    /// A new ordered copy queue.
    fn copy_queue(&self) -> Result<Box<dyn CopyQueue>>;
    /// Exports `[ptr, ptr+len)` of device memory as a dma-buf; the caller owns the fd.
    fn export_dmabuf(&self, ptr: u64, len: usize) -> Result<OwnedFd>;
    /// Whether this device can export dma-bufs at all, and if not, why.
    fn dmabuf_support(&self) -> std::result::Result<(), String>;
    /// A new stream of this runtime.
    fn new_stream(&self) -> Result<Arc<dyn Stream>>;
}

/// The refusal of a build without the CUDA backend.
#[cfg(not(feature = "cuda"))]
fn no_cuda() -> Error {
    Error::Unsupported {
        what: "CUDA",
        why: "this build of ugds has no CUDA backend".into(),
        fix: "build the ugds crate with its `cuda` feature (on by default)",
    }
}

/// Size of one staging chunk: large enough that a copy's fixed cost is small, small enough
/// that two chunks in flight overlap well for the sizes KV-cache users move (64 KiB – 64 MiB).
pub const STAGING_CHUNK: usize = 2 << 20;

/// A GPU: its runtime plus pools of staging buffers and copy queues, so the fallback path
/// allocates nothing per I/O once warm.
#[derive(Debug)]
pub struct Gpu {
    rt: Arc<dyn Runtime>,
    staging: Mutex<Vec<PinnedHost>>,
    queues: Mutex<Vec<Box<dyn CopyQueue>>>,
    copy_wait: std::sync::atomic::AtomicU8,
}

/// Device memory allocated through a [`Gpu`]; freed on drop.
#[derive(Debug)]
pub struct GpuMemory {
    gpu: Arc<Gpu>,
    ptr: u64,
    len: usize,
    /// Allocated here (freed on drop), or the caller's.
    owned: bool,
    /// The fork generation it was allocated in (a forked child never frees it).
    born: crate::fork::Born,
}

impl Gpu {
    /// The CUDA GPU of the calling thread: its current context (what `cudaSetDevice(N)` made
    /// current on this thread, or a context the application created), else device 0's primary
    /// context. Loads the driver library; a clear error when there is none. One [`Gpu`] per
    /// context in the process: calls from threads on the same device share it.
    pub fn cuda() -> Result<Arc<Gpu>> {
        #[cfg(feature = "cuda")]
        return cuda::current_gpu();
        #[cfg(not(feature = "cuda"))]
        Err(no_cuda())
    }

    /// CUDA device `ordinal`'s primary context (the one the CUDA runtime, PyTorch and CuPy use).
    pub fn cuda_device(ordinal: i32) -> Result<Arc<Gpu>> {
        #[cfg(feature = "cuda")]
        return cuda::device_gpu(ordinal);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(no_cuda())
        }
    }

    /// The HIP GPU of the calling thread: what `hipSetDevice(N)` selected on this thread, else
    /// device 0 (loads `libamdhip64.so`, or the file `UGDS_HIP_LIBRARY` names; an
    /// [`Error::Unsupported`] naming the library when it cannot be loaded). One [`Gpu`] per
    /// device in the process.
    pub fn hip() -> Result<Arc<Gpu>> {
        hip::current_gpu()
    }

    /// HIP device `ordinal`.
    pub fn hip_device(ordinal: i32) -> Result<Arc<Gpu>> {
        hip::device_gpu(ordinal)
    }

    /// The GPU whose device memory `ptr` is: CUDA's (the context that owns it), else HIP's (the
    /// device that holds it); `None` for host memory. One [`Gpu`] per context or device in the
    /// process, so two pointers of one device give the same value (`Arc::ptr_eq`).
    pub fn of_pointer(ptr: u64) -> Result<Option<Arc<Gpu>>> {
        if let Some(g) = cuda::gpu_of_pointer(ptr)? {
            return Ok(Some(g));
        }
        hip::gpu_of_pointer(ptr)
    }

    /// The CPU stand-in runtime.
    pub fn cpu() -> Arc<Gpu> {
        Self::with_runtime(Arc::new(cpu::Cpu::default()))
    }

    /// Wraps a runtime.
    pub fn with_runtime(rt: Arc<dyn Runtime>) -> Arc<Gpu> {
        Arc::new(Gpu {
            rt,
            staging: Mutex::new(Vec::new()),
            queues: Mutex::new(Vec::new()),
            copy_wait: std::sync::atomic::AtomicU8::new(0),
        })
    }

    /// How staged I/O waits for its copies from now on.
    pub fn set_copy_wait(&self, w: CopyWait) {
        let v = match w {
            CopyWait::Auto => 0,
            CopyWait::Block => 1,
            CopyWait::Poll => 2,
        };
        self.copy_wait.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    /// How staged I/O waits for its copies.
    pub fn copy_wait(&self) -> CopyWait {
        match self.copy_wait.load(std::sync::atomic::Ordering::Relaxed) {
            1 => CopyWait::Block,
            2 => CopyWait::Poll,
            _ => CopyWait::Auto,
        }
    }

    /// Waits for `q`'s copies of an I/O of `io_bytes` bytes, polling or blocking as
    /// [`Gpu::copy_wait`] says.
    pub(crate) fn wait_copy(&self, q: &mut dyn CopyQueue, io_bytes: usize) -> Result<()> {
        let poll = match self.copy_wait() {
            CopyWait::Auto => io_bytes <= SMALL_COPY,
            CopyWait::Block => false,
            CopyWait::Poll => true,
        };
        if !poll {
            return q.wait();
        }
        while !q.poll()? {
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// Fills the pools with `chunks` staging chunks and `queues` copy queues, so the first
    /// staged I/O allocates nothing (pinned allocation and stream creation cost milliseconds).
    pub fn prewarm(&self, chunks: usize, queues: usize) -> Result<()> {
        let have = self.staging.lock().unwrap_or_else(|e| e.into_inner()).len();
        if have < chunks {
            let more = (have..chunks).map(|_| self.alloc_pinned(STAGING_CHUNK)).collect::<Result<Vec<_>>>()?;
            self.put_staging(more);
        }
        let have = self.queues.lock().unwrap_or_else(|e| e.into_inner()).len();
        for _ in have..queues {
            let q = self.rt.copy_queue()?;
            self.put_queue(q);
        }
        Ok(())
    }

    /// The runtime.
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.rt
    }

    /// Allocates device memory.
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<GpuMemory> {
        if len == 0 {
            return Err(Error::invalid("len", "must be non-zero"));
        }
        let born = crate::fork::watch()?;
        let ptr = self.rt.alloc(len)?;
        Ok(GpuMemory { gpu: self.clone(), ptr, len, owned: true, born })
    }

    /// Device memory the caller allocated (not freed on drop).
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + len)` must be device memory of this GPU that stays allocated while the
    /// result (and any buffer registered from it) lives.
    pub unsafe fn borrow(self: &Arc<Self>, ptr: u64, len: usize) -> Result<GpuMemory> {
        if len == 0 || ptr == 0 {
            return Err(Error::invalid("len", "a null or empty range"));
        }
        Ok(GpuMemory { gpu: self.clone(), ptr, len, owned: false, born: crate::fork::watch()? })
    }

    /// Allocates pinned host memory.
    pub fn alloc_pinned(&self, len: usize) -> Result<PinnedHost> {
        let born = crate::fork::watch()?;
        let ptr = self.rt.alloc_pinned(len)?;
        let p = PinnedHost { ptr, len, owner: self.rt.clone(), born };
        if (ptr as usize).is_multiple_of(4096) {
            // Whole pages (staging chunks: a page-aligned allocation owns the rest of its last
            // page). A runtime that carves small allocations out of its own pages keeps them
            // as they are: those pages are the runtime's.
            // SAFETY: the runtime's fresh allocation for this library (never the caller's).
            unsafe { crate::fork::dont_fork(ptr, len.next_multiple_of(4096)) }?;
        }
        Ok(p)
    }

    /// Takes `n` staging chunks from the pool (allocating when it is short).
    pub(crate) fn take_staging(&self, n: usize) -> Result<Vec<PinnedHost>> {
        let mut out = {
            let mut pool = self.staging.lock().unwrap_or_else(|e| e.into_inner());
            // Chunks of the parent's, in a forked child: not inherited (dropped, they leak).
            pool.retain(|c| !c.born.in_child());
            let keep = pool.len().saturating_sub(n);
            pool.split_off(keep)
        };
        while out.len() < n {
            out.push(self.alloc_pinned(STAGING_CHUNK)?);
        }
        Ok(out)
    }

    /// Staging chunks in the pool now (tests).
    #[cfg(all(test, feature = "fallback"))]
    pub(crate) fn pooled_staging(&self) -> usize {
        self.staging.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Copy queues in the pool now (tests).
    #[cfg(all(test, feature = "fallback"))]
    fn pooled_queues(&self) -> usize {
        self.queues.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Gives staging chunks back.
    pub(crate) fn put_staging(&self, bufs: Vec<PinnedHost>) {
        self.staging.lock().unwrap_or_else(|e| e.into_inner()).extend(bufs);
    }

    /// Takes a copy queue from the pool.
    pub(crate) fn take_queue(&self) -> Result<Box<dyn CopyQueue>> {
        let q = self.queues.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match q {
            Some(q) => Ok(q),
            None => self.rt.copy_queue(),
        }
    }

    /// Takes `n` copy queues (all or none).
    pub(crate) fn take_queues(&self, n: usize) -> Result<Vec<Box<dyn CopyQueue>>> {
        let mut qs = Vec::with_capacity(n);
        for _ in 0..n {
            match self.take_queue() {
                Ok(q) => qs.push(q),
                Err(e) => {
                    qs.into_iter().for_each(|q| self.put_queue(q));
                    return Err(e);
                }
            }
        }
        Ok(qs)
    }

    /// Gives a copy queue back.
    pub(crate) fn put_queue(&self, q: Box<dyn CopyQueue>) {
        self.queues.lock().unwrap_or_else(|e| e.into_inner()).push(q);
    }

    /// Copies host bytes to device memory and waits (tests, examples).
    pub fn upload(&self, dst: &GpuMemory, offset: usize, src: &[u8]) -> Result<()> {
        dst.check(offset, src.len())?;
        let stage = self.alloc_pinned(src.len().max(1))?;
        // SAFETY: `stage` is a fresh allocation of at least src.len() bytes owned here.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), stage.as_ptr(), src.len()) };
        let mut q = self.take_queue()?;
        // SAFETY: `stage` lives until after `wait` (or for good, with a failed copy); the range
        // was checked against `dst`.
        let r = unsafe { q.to_device(dst.ptr + offset as u64, stage.as_ptr(), src.len()) }.and_then(|_| q.wait());
        self.copied(r, q, stage).map(drop)
    }

    /// Ends a copy through `q` and `stage` with its result `r`: on success the queue goes back
    /// to the pool and the stage to the caller; after a failure the copy may still run, so a
    /// token keeps both (the queue is never reused, the memory never freed).
    fn copied(&self, r: Result<()>, q: Box<dyn CopyQueue>, stage: PinnedHost) -> Result<PinnedHost> {
        match self.settle_queue(r, q) {
            Ok(()) => Ok(stage),
            Err(mut f) => {
                drop(f.hold_if_running(stage));
                Err(f.into_error())
            }
        }
    }

    /// Ends copies on `q` with their result `r` (of starting them and waiting): on success the
    /// queue goes back to the pool; after a failure its copies may still run, so the failure's
    /// token keeps it (never reused or destroyed).
    pub(crate) fn settle_queue(&self, r: Result<()>, q: Box<dyn CopyQueue>) -> IoResult<()> {
        match r {
            Ok(()) => {
                self.put_queue(q);
                Ok(())
            }
            Err(e) => Err(Failed::running(e, InFlight::new(Why::Copy).holding(q))),
        }
    }

    /// Copies device memory to host bytes and waits (tests, examples).
    pub fn download(&self, src: &GpuMemory, offset: usize, dst: &mut [u8]) -> Result<()> {
        src.check(offset, dst.len())?;
        let stage = self.alloc_pinned(dst.len().max(1))?;
        let mut q = self.take_queue()?;
        // SAFETY: `stage` lives until after `wait` (or for good, with a failed copy); the range
        // was checked against `src`.
        let r = unsafe { q.to_host(stage.as_ptr(), src.ptr + offset as u64, dst.len()) }.and_then(|_| q.wait());
        let stage = self.copied(r, q, stage)?;
        // SAFETY: the copy into `stage` completed (wait returned Ok); it holds dst.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(stage.as_ptr(), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}

impl GpuMemory {
    /// Device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU it lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Whether copy engines (and so staged I/O) can reach it: not another driver's dma-buf,
    /// which only the SSD reaches, peer to peer.
    pub(crate) fn stageable(&self) -> bool {
        self.gpu.rt.vendor() != Vendor::Dmabuf
    }

    /// Exports the whole allocation as a dma-buf (for RDMA or other dma-buf consumers); the
    /// caller owns the fd.
    pub fn export_dmabuf(&self) -> Result<OwnedFd> {
        self.gpu.rt.export_dmabuf(self.ptr, self.len)
    }

    pub(crate) fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Error::invalid(
                "offset",
                format!("[{offset}, +{len}) runs past the {}-byte allocation", self.len),
            ));
        }
        Ok(())
    }
}

impl Drop for GpuMemory {
    fn drop(&mut self) {
        if self.owned && !self.born.in_child() {
            self.gpu.rt.free(self.ptr, self.len);
        }
    }
}

#[cfg(all(test, feature = "fallback"))]
mod tests {
    use super::*;
    use crate::gpu::cpu::Faulty;
    use std::sync::atomic::Ordering;

    /// An upload or download whose copy fails keeps its copy queue out of the pool (its copy
    /// may still run); once copies work again, the next one takes a new queue and works. (The
    /// failed queue used to go back to the pool, and its pinned stage was freed.)
    #[test]
    fn a_failed_upload_or_download_keeps_its_queue_out_of_the_pool() {
        let rt = Arc::new(Faulty::new(true, false));
        let state = rt.state.clone();
        let gpu = Gpu::with_runtime(rt);
        let mem = gpu.alloc(4096).unwrap();
        gpu.prewarm(0, 1).unwrap();
        assert!(gpu.upload(&mem, 0, &[7; 64]).is_err());
        assert_eq!(gpu.pooled_queues(), 0, "the failed upload's queue went back to the pool");
        gpu.prewarm(0, 1).unwrap();
        assert!(gpu.download(&mem, 0, &mut [0; 64]).is_err());
        assert_eq!(gpu.pooled_queues(), 0, "the failed download's queue went back to the pool");
        state.failing.store(false, Ordering::Relaxed);
        gpu.upload(&mem, 0, &[9; 64]).unwrap();
        let mut out = [0u8; 64];
        gpu.download(&mem, 0, &mut out).unwrap();
        assert_eq!(out, [9; 64]);
        assert_eq!(gpu.pooled_queues(), 1);
    }
}

//! The state behind a C face: open/closed, registered handles and buffers, batches, streams.
//! Both faces share this code; where uGDS and cuFile define different behaviour, [`Face`] picks
//! (the differences are listed on [`Face`]). Every function returns a typed [`Fail`] that each
//! face turns into its own codes.

use super::handle::{new_handle_value, open_fd, status_flags, Access};
use super::slots::Slots;
use super::types::uGDSOpError::*;
use super::{CResult, Fail, Handle};
use crate::buffer::Buffer;
use crate::error::Error;
use crate::gpu::{Gpu, GpuMemory};
use crate::storage::{Storage, Target};
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

/// Which API's semantics a [`Library`] follows.
///
/// | | uGDS | cuFile |
/// | --- | --- | --- |
/// | calls before `DriverOpen` | refused (`DRIVER_NOT_INITIALIZED`) where uGDS checks | open the library implicitly |
/// | unregistered memory | sync I/O registers it for the call | staged through the library's bounce buffers (sync and batch) |
/// | sizes, offsets not block multiples | `-EINVAL` | read through a bounce buffer; writes exact bytes to files (page cache), read-modify-write edge blocks on namespaces |
/// | host memory at any address | page-aligned only | any (the pages containing it are pinned) |
/// | the same fd registered twice | a second, independent handle | `HANDLE_ALREADY_REGISTERED` |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    /// uGDS's C API (`libugds.so`).
    Ugds,
    /// NVIDIA cuFile's (`libcufile_ugds.so`).
    CuFile,
}

/// The CUDA GPU of the calling thread (its current context, as `cudaSetDevice` set it; device
/// 0's primary context when it has none), when this machine has CUDA.
pub fn cuda() -> Option<Arc<Gpu>> {
    if crate::gpu::cuda::driver_present() {
        Gpu::cuda().ok()
    } else {
        None
    }
}

/// The calling thread's HIP device (device 0 unless it called `hipSetDevice`), when this machine
/// has a HIP runtime (`libamdhip64.so`, or the file
/// `UGDS_HIP_LIBRARY` names).
pub fn hip() -> Option<Arc<Gpu>> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    if !*PRESENT.get_or_init(crate::gpu::hip::runtime_present) {
        return None;
    }
    Gpu::hip().ok()
}

/// The GPU whose device memory `addr` is, in the context (CUDA) or on the device (HIP) that
/// owns it (`None` for host memory).
pub fn gpu_of(addr: usize) -> Option<Arc<Gpu>> {
    Gpu::of_pointer(addr as u64).ok().flatten()
}

/// Memory registered with `BufRegister`.
#[derive(Debug)]
pub(crate) enum Memory {
    Host,
    Gpu(Arc<GpuMemory>),
}

/// A registered buffer.
#[derive(Debug)]
pub(crate) struct BufEntry {
    /// Unique for the process's life (a later registration at the same address differs).
    pub(crate) id: u64,
    pub(crate) base: usize,
    pub(crate) len: usize,
    pub(crate) mem: Memory,
    /// Registered for export (`uGDSExportDmabuf`, `uGDSRDMARegister`).
    pub(crate) export: bool,
    /// I/O running on it through any handle, with the registrations' own counts.
    pub(crate) inflight: AtomicU32,
    /// RDMA memory regions made from it.
    pub(crate) rdma: AtomicU32,
    /// The fork generation it was registered in (a forked child may register the same memory
    /// again: the parent's entry is not the child's).
    pub(crate) born: crate::fork::Born,
}

/// How an observed I/O was issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    /// A synchronous read or write call.
    Sync,
    /// A stream-ordered operation.
    Async,
    /// A batch entry.
    Batch,
}

/// Called after every read or write the library performs for a face (its statistics):
/// (how, write, bytes moved, latency in ns, success).
pub type IoObserver = fn(IoKind, bool, u64, u64, bool);

/// One face's state. `libugds.so` has one with [`Face::Ugds`]; the cuFile drop-in one with
/// [`Face::CuFile`].
pub struct Library {
    pub(crate) face: Face,
    open: AtomicBool,
    handles: RwLock<HashMap<usize, Arc<Handle>>>,
    bufs: RwLock<HashMap<usize, Arc<BufEntry>>>,
    pub(crate) batches: Slots<Mutex<super::batch::CBatch>>,
    pub(crate) streams: super::stream::Streams,
    pub(crate) rdma_tokens: AtomicU64,
    pub(crate) rdma: super::rdma::RdmaRecords,
    observer: OnceLock<IoObserver>,
    /// The face's configuration ([`super::FaceOptions`]).
    pub(crate) options: RwLock<super::FaceOptions>,
    /// `options.max_io_bytes`, read by every synchronous I/O without taking the lock.
    pub(crate) max_io_bytes: std::sync::atomic::AtomicUsize,
}

impl Library {
    /// An empty, closed library with `face`'s semantics.
    pub fn new(face: Face) -> Library {
        Library {
            face,
            open: AtomicBool::new(false),
            handles: RwLock::default(),
            bufs: RwLock::default(),
            batches: Slots::default(),
            streams: Default::default(),
            rdma_tokens: AtomicU64::new(0),
            rdma: Default::default(),
            observer: OnceLock::new(),
            options: RwLock::default(),
            max_io_bytes: std::sync::atomic::AtomicUsize::new(usize::MAX),
        }
    }

    /// Sets the function told about every read and write (once; later calls are ignored).
    pub fn set_observer(&self, f: IoObserver) {
        let _ = self.observer.set(f);
    }

    /// Tells the observer about one I/O.
    pub(crate) fn observe(&self, kind: IoKind, write: bool, bytes: u64, ns: u64, ok: bool) {
        if let Some(f) = self.observer.get() {
            f(kind, write, bytes, ns, ok);
        }
    }

    /// Which semantics.
    pub fn face(&self) -> Face {
        self.face
    }

    /// Whether the library is open.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Fails with `DRIVER_NOT_INITIALIZED` when closed (uGDS), or opens it (cuFile).
    pub fn require_open(&self) -> CResult<()> {
        if self.is_open() {
            return Ok(());
        }
        match self.face {
            Face::Ugds => Err(Fail::Code(UGDS_DRIVER_NOT_INITIALIZED)),
            Face::CuFile => {
                self.open.store(true, Ordering::Release);
                Ok(())
            }
        }
    }

    /// `DriverOpen`: idempotent (no reference count, as in both APIs).
    pub fn driver_open(&self) -> CResult<()> {
        self.open.store(true, Ordering::Release);
        Ok(())
    }

    /// `DriverClose`: refused while buffers have I/O in flight or RDMA regions; otherwise every
    /// buffer registration is released. Handles stay registered (uGDS keeps them usable after
    /// close; cuFile's close ends the handles too). Application streams are never touched.
    pub fn driver_close(&self) -> CResult<()> {
        if !self.is_open() {
            return Err(Fail::Code(UGDS_DRIVER_NOT_INITIALIZED));
        }
        {
            let bufs = self.bufs.read().unwrap_or_else(|e| e.into_inner());
            if bufs.values().any(|b| b.rdma.load(Ordering::Acquire) > 0) {
                return Err(Fail::Code(UGDS_RDMA_MR_STILL_ACTIVE));
            }
        }
        // All or nothing: no buffer is released while any is busy.
        self.settle_streams();
        let entries = self.buffers();
        if entries.iter().any(|e| self.buf_busy(e)) {
            return Err(Fail::Code(UGDS_BUSY));
        }
        for e in entries {
            match self.buf_deregister(e.base) {
                Ok(()) | Err(Fail::Code(UGDS_MEMORY_NOT_REGISTERED)) => {}
                Err(e) => return Err(e),
            }
        }
        if self.face == Face::CuFile {
            for b in self.batches.drain() {
                drop(b);
            }
            let keys: Vec<usize> = self.handles.read().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
            for k in keys {
                // Bounded: closing (often at exit) must not hang on a stream that never runs.
                let _ = self.handle_deregister(k, 30);
            }
        }
        self.open.store(false, Ordering::Release);
        Ok(())
    }

    // ---- handles ----

    /// The handle `h` names (0 and unknown values: `None`).
    pub fn handle(&self, h: usize) -> Option<Arc<Handle>> {
        self.handles.read().unwrap_or_else(|e| e.into_inner()).get(&h).cloned()
    }

    /// The handle the batch `batch` was set up on (unknown values: `None`).
    pub fn batch_handle(&self, batch: usize) -> Option<usize> {
        let b = self.batches.get(batch)?;
        let h = b.lock().unwrap_or_else(|e| e.into_inner()).handle;
        Some(h)
    }

    /// `HandleRegister` of a descriptor (validated by the face): opens the target and returns
    /// the new handle value.
    pub fn handle_register(&self, fd: c_int) -> CResult<usize> {
        self.require_open()?;
        // A forked child's inherited handles are the parent's: the child registers afresh.
        if self.face == Face::CuFile
            && self
                .handles
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .any(|h| h.fd == fd && !h.storage.in_forked_child())
        {
            return Err(Fail::Code(UGDS_HANDLE_ALREADY_REGISTERED));
        }
        let (storage, access) = open_fd(fd, &self.options())?;
        Ok(self.insert_handle(storage, fd, access))
    }

    /// `ugdsxHandleRegisterTarget`: opens a target by name, as [`Storage::open`] does (a ugds
    /// node, a striped volume `stripe:...`, a volume descriptor file `*.ugds-volume`, an NVMe
    /// over Fabrics URI, a file or a block device), with the face's options (queues, and the
    /// fallback path refused when its configuration turned that off, as for descriptors). The
    /// handle's descriptor (`*(int *)fh`) is -1: the library opened the target.
    pub fn handle_register_target(&self, target: &str) -> CResult<usize> {
        self.require_open()?;
        let opts = self.options();
        let storage = match Target::resolve(target, target, 1)?.open(target, 1, &opts.device)? {
            Some(st) => st,
            None if !opts.fallback => return Err(Fail::Code(UGDS_IO_NOT_SUPPORTED)),
            None => Storage::open_fallback(target)?,
        };
        Ok(self.insert_handle(storage, -1, Access::BOTH))
    }

    /// `uGDSHandleRegisterNvmeof[Ex]`: `fd` is a namespace of the kernel's NVMe over Fabrics
    /// initiator (`/dev/nvmeXnY` whose controller's transport is a fabric). The handle's I/O
    /// goes through our own controller on the same subsystem (read from sysfs, see
    /// [`crate::remote`]); when that controller cannot be connected, through the kernel's block
    /// device behind `fd` (the fallback path, as uGDS's host bounce). Any other descriptor is
    /// `UGDS_INVALID_FILE_TYPE`, a closed one `UGDS_INVALID_VALUE`. `*(int *)fh` is `fd`; the
    /// handle keeps `fd`'s access mode, as every handle of a descriptor does.
    pub fn handle_register_nvmeof(&self, fd: c_int) -> CResult<usize> {
        self.require_open()?;
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|_| Fail::Code(UGDS_INVALID_VALUE))?;
        let path = link.to_string_lossy().into_owned();
        if !crate::remote::sysfs::is_kernel_fabrics_namespace(&path) {
            return Err(Fail::Code(UGDS_INVALID_FILE_TYPE));
        }
        let access = Access::of_mode(status_flags(fd)?);
        let storage = Storage::open(&path)?;
        Ok(self.insert_handle(storage, fd, access))
    }

    /// Makes a handle for an opened target and registers the existing buffers on it.
    fn insert_handle(&self, storage: Arc<Storage>, fd: c_int, access: Access) -> usize {
        let h = Arc::new(Handle::new(storage, fd, access));
        let key = new_handle_value(fd);
        // Visible first, so a concurrent buffer deregistration sees (and cleans) this handle's
        // registrations; then register the buffers that exist already (I/O never registers).
        self.handles.write().unwrap_or_else(|e| e.into_inner()).insert(key, h.clone());
        for b in self.buffers() {
            let _ = self.registration(&h, &b);
        }
        key
    }

    /// `HandleDeregisterEx`: `timeout_sec` 0 checks once, -1 waits as long as it takes, n > 0
    /// waits up to n seconds, below -1 tears down without waiting (the caller asserts that
    /// nothing runs). Unknown handles succeed (already gone).
    pub fn handle_deregister(&self, h: usize, timeout_sec: c_int) -> CResult<()> {
        let Some(handle) = self.handle(h) else { return Ok(()) };
        let deadline = (timeout_sec >= 0).then(|| Instant::now() + Duration::from_secs(timeout_sec as u64));
        // (c_int seconds always fit an Instant.)
        if timeout_sec >= -1 {
            self.settle_streams();
            while handle.inflight.load(Ordering::Acquire) > 0 {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(Fail::Code(UGDS_BUSY));
                }
                std::thread::sleep(Duration::from_micros(200));
                self.settle_streams();
            }
        }
        self.handles.write().unwrap_or_else(|e| e.into_inner()).remove(&h);
        // Batches on this handle end with it (their events can no longer be collected).
        for (k, b) in self.batches.all() {
            if b.lock().unwrap_or_else(|e| e.into_inner()).handle == h {
                self.batches.remove(k);
            }
        }
        Ok(())
    }

    // ---- buffers ----

    fn buffers(&self) -> Vec<Arc<BufEntry>> {
        self.bufs.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// The buffer registered with exactly this base.
    pub(crate) fn buffer(&self, base: usize) -> Option<Arc<BufEntry>> {
        self.bufs.read().unwrap_or_else(|e| e.into_inner()).get(&base).cloned()
    }

    /// `BufRegister`: `gpu` says whether the memory is GPU memory (decided by the face).
    ///
    /// # Safety
    ///
    /// `[base, base+len)` must stay allocated until deregistered.
    pub unsafe fn buf_register(&self, base: usize, len: usize, gpu: Option<Arc<Gpu>>, export: bool) -> CResult<()> {
        // The caller's CUDA context is the same after the call (we may bind ours).
        let _caller = crate::gpu::cuda::CallerContext::keep();
        if base == 0 || len == 0 {
            return Err(Fail::Code(UGDS_INVALID_VALUE));
        }
        let page_aligned = base.is_multiple_of(4096);
        let mem = match gpu {
            Some(g) => {
                if !page_aligned && (self.face == Face::Ugds || export) {
                    return Err(Fail::Code(UGDS_INVALID_VALUE));
                }
                // SAFETY: the caller keeps the memory allocated while registered.
                Memory::Gpu(Arc::new(unsafe { g.borrow(base as u64, len) }?))
            }
            None => {
                if export {
                    return Err(Fail::Code(UGDS_INVALID_VALUE));
                }
                if !page_aligned && self.face == Face::Ugds {
                    return Err(Fail::Code(UGDS_INVALID_VALUE));
                }
                Memory::Host
            }
        };
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let entry = Arc::new(BufEntry {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            base,
            len,
            mem,
            export,
            inflight: AtomicU32::new(0),
            rdma: AtomicU32::new(0),
            born: crate::fork::Born::now(),
        });
        {
            let mut bufs = self.bufs.write().unwrap_or_else(|e| e.into_inner());
            // An entry the parent made before fork() is not this process's registration: the
            // child's replaces it (the parent's handles keep theirs, and refuse I/O by name).
            if bufs.get(&base).is_some_and(|e| !e.born.in_child()) {
                return Err(Fail::Code(UGDS_MEMORY_ALREADY_REGISTERED));
            }
            bufs.insert(base, entry.clone());
        }
        // Register on every handle now, so I/O never makes registration calls (not on the
        // parent's handles in a forked child: they refuse I/O by name).
        let handles: Vec<Arc<Handle>> = self
            .handles
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|h| !h.storage.in_forked_child())
            .cloned()
            .collect();
        for h in handles {
            if let Err(e) = self.registration(&h, &entry) {
                let _ = self.buf_deregister(base);
                return Err(e);
            }
        }
        Ok(())
    }

    /// `BufDeregister`: refused while I/O on it runs or RDMA regions use it.
    pub fn buf_deregister(&self, base: usize) -> CResult<()> {
        // A copy that released a stream and is over no longer holds the buffer.
        self.settle_streams();
        let mut bufs = self.bufs.write().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = bufs.get(&base).cloned() else { return Err(Fail::Code(UGDS_MEMORY_NOT_REGISTERED)) };
        if entry.rdma.load(Ordering::Acquire) > 0 {
            return Err(Fail::Code(UGDS_RDMA_MR_STILL_ACTIVE));
        }
        let handles: Vec<Arc<Handle>> =
            self.handles.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        let mut locked: Vec<_> = handles.iter().map(|h| h.regs.write().unwrap_or_else(|e| e.into_inner())).collect();
        // Someone else holding a registration is I/O (sync, batch or stream-ordered) using it.
        let busy = entry.inflight.load(Ordering::Acquire) > 0
            || locked.iter().any(|m| m.get(&base).is_some_and(|(_, b)| Arc::strong_count(b) > 1 || b.inflight() > 0));
        if busy {
            return Err(Fail::Code(UGDS_BUSY));
        }
        for m in locked.iter_mut() {
            m.remove(&base);
        }
        bufs.remove(&base);
        Ok(())
    }

    /// Whether I/O (sync, batch or stream-ordered) uses `e` now.
    fn buf_busy(&self, e: &BufEntry) -> bool {
        if e.inflight.load(Ordering::Acquire) > 0 {
            return true;
        }
        let handles: Vec<Arc<Handle>> =
            self.handles.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        handles.iter().any(|h| {
            h.regs
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(&e.base)
                .is_some_and(|(_, b)| Arc::strong_count(b) > 1 || b.inflight() > 0)
        })
    }

    /// `h`'s registration of `e` (made now if the buffer or handle is new).
    pub(crate) fn registration(&self, h: &Handle, e: &BufEntry) -> CResult<Arc<Buffer>> {
        let id = e.id;
        if let Some((made_for, b)) = h.regs.read().unwrap_or_else(|e| e.into_inner()).get(&e.base) {
            if *made_for == id {
                return Ok(b.clone());
            }
        }
        let b = Arc::new(register_on(&h.storage, e)?);
        // Still registered? (A deregistration may have raced with us; it holds this lock first.)
        let bufs = self.bufs.read().unwrap_or_else(|e| e.into_inner());
        if bufs.get(&e.base).is_none_or(|x| x.id != e.id) {
            return Err(Fail::Code(UGDS_MEMORY_NOT_REGISTERED));
        }
        let mut regs = h.regs.write().unwrap_or_else(|e| e.into_inner());
        match regs.get(&e.base) {
            Some((made_for, existing)) if *made_for == id => Ok(existing.clone()),
            // None, or one made for an earlier registration at this address: replace it.
            _ => {
                regs.insert(e.base, (id, b.clone()));
                Ok(b)
            }
        }
    }

    /// Takes an aligned host buffer of `h`'s storage for staged I/O.
    pub(crate) fn take_bounce(&self, h: &Handle) -> CResult<Buffer> {
        if let Some(b) = h.bounce.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(b);
        }
        Ok(h.storage.alloc_host(BOUNCE)?)
    }

    /// Returns a bounce buffer that nothing may still use (one that a failed I/O or GPU copy may
    /// still use stays with that failure's `InFlight` token instead, never reaching the pool).
    pub(crate) fn put_bounce(&self, h: &Handle, b: Buffer) {
        let mut pool = h.bounce.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < 8 {
            pool.push(b);
        }
    }
}

/// Size of one bounce buffer (staged I/O moves this much per step).
pub(crate) const BOUNCE: usize = 1 << 20;

/// Registers `e`'s memory on `s`.
fn register_on(s: &Storage, e: &BufEntry) -> CResult<Buffer> {
    match &e.mem {
        Memory::Gpu(m) => s.register_gpu(m.clone(), true).map_err(|err| match err {
            Error::Unsupported { .. } | Error::Gpu { .. } | Error::PeerToPeerRefused => {
                Fail::Code(UGDS_GPU_MEMORY_PINNING_FAILED)
            }
            other => Fail::Lib(other),
        }),
        Memory::Host => {
            // The pages that hold the buffer (mappings are page-granular, so they are mapped).
            let start = e.base & !4095;
            let len = (e.base + e.len).next_multiple_of(4096) - start;
            // SAFETY: the caller registered [base, base+len) and keeps it mapped until it
            // deregisters, which drops this registration first; the rest of its pages belong
            // to the same mappings.
            Ok(unsafe { s.register_host(start as *mut u8, len) }?)
        }
    }
}

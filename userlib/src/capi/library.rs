//! The state behind a C face: open/closed, registered handles and buffers, batches, streams.
//! Both faces share this code; where uGDS and cuFile define different behaviour, [`Face`] picks
//! (the differences are listed on [`Face`]). Every function returns a typed [`Fail`] that each
//! face turns into its own codes.

use super::slots::Slots;
use super::types::uGDSError;
use super::types::uGDSOpError::{self, *};
use crate::buffer::Buffer;
use crate::error::Error;
use crate::fallback::FileTarget;
use crate::gpu::{Gpu, GpuMemory};
use crate::storage::Storage;
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

/// Why a call failed, before a face turns it into its codes.
#[derive(Debug)]
pub enum Fail {
    /// A library status code.
    Code(uGDSOpError),
    /// An errno (read/write return it negated).
    Errno(c_int),
    /// An error of the layer below, mapped by [`Fail::code`] / [`Fail::errno`].
    Lib(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Lib(e)
    }
}

impl From<Error> for crate::inflight::Failed<Fail> {
    fn from(e: Error) -> Self {
        Fail::Lib(e).into()
    }
}

impl Fail {
    /// As a status code.
    pub fn code(&self) -> uGDSOpError {
        match self {
            Fail::Code(c) => *c,
            Fail::Errno(e) if *e == libc::ENOMEM => UGDS_OUT_OF_MEMORY,
            Fail::Errno(e) if *e == libc::EBUSY => UGDS_BUSY,
            Fail::Errno(_) => UGDS_INVALID_VALUE,
            Fail::Lib(e) => code_of(e),
        }
    }

    /// As a status.
    pub fn status(&self) -> uGDSError {
        uGDSError { err: self.code(), cu_err: 0 }
    }

    /// As a read/write result for `face`: uGDS reports errnos only (a library condition becomes
    /// the errno it stands for); cuFile also `-code`.
    pub fn ret_for(&self, face: Face) -> libc::ssize_t {
        if face == Face::CuFile {
            return self.ret();
        }
        let errno = match self {
            Fail::Errno(e) => *e,
            Fail::Lib(e) => -e.errno(),
            Fail::Code(UGDS_MEMORY_NOT_REGISTERED | UGDS_INVALID_VALUE) => libc::EINVAL,
            Fail::Code(UGDS_BUSY) => libc::EBUSY,
            // A read through a write-only descriptor (or the reverse), as read(2) says it.
            Fail::Code(UGDS_INVALID_FILE_OPEN_FLAG) => libc::EBADF,
            Fail::Code(UGDS_OUT_OF_MEMORY) => libc::ENOMEM,
            Fail::Code(_) => libc::EIO,
        };
        -(errno.max(1) as libc::ssize_t)
    }

    /// As a read/write return value: `-errno`, or `-code` for library codes.
    pub fn ret(&self) -> libc::ssize_t {
        match self {
            Fail::Code(c) => -(*c as libc::ssize_t),
            Fail::Errno(e) => -(*e as libc::ssize_t),
            Fail::Lib(e) => e.errno() as libc::ssize_t,
        }
    }
}

/// The status code for an error of the layer below.
pub fn code_of(e: &Error) -> uGDSOpError {
    match e {
        Error::InvalidArgument { .. } => UGDS_INVALID_VALUE,
        Error::RegistrationBusy { .. } => UGDS_BUSY,
        Error::Open { .. } | Error::NoNamespace(_) => UGDS_DEVICE_NOT_FOUND,
        Error::AbiMismatch { .. } => UGDS_DRIVER_VERSION_MISMATCH,
        Error::Gpu { .. } => UGDS_CUDA_DRIVER_ERROR,
        Error::Unsupported { .. } => UGDS_IO_NOT_SUPPORTED,
        Error::Control { source, .. } if source.raw_os_error() == Some(libc::ENOMEM) => UGDS_OUT_OF_MEMORY,
        Error::Control { .. } => UGDS_NVFS_DRIVER_ERROR,
        // The library holds nothing of this process's for the object: a child of fork() opens
        // the driver, its handles and its buffers again (uGDS and cuFile name it so).
        Error::ForkedChild { .. } => UGDS_DRIVER_NOT_INITIALIZED,
        _ => UGDS_INTERNAL_ERROR,
    }
}

/// Result of the core functions.
pub type CResult<T> = Result<T, Fail>;

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

/// What a handle value points at: uGDS's programs read the registered fd from the first `int`
/// of a handle (`*(int *)fh`), so a handle is the address of one of these. Records are never
/// freed or reused, so a stale handle can never name a newer registration; lookups go through
/// a table keyed by the address, so a forged value is a miss and is never dereferenced.
#[repr(C)]
struct HandleRecord {
    fd: c_int,
}

/// A registered file or device.
pub struct Handle {
    /// Where its I/O goes.
    pub storage: Arc<Storage>,
    /// The caller's descriptor.
    pub fd: c_int,
    /// What the caller's descriptor allows: reads and writes against its mode are refused.
    pub access: Access,
    /// Stream-ordered I/O and batches not yet finished (deregistering waits for them).
    pub(crate) inflight: Arc<AtomicU32>,
    /// This handle's registration of each registered buffer, by base address, with the
    /// identity of the registration (`BufEntry`) it was made for.
    regs: RwLock<HashMap<usize, (u64, Arc<Buffer>)>>,
    /// Aligned host buffers of this storage for staged I/O (cuFile semantics).
    bounce: Mutex<Vec<Buffer>>,
    /// Blocks a staged write is reading, modifying and writing (namespaces only).
    edges: Mutex<std::collections::HashSet<u64>>,
    edges_freed: std::sync::Condvar,
}

/// The directions of I/O a handle allows: a file or block device's descriptor's access mode
/// (`O_RDONLY`, `O_WRONLY`, `O_RDWR`), as cuFile keeps it; both for a ugds node, a volume and a
/// target the library opened by name (their descriptors name a controller, not the data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Reads are allowed.
    pub read: bool,
    /// Writes are allowed.
    pub write: bool,
}

impl Access {
    /// Reads and writes.
    pub const BOTH: Access = Access { read: true, write: true };

    /// The access an `O_ACCMODE` value gives.
    pub fn of_mode(flags: c_int) -> Access {
        match flags & libc::O_ACCMODE {
            libc::O_RDONLY => Access { read: true, write: false },
            libc::O_WRONLY => Access { read: false, write: true },
            _ => Access::BOTH,
        }
    }

    /// Refuses I/O in a direction the descriptor was not opened for with cuFile's code
    /// (`CU_FILE_INVALID_FILE_OPEN_FLAG`, "unsupported file open flags").
    pub fn check(self, write: bool) -> CResult<()> {
        if (write && !self.write) || (!write && !self.read) {
            return Err(Fail::Code(UGDS_INVALID_FILE_OPEN_FLAG));
        }
        Ok(())
    }
}

/// Edge blocks locked by a staged write; released on drop.
pub(crate) struct EdgeLock<'a> {
    handle: &'a Handle,
    blocks: Vec<u64>,
}

impl Drop for EdgeLock<'_> {
    fn drop(&mut self) {
        let mut held = self.handle.edges.lock().unwrap_or_else(|e| e.into_inner());
        for b in &self.blocks {
            held.remove(b);
        }
        self.handle.edges_freed.notify_all();
    }
}

impl Handle {
    /// Locks the partly covered first and last blocks of `[off, off+len)` (both at once, so two
    /// writers never wait for each other crosswise).
    pub(crate) fn lock_edges(&self, off: u64, len: u64, bs: u64) -> EdgeLock<'_> {
        let end = off + len;
        let mut blocks = Vec::with_capacity(2);
        if !off.is_multiple_of(bs) {
            blocks.push(off / bs);
        }
        if !end.is_multiple_of(bs) && !blocks.contains(&(end / bs)) {
            blocks.push(end / bs);
        }
        let mut held = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        while blocks.iter().any(|b| held.contains(b)) {
            held = self.edges_freed.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        held.extend(blocks.iter().copied());
        EdgeLock { handle: self, blocks }
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Handle(fd {})", self.fd)
    }
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
    /// node, a striped volume `stripe:...`, a volume descriptor file `*.ugds-volume`, a file
    /// or a block device). The handle's descriptor (`*(int *)fh`) is -1: the library opened the target.
    pub fn handle_register_target(&self, target: &str) -> CResult<usize> {
        self.require_open()?;
        let storage = Storage::open(target)?;
        Ok(self.insert_handle(storage, -1, Access::BOTH))
    }

    /// `uGDSHandleRegisterNvmeof[Ex]`: `fd` is a namespace of the kernel's NVMe over Fabrics
    /// initiator (`/dev/nvmeXnY` whose controller's transport is a fabric). The handle's I/O
    /// goes through our own controller on the same subsystem (read from sysfs, see
    /// [`crate::remote`]); when that controller cannot be connected, through the kernel's block
    /// device behind `fd` (the fallback path, as uGDS's host bounce). Any other descriptor is
    /// `UGDS_INVALID_FILE_TYPE`, a closed one `UGDS_INVALID_VALUE`. `*(int *)fh` is `fd`.
    pub fn handle_register_nvmeof(&self, fd: c_int) -> CResult<usize> {
        self.require_open()?;
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|_| Fail::Code(UGDS_INVALID_VALUE))?;
        let path = link.to_string_lossy().into_owned();
        if !crate::remote::sysfs::is_kernel_fabrics_namespace(&path) {
            return Err(Fail::Code(UGDS_INVALID_FILE_TYPE));
        }
        let storage = Storage::open(&path)?;
        Ok(self.insert_handle(storage, fd, Access::BOTH))
    }

    /// Makes a handle for an opened target and registers the existing buffers on it.
    fn insert_handle(&self, storage: Arc<Storage>, fd: c_int, access: Access) -> usize {
        let h = Arc::new(Handle {
            storage,
            fd,
            access,
            inflight: Arc::default(),
            regs: RwLock::default(),
            bounce: Mutex::default(),
            edges: Mutex::default(),
            edges_freed: Default::default(),
        });
        // A record of its own for every handle, never freed: see `HandleRecord`.
        let rec: &'static mut HandleRecord = Box::leak(Box::new(HandleRecord { fd }));
        let key = rec as *mut HandleRecord as usize;
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
            while handle.inflight.load(Ordering::Acquire) > 0 {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(Fail::Code(UGDS_BUSY));
                }
                std::thread::sleep(Duration::from_micros(200));
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

/// Opens the target behind a caller's descriptor: a ugds node takes the direct path; a regular
/// file or block device the fallback path, through a descriptor of our own opened with O_DIRECT
/// (so a file the caller opened without it still bypasses the page cache) and the caller's
/// access mode, which the handle keeps.
fn open_fd(fd: c_int, opts: &super::FaceOptions) -> CResult<(Arc<Storage>, Access)> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|_| Fail::Code(UGDS_INVALID_VALUE))?;
    let path = link.to_string_lossy().into_owned();
    if crate::device::is_ugds_node(format!("/proc/self/fd/{fd}")) {
        crate::fork::watch()?;
        let dev = crate::device::Device::open_with(&path, opts.device.clone())?;
        return Ok((Storage::direct(&dev, 1)?, Access::BOTH));
    }
    // A volume descriptor file, by the name the caller opened (`*.ugds-volume`; a file of any
    // other name is a file, whatever it holds), read through the caller's descriptor (the file
    // the name led to): the handle's I/O goes to the volume, never to the file's bytes.
    let name = descriptor_name(fd, &path);
    if let Some(spec) = crate::volume::VolumeSpec::descriptor_target(name, format!("/proc/self/fd/{fd}"))? {
        return Ok((Storage::volume(&spec, &opts.device)?, Access::BOTH));
    }
    if !opts.fallback {
        // A file or block device takes the fallback path, which the face's configuration
        // turned off (cuFile: allow_compat_mode false).
        return Err(Fail::Code(UGDS_IO_NOT_SUPPORTED));
    }
    // SAFETY: F_GETFL on a descriptor the caller owns (an invalid one returns -1).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(Fail::Code(UGDS_INVALID_VALUE));
    }
    let access = Access::of_mode(flags);
    let file = reopen_direct(fd, access)
        .map(|f| (f, true))
        .or_else(|_| dup_own(fd).map(|f| (f, flags & libc::O_DIRECT != 0)))?;
    match FileTarget::from_file(file.0, &path, file.1) {
        Ok(f) => Ok((Storage::file(f)?, access)),
        Err(Error::InvalidArgument { .. }) => Err(Fail::Code(UGDS_INVALID_FILE_TYPE)),
        Err(e) => Err(Fail::Lib(e)),
    }
}

/// The name of the file behind `fd`, whose /proc link reads `link`: the link, less the
/// " (deleted)" the kernel appends once the file has no name left (so an unlinked descriptor
/// file still counts as one).
fn descriptor_name(fd: c_int, link: &str) -> &str {
    // SAFETY: fstat fills the struct we pass; an invalid descriptor returns -1.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let unlinked = unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_nlink == 0;
    match link.strip_suffix(" (deleted)") {
        Some(name) if unlinked => name,
        _ => link,
    }
}

/// Opens the caller's file again, with O_DIRECT and the caller's access mode, through /proc
/// (the same file even if renamed or unlinked since). Opening through /proc checks the file's
/// permissions, not the descriptor's mode: asking for more than the caller's mode would give a
/// write-only descriptor's handle the file's bytes.
fn reopen_direct(fd: c_int, access: Access) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(access.read)
        .write(access.write)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{fd}"))
}

/// A duplicate of the caller's descriptor that we own.
fn dup_own(fd: c_int) -> CResult<std::fs::File> {
    // SAFETY: dup of a descriptor the caller passed; failure returns -1.
    let own = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if own < 0 {
        return Err(Fail::Code(UGDS_GETNEWFD_FAILED));
    }
    // SAFETY: `own` is a new descriptor nobody else owns.
    Ok(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(own) })
}

//! The C ABI (`libugds.so`, header `include/ugds.h`): uGDS's names with cuFile's semantics,
//! over [`crate::Storage`]. Every handle, buffer, batch and stream the C side names is looked
//! up in a registry first, so an unknown or stale pointer is an error code, never undefined
//! behaviour. Read/write return bytes, `-errno` for OS and argument errors, and `-code` for
//! library errors (`code` a `uGDSOpError`).

pub mod types;

use crate::batch::{IoStatus, Op};
use crate::error::Error;
use crate::fallback::FileTarget;
use crate::gpu::{Gpu, GpuMemory};
use crate::storage::{Buffer, Storage};
use crate::storage_batch::{IoRequest, StorageBatch};
use crate::stream::{CpuStream, Stream};
use crate::stream_io::{AsyncOp, AsyncParams, StreamIo};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use types::uGDSOpError::*;
pub use types::*;

/// A registered file or device.
struct Handle {
    storage: Arc<Storage>,
    fd: c_int,
    inflight: Arc<AtomicU32>,
    /// This handle's registration of each registered buffer (made on first use).
    bufs: Mutex<HashMap<usize, Arc<Buffer>>>,
}

enum Memory {
    Host,
    Gpu(Arc<GpuMemory>),
}

/// Memory registered with `uGDSBufRegister`.
struct BufEntry {
    len: usize,
    mem: Memory,
}

/// A batch: entries for one handle, events kept until read.
struct CBatch {
    handle: usize,
    sb: StorageBatch,
    ready: VecDeque<uGDSIOEvents_t>,
    cookies: HashMap<u64, *mut c_void>,
    next: u64,
}

// SAFETY: cookies are opaque values handed back to the caller, never dereferenced.
unsafe impl Send for CBatch {}

#[derive(Default)]
struct State {
    open: bool,
    handles: HashMap<usize, Arc<Handle>>,
    bufs: BTreeMap<usize, Arc<BufEntry>>,
    batches: HashMap<usize, Arc<Mutex<CBatch>>>,
    streams: HashMap<usize, Arc<StreamIo>>,
    cpu_streams: HashMap<usize, Arc<CpuStream>>,
    next_id: usize,
}

// SAFETY: everything in the state is Send (Arcs of Send + Sync values, raw cookies that are
// never dereferenced).
unsafe impl Send for State {}

fn state() -> MutexGuard<'static, State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The CUDA runtime, when this machine has one.
fn cuda() -> Option<Arc<Gpu>> {
    static G: OnceLock<Option<Arc<Gpu>>> = OnceLock::new();
    G.get_or_init(|| if crate::gpu::cuda::driver_present() { Gpu::cuda().ok() } else { None }).clone()
}

fn code_of(e: &Error) -> types::uGDSOpError {
    match e {
        Error::InvalidArgument { .. } => UGDS_INVALID_VALUE,
        Error::RegistrationBusy { .. } => UGDS_BUSY,
        Error::Open { .. } | Error::NoNamespace(_) => UGDS_DEVICE_NOT_FOUND,
        Error::AbiMismatch { .. } => UGDS_DRIVER_VERSION_MISMATCH,
        Error::Gpu { .. } => UGDS_CUDA_DRIVER_ERROR,
        Error::Unsupported { .. } => UGDS_PLATFORM_NOT_SUPPORTED,
        Error::Control { source, .. } if source.raw_os_error() == Some(libc::ENOMEM) => UGDS_OUT_OF_MEMORY,
        Error::Control { .. } => UGDS_NVFS_DRIVER_ERROR,
        _ => UGDS_INTERNAL_ERROR,
    }
}

fn err(e: &Error) -> uGDSError_t {
    uGDSError_t::of(code_of(e))
}

/// The value read/write return for an error.
fn neg(e: &Error) -> libc::ssize_t {
    e.errno() as libc::ssize_t
}

fn lib(code: types::uGDSOpError) -> libc::ssize_t {
    -(code as libc::ssize_t)
}

fn handle(st: &State, h: uGDSHandle_t) -> Option<Arc<Handle>> {
    st.handles.get(&(h as usize)).cloned()
}

/// Finds the registered buffer containing `ptr`: (its base, entry).
fn buffer_at(st: &State, ptr: usize) -> Option<(usize, Arc<BufEntry>)> {
    let (&base, e) = st.bufs.range(..=ptr).next_back()?;
    (ptr < base + e.len).then(|| (base, e.clone()))
}

/// This handle's registration of the buffer at `base`.
fn handle_buffer(h: &Handle, base: usize, e: &BufEntry) -> Result<Arc<Buffer>, Error> {
    let mut bufs = h.bufs.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(b) = bufs.get(&base) {
        return Ok(b.clone());
    }
    let b = Arc::new(match &e.mem {
        // SAFETY: the caller registered [base, base+len) with uGDSBufRegister and keeps it
        // mapped until uGDSBufDeregister, which drops this registration first.
        Memory::Host => unsafe { h.storage.register_host(base as *mut u8, e.len)? },
        Memory::Gpu(m) => h.storage.register_gpu(m.clone(), true)?,
    });
    bufs.insert(base, b.clone());
    Ok(b)
}

/// Why `resolve` failed: a library code, or an error of registering the buffer.
enum Unresolved {
    Lib(types::uGDSOpError),
    Os(Error),
}

impl Unresolved {
    /// As a read/write return value.
    fn ret(&self) -> libc::ssize_t {
        match self {
            Unresolved::Lib(code) => lib(*code),
            Unresolved::Os(e) => neg(e),
        }
    }

    /// As a status.
    fn status(&self) -> uGDSError_t {
        match self {
            Unresolved::Lib(code) => uGDSError_t::of(*code),
            Unresolved::Os(e) => err(e),
        }
    }
}

/// Resolves (handle, buffer pointer) for an I/O: the handle, its buffer, and the offset of
/// `ptr` in it.
fn resolve(h: uGDSHandle_t, ptr: *mut c_void) -> Result<(Arc<Handle>, Arc<Buffer>, u64), Unresolved> {
    let st = state();
    let h = handle(&st, h).ok_or(Unresolved::Lib(UGDS_HANDLE_NOT_REGISTERED))?;
    let (base, e) = buffer_at(&st, ptr as usize).ok_or(Unresolved::Lib(UGDS_MEMORY_NOT_REGISTERED))?;
    drop(st);
    let b = handle_buffer(&h, base, &e).map_err(|e| match e {
        Error::Unsupported { .. } | Error::Gpu { .. } => Unresolved::Lib(UGDS_GPU_MEMORY_PINNING_FAILED),
        e => Unresolved::Os(e),
    })?;
    Ok((h, b, (ptr as usize - base) as u64))
}

/// Opens the library (also done implicitly by the first call, as cuFile does).
#[no_mangle]
pub extern "C" fn uGDSDriverOpen() -> uGDSError_t {
    state().open = true;
    uGDSError_t::OK
}

/// Closes the library: every handle, buffer, batch and stream registration is released (after
/// their I/O finishes).
#[no_mangle]
pub extern "C" fn uGDSDriverClose() -> uGDSError_t {
    let old = std::mem::take(&mut *state());
    drop(old);
    uGDSError_t::OK
}

/// Registers a file descriptor: `/dev/ugdsN` (direct path, namespace 1), a regular file or a
/// block device (fallback path). The library keeps its own descriptor; the caller may close
/// theirs after deregistering.
///
/// # Safety
///
/// `fh` and `descr` must be valid pointers (NULL is refused).
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleRegister(fh: *mut uGDSHandle_t, descr: *const uGDSDescr_t) -> uGDSError_t {
    if fh.is_null() || descr.is_null() {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    // SAFETY: checked non-null; the caller passes a valid descriptor.
    let d = unsafe { *descr };
    if d.type_ != uGDSHandleType::UGDS_HANDLE_TYPE_OPAQUE_FD {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    // SAFETY: the union's fd member for an OPAQUE_FD descriptor.
    let fd = unsafe { d.handle.fd };
    if state().handles.values().any(|h| h.fd == fd) {
        return uGDSError_t::of(UGDS_HANDLE_ALREADY_REGISTERED);
    }
    let storage = match open_fd(fd) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let mut st = state();
    st.open = true;
    st.next_id += 1;
    let h = Arc::new(Handle { storage, fd, inflight: Arc::default(), bufs: Mutex::default() });
    let key = Arc::as_ptr(&h) as usize;
    st.handles.insert(key, h);
    // SAFETY: checked non-null.
    unsafe { *fh = key as uGDSHandle_t };
    uGDSError_t::OK
}

fn open_fd(fd: c_int) -> Result<Arc<Storage>, uGDSError_t> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|_| uGDSError_t::of(UGDS_INVALID_VALUE))?;
    let path = link.to_string_lossy().into_owned();
    if path.starts_with("/dev/ugds") {
        return Storage::open(&path).map_err(|e| err(&e));
    }
    // SAFETY: F_GETFL on a descriptor the caller owns (an invalid one returns -1).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(uGDSError_t::of(UGDS_INVALID_VALUE));
    }
    // Our own descriptor, so the caller's may be closed independently.
    // SAFETY: dup of a valid descriptor.
    let own = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if own < 0 {
        return Err(uGDSError_t::of(UGDS_GETNEWFD_FAILED));
    }
    // SAFETY: `own` is a new descriptor we own.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(own) };
    match FileTarget::from_file(file, &path, flags & libc::O_DIRECT != 0) {
        Ok(f) => Storage::file(f).map_err(|e| err(&e)),
        Err(Error::InvalidArgument { .. }) => Err(uGDSError_t::of(UGDS_INVALID_FILE_TYPE)),
        Err(e) => Err(err(&e)),
    }
}

/// Deregisters a handle, waiting for its I/O.
///
/// # Safety
///
/// `fh` is a handle from `uGDSHandleRegister` (unknown values are ignored).
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleDeregister(fh: uGDSHandle_t) {
    // SAFETY: forwarded.
    let _ = unsafe { uGDSHandleDeregisterEx(fh, -1) };
}

/// Deregisters a handle. `timeout_sec`: 0 checks only (`UGDS_BUSY` while I/O is in flight),
/// -1 waits as long as it takes, n > 0 waits up to n seconds.
///
/// # Safety
///
/// `fh` is a handle from `uGDSHandleRegister` (unknown values are an error).
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleDeregisterEx(fh: uGDSHandle_t, timeout_sec: c_int) -> uGDSError_t {
    let Some(h) = handle(&state(), fh) else { return uGDSError_t::of(UGDS_HANDLE_NOT_REGISTERED) };
    let deadline = (timeout_sec >= 0).then(|| Instant::now() + Duration::from_secs(timeout_sec as u64));
    let busy = || {
        // Batches are locked after the state lock is released (submit locks batch, then state).
        let batches: Vec<_> = state().batches.values().cloned().collect();
        h.inflight.load(Ordering::Acquire) > 0 || batches.iter().any(|b| batch_busy(b, fh as usize))
    };
    while busy() {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return uGDSError_t::of(UGDS_BUSY);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    state().handles.remove(&(fh as usize));
    uGDSError_t::OK
}

fn batch_busy(b: &Mutex<CBatch>, h: usize) -> bool {
    let b = b.lock().unwrap_or_else(|e| e.into_inner());
    b.handle == h && b.sb.in_flight() > 0
}

/// The size of the file or namespace behind a handle.
///
/// # Safety
///
/// `size` must be a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn uGDSGetDeviceCapacity(fh: uGDSHandle_t, size: *mut u64) -> uGDSError_t {
    let Some(h) = handle(&state(), fh) else { return uGDSError_t::of(UGDS_HANDLE_NOT_REGISTERED) };
    if size.is_null() {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    match h.storage.capacity() {
        // SAFETY: checked non-null.
        Ok(n) => unsafe {
            *size = n;
            uGDSError_t::OK
        },
        Err(e) => err(&e),
    }
}

/// Registers memory for I/O: GPU memory (detected from the pointer) or page-aligned host memory.
///
/// # Safety
///
/// `[ptr, ptr+len)` must stay allocated until `uGDSBufDeregister`.
#[no_mangle]
pub unsafe extern "C" fn uGDSBufRegister(ptr: *const c_void, len: usize, flags: c_int) -> uGDSError_t {
    // No flags are defined (cuFile's are reserved too).
    let _ = flags;
    let cfg = uGDSBufConfig_t { backend: uGDSBackend_t::UGDS_BACKEND_DEFAULT, enable_export: false };
    // SAFETY: forwarded.
    unsafe { uGDSBufRegisterEx(ptr, len, &cfg) }
}

/// Registers memory with options (backend; whether it will be exported as a dma-buf).
///
/// # Safety
///
/// As `uGDSBufRegister`; `cfg` may be NULL (defaults).
#[no_mangle]
pub unsafe extern "C" fn uGDSBufRegisterEx(ptr: *const c_void, len: usize, cfg: *const uGDSBufConfig_t) -> uGDSError_t {
    let cfg = if cfg.is_null() {
        uGDSBufConfig_t { backend: uGDSBackend_t::UGDS_BACKEND_DEFAULT, enable_export: false }
    } else {
        // SAFETY: checked non-null.
        unsafe { *cfg }
    };
    let p = ptr as usize;
    if p == 0 || len == 0 {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    if cfg.backend == uGDSBackend_t::UGDS_BACKEND_HIP {
        return uGDSError_t::of(UGDS_PLATFORM_NOT_SUPPORTED);
    }
    let gpu = cuda().filter(|g| g.runtime().is_device_memory(p as u64));
    if cfg.backend == uGDSBackend_t::UGDS_BACKEND_CUDA && gpu.is_none() {
        return uGDSError_t::of(UGDS_CUDA_MEMORY_TYPE_INVALID);
    }
    let mem = match gpu {
        // SAFETY: the caller keeps the memory allocated while registered.
        Some(g) => match unsafe { g.borrow(p as u64, len) } {
            Ok(m) => Memory::Gpu(Arc::new(m)),
            Err(e) => return err(&e),
        },
        None => Memory::Host,
    };
    let aligned = p.is_multiple_of(4096) && (!cfg.enable_export || len.is_multiple_of(4096));
    if !aligned && (matches!(mem, Memory::Host) || cfg.enable_export) {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    let mut st = state();
    st.open = true;
    if st.bufs.range(..p + len).next_back().is_some_and(|(&b, e)| b + e.len > p) {
        return uGDSError_t::of(UGDS_MEMORY_ALREADY_REGISTERED);
    }
    st.bufs.insert(p, Arc::new(BufEntry { len, mem }));
    uGDSError_t::OK
}

/// Deregisters memory; `UGDS_BUSY` while I/O on it is in flight.
///
/// # Safety
///
/// `ptr` is the base passed to `uGDSBufRegister`.
#[no_mangle]
pub unsafe extern "C" fn uGDSBufDeregister(ptr: *const c_void) -> uGDSError_t {
    let mut st = state();
    if !st.bufs.contains_key(&(ptr as usize)) {
        return uGDSError_t::of(UGDS_MEMORY_NOT_REGISTERED);
    }
    let busy = st.handles.values().any(|h| {
        h.bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(ptr as usize))
            .is_some_and(|b| Arc::strong_count(b) > 1 || b.inflight() > 0)
    });
    if busy {
        return uGDSError_t::of(UGDS_BUSY);
    }
    for h in st.handles.values() {
        h.bufs.lock().unwrap_or_else(|e| e.into_inner()).remove(&(ptr as usize));
    }
    st.bufs.remove(&(ptr as usize));
    uGDSError_t::OK
}

/// Exports registered GPU memory as a dma-buf (for RDMA and other consumers); the caller owns
/// the returned fd.
///
/// # Safety
///
/// `out` must be a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn uGDSExportDmabuf(ptr: *const c_void, out: *mut uGDSDmabufExport_t) -> uGDSError_t {
    if out.is_null() {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    let e = state().bufs.get(&(ptr as usize)).cloned();
    let Some(e) = e else { return uGDSError_t::of(UGDS_MEMORY_NOT_REGISTERED) };
    let Memory::Gpu(m) = &e.mem else { return uGDSError_t::of(UGDS_INVALID_VALUE) };
    match m.export_dmabuf() {
        Ok(fd) => {
            // SAFETY: checked non-null.
            unsafe {
                *out = uGDSDmabufExport_t { fd: std::os::fd::IntoRawFd::into_raw_fd(fd), offset: 0, length: e.len }
            };
            uGDSError_t::OK
        }
        Err(e) => err(&e),
    }
}

fn rw(
    write: bool,
    fh: uGDSHandle_t,
    buf: *mut c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_offset: libc::off_t,
) -> libc::ssize_t {
    if file_offset < 0 || buf_offset < 0 {
        return -(libc::EINVAL as libc::ssize_t);
    }
    let (h, b, off) = match resolve(fh, buf) {
        Ok(x) => x,
        Err(u) => return u.ret(),
    };
    h.inflight.fetch_add(1, Ordering::AcqRel);
    let r = if write {
        h.storage.write(&b, off + buf_offset as u64, file_offset as u64, size as u64)
    } else {
        h.storage.read(&b, off + buf_offset as u64, file_offset as u64, size as u64)
    };
    h.inflight.fetch_sub(1, Ordering::AcqRel);
    match r {
        Ok(n) => n as libc::ssize_t,
        Err(e) => neg(&e),
    }
}

/// Reads `size` bytes at `file_offset` into registered memory at `buf_base + buf_offset`.
/// Returns bytes read, `-errno`, or `-code`.
///
/// # Safety
///
/// `buf_base` must lie in registered memory.
#[no_mangle]
pub unsafe extern "C" fn uGDSRead(
    fh: uGDSHandle_t,
    buf_base: *mut c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_offset: libc::off_t,
) -> libc::ssize_t {
    rw(false, fh, buf_base, size, file_offset, buf_offset)
}

/// Writes `size` bytes from registered memory at `buf_base + buf_offset` to `file_offset`.
///
/// # Safety
///
/// As `uGDSRead`.
#[no_mangle]
pub unsafe extern "C" fn uGDSWrite(
    fh: uGDSHandle_t,
    buf_base: *const c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_offset: libc::off_t,
) -> libc::ssize_t {
    rw(true, fh, buf_base as *mut c_void, size, file_offset, buf_offset)
}

/// Sets up a batch of up to `nr` entries in flight on one handle (threads start here).
///
/// # Safety
///
/// `batch` must be a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOSetUp(batch: *mut uGDSBatchHandle_t, fh: uGDSHandle_t, nr: c_uint) -> uGDSError_t {
    if batch.is_null() || nr == 0 {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    let Some(h) = handle(&state(), fh) else { return uGDSError_t::of(UGDS_HANDLE_NOT_REGISTERED) };
    let sb = match StorageBatch::new(&h.storage, nr as usize) {
        Ok(b) => b,
        Err(e) => return err(&e),
    };
    let b = Arc::new(Mutex::new(CBatch {
        handle: fh as usize,
        sb,
        ready: VecDeque::new(),
        cookies: HashMap::new(),
        next: 0,
    }));
    let key = Arc::as_ptr(&b) as usize;
    state().batches.insert(key, b);
    // SAFETY: checked non-null.
    unsafe { *batch = key as uGDSBatchHandle_t };
    uGDSError_t::OK
}

fn find_batch(b: uGDSBatchHandle_t) -> Option<Arc<Mutex<CBatch>>> {
    state().batches.get(&(b as usize)).cloned()
}

/// Submits `nr` entries. Entries whose buffer is not registered or whose arguments are invalid
/// become `UGDS_BATCH_INVALID` events; the rest run. `UGDS_BATCH_CAPACITY_EXCEEDED` (nothing
/// submitted) when they exceed the free capacity.
///
/// # Safety
///
/// `params` must point to `nr` entries.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOSubmit(
    batch: uGDSBatchHandle_t,
    nr: c_uint,
    params: *const uGDSIOParams_t,
    flags: c_uint,
) -> uGDSError_t {
    let _ = flags;
    let Some(b) = find_batch(batch) else { return uGDSError_t::of(UGDS_INVALID_VALUE) };
    if params.is_null() && nr > 0 {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    // SAFETY: the caller passes `nr` entries.
    let ps = if nr == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(params, nr as usize) } };
    let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
    if b.sb.in_flight() + ps.len() > b.sb.capacity() {
        return uGDSError_t::of(UGDS_BATCH_CAPACITY_EXCEEDED);
    }
    let fh = b.handle as uGDSHandle_t;
    let mut reqs = Vec::with_capacity(ps.len());
    for p in ps {
        let resolved = if p.file_offset < 0 || p.devPtr_offset < 0 {
            Err(-(libc::EINVAL as libc::ssize_t))
        } else {
            resolve(fh, p.devPtr_base).map_err(|u| u.ret())
        };
        match resolved {
            Ok((_, buf, off)) => {
                b.next += 1;
                let id = b.next;
                b.cookies.insert(id, p.cookie);
                reqs.push(IoRequest {
                    op: if p.opcode == uGDSOpcode_t::UGDS_WRITE { Op::Write } else { Op::Read },
                    buf,
                    buf_offset: off + p.devPtr_offset as u64,
                    file_offset: p.file_offset as u64,
                    len: p.size as u64,
                    cookie: id,
                });
            }
            Err(code) => b.ready.push_back(uGDSIOEvents_t {
                cookie: p.cookie,
                status: uGDSBatchStatus_t::UGDS_BATCH_INVALID,
                ret: code,
            }),
        }
    }
    match b.sb.submit(&reqs) {
        Ok(()) => uGDSError_t::OK,
        Err(e) => err(&e),
    }
}

/// Waits until at least `min_nr` events are ready (or `timeout` passes; NULL waits without
/// limit) and returns up to `*nr` of them; `*nr` is set to how many.
///
/// # Safety
///
/// `nr` and `events` must be valid, `events` with room for `*nr` entries.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOGetStatus(
    batch: uGDSBatchHandle_t,
    min_nr: c_uint,
    nr: *mut c_uint,
    events: *mut uGDSIOEvents_t,
    timeout: *const libc::timespec,
) -> uGDSError_t {
    let Some(b) = find_batch(batch) else { return uGDSError_t::of(UGDS_INVALID_VALUE) };
    if nr.is_null() || events.is_null() {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    // SAFETY: checked non-null.
    let max = unsafe { *nr } as usize;
    if (min_nr as usize) > max {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    let limit = if timeout.is_null() {
        Duration::from_secs(3600)
    } else {
        // SAFETY: checked non-null.
        let t = unsafe { *timeout };
        Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
    };
    let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
    let want = (min_nr as usize).saturating_sub(b.ready.len());
    match b.sb.status(want, limit) {
        Ok(evs) => {
            for e in evs {
                let cookie = b.cookies.remove(&e.cookie).unwrap_or(std::ptr::null_mut());
                let (status, ret) = match e.status {
                    IoStatus::Complete => (uGDSBatchStatus_t::UGDS_BATCH_COMPLETE, e.bytes as libc::ssize_t),
                    IoStatus::Invalid => (uGDSBatchStatus_t::UGDS_BATCH_INVALID, e.error.as_ref().map_or(-1, neg)),
                    IoStatus::Timeout => (uGDSBatchStatus_t::UGDS_BATCH_TIMEOUT, -(libc::ETIMEDOUT as libc::ssize_t)),
                    IoStatus::Canceled => (uGDSBatchStatus_t::UGDS_BATCH_CANCELED, -(libc::ECANCELED as libc::ssize_t)),
                    IoStatus::Pending => (uGDSBatchStatus_t::UGDS_BATCH_PENDING, 0),
                    IoStatus::Failed => (uGDSBatchStatus_t::UGDS_BATCH_FAILED, e.error.as_ref().map_or(-1, neg)),
                };
                b.ready.push_back(uGDSIOEvents_t { cookie, status, ret });
            }
        }
        Err(e) => return err(&e),
    }
    let n = b.ready.len().min(max);
    for i in 0..n {
        if let Some(ev) = b.ready.pop_front() {
            // SAFETY: `events` has room for `max` >= n entries.
            unsafe { *events.add(i) = ev };
        }
    }
    // SAFETY: checked non-null.
    unsafe { *nr = n as c_uint };
    uGDSError_t::OK
}

/// Destroys a batch after its entries finish.
///
/// # Safety
///
/// `batch` from `uGDSBatchIOSetUp` (unknown values are ignored).
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIODestroy(batch: uGDSBatchHandle_t) {
    let b = state().batches.remove(&(batch as usize));
    drop(b);
}

/// Late-bound arguments in the caller's memory.
#[derive(Debug)]
struct RawParams {
    size: *const usize,
    file_offset: *const libc::off_t,
    buf_offset: *const libc::off_t,
    bytes: *mut libc::ssize_t,
    base: u64,
}

// SAFETY: the C caller guarantees the pointers stay valid until the stream has passed the
// operation; they are read and written only from the stream's host function and I/O workers,
// with volatile accesses.
unsafe impl Send for RawParams {}
// SAFETY: as above.
unsafe impl Sync for RawParams {}

impl AsyncParams for RawParams {
    fn load(&self) -> (u64, i64, i64) {
        // SAFETY: see the Send impl.
        unsafe {
            (
                std::ptr::read_volatile(self.size) as u64,
                std::ptr::read_volatile(self.file_offset) as i64,
                std::ptr::read_volatile(self.buf_offset) as i64 + self.base as i64,
            )
        }
    }
    fn store_result(&self, v: i64) {
        // SAFETY: see the Send impl.
        unsafe { std::ptr::write_volatile(self.bytes, v as libc::ssize_t) }
    }
    fn result(&self) -> i64 {
        // SAFETY: see the Send impl.
        unsafe { std::ptr::read_volatile(self.bytes) as i64 }
    }
}

/// The StreamIo for a stream pointer: a CPU stream made by `uGDSCpuStreamCreate`, or a CUDA
/// stream (`CUstream` / `cudaStream_t`, NULL for the default stream).
fn stream_io(stream: *mut c_void) -> Result<Arc<StreamIo>, uGDSError_t> {
    let mut st = state();
    if let Some(s) = st.streams.get(&(stream as usize)) {
        return Ok(s.clone());
    }
    let s: Arc<dyn Stream> = match st.cpu_streams.get(&(stream as usize)) {
        Some(c) => c.clone(),
        None => {
            if cuda().is_none() {
                return Err(uGDSError_t::of(UGDS_PLATFORM_NOT_SUPPORTED));
            }
            let c = crate::gpu::cuda::Cuda::new(0).map_err(|e| err(&e))?;
            // SAFETY: the caller passes a stream of the primary context (what the CUDA runtime
            // uses) that outlives its registration.
            unsafe { c.wrap_stream(stream as usize) }
        }
    };
    let sio = Arc::new(StreamIo::new(s).map_err(|e| err(&e))?);
    st.streams.insert(stream as usize, sio.clone());
    Ok(sio)
}

/// Registers a stream for stream-ordered I/O (optional: the first async call registers it).
///
/// # Safety
///
/// `stream` is a CUDA stream or a stream from `uGDSCpuStreamCreate`.
#[no_mangle]
pub unsafe extern "C" fn uGDSStreamRegister(stream: *mut c_void, flags: c_uint) -> uGDSError_t {
    let _ = flags;
    match stream_io(stream) {
        Ok(_) => uGDSError_t::OK,
        Err(e) => e,
    }
}

/// Deregisters a stream, after the I/O queued on it.
///
/// # Safety
///
/// As `uGDSStreamRegister`.
#[no_mangle]
pub unsafe extern "C" fn uGDSStreamDeregister(stream: *mut c_void) -> uGDSError_t {
    match state().streams.remove(&(stream as usize)) {
        Some(s) => {
            drop(s);
            uGDSError_t::OK
        }
        None => uGDSError_t::of(UGDS_INVALID_VALUE),
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn rw_async(
    write: bool,
    fh: uGDSHandle_t,
    buf: *mut c_void,
    size_p: *const usize,
    file_offset_p: *const libc::off_t,
    buf_offset_p: *const libc::off_t,
    bytes_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    if size_p.is_null() || file_offset_p.is_null() || buf_offset_p.is_null() || bytes_p.is_null() {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    let (h, b, off) = match resolve(fh, buf) {
        Ok(x) => x,
        Err(u) => return u.status(),
    };
    let sio = match stream_io(stream) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let args = Arc::new(RawParams {
        size: size_p,
        file_offset: file_offset_p,
        buf_offset: buf_offset_p,
        bytes: bytes_p,
        base: off,
    });
    h.inflight.fetch_add(1, Ordering::AcqRel);
    let op = AsyncOp { op: if write { Op::Write } else { Op::Read }, buf: b, args };
    if let Err(e) = sio.submit(&h.storage, &[op]) {
        h.inflight.fetch_sub(1, Ordering::AcqRel);
        return err(&e);
    }
    let inflight = h.inflight.clone();
    if sio
        .then(move || {
            inflight.fetch_sub(1, Ordering::AcqRel);
        })
        .is_err()
    {
        // The op is queued; without the marker its handle stays counted busy (safe side).
        return uGDSError_t::of(UGDS_INTERNAL_ERROR);
    }
    uGDSError_t::OK
}

/// Queues a read in stream order: `*size_p`, `*file_offset_p` and `*buf_offset_p` are read when
/// the stream reaches it; bytes read (or a negative errno) go to `*bytes_p` before later stream
/// work runs. The I/O does not occupy the runtime's callback thread.
///
/// # Safety
///
/// The four pointers must stay valid until the stream has passed the operation.
#[no_mangle]
pub unsafe extern "C" fn uGDSReadAsync(
    fh: uGDSHandle_t,
    buf_base: *mut c_void,
    size_p: *const usize,
    file_offset_p: *const libc::off_t,
    buf_offset_p: *const libc::off_t,
    bytes_read_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    // SAFETY: forwarded.
    unsafe { rw_async(false, fh, buf_base, size_p, file_offset_p, buf_offset_p, bytes_read_p, stream) }
}

/// Queues a write in stream order (see `uGDSReadAsync`).
///
/// # Safety
///
/// As `uGDSReadAsync`.
#[no_mangle]
pub unsafe extern "C" fn uGDSWriteAsync(
    fh: uGDSHandle_t,
    buf_base: *mut c_void,
    size_p: *const usize,
    file_offset_p: *const libc::off_t,
    buf_offset_p: *const libc::off_t,
    bytes_written_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    // SAFETY: forwarded.
    unsafe { rw_async(true, fh, buf_base, size_p, file_offset_p, buf_offset_p, bytes_written_p, stream) }
}

/// The message for a code (`uGDSOpError`, or a negative read/write return value). Static
/// storage; never NULL.
#[no_mangle]
pub extern "C" fn uGDSGetErrorString(code: i64) -> *const c_char {
    types::message(code).as_ptr()
}

/// (ugds extension) Creates a CPU stream: stream-ordered I/O without a GPU (tests, host-only
/// programs). Work queued with `uGDSCpuStreamLaunch` runs in order with the I/O.
///
/// # Safety
///
/// `stream` must be a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn uGDSCpuStreamCreate(stream: *mut *mut c_void) -> uGDSError_t {
    if stream.is_null() {
        return uGDSError_t::of(UGDS_INVALID_VALUE);
    }
    match CpuStream::new() {
        Ok(s) => {
            let key = Arc::as_ptr(&s) as usize;
            state().cpu_streams.insert(key, s);
            // SAFETY: checked non-null.
            unsafe { *stream = key as *mut c_void };
            uGDSError_t::OK
        }
        Err(e) => err(&e),
    }
}

/// The function a CPU stream runs.
#[allow(non_camel_case_types)]
pub type uGDSHostFn = Option<unsafe extern "C" fn(arg: *mut c_void)>;

struct SendPtr(*mut c_void);
// SAFETY: the C caller hands `arg` to its own function on the stream's thread.
unsafe impl Send for SendPtr {}

/// (ugds extension) Queues `fn(arg)` on a CPU stream.
///
/// # Safety
///
/// `func` must be safe to call with `arg` on another thread.
#[no_mangle]
pub unsafe extern "C" fn uGDSCpuStreamLaunch(stream: *mut c_void, func: uGDSHostFn, arg: *mut c_void) -> uGDSError_t {
    let s = state().cpu_streams.get(&(stream as usize)).cloned();
    let (Some(s), Some(f)) = (s, func) else { return uGDSError_t::of(UGDS_INVALID_VALUE) };
    let a = SendPtr(arg);
    let r = s.launch(move || {
        let a = a;
        // SAFETY: the caller's contract.
        unsafe { f(a.0) }
    });
    match r {
        Ok(()) => uGDSError_t::OK,
        Err(e) => err(&e),
    }
}

/// (ugds extension) Waits for everything queued on a CPU stream.
///
/// # Safety
///
/// `stream` from `uGDSCpuStreamCreate`.
#[no_mangle]
pub unsafe extern "C" fn uGDSCpuStreamSynchronize(stream: *mut c_void) -> uGDSError_t {
    let s = state().cpu_streams.get(&(stream as usize)).cloned();
    match s.map(|s| s.synchronize()) {
        Some(Ok(())) => uGDSError_t::OK,
        Some(Err(e)) => err(&e),
        None => uGDSError_t::of(UGDS_INVALID_VALUE),
    }
}

/// (ugds extension) Destroys a CPU stream after its work.
///
/// # Safety
///
/// `stream` from `uGDSCpuStreamCreate`.
#[no_mangle]
pub unsafe extern "C" fn uGDSCpuStreamDestroy(stream: *mut c_void) -> uGDSError_t {
    let mut st = state();
    st.streams.remove(&(stream as usize));
    match st.cpu_streams.remove(&(stream as usize)) {
        Some(s) => {
            drop(st);
            drop(s);
            uGDSError_t::OK
        }
        None => uGDSError_t::of(UGDS_INVALID_VALUE),
    }
}

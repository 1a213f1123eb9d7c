#![deny(clippy::undocumented_unsafe_blocks)]
//! `libcufile_ugds.so`, also installed as `libcufile.so.0`: NVIDIA cuFile's API, names, types,
//! layouts and semantics, on ugds's core ([`ugds::capi::Library`] with [`Face::CuFile`]).
//!
//! cuFile's semantics, as its documentation defines them: the library opens itself on first
//! use; memory need not be registered (it is staged through the library's own buffers), sizes
//! and offsets need not be aligned (reads go through a bounce buffer; writes go to a file
//! through the page cache, to a namespace by read-modify-write of their edge blocks), any host
//! memory registers, and one batch may span several files.
#![allow(non_camel_case_types, non_snake_case, clippy::missing_safety_doc)]

pub mod bar;
pub mod config;
pub mod file;
pub mod logging;
pub mod stats;
pub use config::{config, Config};

use std::ffi::{c_int, c_long, c_uint, c_void};
use std::sync::LazyLock;
use ugds::capi::{self as u, uGDSOpError, CResult, Entry, EventStatus, Face, Fail, IoKind, LateArgs, Library};

/// The process's cuFile library state.
static CUFILE: LazyLock<Library> = LazyLock::new(|| {
    let lib = Library::new(Face::CuFile);
    lib.set_observer(count_io);
    lib
});

/// Counts every read and write the core performs for this face (sync, stream-ordered and batch)
/// in cuFile's statistics.
fn count_io(kind: IoKind, write: bool, bytes: u64, ns: u64, ok: bool) {
    let op = match (kind, write) {
        (IoKind::Batch, false) => stats::Op::BatchRead,
        (IoKind::Batch, true) => stats::Op::BatchWrite,
        (_, false) => stats::Op::Read,
        (_, true) => stats::Op::Write,
    };
    stats::record(op, bytes, ns, ok);
}

/// The library, its settings loaded (the configuration file is read at the first cuFile call,
/// whichever it is).
pub(crate) fn lib() -> &'static Library {
    static LOADED: std::sync::Once = std::sync::Once::new();
    LOADED.call_once(|| {
        config::settings();
    });
    &CUFILE
}

/// The library without loading the settings (for the settings' own loading).
pub(crate) fn core() -> &'static Library {
    &CUFILE
}

/// `CUfileError_t`: a `CUfileOpError` and the CUDA driver's `CUresult` when that is the cause.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUfileError_t {
    /// `CUfileOpError`.
    pub err: c_int,
    /// `CUresult`.
    pub cu_err: c_int,
}

/// `CUfileOpError` values this library returns (cufile.h's numbering).
pub mod codes {
    use std::ffi::c_int;
    /// Success.
    pub const CU_FILE_SUCCESS: c_int = 0;
    /// The library is not open.
    pub const CU_FILE_DRIVER_NOT_INITIALIZED: c_int = 5001;
    /// Invalid driver property.
    pub const CU_FILE_DRIVER_INVALID_PROPS: c_int = 5002;
    /// Property out of range.
    pub const CU_FILE_DRIVER_UNSUPPORTED_LIMIT: c_int = 5003;
    /// Not supported on this platform.
    pub const CU_FILE_PLATFORM_NOT_SUPPORTED: c_int = 5007;
    /// Not supported on this file.
    pub const CU_FILE_IO_NOT_SUPPORTED: c_int = 5008;
    /// A CUDA driver call failed.
    pub const CU_FILE_CUDA_DRIVER_ERROR: c_int = 5011;
    /// Unsupported file type.
    pub const CU_FILE_INVALID_FILE_TYPE: c_int = 5018;
    /// Invalid argument.
    pub const CU_FILE_INVALID_VALUE: c_int = 5022;
    /// Memory already registered.
    pub const CU_FILE_MEMORY_ALREADY_REGISTERED: c_int = 5023;
    /// Memory not registered.
    pub const CU_FILE_MEMORY_NOT_REGISTERED: c_int = 5024;
    /// Descriptor not registered.
    pub const CU_FILE_HANDLE_NOT_REGISTERED: c_int = 5027;
    /// Descriptor already registered.
    pub const CU_FILE_HANDLE_ALREADY_REGISTERED: c_int = 5028;
    /// Internal error.
    pub const CU_FILE_INTERNAL_ERROR: c_int = 5030;
    /// GPU memory could not be registered for DMA.
    pub const CU_FILE_GPU_MEMORY_PINNING_FAILED: c_int = 5036;
    /// Out of memory.
    pub const CU_FILE_NOMEM_ERROR: c_int = 5043;
    /// I/O error.
    pub const CU_FILE_IO_ERROR: c_int = 5044;
}
use codes::*;

/// A core code as cuFile's: equal numbers up to 5038; the core's uGDS-only codes above that
/// become the cuFile code with the same meaning.
pub fn cufile_code(c: uGDSOpError) -> c_int {
    match c {
        uGDSOpError::UGDS_BATCH_CAPACITY_EXCEEDED => CU_FILE_INVALID_VALUE,
        uGDSOpError::UGDS_BUSY => CU_FILE_INTERNAL_ERROR,
        uGDSOpError::UGDS_RDMA_MR_STILL_ACTIVE => CU_FILE_INTERNAL_ERROR,
        uGDSOpError::UGDS_OUT_OF_MEMORY => CU_FILE_NOMEM_ERROR,
        other => other as c_int,
    }
}

/// cuFile's code for a failure. A handle, buffer or batch the parent process made before
/// `fork()` is `CU_FILE_DRIVER_NOT_INITIALIZED` in the child (cuFile's own rule: a child opens
/// the driver again), with one line on stderr saying so (once per process).
pub fn fail_code(f: &Fail) -> c_int {
    if let Fail::Lib(e @ ugds::Error::ForkedChild { .. }) = f {
        note_forked(e);
        return CU_FILE_DRIVER_NOT_INITIALIZED;
    }
    cufile_code(f.code())
}

/// The log line for a forked child's use of the parent's objects (once per process: a child
/// that keeps trying gets the code every time, the line once).
fn note_forked(e: &ugds::Error) {
    static SAID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);
    // The process id: a grandchild inherits `SAID` set and says it again.
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    if SAID.swap(pid, std::sync::atomic::Ordering::Relaxed) != pid {
        log::error!("CU_FILE_DRIVER_NOT_INITIALIZED: {e}");
    }
}

/// A status with cuFile's code.
pub fn err(code: c_int) -> CUfileError_t {
    CUfileError_t { err: code, cu_err: 0 }
}

fn status(r: CResult<()>) -> CUfileError_t {
    match r {
        Ok(()) => err(CU_FILE_SUCCESS),
        Err(f) => err(fail_code(&f)),
    }
}

/// A read/write result: bytes, or `-errno` / `-CUfileOpError`.
fn ret(r: CResult<usize>) -> libc::ssize_t {
    match r {
        Ok(n) => n as libc::ssize_t,
        Err(Fail::Code(c)) => -(cufile_code(c) as libc::ssize_t),
        Err(f @ Fail::Lib(ugds::Error::ForkedChild { .. })) => -(fail_code(&f) as libc::ssize_t),
        Err(f) => f.ret(),
    }
}

/// `CUfileDescr_t`.
#[repr(C)]
pub struct CUfileDescr_t {
    /// `CUfileFileHandleType` (1: an fd).
    pub type_: c_int,
    /// The fd (or a Windows handle).
    pub handle: u::uGDSDescrHandle,
    /// `CUfileFSOps_t *`, for user-space file systems (not used).
    pub fs_ops: *const c_void,
}

/// `CUfileHandle_t`.
pub type CUfileHandle_t = *mut c_void;
/// `CUfileBatchHandle_t`.
pub type CUfileBatchHandle_t = *mut c_void;

/// The batch member of `CUfileIOParams_t`'s union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileBatchIO {
    /// Memory (device or host).
    pub devPtr_base: *mut c_void,
    /// Offset in the file.
    pub file_offset: libc::off_t,
    /// Offset from the base.
    pub devPtr_offset: libc::off_t,
    /// Bytes.
    pub size: usize,
}

/// `CUfileIOParams_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileIOParams_t {
    /// `CUfileBatchMode_t` (1: batch).
    pub mode: c_int,
    /// The entry.
    pub batch: CUfileBatchIO,
    /// Its file.
    pub fh: CUfileHandle_t,
    /// `CUfileOpcode_t` (0 read, 1 write).
    pub opcode: c_int,
    /// Returned with the event.
    pub cookie: *mut c_void,
}

/// `CUfileIOEvents_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileIOEvents_t {
    /// The entry's cookie.
    pub cookie: *mut c_void,
    /// `CUfileStatus_t`.
    pub status: c_int,
    /// Bytes, or a negative errno in two's complement.
    pub ret: usize,
}

/// Opens the library (optional: the first call of any other function opens it).
#[no_mangle]
pub extern "C" fn cuFileDriverOpen() -> CUfileError_t {
    status(lib().driver_open())
}

/// Closes the library: handles, buffers and batches end (after their I/O). Application
/// streams are never touched.
#[no_mangle]
pub extern "C" fn cuFileDriverClose() -> CUfileError_t {
    close()
}

fn close() -> CUfileError_t {
    let r = lib().driver_close();
    if r.is_ok() {
        config::reset_settings();
    }
    status(r)
}

/// Same as `cuFileDriverClose` (libcufile exports both names).
#[no_mangle]
pub extern "C" fn cuFileDriverClose_v2() -> CUfileError_t {
    close()
}

/// How many times the library is open in this process (0 or 1: opening is idempotent).
#[no_mangle]
pub extern "C" fn cuFileUseCount() -> c_long {
    c_long::from(lib().is_open())
}

/// Registers a file descriptor: a ugds node (direct path), a regular file or a block device
/// (fallback path, through a descriptor of the library's own with O_DIRECT).
#[no_mangle]
pub unsafe extern "C" fn cuFileHandleRegister(fh: *mut CUfileHandle_t, descr: *mut CUfileDescr_t) -> CUfileError_t {
    if fh.is_null() || descr.is_null() {
        return err(CU_FILE_INVALID_VALUE);
    }
    // SAFETY: non-null; the type is read as the int the caller stored.
    let (kind, fd) = unsafe { ((*descr).type_, (*descr).handle.fd) };
    if kind != 1 {
        return err(CU_FILE_INVALID_FILE_TYPE);
    }
    match lib().handle_register(fd) {
        Ok(h) => {
            // SAFETY: checked non-null.
            unsafe { *fh = h as CUfileHandle_t };
            err(CU_FILE_SUCCESS)
        }
        Err(f) => err(fail_code(&f)),
    }
}

/// Deregisters a handle after its I/O. Unknown handles are ignored.
#[no_mangle]
pub extern "C" fn cuFileHandleDeregister(fh: CUfileHandle_t) {
    let _ = lib().handle_deregister(fh as usize, -1);
}

/// Registers memory: GPU memory (detected from the pointer) or any host memory (the pages
/// holding it are pinned). `flags` (RDMA hints) are accepted and have no effect.
#[no_mangle]
pub unsafe extern "C" fn cuFileBufRegister(bufPtr_base: *const c_void, length: usize, flags: c_int) -> CUfileError_t {
    let _ = flags;
    if let Err(f) = lib().require_open() {
        return err(fail_code(&f));
    }
    let base = bufPtr_base as usize;
    let _caller = ugds::gpu::cuda::CallerContext::keep();
    let gpu = u::gpu_of(base);
    // SAFETY: the caller keeps the memory allocated until cuFileBufDeregister.
    status(unsafe { lib().buf_register(base, length, gpu, false) })
}

/// Deregisters memory (refused while I/O on it runs).
#[no_mangle]
pub extern "C" fn cuFileBufDeregister(bufPtr_base: *const c_void) -> CUfileError_t {
    status(lib().buf_deregister(bufPtr_base as usize))
}

/// Reads `size` bytes at `file_offset` into `bufPtr_base + bufPtr_offset` (any memory, any
/// alignment); bytes read, or `-errno` / `-CUfileOpError`.
#[no_mangle]
pub unsafe extern "C" fn cuFileRead(
    fh: CUfileHandle_t,
    bufPtr_base: *mut c_void,
    size: usize,
    file_offset: libc::off_t,
    bufPtr_offset: libc::off_t,
) -> libc::ssize_t {
    // SAFETY: the caller's memory contract.
    ret(unsafe { lib().rw(false, fh as usize, bufPtr_base as usize, size, file_offset, bufPtr_offset) })
}

/// Writes `size` bytes from `bufPtr_base + bufPtr_offset` to `file_offset` (see `cuFileRead`).
#[no_mangle]
pub unsafe extern "C" fn cuFileWrite(
    fh: CUfileHandle_t,
    bufPtr_base: *const c_void,
    size: usize,
    file_offset: libc::off_t,
    bufPtr_offset: libc::off_t,
) -> libc::ssize_t {
    // SAFETY: the caller's memory contract.
    ret(unsafe { lib().rw(true, fh as usize, bufPtr_base as usize, size, file_offset, bufPtr_offset) })
}

/// Queues a read on `stream` (late-bound size and offsets; result in `*bytes_read_p`).
#[no_mangle]
pub unsafe extern "C" fn cuFileReadAsync(
    fh: CUfileHandle_t,
    bufPtr_base: *mut c_void,
    size_p: *mut usize,
    file_offset_p: *mut libc::off_t,
    bufPtr_offset_p: *mut libc::off_t,
    bytes_read_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> CUfileError_t {
    let args = LateArgs { size: size_p, file_offset: file_offset_p, buf_offset: bufPtr_offset_p, bytes: bytes_read_p };
    // SAFETY: the caller keeps the words and memory valid until the stream passed the call.
    status(unsafe { lib().rw_async(false, fh as usize, bufPtr_base as usize, args, u::stream_key(stream)) })
}

/// Queues a write on `stream` (see `cuFileReadAsync`).
#[no_mangle]
pub unsafe extern "C" fn cuFileWriteAsync(
    fh: CUfileHandle_t,
    bufPtr_base: *mut c_void,
    size_p: *mut usize,
    file_offset_p: *mut libc::off_t,
    bufPtr_offset_p: *mut libc::off_t,
    bytes_written_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> CUfileError_t {
    let args =
        LateArgs { size: size_p, file_offset: file_offset_p, buf_offset: bufPtr_offset_p, bytes: bytes_written_p };
    // SAFETY: as for cuFileReadAsync.
    status(unsafe { lib().rw_async(true, fh as usize, bufPtr_base as usize, args, u::stream_key(stream)) })
}

/// Registers a stream; `flags` say which arguments are known aligned (hints; no effect here).
/// Sets up what the stream's first stream-ordered I/O would otherwise set up.
#[no_mangle]
pub extern "C" fn cuFileStreamRegister(stream: *mut c_void, flags: c_uint) -> CUfileError_t {
    let _ = flags;
    if let Err(f) = lib().require_open() {
        return err(fail_code(&f));
    }
    lib().stream_prepare(u::stream_key(stream));
    err(CU_FILE_SUCCESS)
}

/// Deregisters a stream once the library's own queued work on it has run; the stream itself
/// is never synchronised or otherwise touched.
#[no_mangle]
pub extern "C" fn cuFileStreamDeregister(stream: *mut c_void) -> CUfileError_t {
    lib().stream_forget(u::stream_key(stream));
    err(CU_FILE_SUCCESS)
}

/// Sets up a batch of up to `nr` entries in flight (at most 128).
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSetUp(batch_idp: *mut CUfileBatchHandle_t, nr: c_uint) -> CUfileError_t {
    if batch_idp.is_null() {
        return err(CU_FILE_INVALID_VALUE);
    }
    match lib().batch_setup(0, nr) {
        Ok(b) => {
            // SAFETY: checked non-null.
            unsafe { *batch_idp = b as CUfileBatchHandle_t };
            err(CU_FILE_SUCCESS)
        }
        Err(f) => err(fail_code(&f)),
    }
}

/// Submits `nr` entries, each naming its file; any memory and alignment. An entry that names
/// an unknown handle or has a bad value becomes a `CUFILE_INVALID` event; the rest run.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSubmit(
    batch_idp: CUfileBatchHandle_t,
    nr: c_uint,
    iocbp: *mut CUfileIOParams_t,
    flags: c_uint,
) -> CUfileError_t {
    let _ = flags;
    if iocbp.is_null() && nr > 0 {
        return err(CU_FILE_INVALID_VALUE);
    }
    if nr == 0 {
        return err(CU_FILE_SUCCESS);
    }
    // SAFETY: the caller passes `nr` entries.
    let ps = unsafe { std::slice::from_raw_parts(iocbp, nr as usize) };
    let mut entries = Vec::with_capacity(ps.len());
    for p in ps {
        if p.mode != 1 || !(0..=1).contains(&p.opcode) {
            return err(CU_FILE_INVALID_VALUE);
        }
        entries.push(Entry {
            fh: p.fh as usize,
            write: p.opcode == 1,
            base: p.batch.devPtr_base as usize,
            buf_offset: p.batch.devPtr_offset,
            file_offset: p.batch.file_offset,
            size: p.batch.size,
            cookie: p.cookie,
        });
    }
    // SAFETY: the caller's memory contract for every entry.
    status(unsafe { lib().batch_submit(batch_idp as usize, &entries) })
}

/// Waits until `min_nr` entries finished (or `timeout`; NULL: no limit) and returns up to
/// `*nr` events; `*nr` is set to how many.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOGetStatus(
    batch_idp: CUfileBatchHandle_t,
    min_nr: c_uint,
    nr: *mut c_uint,
    iocbp: *mut CUfileIOEvents_t,
    timeout: *mut libc::timespec,
) -> CUfileError_t {
    if nr.is_null() || iocbp.is_null() {
        return err(CU_FILE_INVALID_VALUE);
    }
    // SAFETY: checked non-null.
    let max = unsafe { *nr } as usize;
    if max == 0 || (min_nr as usize) > max {
        return err(CU_FILE_INVALID_VALUE);
    }
    // SAFETY: NULL or the caller's timespec.
    let limit = unsafe { u::timeout_of(timeout) };
    match lib().batch_status(batch_idp as usize, min_nr as usize, max, limit) {
        Ok(evs) => {
            for (i, e) in evs.iter().enumerate() {
                let status = match e.status {
                    EventStatus::Complete => 0x10,
                    EventStatus::Failed => 0x40,
                    EventStatus::Invalid => 0x04,
                    EventStatus::Canceled => 0x08,
                    EventStatus::Timeout => 0x20,
                };
                // SAFETY: `iocbp` has room for `max` events; `evs` holds at most that.
                unsafe { *iocbp.add(i) = CUfileIOEvents_t { cookie: e.cookie, status, ret: e.ret as usize } };
            }
            // SAFETY: checked non-null.
            unsafe { *nr = evs.len() as c_uint };
            err(CU_FILE_SUCCESS)
        }
        Err(f) => err(fail_code(&f)),
    }
}

/// Waits for the batch's submitted entries (they cannot be recalled from the SSD or kernel).
#[no_mangle]
pub extern "C" fn cuFileBatchIOCancel(batch_idp: CUfileBatchHandle_t) -> CUfileError_t {
    status(lib().batch_cancel(batch_idp as usize))
}

/// Destroys a batch after its entries finish.
#[no_mangle]
pub extern "C" fn cuFileBatchIODestroy(batch_idp: CUfileBatchHandle_t) {
    lib().batch_destroy(batch_idp as usize);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_cufile() {
        // cufile.h on x86_64: descriptor 24 bytes, I/O params 64, events 24.
        assert_eq!(std::mem::size_of::<CUfileDescr_t>(), 24);
        assert_eq!(std::mem::size_of::<CUfileIOParams_t>(), 64);
        assert_eq!(std::mem::offset_of!(CUfileIOParams_t, fh), 40);
        assert_eq!(std::mem::offset_of!(CUfileIOParams_t, cookie), 56);
        assert_eq!(std::mem::size_of::<CUfileIOEvents_t>(), 24);
        assert_eq!(std::mem::size_of::<CUfileError_t>(), 8);
    }

    #[test]
    fn uGDS_only_codes_become_cufile_codes() {
        assert_eq!(cufile_code(uGDSOpError::UGDS_INVALID_VALUE), CU_FILE_INVALID_VALUE);
        assert_eq!(cufile_code(uGDSOpError::UGDS_BATCH_CAPACITY_EXCEEDED), CU_FILE_INVALID_VALUE);
        assert_eq!(cufile_code(uGDSOpError::UGDS_OUT_OF_MEMORY), CU_FILE_NOMEM_ERROR);
        assert_eq!(cufile_code(uGDSOpError::UGDS_HANDLE_NOT_REGISTERED), CU_FILE_HANDLE_NOT_REGISTERED);
    }
}

#[cfg(test)]
mod io_stats_tests {
    use super::*;
    use crate::config::test_lock;
    use crate::stats::{
        cuFileGetStatsL1, cuFileSetStatsLevel, cuFileStatsReset, cuFileStatsStart, CUfileStatsLevel1_t,
    };
    use std::os::fd::AsRawFd;

    /// Reads and writes of every kind the core performs are counted: sync calls, and batch
    /// entries (counted as batch reads), through the core's observer.
    #[test]
    fn sync_and_batch_io_are_counted() {
        let _l = test_lock();
        let path = std::env::temp_dir().join(format!("ugds-cufile-stats-{}", std::process::id()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        f.set_len(1 << 20).unwrap();
        assert_eq!(cuFileSetStatsLevel(1).err as c_int, 0);
        assert_eq!(cuFileDriverOpen().err, 0);
        assert_eq!(cuFileStatsStart().err as c_int, 0);
        assert_eq!(cuFileStatsReset().err as c_int, 0);
        let mut d =
            CUfileDescr_t { type_: 1, handle: u::uGDSDescrHandle { fd: f.as_raw_fd() }, fs_ops: std::ptr::null() };
        let mut fh = std::ptr::null_mut();
        // SAFETY: valid out-pointer and descriptor.
        assert_eq!(unsafe { cuFileHandleRegister(&mut fh, &mut d) }.err, 0);
        let mut mem = vec![0u8; 3 * 4096 + 7];
        // SAFETY: `mem` holds 4096 bytes from offset 3.
        assert_eq!(unsafe { cuFileRead(fh, mem.as_mut_ptr().cast(), 4096, 5, 3) }, 4096);
        let mut b = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { cuFileBatchIOSetUp(&mut b, 4) }.err, 0);
        let mut io: Vec<CUfileIOParams_t> = (0..2)
            .map(|i| CUfileIOParams_t {
                mode: 1,
                batch: CUfileBatchIO {
                    devPtr_base: mem.as_mut_ptr().cast(),
                    file_offset: 8192 * i,
                    devPtr_offset: 4096 * i,
                    size: 4096,
                },
                fh,
                opcode: 0,
                cookie: std::ptr::null_mut(),
            })
            .collect();
        // SAFETY: two entries on `mem`, which outlives the batch.
        assert_eq!(unsafe { cuFileBatchIOSubmit(b, 2, io.as_mut_ptr(), 0) }.err, 0);
        let mut ev = [CUfileIOEvents_t { cookie: std::ptr::null_mut(), status: 0, ret: 0 }; 2];
        let mut got = 0;
        while got < 2 {
            let mut n = (2 - got) as c_uint;
            // SAFETY: room for `n` events.
            let r = unsafe { cuFileBatchIOGetStatus(b, 1, &mut n, ev[got..].as_mut_ptr(), std::ptr::null_mut()) };
            assert_eq!(r.err, 0);
            got += n as usize;
        }
        cuFileBatchIODestroy(b);
        let mut s = CUfileStatsLevel1_t::default();
        // SAFETY: a local.
        assert_eq!(unsafe { cuFileGetStatsL1(&mut s) }.err as c_int, 0);
        assert_eq!(s.read_bytes, 4096, "the sync read");
        assert_eq!(s.batch_read_bytes, 8192, "the two batch entries");
        cuFileHandleDeregister(fh);
        let _ = cuFileDriverClose();
        std::fs::remove_file(path).unwrap();
    }
}

#[cfg(test)]
mod access_mode_tests {
    use super::*;
    use crate::config::test_lock;

    /// Registers `f`'s descriptor; the handle.
    fn register(f: &std::fs::File) -> CUfileHandle_t {
        super::config_effect_tests::register(f).expect("registered")
    }

    /// A handle keeps the access mode its file was opened with, as cuFile's does: a read
    /// through a write-only descriptor and a write through a read-only one fail with
    /// `CU_FILE_INVALID_FILE_OPEN_FLAG` and move no data (the library's own O_DIRECT
    /// descriptor once re-opened every file read-write, so such a read returned the file's bytes).
    #[test]
    fn handles_keep_the_callers_access_mode() {
        let _l = test_lock();
        let path = std::env::temp_dir().join(format!("ugds-cufile-access-{}", std::process::id()));
        std::fs::write(&path, vec![0xA5u8; 1 << 16]).unwrap();
        let wo = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let ro = std::fs::OpenOptions::new().read(true).open(&path).unwrap();
        let rw = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let (wfh, rfh, rwfh) = (register(&wo), register(&ro), register(&rw));
        let refused = -(ugds::capi::uGDSOpError::UGDS_INVALID_FILE_OPEN_FLAG as libc::ssize_t);
        let mut mem = vec![0u8; 8192 + 3];
        // Aligned and unaligned reads through the write-only handle.
        for (size, off) in [(4096, 0), (100, 7)] {
            // SAFETY: `mem` holds `size` bytes.
            assert_eq!(unsafe { cuFileRead(wfh, mem.as_mut_ptr().cast(), size, off, 0) }, refused, "{size}@{off}");
        }
        assert!(mem.iter().all(|&b| b == 0), "no byte of the file reached memory");
        // Aligned and unaligned writes through the read-only handle.
        mem.fill(0x11);
        for (size, off) in [(4096, 0), (100, 7)] {
            // SAFETY: `mem` holds `size` bytes.
            assert_eq!(unsafe { cuFileWrite(rfh, mem.as_ptr().cast(), size, off, 0) }, refused, "{size}@{off}");
        }
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0xA5), "the file is unchanged");
        // Each handle still does what its mode allows; a read-write handle does both.
        // SAFETY: `mem` holds 4096 bytes.
        unsafe {
            assert_eq!(cuFileWrite(wfh, mem.as_ptr().cast(), 4096, 4096, 0), 4096);
            assert_eq!(cuFileRead(rfh, mem.as_mut_ptr().cast(), 4096, 0, 0), 4096);
            assert_eq!(cuFileWrite(rwfh, mem.as_ptr().cast(), 100, 9000, 0), 100);
            assert_eq!(cuFileRead(rwfh, mem.as_mut_ptr().cast(), 4096, 4096, 0), 4096);
        }
        assert!(mem[..4096].iter().all(|&b| b == 0x11));
        // Stream-ordered calls are refused when queued, before any stream is touched.
        let (mut size, mut foff, mut boff, mut done) = (4096usize, 0i64, 0i64, 0isize);
        // SAFETY: the words and `mem` outlive the calls, which are refused before queueing.
        unsafe {
            let base = mem.as_mut_ptr().cast();
            let r = cuFileReadAsync(wfh, base, &mut size, &mut foff, &mut boff, &mut done, std::ptr::null_mut());
            assert_eq!(r.err, -refused as c_int, "async read through O_WRONLY");
            let r = cuFileWriteAsync(rfh, base, &mut size, &mut foff, &mut boff, &mut done, std::ptr::null_mut());
            assert_eq!(r.err, -refused as c_int, "async write through O_RDONLY");
        }
        // A batch entry against the wrong mode is refused as an entry with a bad value is.
        let mut b = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { cuFileBatchIOSetUp(&mut b, 1) }.err, 0);
        let mut io = [CUfileIOParams_t {
            mode: 1,
            batch: CUfileBatchIO { devPtr_base: mem.as_mut_ptr().cast(), file_offset: 0, devPtr_offset: 0, size: 4096 },
            fh: wfh,
            opcode: 0,
            cookie: std::ptr::null_mut(),
        }];
        // SAFETY: one entry on `mem`, which outlives the batch.
        assert_eq!(unsafe { cuFileBatchIOSubmit(b, 1, io.as_mut_ptr(), 0) }.err, 0);
        let mut ev = [CUfileIOEvents_t { cookie: std::ptr::null_mut(), status: 0, ret: 0 }];
        let mut n = 1;
        // SAFETY: room for one event.
        assert_eq!(unsafe { cuFileBatchIOGetStatus(b, 1, &mut n, ev.as_mut_ptr(), std::ptr::null_mut()) }.err, 0);
        assert_eq!((n, ev[0].status), (1, 0x04), "a CUFILE_INVALID event");
        cuFileBatchIODestroy(b);
        for fh in [wfh, rfh, rwfh] {
            cuFileHandleDeregister(fh);
        }
        let _ = cuFileDriverClose();
        std::fs::remove_file(path).unwrap();
    }
}

#[cfg(test)]
mod config_effect_tests {
    use super::*;
    use crate::config::{
        cuFileGetParameterSizeT, cuFileSetParameterBool, cuFileSetParameterSizeT, reset_for_test, test_lock, SizeParam,
    };
    use std::os::fd::AsRawFd;

    /// A file of `len` bytes, each its offset's low byte.
    fn file(tag: &str, len: usize) -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!("ugds-cufile-{tag}-{}", std::process::id()));
        std::fs::write(&path, (0..len).map(|i| i as u8).collect::<Vec<_>>()).unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        (path, f)
    }

    /// Registers `f`'s descriptor: the handle, or cuFile's code.
    pub(super) fn register(f: &std::fs::File) -> Result<CUfileHandle_t, c_int> {
        let mut d =
            CUfileDescr_t { type_: 1, handle: u::uGDSDescrHandle { fd: f.as_raw_fd() }, fs_ops: std::ptr::null() };
        let mut fh = std::ptr::null_mut();
        // SAFETY: valid out-pointer and descriptor.
        match unsafe { cuFileHandleRegister(&mut fh, &mut d) }.err {
            0 => Ok(fh),
            e => Err(e),
        }
    }

    /// `allow_compat_mode` off: a file (the fallback path) is not registered.
    #[test]
    fn compat_mode_off_refuses_files() {
        let _l = test_lock();
        reset_for_test();
        let (path, f) = file("compat", 8192);
        assert_eq!(cuFileSetParameterBool(1, 0).err, uGDSOpError::UGDS_SUCCESS);
        assert_eq!(register(&f).err(), Some(CU_FILE_IO_NOT_SUPPORTED));
        reset_for_test();
        let fh = register(&f).expect("compat mode on again: registered");
        cuFileHandleDeregister(fh);
        reset_for_test();
        std::fs::remove_file(path).unwrap();
    }

    /// `max_direct_io_size_kb`: a larger read runs as pieces of that size (the storage counts
    /// each), and its data is whole.
    #[test]
    fn reads_are_split_at_the_max_direct_io_size() {
        let _l = test_lock();
        reset_for_test();
        let (path, f) = file("split", 64 << 10);
        assert_eq!(cuFileSetParameterSizeT(SizeParam::MaxDirectIoSizeKb as c_int, 4).err, uGDSOpError::UGDS_SUCCESS);
        let fh = register(&f).unwrap();
        let before = lib().handle(fh as usize).unwrap().storage.path_counts().fallback;
        let mut mem = vec![0u8; 16 << 10];
        // SAFETY: `mem` holds 16 KiB.
        assert_eq!(unsafe { cuFileRead(fh, mem.as_mut_ptr().cast(), 16 << 10, 8192, 0) }, 16 << 10);
        assert!(mem.iter().enumerate().all(|(i, &b)| b == (8192 + i) as u8), "the data");
        let after = lib().handle(fh as usize).unwrap().storage.path_counts().fallback;
        assert_eq!(after - before, 4, "four 4 KiB pieces");
        // At the end of the file: the short piece ends the read.
        // SAFETY: as above.
        assert_eq!(unsafe { cuFileRead(fh, mem.as_mut_ptr().cast(), 16 << 10, (64 << 10) - 6000, 0) }, 6000);
        cuFileHandleDeregister(fh);
        reset_for_test();
        std::fs::remove_file(path).unwrap();
    }

    /// `io_batchsize` bounds a batch's entries (above the core's own default of 128, too).
    #[test]
    fn the_batch_size_parameter_bounds_batches() {
        let _l = test_lock();
        reset_for_test();
        let mut b = std::ptr::null_mut();
        for (max, nr, ok) in [(200usize, 200u32, true), (4, 5, false), (4, 4, true)] {
            reset_for_test();
            assert_eq!(cuFileSetParameterSizeT(SizeParam::IoBatchSize as c_int, max).err, uGDSOpError::UGDS_SUCCESS);
            // SAFETY: a valid out-pointer.
            let r = unsafe { cuFileBatchIOSetUp(&mut b, nr) }.err;
            assert_eq!(r == 0, ok, "io_batchsize {max}, {nr} entries: {r}");
            if r == 0 {
                cuFileBatchIODestroy(b);
            }
        }
        reset_for_test();
    }

    /// The configuration file (`CUFILE_ENV_PATH_JSON`) is where each open starts; parameters set
    /// before the open win over it; closing goes back to it.
    #[test]
    fn the_configuration_file_is_where_each_open_starts() {
        let _l = test_lock();
        reset_for_test();
        let json = std::env::temp_dir().join(format!("ugds-cufile-json-{}.json", std::process::id()));
        std::fs::write(
            &json,
            r#"{
                // as NVIDIA's file: comments, sections we ignore
                "logging": { "level": "WARN" },
                "profile": { "cufile_stats": 1 },
                "properties": { "io_batchsize": 200, "max_direct_io_size_kb": 64,
                                "use_poll_mode": false, "allow_compat_mode": false, },
                "fs": { "generic": { "posix_unaligned_writes": false } }
            }"#,
        )
        .unwrap();
        std::env::set_var("CUFILE_ENV_PATH_JSON", &json);
        config::reset_settings();
        let c = config();
        assert_eq!((c.max_batch_io_size, c.max_direct_io_size_kb), (200, 64));
        assert!(!c.use_poll_mode && !c.allow_compat_mode);
        assert_eq!(crate::stats::level(), 1);
        let mut v = 0;
        // SAFETY: a local.
        unsafe { cuFileGetParameterSizeT(SizeParam::IoBatchSize as c_int, &mut v) };
        assert_eq!(v, 200);
        let o = lib().options();
        assert!(
            !o.fallback
                && o.device.waiting == ugds::Waiting::Interrupts
                && o.max_batch == 200
                && o.max_io_bytes == 64 << 10,
            "{o:?}"
        );
        assert_eq!(log::max_level(), log::LevelFilter::Warn);
        // A parameter set before the open wins; closing goes back to the file.
        assert_eq!(cuFileSetParameterSizeT(SizeParam::IoBatchSize as c_int, 8).err, uGDSOpError::UGDS_SUCCESS);
        assert_eq!(lib().options().max_batch, 8);
        assert_eq!(cuFileDriverOpen().err, 0);
        assert_eq!(cuFileDriverClose().err, 0);
        assert_eq!(lib().options().max_batch, 200);
        std::env::remove_var("CUFILE_ENV_PATH_JSON");
        std::fs::remove_file(&json).unwrap();
        config::reset_settings();
        assert_eq!(config(), Config::default());
        crate::stats::set_level(0);
        crate::logging::set_level("ERROR");
        reset_for_test();
    }
}

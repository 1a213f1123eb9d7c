//! `libcufile_ugds.so`: NVIDIA cuFile's function names, types and layouts, implemented on
//! ugds's C ABI, so that a program written for cuFile runs on ugds by relinking
//! (`-lcufile_ugds` instead of `-lcufile`) or with `LD_PRELOAD=libcufile_ugds.so`.
//!
//! cuFile's types differ from uGDS's in a few places, converted here: its descriptor carries an
//! `fs_ops` pointer, its batch entries name their file handle and a mode (so one cuFile batch
//! may touch several files: it becomes one uGDS batch per file), and its event `ret` is a
//! `size_t`.
#![allow(non_camel_case_types, non_snake_case, clippy::missing_safety_doc)]

pub mod bar;
pub mod config;
pub mod stats;
pub use config::{config, Config};

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, Mutex, OnceLock};
use ugds::capi::{self as u, uGDSOpError};

/// `CUfileError_t`: same layout as `uGDSError_t`.
pub type CUfileError_t = u::uGDSError_t;
/// `CUfileHandle_t`.
pub type CUfileHandle_t = *mut c_void;
/// `CUfileBatchHandle_t`.
pub type CUfileBatchHandle_t = *mut c_void;

/// `CUfileDescr_t`.
#[repr(C)]
pub struct CUfileDescr_t {
    pub type_: c_int,
    pub handle: u::uGDSDescrHandle,
    pub fs_ops: *const c_void,
}

/// The batch member of `CUfileIOParams_t`'s union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileBatchIO {
    pub devPtr_base: *mut c_void,
    pub file_offset: libc::off_t,
    pub devPtr_offset: libc::off_t,
    pub size: usize,
}

/// `CUfileIOParams_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileIOParams_t {
    pub mode: c_int,
    pub batch: CUfileBatchIO,
    pub fh: CUfileHandle_t,
    pub opcode: c_int,
    pub cookie: *mut c_void,
}

/// `CUfileIOEvents_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileIOEvents_t {
    pub cookie: *mut c_void,
    pub status: c_int,
    pub ret: usize,
}

fn e(err: uGDSOpError) -> CUfileError_t {
    u::uGDSError_t { err, cu_err: 0 }
}

#[no_mangle]
pub extern "C" fn cuFileDriverOpen() -> CUfileError_t {
    u::uGDSDriverOpen()
}

#[no_mangle]
pub extern "C" fn cuFileDriverClose() -> CUfileError_t {
    u::uGDSDriverClose()
}

#[no_mangle]
pub extern "C" fn cuFileDriverClose_v2() -> CUfileError_t {
    u::uGDSDriverClose()
}

#[no_mangle]
pub unsafe extern "C" fn cuFileHandleRegister(fh: *mut CUfileHandle_t, descr: *const CUfileDescr_t) -> CUfileError_t {
    if descr.is_null() {
        return e(uGDSOpError::UGDS_INVALID_VALUE);
    }
    // SAFETY: checked non-null; the caller passes a valid descriptor.
    let d = unsafe { &*descr };
    if d.type_ != 1 {
        return e(uGDSOpError::UGDS_INVALID_VALUE);
    }
    let ud = u::uGDSDescr_t { type_: u::uGDSHandleType::UGDS_HANDLE_TYPE_OPAQUE_FD, handle: d.handle };
    // SAFETY: forwarded.
    unsafe { u::uGDSHandleRegister(fh, &ud) }
}

#[no_mangle]
pub unsafe extern "C" fn cuFileHandleDeregister(fh: CUfileHandle_t) {
    // SAFETY: forwarded.
    unsafe { u::uGDSHandleDeregister(fh) }
}

#[no_mangle]
pub unsafe extern "C" fn cuFileBufRegister(ptr: *const c_void, len: usize, flags: c_int) -> CUfileError_t {
    // SAFETY: forwarded.
    unsafe { u::uGDSBufRegister(ptr, len, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn cuFileBufDeregister(ptr: *const c_void) -> CUfileError_t {
    // SAFETY: forwarded.
    unsafe { u::uGDSBufDeregister(ptr) }
}

#[no_mangle]
pub unsafe extern "C" fn cuFileRead(
    fh: CUfileHandle_t,
    buf: *mut c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_offset: libc::off_t,
) -> libc::ssize_t {
    // SAFETY: forwarded.
    unsafe { u::uGDSRead(fh, buf, size, file_offset, buf_offset) }
}

#[no_mangle]
pub unsafe extern "C" fn cuFileWrite(
    fh: CUfileHandle_t,
    buf: *const c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_offset: libc::off_t,
) -> libc::ssize_t {
    // SAFETY: forwarded.
    unsafe { u::uGDSWrite(fh, buf, size, file_offset, buf_offset) }
}

#[no_mangle]
pub unsafe extern "C" fn cuFileReadAsync(
    fh: CUfileHandle_t,
    buf: *mut c_void,
    size_p: *const usize,
    file_offset_p: *const libc::off_t,
    buf_offset_p: *const libc::off_t,
    bytes_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> CUfileError_t {
    // SAFETY: forwarded.
    unsafe { u::uGDSReadAsync(fh, buf, size_p, file_offset_p, buf_offset_p, bytes_p, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn cuFileWriteAsync(
    fh: CUfileHandle_t,
    buf: *mut c_void,
    size_p: *const usize,
    file_offset_p: *const libc::off_t,
    buf_offset_p: *const libc::off_t,
    bytes_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> CUfileError_t {
    // SAFETY: forwarded.
    unsafe { u::uGDSWriteAsync(fh, buf, size_p, file_offset_p, buf_offset_p, bytes_p, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn cuFileStreamRegister(stream: *mut c_void, flags: c_uint) -> CUfileError_t {
    // SAFETY: forwarded.
    unsafe { u::uGDSStreamRegister(stream, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn cuFileStreamDeregister(stream: *mut c_void) -> CUfileError_t {
    // SAFETY: forwarded.
    unsafe { u::uGDSStreamDeregister(stream) }
}

/// A cuFile batch: one uGDS batch per file handle its entries name.
struct Batch {
    nr: c_uint,
    per_file: HashMap<usize, usize>,
    ready: VecDeque<CUfileIOEvents_t>,
}

// SAFETY: the uGDS batch handles are registry keys, never dereferenced here.
unsafe impl Send for Batch {}

fn batches() -> std::sync::MutexGuard<'static, HashMap<usize, Arc<Mutex<Batch>>>> {
    static B: OnceLock<Mutex<HashMap<usize, Arc<Mutex<Batch>>>>> = OnceLock::new();
    B.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

fn find(b: CUfileBatchHandle_t) -> Option<Arc<Mutex<Batch>>> {
    batches().get(&(b as usize)).cloned()
}

#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSetUp(batch: *mut CUfileBatchHandle_t, nr: c_uint) -> CUfileError_t {
    if batch.is_null() || nr == 0 {
        return e(uGDSOpError::UGDS_INVALID_VALUE);
    }
    let b = Arc::new(Mutex::new(Batch { nr, per_file: HashMap::new(), ready: VecDeque::new() }));
    let key = Arc::as_ptr(&b) as usize;
    batches().insert(key, b);
    // SAFETY: checked non-null.
    unsafe { *batch = key as CUfileBatchHandle_t };
    e(uGDSOpError::UGDS_SUCCESS)
}

#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSubmit(
    batch: CUfileBatchHandle_t,
    nr: c_uint,
    params: *const CUfileIOParams_t,
    flags: c_uint,
) -> CUfileError_t {
    let Some(b) = find(batch) else { return e(uGDSOpError::UGDS_INVALID_VALUE) };
    if params.is_null() && nr > 0 {
        return e(uGDSOpError::UGDS_INVALID_VALUE);
    }
    let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
    if nr > b.nr {
        return e(uGDSOpError::UGDS_BATCH_CAPACITY_EXCEEDED);
    }
    // SAFETY: the caller passes `nr` entries.
    let ps = if nr == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(params, nr as usize) } };
    let mut by_file: HashMap<usize, Vec<u::uGDSIOParams_t>> = HashMap::new();
    for p in ps {
        let opcode = if p.opcode == 1 { u::uGDSOpcode_t::UGDS_WRITE } else { u::uGDSOpcode_t::UGDS_READ };
        by_file.entry(p.fh as usize).or_default().push(u::uGDSIOParams_t {
            devPtr_base: p.batch.devPtr_base,
            file_offset: p.batch.file_offset,
            devPtr_offset: p.batch.devPtr_offset,
            size: p.batch.size,
            opcode,
            cookie: p.cookie,
        });
    }
    for (fh, entries) in by_file {
        let ub = match b.per_file.get(&fh) {
            Some(&ub) => ub,
            None => {
                let mut ub = std::ptr::null_mut();
                // SAFETY: out-pointer to a local; `fh` is checked by uGDS.
                let r = unsafe { u::uGDSBatchIOSetUp(&mut ub, fh as *mut c_void, b.nr) };
                if r.err != uGDSOpError::UGDS_SUCCESS {
                    // Entries naming an unknown handle are invalid; the rest still run.
                    for en in &entries {
                        b.ready.push_back(CUfileIOEvents_t { cookie: en.cookie, status: 0x04, ret: 0 });
                    }
                    continue;
                }
                b.per_file.insert(fh, ub as usize);
                ub as usize
            }
        };
        // SAFETY: `entries` holds `len` entries.
        let r = unsafe { u::uGDSBatchIOSubmit(ub as *mut c_void, entries.len() as c_uint, entries.as_ptr(), flags) };
        if r.err != uGDSOpError::UGDS_SUCCESS {
            return r;
        }
    }
    e(uGDSOpError::UGDS_SUCCESS)
}

#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOGetStatus(
    batch: CUfileBatchHandle_t,
    min_nr: c_uint,
    nr: *mut c_uint,
    events: *mut CUfileIOEvents_t,
    timeout: *const libc::timespec,
) -> CUfileError_t {
    let Some(b) = find(batch) else { return e(uGDSOpError::UGDS_INVALID_VALUE) };
    if nr.is_null() || events.is_null() {
        return e(uGDSOpError::UGDS_INVALID_VALUE);
    }
    // SAFETY: checked non-null.
    let max = unsafe { *nr } as usize;
    let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
    let deadline = std::time::Instant::now()
        + if timeout.is_null() {
            std::time::Duration::from_secs(3600)
        } else {
            // SAFETY: checked non-null.
            let t = unsafe { *timeout };
            std::time::Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
        };
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
    loop {
        let files: Vec<usize> = b.per_file.values().copied().collect();
        for ub in files {
            let mut buf = vec![
                u::uGDSIOEvents_t {
                    cookie: std::ptr::null_mut(),
                    status: u::uGDSBatchStatus_t::UGDS_BATCH_WAITING,
                    ret: 0
                };
                max.max(1)
            ];
            let mut n = buf.len() as c_uint;
            // SAFETY: `buf` has room for `n` events.
            let r = unsafe { u::uGDSBatchIOGetStatus(ub as *mut c_void, 0, &mut n, buf.as_mut_ptr(), &zero) };
            if r.err != uGDSOpError::UGDS_SUCCESS {
                return r;
            }
            for ev in &buf[..n as usize] {
                b.ready.push_back(CUfileIOEvents_t {
                    cookie: ev.cookie,
                    status: ev.status as c_int,
                    ret: ev.ret.max(0) as usize,
                });
            }
        }
        if b.ready.len() >= min_nr as usize || std::time::Instant::now() >= deadline {
            break;
        }
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
    e(uGDSOpError::UGDS_SUCCESS)
}

#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOCancel(batch: CUfileBatchHandle_t) -> CUfileError_t {
    // Entries cannot be recalled once submitted; cancelling waits for them (as destroy does).
    match find(batch) {
        Some(_) => e(uGDSOpError::UGDS_SUCCESS),
        None => e(uGDSOpError::UGDS_INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIODestroy(batch: CUfileBatchHandle_t) {
    let b = batches().remove(&(batch as usize));
    if let Some(b) = b {
        let b = b.lock().unwrap_or_else(|e| e.into_inner());
        for &ub in b.per_file.values() {
            // SAFETY: a uGDS batch made in submit.
            unsafe { u::uGDSBatchIODestroy(ub as *mut c_void) };
        }
    }
}

#[no_mangle]
pub extern "C" fn cuFileUseCount() -> std::ffi::c_long {
    1
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
        assert_eq!(std::mem::size_of::<CUfileIOEvents_t>(), 24);
        assert_eq!(std::mem::size_of::<CUfileError_t>(), 8);
    }
}

//! The uGDS C ABI (`libugds.so`'s exported functions, the `ugds-c` crate), driven as a C
//! program would: a sequence of calls with arbitrary arguments on files (the fallback path).
//!
//! The API's contract is kept where it binds the caller: memory handed over is a real
//! allocation (guard pages around it) and sizes are generated within it, except where the
//! library itself checks the range against a registration this harness knows it made. Handles,
//! batches and streams are drawn from a small pool of live, stale and forged values.
//!
//! Checked: no panic or abort; every status is one the function documents (and the exact one
//! where the harness's model knows it); reads and writes return at most their size or a
//! negative errno of the documented set; each batch entry's event comes once, with its cookie.
//! The library's state is global: every input ends by releasing what it made (and checks that
//! this succeeds), so inputs do not leak into each other.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void, CStr};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use ugds::capi::uGDSOpError::{self, *};
use ugds_c::*;
use ugds::capi::*;

/// Bytes of the file the handles write; truncated back to this at every input's start.
const FILE_LEN: u64 = 1 << 20;

/// A host allocation with an unmapped guard page on each side.
struct Region {
    base: usize,
    len: usize,
}

struct Env {
    rw: File,
    ro: File,
    dir: File,
    null: File,
    regions: [Region; 3],
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ugds-fuzz-capi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("data");
        let rw = File::options().read(true).write(true).create(true).truncate(true).open(&path).expect("data file");
        rw.set_len(FILE_LEN).expect("size the data file");
        let ro = File::open(&path).expect("data file read-only");
        let null = File::options().read(true).write(true).open("/dev/null").expect("/dev/null");
        let dirfd = File::open(&dir).expect("temp dir fd");
        Env { rw, ro, dir: dirfd, null, regions: [region(256 << 10), region(64 << 10), region(8 << 10)] }
    })
}

/// Maps `len` bytes (a page multiple) between two PROT_NONE guard pages; never unmapped (a
/// registration that outlived an input must still name mapped memory).
fn region(len: usize) -> Region {
    // SAFETY: a fresh anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len + 8192, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(p, libc::MAP_FAILED);
    let base = p as usize + 4096;
    // SAFETY: the middle `len` bytes of the mapping just made.
    let r = unsafe { libc::mprotect(base as *mut c_void, len, libc::PROT_READ | libc::PROT_WRITE) };
    assert_eq!(r, 0);
    Region { base, len }
}

/// Which memory (by `kind`): a buffer the harness registered (half of the time), a page of a
/// region (optionally one byte in), none, or an address that is not mapped (only for calls that
/// must look registrations up before touching memory).
#[derive(Arbitrary, Debug, Clone, Copy)]
struct MemSel {
    kind: u8,
    r: u8,
    page: u8,
}

/// A size or offset (by `kind`): whole pages (half of the time: what most calls take; up to
/// 63, or 1 to 256), a few bytes, or any value.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Num {
    kind: u8,
    v: i64,
}

impl Num {
    fn value(self) -> i64 {
        match self.kind % 4 {
            0 => (self.v & 0x3f) * 4096,
            1 => ((self.v & 0xff) + 1) * 4096,
            2 => self.v & 0xffff,
            _ => self.v,
        }
    }
}

/// An opcode field: read or write half of the time each, else any small value.
fn opcode(v: i8) -> c_int {
    if v >= 0 {
        c_int::from(v & 1)
    } else {
        c_int::from(v)
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct EntrySel {
    mem: MemSel,
    buf_offset: Num,
    file_offset: Num,
    size: Num,
    opcode: i8,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct SegSel {
    mem: MemSel,
    offset: Num,
    size: Num,
}

/// One input: calls, after (with `prelude`) what most programs do first, so the fuzzer starts
/// from a working state as often as from nothing: open, a handle on the read-write file, the
/// first region registered, a batch of 8 on the handle.
#[derive(Arbitrary, Debug)]
struct Input {
    prelude: bool,
    calls: Vec<Call>,
}

#[derive(Arbitrary, Debug)]
enum Call {
    DriverOpen,
    DriverClose,
    HandleRegister { fd: u8, kind: i8, null_out: bool, null_descr: bool },
    HandleDeregister { h: u8 },
    HandleDeregisterEx { h: u8, timeout: i8 },
    Capacity { h: u8, null_out: bool },
    BufRegister { mem: MemSel, len: Num, flags: i8 },
    BufRegisterEx { mem: MemSel, len: Num, backend: i8, export: u8, null_config: bool },
    BufDeregister { mem: MemSel },
    Rw { write: bool, h: u8, mem: MemSel, size: Num, file_offset: Num, buf_offset: Num },
    Rwv { write: bool, h: u8, segs: Vec<SegSel>, file_offset: Num, null_segs: bool },
    BatchSetUp { h: u8, nr: u8, null_out: bool },
    BatchSubmit { b: u8, entries: Vec<EntrySel>, null_iocb: bool },
    BatchSubmitv { b: u8, entries: Vec<(Vec<SegSel>, Num, i8)> },
    BatchStatus { b: u8, min_nr: u8, nr: u8, timeout_us: Option<u16>, null_events: bool },
    BatchDestroy { b: u8 },
    Async { write: bool, h: u8, mem: MemSel, size: Num, file_offset: Num, buf_offset: Num, stream: u8 },
    StreamCreate,
    StreamDestroy { s: u8 },
    StreamRegisterEx { backend: i8 },
    StreamDeregister { s: u8 },
    ErrorString(i64),
}

/// What the harness knows of the library's state.
#[derive(Default)]
struct Model {
    open: bool,
    /// Live handles, with their live batches.
    handles: Vec<usize>,
    dead_handles: Vec<usize>,
    /// Handles registered on the read-only descriptor: a write through one is `-EBADF` before
    /// anything else is checked, as pwrite(2) on such a descriptor.
    read_only: std::collections::HashSet<usize>,
    /// Live batches: handle, capacity, submitted cookies not yet reported (cookie -> size).
    batches: Vec<(usize, usize, HashMap<usize, i64>)>,
    dead_batches: Vec<usize>,
    batch_ids: Vec<usize>,
    /// Registered buffers: base -> length.
    bufs: HashMap<usize, usize>,
    streams: Vec<usize>,
    dead_streams: Vec<usize>,
    next_cookie: usize,
}

/// Forged handle values: NULL, small integers, an address-like value.
const FORGED: [usize; 3] = [0, 1, 0xdead_beef_0000_0001];

/// A live value half of the time (when there is one), else any of forged, live and dead.
fn pick(sel: u8, live: &[usize], dead: &[usize]) -> usize {
    if sel & 0x80 == 0 && !live.is_empty() {
        return live[usize::from(sel) % live.len()];
    }
    let all: Vec<usize> = FORGED.iter().chain(live).chain(dead).copied().collect();
    all[usize::from(sel) % all.len()]
}

/// The address a selection names, and how many bytes from it are mapped (0 for none).
fn address(m: &Model, sel: MemSel) -> (usize, usize) {
    match sel.kind % 8 {
        0..=3 => {
            let mut bases: Vec<usize> = m.bufs.keys().copied().collect();
            bases.sort_unstable();
            match bases.get(usize::from(sel.r) % bases.len().max(1)) {
                Some(&b) => (b, mapped_from(b)),
                None => (0, 0),
            }
        }
        k @ (4 | 5) => {
            let reg = &env().regions[usize::from(sel.r) % 3];
            let off = (usize::from(sel.page) * 4096) % reg.len + usize::from(k == 5);
            (reg.base + off, reg.len - off)
        }
        6 => (0, 0),
        _ => (0x1000, 0),
    }
}

/// Bytes mapped from `addr` (inside a region) to the region's end.
fn mapped_from(addr: usize) -> usize {
    env().regions.iter().find(|r| (r.base..r.base + r.len).contains(&addr)).map_or(0, |r| r.base + r.len - addr)
}

/// Memory for a call that may touch it: an unmapped address becomes NULL.
fn real(m: &Model, sel: MemSel) -> (usize, usize) {
    match address(m, sel) {
        (_, 0) => (0, 0),
        a => a,
    }
}

/// The errnos a read or write may return (the C header's list, `ugdsxErrorString`'s table, and
/// what the file system says about a file: too large, read-only).
const ERRNOS: [c_int; 13] = [
    libc::EINVAL,
    libc::EIO,
    libc::ETIMEDOUT,
    libc::EBUSY,
    libc::EAGAIN,
    libc::ENOMEM,
    libc::EBADF,
    libc::ENOSPC,
    libc::EOPNOTSUPP,
    libc::ENODEV,
    libc::EFAULT,
    libc::EFBIG,
    libc::ECANCELED,
];

/// With `UGDS_FUZZ_TRACE` set, every call's outcome goes to stderr (replaying a corpus with
/// `-runs=0` then shows which statuses the inputs reach).
fn trace(what: &str, outcome: &dyn std::fmt::Debug) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("UGDS_FUZZ_TRACE").is_some()) {
        eprintln!("TRACE {what} {outcome:?}");
    }
}

fn check_ret(what: &str, r: isize, size: i64) {
    trace(what, &if r > 0 { "bytes".to_string() } else { r.to_string() });
    if r >= 0 {
        assert!(r as i64 <= size.max(0), "{what}: returned {r} for size {size}");
    } else {
        assert!(ERRNOS.contains(&(-r as c_int)), "{what}: undocumented errno {r}");
    }
}

fn check(what: &str, e: uGDSError_t, allowed: &[uGDSOpError]) -> uGDSOpError {
    trace(what, &e.err);
    assert_eq!(e.cu_err, 0, "{what}: a GPU driver code without a GPU");
    assert!(e.err == UGDS_SUCCESS || allowed.contains(&e.err), "{what}: undocumented status {:?}", e.err);
    e.err
}

fuzz_target!(|input: Input| {
    let env = env();
    env.rw.set_len(0).expect("truncate");
    env.rw.set_len(FILE_LEN).expect("size");
    let mut m = Model { next_cookie: 1, ..Model::default() };
    if input.prelude {
        one(&mut m, Call::DriverOpen);
        one(&mut m, Call::HandleRegister { fd: 0, kind: 0, null_out: false, null_descr: false });
        let whole = MemSel { kind: 4, r: 0, page: 0 };
        one(&mut m, Call::BufRegister { mem: whole, len: Num { kind: 3, v: i64::MAX }, flags: 0 });
        one(&mut m, Call::BatchSetUp { h: 0, nr: 8, null_out: false });
        assert_eq!((m.handles.len(), m.bufs.len(), m.batches.len()), (1, 1, 1), "the prelude failed");
    }
    for call in input.calls.into_iter().take(24) {
        one(&mut m, call);
    }
    release(&mut m);
});

fn fd_of(sel: u8) -> c_int {
    let e = env();
    match sel % 7 {
        0 => e.rw.as_raw_fd(),
        1 => e.ro.as_raw_fd(),
        2 => e.dir.as_raw_fd(),
        3 => e.null.as_raw_fd(),
        4 => -1,
        5 => 1 << 20,
        _ => c_int::MIN,
    }
}

fn one(m: &mut Model, call: Call) {
    match call {
        Call::DriverOpen => {
            check("DriverOpen", uGDSDriverOpen(), &[]);
            m.open = true;
        }
        Call::DriverClose => {
            let r = check("DriverClose", uGDSDriverClose(), &[UGDS_DRIVER_NOT_INITIALIZED, UGDS_BUSY]);
            if !m.open {
                assert_eq!(r, UGDS_DRIVER_NOT_INITIALIZED);
            }
            if r == UGDS_SUCCESS {
                m.open = false;
                m.bufs.clear();
            }
        }
        Call::HandleRegister { fd, kind, null_out, null_descr } => {
            let fd = fd_of(fd);
            let kind = if kind >= 0 { uGDSHandleType::UGDS_HANDLE_TYPE_OPAQUE_FD as c_int } else { c_int::from(kind) };
            let mut descr = uGDSDescr_t { type_: HandleTypeField(kind), handle: uGDSDescrHandle { fd } };
            let mut h: uGDSHandle_t = std::ptr::null_mut();
            let hp = if null_out { std::ptr::null_mut() } else { &mut h as *mut _ };
            let dp = if null_descr { std::ptr::null_mut() } else { &mut descr as *mut _ };
            // SAFETY: NULL or valid pointers to locals.
            let r = check(
                "HandleRegister",
                unsafe { uGDSHandleRegister(hp, dp) },
                &[UGDS_INVALID_VALUE, UGDS_DRIVER_NOT_INITIALIZED, UGDS_INVALID_FILE_TYPE],
            );
            if null_out || null_descr {
                assert_eq!(r, UGDS_INVALID_VALUE);
            } else if !m.open {
                assert_eq!(r, UGDS_DRIVER_NOT_INITIALIZED);
            }
            if r == UGDS_SUCCESS {
                assert!(!h.is_null() && !m.handles.contains(&(h as usize)));
                // The handle points at the registered descriptor (uGDS's `*(int *)fh`).
                // SAFETY: a live handle is the address of the library's record of it.
                assert_eq!(unsafe { *(h as *const c_int) }, fd);
                m.handles.push(h as usize);
                // A handle's address may be reused after deregistration: record it afresh.
                if fd == env().ro.as_raw_fd() {
                    m.read_only.insert(h as usize);
                } else {
                    m.read_only.remove(&(h as usize));
                }
            }
        }
        Call::HandleDeregister { h } => {
            let h = pick(h, &m.handles, &m.dead_handles);
            // Waits for the handle's I/O without limit: a live batch would hold it forever
            // (documented), so only when none is left.
            if m.batches.iter().any(|b| b.0 == h) {
                return;
            }
            uGDSHandleDeregister(h as uGDSHandle_t);
            forget_handle(m, h);
        }
        Call::HandleDeregisterEx { h, timeout } => {
            let h = pick(h, &m.handles, &m.dead_handles);
            let busy = m.batches.iter().any(|b| b.0 == h);
            // 0 checks once, -1 waits (only without batches), below -1 tears down; positive
            // timeouts wait whole seconds, too slow here.
            let t = match timeout {
                -1 if !busy => -1,
                t if t < -1 => c_int::from(t),
                _ => 0,
            };
            let r = check("HandleDeregisterEx", uGDSHandleDeregisterEx(h as uGDSHandle_t, t), &[UGDS_BUSY]);
            if r == UGDS_BUSY {
                assert!(busy && t == 0, "HandleDeregisterEx({t}): busy without a batch");
            } else {
                forget_handle(m, h);
            }
        }
        Call::Capacity { h, null_out } => {
            let h = pick(h, &m.handles, &m.dead_handles);
            let mut cap = 0u64;
            let p = if null_out { std::ptr::null_mut() } else { &mut cap as *mut u64 };
            // SAFETY: NULL or a valid pointer.
            let r = check(
                "GetDeviceCapacity",
                unsafe { uGDSGetDeviceCapacity(h as uGDSHandle_t, p) },
                &[UGDS_INVALID_VALUE, UGDS_HANDLE_NOT_REGISTERED],
            );
            if r == UGDS_SUCCESS {
                assert!(m.handles.contains(&h));
                assert!(cap >= FILE_LEN, "capacity {cap}");
            } else if !null_out && h != 0 {
                assert!(!m.handles.contains(&h), "GetDeviceCapacity of a live handle: {r:?}");
            }
        }
        Call::BufRegister { mem, len, flags } => {
            let (base, avail) = real(m, mem);
            let len = (len.value().unsigned_abs() as usize).min(avail);
            // SAFETY: `[base, +len)` is NULL or inside a region that stays mapped forever.
            let r = check(
                "BufRegister",
                unsafe { uGDSBufRegister(base as *const c_void, len, c_int::from(flags)) },
                &[
                    UGDS_DRIVER_NOT_INITIALIZED,
                    UGDS_INVALID_VALUE,
                    UGDS_MEMORY_ALREADY_REGISTERED,
                    UGDS_IO_NOT_SUPPORTED,
                    UGDS_CUDA_MEMORY_TYPE_INVALID,
                ],
            );
            registered(m, "BufRegister", r, base, len);
        }
        Call::BufRegisterEx { mem, len, backend, export, null_config } => {
            let (base, avail) = real(m, mem);
            let len = (len.value().unsigned_abs() as usize).min(avail);
            let config = uGDSBufConfig { backend: BackendArg(c_int::from(backend)), enable_export: BoolField(export) };
            let cp = if null_config { std::ptr::null() } else { &config as *const _ };
            // SAFETY: as for BufRegister; `cp` is NULL or valid.
            let r = check(
                "BufRegisterEx",
                unsafe { uGDSBufRegisterEx(base as *const c_void, len, cp) },
                &[
                    UGDS_DRIVER_NOT_INITIALIZED,
                    UGDS_INVALID_VALUE,
                    UGDS_MEMORY_ALREADY_REGISTERED,
                    UGDS_PLATFORM_NOT_SUPPORTED,
                    UGDS_CUDA_MEMORY_TYPE_INVALID,
                ],
            );
            registered(m, "BufRegisterEx", r, base, len);
        }
        Call::BufDeregister { mem } => {
            let (base, _) = address(m, mem);
            let r = check(
                "BufDeregister",
                uGDSBufDeregister(base as *const c_void),
                &[UGDS_DRIVER_NOT_INITIALIZED, UGDS_MEMORY_NOT_REGISTERED, UGDS_BUSY],
            );
            match r {
                UGDS_SUCCESS => assert!(m.bufs.remove(&base).is_some(), "deregistered {base:#x}, never registered"),
                UGDS_MEMORY_NOT_REGISTERED => assert!(!m.bufs.contains_key(&base), "{base:#x} is registered"),
                UGDS_DRIVER_NOT_INITIALIZED => assert!(!m.open),
                _ => {}
            }
        }
        Call::Rw { write, h, mem, size, file_offset, buf_offset } => {
            let fh = pick(h, &m.handles, &m.dead_handles);
            let (base, size, foff, boff) = io_args(m, mem, size, file_offset, buf_offset);
            // SAFETY: the range is inside a region, or the library checks it against the
            // registration of `base` (see `io_args`).
            let r = unsafe {
                if write {
                    uGDSWrite(fh as uGDSHandle_t, base as *const c_void, size, foff, boff)
                } else {
                    uGDSRead(fh as uGDSHandle_t, base as *mut c_void, size, foff, boff)
                }
            };
            check_ret(if write { "Write" } else { "Read" }, r, size as i64);
            if fh == 0 {
                assert_eq!(r, -(libc::EINVAL as isize), "I/O on a NULL handle");
            } else if !m.handles.contains(&fh) {
                assert_eq!(r, -(libc::EBADF as isize), "I/O on an unknown handle");
            } else if write && m.read_only.contains(&fh) {
                assert_eq!(r, -(libc::EBADF as isize), "a write through a read-only handle");
            } else if size == 0 || foff < 0 || boff < 0 || base == 0 {
                assert_eq!(r, -(libc::EINVAL as isize), "I/O with a bad value");
            }
        }
        Call::Rwv { write, h, segs, file_offset, null_segs } => {
            let fh = pick(h, &m.handles, &m.dead_handles);
            let segs: Vec<uGDSIoSegment_t> = segs.iter().take(4).map(|g| segment(m, g)).collect();
            let total: i64 = segs.iter().map(|s| s.size as i64).fold(0, i64::saturating_add);
            let p = if null_segs { std::ptr::null() } else { segs.as_ptr() };
            // SAFETY: `p` is NULL or `segs.len()` segments; the library only touches memory
            // registered (and range-checked) under each segment's base.
            let r = unsafe {
                if write {
                    uGDSWritev(fh as uGDSHandle_t, p, segs.len() as c_uint, file_offset.value())
                } else {
                    uGDSReadv(fh as uGDSHandle_t, p, segs.len() as c_uint, file_offset.value())
                }
            };
            check_ret("Readv/Writev", r, total);
        }
        Call::BatchSetUp { h, nr, null_out } => {
            let fh = pick(h, &m.handles, &m.dead_handles);
            let nr = c_uint::from(nr);
            let mut b: uGDSBatchHandle_t = std::ptr::null_mut();
            let bp = if null_out { std::ptr::null_mut() } else { &mut b as *mut _ };
            // SAFETY: NULL or a valid pointer.
            let r =
                check("BatchIOSetUp", unsafe { uGDSBatchIOSetUp(bp, fh as uGDSHandle_t, nr) }, &[UGDS_INVALID_VALUE]);
            if r == UGDS_SUCCESS {
                assert!(m.handles.contains(&fh) && (1..=128).contains(&nr));
                m.batches.push((fh, nr as usize, HashMap::new()));
                m.batch_ids.push(b as usize);
            } else if !null_out && (1..=128).contains(&nr) {
                assert!(!m.handles.contains(&fh), "BatchIOSetUp on a live handle: {r:?}");
            }
        }
        Call::BatchSubmit { b, entries, null_iocb } => {
            let (bh, live) = pick_batch(m, b);
            let mut iocb: Vec<uGDSIOParams_t> = Vec::new();
            let mut sizes = Vec::new();
            for e in entries.iter().take(8) {
                let (base, _) = address(m, e.mem);
                let cookie = m.next_cookie;
                m.next_cookie += 1;
                iocb.push(uGDSIOParams {
                    devPtr_base: base as *mut c_void,
                    file_offset: e.file_offset.value(),
                    devPtr_offset: e.buf_offset.value(),
                    size: e.size.value() as usize,
                    opcode: OpcodeField(opcode(e.opcode)),
                    cookie: cookie as *mut c_void,
                });
                sizes.push((cookie, e.size.value()));
            }
            let p = if null_iocb { std::ptr::null_mut() } else { iocb.as_mut_ptr() };
            // SAFETY: NULL or `iocb.len()` entries; the uGDS face runs entries on registered
            // memory only, range-checked against the registration.
            let r = check(
                "BatchIOSubmit",
                unsafe { uGDSBatchIOSubmit(bh as uGDSBatchHandle_t, iocb.len() as c_uint, p, 0) },
                &[UGDS_INVALID_VALUE, UGDS_BATCH_CAPACITY_EXCEEDED, UGDS_INTERNAL_ERROR],
            );
            if let (Some(i), UGDS_SUCCESS | UGDS_INTERNAL_ERROR) = (live, r) {
                m.batches[i].2.extend(sizes);
            }
        }
        Call::BatchSubmitv { b, entries } => {
            let (bh, live) = pick_batch(m, b);
            let segs: Vec<Vec<uGDSIoSegment_t>> =
                entries.iter().take(4).map(|(s, _, _)| s.iter().take(4).map(|g| segment(m, g)).collect()).collect();
            let mut iocb = Vec::new();
            let mut sizes = Vec::new();
            for ((_, foff, op), s) in entries.iter().zip(&segs) {
                let cookie = m.next_cookie;
                m.next_cookie += 1;
                iocb.push(uGDSIOSegParams {
                    segs: s.as_ptr(),
                    nr_segs: s.len() as c_uint,
                    file_offset: foff.value(),
                    opcode: OpcodeField(opcode(*op)),
                    cookie: cookie as *mut c_void,
                });
                sizes.push((cookie, s.iter().map(|g| g.size as i64).fold(0, i64::saturating_add)));
            }
            // SAFETY: `iocb.len()` entries, each with its `nr_segs` segments (alive until the
            // call returns: they are copied at submit).
            let r = check(
                "BatchIOSubmitv",
                unsafe { uGDSBatchIOSubmitv(bh as uGDSBatchHandle_t, iocb.len() as c_uint, iocb.as_mut_ptr(), 0) },
                &[UGDS_INVALID_VALUE, UGDS_BATCH_CAPACITY_EXCEEDED],
            );
            if let (Some(i), UGDS_SUCCESS) = (live, r) {
                m.batches[i].2.extend(sizes);
            }
        }
        Call::BatchStatus { b, min_nr, nr, timeout_us, null_events } => {
            let (bh, live) = pick_batch(m, b);
            let mut events =
                vec![
                    uGDSIOEvents { cookie: std::ptr::null_mut(), status: uGDSBatchStatus::UGDS_BATCH_WAITING, ret: 0 };
                    MAX_BATCH
                ];
            let mut n = c_uint::from(nr) % (MAX_BATCH as c_uint + 1);
            let mut t = libc::timespec { tv_sec: 0, tv_nsec: i64::from(timeout_us.unwrap_or(0)) * 1000 };
            // NULL waits until `min_nr` entries are done (or none runs): bounded here.
            let tp = if timeout_us.is_some() { &mut t as *mut _ } else { std::ptr::null_mut() };
            let ep = if null_events { std::ptr::null_mut() } else { events.as_mut_ptr() };
            // SAFETY: room for MAX_BATCH events, the most that can be asked for.
            let r = check(
                "BatchIOGetStatus",
                unsafe { uGDSBatchIOGetStatus(bh as uGDSBatchHandle_t, c_uint::from(min_nr), &mut n, ep, tp) },
                &[UGDS_INVALID_VALUE],
            );
            if r != UGDS_SUCCESS {
                return;
            }
            let i = live.expect("GetStatus succeeded on a batch that does not exist");
            let asked = match usize::from(nr) % (MAX_BATCH + 1) {
                0 => m.batches[i].1,
                k => k,
            };
            assert!(n as usize <= asked, "GetStatus returned {n} events, {asked} asked for");
            for e in &events[..n as usize] {
                let size = m.batches[i].2.remove(&(e.cookie as usize));
                let size =
                    size.unwrap_or_else(|| panic!("event for cookie {:?}: not submitted or reported twice", e.cookie));
                match e.status {
                    uGDSBatchStatus::UGDS_BATCH_COMPLETE => check_ret("batch event", e.ret, size),
                    uGDSBatchStatus::UGDS_BATCH_FAILED
                    | uGDSBatchStatus::UGDS_BATCH_INVALID
                    | uGDSBatchStatus::UGDS_BATCH_TIMEOUT => {
                        assert!(e.ret < 0, "failed event with ret {}", e.ret);
                        check_ret("batch event", e.ret, size);
                    }
                    s => panic!("event status {s:?}"),
                }
            }
        }
        Call::BatchDestroy { b } => {
            let (bh, live) = pick_batch(m, b);
            uGDSBatchIODestroy(bh as uGDSBatchHandle_t);
            if let Some(i) = live {
                m.batches.remove(i);
                m.dead_batches.push(m.batch_ids.remove(i));
            }
        }
        Call::Async { write, h, mem, size, file_offset, buf_offset, stream } => {
            let fh = pick(h, &m.handles, &m.dead_handles);
            let s = pick(stream, &m.streams, &m.dead_streams);
            let (base, _) = address(m, mem);
            // Late-bound words: the library reads them when the stream gets there; they stay
            // alive past the synchronisation below.
            let mut words = Box::new((size.value() as usize, file_offset.value(), buf_offset.value(), 0isize));
            let (sp, fp, bp, rp) = (
                &mut words.0 as *mut usize,
                &mut words.1 as *mut i64,
                &mut words.2 as *mut i64,
                &mut words.3 as *mut isize,
            );
            // SAFETY: the words are valid until after the stream is synchronised; the memory
            // must be registered (checked at enqueue), and is range-checked when it runs.
            let r = unsafe {
                if write {
                    uGDSWriteAsync(fh as uGDSHandle_t, base as *mut c_void, sp, fp, bp, rp, s as *mut c_void)
                } else {
                    uGDSReadAsync(fh as uGDSHandle_t, base as *mut c_void, sp, fp, bp, rp, s as *mut c_void)
                }
            };
            let r = check(
                "Read/WriteAsync",
                r,
                &[
                    UGDS_DRIVER_NOT_INITIALIZED,
                    UGDS_INVALID_VALUE,
                    UGDS_PLATFORM_NOT_SUPPORTED,
                    UGDS_INVALID_FILE_OPEN_FLAG,
                ],
            );
            if r == UGDS_INVALID_FILE_OPEN_FLAG {
                assert!(
                    write && m.read_only.contains(&fh),
                    "an I/O the descriptor's open mode allows was refused by it"
                );
            }
            if r == UGDS_SUCCESS {
                assert!(m.streams.contains(&s), "queued on a stream that is not a CPU stream without a GPU");
                check("CpuStreamSynchronize", ugdsxCpuStreamSynchronize(s as *mut c_void), &[]);
                check_ret("async I/O", words.3, words.0 as i64);
            }
        }
        Call::StreamCreate => {
            let mut s: *mut c_void = std::ptr::null_mut();
            // SAFETY: a valid pointer.
            check("CpuStreamCreate", unsafe { ugdsxCpuStreamCreate(&mut s) }, &[]);
            m.streams.push(s as usize);
        }
        Call::StreamDestroy { s } => {
            let s = pick(s, &m.streams, &m.dead_streams);
            let r = check("CpuStreamDestroy", ugdsxCpuStreamDestroy(s as *mut c_void), &[UGDS_INVALID_VALUE]);
            assert_eq!(r == UGDS_SUCCESS, m.streams.contains(&s));
            if r == UGDS_SUCCESS {
                m.streams.retain(|x| *x != s);
                m.dead_streams.push(s);
            }
        }
        Call::StreamRegisterEx { backend } => {
            let r = check(
                "StreamRegisterEx",
                uGDSStreamRegisterEx(std::ptr::null_mut(), BackendArg(c_int::from(backend))),
                &[UGDS_INVALID_VALUE],
            );
            assert_eq!(r == UGDS_SUCCESS, backend == 1, "StreamRegisterEx({backend})");
        }
        Call::StreamDeregister { s } => {
            let s = pick(s, &m.streams, &m.dead_streams);
            check("StreamDeregister", uGDSStreamDeregister(s as *mut c_void), &[]);
        }
        Call::ErrorString(code) => {
            // SAFETY: documented to return a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(ugdsxErrorString(code)) };
            assert!(!s.to_bytes().is_empty());
        }
    }
}

/// Arguments of a synchronous read or write. Memory the harness registered is handed over with
/// any offset and size (the library must refuse what passes the registration's end); other
/// memory only with a range inside its region (the API's contract).
fn io_args(m: &Model, mem: MemSel, size: Num, foff: Num, boff: Num) -> (usize, usize, i64, i64) {
    let (base, avail) = real(m, mem);
    let (size, foff, boff) = (size.value(), foff.value(), boff.value());
    if m.bufs.contains_key(&base) || boff < 0 {
        return (base, size as usize, foff, boff);
    }
    let boff = (boff as usize).min(avail);
    let size = (size.unsigned_abs() as usize).min(avail - boff);
    (base, size, foff, boff as i64)
}

fn segment(m: &Model, s: &SegSel) -> uGDSIoSegment_t {
    let (base, _) = address(m, s.mem);
    uGDSIoSegment { base: base as *mut c_void, offset: s.offset.value(), size: s.size.value() as usize }
}

fn pick_batch(m: &Model, sel: u8) -> (usize, Option<usize>) {
    let b = pick(sel, &m.batch_ids, &m.dead_batches);
    (b, m.batch_ids.iter().position(|x| *x == b))
}

fn registered(m: &mut Model, what: &str, r: uGDSOpError, base: usize, len: usize) {
    match r {
        UGDS_SUCCESS => {
            assert!(m.open && base.is_multiple_of(4096) && len > 0, "{what}({base:#x}, {len}) succeeded");
            assert!(m.bufs.insert(base, len).is_none(), "{what}: {base:#x} registered twice");
        }
        UGDS_MEMORY_ALREADY_REGISTERED => assert!(m.bufs.contains_key(&base)),
        UGDS_DRIVER_NOT_INITIALIZED => assert!(!m.open),
        _ => {}
    }
}

/// A deregistered handle: its batches went with it.
fn forget_handle(m: &mut Model, h: usize) {
    if let Some(i) = m.handles.iter().position(|x| *x == h) {
        m.dead_handles.push(m.handles.remove(i));
    }
    while let Some(i) = m.batches.iter().position(|b| b.0 == h) {
        m.batches.remove(i);
        m.dead_batches.push(m.batch_ids.remove(i));
    }
}

/// Releases everything the input made; each step must succeed now that nothing runs.
fn release(m: &mut Model) {
    for b in std::mem::take(&mut m.batch_ids) {
        uGDSBatchIODestroy(b as uGDSBatchHandle_t);
    }
    m.batches.clear();
    for s in std::mem::take(&mut m.streams) {
        check("CpuStreamDestroy", ugdsxCpuStreamDestroy(s as *mut c_void), &[]);
    }
    check("DriverOpen", uGDSDriverOpen(), &[]);
    for (base, _) in std::mem::take(&mut m.bufs) {
        check("BufDeregister at the end", uGDSBufDeregister(base as *const c_void), &[]);
    }
    for h in std::mem::take(&mut m.handles) {
        check("HandleDeregisterEx at the end", uGDSHandleDeregisterEx(h as uGDSHandle_t, 0), &[]);
    }
    check("DriverClose at the end", uGDSDriverClose(), &[]);
}

//! The `extern "C"` functions that the C++ engine (cpp/plugin.cpp) calls, through the table
//! [`OPS`] that `nixl_plugin_init` hands it (so the library exports NIXL's two entry points
//! and nothing else): each turns raw arguments into the engine's plain values, calls
//! `engine.rs`, logs a failure's named cause and returns NIXL's status code. Handles are boxes
//! handed to the C++ side as pointers.

use crate::engine::{status, Engine, Fail, MemReg, Reg, Seg, TargetReg, Xfer};
use crate::options::{Settings, DEFAULTS};
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Mutex;
use ugds::Op;

/// One descriptor as the C++ side flattens it (plugin.cpp: UgdsDesc).
#[repr(C)]
pub struct Desc {
    addr: u64,
    len: u64,
    dev_id: u64,
    /// The registration's `Reg` (from `ugds_nixl_register`), or null.
    md: *const c_void,
}

/// A prepared transfer behind NIXL's request handle.
type XferBox = Mutex<Xfer>;

fn fail(what: &str, f: Fail) -> i32 {
    log::error!("{what}: {}", f.cause);
    f.status
}

/// # Safety
///
/// `p` is null or points to `n` readable `T`s that outlive `'a`.
unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        return &[];
    }
    // SAFETY: forwarded from the caller.
    unsafe { std::slice::from_raw_parts(p, n) }
}

/// # Safety
///
/// `p` is null or points to `n` readable bytes.
unsafe fn text(p: *const c_char, n: usize) -> Result<String, Fail> {
    // SAFETY: forwarded from the caller.
    let b = unsafe { slice(p.cast::<u8>(), n) };
    String::from_utf8(b.to_vec())
        .map_err(|_| Fail { status: status::INVALID_PARAM, cause: "metaInfo is not UTF-8".into() })
}

/// Makes the engine from NIXL's parameters; null (and the cause logged) when they are refused.
///
/// # Safety
///
/// `keys` and `values` point to `n` NUL-terminated strings each.
pub(crate) unsafe extern "C" fn ugds_nixl_engine_new(
    keys: *const *const c_char,
    values: *const *const c_char,
    n: usize,
) -> *mut c_void {
    crate::install_logger();
    // SAFETY: the caller passes n pointers in each array.
    let (ks, vs) = unsafe { (slice(keys, n), slice(values, n)) };
    let mut params = Vec::with_capacity(n);
    for (&k, &v) in ks.iter().zip(vs) {
        // SAFETY: each is a NUL-terminated string of the core's parameter map, alive for the call.
        let (k, v) = unsafe { (CStr::from_ptr(k), CStr::from_ptr(v)) };
        params.push((k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()));
    }
    match Settings::parse(params.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
        Ok(s) => {
            log::info!("UGDS backend (ugds {}): {s:?}", env!("CARGO_PKG_VERSION"));
            Box::into_raw(Box::new(Engine::new(s))).cast()
        }
        Err(e) => {
            log::error!("creating the UGDS backend: {e}");
            std::ptr::null_mut()
        }
    }
}

/// Drops the engine.
///
/// # Safety
///
/// `e` is null or from `ugds_nixl_engine_new`, not used after.
pub(crate) unsafe extern "C" fn ugds_nixl_engine_free(e: *mut c_void) {
    if !e.is_null() {
        // SAFETY: from Box::into_raw in ugds_nixl_engine_new, freed once.
        drop(unsafe { Box::from_raw(e.cast::<Engine>()) });
    }
}

/// # Safety
///
/// `e` is from `ugds_nixl_engine_new` and alive.
unsafe fn engine<'a>(e: *mut c_void) -> Option<&'a Engine> {
    // SAFETY: forwarded from the caller; the engine is only read through shared references.
    unsafe { e.cast::<Engine>().as_ref() }
}

/// registerMem.
///
/// # Safety
///
/// `e` from `ugds_nixl_engine_new`; `meta` points to `meta_len` bytes; `out` is writable.
pub(crate) unsafe extern "C" fn ugds_nixl_register(
    e: *mut c_void,
    mem_type: i32,
    addr: u64,
    len: u64,
    dev_id: u64,
    meta: *const c_char,
    meta_len: usize,
    out: *mut *mut c_void,
) -> i32 {
    // SAFETY: forwarded from the caller.
    let (Some(e), Some(out)) = (unsafe { engine(e) }, unsafe { out.as_mut() }) else {
        return status::INVALID_PARAM;
    };
    let Some(seg) = Seg::from_raw(mem_type) else {
        return fail("registerMem", Fail { status: status::NOT_SUPPORTED, cause: format!("memory type {mem_type}") });
    };
    // SAFETY: forwarded from the caller.
    let r = unsafe { text(meta, meta_len) }.and_then(|m| e.register(seg, addr, len, dev_id, &m));
    match r {
        Ok(reg) => {
            *out = Box::into_raw(Box::new(reg)).cast();
            status::SUCCESS
        }
        Err(f) => fail("registerMem", f),
    }
}

/// deregisterMem: frees the registration unless I/O on it runs.
///
/// # Safety
///
/// `e` from `ugds_nixl_engine_new`; `md` from `ugds_nixl_register` of it, not used after a
/// success.
pub(crate) unsafe extern "C" fn ugds_nixl_deregister(e: *mut c_void, md: *mut c_void) -> i32 {
    // SAFETY: forwarded from the caller.
    let (Some(e), false) = (unsafe { engine(e) }, md.is_null()) else { return status::INVALID_PARAM };
    // SAFETY: a live registration (from Box::into_raw in ugds_nixl_register).
    let reg = unsafe { &*md.cast::<Reg>() };
    match e.deregister(reg) {
        Ok(()) => {
            // SAFETY: as above; NIXL frees each registration once, and no transfer refers to
            // it through this pointer (a transfer holds its own references).
            drop(unsafe { Box::from_raw(md.cast::<Reg>()) });
            status::SUCCESS
        }
        Err(f) => fail("deregisterMem", f),
    }
}

/// prepXfer.
///
/// # Safety
///
/// `e` from `ugds_nixl_engine_new`; `local`/`remote` point to `n_local`/`n_remote`
/// descriptors whose `md` is null or a live registration of this engine; `out` is writable.
pub(crate) unsafe extern "C" fn ugds_nixl_prep(
    e: *mut c_void,
    op: i32,
    local_type: i32,
    local: *const Desc,
    n_local: usize,
    remote_type: i32,
    remote: *const Desc,
    n_remote: usize,
    out: *mut *mut c_void,
) -> i32 {
    // SAFETY: forwarded from the caller.
    let (Some(e), Some(out)) = (unsafe { engine(e) }, unsafe { out.as_mut() }) else {
        return status::INVALID_PARAM;
    };
    let op = match op {
        0 => Op::Read,
        1 => Op::Write,
        _ => return fail("prepXfer", Fail { status: status::INVALID_PARAM, cause: format!("operation {op}") }),
    };
    let (lt, rt) = (Seg::from_raw(local_type), Seg::from_raw(remote_type));
    if !matches!(lt, Some(Seg::Dram | Seg::Vram)) || !matches!(rt, Some(Seg::File | Seg::Blk)) {
        let cause = format!(
            "UGDS moves DRAM or VRAM (local) to and from FILE or BLK (remote), not {lt:?} and {rt:?} (memory types {local_type}, {remote_type})"
        );
        return fail("prepXfer", Fail { status: status::NOT_SUPPORTED, cause });
    }
    // SAFETY: forwarded from the caller.
    let (l, r) = unsafe { (slice(local, n_local), slice(remote, n_remote)) };
    let mut mems: Vec<(&MemReg, u64, u64)> = Vec::with_capacity(l.len());
    for (i, d) in l.iter().enumerate() {
        // SAFETY: a live registration of this engine, or null (see the function's contract).
        match unsafe { d.md.cast::<Reg>().as_ref() } {
            Some(Reg::Mem(m)) => mems.push((m, d.addr, d.len)),
            _ => {
                let cause = format!("local descriptor {i} has no UGDS memory registration");
                return fail("prepXfer", Fail { status: status::NOT_FOUND, cause });
            }
        }
    }
    let mut targets: Vec<(&TargetReg, u64, u64)> = Vec::with_capacity(r.len());
    for (i, d) in r.iter().enumerate() {
        // SAFETY: as above.
        match unsafe { d.md.cast::<Reg>().as_ref() } {
            Some(Reg::Target(t)) => targets.push((t, d.addr, d.len)),
            _ => {
                let cause = format!("remote descriptor {i} (devId {}) has no UGDS target registration", d.dev_id);
                return fail("prepXfer", Fail { status: status::NOT_FOUND, cause });
            }
        }
    }
    match e.prep(op, &mems, &targets) {
        Ok(x) => {
            *out = Box::into_raw(Box::new(Mutex::new(x))).cast();
            status::SUCCESS
        }
        Err(f) => fail("prepXfer", f),
    }
}

/// # Safety
///
/// `x` is from `ugds_nixl_prep` and not released.
unsafe fn xfer<'a>(x: *mut c_void) -> Option<&'a XferBox> {
    // SAFETY: forwarded from the caller.
    unsafe { x.cast::<XferBox>().as_ref() }
}

/// postXfer.
///
/// # Safety
///
/// `x` is from `ugds_nixl_prep` and not released.
pub(crate) unsafe extern "C" fn ugds_nixl_post(_e: *mut c_void, x: *mut c_void) -> i32 {
    // SAFETY: forwarded from the caller.
    let Some(x) = (unsafe { xfer(x) }) else { return status::INVALID_PARAM };
    match x.lock().unwrap_or_else(|p| p.into_inner()).post() {
        Ok(s) => s,
        Err(f) => fail("postXfer", f),
    }
}

/// checkXfer.
///
/// # Safety
///
/// `x` is from `ugds_nixl_prep` and not released.
pub(crate) unsafe extern "C" fn ugds_nixl_check(_e: *mut c_void, x: *mut c_void) -> i32 {
    // SAFETY: forwarded from the caller.
    let Some(x) = (unsafe { xfer(x) }) else { return status::INVALID_PARAM };
    match x.lock().unwrap_or_else(|p| p.into_inner()).check() {
        Ok(s) => s,
        Err(f) => fail("checkXfer", f),
    }
}

/// releaseReqH: waits for what runs, then frees the transfer.
///
/// # Safety
///
/// `x` is from `ugds_nixl_prep`, not used after.
pub(crate) unsafe extern "C" fn ugds_nixl_release(_e: *mut c_void, x: *mut c_void) -> i32 {
    if x.is_null() {
        return status::INVALID_PARAM;
    }
    // SAFETY: from Box::into_raw in ugds_nixl_prep, released once.
    let x = unsafe { Box::from_raw(x.cast::<XferBox>()) };
    match x.into_inner().unwrap_or_else(|p| p.into_inner()).release() {
        Ok(()) => status::SUCCESS,
        Err(f) => fail("releaseReqH", f),
    }
}

/// A callback that adds one key and value to a C++ parameter map.
type Put = unsafe extern "C" fn(ctx: *mut c_void, key: *const c_char, value: *const c_char);

/// # Safety
///
/// `put` and `ctx` are the C++ side's callback and its map.
unsafe fn put_all(put: Put, ctx: *mut c_void, kvs: &[(String, String)]) {
    for (k, v) in kvs {
        let (Ok(k), Ok(v)) = (CString::new(k.as_str()), CString::new(v.as_str())) else { continue };
        // SAFETY: forwarded from the caller; the strings live for the call (the callback copies).
        unsafe { put(ctx, k.as_ptr(), v.as_ptr()) };
    }
}

/// queryMem, one descriptor: 1 and the target's facts (its name, path, capacity, block size)
/// for a FILE or BLK descriptor that opens; 0 otherwise.
///
/// # Safety
///
/// `e` from `ugds_nixl_engine_new`; `meta` points to `meta_len` bytes; `put`/`ctx` as
/// `put_all` wants.
pub(crate) unsafe extern "C" fn ugds_nixl_query(
    e: *mut c_void,
    mem_type: i32,
    dev_id: u64,
    meta: *const c_char,
    meta_len: usize,
    put: Put,
    ctx: *mut c_void,
) -> i32 {
    // SAFETY: forwarded from the caller.
    let Some(e) = (unsafe { engine(e) }) else { return 0 };
    let Some(seg @ (Seg::File | Seg::Blk)) = Seg::from_raw(mem_type) else { return 0 };
    // SAFETY: forwarded from the caller.
    let r = unsafe { text(meta, meta_len) }.and_then(|m| e.register(seg, 0, 0, dev_id, &m));
    match r {
        Ok(Reg::Target(t)) => {
            // SAFETY: forwarded from the caller.
            unsafe { put_all(put, ctx, &t.facts()) };
            1
        }
        Ok(Reg::Mem(_)) => 0,
        Err(f) => {
            log::info!("queryMem: {}", f.cause);
            0
        }
    }
}

/// The parameters and their defaults (NIXL's `get_backend_options`).
///
/// # Safety
///
/// `put`/`ctx` as `put_all` wants.
pub(crate) unsafe extern "C" fn ugds_nixl_options(put: Put, ctx: *mut c_void) {
    let kvs: Vec<(String, String)> = DEFAULTS.iter().map(|d| (d.0.to_string(), d.1.to_string())).collect();
    // SAFETY: forwarded from the caller.
    unsafe { put_all(put, ctx, &kvs) };
}

/// The plugin's version (ugds's), a static NUL-terminated string.
pub(crate) extern "C" fn ugds_nixl_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The functions the C++ side calls, in the order of its `UgdsOps` (plugin.cpp).
#[repr(C)]
pub struct Ops {
    engine_new: unsafe extern "C" fn(*const *const c_char, *const *const c_char, usize) -> *mut c_void,
    engine_free: unsafe extern "C" fn(*mut c_void),
    register: unsafe extern "C" fn(*mut c_void, i32, u64, u64, u64, *const c_char, usize, *mut *mut c_void) -> i32,
    deregister: unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32,
    prep: unsafe extern "C" fn(
        *mut c_void,
        i32,
        i32,
        *const Desc,
        usize,
        i32,
        *const Desc,
        usize,
        *mut *mut c_void,
    ) -> i32,
    post: unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32,
    check: unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32,
    release: unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32,
    query: unsafe extern "C" fn(*mut c_void, i32, u64, *const c_char, usize, Put, *mut c_void) -> i32,
    options: unsafe extern "C" fn(Put, *mut c_void),
    version: extern "C" fn() -> *const c_char,
}

/// The table `nixl_plugin_init` hands the C++ side.
pub static OPS: Ops = Ops {
    engine_new: ugds_nixl_engine_new,
    engine_free: ugds_nixl_engine_free,
    register: ugds_nixl_register,
    deregister: ugds_nixl_deregister,
    prep: ugds_nixl_prep,
    post: ugds_nixl_post,
    check: ugds_nixl_check,
    release: ugds_nixl_release,
    query: ugds_nixl_query,
    options: ugds_nixl_options,
    version: ugds_nixl_version,
};

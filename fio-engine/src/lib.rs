#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![deny(missing_docs)]
//! `libugds_fio.so`: an fio ioengine over ugds, for fio 3.33 exactly (the release Debian
//! bookworm ships; `sys.rs` holds its types).
//!
//! fio finds it two ways:
//! - `ioengine=external:/path/libugds_fio.so`: fio `dlopen`s the library and calls
//!   [`get_ioengine`] for the ops table;
//! - `LD_PRELOAD=/path/libugds_fio.so fio ... --ioengine=ugds`: a constructor adds the table to
//!   fio's list of engines under the name `ugds` (and a destructor takes it off).
//!
//! Either way the running fio's `fio_version_string` must be the one the bindings were made
//! from; another fio gets a line naming both and no engine (its structures differ).
//!
//! `filename=` is handed to the library's one target resolver (`ugds::Storage::open_with`):
//! a ugds node, a namespace of it (`ugds_nsid=`), a striped volume, an NVMe over Fabrics URI, a
//! file or a block device. I/O is synchronous at iodepth 1, and goes through a batch queue of
//! the fio thread's own at a larger iodepth (fio's commit is one submit: one doorbell, held while
//! finished I/Os wait to be handed to fio; see `Thread::commit`). fio's
//! I/O buffers are the engine's (`iomem_alloc`), registered once per thread and target.

mod engine;
mod fio;
mod options;
mod sys;

use engine::{Done, Outcome, Request, Thread};
use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// The table fio reads (and writes: it links registered engines into a list, and stores the
/// library's handle in it).
#[repr(transparent)]
struct Ops(UnsafeCell<sys::ioengine_ops>);

// SAFETY: fio reads and writes the table only while it loads engines and parses job options,
// on its main thread before any job runs; the engine's own code only takes its address.
unsafe impl Sync for Ops {}

/// No files of fio's making: fio neither stats, creates nor lays out `filename=` (it may be a
/// volume spec or a URI), and keeps no disk statistics for it; the engine reports each target's
/// size. RAWIO: fio aligns each I/O buffer as for O_DIRECT.
const FLAGS: u32 = sys::fio_ioengine_flags_FIO_DISKLESSIO
    | sys::fio_ioengine_flags_FIO_NODISKUTIL
    | sys::fio_ioengine_flags_FIO_RAWIO
    | sys::fio_ioengine_flags_FIO_MEMALIGN;

static OPS: Ops = Ops(UnsafeCell::new(sys::ioengine_ops {
    list: sys::flist_head { next: std::ptr::null_mut(), prev: std::ptr::null_mut() },
    name: c"ugds".as_ptr(),
    // CAST: FIO_IOOPS_VERSION (31) and the flags fit an int.
    version: sys::FIO_IOOPS_VERSION as c_int,
    flags: FLAGS as c_int,
    dlhandle: std::ptr::null_mut(),
    setup: None,
    init: Some(init),
    post_init: None,
    prep: None,
    queue: Some(queue),
    commit: Some(commit),
    getevents: Some(getevents),
    event: Some(event),
    errdetails: None,
    cancel: None,
    cleanup: Some(cleanup),
    open_file: Some(open_file),
    close_file: Some(close_file),
    invalidate: None,
    unlink_file: None,
    get_file_size: Some(get_file_size),
    prepopulate_file: None,
    terminate: None,
    iomem_alloc: Some(iomem_alloc),
    iomem_free: Some(iomem_free),
    io_u_init: None,
    io_u_free: None,
    get_zoned_model: None,
    report_zones: None,
    reset_wp: None,
    get_max_open_zones: None,
    // CAST: a 24-byte struct.
    option_struct_size: options::SIZE as c_int,
    options: options::OPTIONS.as_ptr(),
}));

// The ops table is fio 3.33's: FIO_IOOPS_VERSION 31, checked again by fio itself at load.
const _: () = assert!(sys::FIO_IOOPS_VERSION == 31);

/// Says, once, that this fio is not the one the engine was built for; true when it is.
fn version_ok() -> bool {
    let Some(f) = fio::fio() else { return false };
    if !f.is_ours() {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            log::error!(
                "libugds_fio.so was built for {} (ioengine ops version {}); this fio is {}: rebuild the engine \
                 against this fio's headers (cargo xtask fio-bindings --fio-src DIR)",
                sys::FIO_VERSION,
                sys::FIO_IOOPS_VERSION,
                f.version
            )
        });
    }
    f.is_ours()
}

/// fio's entry point for `ioengine=external:PATH`: hands over the ops table, or nothing (fio
/// then refuses the engine) when this fio is not the one the engine was built for.
///
/// # Safety
///
/// `ops` must be writable (fio passes the address of its own pointer).
#[no_mangle]
pub unsafe extern "C" fn get_ioengine(ops: *mut *mut sys::ioengine_ops) {
    fio::init_log();
    if ops.is_null() || !version_ok() {
        return;
    }
    // SAFETY: the caller passes a writable pointer; the table is a static.
    unsafe { *ops = OPS.0.get() };
}

/// Under LD_PRELOAD: registers the engine as `ugds` (when this process is the fio it was built
/// for; in any other process it does nothing).
extern "C" fn load() {
    if fio::fio().is_none() {
        return;
    }
    fio::init_log();
    if !version_ok() {
        return;
    }
    if let Some(f) = fio::fio() {
        // SAFETY: the table is a static, so it outlives the registration; `unload` takes it
        // off fio's list before the library can be unmapped.
        unsafe { f.register(OPS.0.get()) };
    }
}

/// Takes the engine off fio's list again (the library is being unloaded).
extern "C" fn unload() {
    if let Some(f) = fio::fio().filter(|f| f.is_ours()) {
        // SAFETY: `load` registered it (unregistering an unlinked table is harmless: fio's
        // list removal re-initialises the links).
        unsafe { f.unregister(OPS.0.get()) };
    }
}

// SAFETY: `.init_array` / `.fini_array` entries are called by the dynamic loader with no
// arguments when the library is loaded / unloaded: exactly `extern "C" fn()`.
#[used]
#[unsafe(link_section = ".init_array")]
static LOAD: extern "C" fn() = load;

// SAFETY: as above.
#[used]
#[unsafe(link_section = ".fini_array")]
static UNLOAD: extern "C" fn() = unload;

/// Runs an op, turning a panic (a bug) into fio's error convention instead of unwinding into C.
fn guarded<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        log::error!("internal error in the ugds engine (a panic); the operation failed");
        fallback
    })
}

/// Records an error on the job as fio's `td_verror` does: the first one wins, and its text is
/// what fio prints and puts in its JSON output.
///
/// # Safety
///
/// `td` must be a live job's thread_data.
unsafe fn set_error(td: *mut sys::thread_data, errno: i32, what: &str) {
    // SAFETY: the caller passes a live thread_data, touched by this job's thread only.
    let mut cur = unsafe { td.as_mut() };
    while let Some(t) = cur {
        if t.error == 0 {
            t.error = errno;
            if t.first_error == 0 {
                let msg = format!("ugds: {what}");
                let n = msg.len().min(t.verror.len() - 1);
                for (d, s) in t.verror.iter_mut().zip(msg.as_bytes()[..n].iter()) {
                    // CAST: bytes as C chars.
                    *d = *s as c_char;
                }
                t.verror[n] = 0;
            }
        }
        // SAFETY: fio's parent pointer is null or another live thread_data.
        cur = unsafe { t.parent.as_mut() };
    }
}

/// The job's engine state.
///
/// # Safety
///
/// `td` must be a live job's thread_data, whose ops fio calls from one thread at a time (every
/// job's ops run on its own thread or process), so no other reference to the state exists.
unsafe fn thread<'a>(td: *mut sys::thread_data) -> Option<&'a mut Thread> {
    // SAFETY: by the contract; io_ops_data is null or the Box that `init` leaked.
    unsafe { td.as_ref().and_then(|t| t.io_ops_data.cast::<Thread>().as_mut()) }
}

/// A file's name.
///
/// # Safety
///
/// `f` must be a live fio_file.
unsafe fn file_name(f: *const sys::fio_file) -> String {
    // SAFETY: fio sets file_name to a NUL-terminated string when it adds the file.
    unsafe { (*f).file_name.as_ref().map(|p| CStr::from_ptr(p).to_string_lossy().into_owned()).unwrap_or_default() }
}

/// The size fio would lay a missing file out to: the job's size (or filesize) past its offset.
fn create_len(o: &sys::thread_options) -> u64 {
    o.size.max(o.file_size_low).saturating_add(o.start_offset)
}

unsafe extern "C" fn init(td: *mut sys::thread_data) -> c_int {
    guarded(1, || {
        if !version_ok() {
            return 1;
        }
        // SAFETY: fio calls init with the job's live thread_data.
        let Some(t) = (unsafe { td.as_mut() }) else { return 1 };
        // SAFETY: eo is null or fio's allocation of `option_struct_size` bytes holding the
        // parsed options.
        let eo = unsafe { t.eo.cast::<options::EngineOptions>().as_ref() };
        let th = Thread::new(options::Settings::from(eo), t.o.iodepth as usize);
        t.io_ops_data = Box::into_raw(Box::new(th)).cast();
        0
    })
}

unsafe extern "C" fn cleanup(td: *mut sys::thread_data) {
    guarded((), || {
        // SAFETY: fio calls cleanup once, last, with the job's thread_data.
        let Some(t) = (unsafe { td.as_mut() }) else { return };
        let p = std::mem::replace(&mut t.io_ops_data, std::ptr::null_mut()).cast::<Thread>();
        if !p.is_null() {
            // SAFETY: `init` made it with Box::into_raw; the pointer is cleared above, so it is
            // freed once.
            drop(unsafe { Box::from_raw(p) });
        }
    })
}

unsafe extern "C" fn iomem_alloc(td: *mut sys::thread_data, len: usize) -> c_int {
    guarded(1, || {
        // SAFETY: fio passes the job's thread_data, after init.
        let (Some(th), Some(t)) = (unsafe { thread(td) }, unsafe { td.as_mut() }) else { return 1 };
        match th.alloc_mem(len) {
            Ok(p) => {
                t.orig_buffer = p.cast();
                0
            }
            Err(e) => {
                log::error!("allocating {len} bytes of I/O buffers: {e}");
                libc::ENOMEM
            }
        }
    })
}

unsafe extern "C" fn iomem_free(td: *mut sys::thread_data) {
    guarded((), || {
        // SAFETY: as in iomem_alloc.
        if let Some(th) = unsafe { thread(td) } {
            th.free_mem();
        }
    })
}

/// Opens the target (cached in the job's state when there is one) and sets fio's file size.
///
/// # Safety
///
/// `td` and `f` must be fio's live job and file.
unsafe fn open(td: *mut sys::thread_data, f: *mut sys::fio_file) -> c_int {
    // SAFETY: by the contract.
    let (name, fileno) = unsafe { (file_name(f), (*f).fileno) };
    // SAFETY: by the contract.
    let Some(t) = (unsafe { td.as_ref() }) else { return 1 };
    let len = create_len(&t.o);
    // SAFETY: by the contract.
    let size = match unsafe { thread(td) } {
        // CAST: fio's file numbers are small non-negative ints.
        Some(th) => th.open(fileno as usize, &name, len),
        // fio's main process sizes the files before the jobs start (create_serialize): open
        // with the job's options (its namespace), measure, close; the job opens its own.
        None if t.o.use_thread == 0 && engine::is_rdma_uri(&name) => Err(engine::rdma_needs_threads(&name)),
        None => {
            // SAFETY: eo is null or fio's parsed options of this job (`option_struct_size`
            // bytes), allocated before any file is sized.
            let eo = unsafe { t.eo.cast::<options::EngineOptions>().as_ref() };
            engine::open_storage(&name, &options::Settings::from(eo), len).and_then(|s| s.capacity())
        }
    };
    match size {
        Ok(n) => {
            // SAFETY: by the contract.
            let f = unsafe { &mut *f };
            f.real_file_size = n;
            f.flags |= sys::fio_file_flags_FIO_FILE_size_known;
            0
        }
        Err(e) => {
            log::error!("{name}: {e}");
            // SAFETY: by the contract.
            unsafe { set_error(td, e.errno().abs(), &format!("{name}: {e}")) };
            1
        }
    }
}

unsafe extern "C" fn get_file_size(td: *mut sys::thread_data, f: *mut sys::fio_file) -> c_int {
    // SAFETY: fio passes its live job and file.
    guarded(1, || unsafe { open(td, f) })
}

unsafe extern "C" fn open_file(td: *mut sys::thread_data, f: *mut sys::fio_file) -> c_int {
    // SAFETY: fio passes its live job and file.
    guarded(1, || unsafe { open(td, f) })
}

/// Targets stay open until the job ends (fio closes and reopens files between its phases, and
/// the registration of its buffers is kept across them); fio's descriptor stays -1.
unsafe extern "C" fn close_file(_td: *mut sys::thread_data, _f: *mut sys::fio_file) -> c_int {
    0
}

/// Applies a finished I/O to its io_u.
///
/// # Safety
///
/// `d.key` must be the address of a live io_u that this job queued.
unsafe fn finish(d: &Done) -> *mut sys::io_u {
    // CAST: the key is the io_u's address (see `queue`).
    let io = d.key as usize as *mut sys::io_u;
    // SAFETY: by the contract; fio does not touch an io_u while the engine holds it.
    let u = unsafe { &mut *io };
    // CAST: errno values are small and positive.
    u.error = d.error as c_uint;
    u.resid = if d.error == 0 { u.xfer_buflen.saturating_sub(d.bytes) } else { 0 };
    io
}

unsafe extern "C" fn queue(td: *mut sys::thread_data, io: *mut sys::io_u) -> sys::fio_q_status {
    guarded(sys::fio_q_status_FIO_Q_COMPLETED, || {
        // SAFETY: fio passes its live job and an io_u it owns and hands to the engine.
        let (th, u) = match unsafe { (thread(td), io.as_mut()) } {
            (Some(th), Some(u)) => (th, u),
            _ => return sys::fio_q_status_FIO_Q_COMPLETED,
        };
        let req = match u.ddir {
            sys::fio_ddir_DDIR_READ | sys::fio_ddir_DDIR_WRITE => Request::Rw {
                write: u.ddir == sys::fio_ddir_DDIR_WRITE,
                offset: u.offset,
                len: u.xfer_buflen,
                mem: u.xfer_buf.cast_const().cast(),
            },
            sys::fio_ddir_DDIR_SYNC | sys::fio_ddir_DDIR_DATASYNC => Request::Flush,
            sys::fio_ddir_DDIR_TRIM => Request::Other("trim"),
            _ => Request::Other("sync_file_range"),
        };
        // SAFETY: io_u.file is the live file the I/O is for.
        let fileno = unsafe { u.file.as_ref() }.map_or(usize::MAX, |f| f.fileno as usize);
        // CAST: the io_u's address is the key its completion comes back with.
        match th.queue(fileno, io as usize as u64, req) {
            Outcome::Completed(d) => {
                // SAFETY: the key is this io_u.
                unsafe { finish(&d) };
                sys::fio_q_status_FIO_Q_COMPLETED
            }
            Outcome::Queued => sys::fio_q_status_FIO_Q_QUEUED,
            Outcome::Busy => sys::fio_q_status_FIO_Q_BUSY,
        }
    })
}

unsafe extern "C" fn commit(td: *mut sys::thread_data) -> c_int {
    guarded(-libc::EIO, || {
        // SAFETY: fio passes its live job.
        if let Some(th) = unsafe { thread(td) } {
            th.commit();
        }
        0
    })
}

unsafe extern "C" fn getevents(td: *mut sys::thread_data, min: c_uint, max: c_uint, t: *const sys::timespec) -> c_int {
    guarded(-libc::EIO, || {
        // SAFETY: fio passes its live job.
        let Some(th) = (unsafe { thread(td) }) else { return 0 };
        // SAFETY: t is null (no deadline) or fio's timespec.
        let timeout = unsafe { t.as_ref() }
            // CAST: a timespec's fields are non-negative.
            .map(|t| Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32));
        let n = th.getevents(min as usize, max as usize, timeout);
        for d in &th.events {
            // SAFETY: every key in events is an io_u this job queued and has not got back yet.
            unsafe { finish(d) };
        }
        // CAST: at most `max`, a c_uint that fio keeps within iodepth.
        n as c_int
    })
}

unsafe extern "C" fn event(td: *mut sys::thread_data, i: c_int) -> *mut sys::io_u {
    guarded(std::ptr::null_mut(), || {
        // SAFETY: fio passes its live job.
        let Some(th) = (unsafe { thread(td) }) else { return std::ptr::null_mut() };
        // CAST: the key is the io_u's address.
        usize::try_from(i)
            .ok()
            .and_then(|i| th.events.get(i))
            .map_or(std::ptr::null_mut(), |d| d.key as usize as *mut _)
    })
}

//! What the engine uses of the fio that loaded it: the version string, `register_ioengine` /
//! `unregister_ioengine` and the log functions, found in the running process with `dlsym`
//! (fio is linked with `-rdynamic`, so its functions are in its dynamic symbol table).
//!
//! Looking them up at run time, instead of leaving undefined symbols for the dynamic linker,
//! means the library loads anywhere: preloaded into a program that is not fio it does
//! nothing, and loaded by another fio release it says which fio it was built for instead of
//! failing on a missing symbol or, worse, misreading that fio's structures.

use crate::sys;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::OnceLock;

/// `ssize_t log_info(const char *fmt, ...)` and `log_err`, from fio's `log.h`.
type LogFn = unsafe extern "C" fn(*const c_char, ...) -> isize;
/// `int log_info_flush(void)`, `log.h`.
type FlushFn = unsafe extern "C" fn() -> libc::c_int;
/// `void register_ioengine(struct ioengine_ops *)` and `unregister_ioengine`, `ioengines.h`.
type EngineFn = unsafe extern "C" fn(*mut sys::ioengine_ops);

/// The running fio, as far as the engine needs it.
pub(crate) struct Fio {
    /// `fio_version_string` (e.g. `fio-3.33`).
    pub(crate) version: String,
    log_info: Option<LogFn>,
    log_err: Option<LogFn>,
    log_flush: Option<FlushFn>,
    /// Present only when `version` is the one the bindings are for.
    register: Option<EngineFn>,
    unregister: Option<EngineFn>,
}

/// A symbol of the running process, or null.
fn symbol(name: &CStr) -> *mut c_void {
    // SAFETY: `name` is NUL-terminated; RTLD_DEFAULT searches the global scope and dlsym only
    // reads the name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// A function of the running process, typed as `F`.
///
/// # Safety
///
/// The process's symbol `name`, when it exists, must be a function of type `F`.
unsafe fn function<F: Copy>(name: &CStr) -> Option<F> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    let p = symbol(name);
    if p.is_null() {
        return None;
    }
    // SAFETY: F is a function pointer type of pointer size (checked above) and the caller
    // vouches for its signature.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

impl Fio {
    fn find() -> Option<Fio> {
        let v = symbol(c"fio_version_string");
        if v.is_null() {
            return None;
        }
        // SAFETY: fio defines `const char fio_version_string[] = FIO_VERSION;` (fio.c), a
        // NUL-terminated array that lives as long as the process.
        let version = unsafe { CStr::from_ptr(v.cast::<c_char>()) }.to_string_lossy().into_owned();
        let ours = version == sys::FIO_VERSION;
        // SAFETY: fio has declared the log functions as `ssize_t (const char *, ...)` and
        // `int (void)` (log.h) in every release with an external engine interface, so they are
        // usable to report a version mismatch; the engine table functions are taken only from
        // the release the bindings describe (ioengines.h).
        unsafe {
            Some(Fio {
                version,
                log_info: function::<LogFn>(c"log_info"),
                log_err: function::<LogFn>(c"log_err"),
                log_flush: function::<FlushFn>(c"log_info_flush"),
                register: if ours { function::<EngineFn>(c"register_ioengine") } else { None },
                unregister: if ours { function::<EngineFn>(c"unregister_ioengine") } else { None },
            })
        }
    }

    /// True when this fio is the release the engine was built for.
    pub(crate) fn is_ours(&self) -> bool {
        self.version == sys::FIO_VERSION
    }

    /// Adds `ops` to fio's list of engines (what makes `ioengine=ugds` work under LD_PRELOAD).
    ///
    /// # Safety
    ///
    /// `ops` must stay valid until [`Fio::unregister`] is called with it.
    pub(crate) unsafe fn register(&self, ops: *mut sys::ioengine_ops) -> bool {
        match self.register {
            // SAFETY: the function is fio 3.33's register_ioengine, which links `ops` into a
            // list; the caller keeps `ops` alive.
            Some(f) => unsafe { f(ops) },
            None => return false,
        }
        true
    }

    /// Takes `ops` off fio's list of engines.
    ///
    /// # Safety
    ///
    /// `ops` must have been registered with [`Fio::register`].
    pub(crate) unsafe fn unregister(&self, ops: *mut sys::ioengine_ops) {
        if let Some(f) = self.unregister {
            // SAFETY: fio 3.33's unregister_ioengine unlinks a registered `ops`.
            unsafe { f(ops) }
        }
    }

    /// Writes one line through fio's log (its output file, or stderr for errors).
    fn write(&self, error: bool, line: &str) {
        let Some(f) = (if error { self.log_err } else { self.log_info }) else {
            return;
        };
        // A line with a NUL in it loses what follows (the C string ends there).
        let text = CString::new(line.split('\0').next().unwrap_or_default()).unwrap_or_default();
        // SAFETY: `%s` with one NUL-terminated argument: fio's printf-style log never reads
        // more than that.
        unsafe { f(c"%s\n".as_ptr(), text.as_ptr()) };
        // A job process leaves with _exit, which drops what stdio still buffers: the line is
        // flushed now, or a report written to a file (--output) would lose it.
        if let Some(flush) = self.log_flush {
            // SAFETY: log_info_flush takes no arguments and flushes fio's output stream.
            unsafe { flush() };
        }
    }
}

static FIO: OnceLock<Option<Fio>> = OnceLock::new();

/// The fio this library runs in; `None` in a process that is not fio.
pub(crate) fn fio() -> Option<&'static Fio> {
    FIO.get_or_init(Fio::find).as_ref()
}

/// The `log` sink: every record becomes a `ugds: ...` line of fio's log (errors and warnings
/// through `log_err`).
struct FioLog;

impl log::Log for FioLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        if let Some(f) = fio() {
            f.write(r.level() <= log::Level::Warn, &format!("ugds: {}", r.args()));
        }
    }

    fn flush(&self) {}
}

static SINK: FioLog = FioLog;

/// Installs the sink (once; a program that installed its own logger keeps it). The level is
/// `info`, or `UGDS_FIO_LOG` (`error`, `warn`, `info`, `debug`, `trace`, `off`).
pub(crate) fn init_log() {
    if log::set_logger(&SINK).is_err() {
        return;
    }
    let level = std::env::var("UGDS_FIO_LOG").ok().and_then(|s| s.parse().ok()).unwrap_or(log::LevelFilter::Info);
    log::set_max_level(level);
}

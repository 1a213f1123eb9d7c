//! The library's notices (why a slower path was chosen, and the like) as Python log records:
//! a `log` logger that hands every record of the library to `logging.getLogger("ugds")`, so an
//! application filters, formats or silences them as it does its own. Unconfigured, Python's
//! last-resort handler prints warnings on standard error, as the CLI's sink
//! (`ugds::logging::log_to_stderr`) would.

use pyo3::prelude::*;

/// Forwards `log` records to Python's `logging`.
struct ToLogging;

/// Python's level number for a `log` level (logging.ERROR, WARNING, INFO, DEBUG; trace is
/// below DEBUG).
fn level(l: log::Level) -> u32 {
    match l {
        log::Level::Error => 40,
        log::Level::Warn => 30,
        log::Level::Info => 20,
        log::Level::Debug => 10,
        log::Level::Trace => 5,
    }
}

impl log::Log for ToLogging {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.target().starts_with("ugds")
    }

    fn log(&self, r: &log::Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let msg = r.args().to_string();
        // Not at all while the interpreter shuts down (nothing could receive it).
        let _ = Python::try_attach(|py| -> PyResult<()> {
            let logger = py.import("logging")?.call_method1("getLogger", ("ugds",))?;
            // `%s`: the message is data, never a format string of logging's.
            logger.call_method1("log", (level(r.level()), "%s", msg))?;
            Ok(())
        });
    }

    fn flush(&self) {}
}

static LOGGER: ToLogging = ToLogging;

/// Installs the bridge, unless the process has a `log` logger already (a Rust program
/// embedding Python keeps its own).
pub fn install() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

/// Test hook, not part of the API: logs `msg` as the library logs a notice (a warning of target
/// `ugds`), so the tests see the bridge without a machine that makes the library fall back.
#[pyfunction]
pub fn _notice_for_tests(py: Python<'_>, msg: String) {
    // From another thread, without the GIL, as the library's notices come.
    py.detach(move || {
        let t = std::thread::spawn(move || log::warn!(target: "ugds", "{msg}"));
        let _ = t.join();
    });
}

//! The library's diagnostics (which path an open took and why a slower one was chosen) go
//! through the `log` crate, so the program decides where they go: a Rust program installs the
//! logger it already uses, Python bridges them into its `logging`, and a program that installs
//! none sees none. The `ugds` command and `libugds.so` install [`log_to_stderr`], which writes
//! each record as one line on standard error, as the library did before it logged.

use log::LevelFilter;

/// The environment variable that sets the level of [`log_to_stderr`]'s sink: `off`, `error`,
/// `warn`, `info`, `debug` or `trace`, any case.
pub const LEVEL_ENV: &str = "UGDS_LOG";

/// The level `value` names (see [`LEVEL_ENV`]); `None` for anything else.
pub fn level(value: &str) -> Option<LevelFilter> {
    value.trim().parse().ok()
}

/// The line a record becomes: `ugds: MESSAGE` for warnings and errors (the notices a user
/// reads), `ugds LEVEL: MESSAGE` for the rest.
fn line(level: log::Level, args: &std::fmt::Arguments) -> String {
    match level {
        log::Level::Error | log::Level::Warn => format!("ugds: {args}"),
        other => format!("ugds {other}: {args}"),
    }
}

/// A `log` sink that writes each record as one line on standard error, made by `line` from
/// the record's level and message. The library's is [`log_to_stderr`]'s; the cuFile drop-in
/// makes one with cuFile's prefix.
pub struct StderrSink {
    line: fn(log::Level, &std::fmt::Arguments) -> String,
}

impl StderrSink {
    /// A sink whose lines `line` makes.
    pub const fn new(line: fn(log::Level, &std::fmt::Arguments) -> String) -> Self {
        StderrSink { line }
    }
}

impl log::Log for StderrSink {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            use std::io::Write;
            let line = (self.line)(r.level(), r.args());
            // A failed write to stderr has nowhere else to go.
            let _ = writeln!(std::io::stderr(), "{line}");
            #[cfg(test)]
            tests::WRITTEN.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }

    fn flush(&self) {}
}

/// Installs the standard-error sink with the level [`LEVEL_ENV`] names, else `default`.
/// Returns false, and changes nothing, when the process already has a logger: that one is
/// kept, with its level.
pub fn log_to_stderr(default: LevelFilter) -> bool {
    static SINK: StderrSink = StderrSink::new(line);
    if log::set_logger(&SINK).is_err() {
        return false;
    }
    let env = std::env::var(LEVEL_ENV).ok();
    let chosen = env.as_deref().and_then(level);
    log::set_max_level(chosen.unwrap_or(default));
    if let (Some(v), None) = (env, chosen) {
        log::warn!("{LEVEL_ENV}={v:?} is none of off, error, warn, info, debug, trace; using {default}");
    }
    true
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Every line the sink wrote in this test process (it is the only logger the unit tests
    /// install).
    pub(crate) static WRITTEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// The lines written so far that contain `s`.
    pub(crate) fn written(s: &str) -> Vec<String> {
        let w = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
        w.iter().filter(|l| l.contains(s)).cloned().collect()
    }

    #[test]
    fn level_names_and_lines() {
        assert_eq!(level("warn"), Some(LevelFilter::Warn));
        assert_eq!(level(" DEBUG "), Some(LevelFilter::Debug));
        assert_eq!(level("off"), Some(LevelFilter::Off));
        assert_eq!(level("loud"), None);
        let w = line(log::Level::Warn, &format_args!("{}: using {}: {}", "/f", "the fallback path", "why"));
        assert_eq!(w, "ugds: /f: using the fallback path: why");
        assert_eq!(line(log::Level::Debug, &format_args!("x")), "ugds DEBUG: x");
    }
}

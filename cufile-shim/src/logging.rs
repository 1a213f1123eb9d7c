//! The drop-in's diagnostics go through `log`; this is the sink, on standard error, with the
//! level cuFile's configuration names (`logging.level` in cufile.json, or the
//! `CUFILE_PARAM_LOGGING_LEVEL` string parameter).

use log::LevelFilter;

/// cuFile's level names (`NOTICE|ERROR|WARN|INFO|DEBUG|TRACE`, most severe first), any case.
/// NOTICE is above ERROR in cuFile's order; `log` has nothing above error, so NOTICE keeps the
/// errors only.
pub fn level(name: &str) -> Option<LevelFilter> {
    Some(match name.trim().to_ascii_uppercase().as_str() {
        "NOTICE" | "ERROR" => LevelFilter::Error,
        "WARN" | "WARNING" => LevelFilter::Warn,
        "INFO" => LevelFilter::Info,
        "DEBUG" => LevelFilter::Debug,
        "TRACE" => LevelFilter::Trace,
        _ => return None,
    })
}

/// Each record as one line on standard error, as `cuFile (ugds) LEVEL: message`.
static SINK: ugds::logging::StderrSink =
    ugds::logging::StderrSink::new(|level, args| format!("cuFile (ugds) {level}: {args}"));

/// Installs the sink (once: a logger the process set first is kept) and sets the level;
/// an unknown name keeps the level as it was, and says so.
pub fn set_level(name: &str) {
    let _ = log::set_logger(&SINK);
    match level(name) {
        Some(l) => log::set_max_level(l),
        None => log::warn!("logging level {name:?} is none of NOTICE, ERROR, WARN, INFO, DEBUG, TRACE; kept"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cufile_level_names() {
        assert_eq!(level("ERROR"), Some(LevelFilter::Error));
        assert_eq!(level("notice"), Some(LevelFilter::Error));
        assert_eq!(level(" Trace "), Some(LevelFilter::Trace));
        assert_eq!(level("WARN"), Some(LevelFilter::Warn));
        assert_eq!(level("loud"), None);
        let _l = crate::config::test_lock();
        set_level("DEBUG");
        assert_eq!(log::max_level(), LevelFilter::Debug);
        set_level("nonsense");
        assert_eq!(log::max_level(), LevelFilter::Debug);
        set_level("ERROR");
        assert_eq!(log::max_level(), LevelFilter::Error);
    }
}

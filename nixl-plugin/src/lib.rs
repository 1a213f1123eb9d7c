//! `libplugin_UGDS.so`: a NIXL backend plugin over ugds (backend name `UGDS`). NIXL's agent
//! loads it from its plugin directory (`NIXL_PLUGIN_DIR`) when asked for the backend `UGDS`,
//! and moves DRAM or VRAM to and from FILE and BLK descriptors whose target is anything the
//! library's target resolver opens: a ugds node, a striped volume, an NVMe over Fabrics URI,
//! a block device or a regular file.
//!
//! Layers: `cpp/plugin.cpp` is NIXL's face (a subclass of its backend engine, over our own
//! declaration of NIXL 1.5.1's ABI in `cpp/nixl_abi.h`); `ffi.rs` is the `extern "C"` bridge
//! it calls; `engine.rs` holds the logic over the `ugds` crate; `options.rs` the parameters.
//! See docs/nixl.md.

#![deny(missing_docs)]
// The crate is named for the file NIXL looks for (libplugin_<BACKEND>.so), not by Rust's rule.
#![allow(non_snake_case)]

pub mod engine;
pub mod ffi;
pub mod options;

use std::ffi::{c_char, c_int, c_void, CStr};

extern "C" {
    fn ugds_nixl_cpp_plugin(ops: *const ffi::Ops) -> *mut c_void;
    fn ugds_nixl_cpp_nixl_version() -> *const c_char;
    fn ugds_nixl_cpp_api_version() -> c_int;
}

/// The NIXL release whose ABI the C++ layer declares.
pub fn built_for() -> String {
    // SAFETY: returns a static NUL-terminated string (plugin.cpp).
    unsafe { CStr::from_ptr(ugds_nixl_cpp_nixl_version()) }.to_string_lossy().into_owned()
}

/// NIXL's backend plugin API version that the plugin record carries.
pub fn api_version() -> i32 {
    // SAFETY: a constant (plugin.cpp).
    unsafe { ugds_nixl_cpp_api_version() }
}

/// The line a log record becomes on standard error.
fn line(level: log::Level, args: &std::fmt::Arguments) -> String {
    format!("UGDS {level}: {args}")
}

/// The level NIXL's own log variable (`NIXL_LOG_LEVEL`: TRACE, DEBUG, INFO, WARN, ERROR,
/// FATAL) names.
fn nixl_level(v: &str) -> Option<log::LevelFilter> {
    Some(match v.trim().to_ascii_uppercase().as_str() {
        "TRACE" => log::LevelFilter::Trace,
        "DEBUG" => log::LevelFilter::Debug,
        "INFO" => log::LevelFilter::Info,
        "WARN" | "WARNING" => log::LevelFilter::Warn,
        "ERROR" | "FATAL" => log::LevelFilter::Error,
        _ => return None,
    })
}

/// Installs the plugin's log sink (standard error, next to NIXL's own lines) unless the
/// process has a logger: the level is `UGDS_LOG`'s, else `NIXL_LOG_LEVEL`'s, else warnings.
pub(crate) fn install_logger() {
    static SINK: ugds::logging::StderrSink = ugds::logging::StderrSink::new(line);
    if log::set_logger(&SINK).is_err() {
        return;
    }
    let env = |k| std::env::var(k).ok();
    let level = env(ugds::logging::LEVEL_ENV)
        .as_deref()
        .and_then(ugds::logging::level)
        .or_else(|| env("NIXL_LOG_LEVEL").as_deref().and_then(nixl_level))
        .unwrap_or(log::LevelFilter::Warn);
    log::set_max_level(level);
}

/// The version of the NIXL that loaded the plugin, where it says (see [`wheel_release`]).
fn loading_nixl() -> Option<(String, String)> {
    let lib = loaded_object("libnixl.so")?;
    let version = wheel_release(std::path::Path::new(&lib))?;
    Some((lib, version))
}

/// The release of the wheel that installed `lib`: a wheel install (`nixl_cuXY`, `nixl`) keeps
/// libnixl.so in `SITE/.nixl_cuXY.mesonpy.libs/` next to `SITE/nixl_cuXY-VERSION.dist-info`.
/// `None` for a NIXL built and installed from source.
fn wheel_release(lib: &std::path::Path) -> Option<String> {
    let libs_dir = lib.parent()?;
    let pkg = libs_dir.file_name()?.to_str()?.strip_prefix('.')?.strip_suffix(".mesonpy.libs")?.to_string();
    let site = libs_dir.parent()?;
    let prefix = format!("{pkg}-");
    std::fs::read_dir(site).ok()?.flatten().find_map(|e| {
        let n = e.file_name().into_string().ok()?;
        n.strip_prefix(&prefix)?.strip_suffix(".dist-info").map(str::to_string)
    })
}

/// The path of a loaded object whose file name is `name`.
fn loaded_object(name: &str) -> Option<String> {
    struct Find<'a> {
        name: &'a str,
        found: Option<String>,
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid record and our `Find` back.
        let (info, find) = unsafe { (&*info, &mut *data.cast::<Find>()) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: a NUL-terminated path the loader keeps for the object's life.
        let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
        if path.rsplit('/').next() == Some(find.name) {
            find.found = Some(path.into_owned());
            return 1;
        }
        0
    }
    let mut find = Find { name, found: None };
    // SAFETY: the callback only reads the records and writes `find`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut find as *mut Find).cast()) };
    find.found
}

/// Whether a NIXL of `version` runs the ABI of `built` (same major and minor release).
fn same_abi(version: &str, built: &str) -> bool {
    let mm = |v: &str| v.split('.').take(2).map(str::to_string).collect::<Vec<_>>();
    mm(version) == mm(built)
}

/// NIXL's entry point: the plugin record, after the load checks: the NIXL in this process
/// must be the release whose ABI the plugin declares, where it says which it is (NIXL's core
/// then checks the plugin API version itself). Null, with the reason logged, otherwise.
#[no_mangle]
pub extern "C" fn nixl_plugin_init() -> *mut c_void {
    install_logger();
    let built = built_for();
    match loading_nixl() {
        Some((lib, v)) if !same_abi(&v, &built) => {
            log::error!(
                "libplugin_UGDS.so (ugds {}) is built for NIXL {built}'s plugin ABI (plugin API {}), but this \
                 process runs NIXL {v} ({lib}): not loading it; install nixl {built} or rebuild the plugin for {v}",
                env!("CARGO_PKG_VERSION"),
                api_version()
            );
            return std::ptr::null_mut();
        }
        Some((lib, v)) => log::info!(
            "libplugin_UGDS.so (ugds {}) for NIXL {built} (plugin API {}), loaded by NIXL {v} ({lib})",
            env!("CARGO_PKG_VERSION"),
            api_version()
        ),
        None => log::info!(
            "libplugin_UGDS.so (ugds {}) for NIXL {built} (plugin API {}); the loading NIXL does not say its \
             release (not a wheel install): the plugin API version is all that is checked",
            env!("CARGO_PKG_VERSION"),
            api_version()
        ),
    }
    // SAFETY: keeps the address of a static table and returns that of the C++ side's static
    // plugin record.
    unsafe { ugds_nixl_cpp_plugin(&ffi::OPS) }
}

/// NIXL's exit point (nothing to undo: engines are destroyed by the core first).
#[no_mangle]
pub extern "C" fn nixl_plugin_fini() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_releases() {
        assert_eq!(built_for(), "1.5.1");
        assert_eq!(api_version(), 1);
        assert!(same_abi("1.5.1", "1.5.1") && same_abi("1.5.2", "1.5.1"));
        assert!(!same_abi("1.6.0", "1.5.1") && !same_abi("1.4.0", "1.5.1"));
    }

    #[test]
    fn the_wheel_says_its_release() {
        let site = tempfile::tempdir().expect("temp dir");
        let libs = site.path().join(".nixl_cu12.mesonpy.libs");
        std::fs::create_dir_all(&libs).expect("libs");
        std::fs::create_dir_all(site.path().join("nixl_cu12-1.6.0.dist-info")).expect("dist-info");
        std::fs::create_dir_all(site.path().join("numpy-2.0.0.dist-info")).expect("dist-info");
        let lib = libs.join("libnixl.so");
        assert_eq!(wheel_release(&lib).as_deref(), Some("1.6.0"));
        assert!(!same_abi("1.6.0", &built_for()));
        // A NIXL installed from source: no release to compare.
        assert_eq!(wheel_release(std::path::Path::new("/usr/local/lib/libnixl.so")), None);
    }

    #[test]
    fn levels() {
        assert_eq!(nixl_level("info"), Some(log::LevelFilter::Info));
        assert_eq!(nixl_level("FATAL"), Some(log::LevelFilter::Error));
        assert_eq!(nixl_level("loud"), None);
    }
}

//! The fake HIP runtime (`tests/fake_hip/fake_hip.c`), built with gcc and loaded through
//! `UGDS_HIP_LIBRARY`: shared by the HIP tests of `ugds` and of the C face (`ugds-c`).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use ugds::gpu::hip::LIBRARY_ENV;

/// Builds the fake runtime once per test process.
pub fn fake_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-hip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("libamdhip64.so");
        // The source is compiled into the test, so every crate's tests find it.
        let src = dir.join("fake_hip.c");
        std::fs::write(&src, include_str!("../fake_hip/fake_hip.c")).unwrap();
        let st = std::process::Command::new("gcc")
            .args(["-shared", "-fPIC", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("gcc runs");
        assert!(st.success(), "building the fake libamdhip64.so failed");
        out
    })
}

/// Serialises the tests (they change the environment the loader reads) and points the loader
/// at the fake runtime, answering in ROCm 6's numbering.
pub fn fake_hip() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var(LIBRARY_ENV, fake_library());
    std::env::remove_var("FAKE_HIP_RUNTIME_VERSION");
    std::env::remove_var("FAKE_HIP_DEVICES");
    g
}

//! Building `kmod/` (ugds.ko) out of tree against a kernel build tree.

use crate::toolchain::{self, KERNEL_RUSTC};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `ugds.ko` against the kernel build tree `kdir` with `rustc`, returning its path.
pub fn build(kdir: &Path, rustc: &Path) -> Result<PathBuf> {
    let src = toolchain::workspace_root().join("kmod");
    // Objects built against another kernel tree must not be reused: clean when it changes.
    let stamp = src.join(".ugds-kdir");
    let want = kdir.display().to_string();
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(want.as_str()) {
        let _ = Command::new("make").arg("-C").arg(&src).arg(format!("KDIR={want}")).arg("clean").output();
        let _ = std::fs::remove_file(src.join("bindings_generated.rs"));
        std::fs::write(&stamp, &want)?;
    }
    let out = Command::new("make")
        .arg("-C")
        .arg(&src)
        .arg(format!("KDIR={}", kdir.display()))
        .arg("LLVM=1")
        .arg(format!("RUSTC={}", rustc.display()))
        .arg(format!("HOSTRUSTC={}", rustc.display()))
        .arg(format!("BINDGEN={}", toolchain::bindgen()?.display()))
        .arg(format!("-j{}", toolchain::jobs()))
        .output()
        .context("running make for kmod/")?;
    if !out.status.success() {
        bail!(
            "building kmod/ against {} failed:\n{}{}",
            kdir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let ko = src.join("ugds.ko");
    if !ko.exists() {
        bail!("make succeeded but {} is missing", ko.display());
    }
    Ok(ko)
}

/// Builds `ugds.ko` for a guest kernel: against the test kernel's build folder, or inside a stock
/// kernel's root by `ugds-kmod` (which checks it against that kernel).
pub fn build_for(guest: &crate::vm::Guest) -> Result<PathBuf> {
    match guest {
        crate::vm::Guest::Built(k) => build_for_test_kernel(k),
        crate::vm::Guest::Stock(k) => k.build_module(),
    }
}

/// Builds `ugds.ko` for the cached test kernel.
pub fn build_for_test_kernel(k: &crate::kernel::TestKernel) -> Result<PathBuf> {
    build(&k.build, Path::new(KERNEL_RUSTC))
}

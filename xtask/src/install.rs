//! `cargo xtask install`: build kmod/ against the running kernel's build tree and load it,
//! refusing with a clear message when that cannot work.

use crate::{kmod, toolchain};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `rustc --version` ("rustc 1.96.0 (...)") as the kernel's CONFIG_RUSTC_VERSION (109600).
pub fn rustc_version_code(version_line: &str) -> Option<u32> {
    let v = version_line.split_whitespace().nth(1)?;
    let v = v.split('-').next()?;
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    let (ma, mi, pa) = (it.next()??, it.next()??, it.next()??);
    Some(ma * 100_000 + mi * 100 + pa)
}

fn config_value(config: &str, key: &str) -> Option<String> {
    config
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .map(|v| v.trim_matches('"').to_string())
}

fn rustc_candidates() -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Some(p) = toolchain::which("rustc") {
        c.push(p);
    }
    c.push(PathBuf::from("/usr/bin/rustc"));
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let rustup =
        std::env::var_os("RUSTUP_HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(&home).join(".rustup"));
    if let Ok(d) = fs::read_dir(rustup.join("toolchains")) {
        for e in d.filter_map(|e| e.ok()) {
            c.push(e.path().join("bin/rustc"));
        }
    }
    c.retain(|p| p.exists());
    c.dedup();
    c
}

/// Finds a rustc whose version equals the kernel's CONFIG_RUSTC_VERSION.
fn matching_rustc(want: u32) -> Result<PathBuf> {
    let mut seen = Vec::new();
    for r in rustc_candidates() {
        let line =
            Command::new(&r).arg("--version").output().ok().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        if let Some(line) = line {
            if rustc_version_code(&line) == Some(want) {
                return Ok(r);
            }
            seen.push(format!("{} ({})", r.display(), line.trim()));
        }
    }
    bail!(
        "the kernel was built with rustc version code {want}, and no matching rustc was found (looked in PATH, /usr/bin, rustup toolchains: {}). \
         Install that exact rustc (e.g. `rustup toolchain install {}.{}.{}` plus `rustup component add rust-src`) and retry.",
        if seen.is_empty() { "none found".into() } else { seen.join(", ") },
        want / 100_000,
        want / 100 % 1000,
        want % 100
    )
}

/// Checks a kernel build tree can build Rust modules; returns the rustc to use.
pub fn check_kdir(kdir: &Path) -> Result<PathBuf> {
    let config = fs::read_to_string(kdir.join(".config")).with_context(|| {
        format!(
            "{} has no .config: is it a kernel build tree? (install the kernel headers package or pass --kdir)",
            kdir.display()
        )
    })?;
    if config_value(&config, "CONFIG_RUST").as_deref() != Some("y") {
        bail!(
            "the kernel at {} was built without CONFIG_RUST, so it cannot load Rust modules. \
             Use the test kernel (`cargo xtask kernel`, then `cargo xtask vm --bind`), or build and boot a kernel with CONFIG_RUST=y.",
            kdir.display()
        );
    }
    let want: u32 = config_value(&config, "CONFIG_RUSTC_VERSION")
        .and_then(|v| v.parse().ok())
        .context("the kernel config has CONFIG_RUST=y but no CONFIG_RUSTC_VERSION")?;
    let rustc = matching_rustc(want)?;
    let meta = kdir.join("rust/libkernel.rmeta");
    if !meta.exists() {
        bail!(
            "{} lacks the kernel crate's Rust metadata ({}): out-of-tree Rust modules need a build tree from a full `make` with CONFIG_RUST=y \
             (Debian's linux-headers packages do not ship it). Point --kdir at such a tree.",
            kdir.display(),
            meta.display()
        );
    }
    Ok(rustc)
}

/// The release (`6.12.9-amd64`) of a kernel build tree.
fn release_of(kdir: &Path) -> Result<String> {
    let p = kdir.join("include/config/kernel.release");
    Ok(fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?.trim().to_string())
}

/// Builds ugds.ko for the running kernel (or `kdir`) and installs it with the CLI and the files
/// of `dist/` (see [`crate::dist`]); loads it unless staging into `destdir`.
pub fn install(kdir: Option<PathBuf>, prefix: &Path, destdir: Option<&Path>) -> Result<()> {
    let kdir = match kdir {
        Some(k) => k,
        None => {
            let release = toolchain::output(Command::new("uname").arg("-r"))?;
            PathBuf::from(format!("/lib/modules/{release}/build"))
        }
    };
    let rustc = check_kdir(&kdir)?;
    let ko = kmod::build(&kdir, &rustc)?;
    let layout =
        crate::dist::Layout { destdir: destdir.unwrap_or(Path::new("/")).to_path_buf(), prefix: prefix.into() };
    let mut installed = vec![crate::dist::install_module(&layout, &ko, &release_of(&kdir)?)?];
    installed.push(crate::dist::install_cli(&layout)?);
    installed.extend(crate::dist::install_files(&layout)?);
    for p in &installed {
        println!("installed {}", p.display());
    }
    if destdir.is_some() {
        return Ok(());
    }
    println!("boot-time binding: list controllers in /etc/ugds/bind.conf (see bind.conf.example), then `systemctl enable ugds-bind.service`");
    if Path::new("/sys/module/ugds").exists() {
        toolchain::run(Command::new("rmmod").arg("ugds")).context("unloading the old ugds module")?;
    }
    toolchain::run(Command::new("insmod").arg(&ko)).context("loading ugds.ko (see dmesg)")?;
    println!("loaded {}", ko.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustc_versions_become_config_codes() {
        assert_eq!(
            rustc_version_code("rustc 1.96.0 (ac68faa20 2026-05-25) (built from a source tarball)"),
            Some(109600)
        );
        assert_eq!(rustc_version_code("rustc 1.78.1-nightly (x)"), Some(107801));
        assert_eq!(rustc_version_code("garbage"), None);
    }

    #[test]
    fn refuses_a_tree_without_rust() {
        let dir = std::env::temp_dir().join(format!("ugds-kdir-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(".config"), "CONFIG_64BIT=y\n# CONFIG_RUST is not set\n").unwrap();
        let err = check_kdir(&dir).unwrap_err().to_string();
        assert!(err.contains("without CONFIG_RUST"), "{err}");
        fs::write(dir.join(".config"), "CONFIG_RUST=y\nCONFIG_RUSTC_VERSION=100\n").unwrap();
        let err = check_kdir(&dir).unwrap_err().to_string();
        assert!(err.contains("no matching rustc"), "{err}");
        let _ = fs::remove_dir_all(&dir);
        let err = check_kdir(Path::new("/nonexistent")).unwrap_err().to_string();
        assert!(err.contains("no .config"), "{err}");
    }
}

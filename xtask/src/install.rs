//! `cargo xtask install`: build kmod/ against the running kernel's build tree and load it,
//! refusing with a clear message when that cannot work.

use crate::toolchain;
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

/// The kernel's CONFIG_RUSTC_VERSION from a headers or build tree, when it has one.
fn kernel_rustc_code(kdir: &Path) -> Option<u32> {
    let config = fs::read_to_string(kdir.join(".config")).ok()?;
    config_value(&config, "CONFIG_RUSTC_VERSION")?.parse().ok()
}

/// Installs `ugds-kmod` as `ROOT/sbin/ugds-kmod` and the sources it builds (`kmod/`, `uapi/`:
/// what git tracks plus untracked files it does not ignore) under `ROOT/share/ugds/src`, where the
/// tool looks for them: the module can then be built on that machine without cargo.
pub fn install_kmod_tool(root: &Path) -> Result<()> {
    let ws = toolchain::workspace_root();
    let files = toolchain::output(Command::new("git").current_dir(&ws).args([
        "ls-files",
        "-co",
        "--exclude-standard",
        "kmod",
        "uapi",
    ]))?;
    let dest = root.join("share/ugds/src");
    let _ = fs::remove_dir_all(&dest);
    for f in files.lines().filter(|f| !f.is_empty()) {
        let from = ws.join(f);
        if !from.is_file() {
            continue; // deleted in the work tree
        }
        let to = dest.join(f);
        fs::create_dir_all(to.parent().context("no parent")?)?;
        fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
    }
    let tool = root.join("sbin/ugds-kmod");
    fs::create_dir_all(tool.parent().context("no parent")?)?;
    let _ = fs::remove_file(&tool);
    fs::copy(ws.join("kmod/ugds-kmod"), &tool).with_context(|| format!("installing {}", tool.display()))?;
    Ok(())
}

/// The `ugds-kmod` command of this checkout.
pub fn ugds_kmod() -> Command {
    Command::new(toolchain::workspace_root().join("kmod/ugds-kmod"))
}

/// The release (`6.12.9-amd64`) of a kernel build tree.
fn release_of(kdir: &Path) -> Result<String> {
    let p = kdir.join("include/config/kernel.release");
    Ok(fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?.trim().to_string())
}

/// Builds and checks ugds.ko for the running kernel (or the tree `kdir`) with `kmod/ugds-kmod
/// build` — which also serves stock distribution kernels, rebuilding the Rust metadata their
/// headers lack — and installs it with the CLI and the files of `dist/` (see [`crate::dist`]);
/// loads it unless staging into `destdir`.
pub fn install(kdir: Option<PathBuf>, prefix: &Path, destdir: Option<&Path>) -> Result<()> {
    let running = toolchain::output(Command::new("uname").arg("-r"))?;
    let headers = kdir.clone().unwrap_or_else(|| PathBuf::from(format!("/lib/modules/{running}/build")));
    let release = release_of(&headers).unwrap_or_else(|_| running.clone());
    let mut cmd = ugds_kmod();
    cmd.args(["build", "--release", &release]).arg("--headers").arg(&headers);
    // A rustup toolchain of the kernel's exact version, when PATH's rustc is another one.
    if std::env::var_os("RUSTC").is_none() {
        if let Some(want) = kernel_rustc_code(&headers) {
            if let Ok(r) = matching_rustc(want) {
                cmd.env("RUSTC", r);
            }
        }
    }
    let out = toolchain::output(&mut cmd).context("ugds-kmod build")?;
    let ko = PathBuf::from(out.lines().last().context("ugds-kmod build printed no module path")?.trim());
    let layout =
        crate::dist::Layout { destdir: destdir.unwrap_or(Path::new("/")).to_path_buf(), prefix: prefix.into() };
    let mut installed = vec![crate::dist::install_module(&layout, &ko, &release)?];
    installed.push(crate::dist::install_cli(&layout)?);
    installed.extend(crate::dist::install_files(&layout)?);
    // The module's build tool and sources: a kernel update is then handled on the machine.
    let staged_prefix = layout.staged(prefix);
    install_kmod_tool(&staged_prefix)?;
    installed.push(staged_prefix.join("sbin/ugds-kmod"));
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
    toolchain::run(Command::new("modprobe").arg("ugds")).context("loading ugds.ko (see dmesg)")?;
    println!("loaded ugds for {release}");
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
        fs::write(dir.join("Makefile"), "").unwrap();
        let run = |args: &[&str]| {
            let out = ugds_kmod().args(args).arg("--headers").arg(&dir).output().unwrap();
            (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
        };
        fs::write(dir.join(".config"), "CONFIG_64BIT=y\n# CONFIG_RUST is not set\n").unwrap();
        let (code, err) = run(&["build", "--release", "7.3.0-test"]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("without CONFIG_RUST") && err.contains("bindeb-pkg"), "{err}");
        fs::write(dir.join(".config"), "CONFIG_RUST=y\n").unwrap();
        let (code, err) = run(&["build", "--release", "5.10.0-test"]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("supports 6.12 7.3"), "{err}");
        fs::write(dir.join(".config"), "CONFIG_RUST=y\nCONFIG_RUSTC_VERSION_TEXT=\"rustc 0.1.0 (x)\"\n").unwrap();
        let (code, err) = run(&["build", "--release", "7.3.0-test"]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("the same compiler") || err.contains("no rustc"), "{err}");
        let (code, err) = run(&["check", "--release", "7.3.0-test", "/nonexistent/ugds.ko"]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("no module at"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    /// The quick first check: a rustc whose version text matches the kernel's but that is not
    /// the kernel's compiler (here: this machine's, against the crate hash of Debian's 7.3.4
    /// kernel) is refused before any metadata is rebuilt.
    #[test]
    fn another_compiler_is_refused_by_the_crate_hash() {
        let dir = std::env::temp_dir().join(format!("ugds-kdir-hash-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("Makefile"), "").unwrap();
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        let version = String::from_utf8(Command::new(&rustc).arg("--version").output().unwrap().stdout).unwrap();
        fs::write(
            dir.join(".config"),
            format!(
                "CONFIG_RUST=y\nCONFIG_RUSTC_VERSION_TEXT=\"{}\"\nCONFIG_CC_VERSION_TEXT=\"gcc (Debian) 12\"\n",
                version.trim()
            ),
        )
        .unwrap();
        fs::write(
            dir.join("Module.symvers"),
            "0x00000000\t_RNvMs1_NtNtCsb5MLIFMWygY_6kernel5alloc9allocatorNtB5_7Vmalloc7to_page\tvmlinux\tEXPORT_SYMBOL_GPL\t\n",
        )
        .unwrap();
        let out = ugds_kmod()
            .args(["prepare", "--release", "7.3.4-test", "--headers"])
            .arg(&dir)
            .arg("--cache")
            .arg(dir.join("cache"))
            .env("RUSTC", &rustc)
            .env("BINDGEN", "true")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(err.contains("Csb5MLIFMWygY_6kernel") && err.contains("not the compiler"), "{err}");
        assert!(!dir.join("cache").exists(), "nothing may be rebuilt after the refusal");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_tool_and_kbuild_support_the_same_series() {
        let root = toolchain::workspace_root();
        let tool = fs::read_to_string(root.join("kmod/ugds-kmod")).unwrap();
        let kbuild = fs::read_to_string(root.join("kmod/Kbuild")).unwrap();
        let list = |text: &str, key: &str| {
            text.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().trim_matches('"').to_string())
        };
        let series = list(&tool, "supported_series=").unwrap();
        assert_eq!(Some(series.clone()), list(&kbuild, "ugds_kernels :="), "ugds-kmod and Kbuild disagree");
        assert_eq!(series, "6.12 7.3");
    }
}

//! `cargo xtask kernel`: the Rust-enabled test kernel, built from Debian's `linux-source-6.12`
//! with the lean fragment in `ci/`, cached outside the repository.
//!
//! The cache key is a hash of everything the build depends on: the source package version,
//! the fragment(s), and the versions of rustc, bindgen and clang. A second run with the same
//! inputs finds the completed build and does nothing.

use crate::toolchain::{self, KERNEL_RUSTC, KERNEL_SOURCE_PACKAGE, KERNEL_SOURCE_TARBALL};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A built test kernel: its source tree, its out-of-tree build folder and its image.
#[derive(Debug, Clone)]
pub struct TestKernel {
    /// The extracted kernel source.
    pub src: PathBuf,
    /// The `O=` build folder: `.config`, `vmlinux`, modules, Rust metadata.
    pub build: PathBuf,
}

impl TestKernel {
    /// The bootable image.
    pub fn bzimage(&self) -> PathBuf {
        self.build.join("arch/x86/boot/bzImage")
    }

    /// The kernel's own NVMe driver modules, in load order.
    pub fn nvme_modules(&self) -> Vec<PathBuf> {
        vec![self.build.join("drivers/nvme/host/nvme-core.ko"), self.build.join("drivers/nvme/host/nvme.ko")]
    }

    /// The `make` variables every kernel and module build must share.
    pub fn make_vars() -> Result<Vec<String>> {
        Ok(vec![
            "LLVM=1".into(),
            format!("RUSTC={KERNEL_RUSTC}"),
            format!("HOSTRUSTC={KERNEL_RUSTC}"),
            format!("BINDGEN={}", toolchain::bindgen()?.display()),
        ])
    }
}

/// The kernels a VM can boot, by name (`--kernel NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Choice {
    /// The test kernel built from Debian's linux-source-6.12 with ci/kernel.fragment.
    #[default]
    #[value(name = "6.12")]
    Test612,
    /// The same with KASAN, lockdep and atomic-sleep checks.
    #[value(name = "6.12-debug")]
    Test612Debug,
    /// Debian 13's stock 7.3 kernel (trixie-backports), unmodified, in a Debian root.
    #[value(name = "debian-7.3")]
    Debian73,
}

impl Choice {
    /// `--debug-kernel` is the older spelling of `--kernel 6.12-debug`.
    pub fn with_debug(self, debug: bool) -> Choice {
        if debug {
            Choice::Test612Debug
        } else {
            self
        }
    }

    /// Whether this is a debug (KASAN) kernel: needs more memory and time.
    pub fn is_debug(self) -> bool {
        self == Choice::Test612Debug
    }

    /// The kernel, built or fetched unless the cache holds it.
    pub fn ensure(self) -> Result<crate::vm::Guest> {
        Ok(match self {
            Choice::Test612 => crate::vm::Guest::Built(ensure(Flavour::Normal)?),
            Choice::Test612Debug => crate::vm::Guest::Built(ensure(Flavour::Debug)?),
            Choice::Debian73 => crate::vm::Guest::Stock(crate::stock::ensure()?),
        })
    }
}

/// Which configuration to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// The lean test kernel.
    Normal,
    /// Plus KASAN, lockdep and atomic-sleep checks.
    Debug,
}

fn fragments(flavour: Flavour) -> Vec<PathBuf> {
    let ci = toolchain::workspace_root().join("ci");
    let mut v = vec![ci.join("kernel.fragment")];
    if flavour == Flavour::Debug {
        v.push(ci.join("kernel-debug.fragment"));
    }
    v
}

fn source_version() -> Result<String> {
    toolchain::output(Command::new("dpkg-query").args(["-W", "-f=${Version}"]).arg(KERNEL_SOURCE_PACKAGE)).with_context(
        || format!("{KERNEL_SOURCE_PACKAGE} is not installed: run `apt-get install {KERNEL_SOURCE_PACKAGE}`"),
    )
}

/// The cache key of a build: hex SHA-256 over all its inputs (first 16 digits).
fn cache_key(flavour: Flavour, src_version: &str) -> Result<String> {
    let mut h = Sha256::new();
    h.update(b"ugds-test-kernel-v1\0");
    h.update(src_version.as_bytes());
    for f in fragments(flavour) {
        h.update(fs::read(&f).with_context(|| format!("reading {}", f.display()))?);
    }
    h.update(toolchain::version_of(Path::new(KERNEL_RUSTC))?.as_bytes());
    h.update(toolchain::version_of(&toolchain::bindgen()?)?.as_bytes());
    h.update(toolchain::version_of(Path::new("clang")).unwrap_or_default().as_bytes());
    let digest = h.finalize();
    Ok(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
}

fn locate(flavour: Flavour) -> Result<(TestKernel, String)> {
    let version = source_version()?;
    let key = cache_key(flavour, &version)?;
    let cache = toolchain::cache_dir();
    let name = match flavour {
        Flavour::Normal => format!("kernel-{key}"),
        Flavour::Debug => format!("kernel-debug-{key}"),
    };
    Ok((
        TestKernel { src: cache.join("src").join(&version).join("linux-source-6.12"), build: cache.join(name) },
        version,
    ))
}

/// Builds the test kernel unless the cache already holds it.
pub fn ensure(flavour: Flavour) -> Result<TestKernel> {
    let (kernel, _version) = locate(flavour)?;
    let stamp = kernel.build.join(".ugds-complete");
    if stamp.exists() {
        eprintln!("test kernel: cached at {}", kernel.build.display());
        return Ok(kernel);
    }
    let log = kernel.build.join("ugds-build.log");
    if wait_for_other_build(&log, &stamp) {
        eprintln!("test kernel: built by another process at {}", kernel.build.display());
        return Ok(kernel);
    }
    extract_source(&kernel.src)?;
    fs::create_dir_all(&kernel.build)?;
    let vars = TestKernel::make_vars()?;

    let make = |args: &[&str]| -> Command {
        let mut c = Command::new("make");
        c.arg("-C").arg(&kernel.src).arg(format!("O={}", kernel.build.display())).args(&vars).args(args);
        c
    };
    run_logged(make(&["tinyconfig"]), &log, "tinyconfig")?;
    let mut merge = Command::new(kernel.src.join("scripts/kconfig/merge_config.sh"));
    merge
        .current_dir(&kernel.build)
        .args(["-m", "-O"])
        .arg(&kernel.build)
        .arg(kernel.build.join(".config"))
        .args(fragments(flavour));
    run_logged(merge, &log, "merge fragment")?;
    run_logged(make(&["olddefconfig"]), &log, "olddefconfig")?;
    check_config(&kernel.build.join(".config"), flavour, &kernel, &vars)?;
    let jobs = format!("-j{}", toolchain::jobs());
    run_logged(make(&[&jobs, "bzImage", "modules"]), &log, "build")?;
    fs::write(&stamp, b"")?;
    eprintln!("test kernel: built at {}", kernel.build.display());
    Ok(kernel)
}

/// Another process (a second worktree's `cargo xtask test`) may be building the same kernel into
/// the same folder: while its build log keeps growing (a line within 10 minutes), wait for its completion stamp instead of
/// starting a second build over it. True when the other build completed.
fn wait_for_other_build(log: &Path, stamp: &Path) -> bool {
    let fresh = || {
        fs::metadata(log)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < Duration::from_secs(600)))
    };
    if !fresh() {
        return false;
    }
    eprintln!("test kernel: another process is building it ({} is growing); waiting", log.display());
    while fresh() {
        if stamp.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_secs(5));
    }
    stamp.exists()
}

fn extract_source(src: &Path) -> Result<()> {
    if src.join("Makefile").exists() {
        return Ok(());
    }
    let parent = src.parent().context("source path has no parent")?;
    let tmp = parent.with_extension("partial");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    if !Path::new(KERNEL_SOURCE_TARBALL).exists() {
        bail!("{KERNEL_SOURCE_TARBALL} is missing: run `apt-get install {KERNEL_SOURCE_PACKAGE}`");
    }
    let pb = spinner("extracting kernel source");
    toolchain::run(Command::new("tar").arg("-xf").arg(KERNEL_SOURCE_TARBALL).arg("-C").arg(&tmp))?;
    pb.finish_and_clear();
    let _ = fs::remove_dir_all(parent);
    fs::rename(&tmp, parent)?;
    Ok(())
}

/// Every option the fragment asks for must have survived `olddefconfig`; a dropped one
/// (usually CONFIG_RUST, when the toolchain is wrong) is an error that says why.
fn check_config(config: &Path, flavour: Flavour, k: &TestKernel, vars: &[String]) -> Result<()> {
    let text = fs::read_to_string(config)?;
    let mut missing = Vec::new();
    for f in fragments(flavour) {
        for line in fs::read_to_string(&f)?.lines() {
            let line = line.trim();
            if line.starts_with("CONFIG_") && !text.lines().any(|l| l == line) {
                missing.push(line.to_string());
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let mut hint = String::new();
    if missing.iter().any(|m| m.starts_with("CONFIG_RUST=")) {
        let out = Command::new("make")
            .arg("-C")
            .arg(&k.src)
            .arg(format!("O={}", k.build.display()))
            .args(vars)
            .arg("rustavailable")
            .output()?;
        hint = format!(
            "\n`make rustavailable` says:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    bail!("the kernel config dropped options the fragment sets: {}{hint}", missing.join(", "))
}

fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {prefix}: {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_prefix(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// Runs a build step with its output appended to `log`, showing progress (lines of build output
/// and the latest one); on failure prints the log's tail.
fn run_logged(mut cmd: Command, log: &Path, step: &str) -> Result<()> {
    let mut logf = fs::OpenOptions::new().create(true).append(true).open(log)?;
    writeln!(logf, "==> {step}: {cmd:?}")?;
    let pb = spinner(step);
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let logf2 = logf.try_clone()?;
    let err_thread = std::thread::spawn(move || {
        let mut logf2 = logf2;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(logf2, "{line}");
        }
    });
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let mut n = 0u64;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        n += 1;
        writeln!(logf, "{line}")?;
        pb.set_message(format!("{n} steps, {}", line.trim()));
    }
    let status = child.wait()?;
    let _ = err_thread.join();
    pb.finish_and_clear();
    if !status.success() {
        eprintln!("--- last lines of {} ---\n{}", log.display(), toolchain::tail(log, 40));
        bail!("kernel {step} failed ({status}); full log: {}", log.display());
    }
    eprintln!("kernel {step}: done in {:.0?}", start.elapsed());
    Ok(())
}

//! Where the tools live: cache folders, the kernel's rustc, bindgen, and running commands.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The rustc that built (and must build modules for) the test kernel: Debian's `rustc-web`.
pub const KERNEL_RUSTC: &str = "/usr/bin/rustc";

/// The Debian kernel source tarball the test kernel is built from.
pub const KERNEL_SOURCE_TARBALL: &str = "/usr/src/linux-source-6.12.tar.xz";

/// The Debian package that ships [`KERNEL_SOURCE_TARBALL`].
pub const KERNEL_SOURCE_PACKAGE: &str = "linux-source-6.12";

/// Root of the workspace (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// Cache folder outside the repository: `$UGDS_CACHE`, else `$XDG_CACHE_HOME/ugds`, else `~/.cache/ugds`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("UGDS_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("ugds");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/ugds")
}

/// Finds bindgen: `$BINDGEN`, then PATH, then `~/.cargo/bin`.
pub fn bindgen() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("BINDGEN") {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = which("bindgen") {
        return Ok(p);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let p = PathBuf::from(home).join(".cargo/bin/bindgen");
    if p.exists() {
        return Ok(p);
    }
    bail!("bindgen not found: install it with `cargo install --locked bindgen-cli@0.73.0` (or set BINDGEN)")
}

/// Looks a program up in PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Runs a command to completion; an error names the command and its exit status.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs a command and returns its standard output (trimmed); fails on a non-zero exit.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The version line of a tool (`TOOL --version`), for cache keys.
pub fn version_of(tool: &Path) -> Result<String> {
    output(Command::new(tool).arg("--version"))
}

/// The last `n` lines of a file, for showing why a build failed.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The number of parallel build jobs: cores + 1.
pub fn jobs() -> usize {
    std::thread::available_parallelism().map(|n| n.get() + 1).unwrap_or(3)
}

/// Installs what is missing (`ci/setup.sh`) and builds `cargo build --release` with `args`
/// (the CLI and examples the demo and the benchmark run). Returns the release folder.
pub fn setup_and_build_release(args: &[&str]) -> Result<PathBuf> {
    let root = workspace_root();
    run(Command::new("bash").arg(root.join("ci/setup.sh"))).context("installing prerequisites")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).current_dir(&root).args(["build", "--quiet", "--release"]).args(args))?;
    Ok(root.join("target/release"))
}

//! `cargo xtask wheel`: the Python package (`python/`) built by maturin into
//! `target/wheels/ugds-<version>-cp39-abi3-<platform>.whl`, one wheel for every CPython >= 3.9.
//! maturin comes from PyPI into a virtual environment under `target/pyenv` (pinned below), which
//! the host tests also install the wheel into, exactly as a user would (`pip install` of the
//! wheel, nothing else).

use crate::toolchain;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The maturin release the wheel is built with (PyO3 0.30 needs >= 1.9.4).
const MATURIN: &str = "1.16.0";

/// numpy for the host tests (optional: they skip numpy's cases when it cannot be installed).
const NUMPY: &str = "numpy<3";

fn root() -> PathBuf {
    toolchain::workspace_root()
}

/// The virtual environment's directory.
fn venv() -> PathBuf {
    root().join("target/pyenv")
}

/// The virtual environment's python, created (with maturin) on first use.
pub fn python() -> Result<PathBuf> {
    let py = venv().join("bin/python");
    if !py.exists() {
        let made = Command::new("python3").args(["-m", "venv"]).arg(venv()).status();
        if !made.is_ok_and(|s| s.success()) {
            let _ = std::fs::remove_dir_all(venv());
            bail!(
                "`python3 -m venv {}` failed: install python3 and its venv module (Debian: apt-get install \
                 python3-venv)",
                venv().display()
            );
        }
    }
    let maturin = venv().join("bin/maturin");
    let have = toolchain::version_of(&maturin).unwrap_or_default();
    if !have.contains(MATURIN) {
        toolchain::run(
            Command::new(&py)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
                .arg(format!("maturin=={MATURIN}")),
        )
        .context("installing maturin from PyPI into target/pyenv")?;
    }
    Ok(py)
}

/// Builds the wheel; returns its path (the only `ugds-*.whl` in target/wheels afterwards).
pub fn build() -> Result<PathBuf> {
    python()?;
    let out = root().join("target/wheels");
    std::fs::create_dir_all(&out)?;
    for e in std::fs::read_dir(&out)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("ugds-") && name.ends_with(".whl") {
            std::fs::remove_file(e.path())?;
        }
    }
    toolchain::run(
        Command::new(venv().join("bin/maturin"))
            .current_dir(root())
            .args(["build", "--release", "--quiet", "-m", "python/Cargo.toml", "--out"])
            .arg(&out),
    )?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(&out)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("ugds-")))
        .collect();
    match &wheels[..] {
        [w] => Ok(w.clone()),
        _ => bail!("expected one ugds wheel in {}, found {wheels:?}", out.display()),
    }
}

/// Installs `wheel` into the virtual environment as a user would (pip, no other dependency),
/// plus numpy for the tests when PyPI has it.
fn install(py: &Path, wheel: &Path) -> Result<()> {
    toolchain::run(
        Command::new(py)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "--force-reinstall", "--no-deps"])
            .arg(wheel),
    )?;
    let has_numpy = Command::new(py).args(["-c", "import numpy"]).output().is_ok_and(|o| o.status.success());
    if !has_numpy {
        let ok = Command::new(py)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", NUMPY])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("numpy could not be installed: the Python tests skip its cases");
        }
    }
    Ok(())
}

/// Parses the Python suite's `UGDS-PY passed=N failed=M skipped=K` line.
pub fn parse_result(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().rev().find_map(|l| l.find("UGDS-PY ").map(|i| &l[i..]))?;
    let get = |k: &str| {
        line.split_whitespace().find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('='))?.parse().ok())
    };
    Some((get("passed")?, get("failed")?))
}

/// The host phase of `cargo xtask test`: builds the wheel, installs it, runs every
/// tests/python/test_ugds_*.py (the package on files: the fallback path; the KV store and the
/// LMCache connector); returns (passed, failed) summed over the scripts.
pub fn host_tests() -> Result<(u64, u64)> {
    let wheel = build()?;
    let py = python()?;
    install(&py, &wheel)?;
    let dir = root().join("target/py-test");
    std::fs::create_dir_all(&dir)?;
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(root().join("tests/python"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("test_ugds_")))
        .collect();
    scripts.sort();
    let (mut passed, mut failed) = (0, 0);
    for script in scripts {
        let out = Command::new(&py)
            .arg(&script)
            .env("UGDS_TEST_DIR", &dir)
            // The installed wheel, not the sources: run from a folder without a `ugds` package.
            .current_dir(&dir)
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        print!("{text}");
        match parse_result(&text) {
            Some((p, f)) => {
                passed += p;
                // A crash after the summary line still fails the phase.
                failed += if out.status.success() || f > 0 { f } else { 1 };
            }
            None => {
                eprintln!("{} did not finish ({})", script.display(), out.status);
                failed += 1;
            }
        }
    }
    Ok((passed, failed))
}

/// Builds the wheel and installs it into `target/pyenv`, where the VM's python variant runs it
/// (the host phase does this before its own Python tests).
pub fn install_for_vm() -> Result<()> {
    let wheel = build()?;
    install(&python()?, &wheel)
}

/// `cargo xtask wheel`.
pub fn run() -> Result<()> {
    let w = build()?;
    println!("{}", w.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_python_result_line() {
        assert_eq!(parse_result("x\nUGDS-PY passed=12 failed=1 skipped=2\n"), Some((12, 1)));
        assert_eq!(parse_result("UGDS-PY passed=3"), None);
        assert_eq!(parse_result("nothing"), None);
    }
}

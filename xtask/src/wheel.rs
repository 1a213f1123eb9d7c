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

/// The vLLM release `tests/python/test_ugds_vllm.py` runs against (its wheel, 336 MB, is cached
/// in `~/.cache/ugds/vllm-<version>`), installed without its dependencies.
const VLLM: &str = "0.33.0";

/// What `vllm.v1.kv_offload`'s imports need beyond Debian's torch and numpy (pure Python, pinned).
const VLLM_IMPORTS: &[&str] = &["packaging==26.4", "msgspec==0.23.0", "typing_extensions==4.16.0"];

/// The LMCache release `tests/python/test_lmcache_select.py` runs against (its wheel for
/// Debian's Python 3.11, 17.7 MB, is cached in `~/.cache/ugds/lmcache-<version>`), installed
/// without its dependencies.
const LMCACHE: &str = "0.5.6";

/// What the LMCache modules that test imports need beyond Debian's torch and what it depends on
/// (numpy, psutil, requests, PyYAML, sortedcontainers) and python3-cryptography
/// (ci/packages.txt); prometheus_client as LMCache 0.5.6 bounds it.
const LMCACHE_IMPORTS: &[&str] =
    &["aiohttp==3.14.5", "cachetools==8.0.2", "prometheus_client==0.24.1", "py-cpuinfo==9.0.0"];

/// The interpreter of the vLLM and LMCache environments: Debian's, whose `python3-torch` (a CPU
/// build; PyPI's torch wheels need CUDA's libraries to import) their venvs see through
/// `--system-site-packages`.
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

fn root() -> PathBuf {
    toolchain::workspace_root()
}

/// The virtual environment's directory.
fn venv() -> PathBuf {
    root().join("target/pyenv")
}

/// The python of the virtual environment at `dir`, created (empty) on first use.
pub fn venv_python(dir: &Path) -> Result<PathBuf> {
    let py = dir.join("bin/python");
    if !py.exists() {
        let made = Command::new("python3").args(["-m", "venv"]).arg(dir).status();
        if !made.is_ok_and(|s| s.success()) {
            let _ = std::fs::remove_dir_all(dir);
            bail!(
                "`python3 -m venv {}` failed: install python3 and its venv module (Debian: apt-get install \
                 python3-venv)",
                dir.display()
            );
        }
    }
    Ok(py)
}

/// The virtual environment's python, created (with maturin) on first use.
pub fn python() -> Result<PathBuf> {
    let py = venv_python(&venv())?;
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

/// `target/vllm-env`: vLLM `VLLM` and `VLLM_IMPORTS` in an environment of Debian's Python
/// ([`system_env`]).
fn vllm_env(wheel: &Path) -> Result<PathBuf> {
    system_env("vllm-env", ("vllm", VLLM, "about 336 MB"), VLLM_IMPORTS, wheel)
}

/// `target/lmcache-env`: LMCache `LMCACHE` and `LMCACHE_IMPORTS` in an environment of Debian's
/// Python ([`system_env`]), where `tests/python/test_lmcache_select.py` runs, on the host and
/// in the VM (which has no network: this is made before it boots).
fn lmcache_env(wheel: &Path) -> Result<PathBuf> {
    system_env("lmcache-env", ("lmcache", LMCACHE, "about 18 MB"), LMCACHE_IMPORTS, wheel)
}

/// `target/<name>`: a virtual environment of Debian's Python with its torch and numpy, the
/// release `(package, version, size)` (`pip --no-deps`, from its wheel cached by
/// [`cached_wheel`]), `pins`, and `wheel`. Kept between runs (a marker names what it holds), so a
/// warm run only reinstalls the ugds wheel. Fails, naming the fix, when something cannot be had:
/// the tests that need the release must not skip.
fn system_env(name: &str, release: (&str, &str, &str), pins: &[&str], wheel: &Path) -> Result<PathBuf> {
    let (package, version, _) = release;
    let torch = Command::new(SYSTEM_PYTHON).args(["-c", "import torch, numpy"]).output();
    if !torch.as_ref().is_ok_and(|o| o.status.success()) {
        bail!(
            "{SYSTEM_PYTHON} cannot import torch and numpy (the {package} tests need them): apt-get install \
             python3-torch python3-numpy python3-venv (ci/packages.txt lists them)"
        );
    }
    let env = root().join("target").join(name);
    let py = env.join("bin/python");
    let marker = env.join(format!("ugds-{name}"));
    let want = format!("{package}=={version} {}", pins.join(" "));
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(want.as_str()) {
        let _ = std::fs::remove_dir_all(&env);
        toolchain::run(Command::new(SYSTEM_PYTHON).args(["-m", "venv", "--system-site-packages"]).arg(&env))
            .with_context(|| format!("creating target/{name} (apt-get install python3-venv)"))?;
        let pip = |args: &[&str]| {
            toolchain::run(
                Command::new(&py).args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]).args(args),
            )
        };
        pip(&["--no-deps", path_str(&cached_wheel(&py, release)?)?])
            .with_context(|| format!("installing {package} into target/{name}"))?;
        pip(pins).with_context(|| format!("installing what {package}'s modules import into target/{name}"))?;
        std::fs::write(&marker, &want)?;
    }
    toolchain::run(
        Command::new(&py)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "--force-reinstall", "--no-deps"])
            .arg(wheel),
    )?;
    Ok(py)
}

/// The wheel of `(package, version, size)` in the cache, `~/.cache/ugds/<package>-<version>`
/// (`pip download` by `py`, so for its Python, into it on first use).
fn cached_wheel(py: &Path, (package, version, size): (&str, &str, &str)) -> Result<PathBuf> {
    let dir = toolchain::cache_dir().join(format!("{package}-{version}"));
    let find = || -> Option<PathBuf> {
        std::fs::read_dir(&dir).ok()?.flatten().map(|e| e.path()).find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(&format!("{package}-{version}-")) && n.ends_with(".whl")
            })
        })
    };
    if let Some(w) = find() {
        return Ok(w);
    }
    let tmp = dir.with_extension("part");
    let _ = std::fs::remove_dir_all(&tmp);
    println!("downloading {package} {version}'s wheel ({size}) into {}", dir.display());
    toolchain::run(
        Command::new(py)
            .args(["-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps", "-d"])
            .arg(&tmp)
            .arg(format!("{package}=={version}")),
    )
    .with_context(|| format!("downloading {package}'s wheel from PyPI"))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir)?;
    find().with_context(|| format!("no {package}-{version} wheel in {}", dir.display()))
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str().with_context(|| format!("{} is not UTF-8", p.display()))
}

/// Parses the Python suite's `UGDS-PY passed=N failed=M skipped=K` line.
pub fn parse_result(text: &str) -> Option<(u64, u64)> {
    parse_counts(text, "UGDS-PY ")
}

/// Parses the last `TAG passed=N failed=M ...` line of a script's output.
pub fn parse_counts(text: &str, tag: &str) -> Option<(u64, u64)> {
    let line = text.lines().rev().find_map(|l| l.find(tag).map(|i| &l[i..]))?;
    let get = |k: &str| {
        line.split_whitespace().find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('='))?.parse().ok())
    };
    Some((get("passed")?, get("failed")?))
}

/// The host phase of `cargo xtask test`: builds the wheel, installs it, runs every
/// tests/python/test_ugds_*.py (the package on files: the fallback path; the KV store and the
/// LMCache connector; the vLLM offloading spec twice, in `target/vllm-env`), then
/// tests/python/test_lmcache_select.py in `target/lmcache-env` (LMCache's own selection code
/// against our installed libugds.so, on files: its node tests run in the VM); returns (passed,
/// failed) summed over the scripts.
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
    let mut count = |(p, f): (u64, u64)| {
        passed += p;
        failed += f;
    };
    // The vLLM spec's tests run in their own environment: with vLLM (which must import), then
    // on the stand-in classes a GPU machine without vLLM uses.
    let vllm = scripts.iter().any(|s| s.file_name().is_some_and(|n| n.to_string_lossy().starts_with("test_ugds_vllm")));
    let vllm_py = if vllm {
        match vllm_env(&wheel) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("the vLLM tests' environment: {e:#}");
                count((0, 1));
                None
            }
        }
    } else {
        None
    };
    for script in &scripts {
        if !script.file_name().is_some_and(|n| n.to_string_lossy().starts_with("test_ugds_vllm")) {
            count(run_script(&py, script, &dir, &[])?);
        } else if let Some(vpy) = &vllm_py {
            count(run_script(vpy, script, &dir, &[("UGDS_VLLM_REQUIRE", VLLM)])?);
            count(run_script(vpy, script, &dir, &[("UGDS_VLLM_SHIM", "1")])?);
        }
    }
    match lmcache_env(&wheel) {
        Ok(lpy) => {
            let lib = path_str(&lmcache_lib_dir())?.to_string();
            let env = [("UGDS_LMCACHE_REQUIRE", LMCACHE), ("LD_LIBRARY_PATH", lib.as_str())];
            count(run_script(&lpy, &root().join("tests/python/test_lmcache_select.py"), &dir, &env)?);
        }
        Err(e) => {
            eprintln!("the LMCache tests' environment: {e:#}");
            count((0, 1));
        }
    }
    Ok((passed, failed))
}

/// The folder of the installed libugds.so that LMCache's uGDS backend finds through
/// `LD_LIBRARY_PATH` (`target/c-prefix/lib`, installed by the C suite's build before the host
/// phases and the VM).
fn lmcache_lib_dir() -> PathBuf {
    root().join("target/c-prefix/lib")
}

/// Runs one test script with `py`; returns its (passed, failed), a script that did not finish or
/// crashed after its summary line counting one failure.
fn run_script(py: &Path, script: &Path, dir: &Path, env: &[(&str, &str)]) -> Result<(u64, u64)> {
    let out = Command::new(py)
        .arg(script)
        .env("UGDS_TEST_DIR", dir)
        .envs(env.iter().copied())
        // The installed wheel, not the sources: run from a folder without a `ugds` package.
        .current_dir(dir)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    print!("{text}");
    Ok(match parse_result(&text) {
        // A crash after the summary line still fails the phase.
        Some((p, f)) => (p, if out.status.success() || f > 0 { f } else { 1 }),
        None => {
            eprintln!("{} {env:?} did not finish ({})", script.display(), out.status);
            (0, 1)
        }
    })
}

/// Builds the wheel and installs it into `target/pyenv`, where the VM's python variant runs it,
/// and makes `target/lmcache-env` with it (the VM has no network to fetch LMCache's wheel);
/// the host phase does both before its own Python tests. An LMCache environment that cannot be
/// made is said here; the VM test that needs it then fails naming it.
pub fn install_for_vm() -> Result<()> {
    let wheel = build()?;
    install(&python()?, &wheel)?;
    if let Err(e) = lmcache_env(&wheel) {
        eprintln!("the LMCache test's environment (target/lmcache-env) for the VM: {e:#}");
    }
    Ok(())
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

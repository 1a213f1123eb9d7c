//! The NIXL backend plugin's host phase: NIXL's own Python API (the PyPI wheel `nixl-cu12`,
//! the release the plugin's ABI declaration matches) in a virtual environment of its own,
//! `target/nixl-pyenv`, runs tests/nixl/test_nixl_ugds.py against libplugin_UGDS.so and NIXL's
//! POSIX plugin on a file (the fallback path).

use crate::toolchain;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The NIXL wheel (no dependencies installed: torch is only a type hint of its Python API).
const NIXL: &str = "nixl-cu12==1.5.1";
/// Its import name and version, as the installed package reports them.
const NIXL_MODULE: &str = "nixl_cu12";
const NIXL_VERSION: &str = "1.5.1";
/// The test script's own dependency.
const NUMPY: &str = "numpy<3";

fn root() -> PathBuf {
    toolchain::workspace_root()
}

fn venv() -> PathBuf {
    root().join("target/nixl-pyenv")
}

/// The virtual environment's python with NIXL installed (from PyPI on first use, or from
/// the wheel file `UGDS_NIXL_WHEEL` names).
pub fn python() -> Result<PathBuf> {
    let py = crate::wheel::venv_python(&venv())?;
    let check = format!("import numpy, importlib.metadata as m; assert m.version('{NIXL_MODULE}'.replace('_', '-')) == '{NIXL_VERSION}'");
    if !Command::new(&py).args(["-c", &check]).output().is_ok_and(|o| o.status.success()) {
        let wheel = std::env::var("UGDS_NIXL_WHEEL").unwrap_or_else(|_| NIXL.to_string());
        toolchain::run(
            Command::new(&py)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"])
                .arg(&wheel)
                .arg(NUMPY),
        )
        .with_context(|| format!("installing {wheel} into {}", venv().display()))?;
    }
    Ok(py)
}

/// NIXL's package folder and its plugins' folder in the environment.
fn site(py: &Path) -> Result<PathBuf> {
    let code = format!("import {NIXL_MODULE}, os; print(os.path.dirname(os.path.dirname({NIXL_MODULE}.__file__)))");
    Ok(PathBuf::from(toolchain::output(Command::new(py).args(["-c", &code]))?))
}

/// Builds the plugin and makes a plugin folder with it and NIXL's POSIX plugin
/// (`target/nixl-plugins`, the folder NIXL_PLUGIN_DIR names) beside the environment
/// (`target/nixl-pyenv`): what the host phase and the VM's `nixl` variant run. Returns the
/// environment's python, NIXL's package folder and the plugin folder.
pub fn prepare() -> Result<(PathBuf, PathBuf, PathBuf)> {
    toolchain::run(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())).current_dir(root()).args([
            "build",
            "--quiet",
            "-p",
            "ugds-nixl",
            "--lib",
        ]),
    )?;
    let py = python()?;
    let site = site(&py)?;
    let libs = site.join(format!(".{NIXL_MODULE}.mesonpy.libs"));
    let dir = root().join("target/nixl-plugins");
    std::fs::create_dir_all(&dir)?;
    for (name, from) in [
        ("libplugin_UGDS.so", root().join("target/debug/libplugin_UGDS.so")),
        ("libplugin_POSIX.so", libs.join("plugins/libplugin_POSIX.so")),
    ] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&from, &link).with_context(|| format!("linking {}", link.display()))?;
    }
    Ok((py, site, dir))
}

/// The host phase: [`prepare`], then the script on a file; returns (passed, failed).
pub fn host_tests() -> Result<(u64, u64)> {
    let (py, site, dir) = prepare()?;
    let libs = site.join(format!(".{NIXL_MODULE}.mesonpy.libs"));
    let tmp = root().join("target/nixl-test");
    std::fs::create_dir_all(&tmp)?;
    let out = Command::new(&py)
        .arg(root().join("tests/nixl/test_nixl_ugds.py"))
        .env("NIXL_PLUGIN_DIR", &dir)
        // NIXL's POSIX plugin finds its libraries relative to its own folder ($ORIGIN), which
        // a link elsewhere does not keep: name them.
        .env("LD_LIBRARY_PATH", format!("{}:{}", libs.display(), site.join(format!("{NIXL_MODULE}.libs")).display()))
        .env("UGDS_TEST_DIR", &tmp)
        .current_dir(&tmp)
        .output()
        .context("running tests/nixl/test_nixl_ugds.py")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    print!("{text}");
    match crate::wheel::parse_counts(&text, "UGDS-NIXL ") {
        Some((p, f)) => Ok((p, if out.status.success() || f > 0 { f } else { f + 1 })),
        None => {
            eprintln!("tests/nixl/test_nixl_ugds.py did not finish ({})", out.status);
            Ok((0, 1))
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn result_line() {
        let parse = |t| crate::wheel::parse_counts(t, "UGDS-NIXL ");
        assert_eq!(parse("ok x\nUGDS-NIXL passed=13 failed=0\n"), Some((13, 0)));
        assert_eq!(parse("UGDS-NIXL passed=2"), None);
    }
}

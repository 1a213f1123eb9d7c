//! The Python package in the VM: the host's pytest-free suites (`tests/python/test_ugds_*.py`,
//! unittest) run on ugds nodes, on the direct path, with the wheel the host phase of `cargo xtask
//! test` installed into `target/pyenv` (the guest sees the host's files at the same paths).
//! `test_ugds_py.py` covers host memory and the CPU stand-in "GPU" memory registered
//! peer-to-peer through its dma-buf (udmabuf); `test_ugds_kv.py` the KV store and the LMCache
//! connector, its kill -9 test included. Both scripts check `path_counts()`, so a run that
//! silently took another path fails.

use crate::kmod::bound_node;
use crate::{ensure_that, Test};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::Command;

const V: &str = "python";

/// The Python tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "python_package_suite_on_a_ugds_node", variant: V, run: package_suite },
        Test { name: "python_kv_store_suite_on_a_ugds_node", variant: V, run: kv_suite },
    ]
}

/// 256 MiB with 4 KiB blocks (the KV store); 128 MiB with 512-byte blocks (the package).
pub const NVME: &[&str] = &["size=256M,lbs=4096", "size=128M,lbs=512"];

fn root() -> PathBuf {
    // The tests crate is a member of the workspace; the guest sees the host's paths.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs one script with `var=node`; returns (passed, failed, skipped) from its
/// `UGDS-PY passed=N failed=M skipped=K` line and the names of the skipped tests, after printing
/// the lines that say what failed or was skipped.
fn run_script(script: &str, var: &str, node: &str) -> Result<(u64, u64, u64, Vec<String>)> {
    let py = root().join("target/pyenv/bin/python");
    ensure_that!(
        py.exists(),
        "{} missing: the host phase of `cargo xtask test` installs the wheel there",
        py.display()
    );
    let dir = PathBuf::from("/tmp/ugds-py-vm");
    std::fs::create_dir_all(&dir)?;
    let out = Command::new(&py)
        .arg(root().join("tests/python").join(script))
        .env(var, node)
        .env("UGDS_TEST_DIR", &dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // Not the sources' folder: the installed wheel is what runs.
        .current_dir(&dir)
        .output()
        .with_context(|| format!("running {script}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for l in text.lines().filter(|l| l.contains("... FAIL") || l.contains("... ERROR") || l.contains("... skipped")) {
        println!("    {l}");
    }
    let line = text.lines().rev().find_map(|l| l.find("UGDS-PY ").map(|i| &l[i..]));
    let Some(line) = line else { anyhow::bail!("{script} did not finish ({}):\n{text}", out.status) };
    println!("    {script} on {node}: {line}");
    let get = |k: &str| -> Result<u64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('='))?.parse().ok())
            .with_context(|| format!("no {k} in {line:?}"))
    };
    let skipped_names =
        text.lines().filter(|l| l.contains("... skipped")).map(|l| l.split(" ... ").next().unwrap_or(l).to_string());
    let r = (get("passed")?, get("failed")?, get("skipped")?, skipped_names.collect());
    ensure_that!(r.1 == 0 && out.status.success(), "{script} on {node}: {line}\n{text}");
    Ok(r)
}

fn package_suite() -> Result<()> {
    let node = bound_node(1)?;
    let (passed, _, _, skipped) = run_script("test_ugds_py.py", "UGDS_PY_TARGET", &node)?;
    // What may be skipped on a node: the numpy and readelf cases (the host's packages); never the
    // direct-path and dma-buf tests.
    ensure_that!(!skipped.iter().any(|t| t.contains("DmaBufTests")), "direct-path tests skipped: {skipped:?}");
    ensure_that!(passed >= 34, "only {passed} passed ({skipped:?} skipped)");
    Ok(())
}

fn kv_suite() -> Result<()> {
    let node = bound_node(0)?;
    let (passed, _, skipped, names) = run_script("test_ugds_kv.py", "UGDS_KV_TARGET", &node)?;
    ensure_that!(passed >= 15 && skipped == 0, "only {passed} passed, {names:?} skipped");
    Ok(())
}

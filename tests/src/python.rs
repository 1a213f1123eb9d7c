//! The Python package in the VM: the host's pytest-free suites (`tests/python/test_ugds_*.py`,
//! unittest) run on ugds nodes, on the direct path, with the wheel the host phase of `cargo xtask
//! test` installed into `target/pyenv` (the guest sees the host's files at the same paths).
//! `test_ugds_py.py` covers host memory and the CPU stand-in "GPU" memory registered
//! peer-to-peer through its dma-buf (udmabuf); `test_ugds_kv.py` the KV store and the LMCache
//! connector, its kill -9 test included. Both scripts check `path_counts()`, so a run that
//! silently took another path fails. `test_lmcache_select.py` runs LMCache's own selection code
//! (its GDS L1 tier's `ugds` backend, its native-plugin L2 adapter) against our installed
//! libugds.so and a node, in `target/lmcache-env` (made by the host before the VM boots).

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
        Test { name: "python_lmcache_selects_ugds_on_a_node", variant: V, run: lmcache_select },
    ]
}

/// The LMCache release target/lmcache-env holds (`LMCACHE` in xtask/src/wheel.rs).
const LMCACHE: &str = "0.5.6";

/// The size of the first controller's namespace (`NVME[0]`), as LMCache must read it through
/// `uGDSGetDeviceCapacity`.
const NODE0_BYTES: u64 = 256 << 20;

/// 256 MiB with 4 KiB blocks (the KV store); 128 MiB with 512-byte blocks (the package).
pub const NVME: &[&str] = &["size=256M,lbs=4096", "size=128M,lbs=512"];

fn root() -> PathBuf {
    // The tests crate is a member of the workspace; the guest sees the host's paths.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs one script with `var=node` in `target/pyenv`; see [`run_script_in`].
fn run_script(script: &str, var: &str, node: &str) -> Result<(u64, u64, u64, Vec<String>)> {
    run_script_in("target/pyenv", script, &[(var, node)])
}

/// Runs one script with the python of the virtual environment `env` (relative to the
/// repository) and the variables `vars`; returns (passed, failed, skipped) from its
/// `UGDS-PY passed=N failed=M skipped=K` line and the names of the skipped tests, after printing
/// the lines that say what failed or was skipped.
fn run_script_in(env: &str, script: &str, vars: &[(&str, &str)]) -> Result<(u64, u64, u64, Vec<String>)> {
    let py = root().join(env).join("bin/python");
    ensure_that!(
        py.exists(),
        "{} missing: the host phase of `cargo xtask test` (or a VM-only run, before the VM boots) makes {env} and \
         installs the wheel there",
        py.display()
    );
    let node = vars.first().map_or("", |v| v.1);
    let dir = PathBuf::from("/tmp/ugds-py-vm");
    std::fs::create_dir_all(&dir)?;
    let out = Command::new(&py)
        .arg(root().join("tests/python").join(script))
        .envs(vars.iter().copied())
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
    let Some(line) = crate::result_line(&text, "UGDS-PY ") else {
        anyhow::bail!("{script} did not finish ({}):\n{text}", out.status)
    };
    println!("    {script} on {node}: {}", line.0);
    let get = |k: &str| line.count(k);
    let skipped_names =
        text.lines().filter(|l| l.contains("... skipped")).map(|l| l.split(" ... ").next().unwrap_or(l).to_string());
    let r = (get("passed")?, get("failed")?, get("skipped")?, skipped_names.collect());
    ensure_that!(r.1 == 0 && out.status.success(), "{script} on {node}: {}\n{text}", line.0);
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

/// LMCache 0.5.6's own code on node 0: its `--l1-manager` JSON and legacy flags select the `ugds`
/// GDS L1 backend; its L1 manager opens the node through it (the sysfs-class check, our
/// libugds.so found by `find_library` through `LD_LIBRARY_PATH`, the capacity from
/// `uGDSGetDeviceCapacity` equal to the namespace's) and its handle writes and reads there; a
/// slab larger than the node, a missing node, /dev/null and a file are refused with its
/// messages; its native-plugin L2 adapter loads `ugds.lmcache.UgdsConnector` on the node.
fn lmcache_select() -> Result<()> {
    let node = bound_node(0)?;
    let lib = root().join("target/c-prefix/lib");
    ensure_that!(
        lib.join("libugds.so").exists(),
        "{} has no libugds.so (the C suite's build installs it)",
        lib.display()
    );
    let lib = lib.to_str().context("the library folder is not UTF-8")?.to_string();
    let bytes = NODE0_BYTES.to_string();
    let vars = [
        ("UGDS_LMC_TARGET", node.as_str()),
        ("UGDS_LMC_CAPACITY", bytes.as_str()),
        ("UGDS_LMCACHE_REQUIRE", LMCACHE),
        ("LD_LIBRARY_PATH", lib.as_str()),
    ];
    let (passed, _, skipped, names) = run_script_in("target/lmcache-env", "test_lmcache_select.py", &vars)?;
    // Nothing may skip on a node: the node tests, the version check and the CPU-torch refusal
    // (the VM's torch is a CPU build) all run.
    ensure_that!(passed >= 18 && skipped == 0, "only {passed} passed, {names:?} skipped");
    Ok(())
}

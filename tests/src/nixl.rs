//! The NIXL backend plugin (`libplugin_UGDS.so`) on ugds targets, through NIXL's own Python
//! API: tests/nixl/test_nixl_ugds.py in VM mode (`--target`), run by the environment the host
//! phase of `cargo xtask test` made (`target/nixl-pyenv`: nixl-cu12 and numpy for the host's
//! python3, which the guest runs from the host's root) with the plugin folder it made
//! (`target/nixl-plugins`). Per target: the path NIXL's query reports is `direct`, data written
//! through UGDS (one descriptor, then 16 in one transfer) reads back byte for byte, a read at
//! the capacity is refused with NIXL's NIXL_ERR_INVALID_PARAM; a node is also named by an open
//! fd in devId, through the synchronous queue mode.

use crate::kmod::bound_node;
use crate::{ensure_that, Test};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::Command;

const V: &str = "nixl";

/// The tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "nixl_plugin_on_a_ugds_node", variant: V, run: node },
        Test { name: "nixl_plugin_on_a_striped_volume", variant: V, run: volume },
    ]
}

/// Three controllers: a node of its own (512-byte blocks), and two members of a volume.
pub const NVME: &[&str] = &["size=128M,lbs=512", "size=128M,lbs=4096", "size=128M,lbs=4096"];

fn root() -> PathBuf {
    // The tests crate is a member of the workspace; the guest sees the host's paths.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs the script on `targets`; checks its `UGDS-NIXL passed=N failed=0` line.
fn run(targets: &[&str], min_passed: u64) -> Result<()> {
    let py = root().join("target/nixl-pyenv/bin/python");
    let plugins = root().join("target/nixl-plugins");
    ensure_that!(
        py.exists() && plugins.join("libplugin_UGDS.so").exists(),
        "{} or {} missing: the host phase of `cargo xtask test` (or `cargo xtask test-nixl`) makes them",
        py.display(),
        plugins.display()
    );
    let mut cmd = Command::new(&py);
    cmd.arg(root().join("tests/nixl/test_nixl_ugds.py"));
    for t in targets {
        cmd.args(["--target", t]);
    }
    let out = cmd
        .env("NIXL_PLUGIN_DIR", &plugins)
        .env("NIXL_LOG_LEVEL", "INFO")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir("/tmp")
        .output()
        .context("running test_nixl_ugds.py")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let Some(line) = crate::result_line(&text, "UGDS-NIXL ") else {
        anyhow::bail!("test_nixl_ugds.py did not finish ({}):\n{text}", out.status)
    };
    println!("    {targets:?}: {}", line.0);
    let (passed, failed) = (line.count("passed")?, line.count("failed")?);
    ensure_that!(failed == 0 && out.status.success(), "{targets:?}: {}\n{text}", line.0);
    ensure_that!(passed >= min_passed, "{targets:?}: only {passed} passed\n{text}");
    Ok(())
}

fn node() -> Result<()> {
    let n = bound_node(0)?;
    // direct path, write/read, past the end, by fd.
    run(&[&n], 4)
}

fn volume() -> Result<()> {
    let members = [bound_node(1)?, bound_node(2)?];
    let spec = format!("stripe:64K:{}", members.join(","));
    let desc = format!("/tmp/nixl-{}.ugds-volume", std::process::id());
    std::fs::write(&desc, format!("{}\n{spec}\n", ugds::volume::DESCRIPTOR_MAGIC))?;
    let r = run(&[&spec, &desc], 6);
    let _ = std::fs::remove_file(&desc);
    r
}

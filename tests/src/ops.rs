//! The installed `ugds` CLI as an operator uses it: `ugds bind` refusing a controller with a
//! mounted, open or md-held namespace (changing nothing), `ugds list --json` against the emulated
//! controllers (serials and namespaces from the VM spec), `ugds status` (JSON and OpenMetrics)
//! counting the queue pairs and pinned bytes this very process made, `ugds unbind`.

use crate::raw::{HostBuf, RawDev};
use crate::{
    driver_of, ensure_that, load_module, namespace_block_device, namespace_device, nvme_controllers, sh, Test,
};
use anyhow::{Context, Result};
use serde_json::Value;
use std::process::{Command, Stdio};

const V: &str = "ops";

/// Controller 0: one 64 MiB namespace of 4 KiB blocks; controller 1: two 32 MiB namespaces of
/// 512-byte blocks. The serials are what `ugds list` must report.
pub const NVME: &[&str] = &["size=64M,lbs=4096,serial=UGDSOPS0A", "size=32M,ns=2,serial=UGDSOPS1B"];
const SERIALS: [&str; 2] = ["UGDSOPS0A", "UGDSOPS1B"];

/// The ops tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "ops_cli_bind_refusals_change_nothing", variant: V, run: bind_refusals },
        Test { name: "ops_cli_list_json_matches_the_controllers", variant: V, run: list_json },
        Test { name: "ops_cli_status_counts_this_process", variant: V, run: status_counts },
        Test { name: "ops_cli_unbind_gives_back_to_nvme", variant: V, run: unbind_all },
        Test { name: "ops_cli_boot_config_by_serial_refuses_group_without_iommu", variant: V, run: boot_config },
        Test { name: "ops_cli_group_access_with_iommu", variant: "iommu", run: group_with_iommu },
    ]
}

/// Runs the built CLI (`$UGDS_CLI`): (success, stdout, stderr).
fn ugds(args: &[&str]) -> Result<(bool, String, String)> {
    let bin = std::env::var("UGDS_CLI").context("UGDS_CLI not set")?;
    let out = Command::new(&bin).args(args).output().with_context(|| format!("running {bin}"))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Runs the CLI, which must succeed, and parses its stdout as JSON.
fn ugds_json(args: &[&str]) -> Result<Value> {
    let (ok, out, err) = ugds(args)?;
    ensure_that!(ok, "ugds {args:?} failed: {out}{err}");
    serde_json::from_str(&out).with_context(|| format!("ugds {args:?} printed no JSON: {out}"))
}

/// Every controller back on the kernel nvme driver (with the module loaded).
fn all_on_nvme() -> Result<Vec<String>> {
    load_module()?;
    let ctrls = nvme_controllers()?;
    if ctrls.iter().any(|a| driver_of(a).as_deref() != Some("nvme")) {
        let (ok, out, err) = ugds(&["unbind", "--all"])?;
        ensure_that!(ok, "ugds unbind --all: {out}{err}");
    }
    ensure_that!(ctrls.len() == 2, "expected 2 controllers, found {ctrls:?}");
    Ok(ctrls)
}

/// A refused bind exits non-zero, says why, and leaves the controller (and `driver_override`)
/// as it was.
fn refused(target: &str, addr: &str, why: &str) -> Result<()> {
    let (ok, out, err) = ugds(&["bind", target])?;
    ensure_that!(!ok, "ugds bind {target} succeeded while {why}: {out}");
    ensure_that!(err.contains(why), "the refusal of {target} does not say {why:?}: {err}");
    ensure_that!(driver_of(addr).as_deref() == Some("nvme"), "{addr} left nvme after a refused bind");
    let o = std::fs::read_to_string(format!("/sys/bus/pci/devices/{addr}/driver_override"))?;
    ensure_that!(o.trim() == "(null)" || o.trim().is_empty(), "a refused bind set driver_override to {o:?}");
    Ok(())
}

/// Mounted, open and md-held namespaces refuse `ugds bind`; so does a list naming one of them,
/// and bad targets; then both bind.
fn bind_refusals() -> Result<()> {
    let c = all_on_nvme()?;
    let ns0 = namespace_block_device(&c[0])?;
    sh(&format!("mkfs.ext2 -q -F {ns0} && mkdir -p /tmp/opsmnt && mount -t ext2 {ns0} /tmp/opsmnt"))?;
    let r = refused(&ns0, &c[0], "is mounted on /tmp/opsmnt");
    let list = ugds(&["bind", &c[1], &c[0]]);
    let _ = sh("umount /tmp/opsmnt");
    r?;
    let (ok, _, err) = list?;
    ensure_that!(!ok && err.contains("refusing to bind any of them"), "a list with a mounted member: {err}");
    ensure_that!(driver_of(&c[1]).as_deref() == Some("nvme"), "the free member of a refused list was bound");
    // Held open by another process.
    let mut holder = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("exec 3<{ns0}; echo READY; exec sleep 60"))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().context("holder stdout")?),
        &mut line,
    )?;
    let r = refused(&c[0], &c[0], &format!("is open by pid {}", holder.id()));
    let _ = holder.kill();
    let _ = holder.wait();
    r?;
    // A member of an md array.
    let (ns1, ns1b) = (namespace_device(&c[1], 1)?, namespace_device(&c[1], 2)?);
    sh(&format!("mdadm --build /dev/md9 --level=0 --chunk=64 --raid-devices=2 {ns1} {ns1b} 2>&1"))?;
    let listed = ugds_json(&["list", "--json"]);
    let r = refused(&c[1], &c[1], "is held by md9");
    let _ = sh("mdadm --stop /dev/md9 2>&1");
    r?;
    let listed = listed?;
    let md = &listed["controllers"][1]["md_arrays"];
    ensure_that!(md == &serde_json::json!(["md9"]), "ugds list shows md membership {md} for {}", c[1]);
    // Bad targets, by name.
    let (ok, _, err) = ugds(&["bind", "/dev/nvme77"])?;
    ensure_that!(!ok && err.contains("no such NVMe controller"), "an unknown target: {err}");
    let (ok, _, err) = ugds(&["bind", &c[0], &ns0])?;
    ensure_that!(!ok && err.contains("are the same controller"), "the same controller twice: {err}");
    ensure_that!(driver_of(&c[0]).as_deref() == Some("nvme"), "a refused list bound {}", c[0]);
    // Both free now: bound, in order, with a volume spec.
    let v = ugds_json(&["bind", "--json", &c[0], &c[1]])?;
    let bound = v["bound"].as_array().context("no bound list")?;
    ensure_that!(bound.len() == 2 && bound[0]["pci"] == c[0].as_str(), "bound {v}");
    ensure_that!(v["volume"].as_str().is_some_and(|s| s.starts_with("stripe:128K:/dev/ugds_drv")), "volume in {v}");
    for a in &c {
        ensure_that!(driver_of(a).as_deref() == Some("ugds"), "{a} not bound after ugds bind");
    }
    Ok(())
}

/// The controllers in `ugds list --json` as the kernel nvme driver shows them and as ugds does:
/// serials from the VM spec, namespaces with their sizes and block sizes, drivers, nodes.
fn list_json() -> Result<()> {
    let c = all_on_nvme()?;
    let check = |v: &Value, driver: &str| -> Result<()> {
        let l = v["controllers"].as_array().context("no controllers")?;
        ensure_that!(l.len() == 2, "{} controllers listed", l.len());
        for (i, e) in l.iter().enumerate() {
            ensure_that!(e["pci"] == c[i].as_str(), "controller {i}: {e}");
            ensure_that!(e["driver"] == driver, "controller {i} driver: {e}");
            ensure_that!(e["serial"] == SERIALS[i], "controller {i} serial: {e}");
            ensure_that!(e["model"].as_str().is_some_and(|m| m.contains("QEMU")), "controller {i} model: {e}");
        }
        let ns = |i: usize| l[i]["namespaces"].as_array().cloned().unwrap_or_default();
        let sizes = |i: usize| -> Vec<(u64, u64, u64)> {
            ns(i)
                .iter()
                .map(|n| {
                    (
                        n["id"].as_u64().unwrap_or(0),
                        n["size"].as_u64().unwrap_or(0),
                        n["block_size"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        };
        ensure_that!(sizes(0) == [(1, 64 << 20, 4096)], "controller 0 namespaces {:?}", sizes(0));
        ensure_that!(sizes(1) == [(1, 32 << 20, 512), (2, 32 << 20, 512)], "controller 1 namespaces {:?}", sizes(1));
        Ok(())
    };
    let v = ugds_json(&["list", "--json"])?;
    check(&v, "nvme")?;
    ensure_that!(
        v["controllers"][0]["block_devices"].as_array().is_some_and(|b| !b.is_empty()),
        "no block devices: {v}"
    );
    let (ok, out, err) = ugds(&["bind", "--all"])?;
    ensure_that!(ok, "ugds bind --all: {out}{err}");
    let v = ugds_json(&["list", "--json"])?;
    check(&v, "ugds")?;
    for i in 0..2 {
        let nodes = &v["controllers"][i]["ugds_nodes"];
        ensure_that!(nodes.as_array().is_some_and(|n| n.len() == 1), "controller {i} nodes {nodes}");
    }
    let (ok, text, _) = ugds(&["list"])?;
    ensure_that!(ok && text.contains(SERIALS[1]) && text.contains("namespace 2:"), "ugds list text: {text}");
    Ok(())
}

/// The node of controller `i`, bound to ugds by the CLI.
fn node(i: usize) -> Result<String> {
    let c = nvme_controllers()?;
    if driver_of(&c[i]).as_deref() != Some("ugds") {
        load_module()?;
        let (ok, out, err) = ugds(&["bind", &c[i]])?;
        ensure_that!(ok, "ugds bind {}: {out}{err}", c[i]);
    }
    let v = ugds_json(&["list", "--json"])?;
    v["controllers"][i]["ugds_nodes"][0].as_str().map(str::to_string).context("no node listed")
}

/// This process's entry in `ugds status --json` of `node`, if any.
fn my_entry(node: &str) -> Result<Option<Value>> {
    let v = ugds_json(&["status", "--json", node])?;
    let n = &v["nodes"][0];
    ensure_that!(n["node"] == node && n["state"] == "ok", "status of {node}: {v}");
    let me = u64::from(std::process::id());
    Ok(n["processes"].as_array().and_then(|p| p.iter().find(|e| e["pid"].as_u64() == Some(me)).cloned()))
}

/// The value of the OpenMetrics sample `name` for this process's pid, from `ugds status
/// --prometheus`; the text must end with `# EOF` and declare the family with its unit.
fn my_metric(text: &str, family: &str, unit: Option<&str>) -> Result<Option<f64>> {
    ensure_that!(text.ends_with("# EOF\n"), "no # EOF at the end:\n{text}");
    ensure_that!(text.contains(&format!("# TYPE {family} gauge\n")), "no TYPE of {family}:\n{text}");
    if let Some(u) = unit {
        ensure_that!(text.contains(&format!("# UNIT {family} {u}\n")), "no UNIT of {family}:\n{text}");
    }
    let pid = format!("pid=\"{}\"", std::process::id());
    let prefix = format!("{family}{{");
    match text.lines().find(|l| l.starts_with(&prefix) && l.contains(&pid)) {
        Some(line) => Ok(Some(line.rsplit_once(' ').context("no value")?.1.parse()?)),
        None => Ok(None),
    }
}

/// Queue pairs and pinned bytes this process made show up under its pid in `ugds status`
/// (JSON, OpenMetrics and the metrics file), and go away when it closes the node.
fn status_counts() -> Result<()> {
    const LEN: usize = 1 << 20;
    let node = node(1)?;
    ensure_that!(my_entry(&node)?.is_none(), "this process is listed before it opened {node}");
    let dev = RawDev::open(&node)?;
    let _q1 = dev.create_qpair(16)?;
    let _q2 = dev.create_qpair(32)?;
    let buf = HostBuf::new(LEN)?;
    let h = dev.register(buf.addr(), LEN as u64)?;
    let e = my_entry(&node)?.context("this process is not in ugds status")?;
    ensure_that!(e["qpairs"] == 2 && e["registrations"] == 1, "counted {e}");
    ensure_that!(e["pinned_bytes"] == LEN as u64 && e["dmabuf_bytes"] == 0, "pinned {e}");
    let (ok, text, err) = ugds(&["status", "--prometheus", &node])?;
    ensure_that!(ok, "ugds status --prometheus: {err}");
    ensure_that!(my_metric(&text, "ugds_process_queue_pairs", None)? == Some(2.0), "queue pairs in\n{text}");
    ensure_that!(
        my_metric(&text, "ugds_process_pinned_bytes", Some("bytes"))? == Some(LEN as f64),
        "pinned bytes in\n{text}"
    );
    ensure_that!(text.contains("# TYPE ugds_resets counter\n") && text.contains("ugds_resets_total{"), "{text}");
    let file = "/tmp/ugds-ops-test.prom";
    let (ok, out, err) = ugds(&["status", "--prometheus-file", file])?;
    ensure_that!(ok && out.is_empty(), "ugds status --prometheus-file: {out}{err}");
    let written = std::fs::read_to_string(file)?;
    ensure_that!(my_metric(&written, "ugds_process_queue_pairs", None)? == Some(2.0), "file:\n{written}");
    dev.deregister(h.id, h.generation)?;
    let e = my_entry(&node)?.context("gone after deregistering")?;
    ensure_that!(e["pinned_bytes"] == 0 && e["qpairs"] == 2, "after deregistering: {e}");
    drop((_q1, _q2));
    drop(dev);
    ensure_that!(my_entry(&node)?.is_none(), "this process is still listed after closing {node}");
    // A reset shows as one timeout (a reset begun), one reset completed and an epoch two ahead.
    let figures = |v: &Value| -> Result<[u64; 3]> {
        let n = &v["nodes"][0];
        let get = |k: &str| n[k].as_u64().with_context(|| format!("no {k} in {v}"));
        Ok([get("timeouts")?, get("resets")?, get("epoch")?])
    };
    let before = figures(&ugds_json(&["status", "--json", &node])?)?;
    RawDev::open(&node)?.reset()?;
    let after = ugds_json(&["status", "--json", &node])?;
    let want = [before[0] + 1, before[1] + 1, before[2] + 2];
    ensure_that!(
        figures(&after)? == want && after["nodes"][0]["state"] == "ok",
        "after a reset: {after}, before {before:?}"
    );
    // A target that is no ugds node is named.
    let (ok, _, err) = ugds(&["status", "/dev/null"])?;
    ensure_that!(!ok && err.contains("not a ugds node"), "status of /dev/null: {err}");
    Ok(())
}

/// `ugds unbind --all` gives every controller back to nvme, with its disks.
fn unbind_all() -> Result<()> {
    node(0)?;
    let v = ugds_json(&["unbind", "--json", "--all"])?;
    let r = v["released"].as_array().context("no released list")?;
    ensure_that!(!r.is_empty() && r.iter().all(|e| e["driver"] == "nvme" && e["disk"].is_string()), "released {v}");
    for a in nvme_controllers()? {
        ensure_that!(driver_of(&a).as_deref() == Some("nvme"), "{a} not on nvme after ugds unbind --all");
    }
    let (ok, _, err) = ugds(&["unbind", "--all"])?;
    ensure_that!(!ok && err.contains("no controller is bound to ugds"), "a second unbind --all: {err}");
    Ok(())
}

/// The mode bits and group of a node.
fn mode_and_group(node: &str) -> Result<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(node)?;
    Ok((m.mode() & 0o777, m.gid()))
}

/// `ugds bind --config` binds the configured controller found by its serial; the file's group is
/// refused by name without an IOMMU (the VM has none here), the node staying root's (0600); a
/// bad line is refused with its number and binds nothing; `ugds unbind --config` gives it back.
fn boot_config() -> Result<()> {
    let c = all_on_nvme()?;
    let conf = "/tmp/ops-bind.conf";
    std::fs::write(conf, "# test\nserial=UGDSOPS1B\nbogus line\n")?;
    let (ok, _, err) = ugds(&["bind", "--config", conf])?;
    ensure_that!(!ok && err.contains("line 3"), "a bad line: {err}");
    ensure_that!(driver_of(&c[1]).as_deref() == Some("nvme"), "a bad file bound {}", c[1]);
    // The suite's second pass runs this variant with the IOMMU on: group access is then
    // allowed (ops_cli_group_access_with_iommu tests it), so the refusal is checked only without.
    let iommu = std::fs::read_dir("/sys/class/iommu").map(|d| d.count() > 0).unwrap_or(false);
    let group = if iommu { "" } else { "group=disk\n" };
    std::fs::write(conf, format!("serial=UGDSOPS1B  # the second one\n{group}"))?;
    let (ok, out, err) = ugds(&["bind", "--config", conf])?;
    if !iommu {
        ensure_that!(!ok, "group access without an IOMMU was not refused: {out}");
        ensure_that!(err.contains("refusing group access") && err.contains("no IOMMU group"), "refusal: {err}");
    }
    ensure_that!(driver_of(&c[1]).as_deref() == Some("ugds"), "{} not bound by --config: {out}{err}", c[1]);
    ensure_that!(driver_of(&c[0]).as_deref() == Some("nvme"), "{} bound though not configured", c[0]);
    let node = out.split_whitespace().find(|w| w.starts_with("/dev/ugds_drv")).context("no node printed")?.to_string();
    ensure_that!(mode_and_group(&node)? == (0o600, 0), "{node} is not root's 0600 (no group configured or refused)");
    if !iommu {
        let (ok, _, err) = ugds(&["access", "--config", conf, &node])?;
        ensure_that!(!ok && err.contains("refusing group access"), "ugds access without an IOMMU: {err}");
    }
    let (ok, out, err) = ugds(&["unbind", "--config", conf])?;
    ensure_that!(ok && out.contains("given back to nvme"), "unbind --config: {out}{err}");
    ensure_that!(driver_of(&c[1]).as_deref() == Some("nvme"), "{} not given back", c[1]);
    Ok(())
}

/// With the IOMMU translating, `ugds access` gives the node to the configured group, mode 0660,
/// and a process of that group (not root) can open it.
fn group_with_iommu() -> Result<()> {
    load_module()?;
    let addr = nvme_controllers()?.first().cloned().context("no controller")?;
    let conf = "/tmp/ops-iommu.conf";
    std::fs::write(conf, format!("{addr}\ngroup=disk\n"))?;
    let (ok, out, err) = ugds(&["bind", "--config", conf])?;
    ensure_that!(ok, "bind --config with the IOMMU on: {out}{err}");
    let node = out.split_whitespace().find(|w| w.starts_with("/dev/ugds_drv")).context("no node printed")?.to_string();
    ensure_that!(out.contains(&format!("{node}: group disk, mode 0660")), "no access line: {out}");
    ensure_that!(mode_and_group(&node)? == (0o660, 6), "{node}: mode and group {:?}", mode_and_group(&node)?);
    // Not root, in group disk: the open succeeds (uid 65534, gid 6).
    let (ok, _, err) = ugds_as(65534, 6, &["status", "--json", &node])?;
    ensure_that!(ok, "a member of the group cannot read {node}: {err}");
    let (ok, _, _) = ugds_as(65534, 65534, &["status", "--json", &node])?;
    ensure_that!(!ok, "a process outside the group opened {node}");
    let (ok, out, err) = ugds(&["unbind", &addr])?;
    ensure_that!(ok, "unbind: {out}{err}");
    Ok(())
}

/// Runs the CLI as `uid`:`gid` with no supplementary groups (through util-linux `setpriv`).
fn ugds_as(uid: u32, gid: u32, args: &[&str]) -> Result<(bool, String, String)> {
    let bin = std::env::var("UGDS_CLI").context("UGDS_CLI not set")?;
    let out = Command::new("setpriv")
        .args([format!("--reuid={uid}"), format!("--regid={gid}"), "--clear-groups".into(), bin])
        .args(args)
        .output()
        .context("running setpriv")?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

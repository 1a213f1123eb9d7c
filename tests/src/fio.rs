//! The fio engine (`libugds_fio.so`, `$UGDS_FIO_ENGINE`) under the distribution's fio
//! (`/usr/bin/fio`, which the guest sees on the host's root): fio's own verification (crc32c,
//! md5, pattern, verify_backlog) on a ugds node with each queue, interrupt and data-pointer
//! option, on a second namespace, on a striped volume (spec and descriptor file) and on a file;
//! and fio's io_uring engine on the kernel's block device against the ugds engine on the same
//! controller, each verifying what the other wrote. In the remote variant: the same
//! verification on `nvmeof://` URIs, through our NVMe/TCP and NVMe/RDMA initiators to the
//! kernel's nvmet.

use crate::kmod::bound_node;
use crate::{ensure_that, namespace_block_device, nvme_controllers, xtask, Test};
use anyhow::{Context, Result};
use serde_json::Value;
use std::process::Command;

const V: &str = "fio";

/// A 4096-byte-block controller; one of 512-byte blocks with two namespaces; two members of a
/// striped volume.
pub const NVME: &[&str] =
    &["size=128M,lbs=4096", "size=64M,lbs=512,ns=2", "size=64M,serial=fv0", "size=64M,serial=fv1"];

/// The fio tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "fio_verify_on_a_ugds_node_every_engine_option", variant: V, run: node },
        Test { name: "fio_verify_on_a_second_namespace", variant: V, run: namespace },
        Test { name: "fio_verify_on_a_striped_volume", variant: V, run: volume },
        Test { name: "fio_verify_on_a_file", variant: V, run: file },
        Test { name: "fio_io_uring_and_ugds_engine_on_the_same_controller", variant: V, run: io_uring_vs_ugds },
        Test { name: "fio_verify_on_an_nvme_over_tcp_uri", variant: "remote", run: remote_uri },
        Test { name: "fio_verify_on_an_nvme_over_rdma_uri", variant: "remote", run: rdma_uri },
    ]
}

/// The engine built for this suite.
fn engine() -> Result<String> {
    std::env::var("UGDS_FIO_ENGINE").context("UGDS_FIO_ENGINE is not set (run through cargo xtask test)")
}

/// What one fio run reported.
struct Run {
    ok: bool,
    job: Value,
    text: String,
}

/// Runs `/usr/bin/fio` on a job file of `lines` (one `[job]` section), JSON report on stdout.
fn fio(lines: &[String]) -> Result<Run> {
    let path = format!("/tmp/ugds-fio-{}.fio", std::process::id());
    std::fs::write(&path, format!("[job]\n{}\n", lines.join("\n")))?;
    let out = Command::new("/usr/bin/fio")
        .current_dir("/tmp")
        .arg("--output-format=json")
        .arg(&path)
        .output()
        .context("running fio")?;
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // The engine's log lines come before the report, which starts on a line of its own.
    let json = if stdout.starts_with('{') { Some(&stdout[..]) } else { stdout.find("\n{").map(|i| &stdout[i + 1..]) };
    let v: Value = json.and_then(|j| serde_json::from_str(j).ok()).unwrap_or(Value::Null);
    let text = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    Ok(Run { ok: out.status.success(), job: v["jobs"][0].clone(), text })
}

impl Run {
    fn bytes(&self, dir: &str) -> u64 {
        self.job[dir]["io_bytes"].as_u64().unwrap_or(0)
    }

    /// Exit 0, no job error, `write` bytes written and `read` verified.
    fn clean(&self, write: u64, read: u64) -> Result<()> {
        ensure_that!(self.ok && self.job["error"].as_i64() == Some(0), "fio failed:\n{}", self.text);
        ensure_that!(self.bytes("write") == write, "wrote {} bytes, not {write}:\n{}", self.bytes("write"), self.text);
        ensure_that!(self.bytes("read") == read, "verified {} bytes, not {read}:\n{}", self.bytes("read"), self.text);
        Ok(())
    }
}

/// A verifying job on `target` through the engine: `size` bytes, then `extra` lines.
fn job(target: &str, size: u64, extra: &[&str]) -> Result<Vec<String>> {
    let mut v = vec![format!("ioengine=external:{}", engine()?), format!("filename={target}"), format!("size={size}")];
    v.extend(extra.iter().map(|s| s.to_string()));
    Ok(v)
}

/// Verification kinds and depths every target gets.
const VERIFIES: &[&[&str]] = &[
    &["bs=4k", "rw=randwrite", "verify=crc32c", "iodepth=1"],
    &["bs=4k", "rw=randwrite", "verify=md5", "verify_backlog=64", "iodepth=32", "iodepth_batch=8"],
    &["bs=128k", "rw=write", "verify=pattern", "verify_pattern=0x7e3d91c5", "iodepth=8"],
];

fn verify_all(target: &str, size: u64, extra: &[&str]) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    for v in VERIFIES {
        let lines: Vec<&str> = v.iter().chain(extra).copied().collect();
        let r = fio(&job(target, size, &lines)?)?;
        r.clean(size, size).with_context(|| format!("{target} with {lines:?}"))?;
        runs.push(r);
    }
    Ok(runs)
}

fn node() -> Result<()> {
    let n = bound_node(0)?;
    let runs = verify_all(&n, 32 << 20, &[])?;
    ensure_that!(runs[0].text.contains("direct path"), "no direct path line:\n{}", runs[0].text);
    ensure_that!(runs[1].text.contains("a batch queue of this thread's own"), "{}", runs[1].text);
    // Each engine option, on what it changes.
    for extra in [
        &["bs=4k", "rw=randwrite", "verify=crc32c", "iodepth=1", "ugds_queue=owned"][..],
        &["bs=4k", "rw=randwrite", "verify=crc32c", "verify_backlog=32", "iodepth=16", "ugds_wait=interrupts"],
        &["bs=4k", "rw=randwrite", "verify=crc32c", "iodepth=1", "ugds_wait=interrupts"],
        &["bs=256k", "rw=randwrite", "verify=md5", "iodepth=8", "ugds_dptr=sgl"],
        &["bs=256k", "rw=randwrite", "verify=md5", "iodepth=8", "ugds_dptr=prp"],
    ] {
        let r = fio(&job(&n, 16 << 20, extra)?)?;
        r.clean(16 << 20, 16 << 20).with_context(|| format!("{n} with {extra:?}"))?;
        if extra.contains(&"ugds_queue=owned") {
            ensure_that!(r.text.contains("a queue pair of this thread's own"), "{}", r.text);
        }
    }
    // Several threads of one process, each on its own range of the node.
    let r = fio(&job(
        &n,
        8 << 20,
        &[
            "bs=8k",
            "rw=randwrite",
            "verify=crc32c",
            "iodepth=8",
            "numjobs=4",
            "thread=1",
            "offset_increment=8M",
            "group_reporting=1",
        ],
    )?)?;
    r.clean(32 << 20, 32 << 20).context("four threads")?;
    Ok(())
}

fn namespace() -> Result<()> {
    let n = bound_node(1)?;
    verify_all(&n, 16 << 20, &["ugds_nsid=2"])?;
    Ok(())
}

fn volume() -> Result<()> {
    let members = [bound_node(2)?, bound_node(3)?];
    // fio splits filename= at ':'; a backslash keeps it.
    let spec = format!("stripe\\:64K\\:{}", members.join(","));
    let runs = verify_all(&spec, 64 << 20, &[])?;
    ensure_that!(runs[0].text.contains("volume"), "no volume in the path line:\n{}", runs[0].text);
    let desc = format!("/tmp/fio-{}.ugds-volume", std::process::id());
    std::fs::write(&desc, format!("{}\nstripe:64K:{}\n", ugds::volume::DESCRIPTOR_MAGIC, members.join(",")))?;
    let r = verify_all(&desc, 32 << 20, &["offset=16M"]);
    let _ = std::fs::remove_file(&desc);
    r?;
    Ok(())
}

/// The remote variant's nvmet namespace by URI: fio splits `filename=` at ':', so every ':' of
/// the URI is escaped.
fn remote_uri() -> Result<()> {
    crate::remote::ensure_target()?;
    let uri = format!("nvmeof://tcp/127.0.0.1:4420/{}?nsid=1", crate::remote::NQN);
    let runs = verify_all(&uri.replace(':', "\\:"), 16 << 20, &[])?;
    ensure_that!(runs[0].text.contains("remote path (NVMe/TCP"), "no remote path line:\n{}", runs[0].text);
    ensure_that!(runs[1].text.contains("iodepth 32"), "{}", runs[1].text);
    Ok(())
}

/// The same over our NVMe/RDMA initiator, to the kernel's nvmet on soft-RoCE, with fio's jobs
/// as threads: fio sizes the target in its parent process before forking a job, and the verbs
/// contexts opened there are the parent's (a forked job's Fabrics Connect failed with EACCES);
/// a job run as a process is refused by name before anything connects.
fn rdma_uri() -> Result<()> {
    crate::remote_rdma::ensure_rdma_target()?;
    let target = crate::remote_rdma::uri(1).replace(':', "\\:");
    let forked = fio(&job(&target, 1 << 20, &["bs=4k", "rw=randwrite", "verify=crc32c"])?)?;
    ensure_that!(!forked.ok && forked.text.contains("add thread=1"), "a forked job on RDMA:\n{}", forked.text);
    let runs = verify_all(&target, 16 << 20, &["thread=1"])?;
    ensure_that!(runs[0].text.contains("remote path (NVMe/RDMA"), "no remote path line:\n{}", runs[0].text);
    ensure_that!(runs[1].text.contains("iodepth 32"), "{}", runs[1].text);
    Ok(())
}

fn file() -> Result<()> {
    let f = format!("/tmp/fio-{}.dat", std::process::id());
    let r = verify_all(&f, 16 << 20, &[]);
    let _ = std::fs::remove_file(&f);
    let runs = r?;
    ensure_that!(runs[0].text.contains("fallback path"), "{}", runs[0].text);
    Ok(())
}

/// A job both engines run: the same blocks, the same seed, so one verifies what the other wrote.
fn shared_job(engine_lines: &[String], write: bool) -> Vec<String> {
    let mut v = engine_lines.to_vec();
    v.extend(["size=32M", "bs=16k", "rw=randwrite", "randseed=4242", "verify=crc32c", "iodepth=16"].map(String::from));
    v.push(if write { "do_verify=0".into() } else { "verify_only=1".into() });
    v
}

fn io_uring_vs_ugds() -> Result<()> {
    let addr = nvme_controllers()?.first().cloned().context("no controller")?;
    let kernel = |write| -> Result<Run> {
        let (ok, out) = xtask(&["unbind", &addr])?;
        ensure_that!(ok, "unbind {addr}: {out}");
        let dev = namespace_block_device(&addr)?;
        let lines = vec!["ioengine=io_uring".to_string(), "direct=1".into(), format!("filename={dev}")];
        fio(&shared_job(&lines, write))
    };
    let ugds = |write| -> Result<Run> {
        let n = bound_node(0)?;
        let lines = vec![format!("ioengine=external:{}", engine()?), format!("filename={n}")];
        fio(&shared_job(&lines, write))
    };
    // The kernel writes, ugds verifies; then ugds writes, the kernel verifies.
    kernel(true)?.clean(32 << 20, 0).context("io_uring writing")?;
    ugds(false)?.clean(32 << 20, 32 << 20).context("the ugds engine verifying io_uring's data")?;
    ugds(true)?.clean(32 << 20, 0).context("the ugds engine writing")?;
    kernel(false)?.clean(32 << 20, 32 << 20).context("io_uring verifying the ugds engine's data")?;
    // The same reads, both engines, side by side (not a benchmark: TCG).
    let read = |lines: Vec<String>| -> Result<Run> {
        let mut v = lines;
        v.extend(["size=32M", "bs=4k", "rw=randread", "iodepth=16", "runtime=2", "time_based=1"].map(String::from));
        fio(&v)
    };
    let (ok, out) = xtask(&["unbind", &addr])?;
    ensure_that!(ok, "unbind {addr}: {out}");
    let dev = namespace_block_device(&addr)?;
    let k = read(vec!["ioengine=io_uring".into(), "direct=1".into(), format!("filename={dev}")])?;
    let n = bound_node(0)?;
    let u = read(vec![format!("ioengine=external:{}", engine()?), format!("filename={n}")])?;
    for (name, r) in [("io_uring", &k), ("ugds", &u)] {
        ensure_that!(r.ok && r.job["error"].as_i64() == Some(0), "{name} reads failed:\n{}", r.text);
        println!("    {name}: {:.0} IOPS", r.job["read"]["iops"].as_f64().unwrap_or(0.0));
    }
    Ok(())
}

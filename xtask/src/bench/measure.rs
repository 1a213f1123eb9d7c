//! The guest side of `cargo xtask bench`: one measurement per engine and point (fio on the
//! kernel's block device, fio with ugds's ioengine, `ugds bench`, `spdk_nvme_perf`), and the
//! turns that hand the controller from one driver to the next between them.

use super::{repeats, spdk, Axes, BASELINE, FIO_UGDS, KERNEL, MARK, OWNED, SPAN};
use crate::{bind, toolchain};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// Runs `cmd` with `/bin/sh`, its output as a string.
pub(super) fn sh(cmd: &str) -> Result<String> {
    toolchain::output(Command::new("/bin/sh").arg("-c").arg(cmd))
}

/// 2 MiB huge pages every bench guest reserves (512 MiB of the VM's 2 GiB): `ugds bench`'s
/// buffers and the fio engine's come from them, as `spdk_nvme_perf`'s do from DPDK's. Without
/// them a large point's IOPS moved 3x to 4x with how many pieces the buffer's memory came in
/// (the test kernel has no transparent huge pages).
pub const HUGEPAGES: usize = 256;

/// Reserves [`HUGEPAGES`] in the guest; fails when it gets fewer than half.
pub(super) fn reserve_hugepages() -> Result<()> {
    let path = "/proc/sys/vm/nr_hugepages";
    std::fs::write(path, HUGEPAGES.to_string()).with_context(|| format!("writing {HUGEPAGES} to {path}"))?;
    let got: usize = std::fs::read_to_string(path)?.trim().parse()?;
    if got < HUGEPAGES / 2 {
        bail!("the guest reserved {got} hugepages of the {HUGEPAGES} asked for");
    }
    Ok(())
}

/// Which of fio's latencies a point reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Latency {
    /// `clat`: from the submission's return to the completion.
    Completion,
    /// `lat`: from the start of the submission to the completion, as `ugds bench` measures (a
    /// transport that sends in the submitting call, as nvme-tcp can, hides its work from clat).
    Total,
}

/// What every engine runs at one point of a grid, in fio's terms: `rw`, block `size`, queue
/// `depth`, `seconds`, and the working set `span`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Job<'a> {
    pub(super) rw: &'a str,
    pub(super) size: &'a str,
    pub(super) depth: usize,
    pub(super) seconds: u64,
    pub(super) span: &'a str,
}

/// One fio point on a block device (io_uring, O_DIRECT, fixed buffers, registered files):
/// `iops`, `p50_us`, `p99_us` (completion latency).
pub(super) fn fio_point(dev: &str, job: Job) -> Result<Value> {
    fio_point_with(dev, job, Latency::Completion, None)
}

/// [`fio_point`] with the latency `lat` names (recorded as the point's `latency`); `cpus`: the
/// CPUs fio runs on (its `cpus_allowed`), or anywhere.
pub(super) fn fio_point_with(dev: &str, job: Job, lat: Latency, cpus: Option<&str>) -> Result<Value> {
    match cpus {
        Some(c) => fio_job(KERNEL, &format!("{KERNEL_ENGINE} --cpus_allowed={c}"), dev, job, lat),
        None => fio_job(KERNEL, KERNEL_ENGINE, dev, job, lat),
    }
}

/// The kernel path's fio engine options: io_uring, O_DIRECT, fixed buffers, registered files.
const KERNEL_ENGINE: &str = "--ioengine=io_uring --direct=1 --fixedbufs --registerfiles";

/// One fio job (`engine_args`: its ioengine and that engine's options) on `target`, as point
/// `engine`: `iops`, `p50_us`, `p99_us` (the latency `lat` names), and for completion points
/// the total latency's `lat_p50_us` / `lat_p99_us`.
pub(super) fn fio_job(engine: &str, engine_args: &str, target: &str, job: Job, lat: Latency) -> Result<Value> {
    let Job { rw, size, depth, seconds, span } = job;
    // Completion points also ask for the total latency (fio 3.20 and later report both), kept as
    // `lat_p50_us` / `lat_p99_us` beside the completion latency's `p50_us` / `p99_us`.
    let (flag, key) = match lat {
        Latency::Completion => (" --lat_percentiles=1 --clat_percentiles=1", "clat_ns"),
        Latency::Total => (" --lat_percentiles=1", "lat_ns"),
    };
    let out = sh(&format!(
        "fio --output-format=json --name=k --filename={target} {engine_args} --rw={rw} --bs={size} \
         --iodepth={depth} --size={span} --runtime={seconds} --time_based --randrepeat=0{flag}"
    ))?;
    let v: Value = serde_json::from_str(out.get(out.find('{').unwrap_or(0)..).unwrap_or(""))?;
    let side = if rw.contains("write") { &v["jobs"][0]["write"] } else { &v["jobs"][0]["read"] };
    let pct = |p: &str| side[key]["percentile"][p].as_f64().unwrap_or(0.0) / 1000.0;
    let mut point = json!({"engine": engine, "rw": rw, "size": size, "depth": depth,
              "iops": side["iops"].as_f64().unwrap_or(0.0), "p50_us": pct("50.000000"), "p99_us": pct("99.000000")});
    if lat == Latency::Total {
        point["latency"] = json!("total");
    } else {
        let total = |p: &str| side["lat_ns"]["percentile"][p].as_f64().filter(|v| *v > 0.0).map(|v| v / 1000.0);
        if let (Some(p50), Some(p99)) = (total("50.000000"), total("99.000000")) {
            point["lat_p50_us"] = json!(p50);
            point["lat_p99_us"] = json!(p99);
        }
    }
    Ok(point)
}

/// One `ugds bench` point on a target (a node or a `stripe:` volume), as the CLI's JSON with
/// the grid's names (`engine`, `rw` as fio says it, `size` as given).
pub(super) fn ugds_point(cli: &str, target: &str, job: Job) -> Result<Value> {
    ugds_point_on(cli, target, job, false)
}

/// [`ugds_point`]; `owned`: synchronous calls on owned queue pairs (`--queue owned`, engine
/// [`OWNED`]).
pub(super) fn ugds_point_on(cli: &str, target: &str, job: Job, owned: bool) -> Result<Value> {
    let Job { rw, size, depth, seconds, span } = job;
    let queue = if owned { " --queue owned" } else { "" };
    // fio's options under fio's names: `rw` passes through.
    let out = sh(&format!(
        "{cli} --json bench {target} --rw {rw} --bs {size} --iodepth {depth} --runtime {seconds} --size {span}{queue}"
    ))?;
    let mut v: Value = serde_json::from_str(&out)?;
    v["engine"] = json!(if owned { OWNED } else { "ugds" });
    v["rw"] = json!(rw);
    v["size"] = json!(size);
    v["depth"] = json!(depth);
    Ok(v)
}

/// [`ugds_point`] with another build's CLI, as engine [`BASELINE`].
fn baseline_point(cli: &str, target: &str, job: Job) -> Result<Value> {
    let mut v = ugds_point(cli, target, job)?;
    v["engine"] = json!(BASELINE);
    Ok(v)
}

/// Who drives a controller during a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// The ugds driver: `ugds bench`, fio with ugds's engine, the owned queues.
    Ugds,
    /// The kernel's nvme driver: fio on the block device.
    Kernel,
    /// uio_pci_generic: `spdk_nvme_perf`.
    Spdk,
}

/// The sides a point's turns visit, in a line whose neighbours are one rebind apart (ugds and
/// SPDK each hand the controller back to the kernel's driver): the kernel and ugds, with SPDK
/// beyond the kernel when it takes part.
fn sides(spdk: bool) -> Vec<Owner> {
    if spdk {
        vec![Owner::Ugds, Owner::Kernel, Owner::Spdk]
    } else {
        vec![Owner::Kernel, Owner::Ugds]
    }
}

/// Hands the controller at `addr` from `from` to `to`, through the kernel's driver.
fn switch(addr: &str, from: Owner, to: Owner) -> Result<()> {
    let mut at = from;
    while at != to {
        let next = if at == Owner::Kernel { to } else { Owner::Kernel };
        match (at, next) {
            (Owner::Kernel, Owner::Ugds) => drop(bind::bind(addr)?),
            (Owner::Ugds, Owner::Kernel) => drop(bind::unbind(addr)?),
            (Owner::Kernel, Owner::Spdk) => spdk::take(addr)?,
            (Owner::Spdk, Owner::Kernel) => spdk::give_back(addr)?,
            (a, b) => bail!("no rebind from {a:?} to {b:?}"),
        }
        at = next;
    }
    Ok(())
}

/// Guest side: every engine on each controller (`backends`, in PCI order) at every point of
/// `axes`, one JSON line per measurement (with its `repeat`), the engines' turns interleaved at
/// every point (the controller rebound between turns, outside the measured time). `spdk`:
/// `spdk_nvme_perf`'s path, SPDK taking a turn of its own. `baseline`: another build's CLI,
/// whose `ugds bench` runs in ugds's turns next to ours, ours first in even repeats and the
/// baseline first in odd ones.
#[allow(clippy::too_many_arguments)]
pub fn guest(
    cli: &str,
    fio_engine: &str,
    seconds: u64,
    repeats: usize,
    backends: &[String],
    spdk: Option<&str>,
    axes: &Axes,
    baseline: Option<&str>,
) -> Result<()> {
    if !Path::new("/sys/module/ugds").exists() {
        sh(&format!("insmod {}", std::env::var("UGDS_KMOD").context("UGDS_KMOD")?))?;
    }
    reserve_hugepages()?;
    if spdk.is_some() {
        spdk::prepare(&std::env::var("UGDS_KERNEL_BUILD").context("UGDS_KERNEL_BUILD")?)?;
    }
    let ours = format!("--ioengine=external:{fio_engine}");
    let line = sides(spdk.is_some());
    let controllers = bind::nvme_controllers()?;
    if controllers.len() != backends.len() {
        bail!("{} controllers for backends {backends:?}", controllers.len());
    }
    for (addr, backend) in controllers.into_iter().zip(backends) {
        let blk = || bind::first_namespace(&addr).with_context(|| format!("no block device on {addr}"));
        // Fill the working set once, so reads of the file-backed drive read data.
        if backend == "file" {
            sh(&format!(
                "fio --name=fill --filename={} --ioengine=io_uring --direct=1 --rw=write --bs=1M --size={SPAN} --output=/dev/null",
                blk()?
            ))?;
        }
        let mut owner = Owner::Kernel;
        let emit = |mut v: Value, repeat: usize| {
            v["backend"] = json!(backend);
            v["repeat"] = json!(repeat);
            println!("{MARK}{v}");
        };
        for rw in &axes.rws {
            for size in &axes.sizes {
                for &depth in &axes.depths {
                    let job = Job { rw, size, depth, seconds, span: SPAN };
                    let at = line.iter().position(|o| *o == owner).unwrap_or(0);
                    for (repeat, side) in repeats::snake(repeats, line.len(), at) {
                        let side = line[side];
                        switch(&addr, owner, side)?;
                        owner = side;
                        match side {
                            Owner::Kernel => emit(fio_point(&blk()?, job)?, repeat),
                            Owner::Spdk => emit(spdk::measure(spdk.context("no spdk_nvme_perf")?, &addr, job)?, repeat),
                            Owner::Ugds => {
                                let node = bind::ugds_nodes(&addr)
                                    .first()
                                    .map(|n| format!("/dev/{n}"))
                                    .context("no ugds node")?;
                                // Each goes first every other repeat: what the first leaves
                                // behind (a warm cache, the host's writeback) lands on both.
                                let ours_first = repeat % 2 == 0;
                                match baseline {
                                    Some(b) if !ours_first => {
                                        emit(baseline_point(b, &node, job)?, repeat);
                                        emit(ugds_point(cli, &node, job)?, repeat);
                                    }
                                    Some(b) => {
                                        emit(ugds_point(cli, &node, job)?, repeat);
                                        emit(baseline_point(b, &node, job)?, repeat);
                                    }
                                    None => emit(ugds_point(cli, &node, job)?, repeat),
                                }
                                let fio = fio_job(FIO_UGDS, &ours, &node, job, Latency::Completion)?;
                                emit(fio, repeat);
                                // Synchronous calls again, each on a queue pair the thread owns.
                                if depth == 1 {
                                    emit(ugds_point_on(cli, &node, job, true)?, repeat);
                                }
                            }
                        }
                    }
                }
            }
        }
        switch(&addr, owner, Owner::Kernel)?;
    }
    Ok(())
}

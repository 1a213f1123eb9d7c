//! `cargo xtask bench`: one VM boot, two emulated controllers (one on an image in the host's
//! memory, one null-backed to isolate software and emulation cost), three engines on the same
//! controller with the same fio job: the kernel path (fio, io_uring, O_DIRECT, fixed buffers,
//! registered files), fio with ugds's own ioengine (`libugds_fio.so`), and `ugds bench`; at QD 1
//! `ugds bench` also on owned queue pairs (`--queue owned`). Every point is measured several
//! times per engine, interleaved with the kernel's (see [`repeats`]): medians, the median ratio
//! with its range, noisy points marked. Plus the data path's own cost on the host. Writes JSON,
//! a markdown table with ratios and PNG plots. With `--baseline-cli`, another build's `ugds
//! bench` in the same turns as ours, compared with it point by point (see [`baseline`]).

use crate::{kernel, kmod, toolchain, vm};
use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod baseline;
pub mod host;
mod measure;
pub mod p2p;
pub mod remote;
pub mod repeats;
pub mod spdk;
pub mod volume;

/// The main grid's sizes, depths and patterns unless `--sizes`, `--depths` and `--rw` say.
const SIZES: &[&str] = &["4K", "16K", "64K", "128K"];
const DEPTHS: &[usize] = &[1, 8, 32, 128];
const RWS: &[&str] = &["randread", "randwrite"];
/// The main grid's working set (random offsets within it) on each controller.
const SPAN: &str = "1G";
const MARK: &str = "BENCH-POINT ";
/// The kernel path: fio with io_uring on the kernel's block device.
const KERNEL: &str = "kernel";
/// `ugds bench` points.
const UGDS: &str = "ugds";
/// fio with ugds's ioengine on the ugds node: the kernel's job, the other engine.
const FIO_UGDS: &str = "fio-ugds";
/// The engine name of `ugds bench --queue owned` points (synchronous calls, QD 1 only).
const OWNED: &str = "ugds-owned";
/// `ugds bench` points of the baseline CLI (`--baseline-cli`), measured in ugds's turns.
const BASELINE: &str = "ugds-baseline";
/// `spdk_nvme_perf` points.
const SPDK: &str = spdk::SPDK;
/// What a point is, besides its engine.
const KEYS: &[&str] = &["backend", "rw", "size", "depth"];

pub use measure::guest;
use measure::{fio_point, fio_point_with, reserve_hugepages, sh, ugds_point, Job, Latency, HUGEPAGES};

/// A grid's axes: I/O sizes (`4K`, `1M`), queue depths (fio `iodepth`; `ugds bench
/// --iodepth`), and `randread` and/or `randwrite`. The main grid measures them rw by rw, size by
/// size, depth by depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Axes {
    pub sizes: Vec<String>,
    pub depths: Vec<usize>,
    pub rws: Vec<String>,
}

impl Axes {
    /// The main grid's: [`SIZES`] x [`DEPTHS`] x [`RWS`].
    pub fn main() -> Axes {
        Axes::of(SIZES, DEPTHS, RWS)
    }

    /// The volume and remote grids': [`volume::DEFAULT_SIZES`] x [`volume::DEFAULT_DEPTHS`] x
    /// [`RWS`].
    pub fn volume() -> Axes {
        Axes::of(volume::DEFAULT_SIZES, volume::DEFAULT_DEPTHS, RWS)
    }

    fn of(sizes: &[&str], depths: &[usize], rws: &[&str]) -> Axes {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Axes { sizes: strings(sizes), depths: depths.to_vec(), rws: strings(rws) }
    }

    /// These axes with each one given (`--sizes`, `--depths`, `--rw`) in place of its default.
    pub fn with(self, sizes: Option<Vec<String>>, depths: Option<Vec<usize>>, rws: Option<Vec<String>>) -> Axes {
        Axes { sizes: sizes.unwrap_or(self.sizes), depths: depths.unwrap_or(self.depths), rws: rws.unwrap_or(self.rws) }
    }

    /// Checks the axes as the main grid's: [`check_axes`] within its working set ([`SPAN`]),
    /// no value twice.
    pub fn checked_main(self) -> Result<Axes> {
        check_axes(&self.sizes, &self.depths, &self.rws, u64::MAX)?;
        let span = vm::parse_size(SPAN)?;
        if let Some(s) = self.sizes.iter().find(|s| vm::parse_size(s).is_ok_and(|n| n > span)) {
            bail!("size {s} is larger than the grid's working set ({SPAN})");
        }
        fn twice<T: PartialEq + std::fmt::Display>(flag: &str, v: &[T]) -> Result<()> {
            match v.iter().enumerate().find(|(i, x)| v[..*i].contains(x)) {
                Some((_, x)) => bail!("{flag} names {x} twice"),
                None => Ok(()),
            }
        }
        twice("--sizes", &self.sizes)?;
        twice("--depths", &self.depths)?;
        twice("--rw", &self.rws)?;
        Ok(self)
    }

    /// Points per controller and engine.
    fn points(&self) -> usize {
        self.sizes.len() * self.depths.len() * self.rws.len()
    }

    /// Points at QD 1 (where ugds also runs on owned queues).
    fn qd1_points(&self) -> usize {
        if self.depths.contains(&1) {
            self.sizes.len() * self.rws.len()
        } else {
            0
        }
    }
}

/// Host side. `baseline`: another build's `ugds` CLI, whose `ugds bench` runs in the same
/// turns as ours (engine [`BASELINE`]) and is compared with it point by point.
pub fn run(
    seconds: u64,
    repeats: usize,
    out: Option<PathBuf>,
    backends: &[String],
    spdk: bool,
    axes: Axes,
    baseline: Option<&Path>,
) -> Result<()> {
    let t = Instant::now();
    if repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let axes = axes.checked_main()?;
    let baseline = baseline.map(baseline::checked).transpose()?;
    // SPDK first: what is missing is said before anything is built.
    let perf = if spdk { Some(crate::spdk::cached()?.perf()) } else { None };
    let root = toolchain::workspace_root();
    toolchain::setup_and_build_release(&["-p", "ugds-cli", "--bins"])?;
    toolchain::setup_and_build_release(&["-p", "ugds-fio", "--lib"])?;
    toolchain::setup_and_build_release(&["-p", "ugds", "--features", "test-utils", "--example", "datapath_cost"])?;
    let k = kernel::Choice::Test612.ensure()?;
    let ko = kmod::build_for(&k)?;
    let mut env = vec![("UGDS_KMOD".into(), ko.display().to_string())];
    if spdk {
        let vm::Guest::Built(built) = &k else { bail!("--spdk needs the test kernel") };
        let uio = built.build.join("drivers/uio/uio_pci_generic.ko");
        if !uio.exists() {
            bail!(
                "--spdk: the test kernel has no {} (ci/kernel.fragment sets CONFIG_UIO_PCI_GENERIC=m)",
                uio.display()
            );
        }
        env.extend(k.suite_env());
    }
    let cli = root.join("target/release/ugds");
    let engine = root.join("target/release/libugds_fio.so");
    let me = std::env::current_exe()?;
    let points = axes.points();
    // Per controller: 3 engines at every point (one more each with SPDK and with a baseline
    // CLI), ugds's owned queues at QD 1, each `repeats` times; about 2 s per measurement and
    // rebind besides the measuring, SPDK's start (DPDK under TCG) another 3 s.
    let engines = 3 + u64::from(spdk) + u64::from(baseline.is_some());
    let per_controller = repeats as u64 * (engines * points as u64 + axes.qd1_points() as u64);
    let measured = backends.len() as u64 * per_controller;
    let spdk_start = if spdk { backends.len() as u64 * repeats as u64 * points as u64 * 3 } else { 0 };
    let estimate = Duration::from_secs(measured * (seconds + 2) + spdk_start + 120);
    let nvme = backends
        .iter()
        .map(|b| format!("size=2G,lbs=4096,backend={}", if b == "file" { "memory" } else { "null" }).parse())
        .collect::<Result<Vec<vm::NvmeSpec>>>()?;
    let mut cmd = vec![
        me.display().to_string(),
        "bench-guest".into(),
        cli.display().to_string(),
        engine.display().to_string(),
        seconds.to_string(),
        repeats.to_string(),
        format!("--backends={}", backends.join(",")),
        format!("--sizes={}", axes.sizes.join(",")),
        format!("--depths={}", axes.depths.iter().map(usize::to_string).collect::<Vec<_>>().join(",")),
        format!("--rws={}", axes.rws.join(",")),
    ];
    if let Some(p) = &perf {
        cmd.push(format!("--spdk={}", p.display()));
    }
    if let Some(b) = &baseline {
        cmd.push(format!("--baseline-cli={}", b.display()));
    }
    let cfg = vm::VmConfig {
        nvme,
        iommu: false,
        bind_module: None,
        mem: "2G".into(),
        timeout: (estimate * 2).max(Duration::from_secs(1800)),
        env,
        cmd,
        p2p: None,
    };
    let owned = if axes.qd1_points() > 0 { ", and ugds on owned queues at QD 1" } else { "" };
    eprintln!(
        "bench: booting the VM ({points} points x {engines} engines x {} controller(s){owned}, {repeats} times \
         each, interleaved, {seconds} s per measurement: about {} min)",
        backends.len(),
        estimate.as_secs().div_ceil(60)
    );
    let host = host::HostRun::start();
    let outcome = vm::run(&cfg, &k, true)?;
    let host = host.finish();
    if outcome.code != 0 {
        bail!("the benchmark failed in the VM (exit {})", outcome.code);
    }
    let raw = points_from(&outcome.output)?;
    let mut points = repeats::merge(&raw, KEYS);
    add_ratios(&mut points);
    let versus = baseline::compare(&raw, &points, KEYS);
    baseline::annotate(&mut points, &versus);
    let micro = microbench(&root)?;
    let dir = out.unwrap_or_else(|| root.join("target/bench"));
    std::fs::create_dir_all(&dir)?;
    let mut all = json!({ "points": points, "measurements": raw, "datapath_cost": micro, "seconds_per_point": seconds,
                      "repeats": repeats, "noisy_above": repeats::NOISY, "guest_hugepages_2m": HUGEPAGES,
                      "host": host.json() });
    if spdk {
        all["spdk"] = json!({ "version": crate::spdk::VERSION, "dpdk": toolchain::output(Command::new("pkg-config").args(["--modversion", "libdpdk"]))?,
                              "driver": "uio_pci_generic", "options": "-c 0x1 -L (one core, latency summary)" });
    }
    if let Some(b) = &baseline {
        all["baseline_cli"] = json!(b.display().to_string());
    }
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(&all)?)?;
    let mut md = table(&points, &micro, repeats, seconds, &axes);
    if let Some(b) = &baseline {
        md.push_str(&baseline::table(&points, &versus, b));
    }
    md.push_str(&host.markdown());
    std::fs::write(dir.join("results.md"), &md)?;
    let plots = plot(&points, &dir, &axes)?;
    println!("{md}");
    println!("wrote results.json, results.md and {plots} plot(s) to {} in {:.0?}", dir.display(), t.elapsed());
    host.warn();
    Ok(())
}

/// The points the guest printed (lines carrying [`MARK`], wherever the console put them).
fn points_from(output: &str) -> Result<Vec<Value>> {
    Ok(output
        .lines()
        .filter_map(|l| l.find(MARK).map(|i| &l[i + MARK.len()..]))
        .map(serde_json::from_str)
        .collect::<std::result::Result<_, _>>()?)
}

/// The data path's own cost at burst 1 (`cargo xtask cost`'s measurement): ns and instructions
/// per command with the device model included, and the engine's own instructions.
fn microbench(root: &Path) -> Result<Value> {
    let c = crate::cost::measure(&root.join("target/release/examples/datapath_cost"), 1, "shared")?;
    Ok(json!({ "ns_per_command": c.ns_total, "instructions_per_command": c.instr_total,
               "engine_instructions_per_command": c.instr_engine() }))
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

/// ugds p50 over the kernel's at the same point; `None` unless both measured one. Like with like:
/// the total latency (fio `lat`, `lat_p50_us`: from the submission call to the completion) of
/// whichever side has it (`ugds bench` times each I/O from the call to its return, which is
/// that too), else the completion latency (`p50_us`, fio `clat`, which leaves out the submission
/// call and whatever completes inside it).
pub(crate) fn p50_ratio(k: &Value, u: &Value) -> Option<f64> {
    let (kernel, ours) = (total_p50(k), total_p50(u));
    (kernel > 0.0 && ours > 0.0).then(|| ours / kernel)
}

/// A point's p50 as [`p50_ratio`] compares it: the total latency where it has one, else its
/// completion latency.
pub(crate) fn total_p50(v: &Value) -> f64 {
    if f(v, "lat_p50_us") > 0.0 {
        f(v, "lat_p50_us")
    } else {
        f(v, "p50_us")
    }
}

/// The point of `engine` beside `u` (same backend, rw, size and depth).
fn beside<'a>(points: &'a [Value], u: &Value, engine: &str) -> Option<&'a Value> {
    points.iter().find(|k| k["engine"] == engine && KEYS.iter().all(|key| k[*key] == u[*key]))
}

/// The kernel's point beside `u`.
fn kernel_beside<'a>(points: &'a [Value], u: &Value) -> Option<&'a Value> {
    beside(points, u, KERNEL)
}

/// Adds `iops_ratio` (median of the per-repeat ratios), `iops_ratio_range`, `noisy` and
/// `p50_ratio` (of the medians) to every point of ours (the baseline CLI's too), and SPDK's, that has a kernel point
/// beside it; and to ours with an SPDK point beside them the same against SPDK under `spdk_`
/// names (`spdk_iops_ratio`, ...: ours over SPDK's). Only adds keys: a reader of the older
/// JSON reads this one.
fn add_ratios(points: &mut [Value]) {
    let theirs: Vec<Value> = points.iter().filter(|p| p["engine"] == KERNEL || p["engine"] == SPDK).cloned().collect();
    for u in points.iter_mut().filter(|p| [UGDS, OWNED, FIO_UGDS, BASELINE, SPDK].iter().any(|e| p["engine"] == *e)) {
        if let Some(k) = kernel_beside(&theirs, u) {
            let r = repeats::ratio(u, k);
            repeats::annotate(u, r);
            if let Some(r) = p50_ratio(k, u) {
                u["p50_ratio"] = json!(r);
            }
        }
        if u["engine"] == SPDK {
            continue;
        }
        if let Some(sp) = beside(&theirs, u, SPDK) {
            let r = repeats::ratio(u, sp);
            u["spdk_iops_ratio"] = json!(r.median);
            u["spdk_iops_ratio_range"] = json!([r.min, r.max]);
            u["spdk_noisy"] = json!(r.noisy);
            if let Some(r) = p50_ratio(sp, u) {
                u["spdk_p50_ratio"] = json!(r);
            }
        }
    }
}

/// A ratio cell: `0.85x`, or `–` when there is none.
fn ratio_cell(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |r| format!("{r:.2}x"))
}

/// The IOPS ratio of `u` to `k` as a cell (median, range, or noisy); `–` without `u`.
fn repeats_cell(k: &Value, u: Option<&Value>) -> String {
    u.map_or_else(|| "–".into(), |u| repeats::cell(repeats::ratio(u, k)))
}

/// The row of one point: the kernel, `ugds bench` and fio with ugds's engine, IOPS, latency and
/// ratios, and `ugds bench` on owned queues where it ran (QD 1), with its own ratios. With
/// `spdk` (an SPDK point, or `Some(None)` where the table has SPDK's column and this point no
/// SPDK measurement), ugds/SPDK beside ugds/kernel.
#[allow(clippy::too_many_arguments)]
fn table_row(
    rw: &str,
    size: &str,
    depth: usize,
    k: &Value,
    u: &Value,
    fio: Option<&Value>,
    owned: Option<&Value>,
    spdk: Option<Option<&Value>>,
) -> String {
    let iops = |v: Option<&Value>| v.map_or_else(|| "–".into(), |v| format!("{:.0}", f(v, "iops")));
    let versus_spdk = match spdk {
        None => String::new(),
        Some(sp) => format!(" {} |", sp.map_or_else(|| "–".into(), |sp| repeats::cell(repeats::ratio(u, sp)))),
    };
    format!(
        "| {rw} | {size} | {depth} | {:.0} | {:.0} | {} |{versus_spdk} {} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {} | {} | {} | {} |",
        f(k, "iops"),
        f(u, "iops"),
        repeats_cell(k, Some(u)),
        iops(fio),
        repeats_cell(k, fio),
        f(k, "p50_us"),
        f(k, "p99_us"),
        f(u, "p50_us"),
        f(u, "p99_us"),
        ratio_cell(p50_ratio(k, u)),
        iops(owned),
        repeats_cell(k, owned),
        ratio_cell(owned.and_then(|o| p50_ratio(k, o))),
    )
}

/// One engine's ratios to `reference` (kernel or SPDK) over a backend's grid, summarised.
fn summary_line(points: &[Value], backend: &str, engine: &str, name: &str, reference: &str) -> Option<String> {
    let rs: Vec<repeats::Ratio> = points
        .iter()
        .filter(|p| p["backend"] == backend && p["engine"] == engine)
        .filter_map(|u| beside(points, u, reference).map(|k| repeats::ratio(u, k)))
        .collect();
    let theirs = if reference == SPDK { "SPDK" } else { reference };
    summary_of(&format!("{name}/{theirs} IOPS"), &rs)
}

/// `what: geometric mean ...` of the ratios `rs` (the noisy ones counted, not averaged);
/// `None` for none.
fn summary_of(what: &str, rs: &[repeats::Ratio]) -> Option<String> {
    if rs.is_empty() {
        return None;
    }
    let (g, noisy) = repeats::summary(rs);
    let lo = rs.iter().filter(|r| !r.noisy).map(|r| r.median).fold(f64::INFINITY, f64::min);
    let hi = rs.iter().filter(|r| !r.noisy).map(|r| r.median).fold(0.0, f64::max);
    Some(match g {
        Some(g) => format!(
            "{what}: geometric mean {g:.2}x over {} points ({lo:.2}x to {hi:.2}x), {noisy} noisy",
            rs.len() - noisy
        ),
        None => format!("{what}: all {noisy} points noisy"),
    })
}

/// The goal against SPDK: at least SPDK's IOPS at QD 1, at least [`SPDK_GOAL`] of them deeper.
const SPDK_GOAL: f64 = 0.90;

/// What `engine` needs of SPDK's IOPS at `depth` to meet the goal.
fn goal_at(depth: usize) -> f64 {
    if depth == 1 {
        1.0
    } else {
        SPDK_GOAL
    }
}

/// Whether `engine` (ugds bench, or the owned queues) met the goal against SPDK over a
/// backend's grid: the points measured, those missed (with their ratio), those too noisy to say.
fn goal_line(points: &[Value], backend: &str, engine: &str, name: &str) -> Option<String> {
    let mut judged = 0;
    let mut missed = Vec::new();
    let mut noisy = Vec::new();
    for u in points.iter().filter(|p| p["backend"] == backend && p["engine"] == engine) {
        let Some(sp) = beside(points, u, SPDK) else { continue };
        let r = repeats::ratio(u, sp);
        let at = format!("{} {} QD {}", u["rw"].as_str().unwrap_or(""), u["size"].as_str().unwrap_or(""), u["depth"]);
        if r.noisy {
            noisy.push(at);
            continue;
        }
        judged += 1;
        let depth = u["depth"].as_u64().unwrap_or(0) as usize;
        if r.median < goal_at(depth) {
            missed.push(format!("{at} ({:.2}x)", r.median));
        }
    }
    if judged == 0 && noisy.is_empty() {
        return None;
    }
    let mut l = format!(
        "goal for {name} (>= SPDK's IOPS at QD 1, >= {SPDK_GOAL:.2}x deeper): met at {} of {judged} points",
        judged - missed.len()
    );
    if !missed.is_empty() {
        let _ = write!(l, "; missed at {}", missed.join(", "));
    }
    if !noisy.is_empty() {
        let _ = write!(l, "; {} noisy, not judged: {}", noisy.len(), noisy.join(", "));
    }
    Some(l)
}

/// The cell of I/Os per round: SPDK's poller's (completions per poll that found any) and
/// `ugds bench`'s batch's (I/Os per wait and submit), `–` where a side did not say.
fn per_round(sp: &Value, ours: Option<&Value>) -> String {
    let n = |v: Option<&Value>| {
        v.and_then(|v| v["ios_per_round"].as_f64()).map_or_else(|| "–".into(), |x| format!("{x:.2}"))
    };
    format!("{} / {}", n(Some(sp)), n(ours))
}

/// SPDK's own figures per point, beside the ratios of ours to them.
fn spdk_table(s: &mut String, points: &[Value], backend: &str) {
    let _ = writeln!(
        s,
        "\nSPDK's `spdk_nvme_perf` on the same controller (its own figures; latencies from submission to completion):\n\n| rw | size | QD | SPDK IOPS | SPDK MiB/s | SPDK avg / min / max us | SPDK p50 / p99 us | SPDK/kernel | ugds/SPDK | ugds/SPDK p50 | fio+ugds/SPDK | owned/SPDK | I/Os per round, SPDK / ugds | goal |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    for sp in points.iter().filter(|p| p["backend"] == backend && p["engine"] == SPDK) {
        let ours = |engine: &str| beside(points, sp, engine);
        let versus = |engine: &str| ours(engine).map_or_else(|| "–".into(), |u| repeats::cell(repeats::ratio(u, sp)));
        let goal = ours(UGDS).map_or_else(
            || "–".into(),
            |u| {
                let r = repeats::ratio(u, sp);
                let depth = sp["depth"].as_u64().unwrap_or(0) as usize;
                if r.noisy {
                    "noisy".into()
                } else if r.median >= goal_at(depth) {
                    "met".into()
                } else {
                    format!("missed (needs {:.2}x)", goal_at(depth))
                }
            },
        );
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} | {} | {} | {} | {} | {} | {} | {goal} |",
            sp["rw"].as_str().unwrap_or(""),
            sp["size"].as_str().unwrap_or(""),
            sp["depth"],
            f(sp, "iops"),
            f(sp, "mib_s"),
            f(sp, "avg_us"),
            f(sp, "min_us"),
            f(sp, "max_us"),
            f(sp, "p50_us"),
            f(sp, "p99_us"),
            kernel_beside(points, sp).map_or_else(|| "–".into(), |k| repeats::cell(repeats::ratio(sp, k))),
            versus(UGDS),
            ratio_cell(ours(UGDS).and_then(|u| p50_ratio(sp, u))),
            versus(FIO_UGDS),
            versus(OWNED),
            per_round(sp, ours(UGDS)),
        );
    }
}

/// The markdown of a run: per controller, a row per point of `axes` measured by the kernel and
/// `ugds bench` (points not measured have none), geometric means over the rows, SPDK's table.
fn table(points: &[Value], micro: &Value, repeats: usize, seconds: u64, axes: &Axes) -> String {
    let mut s = String::new();
    let with_spdk = points.iter().any(|p| p["engine"] == SPDK);
    for backend in ["file", "null"] {
        if !points.iter().any(|p| p["backend"] == backend) {
            continue;
        }
        let title = if backend == "file" {
            "controller on an image file in the host's memory"
        } else {
            "null-backed controller (no data)"
        };
        let (spdk_head, spdk_rule) = if with_spdk { (" ugds/SPDK |", " ---: |") } else { ("", "") };
        let _ = writeln!(
            s,
            "\n### {title}\n\n| rw | size | QD/batch | kernel IOPS | ugds IOPS | ugds/kernel |{spdk_head} fio+ugds IOPS | fio+ugds/kernel | kernel p50/p99 us | ugds p50/p99 us | ugds/kernel p50 | owned IOPS | owned/kernel | owned/kernel p50 |\n| --- | --- | ---: | ---: | ---: | ---: |{spdk_rule} ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for rw in &axes.rws {
            for size in &axes.sizes {
                for depth in &axes.depths {
                    let find = |engine: &str| {
                        points.iter().find(|p| {
                            p["backend"] == backend
                                && p["engine"] == engine
                                && p["rw"] == *rw
                                && p["size"] == *size
                                && p["depth"] == *depth
                        })
                    };
                    if let (Some(k), Some(u)) = (find(KERNEL), find(UGDS)) {
                        let sp = with_spdk.then(|| find(SPDK));
                        let _ = writeln!(s, "{}", table_row(rw, size, *depth, k, u, find(FIO_UGDS), find(OWNED), sp));
                    }
                }
            }
        }
        s.push('\n');
        for (engine, name) in [(UGDS, "ugds"), (FIO_UGDS, "fio+ugds"), (OWNED, "owned"), (SPDK, "SPDK")] {
            if let Some(l) = summary_line(points, backend, engine, name, KERNEL) {
                let _ = writeln!(s, "- {l}");
            }
        }
        if with_spdk {
            for (engine, name) in [(UGDS, "ugds"), (FIO_UGDS, "fio+ugds"), (OWNED, "owned")] {
                if let Some(l) = summary_line(points, backend, engine, name, SPDK) {
                    let _ = writeln!(s, "- {l}");
                }
            }
            for (engine, name) in [(UGDS, "`ugds bench`"), (OWNED, "owned queues (QD 1)")] {
                if let Some(l) = goal_line(points, backend, engine, name) {
                    let _ = writeln!(s, "- {l}");
                }
            }
            spdk_table(&mut s, points, backend);
        }
    }
    let _ = writeln!(
        s,
        "\nEvery point was measured {repeats} times per engine for {seconds} s, the engines interleaved (kernel, ours, ours, kernel, ...; the controller rebound in between); IOPS and latencies are medians, a ratio is the median of the ratios of measurements made side by side, with their range in brackets. A point where an engine's measurements disagree by more than {}x is noisy: not a result, left out of the means. fio+ugds: the kernel's fio job with ugds's ioengine (`ioengine=external:libugds_fio.so`) on the ugds node. ugds/kernel p50 below 1 is lower latency for ugds; it compares total latencies (from the submission call to the completion: fio `lat`, `ugds bench`'s call to return), where the columns show the kernel's completion latency (fio `clat`). owned: `ugds bench --queue owned`, each thread's synchronous calls on a queue pair of its own (no lock); QD 1 only (deeper points are batches, which own their queue pair already).",
        repeats::NOISY
    );
    if with_spdk {
        let _ = writeln!(
            s,
            "\nSPDK: `spdk_nvme_perf -q QD -o SIZE -w RW -t {seconds} -c 0x1 -L -r 'trtype:PCIe traddr:ADDR'` (SPDK {}, Debian's DPDK, the controller bound to uio_pci_generic for its turn), taking turns with ugds and the kernel (ugds, kernel, SPDK, then back: SPDK, kernel, ugds, ...). It picks its offsets over the whole 2 GiB namespace, where the others keep to the first 1 GiB (the same on the null-backed controller). ugds/SPDK above 1 is more IOPS for ugds; the goal: at least SPDK's IOPS at every QD 1 point, at least {SPDK_GOAL:.2}x of them everywhere else.",
            crate::spdk::VERSION
        );
    }
    let _ = writeln!(
        s,
        "\nData path's own cost (host, in-memory device stepped on the same thread, 4 KiB reads, burst 1): {:.1} ns and {:.0} instructions per command (device model included).",
        f(micro, "ns_per_command"),
        f(micro, "instructions_per_command")
    );
    s
}

/// Registers the DejaVu font as plotters' "sans-serif" (once per process).
fn register_font() -> Result<()> {
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if DONE.get().is_some() {
        return Ok(());
    }
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
        .context("the DejaVu font (apt-get install fonts-dejavu-core)")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font).map_err(|_| anyhow::anyhow!("font"))?;
    let _ = DONE.set(());
    Ok(())
}

/// A plot per controller and rw of `axes`: IOPS against log2 of the depth, a line per engine
/// and size over the points measured.
fn plot(points: &[Value], dir: &Path, axes: &Axes) -> Result<usize> {
    register_font()?;
    let log2 = |d: usize| (d as f64).log2();
    let right = axes.depths.iter().map(|&d| log2(d)).fold(0.0, f64::max) + 0.2;
    let ticks = axes
        .depths
        .iter()
        .map(|&d| {
            let l = log2(d);
            if l.fract() == 0.0 {
                format!("{l:.0} = {d}")
            } else {
                format!("{l:.1} = {d}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut n = 0;
    for backend in ["file", "null"] {
        if !points.iter().any(|p| p["backend"] == backend) {
            continue;
        }
        for rw in &axes.rws {
            let path = dir.join(format!("iops-{backend}-{rw}.png"));
            let root = BitMapBackend::new(&path, (900, 600)).into_drawing_area();
            root.fill(&WHITE)?;
            let max = points
                .iter()
                .filter(|p| p["backend"] == backend && p["rw"] == *rw)
                .map(|p| f(p, "iops"))
                .fold(1.0, f64::max);
            let mut chart = ChartBuilder::on(&root)
                .caption(format!("{rw}, {backend}-backed QEMU NVMe: IOPS vs queue depth"), ("sans-serif", 22))
                .margin(15)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(0f64..right, 0f64..max * 1.1)?;
            chart.configure_mesh().x_desc(format!("log2(queue depth or batch size): {ticks}")).y_desc("IOPS").draw()?;
            let colors = [RED, BLUE, GREEN, MAGENTA];
            for (ci, size) in axes.sizes.iter().enumerate() {
                let color = colors[ci % colors.len()];
                for (engine, width) in [(UGDS, 3), (FIO_UGDS, 2), (KERNEL, 1), (SPDK, 1)] {
                    let series: Vec<(f64, f64)> = axes
                        .depths
                        .iter()
                        .filter_map(|d| {
                            points
                                .iter()
                                .find(|p| {
                                    p["backend"] == backend
                                        && p["engine"] == engine
                                        && p["rw"] == *rw
                                        && p["size"] == *size
                                        && p["depth"] == *d
                                })
                                .map(|p| (log2(*d), f(p, "iops")))
                        })
                        .collect();
                    if series.is_empty() {
                        continue;
                    }
                    let style = color.stroke_width(width);
                    if engine == SPDK {
                        // SPDK: a thin line with a triangle at each point.
                        chart.draw_series(series.iter().map(|&p| TriangleMarker::new(p, 6, color.filled())))?;
                    }
                    chart
                        .draw_series(LineSeries::new(series, style))?
                        .label(format!("{engine} {size}"))
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
                }
            }
            // ugds on owned queue pairs: synchronous calls only, so one dot per size at QD 1.
            for (ci, size) in axes.sizes.iter().enumerate() {
                let owned = points.iter().find(|p| {
                    p["backend"] == backend
                        && p["engine"] == OWNED
                        && p["rw"] == *rw
                        && p["size"] == *size
                        && p["depth"] == 1
                });
                if let Some(p) = owned {
                    let color = colors[ci % colors.len()];
                    chart
                        .draw_series(std::iter::once(Circle::new((0.0, f(p, "iops")), 5, color.filled())))?
                        .label(format!("ugds owned queue {size}"))
                        .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
                }
            }
            chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
            root.present()?;
            n += 1;
        }
    }
    Ok(n)
}

/// Checks a grid's axes: sizes (multiples of 4K, none larger than `span`), depths (at least 1)
/// and rws (`randread`, `randwrite`), none empty.
fn check_axes(sizes: &[String], depths: &[usize], rws: &[String], span: u64) -> Result<()> {
    if sizes.is_empty() || depths.is_empty() || rws.is_empty() {
        bail!("the grid is empty (--sizes, --depths and --rw each need a value)");
    }
    for s in sizes {
        let n = vm::parse_size(s)?;
        if n == 0 || !n.is_multiple_of(4096) {
            bail!("size {s} is not a multiple of 4K");
        }
        if n > span {
            bail!("size {s} is larger than --span");
        }
    }
    if depths.contains(&0) {
        bail!("--depths takes depths of at least 1, not 0");
    }
    if let Some(rw) = rws.iter().find(|r| !matches!(r.as_str(), "randread" | "randwrite")) {
        bail!("--rw takes randread and randwrite, not {rw}");
    }
    Ok(())
}

/// The strings of a grid's JSON array `k`.
fn json_strs(v: &Value, k: &str) -> Result<Vec<String>> {
    v[k].as_array()
        .with_context(|| format!("grid: no {k}"))?
        .iter()
        .map(|x| x.as_str().map(str::to_string).with_context(|| format!("grid: {k}")))
        .collect()
}

/// The counts of a grid's JSON array `k`.
fn json_nums(v: &Value, k: &str) -> Result<Vec<usize>> {
    v[k].as_array()
        .with_context(|| format!("grid: no {k}"))?
        .iter()
        .map(|x| x.as_u64().map(|n| n as usize).with_context(|| format!("grid: {k}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{add_ratios, plot, repeats, table, volume, Axes, DEPTHS, FIO_UGDS, KEYS, OWNED, SIZES, SPDK};
    use crate::vm;
    use serde_json::{json, Value};
    use std::path::Path;

    fn point(engine: &str, depth: usize, iops: f64, p50: f64) -> Value {
        json!({"engine": engine, "backend": "null", "rw": "randread", "size": "4K", "depth": depth,
               "iops": iops, "p50_us": p50, "p99_us": 2.0 * p50})
    }

    /// Two measurements per engine and point, as the guest prints them.
    fn measurements() -> Vec<Value> {
        let mut out = Vec::new();
        for (repeat, scale) in [(0, 1.0), (1, 1.2)] {
            let mut k1 = point("kernel", 1, 10000.0 * scale, 40.0);
            // The total latency (submission included) is what ugds's p50 is compared with.
            k1["lat_p50_us"] = json!(80.0);
            let mut fio = point(FIO_UGDS, 1, 15000.0 * scale, 30.0);
            fio["lat_p50_us"] = json!(40.0);
            for mut p in [
                k1,
                point("ugds", 1, 20000.0 * scale, 20.0),
                fio,
                point(OWNED, 1, 25000.0 * scale, 10.0),
                point("kernel", 8, 50000.0, 100.0),
                // ugds at QD 8 disagrees with itself by 2x: noisy.
                point("ugds", 8, 40000.0 * (1.0 + repeat as f64), 0.0),
            ] {
                p["repeat"] = json!(repeat);
                out.push(p);
            }
        }
        out
    }

    fn grid() -> Vec<Value> {
        let mut pts = repeats::merge(&measurements(), KEYS);
        add_ratios(&mut pts);
        pts
    }

    /// Each row carries the median ratios over repeats with their range, fio with ugds's engine
    /// beside `ugds bench`, p50 ratios of total latencies, and at QD 1 the owned queues; a point
    /// whose repeats disagree says noisy; one without a measurement shows `–`.
    #[test]
    fn rows_carry_median_ratios_fio_ugds_and_the_owned_mode() {
        let t = table(&grid(), &json!({}), 2, 1, &Axes::main());
        let qd1 = t.lines().find(|l| l.starts_with("| randread | 4K | 1 |")).expect("QD 1 row");
        let cells: Vec<&str> = qd1.split('|').map(str::trim).collect();
        // | rw | size | QD | kernel IOPS | ugds IOPS | ugds/kernel | fio+ugds IOPS | fio+ugds/kernel |
        // kernel p50/p99 | ugds p50/p99 | ugds/kernel p50 | owned IOPS | owned/kernel | owned/kernel p50 |
        assert_eq!(
            &cells[4..15],
            &["11000", "22000", "2.00x", "16500", "1.50x", "40 / 80", "20 / 40", "0.25x", "27500", "2.50x", "0.12x"],
            "{qd1}"
        );
        let qd8 = t.lines().find(|l| l.starts_with("| randread | 4K | 8 |")).expect("QD 8 row");
        let cells: Vec<&str> = qd8.split('|').map(str::trim).collect();
        assert_eq!(cells[6], "noisy (0.80–1.60)", "{qd8}");
        assert_eq!(&cells[7..9], &["–", "–"], "{qd8}");
        assert_eq!(&cells[12..15], &["–", "–", "–"], "{qd8}");
        // Header and rows have as many columns.
        let header = t.lines().find(|l| l.starts_with("| rw |")).expect("header");
        assert_eq!(header.matches('|').count(), qd1.matches('|').count());
        // The summary leaves the noisy point out and counts it.
        assert!(t.contains("- ugds/kernel IOPS: geometric mean 2.00x over 1 points (2.00x to 2.00x), 1 noisy"), "{t}");
        assert!(t.contains("- fio+ugds/kernel IOPS: geometric mean 1.50x over 1 points"), "{t}");
    }

    /// The JSON's points of ours gain their ratios to the kernel; the kernel's gain none.
    #[test]
    fn ratios_are_added_to_our_points_only() {
        let pts = grid();
        let get = |engine: &str, depth: usize| {
            pts.iter().find(|p| p["engine"] == engine && p["depth"] == depth).expect("point").clone()
        };
        let u = get("ugds", 1);
        assert_eq!(u["p50_ratio"], json!(0.25));
        assert_eq!(u["iops_ratio"], json!(2.0));
        assert_eq!(u["iops_ratio_range"], json!([2.0, 2.0]));
        assert_eq!(u["noisy"], json!(false));
        assert_eq!(u["iops_repeats"], json!([20000.0, 24000.0]));
        // fio with ugds's engine: total latency against total latency (40 over 80).
        assert_eq!(get(FIO_UGDS, 1)["p50_ratio"], json!(0.5));
        assert_eq!(get(OWNED, 1)["p50_ratio"], json!(0.125));
        let k = get("kernel", 1);
        assert!(k.get("p50_ratio").is_none() && k.get("iops_ratio").is_none());
        // No p50 measured: no p50 ratio, but the IOPS one, noisy.
        let u8 = get("ugds", 8);
        assert!(u8.get("p50_ratio").is_none());
        assert_eq!(u8["noisy"], json!(true));
        assert_eq!(u8["iops"], json!(60000.0));
    }

    /// Every backend and rw gets its plot, the owned queues' dots included.
    #[test]
    fn plots_are_written_with_the_owned_points() {
        if !Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
            return;
        }
        let dir = vm::TempDir::new("ugds-bench-main-plot").unwrap();
        // The grid has the null-backed controller only: its two plots, none for the file one.
        assert_eq!(plot(&grid(), dir.path(), &Axes::main()).unwrap(), 2);
        assert!(!dir.path().join("iops-file-randread.png").exists());
        let png = std::fs::read(dir.path().join("iops-null-randread.png")).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
    }

    /// The grid of [`measurements`] with SPDK beside it: at QD 1 SPDK does 16000 and 19200
    /// IOPS (ugds 20000 and 24000: 1.25x), at QD 8 (ugds noisy) 50000 both times.
    fn grid_with_spdk() -> Vec<Value> {
        let mut raw = measurements();
        for (repeat, scale) in [(0, 1.0), (1, 1.2)] {
            for (depth, iops) in [(1, 16000.0 * scale), (8, 50000.0)] {
                let mut p = point(SPDK, depth, iops, 30.0);
                p["lat_p50_us"] = json!(30.0);
                p["mib_s"] = json!(iops * 4096.0 / 1048576.0);
                p["avg_us"] = json!(33.0);
                p["min_us"] = json!(9.5);
                p["max_us"] = json!(900.0);
                p["repeat"] = json!(repeat);
                raw.push(p);
            }
        }
        // A QD 32 point where ugds falls short of SPDK by more than 10 %: 0.80x.
        for repeat in [0, 1] {
            for (engine, iops) in [("kernel", 60000.0), ("ugds", 64000.0), (SPDK, 80000.0)] {
                let mut p = point(engine, 32, iops, 50.0);
                p["repeat"] = json!(repeat);
                raw.push(p);
            }
        }
        let mut pts = repeats::merge(&raw, KEYS);
        add_ratios(&mut pts);
        pts
    }

    /// With SPDK: ugds/SPDK sits beside ugds/kernel in the main table, SPDK's own figures and
    /// the ratios to them in a table of their own, summaries against SPDK, and the goal says
    /// where it was missed; the JSON carries the `spdk_` ratios on our points and SPDK's
    /// ratio to the kernel on its own.
    #[test]
    fn spdk_stands_beside_the_kernel() {
        let pts = grid_with_spdk();
        let get = |engine: &str, depth: usize| {
            pts.iter().find(|p| p["engine"] == engine && p["depth"] == depth).expect("point").clone()
        };
        let u = get("ugds", 1);
        assert_eq!(u["spdk_iops_ratio"], json!(1.25));
        assert_eq!(u["spdk_iops_ratio_range"], json!([1.25, 1.25]));
        assert_eq!(u["spdk_noisy"], json!(false));
        // Total latency against total latency: ugds bench's 20 us over SPDK's 30.
        assert!((u["spdk_p50_ratio"].as_f64().unwrap() - 20.0 / 30.0).abs() < 1e-9);
        assert_eq!(u["iops_ratio"], json!(2.0), "the kernel ratio stays");
        let sp = get(SPDK, 1);
        // SPDK over the kernel: 16000/10000 and 19200/12000.
        assert_eq!(sp["iops_ratio"], json!(1.6));
        assert!(sp.get("spdk_iops_ratio").is_none());
        assert_eq!(get("ugds", 8)["spdk_noisy"], json!(true));

        let t = table(&pts, &json!({}), 2, 1, &Axes::main());
        let header = t.lines().find(|l| l.starts_with("| rw | size | QD/batch |")).expect("header");
        let heads: Vec<&str> = header.split('|').map(str::trim).collect();
        assert_eq!(&heads[6..8], &["ugds/kernel", "ugds/SPDK"], "{header}");
        let qd1 = t.lines().find(|l| l.starts_with("| randread | 4K | 1 |")).expect("QD 1 row");
        let cells: Vec<&str> = qd1.split('|').map(str::trim).collect();
        assert_eq!(&cells[4..9], &["11000", "22000", "2.00x", "1.25x", "16500"], "{qd1}");
        assert_eq!(header.matches('|').count(), qd1.matches('|').count());
        let row = t.lines().find(|l| l.starts_with("| randread | 4K | 1 | 17600 |")).expect("SPDK row");
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | rw | size | QD | IOPS | MiB/s | avg/min/max | p50/p99 | SPDK/kernel | ugds/SPDK | p50 | fio+ugds/SPDK | owned/SPDK | I/Os per round | goal |
        assert_eq!(
            &cells[5..15],
            &["68.8", "33.0 / 9.5 / 900.0", "30.0 / 60.0", "1.60x", "1.25x", "0.67x", "0.94x", "1.56x", "– / –", "met"],
            "{row}"
        );
        // Where both sides said how many I/Os a round carried, the cell has both.
        let mut with_rounds = pts.clone();
        for p in with_rounds.iter_mut().filter(|p| p["depth"] == 32 && p["rw"] == "randread" && p["size"] == "4K") {
            p["ios_per_round"] = json!(if p["engine"] == SPDK { 7.98 } else { 4.5 });
        }
        let t2 = table(&with_rounds, &json!({}), 2, 1, &Axes::main());
        let row32 = t2.lines().find(|l| l.starts_with("| randread | 4K | 32 | 80000 |")).expect("SPDK QD 32 row");
        assert!(row32.contains("| 7.98 / 4.50 |"), "{row32}");
        let qd32 = t.lines().find(|l| l.starts_with("| randread | 4K | 32 | 80000 |")).expect("SPDK QD 32 row");
        assert!(qd32.ends_with("| missed (needs 0.90x) |"), "{qd32}");
        assert!(t.contains("- ugds/SPDK IOPS: geometric mean"), "{t}");
        assert!(t.contains("- SPDK/kernel IOPS: geometric mean"), "{t}");
        assert!(
            t.contains("- goal for `ugds bench` (>= SPDK's IOPS at QD 1, >= 0.90x deeper): met at 1 of 2 points; missed at randread 4K QD 32 (0.80x); 1 noisy, not judged: randread 4K QD 8"),
            "{t}"
        );
        assert!(
            t.contains(
                "- goal for owned queues (QD 1) (>= SPDK's IOPS at QD 1, >= 0.90x deeper): met at 1 of 1 points"
            ),
            "{t}"
        );
        // Without SPDK points the table keeps its old columns.
        let plain = table(&grid(), &json!({}), 2, 1, &Axes::main());
        assert!(!plain.contains("SPDK"), "{plain}");
    }

    fn axes(sizes: &[&str], depths: &[usize], rws: &[&str]) -> Axes {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Axes { sizes: strings(sizes), depths: depths.to_vec(), rws: strings(rws) }
    }

    /// A part of the grid (`--sizes 4K --depths 1,8 --rw randread`): rows for its points only,
    /// means over them, a plot per rw it has; more sizes than the plot has colours, and axes
    /// with nothing measured, draw without a panic.
    #[test]
    fn a_part_of_the_grid_shows_its_points_only() {
        let part = axes(&["4K"], &[1, 8], &["randread"]);
        let t = table(&grid(), &json!({}), 2, 1, &part);
        let rows: Vec<&str> = t.lines().filter(|l| l.starts_with("| rand")).collect();
        assert_eq!(rows.len(), 2, "{t}");
        assert!(rows[0].starts_with("| randread | 4K | 1 |") && rows[1].starts_with("| randread | 4K | 8 |"), "{t}");
        assert!(t.contains("- ugds/kernel IOPS: geometric mean 2.00x over 1 points"), "{t}");
        // QD 8 alone: no owned queues, no QD 1 row.
        let t = table(&grid(), &json!({}), 2, 1, &axes(&["4K"], &[8], &["randread"]));
        assert_eq!(t.lines().filter(|l| l.starts_with("| rand")).count(), 1, "{t}");
        // Nothing measured: no rows, no means, no panic.
        let t = table(&[], &json!({}), 1, 1, &part);
        assert!(!t.contains("| randread") && !t.contains("geometric mean"), "{t}");

        if !Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
            return;
        }
        let dir = vm::TempDir::new("ugds-bench-main-part").unwrap();
        let wide = axes(&["4K", "8K", "16K", "32K", "64K", "128K"], &[1, 6, 8, 256], &["randread"]);
        assert_eq!(plot(&grid(), dir.path(), &wide).unwrap(), 1);
        assert!(dir.path().join("iops-null-randread.png").exists());
        assert!(!dir.path().join("iops-null-randwrite.png").exists());
        assert_eq!(plot(&[], dir.path(), &part).unwrap(), 0);
    }

    /// The main grid's axes are checked before the VM boots, each error naming what is wrong.
    #[test]
    fn the_main_grid_refuses_bad_axes() {
        assert_eq!(Axes::main().checked_main().unwrap(), Axes::main());
        assert_eq!(Axes::main().points(), 32);
        assert_eq!(Axes::main().qd1_points(), 8);
        let err = |a: Axes| format!("{:#}", a.checked_main().unwrap_err());
        assert!(err(axes(&["4K"], &[0], &["randread"])).contains("--depths takes depths of at least 1, not 0"));
        assert!(err(axes(&["4K"], &[1], &["read"])).contains("not read"));
        assert!(err(axes(&["3K"], &[1], &["randread"])).contains("3K is not a multiple of 4K"));
        assert!(err(axes(&["2G"], &[1], &["randread"])).contains("working set (1G)"));
        assert!(err(axes(&["4K", "4K"], &[1], &["randread"])).contains("--sizes names 4K twice"));
        assert!(err(axes(&["4K"], &[1, 8, 1], &["randread"])).contains("--depths names 1 twice"));
        assert!(err(axes(&[], &[1], &["randread"])).contains("the grid is empty"));
        let given = Axes::main().with(Some(vec!["64K".into()]), None, Some(vec!["randwrite".into()]));
        assert_eq!(given, axes(&["64K"], DEPTHS, &["randwrite"]));
    }

    /// `cargo xtask bench --help` names each grid's default sizes and depths as they are.
    #[test]
    fn the_help_names_the_defaults() {
        use clap::CommandFactory;
        let mut cli = crate::Cli::command();
        let bench = cli.find_subcommand_mut("bench").expect("bench");
        let help = |id: &str| {
            let arg = bench.get_arguments().find(|a| a.get_id() == id).expect(id);
            arg.get_help().expect("help").to_string().replace('\n', " ")
        };
        let joined = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        let sizes = help("sizes");
        assert!(sizes.contains(&format!("main grid {}", SIZES.join(","))), "{sizes}");
        assert!(sizes.contains(&format!("remote {}", volume::DEFAULT_SIZES.join(","))), "{sizes}");
        let depths = help("depths");
        assert!(depths.contains(&format!("main grid {}", joined(DEPTHS))), "{depths}");
        assert!(depths.contains(&format!("remote {}", joined(volume::DEFAULT_DEPTHS))), "{depths}");
    }
}

//! `cargo xtask bench`: one VM boot, two emulated controllers (one on an image in the host's
//! memory, one null-backed to isolate software and emulation cost), three engines on the same
//! controller with the same fio job: the kernel path (fio, io_uring, O_DIRECT, fixed buffers,
//! registered files), fio with ugds's own ioengine (`libugds_fio.so`), and `ugds bench`; at QD 1
//! `ugds bench` also on owned queue pairs (`--queue owned`). Every point is measured several
//! times per engine, interleaved with the kernel's (see [`repeats`]): medians, the median ratio
//! with its range, noisy points marked. Plus the data path's own cost on the host. Writes JSON,
//! a markdown table with ratios and PNG plots.

use crate::{bind, kernel, kmod, toolchain, vm};
use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub mod p2p;
pub mod remote;
pub mod repeats;
pub mod volume;

const SIZES: &[&str] = &["4K", "16K", "64K", "128K"];
const DEPTHS: &[usize] = &[1, 8, 32, 128];
const RWS: &[&str] = &["randread", "randwrite"];
const MARK: &str = "BENCH-POINT ";
/// The kernel path: fio with io_uring on the kernel's block device.
const KERNEL: &str = "kernel";
/// `ugds bench` points.
const UGDS: &str = "ugds";
/// fio with ugds's ioengine on the ugds node: the kernel's job, the other engine.
const FIO_UGDS: &str = "fio-ugds";
/// The engine name of `ugds bench --queue owned` points (synchronous calls, QD 1 only).
const OWNED: &str = "ugds-owned";
/// What a point is, besides its engine.
const KEYS: &[&str] = &["backend", "rw", "size", "depth"];

/// Host side.
pub fn run(seconds: u64, repeats: usize, out: Option<PathBuf>) -> Result<()> {
    let t = Instant::now();
    if repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let root = toolchain::workspace_root();
    toolchain::setup_and_build_release(&["-p", "ugds-cli", "--bins"])?;
    toolchain::setup_and_build_release(&["-p", "ugds-fio", "--lib"])?;
    toolchain::setup_and_build_release(&["-p", "ugds", "--features", "test-utils", "--example", "datapath_cost"])?;
    let k = kernel::Choice::Test612.ensure()?;
    let ko = kmod::build_for(&k)?;
    let cli = root.join("target/release/ugds");
    let engine = root.join("target/release/libugds_fio.so");
    let me = std::env::current_exe()?;
    let points = SIZES.len() * DEPTHS.len() * RWS.len();
    // Per controller: 3 engines at every point, ugds's owned queues at QD 1, each `repeats`
    // times; about 2 s per measurement and rebind besides the measuring.
    let measured = 2 * repeats as u64 * (3 * points as u64 + (points / DEPTHS.len()) as u64);
    let estimate = Duration::from_secs(measured * (seconds + 2) + 120);
    let cfg = vm::VmConfig {
        nvme: vec!["size=2G,lbs=4096,backend=memory".parse()?, "size=2G,lbs=4096,backend=null".parse()?],
        iommu: false,
        bind_module: None,
        mem: "2G".into(),
        timeout: (estimate * 2).max(Duration::from_secs(1800)),
        env: vec![("UGDS_KMOD".into(), ko.display().to_string())],
        cmd: vec![
            me.display().to_string(),
            "bench-guest".into(),
            cli.display().to_string(),
            engine.display().to_string(),
            seconds.to_string(),
            repeats.to_string(),
        ],
        p2p: None,
    };
    eprintln!(
        "bench: booting the VM ({points} points x 3 engines x 2 controllers, and ugds on owned queues at QD 1, \
         {repeats} times each, interleaved, {seconds} s per measurement: about {} min)",
        estimate.as_secs().div_ceil(60)
    );
    let outcome = vm::run(&cfg, &k, true)?;
    if outcome.code != 0 {
        bail!("the benchmark failed in the VM (exit {})", outcome.code);
    }
    let raw = points_from(&outcome.output)?;
    let mut points = repeats::merge(&raw, KEYS);
    add_ratios(&mut points);
    let micro = microbench(&root)?;
    let dir = out.unwrap_or_else(|| root.join("target/bench"));
    std::fs::create_dir_all(&dir)?;
    let all = json!({ "points": points, "measurements": raw, "datapath_cost": micro, "seconds_per_point": seconds,
                      "repeats": repeats, "noisy_above": repeats::NOISY });
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(&all)?)?;
    let md = table(&points, &micro, repeats, seconds);
    std::fs::write(dir.join("results.md"), &md)?;
    let plots = plot(&points, &dir)?;
    println!("{md}");
    println!("wrote results.json, results.md and {plots} plot(s) to {} in {:.0?}", dir.display(), t.elapsed());
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

/// `kernel IOPS | ugds IOPS | ugds/kernel` cells of a table row.
fn iops_cells(k: &Value, u: &Value) -> String {
    format!("{:.0} | {:.0} | {:.2}x", f(k, "iops"), f(u, "iops"), f(u, "iops") / f(k, "iops").max(1.0))
}

/// ugds p50 over the kernel's at the same point; `None` unless both measured one. Like with like:
/// the total latency (fio `lat`, `lat_p50_us`: from the submission call to the completion) of
/// whichever side has it (`ugds bench` times each I/O from the call to its return, which is
/// that too), else the completion latency (`p50_us`, fio `clat`, which leaves out the submission
/// call and whatever completes inside it).
fn p50_ratio(k: &Value, u: &Value) -> Option<f64> {
    let total = |v: &Value| if f(v, "lat_p50_us") > 0.0 { f(v, "lat_p50_us") } else { f(v, "p50_us") };
    let (kernel, ours) = (total(k), total(u));
    (kernel > 0.0 && ours > 0.0).then(|| ours / kernel)
}

/// The kernel's point beside `u` (same backend, rw, size and depth).
fn kernel_beside<'a>(points: &'a [Value], u: &Value) -> Option<&'a Value> {
    points.iter().find(|k| k["engine"] == KERNEL && KEYS.iter().all(|key| k[*key] == u[*key]))
}

/// Adds `iops_ratio` (median of the per-repeat ratios), `iops_ratio_range`, `noisy` and
/// `p50_ratio` (of the medians) to every point of ours that has a kernel point beside it. Only
/// adds keys: a reader of the older JSON reads this one.
fn add_ratios(points: &mut [Value]) {
    let kernel: Vec<Value> = points.iter().filter(|p| p["engine"] == KERNEL).cloned().collect();
    for u in points.iter_mut().filter(|p| [UGDS, OWNED, FIO_UGDS].iter().any(|e| p["engine"] == *e)) {
        let Some(k) = kernel_beside(&kernel, u) else { continue };
        let r = repeats::ratio(u, k);
        repeats::annotate(u, r);
        if let Some(r) = p50_ratio(k, u) {
            u["p50_ratio"] = json!(r);
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
/// ratios, and `ugds bench` on owned queues where it ran (QD 1), with its own ratios.
fn table_row(
    rw: &str,
    size: &str,
    depth: usize,
    k: &Value,
    u: &Value,
    fio: Option<&Value>,
    owned: Option<&Value>,
) -> String {
    let iops = |v: Option<&Value>| v.map_or_else(|| "–".into(), |v| format!("{:.0}", f(v, "iops")));
    format!(
        "| {rw} | {size} | {depth} | {:.0} | {:.0} | {} | {} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {} | {} | {} | {} |",
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

/// One engine's ratios to the kernel over a backend's grid, summarised.
fn summary_line(points: &[Value], backend: &str, engine: &str, name: &str) -> Option<String> {
    let rs: Vec<repeats::Ratio> = points
        .iter()
        .filter(|p| p["backend"] == backend && p["engine"] == engine)
        .filter_map(|u| kernel_beside(points, u).map(|k| repeats::ratio(u, k)))
        .collect();
    if rs.is_empty() {
        return None;
    }
    let (g, noisy) = repeats::summary(&rs);
    let lo = rs.iter().filter(|r| !r.noisy).map(|r| r.median).fold(f64::INFINITY, f64::min);
    let hi = rs.iter().filter(|r| !r.noisy).map(|r| r.median).fold(0.0, f64::max);
    Some(match g {
        Some(g) => format!(
            "{name}/kernel IOPS: geometric mean {g:.2}x over {} points ({lo:.2}x to {hi:.2}x), {noisy} noisy",
            rs.len() - noisy
        ),
        None => format!("{name}/kernel IOPS: all {noisy} points noisy"),
    })
}

fn table(points: &[Value], micro: &Value, repeats: usize, seconds: u64) -> String {
    let mut s = String::new();
    for backend in ["file", "null"] {
        let title = if backend == "file" {
            "controller on an image file in the host's memory"
        } else {
            "null-backed controller (no data)"
        };
        let _ = writeln!(
            s,
            "\n### {title}\n\n| rw | size | QD/batch | kernel IOPS | ugds IOPS | ugds/kernel | fio+ugds IOPS | fio+ugds/kernel | kernel p50/p99 us | ugds p50/p99 us | ugds/kernel p50 | owned IOPS | owned/kernel | owned/kernel p50 |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for rw in RWS {
            for size in SIZES {
                for depth in DEPTHS {
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
                        let _ = writeln!(s, "{}", table_row(rw, size, *depth, k, u, find(FIO_UGDS), find(OWNED)));
                    }
                }
            }
        }
        s.push('\n');
        for (engine, name) in [(UGDS, "ugds"), (FIO_UGDS, "fio+ugds"), (OWNED, "owned")] {
            if let Some(l) = summary_line(points, backend, engine, name) {
                let _ = writeln!(s, "- {l}");
            }
        }
    }
    let _ = writeln!(
        s,
        "\nEvery point was measured {repeats} times per engine for {seconds} s, the engines interleaved (kernel, ours, ours, kernel, ...; the controller rebound in between); IOPS and latencies are medians, a ratio is the median of the ratios of measurements made side by side, with their range in brackets. A point where an engine's measurements disagree by more than {}x is noisy: not a result, left out of the means. fio+ugds: the kernel's fio job with ugds's ioengine (`ioengine=external:libugds_fio.so`) on the ugds node. ugds/kernel p50 below 1 is lower latency for ugds; it compares total latencies (from the submission call to the completion: fio `lat`, `ugds bench`'s call to return), where the columns show the kernel's completion latency (fio `clat`). owned: `ugds bench --queue owned`, each thread's synchronous calls on a queue pair of its own (no lock); QD 1 only (deeper points are batches, which own their queue pair already).",
        repeats::NOISY
    );
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

fn plot(points: &[Value], dir: &Path) -> Result<usize> {
    register_font()?;
    let mut n = 0;
    for backend in ["file", "null"] {
        for rw in RWS {
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
                .build_cartesian_2d(0f64..7.2f64, 0f64..max * 1.1)?;
            chart
                .configure_mesh()
                .x_desc("log2(queue depth or batch size): 0 = 1, 3 = 8, 5 = 32, 7 = 128")
                .y_desc("IOPS")
                .draw()?;
            let colors = [RED, BLUE, GREEN, MAGENTA];
            for (ci, size) in SIZES.iter().enumerate() {
                for (engine, width) in [(UGDS, 3), (FIO_UGDS, 2), (KERNEL, 1)] {
                    let series: Vec<(f64, f64)> = DEPTHS
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
                                .map(|p| ((*d as f64).log2(), f(p, "iops")))
                        })
                        .collect();
                    if series.is_empty() {
                        continue;
                    }
                    let style = colors[ci].stroke_width(width);
                    chart
                        .draw_series(LineSeries::new(series, style))?
                        .label(format!("{engine} {size}"))
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
                }
            }
            // ugds on owned queue pairs: synchronous calls only, so one dot per size at QD 1.
            for (ci, size) in SIZES.iter().enumerate() {
                let owned = points.iter().find(|p| {
                    p["backend"] == backend
                        && p["engine"] == OWNED
                        && p["rw"] == *rw
                        && p["size"] == *size
                        && p["depth"] == 1
                });
                if let Some(p) = owned {
                    let color = colors[ci];
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

fn sh(cmd: &str) -> Result<String> {
    toolchain::output(Command::new("/bin/sh").arg("-c").arg(cmd))
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
        bail!("a depth of 0");
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

/// Which of fio's latencies a point reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Latency {
    /// `clat`: from the submission's return to the completion.
    Completion,
    /// `lat`: from the start of the submission to the completion, as `ugds bench` measures (a
    /// transport that sends in the submitting call, as nvme-tcp can, hides its work from clat).
    Total,
}

/// What every engine runs at one point of a grid, in fio's terms: `rw`, block `size`, queue
/// `depth`, `seconds`, and the working set `span`.
#[derive(Debug, Clone, Copy)]
struct Job<'a> {
    rw: &'a str,
    size: &'a str,
    depth: usize,
    seconds: u64,
    span: &'a str,
}

/// One fio point on a block device (io_uring, O_DIRECT, fixed buffers, registered files):
/// `iops`, `p50_us`, `p99_us` (completion latency).
fn fio_point(dev: &str, job: Job) -> Result<Value> {
    fio_point_with(dev, job, Latency::Completion)
}

/// [`fio_point`] with the latency `lat` names (recorded as the point's `latency`).
fn fio_point_with(dev: &str, job: Job, lat: Latency) -> Result<Value> {
    fio_job(KERNEL, KERNEL_ENGINE, dev, job, lat)
}

/// The kernel path's fio engine options: io_uring, O_DIRECT, fixed buffers, registered files.
const KERNEL_ENGINE: &str = "--ioengine=io_uring --direct=1 --fixedbufs --registerfiles";

/// One fio job (`engine_args`: its ioengine and that engine's options) on `target`, as point
/// `engine`: `iops`, `p50_us`, `p99_us` (the latency `lat` names), and for completion points
/// the total latency's `lat_p50_us` / `lat_p99_us`.
fn fio_job(engine: &str, engine_args: &str, target: &str, job: Job, lat: Latency) -> Result<Value> {
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
fn ugds_point(cli: &str, target: &str, job: Job) -> Result<Value> {
    ugds_point_on(cli, target, job, false)
}

/// [`ugds_point`]; `owned`: synchronous calls on owned queue pairs (`--queue owned`, engine
/// [`OWNED`]).
fn ugds_point_on(cli: &str, target: &str, job: Job, owned: bool) -> Result<Value> {
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

/// Guest side: every engine on both controllers, one JSON line per measurement (with its
/// `repeat`), the kernel's and ours interleaved at every point (the controller rebound between).
pub fn guest(cli: &str, fio_engine: &str, seconds: u64, repeats: usize) -> Result<()> {
    if !Path::new("/sys/module/ugds").exists() {
        sh(&format!("insmod {}", std::env::var("UGDS_KMOD").context("UGDS_KMOD")?))?;
    }
    let ours = format!("--ioengine=external:{fio_engine}");
    for (addr, backend) in bind::nvme_controllers()?.into_iter().zip(["file", "null"]) {
        let blk = || bind::first_namespace(&addr).with_context(|| format!("no block device on {addr}"));
        // Fill the working set once, so reads of the file-backed drive read data.
        if backend == "file" {
            sh(&format!(
                "fio --name=fill --filename={} --ioengine=io_uring --direct=1 --rw=write --bs=1M --size=1G --output=/dev/null",
                blk()?
            ))?;
        }
        let mut on_ugds = false;
        let emit = |mut v: Value, repeat: usize| {
            v["backend"] = json!(backend);
            v["repeat"] = json!(repeat);
            println!("{MARK}{v}");
        };
        for rw in RWS {
            for size in SIZES {
                for &depth in DEPTHS {
                    let job = Job { rw, size, depth, seconds, span: "1G" };
                    for (repeat, ugds_side) in repeats::order(repeats, on_ugds) {
                        if ugds_side != on_ugds {
                            if ugds_side {
                                bind::bind(&addr)?;
                            } else {
                                bind::unbind(&addr)?;
                            }
                            on_ugds = ugds_side;
                        }
                        if !ugds_side {
                            emit(fio_point(&blk()?, job)?, repeat);
                            continue;
                        }
                        let node =
                            bind::ugds_nodes(&addr).first().map(|n| format!("/dev/{n}")).context("no ugds node")?;
                        emit(ugds_point(cli, &node, job)?, repeat);
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
        if on_ugds {
            bind::unbind(&addr)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{add_ratios, plot, repeats, table, FIO_UGDS, KEYS, OWNED};
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
        let t = table(&grid(), &json!({}), 2, 1);
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
        assert_eq!(plot(&grid(), dir.path()).unwrap(), 4);
        let png = std::fs::read(dir.path().join("iops-null-randread.png")).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
    }
}

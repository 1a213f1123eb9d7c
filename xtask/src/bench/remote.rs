//! `cargo xtask bench --remote tcp|rdma`: our NVMe over Fabrics initiator (`ugds bench` on an
//! `nvmeof://` URI) against the kernel's initiator (nvme-tcp or nvme-rdma, with fio io_uring
//! O_DIRECT on its `/dev/nvmeXnY`) on the same target in one VM: the kernel's nvmet, its
//! namespace backed by an emulated NVMe disk, on loopback (TCP) or on a soft-RoCE device bound
//! to a dummy interface (RDMA). Writes JSON, CSV, a markdown table with ratios per point and
//! geometric means, and PNG plots.
//!
//! Each point is measured `repeats` times per engine, the engines alternating on the same
//! target (both initiators stay connected), and reports medians, the median of the per-repeat
//! ratios with its range, and `noisy` where an engine's repeats disagree (see `repeats`).
//!
//! `ugds bench --depth N` keeps N requests in its batch; the batch holds I/O queues (TCP
//! connections, RDMA queue pairs) of its own with every request's commands in flight. The guest samples the
//! TCP connections ugds holds to the target during each point and records the I/O queues among
//! them next to the requested depth.

use super::repeats::{self, Ratio};
use super::volume::spread;
use super::{check_axes, f, json_nums, json_strs, points_from, register_font};
use crate::{kernel, toolchain, vm};
use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod guest;
pub use guest::guest;

/// The subsystem the target exports.
const NQN: &str = "nqn.2024-01.io.ugds:bench";
/// The target's service id (both transports).
const PORT: u16 = 4420;
/// The dummy interface's address, which the soft-RoCE device carries (RDMA).
const RDMA_ADDR: &str = "10.77.0.1";
const CONFIGFS: &str = "/sys/kernel/config/nvmet";
/// Bytes of the emulated disk behind the target.
const DISK_BYTES: u64 = 2 << 30;

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    /// `tcp` or `rdma`.
    pub transport: String,
    /// I/O sizes (`4K`, `1M`).
    pub sizes: Vec<String>,
    /// Queue depths (fio `iodepth`; `ugds bench --depth`).
    pub depths: Vec<usize>,
    /// `randread` and/or `randwrite`.
    pub rws: Vec<String>,
    /// The emulated disk behind the target: `file` or `null`.
    pub backend: String,
    /// Seconds per point.
    pub seconds: u64,
    /// Working set (random offsets within it).
    pub span: u64,
    /// Measurements per engine and point, interleaved.
    pub repeats: usize,
    /// CPUs both engines' processes are confined to (a list as taskset and fio's
    /// `cpus_allowed` take it, e.g. `1` or `0-1`); `None`: wherever the scheduler puts them.
    /// The kernel's own threads (the initiator's and the target's workers) are never pinned.
    pub cpus: Option<String>,
}

impl Grid {
    /// Checks the grid.
    pub fn checked(self) -> Result<Grid> {
        if !matches!(self.transport.as_str(), "tcp" | "rdma") {
            bail!("--remote takes tcp or rdma, not {}", self.transport);
        }
        if !matches!(self.backend.as_str(), "file" | "null") {
            bail!("--backend with --remote takes file or null, not {}", self.backend);
        }
        if self.span > DISK_BYTES {
            bail!("--span is larger than the target's {} disk", ugds::units::human(DISK_BYTES));
        }
        check_axes(&self.sizes, &self.depths, &self.rws, self.span)?;
        if self.repeats == 0 {
            bail!("--repeats must be at least 1");
        }
        if let Some(c) = &self.cpus {
            // Every CPU the guest has, in ranges that ascend: taskset refuses a range that does
            // not, and a CPU the guest lacks would fail fio's points while taskset drops it.
            let cpu = |n: &str| n.bytes().all(|b| b.is_ascii_digit()).then(|| n.parse::<u32>().ok()).flatten();
            let ok = c.split(',').all(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                matches!((cpu(a), cpu(b)), (Some(a), Some(b)) if a <= b && b < vm::GUEST_CPUS)
            });
            if !ok {
                bail!(
                    "--cpus takes a list of the guest's CPUs (0 to {}) such as 1 or 0-1, not {c:?}",
                    vm::GUEST_CPUS - 1
                );
            }
        }
        Ok(self)
    }

    /// Points per engine.
    pub fn points(&self) -> usize {
        self.sizes.len() * self.depths.len() * self.rws.len()
    }

    /// As JSON (what the guest gets, and what the results record).
    pub fn to_json(&self) -> Value {
        json!({"transport": self.transport, "sizes": self.sizes, "depths": self.depths, "rws": self.rws,
               "backend": self.backend, "seconds": self.seconds, "span": self.span, "repeats": self.repeats,
               "cpus": self.cpus})
    }

    /// From [`Grid::to_json`]'s form.
    pub fn from_json(v: &Value) -> Result<Grid> {
        let str1 = |k: &str| v[k].as_str().map(str::to_string).with_context(|| format!("grid: no {k}"));
        let num = |k: &str| v[k].as_u64().with_context(|| format!("grid: no {k}"));
        Grid {
            transport: str1("transport")?,
            sizes: json_strs(v, "sizes")?,
            depths: json_nums(v, "depths")?,
            rws: json_strs(v, "rws")?,
            backend: str1("backend")?,
            seconds: num("seconds")?,
            span: num("span")?,
            // CAST: a small count.
            repeats: v["repeats"].as_u64().unwrap_or(1) as usize,
            cpus: v["cpus"].as_str().map(str::to_string),
        }
        .checked()
    }

    /// The target's address on this transport.
    pub(crate) fn address(&self) -> &'static str {
        if self.transport == "rdma" {
            RDMA_ADDR
        } else {
            "127.0.0.1"
        }
    }

    /// The URI our initiator opens.
    pub(crate) fn uri(&self) -> String {
        format!("nvmeof://{}/{}:{PORT}/{NQN}?nsid=1", self.transport, self.address())
    }
}

/// Host side: build, boot one VM, collect the points, write the results. `baseline`: another
/// build's `ugds` CLI, whose `ugds bench` runs in ugds's turns too (engine `ugds-baseline`,
/// compared with ours point by point, as in the main grid).
pub fn run(grid: &Grid, out: Option<PathBuf>, baseline: Option<&Path>) -> Result<()> {
    let t = Instant::now();
    let root = toolchain::workspace_root();
    let baseline = baseline.map(super::baseline::checked).transpose()?;
    toolchain::setup_and_build_release(&["-p", "ugds-cli", "--bins"])?;
    let k = kernel::Choice::Test612.ensure()?;
    let cli = root.join("target/release/ugds");
    let me = std::env::current_exe()?;
    let spec = format!("size={}M,lbs=4096,backend={},serial=rbench0", DISK_BYTES >> 20, grid.backend);
    let engines = 2 + usize::from(baseline.is_some());
    let points_total = engines * grid.points() * grid.repeats;
    // Under TCG a point costs its seconds plus a few for fio or the CLI to start and warm up.
    let estimate = points_total as u64 * (grid.seconds + 4);
    let cfg = vm::VmConfig {
        nvme: vec![spec.parse()?],
        iommu: false,
        bind_module: None,
        mem: "3G".into(),
        timeout: Duration::from_secs((estimate * 3).max(1800)),
        env: k.suite_env(),
        cmd: vec![
            me.display().to_string(),
            "bench-remote-guest".into(),
            cli.display().to_string(),
            grid.to_json().to_string(),
        ]
        .into_iter()
        .chain(baseline.iter().map(|b| format!("--baseline-cli={}", b.display())))
        .collect(),
        p2p: None,
    };
    eprintln!(
        "bench: booting the VM ({points_total} points over {}: {} sizes x {} depths x {} rw x {engines} engines x {} \
         repeats, {} s each; about {} min)",
        grid.transport,
        grid.sizes.len(),
        grid.depths.len(),
        grid.rws.len(),
        grid.repeats,
        grid.seconds,
        estimate.div_ceil(60)
    );
    let host = super::host::HostRun::start();
    let outcome = vm::run(&cfg, &k, true)?;
    let host = host.finish();
    if outcome.code != 0 {
        bail!("the remote benchmark failed in the VM (exit {})", outcome.code);
    }
    let mut measurements = points_from(&outcome.output)?;
    let (points, versus) = merged(grid, &mut measurements);
    let dir = out.unwrap_or_else(|| root.join("target/bench-remote"));
    std::fs::create_dir_all(&dir)?;
    let stem = format!("remote-results-{}", grid.transport);
    let mut all = json!({ "grid": grid.to_json(), "points": points, "measurements": measurements,
                      "noisy_above": repeats::NOISY, "vm_seconds": t.elapsed().as_secs(), "host": host.json() });
    if let Some(b) = &baseline {
        all["baseline_cli"] = json!(b.display().to_string());
    }
    std::fs::write(dir.join(format!("{stem}.json")), serde_json::to_string_pretty(&all)?)?;
    std::fs::write(dir.join(format!("{stem}.csv")), csv(grid, &points))?;
    let mut md = table(grid, &points);
    if let Some(b) = &baseline {
        md.push_str(&super::baseline::table(&points, &versus, b));
    }
    md.push_str(&host.markdown());
    std::fs::write(dir.join(format!("{stem}.md")), &md)?;
    let plots = plot(grid, &points, &dir)?;
    println!("{md}");
    println!("wrote {stem}.json, .csv, .md and {plots} plot(s) to {} in {:.0?}", dir.display(), t.elapsed());
    host.warn();
    Ok(())
}

/// Every engine's points from `measurements` (each given the grid's backend, the controller
/// column of the baseline's table), ours annotated with the baseline's ratios where it ran.
fn merged(grid: &Grid, measurements: &mut [Value]) -> (Vec<Value>, Vec<super::baseline::Versus>) {
    for m in measurements.iter_mut() {
        m["backend"] = json!(grid.backend);
    }
    let mut points = repeats::merge(measurements, &["rw", "size", "depth"]);
    let versus = super::baseline::compare(measurements, &points, super::KEYS);
    super::baseline::annotate(&mut points, &versus);
    (points, versus)
}

fn find<'a>(points: &'a [Value], engine: &str, rw: &str, size: &str, depth: usize) -> Option<&'a Value> {
    points.iter().find(|p| p["engine"] == engine && p["rw"] == rw && p["size"] == size && p["depth"] == depth)
}

/// Both engines' figures at one point, when both measured it.
fn pair<'a>(points: &'a [Value], rw: &str, size: &str, depth: usize) -> Option<(&'a Value, &'a Value)> {
    let k = find(points, "kernel", rw, size, depth).filter(|p| p.get("error").is_none())?;
    let u = find(points, "ugds", rw, size, depth).filter(|p| p.get("error").is_none())?;
    Some((k, u))
}

/// ugds/kernel IOPS (the median of the repeats' ratios, with their range and whether the
/// repeats disagree) and p50 latency (of the medians; only when both engines report one).
fn ratios(k: &Value, u: &Value) -> (Ratio, Option<f64>) {
    let p50 = (f(k, "p50_us") > 0.0 && f(u, "p50_us") > 0.0).then(|| f(u, "p50_us") / f(k, "p50_us"));
    (repeats::ratio(u, k), p50)
}

/// The geometric mean of the IOPS ratios that are results `g (lo–hi)`, and how many were noisy.
fn ratio_summary(rs: &[Ratio]) -> String {
    let good: Vec<f64> = rs.iter().filter(|r| !r.noisy).map(|r| r.median).collect();
    let (_, noisy) = repeats::summary(rs);
    let mut c = spread_cell(&good);
    if noisy > 0 {
        let _ = write!(c, ", {noisy} noisy");
    }
    c
}

/// `g (lo–hi)` or `–`.
fn spread_cell(v: &[f64]) -> String {
    spread(v).map_or_else(|| "–".into(), |(g, lo, hi)| format!("{g:.2}x ({lo:.2}–{hi:.2})"))
}

/// The markdown: geometric means per rw (all points, and per size), then every point.
pub fn table(grid: &Grid, points: &[Value]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n### NVMe over Fabrics, {}: ugds initiator vs the kernel's (fio io_uring O_DIRECT)\n\n\
         Geometric means over the points both engines measured (min–max), noisy points left out of the IOPS \
         mean; a point's IOPS ratio is the median of its {} repeats' ratios (their range), `noisy` where an \
         engine's repeats differ by more than {}x; p50 below 1 is lower latency for ugds.\n\n\
         | rw | sizes | points | ugds/kernel IOPS | ugds/kernel p50 |\n| --- | --- | ---: | ---: | ---: |",
        grid.transport,
        grid.repeats,
        repeats::NOISY
    );
    for rw in &grid.rws {
        let mut groups: Vec<(String, Vec<&String>)> = vec![("all".into(), grid.sizes.iter().collect())];
        groups.extend(grid.sizes.iter().map(|s| (s.clone(), vec![s])));
        for (name, sizes) in groups {
            let rs: Vec<(Ratio, Option<f64>)> = sizes
                .iter()
                .flat_map(|size| grid.depths.iter().map(move |d| (*size, *d)))
                .filter_map(|(size, d)| pair(points, rw, size, d).map(|(k, u)| ratios(k, u)))
                .collect();
            let iops: Vec<Ratio> = rs.iter().map(|r| r.0).collect();
            let p50: Vec<f64> = rs.iter().filter_map(|r| r.1).collect();
            let _ = writeln!(s, "| {rw} | {name} | {} | {} | {} |", rs.len(), ratio_summary(&iops), spread_cell(&p50));
        }
    }
    let _ = writeln!(
        s,
        "\n| rw | size | QD | kernel IOPS | ugds IOPS | ugds/kernel IOPS | kernel p50 us | ugds p50 us | ugds/kernel p50 | kernel p99 us | ugds p99 us | ugds I/O queues |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    // Each engine's figures where it has them; a failed point names its error in a footnote.
    let mut errors: Vec<String> = Vec::new();
    for rw in &grid.rws {
        for size in &grid.sizes {
            for &depth in &grid.depths {
                let mut cells = |engine: &str| -> [String; 3] {
                    match find(points, engine, rw, size, depth) {
                        Some(p) if p.get("error").is_none() => {
                            ["iops", "p50_us", "p99_us"].map(|k| format!("{:.0}", f(p, k)))
                        }
                        found => {
                            let why = found.and_then(|p| p["error"].as_str()).map(|e| {
                                let n = errors.iter().position(|x| x == e).unwrap_or_else(|| {
                                    errors.push(e.to_string());
                                    errors.len() - 1
                                });
                                format!("failed [{}]", n + 1)
                            });
                            [why.unwrap_or_else(|| "–".into()), "–".into(), "–".into()]
                        }
                    }
                };
                let ([ki, k50, k99], [ui, u50, u99]) = (cells("kernel"), cells("ugds"));
                let (ri, rp) = pair(points, rw, size, depth).map(|(k, u)| ratios(k, u)).unzip();
                let ratio = |r: Option<f64>| r.map_or_else(|| "–".into(), |r| format!("{r:.2}x"));
                let queues = find(points, "ugds", rw, size, depth).and_then(|u| u["io_queues"].as_u64());
                let _ = writeln!(
                    s,
                    "| {rw} | {size} | {depth} | {ki} | {ui} | {} | {k50} | {u50} | {} | {k99} | {u99} | {} |",
                    ri.map_or_else(|| "–".into(), repeats::cell),
                    ratio(rp.flatten()),
                    queues.map_or_else(|| "–".into(), |q| q.to_string())
                );
            }
        }
    }
    let stalls = |engine: &str, k: &str| -> Option<u64> {
        let v: Vec<u64> = points.iter().filter(|p| p["engine"] == engine).filter_map(|p| p[k].as_u64()).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    };
    if let (Some(kr), Some(ur)) = (stalls("kernel", "tcp_retransmits"), stalls("ugds", "tcp_retransmits")) {
        let _ = writeln!(
            s,
            "\nTCP during the kernel's points (the first measurement of each): {kr} segments retransmitted, {} retransmission timeouts, {} zero \
             windows advertised, {} window probes; during ugds's: {ur}, {}, {}, {}.",
            stalls("kernel", "tcp_timeouts").unwrap_or(0),
            stalls("kernel", "tcp_zero_windows").unwrap_or(0),
            stalls("kernel", "tcp_window_probes").unwrap_or(0),
            stalls("ugds", "tcp_timeouts").unwrap_or(0),
            stalls("ugds", "tcp_zero_windows").unwrap_or(0),
            stalls("ugds", "tcp_window_probes").unwrap_or(0)
        );
    }
    for (i, e) in errors.iter().enumerate() {
        let _ = writeln!(s, "\n[{}] {e}", i + 1);
    }
    let _ = writeln!(
        s,
        "\nTarget: the kernel's nvmet over {} on {}, namespace backed by a {} {}-backed emulated NVMe disk; \
         working set {}, {} s per point. Latency is from submission to completion for both (fio's total \
         `lat`, not `clat`: nvme-tcp may send in the submitting call). The kernel initiator keeps QD I/Os in \
         flight (fio iodepth); ugds keeps QD requests in its batch, {}.",
        grid.transport,
        grid.address(),
        ugds::units::human(DISK_BYTES),
        grid.backend,
        ugds::units::human(grid.span),
        grid.seconds,
        if grid.transport == "tcp" {
            "all in flight on the batch's own I/O queues (the last column: the most TCP connections ugds held \
             to the target during the point, less the admin queue; – where not sampled)"
        } else {
            "all in flight on the batch's own I/O queues (RDMA queue pairs; their number is not sampled)"
        }
    );
    if let Some(c) = &grid.cpus {
        let _ = writeln!(
            s,
            "\nBoth engines' processes ran on CPU list {c} alone (fio's `cpus_allowed`, `taskset` for each \
             `ugds bench`, the baseline's too); the kernel's own workers (the initiator's and the target's) \
             are not confined by it."
        );
    }
    s
}

/// One line per point: both engines' figures, the ratios, and why a figure is missing.
pub fn csv(grid: &Grid, points: &[Value]) -> String {
    let mut s = String::from(
        "transport,rw,size,depth,kernel_iops,ugds_iops,iops_ratio,iops_ratio_min,iops_ratio_max,noisy,kernel_p50_us,ugds_p50_us,p50_ratio,\
         kernel_p99_us,ugds_p99_us,ugds_io_queues,kernel_tcp_retransmits,ugds_tcp_retransmits,kernel_error,ugds_error\n",
    );
    let num = |p: Option<&Value>, k: &str| {
        p.filter(|p| p.get("error").is_none()).map_or_else(String::new, |p| format!("{:.1}", f(p, k)))
    };
    let count = |p: Option<&Value>, k: &str| p.and_then(|p| p[k].as_u64()).map_or_else(String::new, |n| n.to_string());
    // Errors are free text: quoted, inner quotes doubled.
    let err = |p: Option<&Value>| {
        p.and_then(|p| p["error"].as_str()).map_or_else(String::new, |e| format!("\"{}\"", e.replace('"', "\"\"")))
    };
    for rw in &grid.rws {
        for size in &grid.sizes {
            for &depth in &grid.depths {
                let (k, u) = (find(points, "kernel", rw, size, depth), find(points, "ugds", rw, size, depth));
                let (ri, rp) = pair(points, rw, size, depth).map(|(k, u)| ratios(k, u)).unzip();
                let _ = writeln!(
                    s,
                    "{},{rw},{size},{depth},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                    grid.transport,
                    num(k, "iops"),
                    num(u, "iops"),
                    ri.map_or_else(String::new, |r| format!("{:.3}", r.median)),
                    ri.map_or_else(String::new, |r| format!("{:.3}", r.min)),
                    ri.map_or_else(String::new, |r| format!("{:.3}", r.max)),
                    ri.map_or_else(String::new, |r| r.noisy.to_string()),
                    num(k, "p50_us"),
                    num(u, "p50_us"),
                    rp.flatten().map_or_else(String::new, |r| format!("{r:.3}")),
                    num(k, "p99_us"),
                    num(u, "p99_us"),
                    u.and_then(|u| u["io_queues"].as_u64()).map_or_else(String::new, |q| q.to_string()),
                    count(k, "tcp_retransmits"),
                    count(u, "tcp_retransmits"),
                    err(k),
                    err(u)
                );
            }
        }
    }
    s
}

/// One PNG per rw: IOPS (log) against queue depth, ugds thick and the kernel thin, one colour
/// per size; and the ugds/kernel IOPS ratio against queue depth.
fn plot(grid: &Grid, points: &[Value], dir: &Path) -> Result<usize> {
    register_font()?;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    let x = |d: usize| (d as f64).log2();
    let xmax = grid.depths.iter().copied().max().map_or(1.0, x) + 0.3;
    let mut n = 0;
    for rw in &grid.rws {
        let series = |engine: &str, size: &str| -> Vec<(f64, f64)> {
            grid.depths
                .iter()
                .filter_map(|&d| {
                    find(points, engine, rw, size, d)
                        .filter(|p| p.get("error").is_none())
                        .map(|p| (x(d), f(p, "iops").max(1.0)))
                })
                .collect()
        };
        let ratio = |size: &str| -> Vec<(f64, f64)> {
            grid.depths
                .iter()
                .filter_map(|&d| pair(points, rw, size, d).map(|(k, u)| (x(d), ratios(k, u).0.median)))
                .collect()
        };
        let all: Vec<f64> =
            grid.sizes.iter().flat_map(|s| [series("ugds", s), series("kernel", s)]).flatten().map(|p| p.1).collect();
        let rs: Vec<f64> = grid.sizes.iter().flat_map(|s| ratio(s)).map(|p| p.1).collect();
        if all.is_empty() {
            continue;
        }
        let path = dir.join(format!("remote-{}-{rw}.png", grid.transport));
        let root = BitMapBackend::new(&path, (1300, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(
            &format!(
                "{rw} over NVMe/{}: ugds initiator (thick) vs kernel initiator + fio (thin)",
                grid.transport.to_uppercase()
            ),
            ("sans-serif", 22),
        )?;
        let (left, right) = root.split_horizontally(650);
        let (lo, hi) = (all.iter().copied().fold(f64::MAX, f64::min), all.iter().copied().fold(1.0, f64::max));
        let depth_label = |v: &f64| {
            let d = v.exp2();
            if (d - d.round()).abs() < 1e-6 && grid.depths.contains(&(d.round() as usize)) {
                format!("{d:.0}")
            } else {
                String::new()
            }
        };
        let mut c1 = ChartBuilder::on(&left)
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.3f64..xmax, ((lo / 2.0).max(1.0)..hi * 2.0).log_scale())?;
        c1.configure_mesh()
            .x_desc("queue depth (log2 axis)")
            .y_desc("IOPS (log)")
            .x_label_formatter(&depth_label)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        let rmax = rs.iter().copied().fold(1.0, f64::max);
        let mut c2 = ChartBuilder::on(&right)
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.3f64..xmax, 0f64..rmax * 1.15)?;
        c2.configure_mesh()
            .x_desc("queue depth (log2 axis)")
            .y_desc("ugds IOPS / kernel IOPS")
            .x_label_formatter(&depth_label)
            .draw()?;
        c2.draw_series(LineSeries::new([(-0.3, 1.0), (xmax, 1.0)], BLACK.mix(0.6).stroke_width(2)))?
            .label("equal")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.6).stroke_width(2)));
        for (ci, size) in grid.sizes.iter().enumerate() {
            let color = colors[ci % colors.len()];
            for (engine, width) in [("ugds", 3), ("kernel", 1)] {
                let style = color.stroke_width(width);
                c1.draw_series(LineSeries::new(series(engine, size), style))?
                    .label(format!("{engine} {size}"))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            }
            let style = color.stroke_width(2);
            c2.draw_series(LineSeries::new(ratio(size), style))?
                .label(size.to_string())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        c1.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
        c2.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
        root.present()?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Grid {
        Grid {
            transport: "tcp".into(),
            sizes: vec!["4K".into(), "1M".into()],
            depths: vec![1, 32],
            rws: vec!["randread".into()],
            backend: "null".into(),
            seconds: 1,
            span: 1 << 30,
            repeats: 1,
            cpus: None,
        }
        .checked()
        .unwrap()
    }

    /// With a baseline CLI, its measurements pair with ours by repeat and give the ugds/baseline
    /// table; the kernel's table is unchanged by them.
    #[test]
    fn a_baseline_clis_points_are_compared_with_ours_by_repeat() {
        let g = grid();
        let m = |engine: &str, repeat: u64, iops: f64| {
            json!({"engine": engine, "rw": "randread", "size": "4K", "depth": 1, "repeat": repeat,
                   "iops": iops, "p50_us": 1e6 / iops, "p99_us": 2e6 / iops})
        };
        let mut raw = vec![
            m("kernel", 0, 1000.0),
            m("ugds", 0, 2000.0),
            m("ugds-baseline", 0, 1000.0),
            m("kernel", 1, 1000.0),
            m("ugds-baseline", 1, 1250.0),
            m("ugds", 1, 2500.0),
        ];
        let (points, versus) = merged(&g, &mut raw);
        assert_eq!(versus.len(), 1);
        let ours = points.iter().find(|p| p["engine"] == "ugds").unwrap();
        assert_eq!(ours["baseline_iops_ratio"], json!(2.0), "{ours}");
        let md = super::super::baseline::table(&points, &versus, Path::new("/old/ugds"));
        assert!(md.contains("| null | randread | 4K | 1 | 2250 | 1125 | 2.00x"), "{md}");
        let t = table(&g, &points);
        assert!(t.contains("| randread | 4K | 1 | 1000 | 2250 | 2.25x"), "{t}");
    }

    #[test]
    fn the_grid_is_checked_and_round_trips() {
        let g = grid();
        assert_eq!(g.points(), 4);
        assert_eq!(Grid::from_json(&g.to_json()).unwrap(), g);
        assert_eq!(g.uri(), "nvmeof://tcp/127.0.0.1:4420/nqn.2024-01.io.ugds:bench?nsid=1");
        let r = Grid { transport: "rdma".into(), ..grid() }.checked().unwrap();
        assert_eq!(r.uri(), "nvmeof://rdma/10.77.0.1:4420/nqn.2024-01.io.ugds:bench?nsid=1");
        let bad = |f: fn(&mut Grid)| {
            let mut g = grid();
            f(&mut g);
            g.checked().is_err()
        };
        assert!(bad(|g| g.transport = "fc".into()));
        assert!(bad(|g| g.backend = "both".into()));
        assert!(bad(|g| g.sizes = vec!["3000".into()]));
        assert!(bad(|g| g.sizes = vec!["2G".into()]));
        assert!(bad(|g| g.depths = vec![0]));
        assert!(bad(|g| g.rws = vec!["read".into()]));
        assert!(bad(|g| g.span = 4 << 30));
        assert!(bad(|g| g.depths.clear()));
        assert!(bad(|g| g.repeats = 0));
        for cpus in ["", "1,", "a", "0-", "1 2", "1;reboot", "1-0", "2", "0-3", "0-1-1", "+1"] {
            let mut g = grid();
            g.cpus = Some(cpus.into());
            assert!(g.checked().is_err(), "{cpus:?}");
        }
        for cpus in ["1", "0-1", "0,1", "1-1"] {
            assert!(Grid { cpus: Some(cpus.into()), ..grid() }.checked().is_ok(), "{cpus:?}");
        }
        let pinned = Grid { cpus: Some("0,1".into()), ..grid() }.checked().unwrap();
        assert_eq!(Grid::from_json(&pinned.to_json()).unwrap(), pinned);
        assert!(table(&pinned, &[]).contains("ran on CPU list 0,1 alone"));
        assert!(!table(&grid(), &[]).contains("ran on CPU list"));
    }

    fn point(engine: &str, size: &str, depth: usize, iops: f64, p50: f64) -> Value {
        json!({"engine": engine, "rw": "randread", "size": size, "depth": depth, "iops": iops,
               "p50_us": p50, "p99_us": 2.0 * p50, "io_queues": 8, "tcp_retransmits": 3, "tcp_timeouts": 0})
    }

    #[test]
    fn the_table_and_csv_have_ratios_means_and_errors_by_name() {
        let g = grid();
        let mut pts = vec![
            point("kernel", "4K", 1, 1000.0, 100.0),
            point("ugds", "4K", 1, 2000.0, 50.0),
            point("kernel", "4K", 32, 4000.0, 400.0),
            point("ugds", "4K", 32, 2000.0, 400.0),
            point("kernel", "1M", 1, 100.0, 1000.0),
        ];
        pts.push(json!({"engine": "ugds", "rw": "randread", "size": "1M", "depth": 1,
                        "error": "ugds bench exited with 1: \"rdma\" is not implemented"}));
        let t = table(&g, &pts);
        assert!(t.contains("| randread | 4K | 1 | 1000 | 2000 | 2.00x | 100 | 50 | 0.50x | 200 | 100 | 8 |"), "{t}");
        assert!(t.contains("| randread | 4K | 32 | 4000 | 2000 | 0.50x | 400 | 400 | 1.00x |"), "{t}");
        // The geometric mean of 2 and 0.5 is 1; of p50 0.5 and 1, 0.71.
        assert!(t.contains("| randread | all | 2 | 1.00x (0.50–2.00) | 0.71x (0.50–1.00) |"), "{t}");
        assert!(t.contains("| randread | 1M | 0 | – | – |"), "{t}");
        assert!(t.contains("| randread | 1M | 1 | 100 | failed [1] | – | 1000 | – | – | 2000 | – | – |"), "{t}");
        assert!(t.contains("\n[1] ugds bench exited with 1: \"rdma\" is not implemented\n"), "{t}");
        assert!(t.contains("all in flight on the batch's own I/O queues"), "{t}");
        let r = table(&Grid { transport: "rdma".into(), ..g.clone() }, &pts);
        assert!(r.contains("own I/O queues (RDMA queue pairs") && !r.contains("TCP connections"), "{r}");
        assert!(t.contains("| randread | 1M | 32 | – | – | – | – | – | – | – | – | – |"), "{t}");
        assert!(t.contains("during the kernel's points (the first measurement of each): 9 segments retransmitted, 0 retransmission timeouts, 0 zero windows advertised, 0 window probes; during ugds's: 6, 0, 0, 0."), "{t}");
        let c = csv(&g, &pts);
        assert_eq!(c.lines().count(), 5, "{c}");
        assert!(
            c.contains(
                "\ntcp,randread,4K,1,1000.0,2000.0,2.000,2.000,2.000,false,100.0,50.0,0.500,200.0,100.0,8,3,3,,\n"
            ),
            "{c}"
        );
        assert!(c.contains("\ntcp,randread,1M,1,100.0,,,,,,1000.0,,,2000.0,,,3,,,\"ugds bench exited with 1: \"\"rdma\"\" is not implemented\"\n"), "{c}");
    }

    /// Repeats merge into medians; a point whose repeats disagree is noisy, shown as such and
    /// left out of the mean.
    #[test]
    fn repeats_give_median_ratios_and_noisy_points_stay_out_of_the_mean() {
        let g = Grid { repeats: 3, ..grid() };
        let m = |engine: &str, size: &str, r: usize, iops: f64| {
            let mut p = point(engine, size, 1, iops, 10.0);
            p["repeat"] = json!(r);
            p
        };
        let raw = vec![
            m("kernel", "4K", 0, 100.0),
            m("ugds", "4K", 0, 300.0),
            m("ugds", "4K", 1, 200.0),
            m("kernel", "4K", 1, 100.0),
            m("kernel", "4K", 2, 100.0),
            m("ugds", "4K", 2, 250.0),
            m("kernel", "1M", 0, 100.0),
            m("ugds", "1M", 0, 50.0),
            m("ugds", "1M", 1, 400.0),
            m("kernel", "1M", 1, 100.0),
            m("kernel", "1M", 2, 100.0),
            m("ugds", "1M", 2, 100.0),
        ];
        let pts = repeats::merge(&raw, &["rw", "size", "depth"]);
        let t = table(&g, &pts);
        assert!(t.contains("| randread | 4K | 1 | 100 | 250 | 2.50x (2.00–3.00) |"), "{t}");
        assert!(t.contains("| randread | 1M | 1 | 100 | 100 | noisy (0.50–4.00) |"), "{t}");
        assert!(t.contains("| randread | all | 2 | 2.50x (2.50–2.50), 1 noisy |"), "{t}");
    }

    #[test]
    fn plots_are_written() {
        if !Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
            return;
        }
        let g = grid();
        let pts: Vec<Value> = [1, 32]
            .iter()
            .flat_map(|&d| {
                ["4K", "1M"].map(|s| [point("kernel", s, d, 1000.0 * d as f64, 9.0), point("ugds", s, d, 3000.0, 3.0)])
            })
            .flatten()
            .collect();
        let dir = vm::TempDir::new("ugds-bench-remote-plot").unwrap();
        assert_eq!(plot(&g, &pts, dir.path()).unwrap(), 1);
        let png = std::fs::read(dir.path().join("remote-tcp-randread.png")).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
    }
}

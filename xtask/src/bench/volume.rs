//! `cargo xtask bench --members 1,2,4`: a striped ugds volume against the kernel's md RAID0 (fio,
//! io_uring, O_DIRECT) over the same emulated controllers, per member count; one VM boot with as
//! many controllers per backend as the largest member count. Each point is measured `--repeats`
//! times per engine, the engines taking turns (see [`super::repeats`]): the controllers move
//! between the kernel's nvme driver (md) and ugds at each turn, which costs a rebind per round,
//! outside the measured time. Writes JSON, a markdown table with median ratios, their range and
//! scaling per point, and PNG scaling plots (members on the x axis). With `--baseline-cli`,
//! another build's `ugds bench` runs on the same volume in ugds's turns (engine
//! `ugds-baseline`, see [`super::baseline`]).

use super::repeats::{self, Ratio};
use super::{
    check_axes, f, fio_point, json_nums, json_strs, p50_ratio, points_from, register_font, reserve_hugepages, sh,
    total_p50, ugds_point, Job, BASELINE, HUGEPAGES, MARK,
};
use crate::{bind, kernel, kmod, toolchain, vm};
use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Bytes per emulated controller (each member uses at most `span` of it).
const CONTROLLER_BYTES: u64 = 2 << 30;
/// What a point is, besides its engine (the keys its repeats are merged on).
const KEYS: &[&str] = &["backend", "members", "rw", "size", "depth"];

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    /// Member counts, ascending.
    pub members: Vec<usize>,
    /// I/O sizes (`4K`, `1M`).
    pub sizes: Vec<String>,
    /// Queue depths (fio `iodepth`; `ugds bench --depth`).
    pub depths: Vec<usize>,
    /// `randread` and/or `randwrite`.
    pub rws: Vec<String>,
    /// `file` and/or `null`.
    pub backends: Vec<String>,
    /// Seconds per point.
    pub seconds: u64,
    /// Working set over the volume (random offsets within it).
    pub span: u64,
    /// Chunk size (ugds volume and md RAID0 alike).
    pub chunk: u64,
    /// Measurements per engine and point, the engines taking turns.
    pub repeats: usize,
}

/// The volume and remote grids' sizes unless `--sizes` says ([`super::Axes::volume`]).
pub const DEFAULT_SIZES: &[&str] = &["4K", "64K", "128K", "1M"];
/// The volume and remote grids' depths unless `--depths` says.
pub const DEFAULT_DEPTHS: &[usize] = &[1, 32, 128];

impl Grid {
    /// Checks the grid and puts member counts in order.
    pub fn checked(mut self) -> Result<Grid> {
        self.members.sort_unstable();
        self.members.dedup();
        match (self.members.first(), self.members.last()) {
            (Some(&lo), Some(&hi)) if lo >= 1 && hi <= 8 => {}
            _ => bail!("--members takes counts from 1 to 8 (e.g. 1,2,4)"),
        }
        check_axes(&self.sizes, &self.depths, &self.rws, self.span)?;
        if self.backends.is_empty() {
            bail!("the grid is empty (--backend needs a value)");
        }
        if self.repeats == 0 {
            bail!("--repeats must be at least 1");
        }
        if let Some(b) = self.backends.iter().find(|b| !matches!(b.as_str(), "file" | "null")) {
            bail!("--backend takes file, null or both, not {b}");
        }
        if self.chunk < 4096 || !self.chunk.is_power_of_two() {
            bail!("--chunk must be a power of two of at least 4K");
        }
        if self.span > CONTROLLER_BYTES || !self.span.is_multiple_of(self.chunk * 8) {
            bail!("--span must be a multiple of 8 chunks and at most {} (one controller)", CONTROLLER_BYTES >> 20);
        }
        Ok(self)
    }

    /// Controllers per backend: the largest member count.
    pub fn controllers(&self) -> usize {
        self.members.iter().copied().max().unwrap_or(1)
    }

    /// Points per engine per backend.
    pub fn points(&self) -> usize {
        self.members.len() * self.sizes.len() * self.depths.len() * self.rws.len()
    }

    /// As JSON (what the guest gets, and what the results record).
    pub fn to_json(&self) -> Value {
        json!({"members": self.members, "sizes": self.sizes, "depths": self.depths, "rws": self.rws,
               "backends": self.backends, "seconds": self.seconds, "span": self.span, "chunk": self.chunk,
               "repeats": self.repeats})
    }

    /// From [`Grid::to_json`]'s form.
    pub fn from_json(v: &Value) -> Result<Grid> {
        let num = |k: &str| v[k].as_u64().with_context(|| format!("grid: no {k}"));
        Grid {
            members: json_nums(v, "members")?,
            sizes: json_strs(v, "sizes")?,
            depths: json_nums(v, "depths")?,
            rws: json_strs(v, "rws")?,
            backends: json_strs(v, "backends")?,
            seconds: num("seconds")?,
            span: num("span")?,
            chunk: num("chunk")?,
            // Recorded before repeats existed: one measurement per engine and point.
            repeats: v["repeats"].as_u64().unwrap_or(1) as usize,
        }
        .checked()
    }
}

/// `file|null|both` as backends.
pub fn backends(s: &str) -> Result<Vec<String>> {
    match s {
        "both" => Ok(vec!["file".into(), "null".into()]),
        "file" | "null" => Ok(vec![s.into()]),
        _ => bail!("--backend takes file, null or both, not {s}"),
    }
}

/// Host side: build, boot one VM, collect the points, write the results. `baseline`: another
/// build's `ugds` CLI, whose `ugds bench` runs on the volume in ugds's turns too.
pub fn run(grid: &Grid, out: Option<PathBuf>, baseline: Option<&Path>) -> Result<()> {
    let t = Instant::now();
    let baseline = baseline.map(super::baseline::checked).transpose()?;
    let root = toolchain::workspace_root();
    toolchain::setup_and_build_release(&["-p", "ugds-cli", "--bins"])?;
    let k = kernel::Choice::Test612.ensure()?;
    let ko = kmod::build_for(&k)?;
    let cli = root.join("target/release/ugds");
    let me = std::env::current_exe()?;
    let mut nvme = Vec::new();
    for b in &grid.backends {
        for i in 0..grid.controllers() {
            nvme.push(format!("size={}M,lbs=4096,backend={b},serial=vb{b}{i}", CONTROLLER_BYTES >> 20).parse()?);
        }
    }
    let points_total = (2 + usize::from(baseline.is_some())) * grid.points() * grid.backends.len();
    // Under TCG a measurement costs its seconds plus a few for fio or the CLI to start and warm
    // up, and each round a rebind of the controllers.
    let estimate = (points_total * grid.repeats) as u64 * (grid.seconds + 5);
    let cfg = vm::VmConfig {
        nvme,
        iommu: false,
        bind_module: None,
        mem: "2G".into(),
        timeout: Duration::from_secs((estimate * 3).max(1800)),
        env: vec![("UGDS_KMOD".into(), ko.display().to_string())],
        cmd: [
            me.display().to_string(),
            "bench-volume-guest".into(),
            cli.display().to_string(),
            grid.to_json().to_string(),
        ]
        .into_iter()
        .chain(baseline.iter().map(|b| format!("--baseline-cli={}", b.display())))
        .collect(),
        p2p: None,
    };
    eprintln!(
        "bench: booting the VM ({points_total} points: members {:?} x {} sizes x {} depths x {} rw x {} engines x {} \
         backend(s), {} times each, interleaved, {} s per measurement; about {} min)",
        grid.members,
        grid.sizes.len(),
        grid.depths.len(),
        grid.rws.len(),
        2 + usize::from(baseline.is_some()),
        grid.backends.len(),
        grid.repeats,
        grid.seconds,
        estimate.div_ceil(60)
    );
    let host = super::host::HostRun::start();
    let outcome = vm::run(&cfg, &k, true)?;
    let host = host.finish();
    if outcome.code != 0 {
        bail!("the volume benchmark failed in the VM (exit {})", outcome.code);
    }
    let raw = points_from(&outcome.output)?;
    let mut points = merged(&raw);
    let versus = super::baseline::compare(&raw, &points, KEYS);
    super::baseline::annotate(&mut points, &versus);
    let dir = out.unwrap_or_else(|| root.join("target/bench-volume"));
    std::fs::create_dir_all(&dir)?;
    let mut all = json!({ "grid": grid.to_json(), "points": points, "measurements": raw,
                      "noisy_above": repeats::NOISY, "vm_seconds": t.elapsed().as_secs(), "guest_hugepages_2m": HUGEPAGES,
                      "host": host.json() });
    if let Some(b) = &baseline {
        all["baseline_cli"] = json!(b.display().to_string());
    }
    std::fs::write(dir.join("volume-results.json"), serde_json::to_string_pretty(&all)?)?;
    let mut md = table(grid, &points);
    if let Some(b) = &baseline {
        md.push_str(&super::baseline::table(&points, &versus, b));
    }
    md.push_str(&host.markdown());
    std::fs::write(dir.join("volume-results.md"), &md)?;
    let plots = plot(grid, &points, &dir)?;
    println!("{md}");
    println!(
        "wrote volume-results.json, volume-results.md and {plots} plot(s) to {} in {:.0?}",
        dir.display(),
        t.elapsed()
    );
    host.warn();
    Ok(())
}

/// One point per engine and position from the repeats' measurements, each ugds volume point
/// with its ratio against md beside it (`iops_ratio`, `iops_ratio_range`, `noisy`).
pub fn merged(raw: &[Value]) -> Vec<Value> {
    let mut points = repeats::merge(raw, KEYS);
    let kernel: Vec<Value> = points.iter().filter(|p| p["engine"] == "kernel").cloned().collect();
    for u in points.iter_mut().filter(|p| p["engine"] == "ugds") {
        if let Some(k) = kernel.iter().find(|k| KEYS.iter().all(|key| k[*key] == u[*key])) {
            repeats::annotate(u, repeats::ratio(u, k));
        }
    }
    points
}

fn find<'a>(
    points: &'a [Value],
    backend: &str,
    engine: &str,
    members: usize,
    rw: &str,
    size: &str,
    depth: usize,
) -> Option<&'a Value> {
    points.iter().find(|p| {
        p["backend"] == backend
            && p["engine"] == engine
            && p["members"] == members
            && p["rw"] == rw
            && p["size"] == size
            && p["depth"] == depth
    })
}

/// Geometric mean, min and max.
pub(super) fn spread(v: &[f64]) -> Option<(f64, f64, f64)> {
    if v.is_empty() || v.iter().any(|x| *x <= 0.0) {
        return None;
    }
    let g = (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
    Some((g, v.iter().copied().fold(f64::MAX, f64::min), v.iter().copied().fold(0.0, f64::max)))
}

/// The markdown: per backend a summary (ugds/kernel IOPS per member count) and every point with
/// both ratios and each engine's scaling against the fewest members.
pub fn table(grid: &Grid, points: &[Value]) -> String {
    let mut s = String::new();
    let base = grid.members[0];
    for backend in &grid.backends {
        let _ = writeln!(
            s,
            "\n### {backend}-backed controllers\n\nugds/kernel IOPS per member count (geometric mean over sizes and depths of the per-point median ratios; min–max; noisy points left out):\n\n| members | {} |\n| ---: |{}",
            grid.rws.join(" | "),
            " ---: |".repeat(grid.rws.len())
        );
        for &n in &grid.members {
            let mut row = format!("| {n} |");
            for rw in &grid.rws {
                let rs: Vec<Ratio> = grid
                    .sizes
                    .iter()
                    .flat_map(|size| grid.depths.iter().map(move |d| (size, *d)))
                    .filter_map(|(size, d)| {
                        let k = find(points, backend, "kernel", n, rw, size, d)?;
                        let u = find(points, backend, "ugds", n, rw, size, d)?;
                        Some(repeats::ratio(u, k))
                    })
                    .collect();
                let good: Vec<f64> = rs.iter().filter(|r| !r.noisy).map(|r| r.median).collect();
                let noisy = rs.len() - good.len();
                let noted = if noisy > 0 { format!(", {noisy} noisy left out") } else { String::new() };
                match spread(&good) {
                    Some((g, lo, hi)) => {
                        let _ = write!(row, " {g:.2}x ({lo:.2}–{hi:.2}{noted}) |");
                    }
                    None => {
                        let _ = write!(row, " –{noted} |");
                    }
                }
            }
            let _ = writeln!(s, "{row}");
        }
        let _ = writeln!(
            s,
            "\n| rw | size | QD | members | kernel IOPS | ugds IOPS | ugds/kernel IOPS | kernel p50 us | ugds p50 us | ugds/kernel p50 | kernel scaling | ugds scaling |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for rw in &grid.rws {
            for size in &grid.sizes {
                for &depth in &grid.depths {
                    for &n in &grid.members {
                        let (Some(k), Some(u)) = (
                            find(points, backend, "kernel", n, rw, size, depth),
                            find(points, backend, "ugds", n, rw, size, depth),
                        ) else {
                            continue;
                        };
                        let scale = |engine: &str, now: &Value| {
                            find(points, backend, engine, base, rw, size, depth)
                                .map(|b| format!("{:.2}x", f(now, "iops") / f(b, "iops").max(1.0)))
                                .unwrap_or_else(|| "–".into())
                        };
                        let _ = writeln!(
                            s,
                            "| {rw} | {size} | {depth} | {n} | {:.0} | {:.0} | {} | {:.0} | {:.0} | {} | {} | {} |",
                            f(k, "iops"),
                            f(u, "iops"),
                            repeats::cell(repeats::ratio(u, k)),
                            total_p50(k),
                            total_p50(u),
                            p50_ratio(k, u).map_or_else(|| "–".into(), |r| format!("{r:.2}x")),
                            scale("kernel", k),
                            scale("ugds", u)
                        );
                    }
                }
            }
        }
    }
    for backend in &grid.backends {
        let rows: Vec<String> = grid
            .rws
            .iter()
            .flat_map(|rw| grid.sizes.iter().flat_map(move |size| grid.depths.iter().map(move |d| (rw, size, *d))))
            .filter_map(|(rw, size, d)| {
                let node = find(points, backend, "ugds-node", 1, rw, size, d)?;
                let vol = find(points, backend, "ugds", 1, rw, size, d)?;
                Some(format!(
                    "| {rw} | {size} | {d} | {:.0} | {:.0} | {:.2}x |",
                    f(node, "iops"),
                    f(vol, "iops"),
                    f(vol, "iops") / f(node, "iops").max(1.0)
                ))
            })
            .collect();
        if !rows.is_empty() {
            let _ = writeln!(
                s,
                "\n### {backend}-backed: a 1-member volume against the node itself (the volume layer's own cost)\n\n| rw | size | QD | node IOPS | 1-member volume IOPS | volume/node |\n| --- | --- | ---: | ---: | ---: | ---: |\n{}",
                rows.join("\n")
            );
        }
    }
    let _ = writeln!(
        s,
        "\nIOPS and p50 are medians of {} measurements per engine, the engines taking turns; ugds/kernel IOPS is the \
         median of the per-turn ratios with their range, `noisy` where an engine's measurements differ by more than \
         {}x. Scaling: IOPS against the same engine's {base}-member figure at the same point. p50 is from the submission \
         call to the completion (md's: fio's total `lat`); ugds/kernel p50 below 1 is lower latency for ugds. Chunk {}, working set {} over the volume, {} s per measurement.",
        grid.repeats,
        repeats::NOISY,
        ugds::units::human(grid.chunk),
        ugds::units::human(grid.span),
        grid.seconds
    );
    s
}

/// One PNG per backend and rw at the grid's deepest queue: IOPS (log scale) and scaling against
/// the fewest members, members on the x axis, one line per engine per size.
fn plot(grid: &Grid, points: &[Value], dir: &Path) -> Result<usize> {
    register_font()?;
    let depth = grid.depths.iter().copied().max().unwrap_or(1);
    let base = grid.members[0];
    let xmax = grid.controllers() as f64 + 0.3;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    let mut n = 0;
    for backend in &grid.backends {
        for rw in &grid.rws {
            let path = dir.join(format!("volume-scaling-{backend}-{rw}.png"));
            let root = BitMapBackend::new(&path, (1300, 560)).into_drawing_area();
            root.fill(&WHITE)?;
            let root = root.titled(
                &format!("{rw}, {backend}-backed QEMU NVMe, QD {depth}: ugds volume (thick) vs md RAID0 + fio (thin)"),
                ("sans-serif", 22),
            )?;
            let (left, right) = root.split_horizontally(650);
            let series = |engine: &str, size: &str, scaled: bool| -> Vec<(f64, f64)> {
                let b = find(points, backend, engine, base, rw, size, depth).map(|p| f(p, "iops")).unwrap_or(0.0);
                grid.members
                    .iter()
                    .filter_map(|&m| {
                        find(points, backend, engine, m, rw, size, depth).map(|p| (m as f64, f(p, "iops")))
                    })
                    .map(|(x, y)| (x, if scaled { y / b.max(1.0) } else { y.max(1.0) }))
                    .collect()
            };
            let all: Vec<f64> = grid
                .sizes
                .iter()
                .flat_map(|s| ["ugds", "kernel"].map(|e| series(e, s, false)))
                .flatten()
                .map(|p| p.1)
                .collect();
            let (lo, hi) = (all.iter().copied().fold(f64::MAX, f64::min), all.iter().copied().fold(1.0, f64::max));
            let mut c1 = ChartBuilder::on(&left)
                .margin(15)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(0.7f64..xmax, ((lo.min(hi) / 2.0).max(1.0)..hi * 2.0).log_scale())?;
            let whole = |x: &f64| if (x - x.round()).abs() < 1e-6 { format!("{x:.0}") } else { String::new() };
            c1.configure_mesh()
                .x_desc("members")
                .y_desc("IOPS (log)")
                .x_label_formatter(&whole)
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()?;
            let smax = grid
                .sizes
                .iter()
                .flat_map(|s| ["ugds", "kernel"].map(|e| series(e, s, true)))
                .flatten()
                .map(|p| p.1)
                .fold(grid.controllers() as f64 / base as f64, f64::max);
            let mut c2 = ChartBuilder::on(&right)
                .margin(15)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(0.7f64..xmax, 0f64..smax * 1.1)?;
            c2.configure_mesh()
                .x_desc("members")
                .y_desc(format!("IOPS / {base}-member IOPS"))
                .x_label_formatter(&whole)
                .draw()?;
            // Perfect scaling, for reference.
            c2.draw_series(LineSeries::new(
                grid.members.iter().map(|&m| (m as f64, m as f64 / base as f64)),
                BLACK.mix(0.3).stroke_width(1),
            ))?
            .label("linear")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.3)));
            for (ci, size) in grid.sizes.iter().enumerate() {
                for (engine, width) in [("ugds", 3), ("kernel", 1)] {
                    let style = colors[ci % colors.len()].stroke_width(width);
                    c1.draw_series(LineSeries::new(series(engine, size, false), style))?
                        .label(format!("{engine} {size}"))
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
                    c2.draw_series(LineSeries::new(series(engine, size, true), style))?;
                }
            }
            c1.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
            c2.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
            root.present()?;
            n += 1;
        }
    }
    Ok(n)
}

/// Waits for a controller's first namespace's block device while the kernel drives it.
pub(super) fn disk_of(addr: &str) -> Result<String> {
    for _ in 0..200 {
        if let Some(d) = bind::first_namespace(addr) {
            return Ok(d);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{addr} has no namespace block device")
}

/// Guest side: per backend, every point measured in turns by the kernel's md RAID0 over the
/// first N namespaces and by the ugds volume over the same controllers, one JSON line per
/// measurement. `baseline`: another build's CLI, run on the volume in ugds's turns too (ours
/// first in even repeats, the baseline's in odd ones).
pub fn guest(cli: &str, grid: &str, baseline: Option<&str>) -> Result<()> {
    let grid = Grid::from_json(&serde_json::from_str(grid)?)?;
    if !Path::new("/sys/module/ugds").exists() {
        sh(&format!("insmod {}", std::env::var("UGDS_KMOD").context("UGDS_KMOD")?))?;
    }
    reserve_hugepages()?;
    let all = bind::nvme_controllers()?;
    let m = grid.controllers();
    if all.len() != m * grid.backends.len() {
        bail!("{} controllers, expected {} x {}", all.len(), m, grid.backends.len());
    }
    let span = ugds::units::human(grid.span);
    for (group, backend) in all.chunks(m).zip(&grid.backends) {
        let disks: Vec<String> = group.iter().map(|a| disk_of(a)).collect::<Result<_>>()?;
        if backend == "file" {
            // Write each member's working set once, so reads of the file-backed drives read data.
            let t = Instant::now();
            let jobs: Vec<String> =
                disks.iter().enumerate().map(|(i, d)| format!("--name=fill{i} --filename={d}")).collect();
            sh(&format!(
                "fio --ioengine=io_uring --direct=1 --rw=write --bs=1M --size={span} --output=/dev/null {}",
                jobs.join(" ")
            ))?;
            eprintln!("bench: filled {} x {span} in {:.0?}", disks.len(), t.elapsed());
        }
        let mut side = Side::Kernel(None);
        let r = (|| -> Result<()> {
            // Each round starts on the side the last one ended on: one switch per round.
            let mut start = false;
            for &n in &grid.members {
                for rw in &grid.rws {
                    for size in &grid.sizes {
                        for &depth in &grid.depths {
                            let job = Job { rw, size, depth, seconds: grid.seconds, span: &span };
                            for (repeat, ours) in repeats::order(grid.repeats, start) {
                                let mut out = Vec::new();
                                if ours {
                                    let nodes = side.switch_to_ugds(group)?;
                                    let volume = bind::volume_spec(grid.chunk, &nodes[..n])?;
                                    let mut clis = vec![(cli, "ugds")];
                                    if let Some(b) = baseline {
                                        clis.insert(usize::from(repeat % 2 == 0), (b, BASELINE));
                                    }
                                    for (c, engine) in clis {
                                        out.push((ugds_point(c, &volume, job)?, engine));
                                    }
                                    // Reference: the first member's node itself (the single-device
                                    // path, no volume).
                                    if n == 1 {
                                        out.push((ugds_point(cli, &nodes[0], job)?, "ugds-node"));
                                    }
                                } else {
                                    side.switch_to_md(n, group, grid.chunk)?;
                                    out.push((fio_point("/dev/md0", job)?, "kernel"));
                                }
                                for (mut v, engine) in out {
                                    v["engine"] = json!(engine);
                                    v["backend"] = json!(backend);
                                    v["members"] = json!(n);
                                    v["repeat"] = json!(repeat);
                                    println!("{MARK}{v}");
                                }
                                start = ours;
                            }
                        }
                    }
                }
            }
            Ok(())
        })();
        side.release(group)?;
        r?;
    }
    Ok(())
}

/// Who drives a backend's controllers now: the kernel's nvme driver (with md0 built over the
/// first N of them, or none), or ugds (its nodes).
enum Side {
    Kernel(Option<usize>),
    Ugds(Vec<String>),
}

impl Side {
    /// md0 over the first `n` controllers' disks, the controllers on the kernel's driver.
    fn switch_to_md(&mut self, n: usize, group: &[String], chunk: u64) -> Result<()> {
        if let Side::Kernel(Some(built)) = *self {
            if built == n {
                return Ok(());
            }
        }
        self.release(group)?;
        // The kernel may name a controller's disk anew after a rebind: asked each time.
        let disks: Vec<String> = group[..n].iter().map(|a| disk_of(a)).collect::<Result<_>>()?;
        // --force: mdadm asks for it before a one-device array.
        sh(&format!(
            "mdadm --build /dev/md0 --force --level=0 --chunk={} --raid-devices={n} {} 2>&1",
            chunk >> 10,
            disks.join(" ")
        ))
        .context("mdadm --build (needs md RAID0 in the test kernel and mdadm)")?;
        *self = Side::Kernel(Some(n));
        Ok(())
    }

    /// The controllers on ugds; their nodes.
    fn switch_to_ugds(&mut self, group: &[String]) -> Result<Vec<String>> {
        if let Side::Ugds(nodes) = self {
            return Ok(nodes.clone());
        }
        self.release_md()?;
        let (bound, _) = bind::bind_many(group, false)?;
        let nodes: Vec<String> = bound.into_iter().map(|b| b.node).collect();
        *self = Side::Ugds(nodes.clone());
        Ok(nodes)
    }

    fn release_md(&mut self) -> Result<()> {
        if let Side::Kernel(Some(_)) = self {
            sh("mdadm --stop /dev/md0 2>&1")?;
            *self = Side::Kernel(None);
        }
        Ok(())
    }

    /// Leaves the controllers on the kernel's driver with no array.
    fn release(&mut self, group: &[String]) -> Result<()> {
        self.release_md()?;
        if let Side::Ugds(_) = self {
            bind::unbind_many(group, false)?;
            *self = Side::Kernel(None);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Grid {
        Grid {
            members: vec![4, 1, 2, 2],
            sizes: vec!["4K".into(), "1M".into()],
            depths: vec![1, 32],
            rws: vec!["randread".into()],
            backends: backends("null").unwrap(),
            seconds: 1,
            span: 1 << 30,
            chunk: 128 << 10,
            repeats: 3,
        }
        .checked()
        .unwrap()
    }

    #[test]
    fn the_grid_is_checked_and_round_trips() {
        let g = grid();
        assert_eq!(g.members, [1, 2, 4]);
        assert_eq!((g.controllers(), g.points()), (4, 12));
        assert_eq!(Grid::from_json(&g.to_json()).unwrap(), g);
        assert_eq!(backends("both").unwrap(), ["file", "null"]);
        assert!(backends("tape").is_err());
        let bad = |f: fn(&mut Grid)| {
            let mut g = grid();
            f(&mut g);
            g.checked().is_err()
        };
        assert!(bad(|g| g.members = vec![0, 2]));
        assert!(bad(|g| g.members = vec![9]));
        assert!(bad(|g| g.sizes = vec!["3000".into()]));
        assert!(bad(|g| g.depths = vec![0]));
        assert!(bad(|g| g.rws = vec!["read".into()]));
        assert!(bad(|g| g.chunk = 3 << 10));
        assert!(bad(|g| g.span = 4 << 30));
        assert!(bad(|g| g.sizes.clear()));
    }

    fn point(engine: &str, members: usize, size: &str, depth: usize, iops: f64, p50: f64) -> Value {
        json!({"backend": "null", "engine": engine, "members": members, "rw": "randread", "size": size,
               "depth": depth, "iops": iops, "p50_us": p50})
    }

    #[test]
    fn the_table_has_ratios_and_scaling() {
        let g = grid();
        let mut pts = Vec::new();
        for (m, k, u) in [(1, 1000.0, 3000.0), (2, 1500.0, 6000.0), (4, 2000.0, 9000.0)] {
            pts.push(point("kernel", m, "4K", 32, k, 100.0));
            pts.push(point("ugds", m, "4K", 32, u, 25.0));
        }
        let t = table(&g, &pts);
        assert!(
            t.contains("| randread | 4K | 32 | 4 | 2000 | 9000 | 4.50x | 100 | 25 | 0.25x | 2.00x | 3.00x |"),
            "{t}"
        );
        assert!(
            t.contains("| randread | 4K | 32 | 1 | 1000 | 3000 | 3.00x | 100 | 25 | 0.25x | 1.00x | 1.00x |"),
            "{t}"
        );
        // One ratio per member count: the geometric mean of one point is that point.
        assert!(t.contains("| 2 | 4.00x (4.00–4.00) |"), "{t}");
        pts.push(point("ugds-node", 1, "4K", 32, 6000.0, 10.0));
        let t = table(&g, &pts);
        assert!(t.contains("| randread | 4K | 32 | 6000 | 3000 | 0.50x |"), "{t}");
        // Points the grid lacks are left out, not invented.
        assert!(!t.contains("| 1M |"), "{t}");
        let (g3, lo, hi) = spread(&[1.0, 4.0]).unwrap();
        assert!((g3 - 2.0).abs() < 1e-9 && lo == 1.0 && hi == 4.0);
        assert!(spread(&[]).is_none());
    }

    /// The p50s compared are like with like: md's total latency (fio's `lat`, from the
    /// submission call) where fio gave it, as `ugds bench` times its I/Os, not its completion
    /// latency (`clat`), which leaves the submission call out.
    #[test]
    fn the_p50_ratio_compares_total_latencies() {
        let g = grid();
        let mut k = point("kernel", 2, "4K", 1, 1000.0, 30.0);
        k["lat_p50_us"] = json!(40.0);
        let pts = vec![k, point("ugds", 2, "4K", 1, 2000.0, 20.0)];
        let t = table(&g, &pts);
        assert!(t.contains("| randread | 4K | 1 | 2 | 1000 | 2000 | 2.00x | 40 | 20 | 0.50x |"), "{t}");
    }

    /// With a baseline CLI, its volume points pair with ours by member count and repeat: the
    /// ugds/baseline table has a row per member count, and md's table is as it was.
    #[test]
    fn a_baseline_clis_volume_points_are_compared_with_ours_by_member_count() {
        let g = grid();
        let mut raw = Vec::new();
        for r in 0..3usize {
            for (engine, m, iops) in [
                ("kernel", 2, 1000.0),
                ("ugds", 2, 3000.0),
                (BASELINE, 2, 2000.0),
                ("ugds", 4, 3000.0),
                (BASELINE, 4, 3000.0),
            ] {
                // The machine's speed moves between repeats (binary fractions: exact ratios).
                let mut p = point(engine, m, "1M", 32, iops * [1.0, 1.25, 1.125][r], 100.0);
                p["repeat"] = json!(r);
                raw.push(p);
            }
        }
        let mut pts = merged(&raw);
        let versus = super::super::baseline::compare(&raw, &pts, KEYS);
        assert_eq!(versus.len(), 2, "one per member count");
        super::super::baseline::annotate(&mut pts, &versus);
        let u2 = find(&pts, "null", "ugds", 2, "randread", "1M", 32).unwrap();
        assert_eq!(u2["baseline_iops_ratio"], json!(1.5), "{u2}");
        assert_eq!(find(&pts, "null", "ugds", 4, "randread", "1M", 32).unwrap()["baseline_iops_ratio"], json!(1.0));
        let md = super::super::baseline::table(&pts, &versus, Path::new("/old/ugds"));
        assert!(md.contains("| controller | members | rw | size | QD/batch |"), "{md}");
        assert!(md.contains("| null | 2 | randread | 1M | 32 | 3375 | 2250 | 1.50x |"), "{md}");
        assert!(md.contains("| null | 4 | randread | 1M | 32 | 3375 | 3375 | 1.00x |"), "{md}");
        // md's table compares ugds with the kernel only.
        let t = table(&g, &pts);
        assert!(t.contains("| randread | 1M | 32 | 2 | 1125 | 3375 | 3.00x |"), "{t}");
    }

    #[test]
    fn repeats_give_median_ratios_and_noisy_points_leave_the_summary() {
        let g = grid();
        let mut raw = Vec::new();
        let measure = |raw: &mut Vec<Value>, engine: &str, m: usize, iops: [f64; 3]| {
            for (r, v) in iops.into_iter().enumerate() {
                let mut p = point(engine, m, "4K", 32, v, 100.0);
                p["repeat"] = json!(r);
                raw.push(p);
            }
        };
        // Per-turn ratios 2.4, 2.5 and 3.3: their median is 2.5, where the medians' ratio is 3.
        measure(&mut raw, "kernel", 2, [1000.0, 1200.0, 1000.0]);
        measure(&mut raw, "ugds", 2, [2400.0, 3000.0, 3300.0]);
        // md's turns disagree by 3x: noisy, left out of the member count's mean.
        measure(&mut raw, "kernel", 4, [1000.0, 3000.0, 1000.0]);
        measure(&mut raw, "ugds", 4, [5000.0, 5000.0, 5000.0]);
        let pts = merged(&raw);
        assert_eq!(pts.len(), 4, "one point per engine and position");
        let u2 = find(&pts, "null", "ugds", 2, "randread", "4K", 32).unwrap();
        assert!((u2["iops_ratio"].as_f64().unwrap() - 2.5).abs() < 1e-9, "{u2}");
        assert_eq!(u2["noisy"], json!(false));
        assert_eq!(find(&pts, "null", "ugds", 4, "randread", "4K", 32).unwrap()["noisy"], json!(true));
        let t = table(&g, &pts);
        assert!(t.contains("| randread | 4K | 32 | 2 | 1000 | 3000 | 2.50x (2.40–3.30) |"), "{t}");
        assert!(t.contains("| randread | 4K | 32 | 4 | 1000 | 5000 | noisy (1.67–5.00) |"), "{t}");
        assert!(t.contains("| 4 | –, 1 noisy left out |"), "{t}");
        assert!(t.contains("| 2 | 2.50x (2.50–2.50) |"), "{t}");
        // A grid recorded before repeats existed reads as one measurement per point.
        let mut old = g.to_json();
        old.as_object_mut().unwrap().remove("repeats");
        assert_eq!(Grid::from_json(&old).unwrap().repeats, 1);
    }

    #[test]
    fn plots_are_written() {
        if !Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
            return;
        }
        let g = grid();
        let pts: Vec<Value> = [1, 2, 4]
            .iter()
            .flat_map(|&m| {
                [point("kernel", m, "4K", 32, 1000.0 * m as f64, 9.0), point("ugds", m, "4K", 32, 3000.0, 3.0)]
            })
            .collect();
        let dir = vm::TempDir::new("ugds-bench-plot").unwrap();
        assert_eq!(plot(&g, &pts, dir.path()).unwrap(), 1);
        let png = std::fs::read(dir.path().join("volume-scaling-null-randread.png")).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
    }
}

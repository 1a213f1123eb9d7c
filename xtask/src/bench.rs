//! `cargo xtask bench`: one VM boot, two emulated controllers (file-backed, and null-backed to
//! isolate software and emulation cost), the kernel path (fio, io_uring, O_DIRECT, fixed buffers,
//! registered files) and ugds (`ugds bench`) on the same grid, side by side; at QD 1 ugds twice:
//! on the device's shared queue pairs and on owned ones (`--queue owned`); plus the data path's
//! own cost on the host. Writes JSON, a markdown table with ratios and PNG plots.

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
pub mod volume;

const SIZES: &[&str] = &["4K", "16K", "64K", "128K"];
const DEPTHS: &[usize] = &[1, 8, 32, 128];
const RWS: &[&str] = &["randread", "randwrite"];
const MARK: &str = "BENCH-POINT ";
/// The engine name of `ugds bench --queue owned` points (synchronous calls, QD 1 only).
const OWNED: &str = "ugds-owned";

/// Host side.
pub fn run(seconds: u64, out: Option<PathBuf>) -> Result<()> {
    let t = Instant::now();
    let root = toolchain::workspace_root();
    toolchain::setup_and_build_release(&["-p", "ugds-cli", "--bins"])?;
    toolchain::setup_and_build_release(&["-p", "ugds", "--features", "test-utils", "--example", "datapath_cost"])?;
    let k = kernel::Choice::Test612.ensure()?;
    let ko = kmod::build_for(&k)?;
    let cli = root.join("target/release/ugds");
    let me = std::env::current_exe()?;
    let cfg = vm::VmConfig {
        nvme: vec!["size=2G,lbs=4096".parse()?, "size=2G,lbs=4096,backend=null".parse()?],
        iommu: false,
        bind_module: None,
        mem: "2G".into(),
        timeout: Duration::from_secs(1800),
        env: vec![("UGDS_KMOD".into(), ko.display().to_string())],
        cmd: vec![me.display().to_string(), "bench-guest".into(), cli.display().to_string(), seconds.to_string()],
        p2p: None,
    };
    eprintln!(
        "bench: booting the VM ({} points x 2 engines x 2 controllers, and ugds on owned queues at QD 1, {seconds} s each)",
        SIZES.len() * DEPTHS.len() * RWS.len()
    );
    let outcome = vm::run(&cfg, &k, true)?;
    if outcome.code != 0 {
        bail!("the benchmark failed in the VM (exit {})", outcome.code);
    }
    let mut points = points_from(&outcome.output)?;
    add_ratios(&mut points);
    let micro = microbench(&root)?;
    let dir = out.unwrap_or_else(|| root.join("target/bench"));
    std::fs::create_dir_all(&dir)?;
    let all = json!({ "points": points, "datapath_cost": micro, "seconds_per_point": seconds });
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(&all)?)?;
    let md = table(&points, &micro);
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
    let c = crate::cost::measure(&root.join("target/release/examples/datapath_cost"), 1, false)?;
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
/// `ugds bench` times each I/O from the call to its return, so the kernel's total latency (fio
/// `lat`, `lat_p50_us`) where the point has it, else its completion latency (`p50_us`, fio
/// `clat`, which leaves out the submission call and whatever completes inside it).
fn p50_ratio(k: &Value, u: &Value) -> Option<f64> {
    let kernel = if f(k, "lat_p50_us") > 0.0 { f(k, "lat_p50_us") } else { f(k, "p50_us") };
    (kernel > 0.0 && f(u, "p50_us") > 0.0).then(|| f(u, "p50_us") / kernel)
}

/// Adds `iops_ratio` and `p50_ratio` (ugds over kernel at the same backend, rw, size and depth)
/// to every ugds point (`ugds` and `ugds-owned`) that has a kernel point beside it. Only adds
/// keys: a reader of the older JSON reads this one.
fn add_ratios(points: &mut [Value]) {
    let kernel: Vec<Value> = points.iter().filter(|p| p["engine"] == "kernel").cloned().collect();
    for u in points.iter_mut().filter(|p| p["engine"] == "ugds" || p["engine"] == OWNED) {
        let same = |k: &&Value| ["backend", "rw", "size", "depth"].iter().all(|key| k[key] == u[key]);
        let Some(k) = kernel.iter().find(same) else { continue };
        u["iops_ratio"] = json!(f(u, "iops") / f(k, "iops").max(1.0));
        if let Some(r) = p50_ratio(k, u) {
            u["p50_ratio"] = json!(r);
        }
    }
}

/// A ratio cell: `0.85x`, or `–` when there is none.
fn ratio_cell(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |r| format!("{r:.2}x"))
}

/// The row of one point: both engines, their IOPS and p50 ratios, and ugds on owned queues where
/// it ran (QD 1), with its own ratios to the kernel.
fn table_row(rw: &str, size: &str, depth: usize, k: &Value, u: &Value, owned: Option<&Value>) -> String {
    let owned_cells = match owned {
        Some(o) => format!(
            "{:.0} | {:.0} / {:.0} | {} | {}",
            f(o, "iops"),
            f(o, "p50_us"),
            f(o, "p99_us"),
            ratio_cell(Some(f(o, "iops") / f(k, "iops").max(1.0))),
            ratio_cell(p50_ratio(k, o))
        ),
        None => "– | – | – | –".into(),
    };
    format!(
        "| {rw} | {size} | {depth} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {} | {owned_cells} |",
        iops_cells(k, u),
        f(k, "p50_us"),
        f(k, "p99_us"),
        f(u, "p50_us"),
        f(u, "p99_us"),
        ratio_cell(p50_ratio(k, u))
    )
}

fn table(points: &[Value], micro: &Value) -> String {
    let mut s = String::new();
    for backend in ["file", "null"] {
        let _ = writeln!(
            s,
            "\n### {backend}-backed controller\n\n| rw | size | QD/batch | kernel IOPS | ugds IOPS | ugds/kernel | kernel p50/p99 us | ugds p50/p99 us | ugds/kernel p50 | owned IOPS | owned p50/p99 us | owned/kernel | owned/kernel p50 |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
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
                    if let (Some(k), Some(u)) = (find("kernel"), find("ugds")) {
                        let _ = writeln!(s, "{}", table_row(rw, size, *depth, k, u, find(OWNED)));
                    }
                }
            }
        }
    }
    let _ = writeln!(
        s,
        "\nugds/kernel p50 below 1 is lower latency for ugds; it compares ugds's latency (call to return) with the kernel's total latency (fio `lat`, submission included: `lat_p50_us` in the JSON), where the columns show the kernel's completion latency (fio `clat`). owned: `ugds bench --queue owned`, each thread's synchronous calls on a queue pair of its own (no lock); QD 1 only (deeper points are batches, which own their queue pair already)."
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
                for (engine, dashed) in [("ugds", false), ("kernel", true)] {
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
                    let style = colors[ci].stroke_width(if dashed { 1 } else { 3 });
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

/// One fio point on a block device (io_uring, O_DIRECT, fixed buffers, registered files):
/// `iops`, `p50_us`, `p99_us` (completion latency).
fn fio_point(dev: &str, rw: &str, size: &str, depth: usize, seconds: u64, span: &str) -> Result<Value> {
    fio_point_with(dev, rw, size, depth, seconds, span, Latency::Completion)
}

/// [`fio_point`] with the latency `lat` names (recorded as the point's `latency`).
fn fio_point_with(
    dev: &str,
    rw: &str,
    size: &str,
    depth: usize,
    seconds: u64,
    span: &str,
    lat: Latency,
) -> Result<Value> {
    // Completion points also ask for the total latency (fio 3.20 and later report both), kept as
    // `lat_p50_us` / `lat_p99_us` beside the completion latency's `p50_us` / `p99_us`.
    let (flag, key) = match lat {
        Latency::Completion => (" --lat_percentiles=1 --clat_percentiles=1", "clat_ns"),
        Latency::Total => (" --lat_percentiles=1", "lat_ns"),
    };
    let out = sh(&format!(
        "fio --output-format=json --name=k --filename={dev} --ioengine=io_uring --direct=1 --fixedbufs \
         --registerfiles --rw={rw} --bs={size} --iodepth={depth} --size={span} --runtime={seconds} --time_based --randrepeat=0{flag}"
    ))?;
    let v: Value = serde_json::from_str(out.get(out.find('{').unwrap_or(0)..).unwrap_or(""))?;
    let side = if rw.contains("write") { &v["jobs"][0]["write"] } else { &v["jobs"][0]["read"] };
    let pct = |p: &str| side[key]["percentile"][p].as_f64().unwrap_or(0.0) / 1000.0;
    let mut point = json!({"engine": "kernel", "rw": rw, "size": size, "depth": depth,
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
fn ugds_point(cli: &str, target: &str, rw: &str, size: &str, depth: usize, seconds: u64, span: &str) -> Result<Value> {
    ugds_point_on(cli, target, rw, size, depth, seconds, span, false)
}

/// [`ugds_point`]; `owned`: synchronous calls on owned queue pairs (`--queue owned`, engine
/// [`OWNED`]).
#[allow(clippy::too_many_arguments)]
fn ugds_point_on(
    cli: &str,
    target: &str,
    rw: &str,
    size: &str,
    depth: usize,
    seconds: u64,
    span: &str,
    owned: bool,
) -> Result<Value> {
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

/// Guest side: both engines on both controllers, one JSON line per point.
pub fn guest(cli: &str, seconds: u64) -> Result<()> {
    if !Path::new("/sys/module/ugds").exists() {
        sh(&format!("insmod {}", std::env::var("UGDS_KMOD").context("UGDS_KMOD")?))?;
    }
    for (addr, backend) in bind::nvme_controllers()?.into_iter().zip(["file", "null"]) {
        let ctrl = std::fs::read_dir(format!("/sys/bus/pci/devices/{addr}/nvme"))?.next().context("nvme")??.file_name();
        let blk = format!("/dev/{}n1", ctrl.to_string_lossy());
        // Fill the working set once, so reads of the file-backed drive read data.
        if backend == "file" {
            sh(&format!("fio --name=fill --filename={blk} --ioengine=io_uring --direct=1 --rw=write --bs=1M --size=1G --output=/dev/null"))?;
        }
        for rw in RWS {
            for size in SIZES {
                for depth in DEPTHS {
                    let mut v = fio_point(&blk, rw, size, *depth, seconds, "1G")?;
                    v["backend"] = json!(backend);
                    println!("{MARK}{v}");
                }
            }
        }
        bind::bind(&addr)?;
        let node = bind::ugds_nodes(&addr).first().map(|n| format!("/dev/{n}")).context("no ugds node")?;
        for rw in RWS {
            for size in SIZES {
                for depth in DEPTHS {
                    let mut v = ugds_point(cli, &node, rw, size, *depth, seconds, "1G")?;
                    v["backend"] = json!(backend);
                    println!("{MARK}{v}");
                    // Synchronous calls again, each on a queue pair the thread owns.
                    if *depth == 1 {
                        let mut v = ugds_point_on(cli, &node, rw, size, 1, seconds, "1G", true)?;
                        v["backend"] = json!(backend);
                        println!("{MARK}{v}");
                    }
                }
            }
        }
        bind::unbind(&addr)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{add_ratios, plot, table, OWNED};
    use crate::vm;
    use serde_json::{json, Value};
    use std::path::Path;

    fn point(engine: &str, depth: usize, iops: f64, p50: f64) -> Value {
        json!({"engine": engine, "backend": "null", "rw": "randread", "size": "4K", "depth": depth,
               "iops": iops, "p50_us": p50, "p99_us": 2.0 * p50})
    }

    fn grid() -> Vec<Value> {
        let mut k1 = point("kernel", 1, 10000.0, 40.0);
        // The total latency (submission included) is what ugds's p50 is compared with.
        k1["lat_p50_us"] = json!(80.0);
        vec![
            k1,
            point("ugds", 1, 20000.0, 20.0),
            point(OWNED, 1, 25000.0, 10.0),
            point("kernel", 8, 50000.0, 100.0),
            point("ugds", 8, 40000.0, 0.0),
        ]
    }

    /// Each row carries ugds/kernel p50 (ugds over kernel), and at QD 1 the owned queues' IOPS,
    /// latency and ratios; a point without a p50 or without owned queues shows `–`.
    #[test]
    fn rows_carry_p50_ratios_and_the_owned_mode() {
        let t = table(&grid(), &json!({}));
        let qd1 = t.lines().find(|l| l.starts_with("| randread | 4K | 1 |")).expect("QD 1 row");
        let cells: Vec<&str> = qd1.split('|').map(str::trim).collect();
        // | rw | size | QD | kernel IOPS | ugds IOPS | ugds/kernel | kernel p50/p99 | ugds p50/p99 |
        // ugds/kernel p50 | owned IOPS | owned p50/p99 | owned/kernel | owned/kernel p50 |
        assert_eq!(
            &cells[4..14],
            &["10000", "20000", "2.00x", "40 / 80", "20 / 40", "0.25x", "25000", "10 / 20", "2.50x", "0.12x"],
            "{qd1}"
        );
        let qd8 = t.lines().find(|l| l.starts_with("| randread | 4K | 8 |")).expect("QD 8 row");
        let cells: Vec<&str> = qd8.split('|').map(str::trim).collect();
        assert_eq!(&cells[9..14], &["–", "–", "–", "–", "–"], "{qd8}");
        // Header and rows have as many columns.
        let header = t.lines().find(|l| l.starts_with("| rw |")).expect("header");
        assert_eq!(header.matches('|').count(), qd1.matches('|').count());
    }

    /// The JSON's ugds points gain their ratios to the kernel; nothing else changes.
    #[test]
    fn ratios_are_added_to_ugds_points_only() {
        let mut pts = grid();
        add_ratios(&mut pts);
        assert_eq!(pts[1]["p50_ratio"], json!(0.25));
        assert_eq!(pts[1]["iops_ratio"], json!(2.0));
        assert_eq!(pts[2]["p50_ratio"], json!(0.125));
        assert!(pts[0].get("p50_ratio").is_none() && pts[0].get("iops_ratio").is_none());
        // Without the kernel's total latency the completion latency is used (QD 8: 100 us).
        let mut k = point("kernel", 8, 50000.0, 100.0);
        let mut u = vec![k.clone(), point("ugds", 8, 50000.0, 50.0)];
        add_ratios(&mut u);
        assert_eq!(u[1]["p50_ratio"], json!(0.5));
        k["lat_p50_us"] = json!(0.0);
        assert_eq!(super::p50_ratio(&k, &u[1]), Some(0.5));
        // No p50 measured: no p50 ratio, but the IOPS one.
        assert!(pts[4].get("p50_ratio").is_none());
        assert_eq!(pts[4]["iops_ratio"], json!(0.8));
        assert_eq!(pts[4]["iops"], json!(40000.0));
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

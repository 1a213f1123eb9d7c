//! SPDK's side of `cargo xtask bench --spdk`: the grid's job as `spdk_nvme_perf` options, its
//! report parsed into a point, and the controller handed to `uio_pci_generic` for SPDK's turn
//! and back to the kernel's nvme driver.
//!
//! `spdk_nvme_perf` polls the controller from one core (`-c 0x1`) through DPDK: the controller
//! is bound to `uio_pci_generic` (the test kernel builds it as a module), DMA goes to hugepages
//! by physical address (no IOMMU in the VM). Its latencies (`-L`: average, min, max, and
//! percentiles from its histogram) run from the submission call to the completion callback:
//! fio's `lat`, what `ugds bench` measures.

use super::Job;
use crate::{bind, vm};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The engine name of SPDK's points.
pub const SPDK: &str = "spdk";

/// The kernel driver SPDK's turn binds the controller to.
const UIO: &str = "uio_pci_generic";

/// `spdk_nvme_perf`'s options for `job` on the controller at PCI address `addr`: queue depth,
/// I/O size in bytes, pattern (fio's `randread` / `randwrite` are SPDK's names too), seconds,
/// one core, that controller only, latency summary with percentiles.
pub(super) fn perf_args(job: Job, addr: &str) -> Result<Vec<String>> {
    let bytes = vm::parse_size(job.size)?;
    if !matches!(job.rw, "randread" | "randwrite" | "read" | "write") {
        bail!("spdk_nvme_perf: no pattern for {}", job.rw);
    }
    if job.depth == 0 || job.seconds == 0 {
        bail!("spdk_nvme_perf: a depth and a time of at least 1");
    }
    Ok(vec![
        "-q".into(),
        job.depth.to_string(),
        "-o".into(),
        bytes.to_string(),
        "-w".into(),
        job.rw.into(),
        "-t".into(),
        job.seconds.to_string(),
        "-c".into(),
        "0x1".into(),
        "-r".into(),
        format!("trtype:PCIe traddr:{addr}"),
        "-L".into(),
        "--transport-stats".into(),
    ])
}

/// What `spdk_nvme_perf` reported: the `Total` line (IOPS, MiB/s, average, min and max latency
/// in µs) and, with `-L`, the percentiles it printed (fraction, µs).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub iops: f64,
    pub mib_s: f64,
    pub avg_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub percentiles: Vec<(f64, f64)>,
    /// With `--transport-stats`, the queue pair's completions per poll that found any: the
    /// I/Os each round carried (`ugds bench`'s `ios_per_round` says the same of its batches).
    pub ios_per_round: Option<f64>,
}

impl Report {
    /// The latency at percentile `pct` (50.0 for the median), if printed.
    pub fn percentile(&self, pct: f64) -> Option<f64> {
        self.percentiles.iter().find(|(p, _)| (p - pct).abs() < 1e-6).map(|(_, us)| *us)
    }
}

/// Parses `spdk_nvme_perf`'s report: the `Total : IOPS MiB/s Average min max` line, and the
/// first `Summary latency data` block's `PCT% : VALUEus` lines. An error when there is no total
/// (the run failed, or completed no I/O).
pub fn parse(out: &str) -> Result<Report> {
    let total = out
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            (name.trim() == "Total").then_some(rest)
        })
        .next_back()
        .context("spdk_nvme_perf printed no Total line")?;
    let nums: Vec<f64> = total
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("spdk_nvme_perf's Total line: {total:?}"))?;
    let [iops, mib_s, avg_us, min_us, max_us] = nums[..] else {
        bail!("spdk_nvme_perf's Total line has {} figures, not 5: {total:?}", nums.len());
    };
    let mut percentiles = Vec::new();
    if let Some(i) = out.find("Summary latency data") {
        for l in out[i..].lines().skip(1) {
            let l = l.trim();
            if l.starts_with("====") {
                continue;
            }
            let Some((p, v)) = l.split_once("% :") else { break };
            let (Ok(p), Ok(v)) = (p.trim().parse::<f64>(), v.trim().trim_end_matches("us").trim().parse::<f64>())
            else {
                break;
            };
            percentiles.push((p, v));
        }
    }
    Ok(Report { iops, mib_s, avg_us, min_us, max_us, percentiles, ios_per_round: ios_per_round(out) })
}

/// Completions per poll that found any, from `--transport-stats`' PCIe counters (`polls`,
/// `idle_polls`, `completions`; the first queue pair's); `None` without them or without a busy
/// poll.
fn ios_per_round(out: &str) -> Option<f64> {
    let counter = |name: &str| {
        out.lines().find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':')?.trim().parse::<u64>().ok())
    };
    let busy = counter("polls")?.checked_sub(counter("idle_polls")?).filter(|&b| b > 0)?;
    Some(counter("completions")? as f64 / busy as f64)
}

/// The grid's point of a report: SPDK's own figures under the grid's names. Its latencies are
/// total ones (`latency: total`), in `p50_us`/`p99_us` and `lat_p50_us`/`lat_p99_us` alike.
pub(super) fn point(r: &Report, job: Job) -> Value {
    let mut v = json!({"engine": SPDK, "rw": job.rw, "size": job.size, "depth": job.depth, "iops": r.iops,
                       "mib_s": r.mib_s, "avg_us": r.avg_us, "min_us": r.min_us, "max_us": r.max_us,
                       "latency": "total"});
    if let Some(n) = r.ios_per_round {
        v["ios_per_round"] = json!(n);
    }
    for (pct, k) in [(50.0, "p50_us"), (99.0, "p99_us")] {
        if let Some(us) = r.percentile(pct) {
            v[k] = json!(us);
            v[format!("lat_{k}")] = json!(us);
        }
    }
    v
}

/// Runs `spdk_nvme_perf` (`perf`, its libraries in `../lib`) for `job` on `addr`, bound to
/// `uio_pci_generic`; the point. DPDK's start and the controller's attach and detach come before
/// and after the measured `-t` seconds; a run that outlives them by a minute is killed.
pub(super) fn measure(perf: &str, addr: &str, job: Job) -> Result<Value> {
    let lib = Path::new(perf).parent().and_then(Path::parent).context("spdk_nvme_perf's folder")?.join("lib");
    let out = Command::new("timeout")
        .args(["-k", "5", &(job.seconds + 60).to_string(), perf])
        .args(perf_args(job, addr)?)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .context("running spdk_nvme_perf")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("spdk_nvme_perf failed ({}):\n{text}", out.status);
    }
    let r = parse(&text).with_context(|| format!("spdk_nvme_perf said:\n{text}"))?;
    Ok(point(&r, job))
}

fn write(path: &str, value: &str) -> Result<()> {
    std::fs::write(path, value).with_context(|| format!("writing {value:?} to {path}"))
}

fn sh(cmd: &str) -> Result<String> {
    super::sh(cmd)
}

/// The guest's set-up for SPDK, once: the uio modules of the test kernel built at `kbuild`,
/// the guest's hugepages (reserved by every bench guest) on hugetlbfs, and a writable /run and /var/tmp (DPDK keeps its runtime folder in
/// /var/run, SPDK its lock files in /var/tmp: the host's, read-only, under the guest's chroot).
pub fn prepare(kbuild: &str) -> Result<()> {
    for m in ["uio", UIO] {
        if !Path::new(&format!("/sys/module/{m}")).exists() {
            let ko = format!("{kbuild}/drivers/uio/{m}.ko");
            sh(&format!("insmod {ko}")).with_context(|| format!("loading {ko}"))?;
        }
    }
    sh("grep -q ' /dev/hugepages hugetlbfs' /proc/mounts || { mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages; }")?;
    sh("grep -q ' /run tmpfs' /proc/mounts || mount -t tmpfs -o mode=755 run /run")?;
    // SPDK claims a controller with a lock file in /var/tmp.
    sh("grep -q ' /var/tmp tmpfs' /proc/mounts || mount -t tmpfs -o mode=1777 vartmp /var/tmp")?;
    Ok(())
}

fn driver(addr: &str) -> Option<String> {
    std::fs::read_link(format!("/sys/bus/pci/devices/{addr}/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Hands the controller at `addr` from the kernel's nvme driver to `uio_pci_generic`.
pub fn take(addr: &str) -> Result<()> {
    let dev = format!("/sys/bus/pci/devices/{addr}");
    if driver(addr).is_some() {
        write(&format!("{dev}/driver/unbind"), addr)?;
    }
    write(&format!("{dev}/driver_override"), UIO)?;
    write("/sys/bus/pci/drivers_probe", addr)?;
    let t = std::time::Instant::now();
    while driver(addr).as_deref() != Some(UIO) {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("{addr} did not bind to {UIO} (driver: {:?})", driver(addr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Gives the controller at `addr` back from `uio_pci_generic` to the kernel's nvme driver and
/// waits for its namespaces.
pub fn give_back(addr: &str) -> Result<()> {
    if driver(addr).as_deref() == Some(UIO) {
        write(&format!("/sys/bus/pci/devices/{addr}/driver/unbind"), addr)?;
    }
    bind::unbind(addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `spdk_nvme_perf -L` on one namespace, as 25.09 printed it in the VM (QD 1, 4 KiB random
    /// reads, null-backed controller; the per-second progress lines run into the first rule).
    const REPORT: &str = "\
Initializing NVMe Controllers
Attached to NVMe Controller at PCIE (0000:00:03.0) [1b36:0010]
Associating PCIE (0000:00:03.0) [1b36:0010] NSID 1 with lcore 0
Initialization complete. Launching workers.
     7236 IOPS,    28.27 MiB/s     6694 IOPS,    26.15 MiB/s========================================================
                                                                                       Latency(us)
Device Information                                 :       IOPS      MiB/s    Average        min        max
PCIE (0000:00:03.0) [1b36:0010] NSID 1 from core  0:    6965.50      27.21     144.05      24.08   43142.05
========================================================
Total                                              :    6965.50      27.21     144.05      24.08   43142.05

Summary latency data for PCIE (0000:00:03.0) [1b36:0010] NSID 1      from core 0:
=================================================================================
  1.00000% :    24.973us
 10.00000% :    25.287us
 25.00000% :    25.496us
 50.00000% :    42.005us
 75.00000% :    44.095us
 90.00000% :    71.889us
 95.00000% :   126.224us
 98.00000% :   461.427us
 99.00000% :  3450.671us
 99.50000% :  7329.332us
 99.90000% : 13642.188us
 99.99000% : 23432.464us
 99.99900% : 43227.011us
 99.99990% : 43227.011us
 99.99999% : 43227.011us

";

    fn job<'a>(rw: &'a str, size: &'a str, depth: usize) -> Job<'a> {
        Job { rw, size, depth, seconds: 2, span: "1G" }
    }

    #[test]
    fn the_job_maps_onto_perf_options() {
        let a = perf_args(job("randwrite", "128K", 32), "0000:00:05.0").unwrap();
        assert_eq!(
            a.join(" "),
            "-q 32 -o 131072 -w randwrite -t 2 -c 0x1 -r trtype:PCIe traddr:0000:00:05.0 -L --transport-stats"
        );
        assert_eq!(
            perf_args(job("randread", "4K", 1), "0000:00:04.0").unwrap()[..6],
            ["-q", "1", "-o", "4096", "-w", "randread"]
        );
        assert!(perf_args(job("randrw", "4K", 1), "x").is_err());
        assert!(perf_args(job("randread", "4Q", 1), "x").is_err());
        assert!(perf_args(job("randread", "4K", 0), "x").is_err());
    }

    #[test]
    fn the_report_parses_into_a_point() {
        let r = parse(REPORT).unwrap();
        assert_eq!((r.iops, r.mib_s, r.avg_us, r.min_us, r.max_us), (6965.50, 27.21, 144.05, 24.08, 43142.05));
        assert_eq!(r.percentiles.len(), 15);
        assert_eq!(r.percentile(50.0), Some(42.005));
        assert_eq!(r.percentile(99.0), Some(3450.671));
        assert_eq!(r.percentile(99.9), Some(13642.188));
        assert_eq!(r.percentile(42.0), None);
        let p = point(&r, job("randread", "4K", 1));
        assert_eq!(p["engine"], "spdk");
        assert_eq!((p["size"].as_str(), p["depth"].as_u64()), (Some("4K"), Some(1)));
        assert_eq!(
            (p["iops"].as_f64(), p["p50_us"].as_f64(), p["lat_p99_us"].as_f64()),
            (Some(6965.5), Some(42.005), Some(3450.671))
        );
        assert_eq!(p["latency"], "total");
        assert_eq!(p["max_us"].as_f64(), Some(43142.05));
    }

    /// Without `-L` no percentiles; a failed run (no Total line) or a mangled one is an error.
    /// `--transport-stats`' block as 25.09 printed it in the VM (4 KiB random reads, QD 8).
    const STATS: &str = "\
lcore 0, ns PCIE (0000:00:03.0) [1b36:0010] NSID 1 statistics:
PCIE transport:
\tpolls:               1577144
\tidle_polls:          1555029
\tcompletions:         176543
\tcq_mmio_doorbell_updates: 22110
\tcq_shadow_doorbell_updates: 22115
\tsubmitted_requests:  176543
\tsq_mmio_doorbell_updates:  22091
\tsq_shadow_doorbell_updates:  22115
\tqueued_requests:     0
";

    #[test]
    fn the_transport_stats_give_the_ios_per_round() {
        let with = format!("{STATS}{REPORT}");
        let r = parse(&with).unwrap();
        let n = r.ios_per_round.unwrap();
        assert!((n - 176543.0 / 22115.0).abs() < 1e-9, "{n}");
        assert_eq!(point(&r, job("randread", "4K", 8))["ios_per_round"], n);
        assert_eq!(parse(REPORT).unwrap().ios_per_round, None);
        assert!(point(&parse(REPORT).unwrap(), job("randread", "4K", 8)).get("ios_per_round").is_none());
        // No busy poll: no figure rather than a division by zero.
        let idle = with.replace("idle_polls:          1555029", "idle_polls:          1577144");
        assert_eq!(parse(&idle).unwrap().ios_per_round, None);
    }

    #[test]
    fn reports_without_latency_data_or_total_line() {
        let plain = &REPORT[..REPORT.find("Summary").unwrap()];
        let r = parse(plain).unwrap();
        assert!(r.percentiles.is_empty());
        assert!(point(&r, job("randread", "4K", 1)).get("p50_us").is_none());
        assert!(parse("EAL: Cannot create runtime directory\nspdk_nvme_perf: failed to init\n").is_err());
        assert!(parse("Total : 1.0 2.0 3.0\n").is_err());
        assert!(parse("Total : 1.0 2.0 x 4.0 5.0\n").is_err());
    }
}

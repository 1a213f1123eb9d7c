#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
//! `ugds`: inspect a controller bound to ugds, read and write it, and benchmark it.

use clap::{Args, CommandFactory, Parser, Subcommand};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::storage::TargetKind;
use ugds::{pattern, Device, DeviceOptions, Storage};

#[derive(Parser)]
#[command(name = "ugds", version, about = "User-space GPU Direct Storage: NVMe from user space")]
struct Cli {
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Parses 4096, 64K, 16M, 1G.
pub(crate) fn size(s: &str) -> Result<u64, String> {
    ugds::units::parse(s)
}

/// A size as [`size`] parses it, refusing 0 (an I/O size: offsets are computed modulo it).
pub(crate) fn nonzero_size(s: &str) -> Result<u64, String> {
    match ugds::units::parse(s)? {
        0 => Err("must be non-zero".into()),
        n => Ok(n),
    }
}

/// A duration in seconds: finite, positive and one a `Duration` holds.
pub(crate) fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("bad number of seconds {s:?}: {e}"))?;
    if !(v.is_finite() && v > 0.0) || Duration::try_from_secs_f64(v).is_err() {
        return Err(format!("{s} is not a positive, finite number of seconds"));
    }
    Ok(v)
}

#[derive(Args)]
pub(crate) struct Target {
    /// The target: a ugds node (/dev/ugds_drvN), a striped volume
    /// (stripe:[CHUNK:]/dev/ugds_drv0,/dev/ugds_drv1,..., or a descriptor file NAME.ugds-volume),
    /// a file or a block device.
    #[arg(value_name = "TARGET")]
    pub(crate) dev: String,
    /// Namespace id.
    #[arg(long, default_value_t = 1)]
    pub(crate) ns: u32,
}

#[derive(Subcommand)]
enum Cmd {
    /// Controller health: id-ctrl, id-ns, smart-log, error-log, fw-log (cli/src/health.rs).
    #[command(flatten)]
    Health(health::HealthCmd),
    /// Where SSDs sit relative to GPUs (same PCIe switch, root complex, NUMA node); with a
    /// target (a ugds node or a volume), its members against one GPU, warning for any member
    /// across the inter-socket link.
    Placement {
        /// A ugds node or a striped volume (spec, or descriptor file `*.ugds-volume`).
        target: Option<String>,
        /// The GPU: an index (in PCI order) or a PCI address (default: every GPU; with
        /// `--nearest`, this process's CUDA device).
        #[arg(long)]
        gpu: Option<String>,
        /// Print the target's members (or, without a target, the controllers bound to ugds) for
        /// one GPU, nearest first, one node a line.
        #[arg(long)]
        nearest: bool,
    },
    /// Controller, namespaces and limits.
    Info {
        /// The device node.
        dev: String,
    },
    /// Write a pattern or a file.
    Write {
        #[command(flatten)]
        t: Target,
        /// Device byte offset.
        #[arg(long, value_parser = size)]
        offset: u64,
        /// Bytes.
        #[arg(long, value_parser = size)]
        len: u64,
        /// Write the documented pattern with this seed.
        #[arg(long, conflicts_with = "from")]
        pattern: Option<u64>,
        /// Write this file's first LEN bytes.
        #[arg(long)]
        from: Option<String>,
    },
    /// Read to a file or check a pattern.
    Read {
        #[command(flatten)]
        t: Target,
        /// Device byte offset.
        #[arg(long, value_parser = size)]
        offset: u64,
        /// Bytes.
        #[arg(long, value_parser = size)]
        len: u64,
        /// Save the data here.
        #[arg(long, conflicts_with = "check_pattern")]
        to: Option<String>,
        /// Check against the pattern with this seed.
        #[arg(long)]
        check_pattern: Option<u64>,
    },
    /// I/O benchmark with fio's job options (--rw, --bs, --iodepth, --numjobs, --runtime, --size,
    /// --offset, --rwmixread) and latency percentiles.
    Bench(bench::BenchArgs),
    /// What decides the I/O path on this machine, each finding with a verdict and the fix. Exits
    /// with status 1 when a finding is `no` (it rules the direct path out).
    Doctor,
    #[command(flatten)]
    Ops(ops::OpsCmd),
    /// The fallback path into GPU memory vs pread(O_DIRECT)+copy vs the disk alone.
    BenchGpu {
        /// The file to read (created with a pattern when missing or short).
        #[arg(required_unless_present = "file_flag", conflicts_with = "file_flag")]
        file: Option<String>,
        /// The file, as an option (deprecated: give it as the first argument).
        #[arg(long = "file", hide = true)]
        file_flag: Option<String>,
        /// Its size.
        #[arg(long, value_parser = size, default_value = "2G")]
        file_size: u64,
        /// I/O sizes.
        #[arg(long, value_parser = nonzero_size, value_delimiter = ',', default_value = "4K,64K,1M,4M,16M")]
        sizes: Vec<u64>,
        /// Thread counts.
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        threads: Vec<usize>,
        /// Seconds per measurement.
        #[arg(long, value_parser = seconds, default_value_t = 1.0)]
        seconds: f64,
        /// Use the CPU stand-in runtime instead of CUDA.
        #[arg(long)]
        cpu: bool,
        /// Instead of bandwidth: each stage's latency (disk, copy, sync vs poll) for the sizes.
        #[arg(long)]
        breakdown: bool,
        /// Instead of bandwidth: batches of these depths (of the first size) against a naive
        /// pread + copy loop.
        #[arg(long, value_delimiter = ',')]
        depths: Option<Vec<usize>>,
    },
    /// Shell completions for bash, zsh, fish, elvish or PowerShell, on standard output
    /// (e.g. `ugds completions bash > /etc/bash_completion.d/ugds`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// The manual page (roff) on standard output, or with --dir one page per subcommand there
    /// (ugds.1, ugds-bench.1, ...).
    Man {
        /// Write every page into this folder instead.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

mod bench;
#[cfg(test)]
mod docs_check;
mod gpu_bench;
mod gpu_breakdown;
mod health;
mod ops;
mod rounds;

pub(crate) type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() {
    let cli = Cli::parse();
    // The library's notices (which path an open took, and why) on stderr, as warnings.
    ugds::logging::log_to_stderr(log::LevelFilter::Warn);
    if let Err(e) = run(cli) {
        eprintln!("ugds: error: {e}");
        std::process::exit(1);
    }
}

/// I/O in chunks of this size through one registration.
const CHUNK: u64 = 8 << 20;

fn run(cli: Cli) -> Res<()> {
    match cli.cmd {
        Cmd::Health(h) => health::run(h, cli.json)?,
        Cmd::Ops(c) => ops::run(c, cli.json)?,
        Cmd::Placement { target, gpu, nearest: true } => nearest(target.as_deref(), gpu.as_deref(), cli.json)?,
        Cmd::Placement { target, gpu, nearest: false } => placement(target.as_deref(), gpu.as_deref(), cli.json)?,
        Cmd::Doctor => doctor(cli.json)?,
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "ugds", &mut std::io::stdout());
        }
        Cmd::Man { dir: None } => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?,
        Cmd::Man { dir: Some(d) } => {
            std::fs::create_dir_all(&d)?;
            clap_mangen::generate_to(Cli::command(), &d)?;
        }
        Cmd::BenchGpu { file, file_flag, file_size, sizes, threads, seconds, cpu, breakdown, depths } => {
            let file = file.or(file_flag).ok_or("give the file to read")?;
            if breakdown || depths.is_some() {
                gpu_bench::prepare(&file, file_size)?;
                let gpu = if cpu { ugds::gpu::Gpu::cpu() } else { ugds::gpu::Gpu::cuda()? };
                if breakdown {
                    gpu_breakdown::breakdown(&file, file_size, &sizes, &gpu, cli.json)?;
                }
                if let Some(d) = depths {
                    let size = sizes.first().copied().unwrap_or(4096);
                    gpu_breakdown::depths(&file, file_size, size, &d, &gpu, cli.json)?;
                }
            } else {
                gpu_bench::run(gpu_bench::Params { file, file_size, sizes, threads, seconds, cpu, json: cli.json })?
            }
        }
        Cmd::Info { dev } if TargetKind::of(&dev)? != TargetKind::Node => {
            // What the resolver calls anything but a ugds node (a volume, a remote target, a file
            // or block device): the storage describes itself. A node shows its controller below.
            let s = Storage::open(&dev)?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"target": dev, "path": s.path_name(),
                        "describe": s.describe(), "direct_io": s.bypasses_page_cache(),
                        "capacity": s.capacity()?, "block_size": s.block_size()})
                );
            } else {
                println!("{dev}: {}", s.describe());
            }
        }
        Cmd::Info { dev } => {
            let d = Device::open_with(&dev, DeviceOptions { queues: 1, ..Default::default() })?;
            let i = d.info();
            let shadow = i.flags & ugds::uapi::ioctl::DEVICE_SHADOW_DOORBELLS != 0;
            if cli.json {
                let ns: Vec<_> = d
                    .namespaces()
                    .iter()
                    .map(|n| serde_json::json!({"id": n.id(), "block_size": n.block_size(), "capacity": n.capacity()}))
                    .collect();
                let v = serde_json::json!({
                    "target": dev, "path": "direct", "model": d.model(), "serial": d.serial(),
                    "firmware": d.firmware(), "mdts": i.mdts_bytes, "max_qpairs": i.max_qpairs,
                    "max_queue_entries": i.max_queue_entries, "irq_vectors": i.irq_vectors,
                    "shadow_doorbells": shadow, "namespaces": ns,
                });
                println!("{v}");
            } else {
                println!("{dev}: {} (serial {}, firmware {})", d.model(), d.serial(), d.firmware());
                println!(
                    "  MDTS {} bytes, {} I/O queue pairs of up to {} entries, {} interrupt vectors, shadow doorbells {}",
                    i.mdts_bytes,
                    i.max_qpairs,
                    i.max_queue_entries,
                    i.irq_vectors,
                    if shadow { "on" } else { "off" }
                );
                for n in d.namespaces() {
                    let extra = if n.metadata_bytes() > 0 || n.pi_type() > 0 {
                        format!(
                            "; {} bytes of metadata per block, PI type {}: not usable by ugds (format without metadata)",
                            n.metadata_bytes(),
                            n.pi_type()
                        )
                    } else {
                        String::new()
                    };
                    println!("  namespace {}: {} bytes in {}-byte blocks{extra}", n.id(), n.capacity(), n.block_size());
                }
            }
        }
        Cmd::Write { t, offset, len, pattern: seed, from } => {
            let file = match (&from, seed) {
                (Some(f), _) => Some(std::fs::read(f)?),
                (None, Some(_)) => None,
                (None, None) => return Err("give --pattern SEED or --from FILE".into()),
            };
            if file.as_ref().is_some_and(|f| (f.len() as u64) < len) {
                return Err(format!("{} holds fewer than --len {len} bytes", from.unwrap_or_default()).into());
            }
            let s = open_target(&t, DeviceOptions { queues: 1, ..Default::default() })?;
            // The whole range is checked before the first chunk goes out: a bad length or
            // offset is refused with the target unchanged (each chunk alone may look fine).
            s.check_range(offset, len)?;
            let buf = s.alloc_host(CHUNK.min(len).max(1) as usize)?;
            let start = Instant::now();
            let mut done = 0;
            let mut chunk = vec![0u8; CHUNK.min(len) as usize];
            while done < len {
                let n = CHUNK.min(len - done) as usize;
                match (&file, seed) {
                    (Some(f), _) => chunk[..n].copy_from_slice(&f[done as usize..done as usize + n]),
                    (None, Some(sd)) => pattern::fill(sd, offset + done, &mut chunk[..n]),
                    (None, None) => return Err("give --pattern SEED or --from FILE".into()),
                }
                buf.copy_in(0, &chunk[..n])?;
                s.write(&buf, 0, offset + done, n as u64)?;
                done += n as u64;
            }
            eprintln!("{}: {}", t.dev, s.describe());
            report(cli.json, "write", len, start.elapsed());
        }
        Cmd::Read { t, offset, len, to, check_pattern } => {
            let s = open_target(&t, DeviceOptions { queues: 1, ..Default::default() })?;
            // A bad range is refused before the output file is created or truncated.
            let cap = s.capacity()?;
            if offset.checked_add(len).is_none_or(|e| e > cap) {
                return Err(format!("[{offset}, +{len}) runs past the end of {} ({cap} bytes)", t.dev).into());
            }
            s.check_range(offset, len)?;
            let mut out = match &to {
                Some(p) => Some(std::fs::File::create(p)?),
                None => None,
            };
            let buf = s.alloc_host(CHUNK.min(len).max(1) as usize)?;
            let mut chunk = vec![0u8; CHUNK.min(len) as usize];
            let start = Instant::now();
            let mut done = 0;
            while done < len {
                let n = CHUNK.min(len - done) as usize;
                s.read(&buf, 0, offset + done, n as u64)?;
                buf.copy_out(0, &mut chunk[..n])?;
                if let Some(f) = out.as_mut() {
                    f.write_all(&chunk[..n])?;
                }
                if let Some(sd) = check_pattern {
                    if let Some(bad) = pattern::first_mismatch(sd, offset + done, &chunk[..n]) {
                        return Err(format!("pattern mismatch at byte offset {bad}").into());
                    }
                }
                done += n as u64;
            }
            eprintln!("{}: {}", t.dev, s.describe());
            report(cli.json, "read", len, start.elapsed());
        }
        Cmd::Bench(b) => bench::run(cli.json, b)?,
    }
    Ok(())
}

fn report(json: bool, op: &str, len: u64, t: Duration) {
    let gibs = len as f64 / t.as_secs_f64() / (1u64 << 30) as f64;
    if json {
        println!("{}", serde_json::json!({"op": op, "bytes": len, "seconds": t.as_secs_f64(), "gib_per_s": gibs}));
    } else {
        println!("{op}: {len} bytes in {:.3} s ({gibs:.3} GiB/s)", t.as_secs_f64());
    }
}

/// Opens the target as every face does ([`Storage::open_with`]): namespace `--ns` of a node or
/// of a volume's members, whose controllers take `opts`.
pub(crate) fn open_target(t: &Target, opts: DeviceOptions) -> Res<Arc<Storage>> {
    Ok(Storage::open_with(&t.dev, t.ns, &opts)?)
}

/// One finding of `ugds doctor --json`.
#[derive(serde::Serialize)]
struct FindingJson<'a> {
    topic: &'a str,
    verdict: &'static str,
    detail: &'a str,
    fix: &'a str,
    /// The predicted route of a `p2p route` finding.
    #[serde(skip_serializing_if = "Option::is_none")]
    p2p: Option<P2pJson<'a>>,
}

/// A predicted peer-to-peer route in `ugds doctor --json`.
#[derive(serde::Serialize)]
struct P2pJson<'a> {
    controller: &'a str,
    peer: &'a str,
    /// `switch`, `host_bridge`, `acs_redirect` or `unknown`.
    route: &'static str,
    /// Whether the kernel allows it; null when unknown.
    allowed: Option<bool>,
    /// The common upstream device (switch, acs_redirect).
    #[serde(skip_serializing_if = "Option::is_none")]
    bridge: Option<&'a str>,
    /// The devices whose ACS redirects (acs_redirect).
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    acs_redirect: &'a [String],
    /// The host bridges consulted (host_bridge, acs_redirect, unless the CPU decided).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    host_bridges: Vec<HostBridgeJson<'a>>,
    /// CPU 0's family when an AMD Zen or later decided (host_bridge, acs_redirect).
    #[serde(skip_serializing_if = "Option::is_none")]
    amd_zen_family: Option<u32>,
    /// Why it is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<&'a str>,
}

/// One host bridge the kernel's P2PDMA list is consulted for.
#[derive(serde::Serialize)]
struct HostBridgeJson<'a> {
    root_bus: &'a str,
    device: Option<&'a str>,
    /// `vvvv:dddd`.
    ids: String,
    /// `listed`, `same_host_bridge_only`, `not_listed` or `no_device` (`other` for a kind this
    /// build does not name).
    listing: &'static str,
}

impl<'a> P2pJson<'a> {
    fn of(c: &'a ugds::doctor::p2p::P2pCheck) -> P2pJson<'a> {
        use ugds::sysfs::{Listing, P2pRoute};
        let mut j = P2pJson {
            controller: &c.controller,
            peer: &c.peer,
            route: c.route.kind(),
            allowed: c.route.allowed(),
            bridge: None,
            acs_redirect: &[],
            host_bridges: Vec::new(),
            amd_zen_family: None,
            why: None,
        };
        let host = match &c.route {
            P2pRoute::Switch { bridge } => {
                j.bridge = Some(bridge);
                None
            }
            P2pRoute::HostBridge { host } => Some(host),
            P2pRoute::AcsRedirect { bridges, common, host } => {
                j.bridge = Some(common);
                j.acs_redirect = bridges;
                Some(host)
            }
            P2pRoute::Unknown { why } => {
                j.why = Some(why);
                None
            }
            _ => None,
        };
        if let Some(h) = host {
            j.amd_zen_family = h.amd_zen_family;
            j.host_bridges = h
                .host_bridges
                .iter()
                .map(|b| HostBridgeJson {
                    root_bus: &b.root_bus,
                    device: b.device.as_deref(),
                    ids: format!("{:04x}:{:04x}", b.ids.0, b.ids.1),
                    listing: match b.listing {
                        Listing::Listed => "listed",
                        Listing::SameHostBridgeOnly => "same_host_bridge_only",
                        Listing::NotListed => "not_listed",
                        Listing::NoDevice => "no_device",
                        _ => "other",
                    },
                })
                .collect();
        }
        j
    }
}

/// A verdict's name: `ok`, `warn`, `no` or `info`.
fn verdict_name(v: ugds::doctor::Verdict) -> &'static str {
    match v {
        ugds::doctor::Verdict::Ok => "ok",
        ugds::doctor::Verdict::Warn => "warn",
        ugds::doctor::Verdict::No => "no",
        ugds::doctor::Verdict::Info => "info",
    }
}

/// `ugds doctor`: the findings (one JSON object per line with `--json`); an error when any is
/// `no`, so scripts can gate on the exit status.
fn doctor(json: bool) -> Res<()> {
    let findings = ugds::doctor::diagnose();
    for f in &findings {
        let verdict = verdict_name(f.verdict);
        if json {
            let j = FindingJson {
                topic: f.topic,
                verdict,
                detail: &f.detail,
                fix: &f.fix,
                p2p: f.p2p.as_ref().map(P2pJson::of),
            };
            println!("{}", serde_json::to_string(&j)?);
            continue;
        }
        println!("[{verdict:^4}] {:<14} {}", f.topic, f.detail);
        if !f.fix.is_empty() {
            println!("       {:<14} fix: {}", "", f.fix);
        }
    }
    let no: Vec<&str> = findings.iter().filter(|f| f.verdict == ugds::doctor::Verdict::No).map(|f| f.topic).collect();
    if !no.is_empty() {
        return Err(format!("{} finding(s) rule the direct path out: {}", no.len(), no.join(", ")).into());
    }
    Ok(())
}

/// A proximity's name in `ugds placement --json`.
fn proximity_name(p: ugds::placement::Proximity) -> &'static str {
    use ugds::placement::Proximity::*;
    match p {
        SameSwitch => "same_switch",
        SameRootComplex => "same_root_complex",
        SameNumaNode => "same_numa_node",
        CrossSocket => "cross_socket",
    }
}

/// `ugds placement --nearest`: the target's members, or the bound controllers, nearest first for
/// one GPU (`--gpu`, else the calling thread's CUDA device).
fn nearest(target: Option<&str>, gpu: Option<&str>, json: bool) -> Res<()> {
    use ugds::placement::{resolve_gpu, thread_gpu, Topology};
    let topo = Topology::default();
    let g = match gpu {
        Some(g) => resolve_gpu(&topo, g)?,
        None => thread_gpu()?,
    };
    let nodes = topo.target_nodes(target)?;
    for (node, p) in topo.nearest(&g, &nodes)? {
        if json {
            println!(
                "{}",
                serde_json::json!({"node": node, "gpu": p.gpu, "ssd": p.ssd,
                    "proximity": proximity_name(p.proximity), "warning": p.warning()})
            );
        } else {
            println!("{node}\t{}\t{}", p.ssd, p.proximity.describe());
        }
    }
    Ok(())
}

/// `ugds placement`: GPU-SSD proximity from sysfs; warnings go to stderr.
fn placement(target: Option<&str>, gpu: Option<&str>, json: bool) -> Res<()> {
    use ugds::placement::{resolve_gpu, Topology};
    let topo = Topology::default();
    let gpus = match gpu {
        Some(g) => vec![resolve_gpu(&topo, g)?],
        None => topo.gpus(),
    };
    if gpus.is_empty() {
        println!("no GPU on the PCI bus: nothing to place SSDs against");
        return Ok(());
    }
    let members = target.map(|t| topo.target_nodes(Some(t))).transpose()?;
    for g in &gpus {
        let rows = match &members {
            Some(m) => topo.for_volume(g, m)?,
            None => topo.all().into_iter().filter(|p| &p.gpu == g).collect(),
        };
        for p in &rows {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"gpu": p.gpu, "ssd": p.ssd, "proximity": proximity_name(p.proximity),
                        "gpu_numa": p.gpu_numa, "ssd_numa": p.ssd_numa, "warning": p.warning()})
                );
            } else {
                println!("GPU {} <- SSD {}: {}", p.gpu, p.ssd, p.proximity.describe());
            }
            if let Some(w) = p.warning() {
                eprintln!("warning: {w}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod p2p_json_tests {
    use super::P2pJson;
    use ugds::doctor::p2p::P2pCheck;
    use ugds::sysfs::{HostBridge, HostBridgePath, Listing, P2pRoute};

    fn json(route: P2pRoute) -> serde_json::Value {
        let c = P2pCheck { controller: "0000:03:00.0".into(), peer: "0000:04:00.0".into(), route };
        serde_json::to_value(P2pJson::of(&c)).unwrap()
    }

    #[test]
    fn each_route_names_its_kind_verdict_and_devices() {
        let j = json(P2pRoute::Switch { bridge: "0000:01:00.0".into() });
        assert_eq!(
            j,
            serde_json::json!({"controller": "0000:03:00.0", "peer": "0000:04:00.0", "route": "switch",
                "allowed": true, "bridge": "0000:01:00.0"})
        );
        let host = HostBridgePath {
            whitelisted: false,
            amd_zen_family: None,
            host_bridges: vec![HostBridge {
                root_bus: "pci0000:00".into(),
                device: Some("0000:00:00.0".into()),
                ids: (0x8086, 0x29c0),
                listing: Listing::NotListed,
            }],
        };
        let j = json(P2pRoute::AcsRedirect {
            bridges: vec!["0000:02:00.0".into()],
            common: "0000:01:00.0".into(),
            host: host.clone(),
        });
        assert_eq!((j["route"].as_str(), j["allowed"].as_bool()), (Some("acs_redirect"), Some(false)));
        assert_eq!(j["acs_redirect"], serde_json::json!(["0000:02:00.0"]));
        assert_eq!(
            j["host_bridges"],
            serde_json::json!([{"root_bus": "pci0000:00", "device": "0000:00:00.0", "ids": "8086:29c0",
                "listing": "not_listed"}])
        );
        assert_eq!(json(P2pRoute::HostBridge { host })["route"], "host_bridge");
        let j = json(P2pRoute::Unknown { why: "only 64 bytes".into() });
        assert_eq!(
            (j["route"].as_str(), j["allowed"].is_null(), j["why"].as_str()),
            (Some("unknown"), true, Some("only 64 bytes"))
        );
    }
}

#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
//! `ugds`: inspect a controller bound to ugds, read and write it, and benchmark it.

use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::{pattern, Device, DeviceOptions, IoRequest, Storage, StorageBatch};

#[derive(Parser)]
#[command(name = "ugds", about = "User-space GPU Direct Storage: NVMe from user space")]
struct Cli {
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Parses 4096, 64K, 16M, 1G.
fn size(s: &str) -> Result<u64, String> {
    ugds::units::parse(s)
}

/// A size as [`size`] parses it, refusing 0 (an I/O size: offsets are computed modulo it).
fn nonzero_size(s: &str) -> Result<u64, String> {
    match ugds::units::parse(s)? {
        0 => Err("must be non-zero".into()),
        n => Ok(n),
    }
}

/// A duration in seconds: finite, positive and one a `Duration` holds.
fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("bad number of seconds {s:?}: {e}"))?;
    if !(v.is_finite() && v > 0.0) || Duration::try_from_secs_f64(v).is_err() {
        return Err(format!("{s} is not a positive, finite number of seconds"));
    }
    Ok(v)
}

#[derive(Args)]
struct Target {
    /// The target: a ugds node (/dev/ugds_drvN), a striped volume
    /// (stripe:[CHUNK:]/dev/ugds_drv0,/dev/ugds_drv1,..., or a descriptor file NAME.ugds-volume),
    /// a file or a block device.
    dev: String,
    /// Namespace id.
    #[arg(long, default_value_t = 1)]
    ns: u32,
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
    /// Random I/O benchmark.
    Bench {
        #[command(flatten)]
        t: Target,
        /// I/O size.
        #[arg(long, value_parser = nonzero_size, default_value = "4K")]
        size: u64,
        /// Threads (each runs one synchronous I/O at a time; the device gets a shared queue pair
        /// per thread, or with `--queue owned` each thread creates one of its own).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// read, write or mix (50/50).
        #[arg(long, default_value = "read")]
        rw: String,
        /// Seconds to run.
        #[arg(long, value_parser = seconds, default_value_t = 5.0)]
        seconds: f64,
        /// Working set (random offsets within it).
        #[arg(long, value_parser = size, default_value = "1G")]
        span: u64,
        /// Wait for completions on interrupts (eventfd) instead of busy polling.
        #[arg(long)]
        interrupts: bool,
        /// I/Os in flight per thread (1: synchronous calls; more: a batch kept full).
        #[arg(long, default_value_t = 1)]
        depth: usize,
        /// Queue pairs of the synchronous calls (depth 1): `shared` (the device's, one per
        /// thread, locked) or `owned` (each thread takes a queue pair of its own: no lock; direct
        /// path on one node only).
        #[arg(long, value_enum, default_value_t = QueueMode::Shared)]
        queue: QueueMode,
    },
    /// What decides the I/O path on this machine, each finding with a verdict and the fix.
    Doctor,
    #[command(flatten)]
    Ops(ops::OpsCmd),
    /// The fallback path into GPU memory vs pread(O_DIRECT)+copy vs the disk alone.
    BenchGpu {
        /// The file to read (created with a pattern when missing or short).
        #[arg(long)]
        file: String,
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
}

/// Which queue pairs `ugds bench`'s synchronous calls use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum QueueMode {
    /// The device's queue pairs, shared and locked (`Storage::read`/`write`).
    Shared,
    /// A queue pair of each thread's own (`Storage::owned_queue`).
    Owned,
}

impl QueueMode {
    fn name(self) -> &'static str {
        match self {
            QueueMode::Shared => "shared",
            QueueMode::Owned => "owned",
        }
    }
}

#[cfg(test)]
mod docs_check;
mod gpu_bench;
mod gpu_breakdown;
mod health;
mod ops;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() {
    let cli = Cli::parse();
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
        Cmd::Doctor => {
            let findings = ugds::doctor::diagnose();
            for f in &findings {
                if cli.json {
                    println!(
                        "{{\"topic\":{:?},\"verdict\":\"{:?}\",\"detail\":{:?},\"fix\":{:?}}}",
                        f.topic, f.verdict, f.detail, f.fix
                    );
                    continue;
                }
                let tag = match f.verdict {
                    ugds::doctor::Verdict::Ok => "[ ok ]",
                    ugds::doctor::Verdict::Warn => "[warn]",
                    ugds::doctor::Verdict::No => "[ no ]",
                    ugds::doctor::Verdict::Info => "[info]",
                };
                println!("{tag} {:<14} {}", f.topic, f.detail);
                if !f.fix.is_empty() {
                    println!("       {:<14} fix: {}", "", f.fix);
                }
            }
        }
        Cmd::BenchGpu { file, file_size, sizes, threads, seconds, cpu, breakdown, depths } => {
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
        Cmd::Info { dev } if !ugds::device::is_ugds_node(&dev) => {
            // A striped volume (direct path), a file or block device (fallback path).
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
            if cli.json {
                let ns: Vec<_> = d
                    .namespaces()
                    .iter()
                    .map(|n| serde_json::json!({"id": n.id(), "block_size": n.block_size(), "capacity": n.capacity()}))
                    .collect();
                let v = serde_json::json!({
                    "target": dev, "path": "direct", "model": d.model(), "serial": d.serial(),
                    "firmware": d.firmware(), "mdts": i.mdts_bytes, "max_qpairs": i.max_qpairs,
                    "max_queue_entries": i.max_queue_entries, "irq_vectors": i.irq_vectors, "namespaces": ns,
                });
                println!("{v}");
            } else {
                println!("{dev}: {} (serial {}, firmware {})", d.model(), d.serial(), d.firmware());
                println!(
                    "  MDTS {} bytes, {} I/O queue pairs of up to {} entries, {} interrupt vectors",
                    i.mdts_bytes, i.max_qpairs, i.max_queue_entries, i.irq_vectors
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
        Cmd::Bench { t, size, threads, rw, seconds, span, interrupts, depth, queue } => {
            bench(cli.json, &t, BenchArgs { depth, size, threads, rw, seconds, span, interrupts, queue })?
        }
    }
    Ok(())
}

fn report(json: bool, op: &str, len: u64, t: Duration) {
    let gibs = len as f64 / t.as_secs_f64() / (1u64 << 30) as f64;
    if json {
        println!("{{\"op\":\"{op}\",\"bytes\":{len},\"seconds\":{:.6},\"gib_per_s\":{gibs:.4}}}", t.as_secs_f64());
    } else {
        println!("{op}: {len} bytes in {:.3} s ({gibs:.3} GiB/s)", t.as_secs_f64());
    }
}

/// Opens the target: a ugds node or a striped volume (`stripe:[CHUNK:]NODE,...`) with `opts`
/// (the direct path), anything else as [`Storage::open`] does (the fallback path).
fn open_target(t: &Target, opts: DeviceOptions) -> Res<Arc<Storage>> {
    if t.dev.starts_with("stripe:") {
        let spec = ugds::VolumeSpec { nsid: t.ns, ..ugds::VolumeSpec::parse(&t.dev)? };
        Ok(Storage::volume(&spec, &opts)?)
    } else if ugds::device::is_ugds_node(&t.dev) {
        Ok(Storage::direct(&Device::open_with(&t.dev, opts)?, t.ns)?)
    } else {
        Ok(Storage::open(&t.dev)?)
    }
}

#[allow(clippy::too_many_arguments)]
/// Keeps `depth` I/Os in flight through a [`ugds::StorageBatch`], resubmitting as they
/// complete.
fn batch_loop(
    st: &Arc<Storage>,
    size: u64,
    span: u64,
    depth: usize,
    deadline: Duration,
    next: &mut dyn FnMut() -> u64,
    is_write: &dyn Fn(u64) -> bool,
    lat: &mut Vec<u32>,
) -> Res<()> {
    let total = usize::try_from(size).ok().and_then(|s| s.checked_mul(depth)).ok_or("--size x --depth overflows")?;
    let buf = Arc::new(st.alloc_host(total)?);
    let mut b = StorageBatch::new(st, depth)?;
    let mut sent = vec![Instant::now(); depth];
    let make = |slot: usize, next: &mut dyn FnMut() -> u64| {
        let r = next();
        IoRequest {
            op: if is_write(r) { ugds::Op::Write } else { ugds::Op::Read },
            buf: buf.clone(),
            buf_offset: slot as u64 * size,
            file_offset: (r % (span / size)) * size,
            len: size,
            cookie: slot as u64,
        }
    };
    // Start-up figure: the first full batch against the median of the next ten.
    let mut times = Vec::with_capacity(11);
    for _ in 0..11 {
        let ios: Vec<_> = (0..depth).map(|i| make(i, next)).collect();
        let t = Instant::now();
        b.submit(&ios)?;
        let ev = b.status(depth, Duration::from_secs(30))?;
        times.push(t.elapsed());
        if ev.iter().any(|e| e.status != ugds::IoStatus::Complete) {
            return Err("warm-up batch failed".into());
        }
    }
    let mut rest = times[1..].to_vec();
    rest.sort();
    eprintln!(
        "ugds bench: first batch of {depth} took {:.0} us, the median of the next 10 {:.0} us",
        times[0].as_secs_f64() * 1e6,
        rest[5].as_secs_f64() * 1e6
    );
    let first: Vec<_> = (0..depth).map(|i| make(i, next)).collect();
    let start = Instant::now();
    sent.iter_mut().for_each(|t| *t = Instant::now());
    b.submit(&first)?;
    while start.elapsed() < deadline {
        let ev = b.status(1, Duration::from_secs(30))?;
        let mut again = Vec::with_capacity(ev.len());
        for e in ev {
            if e.status != ugds::IoStatus::Complete {
                return Err(format!("batch I/O failed: {:?}", e.error).into());
            }
            let slot = e.cookie as usize;
            lat.push(sent[slot].elapsed().as_nanos().min(u32::MAX as u128) as u32);
            sent[slot] = Instant::now();
            again.push(make(slot, next));
        }
        b.submit(&again)?;
    }
    b.cancel()?;
    Ok(())
}

struct BenchArgs {
    depth: usize,
    size: u64,
    threads: usize,
    rw: String,
    seconds: f64,
    span: u64,
    interrupts: bool,
    queue: QueueMode,
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn bench(json: bool, t: &Target, a: BenchArgs) -> Res<()> {
    let BenchArgs { depth, size, threads, rw, seconds, span, interrupts, queue } = a;
    if depth == 0 {
        return Err("--depth must be at least 1".into());
    }
    if queue == QueueMode::Owned && depth > 1 {
        return Err("--queue owned is for synchronous calls (--depth 1); a batch has its own queue pair already".into());
    }
    let rw = rw.as_str();
    if !matches!(rw, "read" | "write" | "mix") {
        return Err(format!("--rw must be read, write or mix, not {rw:?}").into());
    }
    let open_start = Instant::now();
    // Owned queues are created per thread: the device keeps one shared queue pair of its own.
    let shared_queues = if queue == QueueMode::Owned { 1 } else { threads.max(1) };
    let st = open_target(t, DeviceOptions { queues: shared_queues, interrupts, ..Default::default() })?;
    let open_time = open_start.elapsed();
    let span = span.min(st.capacity()?) / size * size;
    if span == 0 {
        return Err("--span is smaller than --size".into());
    }
    let deadline = Duration::from_secs_f64(seconds);
    let cpu0 = cpu_time();
    let results: Vec<Res<Vec<u32>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|ti| {
                let st = &st;
                s.spawn(move || -> Res<Vec<u32>> {
                    let mut x = 0x9E37_79B9u64 ^ ((ti as u64 + 1) * 0x1234_5678_9ABC);
                    let mut next = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    let is_write = |r: u64| match rw {
                        "write" => true,
                        "mix" => r & 1 == 1,
                        _ => false,
                    };
                    let mut lat = Vec::with_capacity(1 << 20);
                    if depth > 1 {
                        return batch_loop(st, size, span, depth, deadline, &mut next, &is_write, &mut lat)
                            .map(|_| lat);
                    }
                    let buf = st.alloc_host(size as usize).map_err(|e| e.to_string())?;
                    let mut owned = match queue {
                        QueueMode::Owned => Some(st.owned_queue().map_err(|e| e.to_string())?),
                        QueueMode::Shared => None,
                    };
                    let start = Instant::now();
                    while start.elapsed() < deadline {
                        let r = next();
                        let off = (r % (span / size)) * size;
                        let t0 = Instant::now();
                        let done = match (owned.as_mut(), is_write(r)) {
                            (Some(q), true) => q.write(&buf, 0, off, size),
                            (Some(q), false) => q.read(&buf, 0, off, size),
                            (None, true) => st.write(&buf, 0, off, size),
                            (None, false) => st.read(&buf, 0, off, size),
                        };
                        done.map_err(|e| e.to_string())?;
                        lat.push(t0.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                    }
                    // Dropped here: its I/Os join the storage's path counts.
                    drop(owned);
                    Ok(lat)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into()))).collect()
    });
    let cpu = cpu_time() - cpu0;
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    all.sort_unstable();
    let n = all.len() as f64;
    let pct =
        |p: f64| all.get(((n * p) as usize).min(all.len().saturating_sub(1))).copied().unwrap_or(0) as f64 / 1000.0;
    let iops = n / seconds;
    let gibs = iops * size as f64 / (1u64 << 30) as f64;
    let cpu_us = cpu.as_secs_f64() * 1e6 / n.max(1.0);
    let mode = if interrupts { "interrupts" } else { "polling" };
    // The paths the I/Os took, as the storage counted them.
    let c = st.path_counts();
    if json {
        let v = serde_json::json!({
            "engine": "ugds", "target": t.dev, "path": st.path_name(),
            "rw": rw, "size": size, "threads": threads, "depth": depth,
            "ios": all.len(), "iops": iops, "gib_per_s": gibs, "p50_us": pct(0.5), "p99_us": pct(0.99),
            "open_ms": open_time.as_secs_f64() * 1e3, "mode": mode, "cpu_us_per_io": cpu_us,
            "queue": if depth > 1 { "batch" } else { queue.name() },
            "path_ios": {"direct_host": c.direct_host, "direct_p2p": c.direct_p2p,
                "direct_staged": c.direct_staged, "fallback": c.fallback, "remote": c.remote,
                "remote_staged": c.remote_staged},
        });
        println!("{v}");
    } else {
        println!(
            "ugds bench {rw} {size} B x {threads} thread(s) x depth {depth} ({} queues): {} I/Os, {iops:.0} IOPS, {gibs:.3} GiB/s, p50 {:.1} us, p99 {:.1} us, {mode}: {cpu_us:.1} us CPU per I/O (device open {:.1} ms); paths: {} direct into host memory, {} fallback, {} remote ({})",
            if depth > 1 { "batch" } else { queue.name() }, all.len(), pct(0.5), pct(0.99), open_time.as_secs_f64() * 1e3, c.direct_host, c.fallback, c.remote, st.describe()
        );
    }
    Ok(())
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
                    "proximity": format!("{:?}", p.proximity), "warning": p.warning()})
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
                    serde_json::json!({"gpu": p.gpu, "ssd": p.ssd, "proximity": format!("{:?}", p.proximity),
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

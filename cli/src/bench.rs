//! `ugds bench`: fio's job options on a ugds target (`--bs`, `--iodepth`, `--numjobs`,
//! `--runtime`, `--size`, `--offset`, `--rw`, `--rwmixread`, with fio's meanings), latency
//! percentiles from an HDR histogram, and one JSON object with `--json`.

use crate::{nonzero_size, open_target, seconds, size, Res, Target};
use clap::builder::TypedValueParser;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::{DeviceOptions, IoRequest, Storage, StorageBatch, Waiting};

/// fio's `rw`: the I/O pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Sequential, mixed reads and writes (`--rwmixread` of them reads).
    #[value(name = "rw", alias = "readwrite")]
    #[serde(rename = "rw")]
    ReadWrite,
    /// Random, mixed reads and writes (`--rwmixread` of them reads).
    Randrw,
}

impl Workload {
    /// Offsets drawn at random within the region (else one after the other, wrapping).
    fn random(self) -> bool {
        matches!(self, Workload::Randread | Workload::Randwrite | Workload::Randrw)
    }

    /// Percent of the I/Os that read.
    fn read_percent(self, rwmixread: u8) -> u8 {
        match self {
            Workload::Read | Workload::Randread => 100,
            Workload::Write | Workload::Randwrite => 0,
            Workload::ReadWrite | Workload::Randrw => rwmixread,
        }
    }
}

/// Which queue pairs `ugds bench`'s synchronous calls use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueMode {
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

/// `ugds bench`'s options, named and meant as fio's job options.
#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    t: Target,
    /// I/O pattern (fio's rw): read and write are sequential, randread, randwrite and randrw
    /// random, rw (readwrite) sequential and mixed.
    #[arg(long, value_enum, default_value_t = Workload::Read)]
    rw: Workload,
    /// Block size: bytes per I/O (fio's bs).
    #[arg(long, value_parser = nonzero_size, default_value = "4K")]
    bs: u64,
    /// I/Os in flight per job (1: synchronous calls; more: a batch kept full).
    #[arg(long, default_value_t = 1, alias = "depth")]
    iodepth: usize,
    /// Jobs: threads, each with its own I/Os in flight (the device gets a shared queue pair per
    /// job, or with `--queue owned` each job creates one of its own).
    #[arg(long, default_value_t = 1, alias = "threads")]
    numjobs: usize,
    /// Seconds to run (fio's runtime, time-based: sequential jobs wrap at the region's end).
    #[arg(long, value_parser = seconds, default_value_t = 5.0, alias = "seconds")]
    runtime: f64,
    /// The region I/O goes to, from --offset (fio's size; default: to the end of the target).
    #[arg(long, value_parser = size, alias = "span")]
    size: Option<u64>,
    /// Where the region starts (fio's offset; a multiple of --bs).
    #[arg(long, value_parser = size, default_value = "0")]
    offset: u64,
    /// Percent of a mixed workload's I/Os that read (fio's rwmixread; rw and randrw only).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    rwmixread: u8,
    /// How waits for completions wait on a ugds node: `adaptive` (spin while a core is free,
    /// then sleep on the queue's interrupt), `poll` (always spin) or `interrupts` (always sleep).
    #[arg(long, default_value = "adaptive", value_parser = clap::builder::PossibleValuesParser::new(["adaptive", "poll", "interrupts"]).try_map(|s| s.parse::<Waiting>()))]
    wait: Waiting,
    /// Queue pairs of the synchronous calls (iodepth 1): `shared` (the device's, one per job,
    /// locked) or `owned` (each job takes a queue pair of its own: no lock; direct path on one
    /// node only).
    #[arg(long, value_enum, default_value_t = QueueMode::Shared)]
    queue: QueueMode,
}

/// One job's offsets and directions: sequential from the region's start (wrapping) or random
/// in it, and reads for `read_percent` of the I/Os.
struct Pattern {
    random: bool,
    read_percent: u64,
    /// Blocks of `bs` in the region.
    blocks: u64,
    /// The next sequential block.
    pos: u64,
    /// xorshift64 state (the offsets' and the read/write mix's source).
    x: u64,
}

impl Pattern {
    fn new(rw: Workload, rwmixread: u8, blocks: u64, job: usize) -> Pattern {
        Pattern {
            random: rw.random(),
            read_percent: u64::from(rw.read_percent(rwmixread)),
            blocks,
            pos: 0,
            x: 0x9E37_79B9u64 ^ ((job as u64 + 1) * 0x1234_5678_9ABC),
        }
    }

    fn rand(&mut self) -> u64 {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        self.x
    }

    /// The next I/O: its block within the region and whether it writes.
    fn next(&mut self) -> (u64, bool) {
        let block = if self.random {
            self.rand() % self.blocks
        } else {
            let b = self.pos;
            self.pos = (self.pos + 1) % self.blocks;
            b
        };
        // Drawn separately from the offset, so a mixed sequential job mixes too.
        let write = match self.read_percent {
            100 => false,
            0 => true,
            p => self.rand() % 100 >= p,
        };
        (block, write)
    }
}

/// Latencies of one direction, in nanoseconds.
struct Lat {
    read: Histogram<u64>,
    write: Histogram<u64>,
}

impl Lat {
    fn new() -> Res<Lat> {
        // Three significant digits (0.1 % resolution), auto-resizing from 1 ns up.
        Ok(Lat { read: Histogram::new(3)?, write: Histogram::new(3)? })
    }

    fn record(&mut self, write: bool, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        let h = if write { &mut self.write } else { &mut self.read };
        // Auto-resizing: recording only fails past u64::MAX / 2 ns (centuries).
        let _ = h.record(ns);
    }

    fn add(&mut self, o: &Lat) -> Res<()> {
        self.read.add(&o.read)?;
        self.write.add(&o.write)?;
        Ok(())
    }
}

/// A latency distribution in microseconds, as fio reports its percentiles.
#[derive(Debug, Serialize, PartialEq)]
pub struct Latency {
    /// I/Os measured.
    pub ios: u64,
    /// Smallest.
    pub min_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p99_9_us: f64,
    /// 99.99th percentile.
    pub p99_99_us: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Latency {
        let us = |ns: u64| ns as f64 / 1000.0;
        if h.is_empty() {
            return Latency {
                ios: 0,
                min_us: 0.0,
                avg_us: 0.0,
                max_us: 0.0,
                p50_us: 0.0,
                p90_us: 0.0,
                p99_us: 0.0,
                p99_9_us: 0.0,
                p99_99_us: 0.0,
            };
        }
        Latency {
            ios: h.len(),
            min_us: us(h.min()),
            avg_us: h.mean() / 1000.0,
            max_us: us(h.max()),
            p50_us: us(h.value_at_quantile(0.5)),
            p90_us: us(h.value_at_quantile(0.9)),
            p99_us: us(h.value_at_quantile(0.99)),
            p99_9_us: us(h.value_at_quantile(0.999)),
            p99_99_us: us(h.value_at_quantile(0.9999)),
        }
    }
}

/// One direction's figures.
#[derive(Debug, Serialize)]
pub struct Side {
    /// I/Os per second.
    pub iops: f64,
    /// GiB per second.
    pub gib_per_s: f64,
    /// Latency, call to return (one I/O's, in a batch its submission to its completion).
    pub lat: Latency,
}

/// I/Os per path, as the storage counted them.
#[derive(Debug, Serialize)]
pub struct PathIos {
    direct_host: u64,
    direct_p2p: u64,
    direct_staged: u64,
    fallback: u64,
    remote: u64,
    remote_staged: u64,
}

/// `ugds bench --json`: the job, totals with their latency distribution flat (the keys
/// `cargo xtask bench` reads), and each direction that ran.
#[derive(Debug, Serialize)]
pub struct Report {
    engine: &'static str,
    target: String,
    path: &'static str,
    rw: Workload,
    bs: u64,
    iodepth: usize,
    numjobs: usize,
    runtime_s: f64,
    offset: u64,
    size: u64,
    rwmixread: Option<u8>,
    iops: f64,
    gib_per_s: f64,
    /// All I/Os' count (`ios`) and latency, flat.
    #[serde(flatten)]
    lat: Latency,
    read: Option<Side>,
    write: Option<Side>,
    open_ms: f64,
    mode: &'static str,
    cpu_us_per_io: f64,
    queue: &'static str,
    path_ios: PathIos,
    /// The most contiguous bus ranges one job's buffer is in (direct path only): 1 per 2 MiB
    /// where the buffers came from huge pages.
    buffer_dma_segments: Option<usize>,
    /// A batch's I/Os per round (one wait, then one submit of what the wait returned), over all
    /// jobs: what one submission, and its doorbell write, carried. Batches only.
    ios_per_round: Option<f64>,
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct we pass; zeroed is a valid `rusage`.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// A job's buffer of at least `len` bytes, rounded up to whole 2 MiB so that it comes from huge
/// pages where the system has them free (as `spdk_nvme_perf`'s do): contiguous memory spares
/// the device a descriptor per page.
fn job_buffer(st: &Storage, len: usize) -> Res<ugds::Buffer> {
    let len = len.checked_next_multiple_of(2 << 20).ok_or("the job's buffer size overflows")?;
    Ok(st.alloc_host(len)?)
}

/// What one job needs to know.
struct Job<'a> {
    st: &'a Arc<Storage>,
    bs: u64,
    offset: u64,
    depth: usize,
    deadline: Duration,
}

/// A batch loop's rounds (one wait, then one submit of what it returned) and the I/Os they
/// submitted, the first full batch included: how many I/Os a submission's doorbell carried.
#[derive(Debug, Default, Clone, Copy)]
struct BatchRounds {
    rounds: u64,
    ios: u64,
}

/// Keeps `depth` I/Os in flight through a [`ugds::StorageBatch`], resubmitting as they
/// complete; counts its rounds into `rounds`.
fn batch_loop(j: &Job, pat: &mut Pattern, lat: &mut Lat, rounds: &mut BatchRounds) -> Res<Option<usize>> {
    let (st, bs, depth) = (j.st, j.bs, j.depth);
    let total = usize::try_from(bs).ok().and_then(|s| s.checked_mul(depth)).ok_or("--bs x --iodepth overflows")?;
    let buf = Arc::new(job_buffer(st, total)?);
    let mut b = StorageBatch::new(st, depth)?;
    let mut sent = vec![(Instant::now(), false); depth];
    let make = |slot: usize, pat: &mut Pattern| {
        let (block, write) = pat.next();
        let req = IoRequest {
            op: if write { ugds::Op::Write } else { ugds::Op::Read },
            buf: buf.clone(),
            buf_offset: slot as u64 * bs,
            file_offset: j.offset + block * bs,
            len: bs,
            cookie: slot as u64,
        };
        (req, write)
    };
    // Start-up figure: the first full batch against the median of the next ten.
    let mut times = Vec::with_capacity(11);
    for _ in 0..11 {
        let ios: Vec<_> = (0..depth).map(|i| make(i, pat).0).collect();
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
    let mut first = Vec::with_capacity(depth);
    let start = Instant::now();
    for (slot, s) in sent.iter_mut().enumerate() {
        let (req, write) = make(slot, pat);
        *s = (start, write);
        first.push(req);
    }
    b.submit(&first)?;
    *rounds = BatchRounds { rounds: 1, ios: first.len() as u64 };
    // Kept from one round to the next: the loop allocates nothing.
    let (mut ev, mut again) = (Vec::with_capacity(depth), first);
    loop {
        b.status_into(1, Duration::from_secs(30), &mut ev)?;
        // One clock read per round, not two per I/O: it ends the latency of every I/O the wait
        // returned (all found by the same wait), starts that of every I/O submitted next, and
        // checks the deadline.
        let now = Instant::now();
        let over = now.duration_since(start) >= j.deadline;
        again.clear();
        for e in ev.drain(..) {
            if e.status != ugds::IoStatus::Complete {
                return Err(format!("batch I/O failed: {:?}", e.error).into());
            }
            let slot = e.cookie as usize;
            let (t0, write) = sent[slot];
            lat.record(write, now.duration_since(t0));
            if !over {
                let (req, write) = make(slot, pat);
                sent[slot] = (now, write);
                again.push(req);
            }
        }
        if over {
            break;
        }
        b.submit(&again)?;
        rounds.rounds += 1;
        rounds.ios += again.len() as u64;
    }
    b.cancel()?;
    Ok(buf.dma_segments())
}

/// One job of synchronous calls (iodepth 1).
fn sync_loop(j: &Job, queue: QueueMode, pat: &mut Pattern, lat: &mut Lat) -> Res<Option<usize>> {
    let (st, bs) = (j.st, j.bs);
    let buf = job_buffer(st, usize::try_from(bs)?)?;
    let mut owned = match queue {
        QueueMode::Owned => Some(st.owned_queue()?),
        QueueMode::Shared => None,
    };
    let start = Instant::now();
    while start.elapsed() < j.deadline {
        let (block, write) = pat.next();
        let off = j.offset + block * bs;
        let t0 = Instant::now();
        match (owned.as_mut(), write) {
            (Some(q), true) => q.write(&buf, 0, off, bs),
            (Some(q), false) => q.read(&buf, 0, off, bs),
            (None, true) => st.write(&buf, 0, off, bs),
            (None, false) => st.read(&buf, 0, off, bs),
        }?;
        lat.record(write, t0.elapsed());
    }
    // Dropped here: its I/Os join the storage's path counts.
    drop(owned);
    Ok(buf.dma_segments())
}

/// The region's blocks: `size` bytes (default: to the end) from `offset`, whole blocks only.
fn region_blocks(capacity: u64, offset: u64, size: Option<u64>, bs: u64) -> Res<u64> {
    if !offset.is_multiple_of(bs) {
        return Err(format!("--offset {offset} is not a multiple of --bs {bs}").into());
    }
    if offset >= capacity {
        return Err(format!("--offset {offset} is at or past the end of the target ({capacity} bytes)").into());
    }
    let len = size.unwrap_or(capacity - offset).min(capacity - offset);
    match len / bs {
        0 => Err(format!("the region (--size {len} from --offset {offset}) is smaller than --bs {bs}").into()),
        n => Ok(n),
    }
}

/// Runs the benchmark and prints its report.
pub fn run(json: bool, a: BenchArgs) -> Res<()> {
    let BenchArgs { t, rw, bs, iodepth, numjobs, runtime, size, offset, rwmixread, wait, queue } = a;
    if iodepth == 0 || numjobs == 0 {
        return Err("--iodepth and --numjobs must be at least 1".into());
    }
    if queue == QueueMode::Owned && iodepth > 1 {
        return Err(
            "--queue owned is for synchronous calls (--iodepth 1); a batch has its own queue pair already".into()
        );
    }
    let open_start = Instant::now();
    // Owned queues are created per job: the device keeps one shared queue pair of its own.
    let shared_queues = if queue == QueueMode::Owned { 1 } else { numjobs };
    // No per-thread queues: `--queue shared` measures the device's shared, locked queue pairs
    // (what a thread gets when the controller has none to spare), `--queue owned` the jobs'
    // `OwnedQueue`s.
    let opts = DeviceOptions { queues: shared_queues, thread_queues: Some(0), waiting: wait, ..Default::default() };
    let st = open_target(&t, opts)?;
    let open_time = open_start.elapsed();
    let blocks = region_blocks(st.capacity()?, offset, size, bs)?;
    let job = Job { st: &st, bs, offset, depth: iodepth, deadline: Duration::from_secs_f64(runtime) };
    let cpu0 = cpu_time();
    let results: Vec<Res<(Lat, Option<usize>, BatchRounds)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..numjobs)
            .map(|ji| {
                let job = &job;
                s.spawn(move || -> Res<(Lat, Option<usize>, BatchRounds)> {
                    let mut pat = Pattern::new(rw, rwmixread, blocks, ji);
                    let mut lat = Lat::new()?;
                    let mut rounds = BatchRounds::default();
                    let segs = if iodepth > 1 {
                        batch_loop(job, &mut pat, &mut lat, &mut rounds)?
                    } else {
                        sync_loop(job, queue, &mut pat, &mut lat)?
                    };
                    Ok((lat, segs, rounds))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a job panicked".into()))).collect()
    });
    let cpu = cpu_time() - cpu0;
    let mut all = Lat::new()?;
    let mut segments = None;
    let mut rounds = BatchRounds::default();
    for r in results {
        let (lat, segs, r) = r?;
        all.add(&lat)?;
        segments = segments.max(segs);
        rounds.rounds += r.rounds;
        rounds.ios += r.ios;
    }
    let mut both = all.read.clone();
    both.add(&all.write)?;
    let side = |h: &Histogram<u64>| Side {
        iops: h.len() as f64 / runtime,
        gib_per_s: h.len() as f64 * bs as f64 / runtime / (1u64 << 30) as f64,
        lat: Latency::of(h),
    };
    let total = side(&both);
    let reads = rw.read_percent(rwmixread) > 0;
    let writes = rw.read_percent(rwmixread) < 100;
    let c = st.path_counts();
    let report = Report {
        engine: "ugds",
        target: t.dev.clone(),
        path: st.path_name(),
        rw,
        bs,
        iodepth,
        numjobs,
        runtime_s: runtime,
        offset,
        size: blocks * bs,
        rwmixread: matches!(rw, Workload::ReadWrite | Workload::Randrw).then_some(rwmixread),
        iops: total.iops,
        gib_per_s: total.gib_per_s,
        lat: total.lat,
        read: reads.then(|| side(&all.read)),
        write: writes.then(|| side(&all.write)),
        open_ms: open_time.as_secs_f64() * 1e3,
        mode: st.waiting().map_or("kernel", Waiting::name),
        cpu_us_per_io: cpu.as_secs_f64() * 1e6 / (both.len() as f64).max(1.0),
        queue: if iodepth > 1 { "batch" } else { queue.name() },
        path_ios: PathIos {
            direct_host: c.direct_host,
            direct_p2p: c.direct_p2p,
            direct_staged: c.direct_staged,
            fallback: c.fallback,
            remote: c.remote,
            remote_staged: c.remote_staged,
        },
        buffer_dma_segments: segments,
        ios_per_round: (rounds.rounds > 0).then(|| rounds.ios as f64 / rounds.rounds as f64),
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report, &st);
    }
    Ok(())
}

/// The human form: fio's shape (one block per direction, percentiles on a line).
fn print_report(r: &Report, st: &Storage) {
    println!(
        "ugds bench: rw={} bs={} iodepth={} numjobs={} runtime={}s size={} offset={} ({} queues, {})",
        serde_json::to_value(r.rw).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
        ugds::units::human(r.bs),
        r.iodepth,
        r.numjobs,
        r.runtime_s,
        ugds::units::human(r.size),
        r.offset,
        r.queue,
        r.mode
    );
    for (name, s) in [("read", &r.read), ("write", &r.write)] {
        let Some(s) = s else { continue };
        let l = &s.lat;
        println!("  {name}: {} I/Os, IOPS={:.0}, BW={:.3} GiB/s", l.ios, s.iops, s.gib_per_s);
        println!("    lat (us): min={:.1}, avg={:.1}, max={:.1}", l.min_us, l.avg_us, l.max_us);
        println!(
            "    percentiles (us): 50th={:.1}, 90th={:.1}, 99th={:.1}, 99.9th={:.1}, 99.99th={:.1}",
            l.p50_us, l.p90_us, l.p99_us, l.p99_9_us, l.p99_99_us
        );
    }
    let c = &r.path_ios;
    println!(
        "  {:.1} us CPU per I/O (device open {:.1} ms); paths: {} direct into host memory, {} fallback, {} remote ({})",
        r.cpu_us_per_io,
        r.open_ms,
        c.direct_host,
        c.fallback,
        c.remote,
        st.describe()
    );
    if let Some(n) = r.buffer_dma_segments {
        println!("  buffers: at most {n} DMA segments each");
    }
    if let Some(n) = r.ios_per_round {
        println!("  batch: {n:.2} I/Os per round (a wait, then a submit and its doorbell write)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_jobs_walk_the_region_and_wrap() {
        let mut p = Pattern::new(Workload::Read, 50, 3, 0);
        let got: Vec<_> = (0..7).map(|_| p.next()).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2, 0].map(|b| (b, false)));
        let mut w = Pattern::new(Workload::Write, 50, 2, 1);
        assert!((0..10).all(|_| w.next().1));
    }

    #[test]
    fn random_offsets_stay_in_the_region_and_mixes_follow_rwmixread() {
        for (rw, mix, lo, hi) in [
            (Workload::Randrw, 70, 6500, 7500),
            (Workload::ReadWrite, 30, 2500, 3500),
            (Workload::Randread, 10, 10000, 10000),
        ] {
            let mut p = Pattern::new(rw, mix, 5, 2);
            let mut reads = 0;
            let mut seen = [false; 5];
            for _ in 0..10000 {
                let (b, write) = p.next();
                assert!(b < 5);
                seen[b as usize] = true;
                reads += u32::from(!write);
            }
            assert!((lo..=hi).contains(&reads), "{rw:?} {mix}: {reads} reads");
            assert!(seen.iter().all(|&s| s));
        }
        // Sequential mixed: offsets still in order.
        let mut p = Pattern::new(Workload::ReadWrite, 50, 4, 0);
        assert_eq!((0..5).map(|_| p.next().0).collect::<Vec<_>>(), [0, 1, 2, 3, 0]);
    }

    #[test]
    fn percentiles_come_from_the_histogram() {
        let mut l = Lat::new().unwrap();
        for us in 1..=10_000u64 {
            l.record(false, Duration::from_micros(us));
        }
        let s = Latency::of(&l.read);
        assert_eq!(s.ios, 10_000);
        // Three significant digits: within 0.1 %.
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 0.001;
        assert!(near(s.min_us, 1.0) && near(s.max_us, 10_000.0), "{s:?}");
        assert!(near(s.avg_us, 5000.5), "{s:?}");
        for (got, want) in [(s.p50_us, 5000.0), (s.p90_us, 9000.0), (s.p99_us, 9900.0), (s.p99_9_us, 9990.0)] {
            assert!(near(got, want), "{got} vs {want}: {s:?}");
        }
        assert!(near(s.p99_99_us, 9999.0), "{s:?}");
        assert_eq!(Latency::of(&l.write).ios, 0);
    }

    #[test]
    fn the_region_is_whole_blocks_inside_the_target() {
        assert_eq!(region_blocks(1 << 20, 0, None, 4096).unwrap(), 256);
        assert_eq!(region_blocks(1 << 20, 8192, Some(10_000), 4096).unwrap(), 2);
        // Past the end: clipped.
        assert_eq!(region_blocks(1 << 20, 8192, Some(1 << 30), 4096).unwrap(), 254);
        for (off, size) in [(100, None), (1 << 20, None), (0, Some(4095))] {
            assert!(region_blocks(1 << 20, off, size, 4096).is_err(), "{off} {size:?}");
        }
    }
}

//! `ugds bench-gpu --breakdown` and `--depths`: where a small read into GPU memory spends its
//! time on the fallback path (the disk alone, the host-to-device copy alone, the whole read
//! with the copy waited for by blocking or by polling, and the naive pread + copy), and how a
//! batch of N reads, and a stream-ordered group of N reads, compare with N naive reads one
//! after another. Every figure comes from
//! the same run, the methods taking turns so the disk's drift hits all of them alike.

use crate::gpu_bench::pread_pinned;
use crate::rounds::{self, median, Ratio};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::batch::{IoStatus, Op};
use ugds::gpu::{CopyQueue, CopyWait, Gpu, GpuMemory, PinnedHost};
use ugds::{AsyncArgs, AsyncOp, IoRequest, Storage, StorageBatch, StreamIo};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Samples per method, taken in rounds that alternate the methods.
const SAMPLES: usize = 1500;
const ROUND: usize = 100;

fn offset(n: u64, size: u64, file_size: u64) -> u64 {
    crate::gpu_bench::offset(0, n, size, file_size)
}

/// Per-size latency of each stage, p50 in microseconds.
pub fn breakdown(file: &str, file_size: u64, sizes: &[u64], gpu: &Arc<Gpu>, json: bool) -> Res<()> {
    let st = Storage::open(file)?;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(file)?;
    let fd = f.as_raw_fd();
    if !json {
        println!("breakdown (p50 of {SAMPLES} each, microseconds; one thread):");
        println!(
            "{:>6} {:>8} {:>10} {:>10} {:>12} {:>12} {:>12} {:>10} {:>10}",
            "size", "disk", "copy+sync", "copy+poll", "ugds block", "ugds poll", "pread+copy", "poll-disk", "poll/disk"
        );
    }
    let mut rows = Vec::new();
    for &size in sizes {
        let mem = Arc::new(gpu.alloc(size as usize)?);
        let buf = st.register_gpu(mem.clone(), true)?;
        let pinned = gpu.alloc_pinned(size as usize)?;
        let mut q = gpu.runtime().copy_queue()?;
        let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        let mut n = 0u64;
        let pread = |n: u64| pread_pinned(fd, &pinned, size, offset(n, size, file_size));
        while t[0].len() < SAMPLES {
            for (method, samples) in t.iter_mut().enumerate() {
                for _ in 0..ROUND {
                    n += 1;
                    let start = Instant::now();
                    match method {
                        0 => pread(n)?,
                        1 | 2 | 5 => {
                            if method == 5 {
                                pread(n)?;
                            }
                            // SAFETY: `pinned` holds `size` bytes, unchanged until the wait
                            // below; `mem` is `size` bytes of device memory.
                            unsafe { q.to_device(mem.device_ptr(), pinned.as_ptr(), size as usize)? };
                            if method == 2 {
                                while !q.poll()? {
                                    std::hint::spin_loop();
                                }
                            } else {
                                q.wait()?;
                            }
                        }
                        _ => {
                            gpu.set_copy_wait(if method == 3 { CopyWait::Block } else { CopyWait::Poll });
                            let got = st.read(&buf, 0, offset(n, size, file_size), size)?;
                            if got != size {
                                return Err(format!("short read: {got} of {size}").into());
                            }
                        }
                    }
                    samples.push(start.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        gpu.set_copy_wait(CopyWait::Auto);
        let m: Vec<f64> = t.iter().map(|v| median(v)).collect();
        let (disk, poll) = (m[0], m[4]);
        if json {
            rows.push(serde_json::json!({"size": size, "disk_us": m[0], "copy_sync_us": m[1], "copy_poll_us": m[2],
                "ugds_block_us": m[3], "ugds_poll_us": m[4], "pread_copy_us": m[5]}));
        } else {
            println!(
                "{:>6} {:>8.1} {:>10.1} {:>10.1} {:>12.1} {:>12.1} {:>12.1} {:>+10.1} {:>9.2}x",
                ugds::units::human(size),
                m[0],
                m[1],
                m[2],
                m[3],
                m[4],
                m[5],
                poll - disk,
                poll / disk
            );
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(rows));
    }
    Ok(())
}

/// Runs `reps` batches of `bufs.len()` reads of `size` through `b`, each entry into its own
/// buffer; returns I/Os per second.
fn batch_iops(
    b: &mut StorageBatch,
    bufs: &[Arc<ugds::Buffer>],
    size: u64,
    file_size: u64,
    reps: usize,
    n: &mut u64,
) -> Res<f64> {
    let d = bufs.len();
    let start = Instant::now();
    for _ in 0..reps {
        let reqs: Vec<IoRequest> = bufs
            .iter()
            .enumerate()
            .map(|(i, buf)| {
                *n += 1;
                IoRequest {
                    op: Op::Read,
                    buf: buf.clone(),
                    buf_offset: 0,
                    file_offset: offset(*n, size, file_size),
                    len: size,
                    cookie: i as u64,
                }
            })
            .collect();
        b.submit(&reqs)?;
        let mut got = 0;
        while got < d {
            let ev = b.status(d - got, Duration::from_secs(30))?;
            if ev.is_empty() {
                return Err("a batch made no progress in 30 s".into());
            }
            if let Some(e) = ev.iter().find(|e| e.status != IoStatus::Complete) {
                return Err(format!("batch entry failed: {e:?}").into());
            }
            got += ev.len();
        }
    }
    Ok((reps * d) as f64 / start.elapsed().as_secs_f64())
}

/// Runs `reps` stream-ordered groups of `bufs.len()` reads of `size`, each entry into its own
/// buffer, each group queued on `sio`'s stream and then synchronized; returns I/Os per second.
fn stream_iops(
    sio: &StreamIo,
    st: &Arc<Storage>,
    bufs: &[Arc<ugds::Buffer>],
    size: u64,
    file_size: u64,
    reps: usize,
    n: &mut u64,
) -> Res<f64> {
    let start = Instant::now();
    for _ in 0..reps {
        let ops: Vec<AsyncOp> = bufs
            .iter()
            .map(|buf| {
                *n += 1;
                let args = AsyncArgs::new(size, offset(*n, size, file_size) as i64, 0);
                AsyncOp { op: Op::Read, buf: buf.clone(), args }
            })
            .collect();
        sio.submit(st, &ops)?;
        sio.synchronize()?;
        if let Some(o) = ops.iter().find(|o| o.args.result() != size as i64) {
            return Err(format!("a stream-ordered read returned {}", o.args.result()).into());
        }
    }
    Ok((reps * bufs.len()) as f64 / start.elapsed().as_secs_f64())
}

/// Runs `count` naive reads of `size` one after another (pread into `pinned`, copy into `mem`
/// on `q`, wait); returns I/Os per second.
#[allow(clippy::too_many_arguments)]
fn naive_iops(
    fd: std::os::fd::RawFd,
    pinned: &PinnedHost,
    q: &mut dyn CopyQueue,
    mem: &GpuMemory,
    size: u64,
    file_size: u64,
    count: usize,
    n: &mut u64,
) -> Res<f64> {
    let start = Instant::now();
    for _ in 0..count {
        *n += 1;
        pread_pinned(fd, pinned, size, offset(*n, size, file_size))?;
        // SAFETY: `pinned` holds the `size` bytes just read and is not reused before the wait
        // below; `mem` is `size` bytes of device memory (allocated for reads of `size`).
        unsafe { q.to_device(mem.device_ptr(), pinned.as_ptr(), size as usize)? };
        q.wait()?;
    }
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// Rounds of the depth sweep.
const DEPTH_ROUNDS: usize = 5;

/// A batch of `depth` reads of `size` into GPU memory, and a stream-ordered group of `depth`
/// reads (queued on a stream, then the stream synchronized), against `depth` naive reads (pread
/// into pinned memory, copy, wait) one after another, and against the same batch into host
/// memory (no copies: what the disk and our io_uring do at that depth, the ceiling for the GPU
/// batch); I/Os per second, median of alternating rounds.
pub fn depths(file: &str, file_size: u64, size: u64, depths: &[usize], gpu: &Arc<Gpu>, json: bool) -> Res<()> {
    let st = Storage::open(file)?;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(file)?;
    let fd = f.as_raw_fd();
    let maxd = depths.iter().copied().max().unwrap_or(1);
    let mems: Vec<_> = (0..maxd).map(|_| gpu.alloc(size as usize).map(Arc::new)).collect::<Result<_, _>>()?;
    let bufs: Vec<_> = mems.iter().map(|m| st.register_gpu(m.clone(), true).map(Arc::new)).collect::<Result<_, _>>()?;
    let hosts: Vec<_> = (0..maxd).map(|_| st.alloc_host(size as usize).map(Arc::new)).collect::<Result<_, _>>()?;
    let pinned = gpu.alloc_pinned(size as usize)?;
    let mut q = gpu.runtime().copy_queue()?;
    let sio = StreamIo::new(gpu.runtime().new_stream()?)?;
    if !json {
        println!(
            "depth sweep ({} reads, IOPS, medians of {DEPTH_ROUNDS} rounds taking turns; ratios: the median of the \
             rounds' ratios, their range, noisy where a method's rounds differ by more than {}x):",
            ugds::units::human(size),
            rounds::NOISY
        );
        println!(
            "{:>6} {:>12} {:>12} {:>12} {:>12} {:>22} {:>22} {:>22}",
            "depth", "batch", "stream", "naive loop", "host batch", "batch/naive", "stream/naive", "batch/host"
        );
    }
    let mut rows = Vec::new();
    let mut n = 0u64;
    for &d in depths {
        let mut b = StorageBatch::new(&st, d)?;
        let mut hb = StorageBatch::new(&st, d)?;
        // Per method (batch, host batch, stream, naive loop), its IOPS in each round; the
        // methods take turns, in both orders.
        let mut got: [Vec<f64>; 4] = Default::default();
        for round in 0..DEPTH_ROUNDS {
            // A round: enough batches for about 0.2 s of work at the naive rate.
            let reps = (2000 / d).max(4);
            for m in rounds::order(round, 4) {
                let iops = match m {
                    0 => batch_iops(&mut b, &bufs[..d], size, file_size, reps, &mut n)?,
                    1 => batch_iops(&mut hb, &hosts[..d], size, file_size, reps, &mut n)?,
                    2 => stream_iops(&sio, &st, &bufs[..d], size, file_size, reps, &mut n)?,
                    _ => naive_iops(fd, &pinned, q.as_mut(), &mems[0], size, file_size, reps * d, &mut n)?,
                };
                got[m].push(iops);
            }
        }
        let [bt, ht, st_t, nt] = &got;
        let (bi, hi, si, ni) = (median(bt), median(ht), median(st_t), median(nt));
        let (batch, stream, of_host) = (Ratio::of(bt, nt), Ratio::of(st_t, nt), Ratio::of(bt, ht));
        if json {
            rows.push(serde_json::json!({"depth": d, "size": size, "batch_iops": bi, "stream_iops": si,
                "naive_iops": ni, "host_batch_iops": hi, "batch_vs_naive": batch.json(),
                "stream_vs_naive": stream.json(), "batch_vs_host_batch": of_host.json()}));
        } else {
            println!(
                "{d:>6} {bi:>12.0} {si:>12.0} {ni:>12.0} {hi:>12.0} {:>22} {:>22} {:>22}",
                batch.cell(),
                stream.cell(),
                of_host.cell()
            );
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(rows));
    }
    Ok(())
}

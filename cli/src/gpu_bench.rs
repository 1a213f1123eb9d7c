//! `ugds bench-gpu`: the fallback path into GPU memory against `pread(O_DIRECT)` + a copy to
//! the GPU, and against the disk's own O_DIRECT read bandwidth (no GPU), in one run.

use crate::rounds::{self, Ratio};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::gpu::{Gpu, PinnedHost};
use ugds::{pattern, Storage};

/// What to run.
pub struct Params {
    pub file: String,
    pub file_size: u64,
    pub sizes: Vec<u64>,
    pub threads: Vec<usize>,
    pub seconds: f64,
    pub cpu: bool,
    pub json: bool,
}

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Makes sure the file holds `size` bytes of the pattern.
pub(crate) fn prepare(path: &str, size: u64) -> Res<()> {
    if std::fs::metadata(path).map(|m| m.len() >= size).unwrap_or(false) {
        return Ok(());
    }
    let f = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(path)?;
    let mut chunk = vec![0u8; 8 << 20];
    let mut off = 0;
    while off < size {
        pattern::fill(1, off, &mut chunk);
        std::os::unix::fs::FileExt::write_all_at(&f, &chunk, off)?;
        off += chunk.len() as u64;
    }
    f.sync_all()?;
    Ok(())
}

/// Runs `body(thread, iteration)` on `threads` threads for `secs`; returns GB/s.
fn timed(threads: usize, secs: f64, size: u64, body: impl Fn(usize, u64) -> Res<()> + Sync) -> Res<f64> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let counts: Vec<Res<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let body = &body;
                s.spawn(move || -> Res<u64> {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        body(t, n)?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a benchmark thread panicked".into()))).collect()
    });
    let mut total = 0;
    for c in counts {
        total += c?;
    }
    Ok(total as f64 * size as f64 / start.elapsed().as_secs_f64() / 1e9)
}

/// Reads `size` bytes at `off` of `fd` into `pinned` (the disk alone, as people write it by
/// hand: `pread` with O_DIRECT into pinned memory).
pub(crate) fn pread_pinned(fd: std::os::fd::RawFd, pinned: &PinnedHost, size: u64, off: u64) -> Res<()> {
    if size as usize > pinned.len() {
        return Err(format!("{size} bytes do not fit a {}-byte pinned buffer", pinned.len()).into());
    }
    // SAFETY: `pinned` holds at least `size` bytes (checked) and the shared borrow keeps it
    // allocated for the call; the kernel writes only those bytes.
    let r = unsafe { libc::pread(fd, pinned.as_ptr() as *mut libc::c_void, size as usize, off as i64) };
    if r != size as isize {
        return Err(format!("pread returned {r}: {}", std::io::Error::last_os_error()).into());
    }
    Ok(())
}

/// Rounds per measurement.
const ROUNDS: usize = 3;

/// Thread `t`'s `n`th random offset, a multiple of `size` inside the file.
pub(crate) fn offset(t: usize, n: u64, size: u64, file_size: u64) -> u64 {
    let slots = (file_size / size).max(1);
    (pattern::splitmix64((t as u64) << 40 | n) % slots) * size
}

pub fn run(p: Params) -> Res<()> {
    prepare(&p.file, p.file_size)?;
    let gpu = if p.cpu { Gpu::cpu() } else { Gpu::cuda()? };
    let st = Storage::open(&p.file)?;
    let maxt = p.threads.iter().copied().max().unwrap_or(1);
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&p.file)?;
    let fd = file.as_raw_fd();
    let mut rows = Vec::new();
    if !p.json {
        println!(
            "device: {}   file: {} ({} MiB, O_DIRECT {})",
            gpu.runtime().device_name(),
            p.file,
            p.file_size >> 20,
            if st.is_direct() { "n/a" } else { "yes" }
        );
        println!(
            "GB/s: medians of {ROUNDS} rounds taking turns; ratios: the median of the rounds' ratios, their range, \
             noisy where a method's rounds differ by more than {}x",
            rounds::NOISY
        );
        println!(
            "{:>8} {:>7} {:>14} {:>18} {:>14} {:>22} {:>22}",
            "size", "threads", "ugds GB/s", "pread+copy GB/s", "disk GB/s", "vs pread+cp", "vs disk"
        );
    }
    for &size in &p.sizes {
        // Per thread: GPU memory registered with ugds, pinned host memory and a copy queue for
        // the baseline.
        let mut bufs = Vec::new();
        let mut pinned = Vec::new();
        for _ in 0..maxt {
            let m = Arc::new(gpu.alloc(size as usize)?);
            bufs.push((st.register_gpu(m.clone(), true)?, m));
            pinned.push(gpu.alloc_pinned(size as usize)?);
        }
        let queues: Vec<std::sync::Mutex<_>> =
            (0..maxt).map(|_| gpu.runtime().copy_queue().map(std::sync::Mutex::new)).collect::<Result<_, _>>()?;
        for &threads in &p.threads {
            let ugds_io = |t: usize, n: u64| -> Res<()> {
                let got = st.read(&bufs[t].0, 0, offset(t, n, size, p.file_size), size)?;
                if got != size {
                    return Err(format!("short read: {got} of {size}").into());
                }
                Ok(())
            };
            let pread = |t: usize, n: u64| pread_pinned(fd, &pinned[t], size, offset(t, n, size, p.file_size));
            let pread_copy = |t: usize, n: u64| -> Res<()> {
                pread(t, n)?;
                let mut q = queues[t].lock().map_err(|_| "poisoned")?;
                // SAFETY: pinned[t] holds `size` bytes read above; bufs[t] is `size` bytes of
                // device memory; we wait before the next pread reuses the buffer.
                unsafe { q.to_device(bufs[t].1.device_ptr(), pinned[t].as_ptr(), size as usize)? };
                q.wait()?;
                Ok(())
            };
            // The disk is shared and noisy: the three methods take turns, in both orders, three
            // rounds each; a comparison is the median of its rounds' ratios, with their range.
            let mut got: [Vec<f64>; 3] = Default::default();
            let secs = p.seconds / ROUNDS as f64;
            for round in 0..ROUNDS {
                for m in rounds::order(round, 3) {
                    got[m].push(match m {
                        0 => timed(threads, secs, size, ugds_io)?,
                        1 => timed(threads, secs, size, pread_copy)?,
                        _ => timed(threads, secs, size, pread)?,
                    });
                }
            }
            let [u, c, d] = &got;
            let (ugds_bw, copy_bw, disk_bw) = (rounds::median(u), rounds::median(c), rounds::median(d));
            let (vs_copy, vs_disk) = (Ratio::of(u, c), Ratio::of(u, d));
            if p.json {
                rows.push(serde_json::json!({"size": size, "threads": threads, "ugds_gbps": ugds_bw,
                    "pread_copy_gbps": copy_bw, "disk_gbps": disk_bw, "vs_pread_copy": vs_copy.json(),
                    "vs_disk": vs_disk.json(), "rounds_gbps": {"ugds": u, "pread_copy": c, "disk": d}}));
            } else {
                println!(
                    "{:>8} {:>7} {:>14.3} {:>18.3} {:>14.3} {:>22} {:>22}",
                    ugds::units::human(size),
                    threads,
                    ugds_bw,
                    copy_bw,
                    disk_bw,
                    vs_copy.cell(),
                    vs_disk.cell()
                );
            }
        }
    }
    if p.json {
        println!("{}", serde_json::Value::Array(rows));
    }
    let c = st.path_counts();
    if !p.json {
        println!(
            "paths: {} fallback, {} direct-host, {} direct-p2p I/Os ({} MiB)",
            c.fallback,
            c.direct_host,
            c.direct_p2p,
            c.bytes >> 20
        );
    }
    Ok(())
}

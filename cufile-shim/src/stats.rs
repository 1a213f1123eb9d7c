//! cuFile's statistics: `cuFileSetStatsLevel`/`cuFileGetStatsLevel`, `cuFileStatsStart`/
//! `Stop`/`Reset` and `cuFileGetStatsL1`/`L2`/`L3`, with cuFile's struct layouts.
//!
//! The I/O layer reports each operation with [`record`] (or [`record_detailed`] when it knows
//! the path, GPU, alignment or entry count); this module does the counting. Level 0 (the
//! default) collects nothing and costs one atomic load per call; level 1 counts operations,
//! bytes and latencies; level 2 adds size histograms; level 3 adds per-GPU counters.
//!
//! Collection runs while the level is above 0 and it is not stopped (`cuFileStatsStop`;
//! `cuFileStatsStart` resumes). Rates (bytes or operations per second) are over the collection
//! window: from the last reset (or the first record) to now, time stopped excluded. Averages
//! are over successful operations. Bytes and latencies count successful operations only.

use crate::config::{driver_is_open, guard, ok, status};
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use ugds::capi::uGDSError_t;
use ugds::capi::uGDSOpError::*;

/// `CUFILE_GPU_UUID_LEN`.
pub const CUFILE_GPU_UUID_LEN: usize = 16;
/// GPUs level 3 reports (the length of `per_gpu_stats`).
pub const MAX_GPUS: usize = 16;
/// Buckets of each size histogram.
pub const HIST_BUCKETS: usize = 32;

/// `CUfileOpCounter_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUfileOpCounter_t {
    /// Successful operations.
    pub ok: u64,
    /// Failed operations.
    pub err: u64,
}

impl CUfileOpCounter_t {
    fn add(&mut self, ok: bool, n: u64) {
        if ok {
            self.ok += n;
        } else {
            self.err += n;
        }
    }
}

/// `CUfileStatsLevel1_t`. Field names are cuFile's; see the module text for what ugds counts.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct CUfileStatsLevel1_t {
    pub read_ops: CUfileOpCounter_t,
    pub write_ops: CUfileOpCounter_t,
    pub hdl_register_ops: CUfileOpCounter_t,
    pub hdl_deregister_ops: CUfileOpCounter_t,
    pub buf_register_ops: CUfileOpCounter_t,
    pub buf_deregister_ops: CUfileOpCounter_t,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_bw_bytes_per_sec: u64,
    pub write_bw_bytes_per_sec: u64,
    pub read_lat_avg_us: u64,
    pub write_lat_avg_us: u64,
    pub read_ops_per_sec: u64,
    pub write_ops_per_sec: u64,
    pub read_lat_sum_us: u64,
    pub write_lat_sum_us: u64,
    pub batch_submit_ops: CUfileOpCounter_t,
    pub batch_complete_ops: CUfileOpCounter_t,
    pub batch_setup_ops: CUfileOpCounter_t,
    pub batch_cancel_ops: CUfileOpCounter_t,
    pub batch_destroy_ops: CUfileOpCounter_t,
    pub batch_enqueued_ops: CUfileOpCounter_t,
    pub batch_posix_enqueued_ops: CUfileOpCounter_t,
    pub batch_processed_ops: CUfileOpCounter_t,
    pub batch_posix_processed_ops: CUfileOpCounter_t,
    pub batch_nvfs_submit_ops: CUfileOpCounter_t,
    pub batch_p2p_submit_ops: CUfileOpCounter_t,
    pub batch_aio_submit_ops: CUfileOpCounter_t,
    pub batch_iouring_submit_ops: CUfileOpCounter_t,
    pub batch_mixed_io_submit_ops: CUfileOpCounter_t,
    pub batch_total_submit_ops: CUfileOpCounter_t,
    pub batch_read_bytes: u64,
    pub batch_write_bytes: u64,
    pub batch_read_bw_bytes: u64,
    pub batch_write_bw_bytes: u64,
    pub batch_submit_lat_avg_us: u64,
    pub batch_completion_lat_avg_us: u64,
    pub batch_submit_ops_per_sec: u64,
    pub batch_complete_ops_per_sec: u64,
    pub batch_submit_lat_sum_us: u64,
    pub batch_completion_lat_sum_us: u64,
    pub last_batch_read_bytes: u64,
    pub last_batch_write_bytes: u64,
}

/// `CUfileStatsLevel2_t`: level 1 plus size histograms. Bucket 0 counts I/Os under 1 KiB;
/// bucket `i` (1..=30) those of `2^(i-1)` to `2^i - 1` KiB; bucket 31 everything from 1 TiB.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct CUfileStatsLevel2_t {
    pub basic: CUfileStatsLevel1_t,
    pub read_size_kb_hist: [u64; HIST_BUCKETS],
    pub write_size_kb_hist: [u64; HIST_BUCKETS],
}

/// `CUfilePerGpuStats_t`. ugds has no nvidia-fs, no dynamic routing and no sparse/inline file
/// handling, so `n_nvfs_*`, `n_dr_*`, `n_sparse_regions` and `n_inline_regions` stay 0;
/// `n_p2p_*` count the direct path, `n_posix_*` the fallback path.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct CUfilePerGpuStats_t {
    pub uuid: [c_char; CUFILE_GPU_UUID_LEN],
    pub read_bytes: u64,
    pub read_bw_bytes_per_sec: u64,
    pub read_utilization: u64,
    pub read_duration_us: u64,
    pub n_total_reads: u64,
    pub n_p2p_reads: u64,
    pub n_nvfs_reads: u64,
    pub n_posix_reads: u64,
    pub n_unaligned_reads: u64,
    pub n_dr_reads: u64,
    pub n_sparse_regions: u64,
    pub n_inline_regions: u64,
    pub n_reads_err: u64,
    pub writes_bytes: u64,
    pub write_bw_bytes_per_sec: u64,
    pub write_utilization: u64,
    pub write_duration_us: u64,
    pub n_total_writes: u64,
    pub n_p2p_writes: u64,
    pub n_nvfs_writes: u64,
    pub n_posix_writes: u64,
    pub n_unaligned_writes: u64,
    pub n_dr_writes: u64,
    pub n_writes_err: u64,
    pub n_mmap: u64,
    pub n_mmap_ok: u64,
    pub n_mmap_err: u64,
    pub n_mmap_free: u64,
    pub reg_bytes: u64,
}

/// `CUfileStatsLevel3_t`: level 2 plus per-GPU counters (GPU `i` at `per_gpu_stats[i]`;
/// `num_gpus` is one more than the highest GPU index seen).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct CUfileStatsLevel3_t {
    pub detailed: CUfileStatsLevel2_t,
    pub num_gpus: u32,
    pub per_gpu_stats: [CUfilePerGpuStats_t; MAX_GPUS],
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A read (`cuFileRead`, `cuFileReadAsync`): bytes moved.
    Read,
    /// A write (`cuFileWrite`, `cuFileWriteAsync`).
    Write,
    /// `cuFileHandleRegister`.
    HandleRegister,
    /// `cuFileHandleDeregister`.
    HandleDeregister,
    /// `cuFileBufRegister`: bytes registered.
    BufRegister,
    /// `cuFileBufDeregister`.
    BufDeregister,
    /// `cuFileBatchIOSetUp`.
    BatchSetup,
    /// `cuFileBatchIOSubmit`: bytes and entries submitted, latency of the call.
    BatchSubmit,
    /// `cuFileBatchIOCancel`.
    BatchCancel,
    /// `cuFileBatchIODestroy`.
    BatchDestroy,
    /// One batch read entry completed: bytes, latency from submit to completion.
    BatchRead,
    /// One batch write entry completed.
    BatchWrite,
}

/// Which path an I/O took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Path {
    /// Not said.
    #[default]
    Unknown,
    /// The direct NVMe path (peer-to-peer into GPU memory, or host memory).
    Direct,
    /// The fallback path (io_uring + O_DIRECT, staging for GPU memory).
    Posix,
    /// A batch whose entries took both.
    Mixed,
}

/// The GPU an operation's memory is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuRef {
    /// CUDA device ordinal; at most [`MAX_GPUS`] are reported.
    pub index: u32,
    /// The device's UUID (`cuDeviceGetUuid`).
    pub uuid: [u8; CUFILE_GPU_UUID_LEN],
}

/// One operation, in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// What.
    pub op: Op,
    /// Bytes moved or registered.
    pub bytes: u64,
    /// How long it took.
    pub latency_ns: u64,
    /// Whether it succeeded.
    pub ok: bool,
    /// Which path it took.
    pub path: Path,
    /// GPU memory's device, or `None` for host memory.
    pub gpu: Option<GpuRef>,
    /// Whether size or offsets were not multiples of the block size.
    pub unaligned: bool,
    /// Entries submitted (for [`Op::BatchSubmit`]).
    pub entries: u32,
}

impl Sample {
    /// A sample with nothing but the four basic facts.
    pub fn new(op: Op, bytes: u64, latency_ns: u64, ok: bool) -> Sample {
        Sample { op, bytes, latency_ns, ok, path: Path::Unknown, gpu: None, unaligned: false, entries: 1 }
    }
}

static LEVEL: AtomicU32 = AtomicU32::new(0);
static STOPPED: AtomicBool = AtomicBool::new(false);

/// The counters and the collection window.
#[derive(Default)]
struct Collected {
    s: CUfileStatsLevel3_t,
    /// Start of the window (set by the first record after a reset).
    since: Option<Instant>,
    /// When collection stopped, while it is stopped.
    stopped_at: Option<Instant>,
}

fn collected() -> MutexGuard<'static, Collected> {
    static C: OnceLock<Mutex<Collected>> = OnceLock::new();
    C.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The statistics level (0..=3).
pub fn level() -> u32 {
    LEVEL.load(Ordering::Relaxed)
}

/// Sets the level; values above 3 are clamped by the callers' range checks.
pub(crate) fn set_level(level: u32) {
    LEVEL.store(level.min(3), Ordering::Relaxed);
}

/// Counts one operation (path, GPU and alignment unknown).
pub fn record(op: Op, bytes: u64, latency_ns: u64, ok: bool) {
    record_detailed(&Sample::new(op, bytes, latency_ns, ok));
}

fn bucket(bytes: u64) -> usize {
    let kb = bytes / 1024;
    // CAST: at most 64.
    (u64::BITS - kb.leading_zeros()).min(HIST_BUCKETS as u32 - 1) as usize
}

/// Counts one operation.
pub fn record_detailed(x: &Sample) {
    let level = level();
    if level == 0 || STOPPED.load(Ordering::Relaxed) {
        return;
    }
    let mut c = collected();
    if c.since.is_none() {
        c.since = Some(Instant::now());
    }
    let us = x.latency_ns / 1000;
    let b = &mut c.s.detailed.basic;
    let posix = x.path == Path::Posix;
    match x.op {
        Op::Read | Op::Write => {
            let (ops, bytes, lat) = if x.op == Op::Read {
                (&mut b.read_ops, &mut b.read_bytes, &mut b.read_lat_sum_us)
            } else {
                (&mut b.write_ops, &mut b.write_bytes, &mut b.write_lat_sum_us)
            };
            ops.add(x.ok, 1);
            if x.ok {
                *bytes += x.bytes;
                *lat += us;
            }
        }
        Op::HandleRegister => b.hdl_register_ops.add(x.ok, 1),
        Op::HandleDeregister => b.hdl_deregister_ops.add(x.ok, 1),
        Op::BufRegister => b.buf_register_ops.add(x.ok, 1),
        Op::BufDeregister => b.buf_deregister_ops.add(x.ok, 1),
        Op::BatchSetup => b.batch_setup_ops.add(x.ok, 1),
        Op::BatchCancel => b.batch_cancel_ops.add(x.ok, 1),
        Op::BatchDestroy => b.batch_destroy_ops.add(x.ok, 1),
        Op::BatchSubmit => {
            b.batch_submit_ops.add(x.ok, 1);
            b.batch_total_submit_ops.add(x.ok, 1);
            match x.path {
                Path::Direct => b.batch_p2p_submit_ops.add(x.ok, 1),
                Path::Posix => b.batch_iouring_submit_ops.add(x.ok, 1),
                Path::Mixed => b.batch_mixed_io_submit_ops.add(x.ok, 1),
                Path::Unknown => {}
            }
            let n = u64::from(x.entries);
            b.batch_enqueued_ops.add(x.ok, n);
            if posix {
                b.batch_posix_enqueued_ops.add(x.ok, n);
            }
            if x.ok {
                b.batch_submit_lat_sum_us += us;
            }
        }
        Op::BatchRead | Op::BatchWrite => {
            b.batch_complete_ops.add(x.ok, 1);
            b.batch_processed_ops.add(x.ok, 1);
            if posix {
                b.batch_posix_processed_ops.add(x.ok, 1);
            }
            if x.ok {
                b.batch_completion_lat_sum_us += us;
                if x.op == Op::BatchRead {
                    b.batch_read_bytes += x.bytes;
                    b.last_batch_read_bytes = x.bytes;
                } else {
                    b.batch_write_bytes += x.bytes;
                    b.last_batch_write_bytes = x.bytes;
                }
            }
        }
    }
    let read = matches!(x.op, Op::Read | Op::BatchRead);
    let write = matches!(x.op, Op::Write | Op::BatchWrite);
    if level >= 2 && x.ok && (read || write) {
        let h = if read { &mut c.s.detailed.read_size_kb_hist } else { &mut c.s.detailed.write_size_kb_hist };
        h[bucket(x.bytes)] += 1;
    }
    let Some(gpu) = x.gpu.filter(|g| (g.index as usize) < MAX_GPUS) else { return };
    if level < 3 {
        return;
    }
    c.s.num_gpus = c.s.num_gpus.max(gpu.index + 1);
    let g = &mut c.s.per_gpu_stats[gpu.index as usize];
    for (d, s) in g.uuid.iter_mut().zip(gpu.uuid) {
        // CAST: a byte, reinterpreted as C's char.
        *d = s as c_char;
    }
    let direct = x.path == Path::Direct;
    if read {
        g.n_total_reads += 1;
        g.n_p2p_reads += u64::from(direct);
        g.n_posix_reads += u64::from(posix);
        g.n_unaligned_reads += u64::from(x.unaligned);
        if x.ok {
            g.read_bytes += x.bytes;
            g.read_duration_us += us;
        } else {
            g.n_reads_err += 1;
        }
    } else if write {
        g.n_total_writes += 1;
        g.n_p2p_writes += u64::from(direct);
        g.n_posix_writes += u64::from(posix);
        g.n_unaligned_writes += u64::from(x.unaligned);
        if x.ok {
            g.writes_bytes += x.bytes;
            g.write_duration_us += us;
        } else {
            g.n_writes_err += 1;
        }
    } else if x.op == Op::BufRegister {
        g.n_mmap += 1;
        if x.ok {
            g.n_mmap_ok += 1;
            g.reg_bytes += x.bytes;
        } else {
            g.n_mmap_err += 1;
        }
    } else if x.op == Op::BufDeregister {
        g.n_mmap_free += 1;
    }
}

/// The counters with rates and averages filled in.
fn snapshot() -> CUfileStatsLevel3_t {
    let c = collected();
    let mut s = c.s;
    let end = c.stopped_at.unwrap_or_else(Instant::now);
    let window = c.since.map(|t| end.saturating_duration_since(t)).unwrap_or(Duration::ZERO);
    let secs = window.as_secs_f64();
    // CAST: rates are non-negative and far below 2^64.
    let per_sec = |n: u64| if secs > 0.0 { (n as f64 / secs) as u64 } else { 0 };
    let avg = |sum: u64, n: u64| sum.checked_div(n).unwrap_or(0);
    let b = &mut s.detailed.basic;
    b.read_bw_bytes_per_sec = per_sec(b.read_bytes);
    b.write_bw_bytes_per_sec = per_sec(b.write_bytes);
    b.read_lat_avg_us = avg(b.read_lat_sum_us, b.read_ops.ok);
    b.write_lat_avg_us = avg(b.write_lat_sum_us, b.write_ops.ok);
    b.read_ops_per_sec = per_sec(b.read_ops.ok);
    b.write_ops_per_sec = per_sec(b.write_ops.ok);
    b.batch_read_bw_bytes = per_sec(b.batch_read_bytes);
    b.batch_write_bw_bytes = per_sec(b.batch_write_bytes);
    b.batch_submit_lat_avg_us = avg(b.batch_submit_lat_sum_us, b.batch_submit_ops.ok);
    b.batch_completion_lat_avg_us = avg(b.batch_completion_lat_sum_us, b.batch_complete_ops.ok);
    b.batch_submit_ops_per_sec = per_sec(b.batch_submit_ops.ok);
    b.batch_complete_ops_per_sec = per_sec(b.batch_complete_ops.ok);
    // CAST: microseconds of a window, far below 2^64.
    let window_us = window.as_micros() as u64;
    for g in &mut s.per_gpu_stats[..s.num_gpus as usize] {
        g.read_bw_bytes_per_sec = per_sec(g.read_bytes);
        g.write_bw_bytes_per_sec = per_sec(g.writes_bytes);
        // Percent of the window spent in I/O (overlapping I/Os can add up past 100: capped).
        g.read_utilization = (g.read_duration_us * 100).checked_div(window_us).unwrap_or(0).min(100);
        g.write_utilization = (g.write_duration_us * 100).checked_div(window_us).unwrap_or(0).min(100);
    }
    s
}

/// Sets the level: 0 off, 1 basic, 2 with histograms, 3 with per-GPU counters. Outside 0..=3 is
/// `CU_FILE_INVALID_VALUE`. Allowed whether or not the driver is open.
#[no_mangle]
pub extern "C" fn cuFileSetStatsLevel(level: c_int) -> uGDSError_t {
    match u32::try_from(level) {
        Ok(l @ 0..=3) => {
            set_level(l);
            ok()
        }
        _ => status(UGDS_INVALID_VALUE),
    }
}

/// Reads the level.
///
/// # Safety
///
/// `level` must be NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetStatsLevel(level: *mut c_int) -> uGDSError_t {
    if level.is_null() {
        return status(UGDS_INVALID_VALUE);
    }
    // SAFETY: checked non-null. CAST: 0..=3.
    unsafe { level.write(self::level() as c_int) };
    ok()
}

fn need_open() -> Result<(), uGDSError_t> {
    if driver_is_open() {
        Ok(())
    } else {
        Err(status(UGDS_DRIVER_NOT_INITIALIZED))
    }
}

/// Resumes collection after `cuFileStatsStop` (collection runs from the start otherwise).
#[no_mangle]
pub extern "C" fn cuFileStatsStart() -> uGDSError_t {
    if let Err(e) = need_open() {
        return e;
    }
    guard(|| {
        let mut c = collected();
        if let (Some(stopped), Some(since)) = (c.stopped_at.take(), c.since) {
            // The window excludes the time stopped.
            c.since = Some(since + stopped.elapsed());
        }
        STOPPED.store(false, Ordering::Relaxed);
        ok()
    })
}

/// Stops collection; the counters keep their values.
#[no_mangle]
pub extern "C" fn cuFileStatsStop() -> uGDSError_t {
    if let Err(e) = need_open() {
        return e;
    }
    guard(|| {
        let mut c = collected();
        if !STOPPED.swap(true, Ordering::Relaxed) {
            c.stopped_at = Some(Instant::now());
        }
        ok()
    })
}

/// Zeroes every counter and restarts the window.
#[no_mangle]
pub extern "C" fn cuFileStatsReset() -> uGDSError_t {
    if let Err(e) = need_open() {
        return e;
    }
    guard(|| {
        let mut c = collected();
        let stopped = STOPPED.load(Ordering::Relaxed);
        *c = Collected::default();
        if stopped {
            c.stopped_at = Some(Instant::now());
            c.since = c.stopped_at;
        }
        ok()
    })
}

/// The checks every `cuFileGetStatsLN` makes: NULL, driver open, level at least `n`.
fn get_stats(null: bool, n: u32) -> Result<CUfileStatsLevel3_t, uGDSError_t> {
    if null {
        return Err(status(UGDS_INVALID_VALUE));
    }
    need_open()?;
    if level() < n {
        return Err(status(UGDS_INVALID_VALUE));
    }
    Ok(snapshot())
}

macro_rules! get_stats_fn {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $n:expr, $pick:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        ///
        /// `stats` must be NULL (refused) or point to a writable struct of that type.
        #[no_mangle]
        pub unsafe extern "C" fn $name(stats: *mut $ty) -> uGDSError_t {
            guard(|| match get_stats(stats.is_null(), $n) {
                Ok(s) => {
                    let pick: fn(&CUfileStatsLevel3_t) -> $ty = $pick;
                    // SAFETY: checked non-null; the caller provides a writable struct.
                    unsafe { stats.write(pick(&s)) };
                    ok()
                }
                Err(e) => e,
            })
        }
    };
}

get_stats_fn!(
    /// Level 1 statistics (level at least 1, else `CU_FILE_INVALID_VALUE`).
    cuFileGetStatsL1, CUfileStatsLevel1_t, 1, |s| s.detailed.basic
);
get_stats_fn!(
    /// Level 2 statistics (level at least 2).
    cuFileGetStatsL2, CUfileStatsLevel2_t, 2, |s| s.detailed
);
get_stats_fn!(
    /// Level 3 statistics (level 3).
    cuFileGetStatsL3, CUfileStatsLevel3_t, 3, |s| *s
);

#[cfg(test)]
pub(crate) fn reset_for_test() {
    set_level(0);
    STOPPED.store(false, Ordering::Relaxed);
    *collected() = Collected::default();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{driver_closed, driver_opened, test_lock};
    use std::mem::{offset_of, size_of};

    // Sizes computed from cufile.h (x86_64, LP64): a counter is 2 × u64 = 16.
    // L1: 21 counters (336) + 10 u64 (80) + 12 u64 (96) = 512.
    // L2: 512 + 2 × 32 × 8 = 1024.
    // Per GPU: 16 (uuid) + 13 read u64 + 11 write u64 + 5 mmap u64 = 16 + 29 × 8 = 248.
    // L3: 1024 + 4 (num_gpus) + 4 (padding to 8) + 16 × 248 = 5000.
    #[test]
    fn layouts_match_cufile_h() {
        assert_eq!(size_of::<CUfileOpCounter_t>(), 16);
        assert_eq!(size_of::<CUfileStatsLevel1_t>(), 512);
        assert_eq!(offset_of!(CUfileStatsLevel1_t, read_bytes), 96);
        assert_eq!(offset_of!(CUfileStatsLevel1_t, batch_submit_ops), 176);
        assert_eq!(offset_of!(CUfileStatsLevel1_t, batch_enqueued_ops), 256);
        assert_eq!(offset_of!(CUfileStatsLevel1_t, batch_nvfs_submit_ops), 320);
        assert_eq!(offset_of!(CUfileStatsLevel1_t, batch_read_bytes), 416);
        assert_eq!(offset_of!(CUfileStatsLevel1_t, last_batch_write_bytes), 504);
        assert_eq!(size_of::<CUfileStatsLevel2_t>(), 1024);
        assert_eq!(offset_of!(CUfileStatsLevel2_t, read_size_kb_hist), 512);
        assert_eq!(offset_of!(CUfileStatsLevel2_t, write_size_kb_hist), 768);
        assert_eq!(size_of::<CUfilePerGpuStats_t>(), 248);
        assert_eq!(offset_of!(CUfilePerGpuStats_t, read_bytes), 16);
        assert_eq!(offset_of!(CUfilePerGpuStats_t, writes_bytes), 120);
        assert_eq!(offset_of!(CUfilePerGpuStats_t, n_mmap), 208);
        assert_eq!(size_of::<CUfileStatsLevel3_t>(), 5000);
        assert_eq!(offset_of!(CUfileStatsLevel3_t, num_gpus), 1024);
        assert_eq!(offset_of!(CUfileStatsLevel3_t, per_gpu_stats), 1032);
    }

    #[test]
    fn histogram_buckets() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1023), 0);
        assert_eq!(bucket(1024), 1);
        assert_eq!(bucket(4096), 3);
        assert_eq!(bucket(8191), 3);
        assert_eq!(bucket(1 << 20), 11);
        assert_eq!(bucket(u64::MAX), 31);
    }

    fn l1() -> Result<CUfileStatsLevel1_t, uGDSOpError> {
        let mut s = CUfileStatsLevel1_t::default();
        // SAFETY: a local.
        let r = unsafe { cuFileGetStatsL1(&mut s) };
        if r.err == UGDS_SUCCESS {
            Ok(s)
        } else {
            Err(r.err)
        }
    }
    use ugds::capi::uGDSOpError;

    #[test]
    fn level_set_get_and_range() {
        let _l = test_lock();
        reset_for_test();
        let mut v = -1;
        for l in 0..=3 {
            assert_eq!(cuFileSetStatsLevel(l).err, UGDS_SUCCESS);
            // SAFETY: a local.
            assert_eq!(unsafe { cuFileGetStatsLevel(&mut v) }.err, UGDS_SUCCESS);
            assert_eq!(v, l);
        }
        assert_eq!(cuFileSetStatsLevel(4).err, UGDS_INVALID_VALUE);
        assert_eq!(cuFileSetStatsLevel(-1).err, UGDS_INVALID_VALUE);
        assert_eq!(level(), 3);
        // SAFETY: NULL is refused.
        assert_eq!(unsafe { cuFileGetStatsLevel(std::ptr::null_mut()) }.err, UGDS_INVALID_VALUE);
        // The same value as the PROFILE_STATS parameter.
        let mut p = 0usize;
        // SAFETY: a local.
        unsafe { crate::config::cuFileGetParameterSizeT(0, &mut p) };
        assert_eq!(p, 3);
        reset_for_test();
    }

    #[test]
    fn errors_before_open_null_and_low_level() {
        let _l = test_lock();
        reset_for_test();
        driver_closed();
        assert_eq!(cuFileStatsStart().err, UGDS_DRIVER_NOT_INITIALIZED);
        assert_eq!(cuFileStatsStop().err, UGDS_DRIVER_NOT_INITIALIZED);
        assert_eq!(cuFileStatsReset().err, UGDS_DRIVER_NOT_INITIALIZED);
        assert_eq!(cuFileSetStatsLevel(1).err, UGDS_SUCCESS);
        assert_eq!(l1(), Err(UGDS_DRIVER_NOT_INITIALIZED));
        driver_opened();
        // SAFETY: NULL is refused.
        unsafe {
            assert_eq!(cuFileGetStatsL1(std::ptr::null_mut()).err, UGDS_INVALID_VALUE);
            assert_eq!(cuFileGetStatsL2(std::ptr::null_mut()).err, UGDS_INVALID_VALUE);
            assert_eq!(cuFileGetStatsL3(std::ptr::null_mut()).err, UGDS_INVALID_VALUE);
        }
        assert!(l1().is_ok());
        let mut s2 = CUfileStatsLevel2_t::default();
        // SAFETY: a local.
        assert_eq!(unsafe { cuFileGetStatsL2(&mut s2) }.err, UGDS_INVALID_VALUE, "level 1 < 2");
        cuFileSetStatsLevel(0);
        assert_eq!(l1(), Err(UGDS_INVALID_VALUE));
        driver_closed();
        reset_for_test();
    }

    #[test]
    fn counting_reset_stop_start() {
        let _l = test_lock();
        reset_for_test();
        driver_opened();
        record(Op::Read, 4096, 10_000, true);
        cuFileSetStatsLevel(1);
        assert_eq!(l1().unwrap(), CUfileStatsLevel1_t::default(), "level 0 collected nothing");
        record(Op::Read, 4096, 10_000, true);
        record(Op::Read, 4096, 30_000, true);
        record(Op::Read, 4096, 5_000, false);
        record(Op::Write, 8192, 40_000, true);
        record(Op::HandleRegister, 0, 0, true);
        record(Op::BufRegister, 1 << 20, 0, false);
        std::thread::sleep(Duration::from_millis(5));
        let s = l1().unwrap();
        assert_eq!(s.read_ops, CUfileOpCounter_t { ok: 2, err: 1 });
        assert_eq!(s.read_bytes, 8192);
        assert_eq!(s.read_lat_sum_us, 40);
        assert_eq!(s.read_lat_avg_us, 20);
        assert_eq!(s.write_ops.ok, 1);
        assert_eq!((s.write_bytes, s.write_lat_avg_us), (8192, 40));
        assert_eq!(s.hdl_register_ops.ok, 1);
        assert_eq!(s.buf_register_ops.err, 1);
        assert!(s.read_bw_bytes_per_sec > 0 && s.read_bw_bytes_per_sec < 8192 * 200 + 1);
        assert!(s.read_ops_per_sec > 0);
        // Stopped: nothing counts.
        assert_eq!(cuFileStatsStop().err, UGDS_SUCCESS);
        record(Op::Read, 4096, 1_000, true);
        assert_eq!(l1().unwrap().read_ops.ok, 2);
        assert_eq!(cuFileStatsStart().err, UGDS_SUCCESS);
        record(Op::Read, 4096, 1_000, true);
        assert_eq!(l1().unwrap().read_ops.ok, 3);
        assert_eq!(cuFileStatsReset().err, UGDS_SUCCESS);
        assert_eq!(l1().unwrap(), CUfileStatsLevel1_t::default());
        driver_closed();
        reset_for_test();
    }

    #[test]
    fn batches_histograms_and_gpus() {
        let _l = test_lock();
        reset_for_test();
        driver_opened();
        cuFileSetStatsLevel(3);
        let gpu = GpuRef { index: 1, uuid: [0xab; 16] };
        record(Op::BatchSetup, 0, 0, true);
        record_detailed(&Sample { path: Path::Posix, entries: 4, ..Sample::new(Op::BatchSubmit, 16384, 3_000, true) });
        record_detailed(&Sample { path: Path::Direct, entries: 2, ..Sample::new(Op::BatchSubmit, 8192, 1_000, true) });
        for _ in 0..3 {
            record_detailed(&Sample {
                path: Path::Posix,
                gpu: Some(gpu),
                ..Sample::new(Op::BatchRead, 4096, 50_000, true)
            });
        }
        record_detailed(&Sample { unaligned: true, gpu: Some(gpu), ..Sample::new(Op::BatchWrite, 100, 2_000, true) });
        record_detailed(&Sample { gpu: Some(gpu), ..Sample::new(Op::BufRegister, 1 << 20, 0, true) });
        record_detailed(&Sample { gpu: Some(gpu), ..Sample::new(Op::BufDeregister, 0, 0, true) });
        record_detailed(&Sample {
            gpu: Some(GpuRef { index: 99, uuid: [0; 16] }),
            ..Sample::new(Op::Read, 1, 1, true)
        });
        let mut s = CUfileStatsLevel3_t::default();
        // SAFETY: a local.
        assert_eq!(unsafe { cuFileGetStatsL3(&mut s) }.err, UGDS_SUCCESS);
        let b = &s.detailed.basic;
        assert_eq!(b.batch_setup_ops.ok, 1);
        assert_eq!((b.batch_submit_ops.ok, b.batch_total_submit_ops.ok), (2, 2));
        assert_eq!((b.batch_iouring_submit_ops.ok, b.batch_p2p_submit_ops.ok), (1, 1));
        assert_eq!((b.batch_enqueued_ops.ok, b.batch_posix_enqueued_ops.ok), (6, 4));
        assert_eq!(b.batch_submit_lat_avg_us, 2);
        assert_eq!((b.batch_complete_ops.ok, b.batch_processed_ops.ok, b.batch_posix_processed_ops.ok), (4, 4, 3));
        assert_eq!((b.batch_read_bytes, b.batch_write_bytes), (12288, 100));
        assert_eq!((b.last_batch_read_bytes, b.last_batch_write_bytes), (4096, 100));
        assert_eq!(b.batch_completion_lat_sum_us, 152);
        assert_eq!(s.detailed.read_size_kb_hist[3], 3);
        assert_eq!(s.detailed.read_size_kb_hist[0], 1, "the 1-byte read on GPU 99 still counts here");
        assert_eq!(s.detailed.write_size_kb_hist[0], 1);
        assert_eq!(s.num_gpus, 2, "GPU 99 is beyond the 16 reported");
        let g = &s.per_gpu_stats[1];
        assert_eq!(g.uuid, [0xab_u8 as c_char; 16]);
        assert_eq!((g.n_total_reads, g.n_posix_reads, g.n_p2p_reads, g.read_bytes), (3, 3, 0, 12288));
        assert_eq!((g.n_total_writes, g.n_unaligned_writes, g.writes_bytes), (1, 1, 100));
        assert_eq!((g.n_mmap, g.n_mmap_ok, g.n_mmap_free, g.reg_bytes), (1, 1, 1, 1 << 20));
        assert!(g.read_utilization <= 100);
        assert_eq!(s.per_gpu_stats[0], CUfilePerGpuStats_t::default());
        driver_closed();
        reset_for_test();
    }
}

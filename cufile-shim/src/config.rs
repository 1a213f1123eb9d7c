//! The cuFile face's process-wide settings: driver properties (`cuFileDriverGetProperties` and
//! the `cuFileDriverSet*` tunables), the library version, and the whole
//! `cuFileGetParameter*` / `cuFileSetParameter*` family. One [`Config`] holds every value; the
//! property and parameter calls read and write it, and every change is handed to the core as
//! [`face_options`] (what the values mean to handles, batches and I/O) and to the logger.
//!
//! # Configuration file
//!
//! The settings of each open of the library start from the defaults with `cufile.json`'s keys applied
//! ([`crate::file`]: `$CUFILE_ENV_PATH_JSON`, else `/etc/cufile.json`), read at the first cuFile
//! call and again after each close; parameters set before the open override the file.
//!
//! # Driver open state
//!
//! cuFile accepts parameter changes only while the driver is closed (they are applied when it
//! opens) and reports statistics only while it is open. The I/O layer tells this module when the
//! driver opens ([`driver_opened`]: `cuFileDriverOpen`, and every call that opens it implicitly)
//! and closes ([`driver_closed`]). Closing ends the session's settings: the next open starts from
//! the defaults and the file again, as cuFile re-reads its configuration at every open.
//!
//! As in NVIDIA's libcufile 1.15 (measured on the GPU machine), `cuFileDriverGetProperties`, the
//! `cuFileDriverSet*` calls and `cuFileGetBARSizeInKB` open the driver implicitly (a parameter set
//! after them is refused); `cuFileGetVersion`, `cuFileGetParameter*` and the statistics-level
//! calls do not.
//!
//! # Units
//!
//! cuFile reports and takes every size here in KiB (its "KB"); so do [`Config`]'s `*_kb` fields.

use std::ffi::{c_char, c_int, CStr};
use std::sync::{Mutex, MutexGuard, OnceLock};
use ugds::capi::uGDSError_t;
use ugds::capi::uGDSOpError::{self, *};

/// A status with no CUDA error attached.
pub(crate) fn status(err: uGDSOpError) -> uGDSError_t {
    uGDSError_t { err, cu_err: 0 }
}

/// Success.
pub(crate) fn ok() -> uGDSError_t {
    status(UGDS_SUCCESS)
}

/// Runs an FFI body; a panic becomes `CU_FILE_INTERNAL_ERROR` instead of unwinding into C.
pub(crate) fn guard(f: impl FnOnce() -> uGDSError_t) -> uGDSError_t {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| status(UGDS_INTERNAL_ERROR))
}

// ---------------------------------------------------------------------------------------------
// Open state
// ---------------------------------------------------------------------------------------------

/// Opens the library (explicitly or implicitly). Parameters are frozen from now on.
pub fn driver_opened() {
    let _ = crate::lib().driver_open();
}

/// Closes the library: parameters may be set again, and the session's settings are dropped
/// (the next open starts from [`Config::default`]).
pub fn driver_closed() {
    if crate::lib().driver_close().is_ok() {
        reset_settings();
    }
}

/// Drops the settings (after the library closed): the next open starts from the defaults and
/// the configuration file, read again.
pub(crate) fn reset_settings() {
    *current() = Settings::from_file();
}

/// Whether the library is open.
pub fn driver_is_open() -> bool {
    crate::lib().is_open()
}

// ---------------------------------------------------------------------------------------------
// The configuration
// ---------------------------------------------------------------------------------------------

/// `libcufile` version this library implements, as `cuFileGetVersion` encodes it:
/// 1000 × major + 10 × minor, so 1.15 is 1150. Clients gate features on it (kvikio turns on its
/// batch calls at 1060 and its stream calls at 1070); we implement the 1.15 function set.
pub const CUFILE_VERSION: c_int = 1150;

/// Largest staging chunk of the fallback path, in KiB.
const STAGING_KB: usize = ugds::gpu::STAGING_CHUNK / 1024;

/// Every setting of the cuFile face. Sizes are in KiB (`*_kb`), as cuFile's API has them.
///
/// Which of them change what ugds does ([`face_options`] hands them to the core) is said per
/// field; the others are accepted, stored and reported back ("accepted, no effect").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Poll for completions (ugds's default) instead of sleeping on the queue's interrupt.
    /// Takes effect: the ugds nodes a handle opens from then on wait adaptively (spin while a
    /// core is free, then sleep), or, when off, sleep on the interrupt without spinning.
    pub use_poll_mode: bool,
    /// I/Os up to this size may spin when `use_poll_mode` is set; larger ones sleep on the
    /// interrupt at once. Takes effect (`DeviceOptions::spin_max_bytes`).
    pub poll_thresh_size_kb: usize,
    /// The largest piece one request is issued in. Takes effect: a larger `cuFileRead` or
    /// `cuFileWrite` runs as pieces of this size, one after the other.
    pub max_direct_io_size_kb: usize,
    /// Allow the fallback path (io_uring + O_DIRECT, staging for GPU memory) where the direct
    /// NVMe path is impossible. Takes effect: when off, a file or block device is not
    /// registered (`CU_FILE_IO_NOT_SUPPORTED`).
    pub allow_compat_mode: bool,
    /// Use the fallback path even where the direct path is possible. Accepted, no effect: a
    /// controller bound to ugds has no kernel block device to fall back to.
    pub force_compat_mode: bool,
    /// Staging memory per GPU for I/O that cannot go device-to-device (ugds stages in pinned
    /// host memory, not GPU memory). Accepted, no effect: the staging pool is one GPU read's
    /// lanes of staging chunks, fixed at build time.
    pub max_device_cache_size_kb: usize,
    /// One staging chunk. Accepted, no effect (the chunk size is fixed at build time).
    pub per_buffer_cache_size_kb: usize,
    /// Cap on memory registered with `cuFileBufRegister`. ugds has no limit of its own (the
    /// module pins whatever it is given, charged to the process's RLIMIT_MEMLOCK); the default
    /// is the largest value the field holds. Accepted, no effect.
    pub max_device_pinned_mem_size_kb: usize,
    /// Entries one batch may have. Takes effect: `cuFileBatchIOSetUp` refuses more.
    pub max_batch_io_size: usize,
    /// ugds's per-command deadline, after which a command is timed out and the controller
    /// reset. Takes effect on the ugds nodes a handle opens from then on.
    pub batch_io_timeout_ms: usize,
    /// Entries per synchronous queue pair (`DeviceOptions::depth`; the default lets the device
    /// pick, at most 256). Takes effect on the ugds nodes a handle opens from then on.
    pub max_io_queue_depth: usize,
    /// I/O worker threads (stream-ordered and portable batch I/O). Accepted, no effect: each
    /// storage's pool has twice the cores' threads, 8 to 32.
    pub max_io_threads: usize,
    /// Size from which a GPU I/O on the fallback path is split into staging chunks that run in
    /// parallel (one chunk). Accepted, no effect (fixed).
    pub min_io_threshold_size_kb: usize,
    /// Staging chunks of one GPU I/O in flight at once (the fallback path's lanes). Accepted, no
    /// effect (fixed).
    pub max_request_parallelism: usize,
    /// Accepted, no effect (no file-system-specific checks exist in ugds).
    pub fs_misc_api_check_aggressive: bool,
    /// Accepted, no effect (ugds always splits large requests into commands in flight at once).
    pub parallel_io: bool,
    /// Accepted, no effect (ugds emits no NVTX ranges).
    pub profile_nvtx: bool,
    /// Accepted, no effect (host memory is always allowed).
    pub allow_system_memory: bool,
    /// Accepted, no effect (the direct path is always peer-to-peer through dma-buf).
    pub use_pcip2pdma: bool,
    /// Accepted, no effect (the fallback path always uses io_uring).
    pub prefer_io_uring: bool,
    /// Accepted, no effect (the fallback path always opens its own O_DIRECT descriptor).
    pub force_odirect_mode: bool,
    /// Accepted, no effect (ugds does no PCIe topology detection: true says so).
    pub skip_topology_detection: bool,
    /// Accepted, no effect.
    pub stream_memops_bypass: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            use_poll_mode: true,
            poll_thresh_size_kb: 16 * 1024,
            max_direct_io_size_kb: 16 * 1024,
            allow_compat_mode: true,
            force_compat_mode: false,
            max_device_cache_size_kb: ugds::fallback::READ_LANES * STAGING_KB,
            per_buffer_cache_size_kb: STAGING_KB,
            max_device_pinned_mem_size_kb: u32::MAX as usize,
            max_batch_io_size: 256,
            batch_io_timeout_ms: 30_000,
            max_io_queue_depth: 256,
            max_io_threads: 8,
            min_io_threshold_size_kb: STAGING_KB,
            max_request_parallelism: ugds::fallback::READ_LANES,
            fs_misc_api_check_aggressive: false,
            parallel_io: true,
            profile_nvtx: false,
            allow_system_memory: true,
            use_pcip2pdma: true,
            prefer_io_uring: true,
            force_odirect_mode: true,
            skip_topology_detection: true,
            stream_memops_bypass: false,
        }
    }
}

/// Values kept outside [`Config`]: the string parameters (the logging level takes effect: it is
/// the drop-in's log level; the log file and directory are accepted with no effect, the log
/// goes to standard error) and the POSIX pool slab arrays (accepted, no effect: ugds sizes its
/// staging pool itself).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Extra {
    logging_level: String,
    env_logfile_path: String,
    log_dir: String,
    slab_size_kb: Vec<usize>,
    slab_count: Vec<usize>,
}

impl Default for Extra {
    fn default() -> Self {
        Extra {
            logging_level: "ERROR".into(),
            env_logfile_path: String::new(),
            log_dir: String::new(),
            // The staging pool: chunks of one size, one lane set per GPU read.
            slab_size_kb: vec![STAGING_KB],
            slab_count: vec![ugds::fallback::READ_LANES],
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Settings {
    config: Config,
    extra: Extra,
}

impl Settings {
    /// What each open of the library starts from: the defaults with the configuration file's keys
    /// ([`crate::file`]). A file that cannot be read or parsed is reported and left out.
    fn from_file() -> Settings {
        let mut s = Settings::default();
        let path = crate::file::path();
        let v = match crate::file::read(&path) {
            Ok(Some(v)) => v,
            Ok(None) => return s,
            Err(e) => {
                crate::logging::set_level(&s.extra.logging_level);
                log::warn!("{e}; the defaults apply");
                return s;
            }
        };
        let (set, unused) = crate::file::apply(&v, &mut s.config);
        for x in set {
            s.take(x);
        }
        if s.extra.slab_size_kb.len() != s.extra.slab_count.len() {
            let d = Extra::default();
            (s.extra.slab_size_kb, s.extra.slab_count) = (d.slab_size_kb, d.slab_count);
            log::warn!(
                "{}: posix_pool_slab_size_kb and posix_pool_slab_count differ in length; both ignored",
                path.display()
            );
        }
        // The file's own level decides what is said about it.
        crate::logging::set_level(&s.extra.logging_level);
        for k in &unused.ignored {
            log::info!("{}: {k} has no meaning in ugds; ignored", path.display());
        }
        for (k, why) in &unused.refused {
            log::warn!("{}: {k}: {why}; ignored", path.display());
        }
        s
    }

    /// Stores a file setting kept outside [`Config`].
    fn take(&mut self, x: crate::file::Setting) {
        use crate::file::Setting;
        match x {
            Setting::Config => {}
            Setting::Stats(level) => crate::stats::set_level(level),
            Setting::String(i, v) => {
                // CAST: the file module names string parameters 0..=2.
                if let Some(f) = string_field(&mut self.extra, i as c_int) {
                    *f = v;
                }
            }
            Setting::Slabs(true, v) => self.extra.slab_size_kb = v,
            Setting::Slabs(false, v) => self.extra.slab_count = v,
        }
    }
}

/// The settings, locked. Dropping the lock hands what they mean to the core
/// ([`face_options`]) and the log level to the logger, so every change takes effect.
pub(crate) struct Locked(MutexGuard<'static, Settings>);

impl std::ops::Deref for Locked {
    type Target = Settings;
    fn deref(&self) -> &Settings {
        &self.0
    }
}

impl std::ops::DerefMut for Locked {
    fn deref_mut(&mut self) -> &mut Settings {
        &mut self.0
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        publish(&self.0);
    }
}

/// Hands `s` to the core and the logger.
fn publish(s: &Settings) {
    crate::core().set_options(face_options(&s.config));
    crate::logging::set_level(&s.extra.logging_level);
}

/// The process's settings: loaded from the file on first use (the first cuFile call).
pub(crate) fn settings() -> &'static Mutex<Settings> {
    static S: OnceLock<Mutex<Settings>> = OnceLock::new();
    S.get_or_init(|| {
        let s = Settings::from_file();
        publish(&s);
        Mutex::new(s)
    })
}

/// The settings, locked.
fn current() -> Locked {
    Locked(settings().lock().unwrap_or_else(|e| e.into_inner()))
}

/// What the settings mean to the core: the options of the ugds nodes a handle opens (queue
/// depth, per-command deadline, polling or interrupts), whether files and block devices may be
/// registered (compatibility mode), the largest piece of one read or write, the largest batch.
pub fn face_options(c: &Config) -> ugds::capi::FaceOptions {
    let d = Config::default();
    let device = ugds::DeviceOptions {
        // The default depth lets the device pick (at most 256, less where the controller allows
        // less); a depth set on purpose is asked for as it is.
        depth: if c.max_io_queue_depth == d.max_io_queue_depth {
            0
        } else {
            u32::try_from(c.max_io_queue_depth).unwrap_or(u32::MAX)
        },
        timeout: std::time::Duration::from_millis(c.batch_io_timeout_ms as u64),
        // Poll mode is adaptive waiting that spins for I/Os up to the threshold; without it
        // every wait sleeps on the queue's interrupt.
        waiting: if c.use_poll_mode { ugds::Waiting::Adaptive } else { ugds::Waiting::Interrupts },
        spin_max_bytes: (c.poll_thresh_size_kb as u64).saturating_mul(1024),
        ..Default::default()
    };
    ugds::capi::FaceOptions {
        device,
        fallback: c.allow_compat_mode,
        max_io_bytes: c.max_direct_io_size_kb.saturating_mul(1024),
        max_batch: c.max_batch_io_size,
    }
}

/// A snapshot of the current settings (what `cuFileDriverGetProperties` reports).
pub fn config() -> Config {
    current().config
}

#[cfg(test)]
pub(crate) fn reset_for_test() {
    driver_closed();
    *current() = Settings::default();
}

/// Serialises the tests that touch process-wide state (open state, settings, statistics).
#[cfg(test)]
pub(crate) fn test_lock() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Driver properties
// ---------------------------------------------------------------------------------------------

/// The `nvfs` member of `CUfileDrvProps_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUfileDrvPropsNvfs {
    /// Kernel-side interface version: ugds's module ioctl ABI version.
    pub major_version: u32,
    /// Always 0 (the ugds ABI has one number).
    pub minor_version: u32,
    /// [`Config::poll_thresh_size_kb`].
    pub poll_thresh_size: usize,
    /// [`Config::max_direct_io_size_kb`].
    pub max_direct_io_size: usize,
    /// Bits `1 << CUfileDriverStatusFlags_t`: what storage ugds drives.
    pub dstatusflags: u32,
    /// Bits `1 << CUfileDriverControlFlags_t`: poll mode, compatibility mode.
    pub dcontrolflags: u32,
}

/// `CUfileDrvProps_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUfileDrvProps_t {
    /// Kernel driver part.
    pub nvfs: CUfileDrvPropsNvfs,
    /// Bits `1 << CUfileFeatureFlags_t`.
    pub fflags: u32,
    /// [`Config::max_device_cache_size_kb`].
    pub max_device_cache_size: u32,
    /// [`Config::per_buffer_cache_size_kb`].
    pub per_buffer_cache_size: u32,
    /// [`Config::max_device_pinned_mem_size_kb`].
    pub max_device_pinned_mem_size: u32,
    /// [`Config::max_batch_io_size`].
    pub max_batch_io_size: u32,
    /// [`Config::batch_io_timeout_ms`].
    pub max_batch_io_timeout_msecs: u32,
}

/// `CUfileDriverStatusFlags_t` bit numbers we set.
pub mod dstatus {
    /// `CU_FILE_NVME_SUPPORTED`: set. ugds drives local NVMe controllers directly.
    pub const NVME_SUPPORTED: u32 = 4;
    /// `CU_FILE_NVME_P2P_SUPPORTED`: set. The direct path DMAs between the SSD and GPU memory
    /// peer-to-peer (the GPU range exported as a dma-buf and attached for the NVMe device).
    pub const NVME_P2P_SUPPORTED: u32 = 11;
    // Not set: Lustre (0), WekaFS (1), NFS (2), GPFS (3), NVMe-oF (5), SCSI (6), ScaleFlux CSD
    // (7), NVMesh (8), BeeGFS (9), ScateFS (12). Files there work, but through the fallback
    // path (compatibility mode), not device-to-device.
}

/// `CUfileDriverControlFlags_t` bit numbers.
pub mod dcontrol {
    /// `CU_FILE_USE_POLL_MODE`: set while [`super::Config::use_poll_mode`].
    pub const USE_POLL_MODE: u32 = 0;
    /// `CU_FILE_ALLOW_COMPAT_MODE`: set while [`super::Config::allow_compat_mode`].
    pub const ALLOW_COMPAT_MODE: u32 = 1;
}

/// `CUfileFeatureFlags_t` bit numbers we set.
pub mod feature {
    /// `CU_FILE_BATCH_IO_SUPPORTED`: set. The batch calls run (one doorbell per submit on the
    /// direct path).
    pub const BATCH_IO_SUPPORTED: u32 = 1;
    /// `CU_FILE_STREAMS_SUPPORTED`: set. `cuFileReadAsync`/`cuFileWriteAsync` are stream-ordered.
    pub const STREAMS_SUPPORTED: u32 = 2;
    /// `CU_FILE_PARALLEL_IO_SUPPORTED`: set. A large request runs as many commands (MDTS pieces,
    /// staging lanes) in flight at once.
    pub const PARALLEL_IO_SUPPORTED: u32 = 3;
    // Not set: CU_FILE_DYN_ROUTING_SUPPORTED (0): ugds does not route through other GPUs or
    // bridges; where peer-to-peer is impossible it uses the fallback path.
}

fn u32_of(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The properties for a configuration.
pub fn properties(c: &Config) -> CUfileDrvProps_t {
    let bit = |on: bool, n: u32| if on { 1u32 << n } else { 0 };
    CUfileDrvProps_t {
        nvfs: CUfileDrvPropsNvfs {
            major_version: ugds::uapi::ioctl::ABI_VERSION,
            minor_version: 0,
            poll_thresh_size: c.poll_thresh_size_kb,
            max_direct_io_size: c.max_direct_io_size_kb,
            dstatusflags: bit(true, dstatus::NVME_SUPPORTED) | bit(true, dstatus::NVME_P2P_SUPPORTED),
            dcontrolflags: bit(c.use_poll_mode, dcontrol::USE_POLL_MODE)
                | bit(c.allow_compat_mode, dcontrol::ALLOW_COMPAT_MODE),
        },
        fflags: bit(true, feature::BATCH_IO_SUPPORTED)
            | bit(true, feature::STREAMS_SUPPORTED)
            | bit(true, feature::PARALLEL_IO_SUPPORTED),
        max_device_cache_size: u32_of(c.max_device_cache_size_kb),
        per_buffer_cache_size: u32_of(c.per_buffer_cache_size_kb),
        max_device_pinned_mem_size: u32_of(c.max_device_pinned_mem_size_kb),
        max_batch_io_size: u32_of(c.max_batch_io_size),
        max_batch_io_timeout_msecs: u32_of(c.batch_io_timeout_ms),
    }
}

/// Fills `props` with the current settings; opens the driver implicitly.
///
/// # Safety
///
/// `props` must be NULL (refused) or point to a writable `CUfileDrvProps_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileDriverGetProperties(props: *mut CUfileDrvProps_t) -> uGDSError_t {
    if props.is_null() {
        return status(UGDS_INVALID_VALUE);
    }
    guard(|| {
        driver_opened();
        let p = properties(&config());
        // SAFETY: checked non-null; the caller provides a writable struct.
        unsafe { props.write(p) };
        ok()
    })
}

/// Changes one value through a `cuFileDriverSet*` call: out of the parameter's range is
/// `CU_FILE_DRIVER_UNSUPPORTED_LIMIT`. Opens the driver implicitly (as NVIDIA's library does);
/// the value applies at once, and the I/O layer reads it per I/O.
fn driver_set(param: SizeParam, value: usize, apply: impl FnOnce(&mut Config)) -> uGDSError_t {
    driver_opened();
    let (min, max) = param.range();
    if !(min..=max).contains(&value) {
        return status(UGDS_DRIVER_UNSUPPORTED_LIMIT);
    }
    apply(&mut current().config);
    ok()
}

/// Sets poll mode and its threshold (KiB).
#[no_mangle]
pub extern "C" fn cuFileDriverSetPollMode(poll: u8, poll_threshold_size: usize) -> uGDSError_t {
    guard(|| {
        driver_set(SizeParam::PollThresholdSizeKb, poll_threshold_size, |c| {
            c.use_poll_mode = poll != 0;
            c.poll_thresh_size_kb = poll_threshold_size;
        })
    })
}

/// Sets the largest piece one request is issued in (KiB).
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxDirectIOSize(max_direct_io_size: usize) -> uGDSError_t {
    guard(|| {
        driver_set(SizeParam::MaxDirectIoSizeKb, max_direct_io_size, |c| c.max_direct_io_size_kb = max_direct_io_size)
    })
}

/// Sets the staging memory cap per GPU (KiB).
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxCacheSize(max_cache_size: usize) -> uGDSError_t {
    guard(|| {
        driver_set(SizeParam::MaxDeviceCacheSizeKb, max_cache_size, |c| c.max_device_cache_size_kb = max_cache_size)
    })
}

/// Sets the cap on registered memory (KiB).
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxPinnedMemSize(max_pinned_size: usize) -> uGDSError_t {
    guard(|| {
        driver_set(SizeParam::MaxDevicePinnedMemSizeKb, max_pinned_size, |c| {
            c.max_device_pinned_mem_size_kb = max_pinned_size
        })
    })
}

/// Writes [`CUFILE_VERSION`].
///
/// # Safety
///
/// `version` must be NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetVersion(version: *mut c_int) -> uGDSError_t {
    if version.is_null() {
        return status(UGDS_INVALID_VALUE);
    }
    // SAFETY: checked non-null.
    unsafe { version.write(CUFILE_VERSION) };
    ok()
}

// ---------------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------------

/// `CUFileSizeTConfigParameter_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeParam {
    /// `CUFILE_PARAM_PROFILE_STATS` (0): the statistics level (`cuFileSetStatsLevel`).
    ProfileStats = 0,
    /// `CUFILE_PARAM_EXECUTION_MAX_IO_QUEUE_DEPTH` (1): [`Config::max_io_queue_depth`].
    MaxIoQueueDepth,
    /// `CUFILE_PARAM_EXECUTION_MAX_IO_THREADS` (2): [`Config::max_io_threads`].
    MaxIoThreads,
    /// `CUFILE_PARAM_EXECUTION_MIN_IO_THRESHOLD_SIZE_KB` (3): [`Config::min_io_threshold_size_kb`].
    MinIoThresholdSizeKb,
    /// `CUFILE_PARAM_EXECUTION_MAX_REQUEST_PARALLELISM` (4): [`Config::max_request_parallelism`].
    MaxRequestParallelism,
    /// `CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB` (5): [`Config::max_direct_io_size_kb`].
    MaxDirectIoSizeKb,
    /// `CUFILE_PARAM_PROPERTIES_MAX_DEVICE_CACHE_SIZE_KB` (6): [`Config::max_device_cache_size_kb`].
    MaxDeviceCacheSizeKb,
    /// `CUFILE_PARAM_PROPERTIES_PER_BUFFER_CACHE_SIZE_KB` (7): [`Config::per_buffer_cache_size_kb`].
    PerBufferCacheSizeKb,
    /// `CUFILE_PARAM_PROPERTIES_MAX_DEVICE_PINNED_MEM_SIZE_KB` (8):
    /// [`Config::max_device_pinned_mem_size_kb`].
    MaxDevicePinnedMemSizeKb,
    /// `CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE` (9): [`Config::max_batch_io_size`].
    IoBatchSize,
    /// `CUFILE_PARAM_POLLTHRESHOLD_SIZE_KB` (10): [`Config::poll_thresh_size_kb`].
    PollThresholdSizeKb,
    /// `CUFILE_PARAM_PROPERTIES_BATCH_IO_TIMEOUT_MS` (11): [`Config::batch_io_timeout_ms`].
    BatchIoTimeoutMs,
}

impl SizeParam {
    /// Every value, in enum order.
    pub const ALL: [SizeParam; 12] = [
        SizeParam::ProfileStats,
        SizeParam::MaxIoQueueDepth,
        SizeParam::MaxIoThreads,
        SizeParam::MinIoThresholdSizeKb,
        SizeParam::MaxRequestParallelism,
        SizeParam::MaxDirectIoSizeKb,
        SizeParam::MaxDeviceCacheSizeKb,
        SizeParam::PerBufferCacheSizeKb,
        SizeParam::MaxDevicePinnedMemSizeKb,
        SizeParam::IoBatchSize,
        SizeParam::PollThresholdSizeKb,
        SizeParam::BatchIoTimeoutMs,
    ];

    /// From the C enum's value.
    pub fn from_raw(v: c_int) -> Option<SizeParam> {
        usize::try_from(v).ok().and_then(|i| Self::ALL.get(i).copied())
    }

    /// The settable range, inclusive.
    pub fn range(self) -> (usize, usize) {
        const U32: usize = u32::MAX as usize;
        match self {
            SizeParam::ProfileStats => (0, 3),
            // An NVMe queue has at most 65536 entries.
            SizeParam::MaxIoQueueDepth => (2, 65536),
            SizeParam::MaxIoThreads => (1, 1024),
            SizeParam::MinIoThresholdSizeKb => (4, 1 << 20),
            SizeParam::MaxRequestParallelism => (1, 1024),
            // From one page to 1 GiB per piece.
            SizeParam::MaxDirectIoSizeKb => (4, 1 << 20),
            SizeParam::MaxDeviceCacheSizeKb => (0, U32),
            SizeParam::PerBufferCacheSizeKb => (4, U32),
            SizeParam::MaxDevicePinnedMemSizeKb => (0, U32),
            // A batch has a queue pair of its own: one entry stays free of the 65536.
            SizeParam::IoBatchSize => (1, 65535),
            SizeParam::PollThresholdSizeKb => (0, 1 << 20),
            SizeParam::BatchIoTimeoutMs => (1, U32),
        }
    }

    fn get(self, c: &Config) -> usize {
        match self {
            SizeParam::ProfileStats => crate::stats::level() as usize,
            SizeParam::MaxIoQueueDepth => c.max_io_queue_depth,
            SizeParam::MaxIoThreads => c.max_io_threads,
            SizeParam::MinIoThresholdSizeKb => c.min_io_threshold_size_kb,
            SizeParam::MaxRequestParallelism => c.max_request_parallelism,
            SizeParam::MaxDirectIoSizeKb => c.max_direct_io_size_kb,
            SizeParam::MaxDeviceCacheSizeKb => c.max_device_cache_size_kb,
            SizeParam::PerBufferCacheSizeKb => c.per_buffer_cache_size_kb,
            SizeParam::MaxDevicePinnedMemSizeKb => c.max_device_pinned_mem_size_kb,
            SizeParam::IoBatchSize => c.max_batch_io_size,
            SizeParam::PollThresholdSizeKb => c.poll_thresh_size_kb,
            SizeParam::BatchIoTimeoutMs => c.batch_io_timeout_ms,
        }
    }

    pub(crate) fn set(self, c: &mut Config, v: usize) {
        match self {
            // CAST: range-checked to 0..=3.
            SizeParam::ProfileStats => crate::stats::set_level(v as u32),
            SizeParam::MaxIoQueueDepth => c.max_io_queue_depth = v,
            SizeParam::MaxIoThreads => c.max_io_threads = v,
            SizeParam::MinIoThresholdSizeKb => c.min_io_threshold_size_kb = v,
            SizeParam::MaxRequestParallelism => c.max_request_parallelism = v,
            SizeParam::MaxDirectIoSizeKb => c.max_direct_io_size_kb = v,
            SizeParam::MaxDeviceCacheSizeKb => c.max_device_cache_size_kb = v,
            SizeParam::PerBufferCacheSizeKb => c.per_buffer_cache_size_kb = v,
            SizeParam::MaxDevicePinnedMemSizeKb => c.max_device_pinned_mem_size_kb = v,
            SizeParam::IoBatchSize => c.max_batch_io_size = v,
            SizeParam::PollThresholdSizeKb => c.poll_thresh_size_kb = v,
            SizeParam::BatchIoTimeoutMs => c.batch_io_timeout_ms = v,
        }
    }
}

/// `CUFileBoolConfigParameter_t`, in enum order (0..=11): use poll mode, allow compat mode,
/// force compat mode, aggressive API check, parallel I/O, NVTX, allow system memory, PCI
/// P2PDMA, prefer io_uring, force O_DIRECT, skip topology detection, stream memops bypass.
fn bool_field(c: &mut Config, param: c_int) -> Option<&mut bool> {
    Some(match param {
        0 => &mut c.use_poll_mode,
        1 => &mut c.allow_compat_mode,
        2 => &mut c.force_compat_mode,
        3 => &mut c.fs_misc_api_check_aggressive,
        4 => &mut c.parallel_io,
        5 => &mut c.profile_nvtx,
        6 => &mut c.allow_system_memory,
        7 => &mut c.use_pcip2pdma,
        8 => &mut c.prefer_io_uring,
        9 => &mut c.force_odirect_mode,
        10 => &mut c.skip_topology_detection,
        11 => &mut c.stream_memops_bypass,
        _ => return None,
    })
}

/// `CUFileStringConfigParameter_t` (0..=2): logging level (the drop-in's log level), log file
/// path, log directory (accepted, no effect: the log goes to standard error).
fn string_field(e: &mut Extra, param: c_int) -> Option<&mut String> {
    Some(match param {
        0 => &mut e.logging_level,
        1 => &mut e.env_logfile_path,
        2 => &mut e.log_dir,
        _ => return None,
    })
}

/// Longest string value accepted, in bytes (without the NUL): a path's limit.
pub const MAX_STRING_PARAM: usize = libc::PATH_MAX as usize - 1;

/// Most slabs accepted by `cuFileSetParameterPosixPoolSlabArray`.
pub const MAX_SLABS: usize = 16;

/// Reads a size_t parameter: the value set (or staged) now.
///
/// # Safety
///
/// `value` must be NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterSizeT(param: c_int, value: *mut usize) -> uGDSError_t {
    let Some(p) = SizeParam::from_raw(param) else { return status(UGDS_INVALID_VALUE) };
    if value.is_null() {
        return status(UGDS_INVALID_VALUE);
    }
    guard(|| {
        let v = p.get(&config());
        // SAFETY: checked non-null.
        unsafe { value.write(v) };
        ok()
    })
}

/// Reads a bool parameter.
///
/// # Safety
///
/// `value` must be NULL (refused) or point to a writable C `bool` (one byte).
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterBool(param: c_int, value: *mut u8) -> uGDSError_t {
    if value.is_null() {
        return status(UGDS_INVALID_VALUE);
    }
    guard(|| {
        let mut c = config();
        let Some(v) = bool_field(&mut c, param) else { return status(UGDS_INVALID_VALUE) };
        // SAFETY: checked non-null.
        unsafe { value.write(u8::from(*v)) };
        ok()
    })
}

/// Reads a string parameter into `desc_str` (`len` bytes, NUL included); a value that does not
/// fit is `CU_FILE_INVALID_VALUE` (never truncated).
///
/// # Safety
///
/// `desc_str` must be NULL (refused) or point to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterString(param: c_int, desc_str: *mut c_char, len: c_int) -> uGDSError_t {
    if desc_str.is_null() || len <= 0 {
        return status(UGDS_INVALID_VALUE);
    }
    guard(|| {
        let mut s = current();
        let Some(v) = string_field(&mut s.extra, param) else { return status(UGDS_INVALID_VALUE) };
        // CAST: len > 0.
        if v.len() + 1 > len as usize {
            return status(UGDS_INVALID_VALUE);
        }
        // SAFETY: `desc_str` has `len` >= v.len() + 1 bytes; the value is our own memory.
        unsafe {
            std::ptr::copy_nonoverlapping(v.as_ptr(), desc_str.cast::<u8>(), v.len());
            desc_str.add(v.len()).write(0);
        }
        ok()
    })
}

/// The settable range of a size_t parameter.
///
/// # Safety
///
/// `min_value` and `max_value` must be NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterMinMaxValue(
    param: c_int,
    min_value: *mut usize,
    max_value: *mut usize,
) -> uGDSError_t {
    let Some(p) = SizeParam::from_raw(param) else { return status(UGDS_INVALID_VALUE) };
    if min_value.is_null() || max_value.is_null() {
        return status(UGDS_INVALID_VALUE);
    }
    let (min, max) = p.range();
    // SAFETY: both checked non-null.
    unsafe {
        min_value.write(min);
        max_value.write(max);
    }
    ok()
}

/// Refuses a change while the driver is open (`CU_FILE_DRIVER_ALREADY_OPEN`).
fn settable() -> Result<Locked, uGDSError_t> {
    let s = current();
    if driver_is_open() {
        return Err(status(UGDS_DRIVER_ALREADY_OPEN));
    }
    Ok(s)
}

/// Sets a size_t parameter (driver closed only); outside [`SizeParam::range`] is
/// `CU_FILE_INVALID_VALUE`.
#[no_mangle]
pub extern "C" fn cuFileSetParameterSizeT(param: c_int, value: usize) -> uGDSError_t {
    let Some(p) = SizeParam::from_raw(param) else { return status(UGDS_INVALID_VALUE) };
    guard(|| {
        let mut s = match settable() {
            Ok(s) => s,
            Err(e) => return e,
        };
        let (min, max) = p.range();
        if !(min..=max).contains(&value) {
            return status(UGDS_INVALID_VALUE);
        }
        p.set(&mut s.config, value);
        ok()
    })
}

/// Sets a bool parameter (driver closed only).
#[no_mangle]
pub extern "C" fn cuFileSetParameterBool(param: c_int, value: u8) -> uGDSError_t {
    guard(|| {
        let mut s = match settable() {
            Ok(s) => s,
            Err(e) => return e,
        };
        let Some(f) = bool_field(&mut s.config, param) else { return status(UGDS_INVALID_VALUE) };
        *f = value != 0;
        ok()
    })
}

/// Sets a string parameter (driver closed only). NULL, non-UTF-8 or longer than
/// [`MAX_STRING_PARAM`] is `CU_FILE_INVALID_VALUE`.
///
/// # Safety
///
/// `desc_str` must be NULL (refused) or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cuFileSetParameterString(param: c_int, desc_str: *const c_char) -> uGDSError_t {
    if desc_str.is_null() {
        return status(UGDS_INVALID_VALUE);
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(desc_str) };
    guard(|| {
        let Ok(text) = text.to_str() else { return status(UGDS_INVALID_VALUE) };
        if text.len() > MAX_STRING_PARAM {
            return status(UGDS_INVALID_VALUE);
        }
        let mut s = match settable() {
            Ok(s) => s,
            Err(e) => return e,
        };
        let Some(f) = string_field(&mut s.extra, param) else { return status(UGDS_INVALID_VALUE) };
        *f = text.to_owned();
        ok()
    })
}

/// Sets the POSIX pool's slab sizes (KiB) and counts, `len` pairs (driver closed only).
/// Accepted, no effect. NULL arrays, `len` outside 1..=[`MAX_SLABS`] or a zero entry are
/// `CU_FILE_INVALID_VALUE`.
///
/// # Safety
///
/// Both arrays must be NULL (refused) or hold `len` readable values.
#[no_mangle]
pub unsafe extern "C" fn cuFileSetParameterPosixPoolSlabArray(
    size_values: *const usize,
    count_values: *const usize,
    len: c_int,
) -> uGDSError_t {
    if size_values.is_null() || count_values.is_null() || len <= 0 || len as usize > MAX_SLABS {
        return status(UGDS_INVALID_VALUE);
    }
    // SAFETY: both non-null, each with `len` values (the caller's contract); CAST: 0 < len <= 16.
    let (sizes, counts) = unsafe {
        (std::slice::from_raw_parts(size_values, len as usize), std::slice::from_raw_parts(count_values, len as usize))
    };
    if sizes.iter().chain(counts).any(|&v| v == 0) {
        return status(UGDS_INVALID_VALUE);
    }
    guard(|| {
        let mut s = match settable() {
            Ok(s) => s,
            Err(e) => return e,
        };
        s.extra.slab_size_kb = sizes.to_vec();
        s.extra.slab_count = counts.to_vec();
        ok()
    })
}

/// Reads the POSIX pool's slabs; `len` must equal the number stored (else
/// `CU_FILE_INVALID_VALUE`, as for NULL arrays).
///
/// # Safety
///
/// Both arrays must be NULL (refused) or have room for `len` values.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterPosixPoolSlabArray(
    size_values: *mut usize,
    count_values: *mut usize,
    len: c_int,
) -> uGDSError_t {
    if size_values.is_null() || count_values.is_null() || len <= 0 {
        return status(UGDS_INVALID_VALUE);
    }
    guard(|| {
        let s = current();
        // CAST: len > 0.
        if s.extra.slab_size_kb.len() != len as usize {
            return status(UGDS_INVALID_VALUE);
        }
        // SAFETY: both non-null with room for `len` values, which is the stored length.
        unsafe {
            std::ptr::copy_nonoverlapping(s.extra.slab_size_kb.as_ptr(), size_values, len as usize);
            std::ptr::copy_nonoverlapping(s.extra.slab_count.as_ptr(), count_values, len as usize);
        }
        ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    fn code(e: uGDSError_t) -> uGDSOpError {
        e.err
    }

    #[test]
    fn poll_mode_and_its_threshold_set_how_waits_wait() {
        let c = Config { use_poll_mode: true, poll_thresh_size_kb: 64, ..Config::default() };
        let d = face_options(&c).device;
        assert_eq!((d.waiting, d.spin_max_bytes), (ugds::Waiting::Adaptive, 64 << 10));
        let d = face_options(&Config { use_poll_mode: false, ..c }).device;
        assert_eq!(d.waiting, ugds::Waiting::Interrupts);
    }

    #[test]
    fn props_layout_matches_cufile_h() {
        // nvfs: 2 × u32 + 2 × size_t + 2 × u32 = 32; then 6 × u32 = 24.
        assert_eq!(size_of::<CUfileDrvPropsNvfs>(), 32);
        assert_eq!(offset_of!(CUfileDrvPropsNvfs, poll_thresh_size), 8);
        assert_eq!(offset_of!(CUfileDrvPropsNvfs, max_direct_io_size), 16);
        assert_eq!(offset_of!(CUfileDrvPropsNvfs, dstatusflags), 24);
        assert_eq!(offset_of!(CUfileDrvPropsNvfs, dcontrolflags), 28);
        assert_eq!(size_of::<CUfileDrvProps_t>(), 56);
        assert_eq!(offset_of!(CUfileDrvProps_t, fflags), 32);
        assert_eq!(offset_of!(CUfileDrvProps_t, max_device_cache_size), 36);
        assert_eq!(offset_of!(CUfileDrvProps_t, per_buffer_cache_size), 40);
        assert_eq!(offset_of!(CUfileDrvProps_t, max_device_pinned_mem_size), 44);
        assert_eq!(offset_of!(CUfileDrvProps_t, max_batch_io_size), 48);
        assert_eq!(offset_of!(CUfileDrvProps_t, max_batch_io_timeout_msecs), 52);
    }

    #[test]
    fn properties_report_defaults_and_flags() {
        let _l = test_lock();
        reset_for_test();
        let mut p = CUfileDrvProps_t::default();
        // SAFETY: a local.
        assert_eq!(code(unsafe { cuFileDriverGetProperties(&mut p) }), UGDS_SUCCESS);
        assert_eq!(p.nvfs.major_version, ugds::uapi::ioctl::ABI_VERSION);
        assert!(p.nvfs.major_version != 0, "kvikio treats 0.0 as 'no GDS driver'");
        assert_eq!(p.nvfs.poll_thresh_size, 16384);
        assert_eq!(p.nvfs.max_direct_io_size, 16384);
        assert_eq!(p.nvfs.dstatusflags, (1 << 4) | (1 << 11));
        assert_eq!(p.nvfs.dcontrolflags, 0b11);
        assert_eq!(p.fflags, 0b1110);
        assert_eq!(p.per_buffer_cache_size, 2048);
        assert_eq!(p.max_device_cache_size, 8 * 2048);
        assert_eq!(p.max_device_pinned_mem_size, u32::MAX);
        assert_eq!(p.max_batch_io_size, 256);
        assert_eq!(p.max_batch_io_timeout_msecs, 30_000);
        assert!(driver_is_open(), "GetProperties opens the driver implicitly");
        // SAFETY: NULL is refused.
        assert_eq!(code(unsafe { cuFileDriverGetProperties(std::ptr::null_mut()) }), UGDS_INVALID_VALUE);
        reset_for_test();
    }

    #[test]
    fn driver_setters_update_properties_and_check_limits() {
        let _l = test_lock();
        reset_for_test();
        assert_eq!(code(cuFileDriverSetPollMode(0, 64)), UGDS_SUCCESS);
        assert_eq!(code(cuFileDriverSetMaxDirectIOSize(1024)), UGDS_SUCCESS);
        assert_eq!(code(cuFileDriverSetMaxCacheSize(4096)), UGDS_SUCCESS);
        assert_eq!(code(cuFileDriverSetMaxPinnedMemSize(1 << 20)), UGDS_SUCCESS);
        let c = config();
        assert!(!c.use_poll_mode);
        assert_eq!((c.poll_thresh_size_kb, c.max_direct_io_size_kb), (64, 1024));
        assert_eq!((c.max_device_cache_size_kb, c.max_device_pinned_mem_size_kb), (4096, 1 << 20));
        let p = properties(&c);
        assert_eq!(p.nvfs.dcontrolflags, 1 << dcontrol::ALLOW_COMPAT_MODE);
        assert_eq!(p.nvfs.poll_thresh_size, 64);
        // Out of range.
        assert_eq!(code(cuFileDriverSetMaxDirectIOSize(0)), UGDS_DRIVER_UNSUPPORTED_LIMIT);
        assert_eq!(code(cuFileDriverSetMaxDirectIOSize(usize::MAX)), UGDS_DRIVER_UNSUPPORTED_LIMIT);
        assert_eq!(code(cuFileDriverSetMaxCacheSize(u32::MAX as usize + 1)), UGDS_DRIVER_UNSUPPORTED_LIMIT);
        assert_eq!(code(cuFileDriverSetMaxPinnedMemSize(usize::MAX)), UGDS_DRIVER_UNSUPPORTED_LIMIT);
        assert_eq!(code(cuFileDriverSetPollMode(1, usize::MAX)), UGDS_DRIVER_UNSUPPORTED_LIMIT);
        assert_eq!(config().max_direct_io_size_kb, 1024, "a refused value changes nothing");
        // They opened the driver: parameters are frozen now, the tunables still apply.
        assert!(driver_is_open());
        assert_eq!(code(cuFileSetParameterSizeT(SizeParam::MaxIoThreads as c_int, 2)), UGDS_DRIVER_ALREADY_OPEN);
        assert_eq!(code(cuFileDriverSetPollMode(1, 4)), UGDS_SUCCESS);
        assert!(config().use_poll_mode);
        driver_closed();
        assert_eq!(config(), Config::default(), "closing ends the session's settings");
    }

    #[test]
    fn version_turns_on_kvikio_batch_and_stream_paths() {
        let mut v = 0;
        // SAFETY: a local.
        assert_eq!(code(unsafe { cuFileGetVersion(&mut v) }), UGDS_SUCCESS);
        assert_eq!(v, 1150);
        assert!(v >= 1070, "kvikio: batch >= 1060, stream >= 1070");
        // SAFETY: NULL is refused.
        assert_eq!(code(unsafe { cuFileGetVersion(std::ptr::null_mut()) }), UGDS_INVALID_VALUE);
    }

    #[test]
    fn every_size_param_round_trips_and_checks_its_range() {
        let _l = test_lock();
        reset_for_test();
        for (i, p) in SizeParam::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i);
            let (mut min, mut max) = (0, 0);
            // SAFETY: locals.
            assert_eq!(code(unsafe { cuFileGetParameterMinMaxValue(i as c_int, &mut min, &mut max) }), UGDS_SUCCESS);
            let mut v = usize::MAX;
            // SAFETY: a local.
            assert_eq!(code(unsafe { cuFileGetParameterSizeT(i as c_int, &mut v) }), UGDS_SUCCESS);
            assert!((min..=max).contains(&v), "{p:?}: default {v} outside {min}..={max}");
            for want in [min, max] {
                assert_eq!(code(cuFileSetParameterSizeT(i as c_int, want)), UGDS_SUCCESS, "{p:?}");
                // SAFETY: a local.
                unsafe { cuFileGetParameterSizeT(i as c_int, &mut v) };
                assert_eq!(v, want, "{p:?}");
            }
            if max < usize::MAX {
                assert_eq!(code(cuFileSetParameterSizeT(i as c_int, max + 1)), UGDS_INVALID_VALUE, "{p:?}");
            }
            if min > 0 {
                assert_eq!(code(cuFileSetParameterSizeT(i as c_int, min - 1)), UGDS_INVALID_VALUE, "{p:?}");
            }
        }
        crate::stats::set_level(0);
        for bad in [-1, 12, c_int::MAX] {
            let mut v = 0;
            assert_eq!(code(cuFileSetParameterSizeT(bad, 1)), UGDS_INVALID_VALUE);
            // SAFETY: a local.
            assert_eq!(code(unsafe { cuFileGetParameterSizeT(bad, &mut v) }), UGDS_INVALID_VALUE);
            // SAFETY: locals.
            assert_eq!(code(unsafe { cuFileGetParameterMinMaxValue(bad, &mut v, &mut v.clone()) }), UGDS_INVALID_VALUE);
        }
        // SAFETY: NULL is refused.
        unsafe {
            assert_eq!(code(cuFileGetParameterSizeT(0, std::ptr::null_mut())), UGDS_INVALID_VALUE);
            let mut v = 0;
            assert_eq!(code(cuFileGetParameterMinMaxValue(0, std::ptr::null_mut(), &mut v)), UGDS_INVALID_VALUE);
            assert_eq!(code(cuFileGetParameterMinMaxValue(0, &mut v, std::ptr::null_mut())), UGDS_INVALID_VALUE);
        }
        reset_for_test();
    }

    #[test]
    fn size_params_feed_properties() {
        let _l = test_lock();
        reset_for_test();
        assert_eq!(code(cuFileSetParameterSizeT(SizeParam::IoBatchSize as c_int, 1000)), UGDS_SUCCESS);
        assert_eq!(code(cuFileSetParameterSizeT(SizeParam::BatchIoTimeoutMs as c_int, 5)), UGDS_SUCCESS);
        let p = properties(&config());
        assert_eq!((p.max_batch_io_size, p.max_batch_io_timeout_msecs), (1000, 5));
        reset_for_test();
    }

    #[test]
    fn bool_params_round_trip() {
        let _l = test_lock();
        reset_for_test();
        for i in 0..12 {
            let mut v = 7u8;
            // SAFETY: a local.
            assert_eq!(code(unsafe { cuFileGetParameterBool(i, &mut v) }), UGDS_SUCCESS);
            let before = v;
            assert!(before <= 1);
            assert_eq!(code(cuFileSetParameterBool(i, 1 - before)), UGDS_SUCCESS);
            // SAFETY: a local.
            unsafe { cuFileGetParameterBool(i, &mut v) };
            assert_eq!(v, 1 - before, "param {i}");
        }
        let c = config();
        assert!(!c.use_poll_mode && !c.allow_compat_mode && c.force_compat_mode && c.stream_memops_bypass);
        // Any non-zero byte is true.
        assert_eq!(code(cuFileSetParameterBool(0, 0x80)), UGDS_SUCCESS);
        assert!(config().use_poll_mode);
        let mut v = 0u8;
        assert_eq!(code(cuFileSetParameterBool(12, 1)), UGDS_INVALID_VALUE);
        assert_eq!(code(cuFileSetParameterBool(-1, 1)), UGDS_INVALID_VALUE);
        // SAFETY: a local, then NULL (refused).
        unsafe {
            assert_eq!(code(cuFileGetParameterBool(12, &mut v)), UGDS_INVALID_VALUE);
            assert_eq!(code(cuFileGetParameterBool(0, std::ptr::null_mut())), UGDS_INVALID_VALUE);
        }
        reset_for_test();
    }

    fn get_string(param: c_int, len: c_int) -> Result<String, uGDSOpError> {
        let mut buf = vec![0x55 as c_char; len.max(1) as usize];
        // SAFETY: `buf` has `len` bytes.
        let r = unsafe { cuFileGetParameterString(param, buf.as_mut_ptr(), len) };
        if r.err != UGDS_SUCCESS {
            return Err(r.err);
        }
        // SAFETY: NUL-terminated by the call.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_owned())
    }

    #[test]
    fn string_params_round_trip_without_truncation() {
        let _l = test_lock();
        reset_for_test();
        assert_eq!(get_string(0, 64).as_deref(), Ok("ERROR"));
        assert_eq!(get_string(1, 64).as_deref(), Ok(""));
        assert_eq!(get_string(2, 1).as_deref(), Ok(""));
        for (i, s) in [(0, c"TRACE"), (1, c"/tmp/cufile.log"), (2, c"/var/log")] {
            // SAFETY: a C string literal.
            assert_eq!(code(unsafe { cuFileSetParameterString(i, s.as_ptr()) }), UGDS_SUCCESS);
            assert_eq!(get_string(i, 64).as_deref(), Ok(s.to_str().unwrap()));
        }
        // "TRACE" needs 6 bytes.
        assert_eq!(get_string(0, 5), Err(UGDS_INVALID_VALUE));
        assert_eq!(get_string(0, 6).as_deref(), Ok("TRACE"));
        assert_eq!(get_string(0, 0), Err(UGDS_INVALID_VALUE));
        assert_eq!(get_string(0, -3), Err(UGDS_INVALID_VALUE));
        assert_eq!(get_string(3, 64), Err(UGDS_INVALID_VALUE));
        let long = std::ffi::CString::new(vec![b'x'; MAX_STRING_PARAM + 1]).unwrap();
        // SAFETY: C strings, then NULL (refused).
        unsafe {
            assert_eq!(code(cuFileSetParameterString(2, long.as_ptr())), UGDS_INVALID_VALUE);
            assert_eq!(code(cuFileSetParameterString(3, c"x".as_ptr())), UGDS_INVALID_VALUE);
            assert_eq!(code(cuFileSetParameterString(0, std::ptr::null())), UGDS_INVALID_VALUE);
            assert_eq!(code(cuFileGetParameterString(0, std::ptr::null_mut(), 8)), UGDS_INVALID_VALUE);
        }
        reset_for_test();
    }

    #[test]
    fn parameters_are_frozen_while_the_driver_is_open() {
        let _l = test_lock();
        reset_for_test();
        assert_eq!(code(cuFileSetParameterSizeT(SizeParam::MaxIoThreads as c_int, 3)), UGDS_SUCCESS);
        driver_opened();
        assert_eq!(code(cuFileSetParameterSizeT(SizeParam::MaxIoThreads as c_int, 4)), UGDS_DRIVER_ALREADY_OPEN);
        assert_eq!(code(cuFileSetParameterBool(0, 0)), UGDS_DRIVER_ALREADY_OPEN);
        // SAFETY: C string literal; arrays of one.
        unsafe {
            assert_eq!(code(cuFileSetParameterString(0, c"INFO".as_ptr())), UGDS_DRIVER_ALREADY_OPEN);
            assert_eq!(code(cuFileSetParameterPosixPoolSlabArray(&4, &1, 1)), UGDS_DRIVER_ALREADY_OPEN);
        }
        // Reads still work and see the value staged before the open.
        let mut v = 0;
        // SAFETY: a local.
        assert_eq!(code(unsafe { cuFileGetParameterSizeT(SizeParam::MaxIoThreads as c_int, &mut v) }), UGDS_SUCCESS);
        assert_eq!(v, 3);
        assert_eq!(config().max_io_threads, 3);
        driver_closed();
        assert_eq!(code(cuFileSetParameterSizeT(SizeParam::MaxIoThreads as c_int, 4)), UGDS_SUCCESS);
        reset_for_test();
    }

    #[test]
    fn posix_pool_slabs_round_trip() {
        let _l = test_lock();
        reset_for_test();
        let (mut s, mut c) = ([0usize; 1], [0usize; 1]);
        // SAFETY: arrays of the given lengths throughout.
        unsafe {
            assert_eq!(code(cuFileGetParameterPosixPoolSlabArray(s.as_mut_ptr(), c.as_mut_ptr(), 1)), UGDS_SUCCESS);
            assert_eq!((s, c), ([2048], [8]));
            let sizes = [4usize, 1024, 16384];
            let counts = [128usize, 64, 32];
            assert_eq!(code(cuFileSetParameterPosixPoolSlabArray(sizes.as_ptr(), counts.as_ptr(), 3)), UGDS_SUCCESS);
            let (mut s3, mut c3) = ([0usize; 3], [0usize; 3]);
            assert_eq!(code(cuFileGetParameterPosixPoolSlabArray(s3.as_mut_ptr(), c3.as_mut_ptr(), 3)), UGDS_SUCCESS);
            assert_eq!((s3, c3), (sizes, counts));
            // Wrong length, NULLs, zero entries, too many.
            assert_eq!(
                code(cuFileGetParameterPosixPoolSlabArray(s.as_mut_ptr(), c.as_mut_ptr(), 1)),
                UGDS_INVALID_VALUE
            );
            assert_eq!(
                code(cuFileGetParameterPosixPoolSlabArray(std::ptr::null_mut(), c.as_mut_ptr(), 1)),
                UGDS_INVALID_VALUE
            );
            assert_eq!(
                code(cuFileSetParameterPosixPoolSlabArray(std::ptr::null(), counts.as_ptr(), 3)),
                UGDS_INVALID_VALUE
            );
            assert_eq!(
                code(cuFileSetParameterPosixPoolSlabArray(sizes.as_ptr(), counts.as_ptr(), 0)),
                UGDS_INVALID_VALUE
            );
            assert_eq!(
                code(cuFileSetParameterPosixPoolSlabArray(sizes.as_ptr(), [1, 0, 1].as_ptr(), 3)),
                UGDS_INVALID_VALUE
            );
            let many = [1usize; MAX_SLABS + 1];
            assert_eq!(
                code(cuFileSetParameterPosixPoolSlabArray(many.as_ptr(), many.as_ptr(), many.len() as c_int)),
                UGDS_INVALID_VALUE
            );
        }
        reset_for_test();
    }
}

//! The direct path's control plane over one `/dev/ugds_drvN`: [`Device`] (the open controller,
//! its queue pairs and status page), [`Namespace`] (where commands go) and the crate-private
//! `Registration` (memory the module pinned or attached for DMA); [`is_ugds_node`] tells such a
//! node from anything else. Data moves through [`crate::Storage`] and [`crate::Buffer`], which
//! own memory, leases and the request check; this layer only builds and runs commands.

use crate::cmd::{self, Command, DmaRange, DptrPolicy, DsmRange};
use crate::error::{Error, Result};
use crate::fork::Born;
#[cfg(doc)]
use crate::inflight::InFlight;
use crate::inflight::IoResult;
use crate::mmio::{Doorbells, StatusView};
#[doc(hidden)]
pub use crate::queue::DptrCounts;
use crate::queue::QueuePair;
pub use crate::sgl::DataPointers;
use crate::sys::{req, DeviceFd, EventFd};
pub use control::Control;
use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use ugds_uapi::ioctl::*;

mod admin;
mod control;
pub(crate) mod lanes;
#[cfg(test)]
mod mock_tests;
mod owned;
mod revocation;

pub(crate) use owned::OwnedQueuePair;

/// Tuning for [`Device::open_with`].
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// I/O queue pairs for synchronous I/O (threads are spread over them); 0 picks
    /// `min(4, what the controller grants)`.
    pub queues: usize,
    /// Entries per queue; 0 picks `min(256, what the controller allows)` (CAP.MQES, which
    /// some controllers set as low as 127, i.e. 128 entries).
    pub depth: u32,
    /// Per-command deadline.
    pub timeout: Duration,
    /// Interrupt mode: wait for completions on the queue's MSI-X interrupt (an eventfd) after
    /// one poll, instead of busy polling. Costs a system call per wait; saves the CPU.
    pub interrupts: bool,
    /// PRPs or SGLs per command ([`DataPointers::Auto`] by default); SGLs only where the
    /// controller reports SGL support (Identify SGLS).
    pub data_pointers: DataPointers,
    /// Open the controller exclusively: the module refuses every other opener while this device
    /// is open, and refuses this open while others have it ([`Error::DeviceBusy`]). Openers of
    /// one controller share one DMA trust domain (any of them can name any bus address in a
    /// command); an exclusive open is the isolation a single tenant gets.
    pub exclusive: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            queues: 0,
            depth: 0,
            timeout: Duration::from_secs(30),
            interrupts: false,
            data_pointers: DataPointers::Auto,
            exclusive: false,
        }
    }
}

/// An open controller's state in this process.
///
/// The mappings (status page, doorbells, queue pairs) are `ManuallyDrop`: in a child forked
/// after the device was opened they are not there (ugds mappings are not inherited), so `Drop`
/// leaks them instead of unmapping whatever the child has at those addresses since.
#[derive(Debug)]
pub(crate) struct Inner {
    /// Shared with every queue pair, which re-arms itself through it after a reset.
    pub(crate) fd: Arc<DeviceFd>,
    pub(crate) info: DeviceInfo,
    pub(crate) status: ManuallyDrop<StatusView>,
    /// The doorbell page(s), shared by every queue pair of this open file.
    pub(crate) doorbells: ManuallyDrop<Arc<Doorbells>>,
    queues: ManuallyDrop<Vec<QueuePair>>,
    /// The fork generation it was opened in.
    pub(crate) born: Born,
    pub(crate) timeout: Duration,
    /// Largest transfer of one command.
    max_cmd_bytes: u64,
    /// PRPs or SGLs: every queue pair of this open device gets it.
    pub(crate) dptr: DptrPolicy,
}

/// An open ugds controller: its queue pairs are mapped into this process.
#[derive(Debug, Clone)]
pub struct Device {
    pub(crate) inner: Arc<Inner>,
}

/// Creates a queue pair of `depth` entries on the controller and maps its SQ, CQ and PRP pool;
/// in interrupt mode also attaches an eventfd to its MSI-X vector. Its commands use PRPs or
/// SGLs as `dptr` says.
pub(crate) fn create_queue_pair(
    fd: &Arc<DeviceFd>,
    depth: u32,
    interrupts: bool,
    doorbells: &Arc<Doorbells>,
    epoch: u64,
    dptr: DptrPolicy,
) -> Result<QueuePair> {
    let flags = if interrupts { QPAIR_FLAG_IRQ } else { 0 };
    let mut a = CreateQpair { depth, flags, ..Default::default() };
    fd.ioctl(req::CreateQpair, &mut a)?;
    let irq = if interrupts {
        let ev = EventFd::new()?;
        let mut s = SetEventfd { qid: a.qid, fd: ev.raw() };
        fd.ioctl(req::SetEventfd, &mut s)?;
        Some(ev)
    } else {
        None
    };
    QueuePair::map(fd, &a, doorbells, epoch, irq, dptr)
}

/// Gives queue pair `qid` (one this open file created) back to the controller: the module
/// deletes it there before freeing its memory, and revokes our mappings of it. Best effort:
/// called from `Drop`, where a failure has nowhere to go.
pub(crate) fn delete_queue_pair(fd: &DeviceFd, qid: u16) {
    let mut d = DeleteQpair { qid: u32::from(qid), reserved: 0 };
    let _ = fd.ioctl(req::DeleteQpair, &mut d);
}

/// Largest transfer per command the library builds (one PRP-list page with an unaligned start
/// covers 511 pages; 1 MiB keeps well inside it).
const MAX_CMD_BYTES: u64 = 1 << 20;

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's index: threads are spread round-robin over a device's queues.
    static THREAD_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn thread_index() -> usize {
    THREAD_INDEX.with(|t| {
        if t.get() == usize::MAX {
            t.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

/// The sysfs class of ugds device nodes: `/sys/class/ugds_drv`, nodes `/dev/ugds_drvN` (the
/// names uGDS uses, so its tools and LMCache's uGDS backend accept them).
pub const NODE_CLASS: &str = "ugds_drv";

/// True when `path` (or what it points to, e.g. `/proc/self/fd/N`) is a ugds device node: a
/// character device whose `/sys/dev/char/MAJ:MIN/subsystem` is the class [`NODE_CLASS`]. The
/// check goes by the sysfs class, never by the name, so a node of another driver named like
/// ours is not taken for one, and a ugds node under any name is.
pub fn is_ugds_node(path: impl AsRef<std::path::Path>) -> bool {
    let Ok(meta) = std::fs::metadata(path) else { return false };
    if !meta.file_type().is_char_device() {
        return false;
    }
    let rdev = meta.rdev();
    let subsystem = format!("/sys/dev/char/{}:{}/subsystem", libc::major(rdev), libc::minor(rdev));
    std::fs::read_link(subsystem).is_ok_and(|class| class.file_name().is_some_and(|n| n == NODE_CLASS))
}

/// What `path` is, in words (for errors that name a wrong target).
pub fn describe_path(path: impl AsRef<std::path::Path>) -> String {
    let Ok(meta) = std::fs::metadata(&path) else { return "missing".into() };
    let t = meta.file_type();
    if t.is_file() {
        format!("a regular file of {} bytes", meta.len())
    } else if t.is_dir() {
        "a directory".into()
    } else if t.is_block_device() {
        "a block device".into()
    } else if t.is_char_device() {
        let rdev = meta.rdev();
        let subsystem = format!("/sys/dev/char/{}:{}/subsystem", libc::major(rdev), libc::minor(rdev));
        match std::fs::read_link(subsystem).ok().and_then(|c| c.file_name().map(|n| n.to_string_lossy().into_owned())) {
            Some(class) => format!("a character device of the class {class}"),
            None => "a character device".into(),
        }
    } else {
        "neither a file nor a device".into()
    }
}

/// Refuses a namespace whose blocks carry metadata or protection information, or whose size in
/// bytes does not fit 64 bits (a controller reporting nonsense: every range check would wrap).
fn usable_namespace(info: &NamespaceInfo) -> Result<()> {
    if info.size_lbas.checked_mul(1u64 << info.lba_shift.min(63)).is_none() {
        return Err(Error::DeviceProtocol(format!(
            "namespace {}: {} blocks of 2^{} bytes overflow 64 bits",
            info.nsid, info.size_lbas, info.lba_shift
        )));
    }
    if info.metadata_bytes == 0 && info.pi_type == 0 {
        return Ok(());
    }
    Err(Error::Unsupported {
        what: "a namespace formatted with metadata",
        why: format!(
            "namespace {} has {} bytes of metadata per block and protection information type {}; \
             ugds moves data blocks only",
            info.nsid, info.metadata_bytes, info.pi_type
        ),
        fix: "format it with a metadata-free LBA format (`nvme format /dev/nvmeXnY --lbaf=N --pi=0`, \
              after unbinding), or use another namespace",
    })
}

/// Identify Controller ONCS bits (NVMe base spec 2.0, figure 275).
const ONCS_DATASET_MANAGEMENT: u32 = 1 << 2;
const ONCS_WRITE_ZEROES: u32 = 1 << 3;

/// Refuses an optional NVM command the controller does not support (its ONCS bit is clear).
fn optional_command(oncs: u32, bit: u32, what: &'static str) -> Result<()> {
    if oncs & bit != 0 {
        return Ok(());
    }
    Err(Error::Unsupported {
        what,
        why: format!("the controller does not support it (Identify Controller ONCS {oncs:#x} lacks bit {:#x})", bit),
        fix: "write a zeroed buffer instead, or use a controller that supports the command",
    })
}

/// A zeroed `DeviceInfo`, for GET_INFO to fill.
pub(crate) fn blank_info() -> DeviceInfo {
    DeviceInfo {
        abi_version: 0,
        instance: 0,
        serial: [0; 20],
        model: [0; 40],
        firmware: [0; 8],
        vid: 0,
        ssvid: 0,
        cap: 0,
        vs: 0,
        mdts_bytes: 0,
        doorbell_stride: 0,
        max_qpairs: 0,
        max_queue_entries: 0,
        irq_vectors: 0,
        num_namespaces: 0,
        vwc: 0,
        oncs: 0,
        page_size: 0,
        namespaces: [NamespaceInfo::default(); MAX_NAMESPACES],
        sgls: 0,
        reserved: 0,
    }
}

/// GET_INFO of an open node, refusing a module of another ABI version.
pub(crate) fn get_info(fd: &DeviceFd) -> Result<DeviceInfo> {
    let mut info = blank_info();
    fd.ioctl(req::GetInfo, &mut info).map_err(|e| match e {
        // The request number encodes the struct's size: a module older than ABI 3 knows
        // GET_INFO only by its smaller size, and says ENOTTY. Its version is unknown (0).
        Error::Control { ref source, .. } if source.raw_os_error() == Some(libc::ENOTTY) => {
            Error::AbiMismatch { kernel: 0, library: ABI_VERSION }
        }
        e => e,
    })?;
    if info.abi_version != ABI_VERSION {
        return Err(Error::AbiMismatch { kernel: info.abi_version, library: ABI_VERSION });
    }
    Ok(info)
}

/// An identify string field (space or NUL padded ASCII) as text.
pub(crate) fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end_matches([' ', '\0']).to_string()
}

impl Device {
    /// Opens `/dev/ugds_drvN` with default options.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Self> {
        Self::open_with(path, DeviceOptions::default())
    }

    /// Opens `/dev/ugds_drvN`: checks the ABI version, creates and maps the queue pairs. A path
    /// that is not UTF-8 is [`Error::InvalidArgument`].
    pub fn open_with(path: impl AsRef<std::path::Path>, opts: DeviceOptions) -> Result<Self> {
        Self::open_node(crate::error::utf8_path(path.as_ref())?, opts)
    }

    fn open_node(path: &str, opts: DeviceOptions) -> Result<Self> {
        if std::path::Path::new(path).exists() && !is_ugds_node(path) {
            return Err(Error::NotUgdsNode {
                path: path.to_string(),
                what: describe_path(path),
                fix: "bind a controller to ugds (`ugds bind /dev/nvmeX`, which prints its node \
                      /dev/ugds_drvN); files and block devices take the fallback path through \
                      `Storage::open` (the CLI's info, read and write accept them)",
            });
        }
        let born = crate::fork::watch()?;
        let fd = Arc::new(DeviceFd::open(path, opts.exclusive)?);
        let info = get_info(&fd)?;
        if opts.interrupts && info.irq_vectors == 0 {
            return Err(Error::invalid("interrupts", "the controller has no MSI-X vectors for I/O queues"));
        }
        let nqueues = if opts.queues == 0 { 4.min(info.max_qpairs as usize) } else { opts.queues };
        if nqueues == 0 || nqueues > info.max_qpairs as usize {
            return Err(Error::invalid("queues", format!("must be 1..={} on this controller", info.max_qpairs)));
        }
        let depth = if opts.depth == 0 { 256.min(info.max_queue_entries) } else { opts.depth };
        if depth < 2 || depth > info.max_queue_entries {
            return Err(Error::invalid("depth", format!("must be 2..={}", info.max_queue_entries)));
        }
        let status = StatusView::map(fd.raw())?;
        let epoch = status.state().epoch();
        let db_len = (4096usize)
            .max(((2 * info.max_qpairs as usize + 2) * info.doorbell_stride as usize).next_multiple_of(4096));
        let doorbells = Arc::new(Doorbells::map(fd.raw(), db_len)?);
        let dptr = DptrPolicy::new(opts.data_pointers, info.sgls);
        let mut queues = Vec::with_capacity(nqueues);
        for _ in 0..nqueues {
            queues.push(create_queue_pair(&fd, depth, opts.interrupts, &doorbells, epoch, dptr)?);
        }
        let mdts = if info.mdts_bytes == 0 { u64::MAX } else { info.mdts_bytes as u64 };
        Ok(Device {
            inner: Arc::new(Inner {
                fd,
                info,
                status: ManuallyDrop::new(status),
                doorbells: ManuallyDrop::new(doorbells),
                queues: ManuallyDrop::new(queues),
                born,
                timeout: opts.timeout,
                max_cmd_bytes: mdts.min(MAX_CMD_BYTES),
                dptr,
            }),
        })
    }

    /// What the controller reported.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// Model number.
    pub fn model(&self) -> String {
        ascii(&self.inner.info.model)
    }

    /// Serial number.
    pub fn serial(&self) -> String {
        ascii(&self.inner.info.serial)
    }

    /// Firmware revision.
    pub fn firmware(&self) -> String {
        ascii(&self.inner.info.firmware)
    }

    /// Maximum data transfer size of one command in bytes (`None`: no limit).
    pub fn mdts(&self) -> Option<u64> {
        (self.inner.info.mdts_bytes != 0).then_some(self.inner.info.mdts_bytes as u64)
    }

    /// True when the controller takes SGLs for NVM I/O commands (Identify SGLS bits 1:0).
    pub fn supports_sgls(&self) -> bool {
        crate::sgl::alignment_from_sgls(self.inner.info.sgls).is_some()
    }

    /// Transfers the synchronous queue pairs wrote so far, by data pointer (PRPs or an SGL):
    /// tests read it to know which one a request really used.
    #[doc(hidden)]
    pub fn dptr_counts(&self) -> DptrCounts {
        let mut c = DptrCounts::default();
        for q in self.inner.queues.iter() {
            c += q.dptr_counts();
        }
        c
    }

    /// The active namespaces.
    pub fn namespaces(&self) -> Vec<Namespace> {
        let i = &self.inner.info;
        i.namespaces[..i.num_namespaces as usize]
            .iter()
            .map(|n| Namespace { dev: self.inner.clone(), info: *n, timeout: self.inner.timeout })
            .collect()
    }

    /// Namespace `nsid`.
    ///
    /// A namespace formatted with metadata or protection information is refused by name: the
    /// data path moves data blocks only (no metadata buffers, no protection fields).
    pub fn namespace(&self, nsid: u32) -> Result<Namespace> {
        self.inner.born.check("device")?;
        let ns = self.namespaces().into_iter().find(|n| n.info.nsid == nsid).ok_or(Error::NoNamespace(nsid))?;
        usable_namespace(&ns.info)?;
        Ok(ns)
    }

    /// The status page: (epoch, faulted), read together in one load. [`Error::ForkedChild`] in a
    /// child forked after the device was opened (the page is not mapped there).
    pub fn status(&self) -> Result<(u64, bool)> {
        self.inner.born.check("device")?;
        let s = self.inner.status.state();
        Ok((s.epoch(), s.faulted()))
    }

    /// Counters from the status page ([`Error::ForkedChild`] as for [`Device::status`]).
    pub fn counters(&self) -> Result<StatusPage> {
        self.inner.born.check("device")?;
        Ok(self.inner.status.snapshot())
    }

    /// Registers host memory `[addr, addr + len)` (page aligned, a multiple of 4 KiB) with the
    /// module, which pins it. The registration owns no memory and exposes none.
    ///
    /// # Safety
    ///
    /// The memory must stay mapped for the registration's lifetime, and nothing may hold Rust
    /// references to any part of it while a read into it is running (the SSD writes it).
    pub(crate) unsafe fn register_host(&self, addr: *mut u8, len: usize) -> Result<Registration> {
        if !(addr as usize).is_multiple_of(4096) || len == 0 || !len.is_multiple_of(4096) {
            return Err(Error::invalid("addr", "address and length must be non-zero multiples of 4096"));
        }
        self.inner.born.check("device")?;
        let mut a = RegisterHost { addr: addr as u64, len: len as u64, handle: RegistrationHandle::default() };
        self.inner.fd.ioctl(req::RegisterHost, &mut a)?;
        self.finish_registration(a.handle)
    }

    /// Registers `[offset, offset + len)` of a dma-buf (GPU memory, a device's BAR, udmabuf, a
    /// dma-heap buffer). Its exporter may revoke it later: commands then check it once per
    /// controller epoch ([`Registration::range`]). [`Error::PeerToPeerRefused`] when the kernel
    /// allows no peer-to-peer DMA between the controller and the exporter's device.
    pub(crate) fn register_dmabuf(&self, fd: i32, offset: u64, len: u64) -> Result<Registration> {
        self.inner.born.check("device")?;
        // Read before the registration exists: a revocation after this moves the epoch.
        let live = revocation::Liveness::checked_at(self.inner.status.state().epoch(), self.inner.status.revocations());
        let mut a = RegisterDmabuf { fd, reserved: 0, offset, len, handle: RegistrationHandle::default() };
        match self.inner.fd.ioctl(req::RegisterDmabuf, &mut a) {
            Err(Error::Control { source, .. }) if source.raw_os_error() == Some(libc::EXDEV) => {
                return Err(Error::PeerToPeerRefused)
            }
            r => r?,
        };
        let mut reg = self.finish_registration(a.handle)?;
        reg.live = Some(live);
        Ok(reg)
    }

    fn finish_registration(&self, h: RegistrationHandle) -> Result<Registration> {
        let mut segments = vec![Segment::default(); h.nsegs as usize];
        // Built before GET_SEGMENTS so that a failure still deregisters (on drop).
        let mut reg = Registration { dev: self.inner.clone(), handle: h, segments: Vec::new(), live: None };
        let n = self.inner.segments_into(h, &mut segments)?;
        segments.truncate(n);
        reg.segments = segments;
        Ok(reg)
    }
}

impl Inner {
    /// `GET_SEGMENTS`: the first `out.len()` DMA segments of registration `h` into `out`;
    /// returns how many the module wrote.
    pub(crate) fn segments_into(&self, h: RegistrationHandle, out: &mut [Segment]) -> Result<usize> {
        let mut g = GetSegments {
            id: h.id,
            generation: h.generation,
            first: 0,
            // CAST: saturated: a longer slice (never seen: counts are u32) is only partly filled.
            count: u32::try_from(out.len()).unwrap_or(u32::MAX),
            segments: out.as_mut_ptr() as u64,
        };
        // SAFETY: `g.segments` points to `out`, `g.count` segments borrowed exclusively for the
        // call.
        let n = unsafe { self.fd.ioctl_unchecked(req::GetSegments, &mut g) }?;
        // CAST: the module writes at most `count` segments.
        Ok(n as usize)
    }

    /// Asks the module for a reset, the one way this crate does: skipped by the module when a
    /// reset ends while this waits for it (a revocation's, another thread's or opener's), as the
    /// epoch read here then has passed. Ok once the controller is known to have stopped since.
    pub(crate) fn reset(&self) -> Result<()> {
        let mut a = Reset { seen_epoch: self.status.state().epoch() };
        self.fd.ioctl(req::Reset, &mut a).map(drop)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.born.in_child() {
            // The parent's mappings: not in this process (VM_DONTCOPY). Leak the bookkeeping;
            // only the descriptor (the child's own reference to the open file) is closed.
            return;
        }
        // SAFETY: each field is dropped once, here, and never used again (`self` is going
        // away). Queue pairs first: they hold the doorbells too.
        unsafe {
            ManuallyDrop::drop(&mut self.queues);
            ManuallyDrop::drop(&mut self.doorbells);
            ManuallyDrop::drop(&mut self.status);
        }
    }
}

/// A namespace of a [`Device`]: where reads and writes go.
#[derive(Debug, Clone)]
pub struct Namespace {
    dev: Arc<Inner>,
    info: NamespaceInfo,
    timeout: Duration,
}

impl Namespace {
    /// The same namespace with another per-command deadline (for calls made through it).
    pub fn with_timeout(&self, timeout: Duration) -> Namespace {
        Namespace { timeout, ..self.clone() }
    }

    /// The starting LBA and block count of a single-command request (batch entries), or why
    /// it needs more than one command. The request was checked by [`crate::Storage`].
    pub(crate) fn one_command(&self, dev_offset: u64, len: u64) -> Result<(u64, u32)> {
        let per_cmd = self.max_command_bytes();
        if len > per_cmd {
            return Err(Error::invalid("len", format!("{len} bytes exceed one command's {per_cmd}")));
        }
        let shift = self.info.lba_shift;
        Ok((dev_offset >> shift, (len >> shift) as u32))
    }

    /// The largest transfer one command (and so one batch entry) may carry.
    pub fn max_command_bytes(&self) -> u64 {
        self.dev.max_cmd_bytes.min(65536 << self.info.lba_shift)
    }

    /// Metadata bytes per block (0: none; such a namespace cannot be used, see
    /// [`Device::namespace`]).
    pub fn metadata_bytes(&self) -> u16 {
        self.info.metadata_bytes
    }

    /// Protection information type (0: none).
    pub fn pi_type(&self) -> u8 {
        self.info.pi_type
    }

    /// Namespace id.
    pub fn id(&self) -> u32 {
        self.info.nsid
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u64 {
        1 << self.info.lba_shift
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.info.size_lbas << self.info.lba_shift
    }

    /// Checks a device range (non-zero, block aligned, inside the namespace); the error names
    /// the argument.
    pub fn check_range(&self, dev_offset: u64, len: u64) -> Result<()> {
        let bs = self.block_size();
        if len == 0 {
            return Err(Error::invalid("len", "must be non-zero"));
        }
        if !len.is_multiple_of(bs) {
            return Err(Error::invalid("len", format!("{len} is not a multiple of the {bs}-byte block size")));
        }
        if !dev_offset.is_multiple_of(bs) {
            return Err(Error::invalid(
                "dev_offset",
                format!("{dev_offset} is not a multiple of the {bs}-byte block size"),
            ));
        }
        if dev_offset.checked_add(len).is_none_or(|e| e > self.capacity()) {
            return Err(Error::invalid(
                "dev_offset",
                format!("[{dev_offset}, +{len}) runs past the namespace's {} bytes", self.capacity()),
            ));
        }
        Ok(())
    }

    fn queue(&self) -> &QueuePair {
        &self.dev.queues[thread_index() % self.dev.queues.len()]
    }

    /// The device's synchronous queue pairs use interrupts (and so do owned ones).
    fn interrupts(&self) -> bool {
        self.dev.queues.first().is_some_and(|q| q.sleeps())
    }

    /// Entries per synchronous queue pair.
    fn queue_depth(&self) -> u32 {
        self.dev.queues.first().map_or(2, |q| q.depth())
    }

    /// Moves `len` bytes between `reg` at `reg_offset` and the namespace at `dev_offset`, in
    /// bursts of commands all in flight at once. The request was checked by [`crate::Storage`]
    /// (the PRP builder still refuses a range outside the registration). On a timeout the
    /// controller is reset; when that fails the failure carries an [`InFlight`] token (the
    /// commands may still run), and the caller must keep the memory pinned with it.
    pub(crate) fn rw(
        &self,
        write: bool,
        reg: &Registration,
        reg_offset: u64,
        dev_offset: u64,
        len: u64,
    ) -> IoResult<()> {
        self.rw_on(lanes::Shared(self.queue()), write, reg, reg_offset, dev_offset, len)
    }

    /// [`Namespace::rw`] on queue `q` (one of the device's shared queues, or an owned one).
    fn rw_on(
        &self,
        q: impl lanes::LaneQueue,
        write: bool,
        reg: &Registration,
        reg_offset: u64,
        dev_offset: u64,
        len: u64,
    ) -> IoResult<()> {
        // The one entry of every synchronous request, shared or owned queue.
        self.dev.born.check("device")?;
        let extents = [lanes::Extent { reg_offset, dev_offset, len }];
        let lane = lanes::Lane { ns: self, reg, extents: &extents };
        lanes::run_one(write, &lane, q).map_err(|f| f.failure)
    }

    fn execute(&self, cmds: &[Command<'_>]) -> Result<()> {
        self.queue().execute(self.info.nsid, cmds, &self.dev.status, self.timeout)
    }

    /// After a timeout: reset the controller (the module disables it, waits for CSTS.RDY=0,
    /// re-enables it and re-creates every live queue, owned ones included). True when the
    /// controller is known to have stopped, so memory of the timed-out commands is safe again.
    /// The caller resynchronises the queue it was using; every other queue of this process
    /// reports the epoch change once to its next user.
    fn reset_controller(&self) -> bool {
        self.dev.reset().is_ok()
    }

    /// [`Namespace::reset_controller`], then this thread's shared queue adopts the new epoch.
    fn recover(&self) -> bool {
        let ok = self.reset_controller();
        if ok {
            self.queue().resync(&self.dev.status);
        }
        ok
    }

    fn no_data(&self, cmd: Command<'_>) -> Result<()> {
        self.dev.born.check("device")?;
        let r = self.execute(&[cmd]);
        if matches!(r, Err(Error::Timeout { .. })) {
            self.recover();
        }
        r
    }

    /// Flushes the volatile write cache. A controller without one (Identify VWC bit 0 clear)
    /// has nothing to flush: nothing is sent, which is exact.
    pub fn flush(&self) -> Result<()> {
        if self.dev.info.vwc & 1 == 0 {
            return Ok(());
        }
        self.no_data(cmd::Flush::new().build())
    }

    fn blocks(&self, dev_offset: u64, len: u64) -> Result<Vec<(u64, u32)>> {
        self.check_range(dev_offset, len)?;
        let shift = self.info.lba_shift;
        let mut v = Vec::new();
        let (mut slba, mut left) = (dev_offset >> shift, len >> shift);
        while left > 0 {
            let n = left.min(65536);
            v.push((slba, n as u32));
            slba += n;
            left -= n;
        }
        Ok(v)
    }

    /// Writes zeroes to `[dev_offset, dev_offset + len)`; refused by name when the controller
    /// lacks Write Zeroes (ONCS bit 3).
    pub fn write_zeroes(&self, dev_offset: u64, len: u64) -> Result<()> {
        optional_command(self.dev.info.oncs, ONCS_WRITE_ZEROES, "Write Zeroes")?;
        for (slba, nlb) in self.blocks(dev_offset, len)? {
            self.no_data(cmd::WriteZeroes::new(slba, nlb).build())?;
        }
        Ok(())
    }

    /// Deallocates (trims) `[dev_offset, dev_offset + len)`; refused by name when the controller
    /// lacks Dataset Management (ONCS bit 2).
    pub fn deallocate(&self, dev_offset: u64, len: u64) -> Result<()> {
        optional_command(self.dev.info.oncs, ONCS_DATASET_MANAGEMENT, "Dataset Management (deallocate)")?;
        for (slba, nlb) in self.blocks(dev_offset, len)? {
            let range = [DsmRange::new(slba, nlb)];
            self.no_data(cmd::DatasetManagement::new(&range).deallocate(true).build())?;
        }
        Ok(())
    }
}

/// Memory the module pinned (host pages) or attached (dma-buf) for this controller's DMA: its
/// handle and DMA segments. Deregistered on drop. It owns no memory and counts nothing: the
/// [`crate::Buffer`] that holds it owns the memory and the lease that says whether the SSD may
/// be using it, and drops its registrations only when no lease is outstanding. A command that
/// may still run after its I/O gave up leaves an [`InFlight`] token behind, which keeps that
/// lease for good: so a registration is dropped only once nothing in flight names it.
#[derive(Debug)]
pub(crate) struct Registration {
    dev: Arc<Inner>,
    handle: RegistrationHandle,
    segments: Vec<Segment>,
    /// A dma-buf, which its exporter may revoke; `None`: pinned host pages, never revoked.
    live: Option<revocation::Liveness>,
}

impl Registration {
    /// [`Error::Revoked`] once the exporter revoked it (checked once per controller epoch).
    pub(crate) fn alive(&self) -> Result<()> {
        self.valid_epoch().map(drop)
    }

    /// The controller epoch its segments may be named in: any (`None`, host pages), or the
    /// current one once it is known alive in it.
    #[inline]
    fn valid_epoch(&self) -> Result<Option<u64>> {
        self.live.as_ref().map(|l| l.epoch(&self.dev, self.handle)).transpose()
    }

    /// Bytes `[off, off + len)` of the registration for one command: checked alive first where
    /// its exporter may revoke it, and then valid only in the controller epoch of that check.
    ///
    /// # Safety
    ///
    /// As [`DmaRange::new`], except that the registration's liveness is checked here.
    #[inline]
    pub(crate) unsafe fn range(&self, off: u64, len: u64) -> Result<DmaRange<'_>> {
        // SAFETY: the caller's contract; a revocable registration is named only in the epoch it
        // was found alive in (a revocation resets the controller first, moving the epoch on).
        let r = unsafe { DmaRange::new(&self.segments, off, len) };
        Ok(match self.valid_epoch()? {
            None => r,
            Some(epoch) => r.only_in(epoch),
        })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.dev.born.in_child() {
            // The parent's registration: deregistering it from here would unpin the parent's
            // memory under its commands (the module refuses a non-opener anyway).
            return;
        }
        let mut d = Deregister { id: self.handle.id, generation: self.handle.generation };
        // SAFETY: no command names the registration any more: its buffer drops it only with no
        // I/O lease outstanding, and a command that may still run keeps its lease for good (an
        // `InFlight` token) unless a reset confirmed the controller stopped.
        let _ = unsafe { self.dev.fd.ioctl_unchecked(req::Deregister, &mut d) };
    }
}

#[cfg(test)]
mod tests {
    use super::is_ugds_node;

    /// Only a character device of the class `ugds_drv` is a ugds node: not a missing path, a
    /// regular file, a directory, another driver's character device, or a link to one.
    #[test]
    fn namespaces_with_metadata_are_refused_by_name() {
        use super::usable_namespace;
        use ugds_uapi::ioctl::NamespaceInfo;
        let plain = NamespaceInfo { nsid: 1, lba_shift: 12, size_lbas: 8, ..Default::default() };
        assert!(usable_namespace(&plain).is_ok());
        let md = NamespaceInfo { metadata_bytes: 8, ..plain };
        let e = usable_namespace(&md).unwrap_err().to_string();
        assert!(e.contains("8 bytes of metadata") && e.contains("nvme format"), "{e}");
        assert!(usable_namespace(&NamespaceInfo { pi_type: 1, ..plain }).is_err());
        // A size whose bytes overflow 64 bits is a protocol error, not a capacity that wrapped.
        let huge = NamespaceInfo { size_lbas: 1 << 53, ..plain };
        assert!(matches!(usable_namespace(&huge), Err(crate::Error::DeviceProtocol(_))));
        assert!(usable_namespace(&NamespaceInfo { size_lbas: (1 << 52) - 1, ..plain }).is_ok());
    }

    #[test]
    fn optional_commands_follow_oncs() {
        use super::{optional_command, ONCS_DATASET_MANAGEMENT, ONCS_WRITE_ZEROES};
        assert!(optional_command(ONCS_WRITE_ZEROES, ONCS_WRITE_ZEROES, "Write Zeroes").is_ok());
        let e = optional_command(ONCS_DATASET_MANAGEMENT, ONCS_WRITE_ZEROES, "Write Zeroes").unwrap_err();
        assert!(e.to_string().contains("Write Zeroes") && e.to_string().contains("ONCS"), "{e}");
        assert!(optional_command(0, ONCS_DATASET_MANAGEMENT, "Dataset Management (deallocate)").is_err());
    }

    #[test]
    fn is_ugds_node_needs_the_sysfs_class() {
        assert!(!is_ugds_node("/nonexistent/ugds_drv0"));
        assert!(!is_ugds_node("/proc/self/exe"));
        assert!(!is_ugds_node("/dev"));
        assert!(!is_ugds_node("/dev/null"));
        let f = std::fs::File::open("/dev/null").unwrap();
        use std::os::fd::AsRawFd;
        assert!(!is_ugds_node(format!("/proc/self/fd/{}", f.as_raw_fd())));
    }
}

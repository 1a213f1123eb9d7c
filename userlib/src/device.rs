//! The direct path's control plane over one `/dev/ugds_drvN`: [`Device`] (the open controller,
//! its queue pairs and status page), [`Namespace`] (where commands go) and the crate-private
//! `Registration` (memory the module pinned or attached for DMA); [`is_ugds_node`] tells such a
//! node from anything else. Data moves through [`crate::Storage`] and [`crate::Buffer`], which
//! own memory, leases and the request check; this layer only builds and runs commands.

use crate::cmd::DptrPolicy;
use crate::error::{Error, Result};
use crate::fork::Born;
#[cfg(doc)]
use crate::inflight::InFlight;
use crate::mmio::{Doorbells, StatusView};
#[doc(hidden)]
pub use crate::queue::DptrCounts;
use crate::queue::{Interrupt, QueuePair, QueueWait, Waiting};
pub use crate::sgl::DataPointers;
use crate::sys::{req, DeviceFd, EventFd};
pub use control::Control;
use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use ugds_uapi::ioctl::*;

/// One entry per device (or namespace) a request touches: inline up to 4, so a volume of up to
/// 4 members allocates nothing for its per-member lists; on the heap past that.
pub(crate) type PerDevice<T> = smallvec::SmallVec<[T; 4]>;

mod admin;
mod control;
pub(crate) mod lanes;
#[cfg(any(test, feature = "test-utils"))]
pub(crate) mod mock_device;
#[cfg(test)]
mod mock_tests;
mod namespace;
mod node;
mod owned;
mod registration;
mod revocation;
#[cfg(test)]
mod thread_queue_tests;
mod thread_queues;

use namespace::usable_namespace;
pub use namespace::Namespace;
pub use node::{describe_path, is_ugds_node, NODE_CLASS};
pub(crate) use owned::OwnedQueuePair;
pub(crate) use registration::{Registration, SegmentTable};
use thread_queues::ThreadQueues;

/// Tuning for [`Device::open_with`].
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// Shared I/O queue pairs for synchronous I/O (threads without a queue of their own are
    /// spread over them); 0 picks `min(4, what the controller grants)`.
    pub queues: usize,
    /// Queue pairs a thread may claim for its own synchronous I/O, at most (SPDK's queue pair
    /// per thread: no lock per request): a thread's first request claims a free one, created
    /// then, and holds it until the thread exits (it is free then for the next thread; the
    /// device gives its queues back to the controller when it closes). Threads beyond them, or
    /// when the controller
    /// has no queue pair to spare, use the shared queues. `Some(0)` turns them off; `None`
    /// picks `min(16, half of what the controller grants beyond the shared queues)`, leaving
    /// the rest for batches and owned queues.
    pub thread_queues: Option<usize>,
    /// Entries per queue; 0 picks `min(256, what the controller allows)` (CAP.MQES, which
    /// some controllers set as low as 127, i.e. 128 entries).
    pub depth: u32,
    /// Per-command deadline.
    pub timeout: Duration,
    /// How waits for completions wait: [`Waiting::Adaptive`] (the default) spins while it
    /// pays and sleeps on the queue's MSI-X interrupt (an eventfd) otherwise;
    /// [`Waiting::Poll`] always spins; [`Waiting::Interrupts`] sleeps without spinning.
    pub waiting: Waiting,
    /// Adaptive waiting: a request larger than this sleeps on the interrupt without spinning
    /// (cuFile's `poll_mode_max_size_kb`); `u64::MAX` lets every request spin.
    pub spin_max_bytes: u64,
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
            thread_queues: None,
            depth: 0,
            timeout: Duration::from_secs(30),
            waiting: Waiting::Adaptive,
            spin_max_bytes: u64::MAX,
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
    /// Queue pairs threads claim for their own synchronous I/O.
    threads: ManuallyDrop<Arc<ThreadQueues>>,
    /// The fork generation it was opened in.
    pub(crate) born: Born,
    pub(crate) timeout: Duration,
    /// Largest transfer of one command.
    max_cmd_bytes: u64,
    /// PRPs or SGLs: every queue pair of this open device gets it.
    pub(crate) dptr: DptrPolicy,
    /// How every queue pair of this open device waits.
    pub(crate) wait: WaitPolicy,
}

/// An open ugds controller: its queue pairs are mapped into this process.
#[derive(Debug, Clone)]
pub struct Device {
    pub(crate) inner: Arc<Inner>,
}

/// How an open device's queue pairs wait: the mode in effect and the adaptive mode's size limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitPolicy {
    pub(crate) mode: Waiting,
    pub(crate) spin_max_bytes: u64,
}

/// Creates a queue pair of `depth` entries on the controller and maps its SQ, CQ and PRP pool;
/// unless it only polls, also attaches an eventfd to its MSI-X vector. Its commands use PRPs or
/// SGLs as `dptr` says.
pub(crate) fn create_queue_pair(
    fd: &Arc<DeviceFd>,
    depth: u32,
    wait: WaitPolicy,
    doorbells: &Arc<Doorbells>,
    epoch: u64,
    dptr: DptrPolicy,
) -> Result<QueuePair> {
    let interrupts = wait.mode.wants_interrupts();
    let flags = if interrupts { QPAIR_FLAG_IRQ } else { 0 };
    let mut a = CreateQpair { depth, flags, ..Default::default() };
    fd.ioctl(req::CreateQpair, &mut a)?;
    let irq = if interrupts {
        let ev = EventFd::new()?;
        let mut s = SetEventfd { qid: a.qid, fd: ev.raw() };
        fd.ioctl(req::SetEventfd, &mut s)?;
        Some(Interrupt::one_shot(ev, fd, a.qid)?)
    } else {
        None
    };
    QueuePair::map(fd, &a, doorbells, epoch, QueueWait::new(wait.mode, irq, wait.spin_max_bytes), dptr)
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

pub(super) fn thread_index() -> usize {
    THREAD_INDEX.with(|t| {
        if t.get() == usize::MAX {
            t.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
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
        flags: 0,
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
    /// How its waits for completions wait: the mode asked for, or polling where adaptive
    /// waiting found no interrupt vector to sleep on.
    pub fn waiting(&self) -> Waiting {
        self.inner.wait.mode
    }

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
        let mode = match opts.waiting {
            Waiting::Interrupts if info.irq_vectors == 0 => {
                return Err(Error::invalid("waiting", "the controller has no MSI-X vectors for I/O queues"));
            }
            // Adaptive waiting without an interrupt to sleep on is polling.
            Waiting::Adaptive if info.irq_vectors == 0 => Waiting::Poll,
            m => m,
        };
        let wait = WaitPolicy { mode, spin_max_bytes: opts.spin_max_bytes };
        let nqueues = if opts.queues == 0 { 4.min(info.max_qpairs as usize) } else { opts.queues };
        if nqueues == 0 || nqueues > info.max_qpairs as usize {
            return Err(Error::invalid("queues", format!("must be 1..={} on this controller", info.max_qpairs)));
        }
        let spare = info.max_qpairs as usize - nqueues;
        let thread_queues = opts.thread_queues.unwrap_or((spare / 2).min(16));
        if thread_queues > spare {
            return Err(Error::invalid(
                "thread_queues",
                format!("must be 0..={spare} on this controller with {nqueues} shared queues"),
            ));
        }
        let depth = if opts.depth == 0 { 256.min(info.max_queue_entries) } else { opts.depth };
        if depth < 2 || depth > info.max_queue_entries {
            return Err(Error::invalid("depth", format!("must be 2..={}", info.max_queue_entries)));
        }
        let status = StatusView::map(fd.raw())?;
        let epoch = status.state().epoch();
        let db_len = (4096usize)
            .max(((2 * info.max_qpairs as usize + 2) * info.doorbell_stride as usize).next_multiple_of(4096));
        let shadow = info.flags & ugds_uapi::ioctl::DEVICE_SHADOW_DOORBELLS != 0;
        let doorbells = Arc::new(Doorbells::map(fd.raw(), db_len, shadow)?);
        let dptr = DptrPolicy::new(opts.data_pointers, info.sgls);
        let mut queues = Vec::with_capacity(nqueues);
        for _ in 0..nqueues {
            queues.push(create_queue_pair(&fd, depth, wait, &doorbells, epoch, dptr)?);
        }
        let mdts = if info.mdts_bytes == 0 { u64::MAX } else { info.mdts_bytes as u64 };
        Ok(Device {
            inner: Arc::new(Inner {
                fd,
                info,
                status: ManuallyDrop::new(status),
                doorbells: ManuallyDrop::new(doorbells),
                queues: ManuallyDrop::new(queues),
                threads: ManuallyDrop::new(Arc::new(ThreadQueues::new(thread_queues, Vec::new()))),
                born,
                timeout: opts.timeout,
                max_cmd_bytes: mdts.min(MAX_CMD_BYTES),
                dptr,
                wait,
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
        for q in self.inner.threads.made() {
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
        let mut reg =
            Registration { dev: self.inner.clone(), handle: h, segments: SegmentTable::default(), live: None };
        let n = self.inner.segments_into(h, &mut segments)?;
        segments.truncate(n);
        reg.segments = SegmentTable::new(segments);
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

    /// A new queue pair for a thread's own synchronous I/O: as deep as the shared queues,
    /// waiting the same way.
    fn create_thread_queue(&self) -> Result<QueuePair> {
        let depth = self.queues.first().map_or(2, QueuePair::depth);
        create_queue_pair(&self.fd, depth, self.wait, &self.doorbells, self.status.state().epoch(), self.dptr)
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
            ManuallyDrop::drop(&mut self.threads);
            ManuallyDrop::drop(&mut self.doorbells);
            ManuallyDrop::drop(&mut self.status);
        }
    }
}

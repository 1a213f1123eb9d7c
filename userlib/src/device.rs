//! `Device`, `Namespace` and `Registration`: the public, safe API over one `/dev/ugds_drvN`;
//! [`is_ugds_node`] tells such a node from anything else.

use crate::cmd::{self, Command, DmaRange, DsmRange};
use crate::error::{Error, Result};
use crate::mem::HostMemory;
use crate::mmio::{Doorbells, StatusView};
use crate::queue::{self, QueuePair, MAX_BURST};
use crate::sys::{req, DeviceFd, EventFd};
use std::cell::Cell;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use ugds_uapi::ioctl::*;

/// Tuning for [`Device::open_with`].
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// I/O queue pairs for synchronous I/O (threads are spread over them); 0 picks
    /// `min(4, what the controller grants)`.
    pub queues: usize,
    /// Entries per queue.
    pub depth: u32,
    /// Per-command deadline.
    pub timeout: Duration,
    /// Interrupt mode: wait for completions on the queue's MSI-X interrupt (an eventfd) after
    /// one poll, instead of busy polling. Costs a system call per wait; saves the CPU.
    pub interrupts: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions { queues: 0, depth: 256, timeout: Duration::from_secs(30), interrupts: false }
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) fd: DeviceFd,
    pub(crate) info: DeviceInfo,
    pub(crate) status: StatusView,
    /// The doorbell page(s), shared by every queue pair of this open file.
    pub(crate) doorbells: Arc<Doorbells>,
    queues: Vec<QueuePair>,
    pub(crate) timeout: Duration,
    /// Largest transfer of one command.
    max_cmd_bytes: u64,
}

/// An open ugds controller: its queue pairs are mapped into this process.
#[derive(Debug, Clone)]
pub struct Device {
    pub(crate) inner: Arc<Inner>,
}

/// Creates a queue pair of `depth` entries on the controller and maps its SQ, CQ and PRP pool;
/// in interrupt mode also attaches an eventfd to its MSI-X vector.
pub(crate) fn create_queue_pair(
    fd: &DeviceFd,
    depth: u32,
    interrupts: bool,
    doorbells: &Arc<Doorbells>,
    epoch: u64,
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
    QueuePair::map(fd, &a, doorbells, epoch, irq)
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

/// Refuses a namespace whose blocks carry metadata or protection information.
fn metadata_free(info: &NamespaceInfo) -> Result<()> {
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

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end_matches([' ', '\0']).to_string()
}

impl Device {
    /// Opens `/dev/ugds_drvN` with default options.
    pub fn open(path: &str) -> Result<Self> {
        Self::open_with(path, DeviceOptions::default())
    }

    /// Opens `/dev/ugds_drvN`: checks the ABI version, creates and maps the queue pairs.
    pub fn open_with(path: &str, opts: DeviceOptions) -> Result<Self> {
        if std::path::Path::new(path).exists() && !is_ugds_node(path) {
            return Err(Error::NotUgdsNode {
                path: path.to_string(),
                what: describe_path(path),
                fix: "bind a controller to ugds (`cargo xtask bind /dev/nvmeX`, which prints its node \
                      /dev/ugds_drvN); files and block devices take the fallback path through \
                      `Storage::open` (the CLI's info, read and write accept them)",
            });
        }
        let fd = DeviceFd::open(path)?;
        let mut info = DeviceInfo {
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
        };
        fd.ioctl(req::GetInfo, &mut info)?;
        if info.abi_version != ABI_VERSION {
            return Err(Error::AbiMismatch { kernel: info.abi_version, library: ABI_VERSION });
        }
        if opts.interrupts && info.irq_vectors == 0 {
            return Err(Error::invalid("interrupts", "the controller has no MSI-X vectors for I/O queues"));
        }
        let nqueues = if opts.queues == 0 { 4.min(info.max_qpairs as usize) } else { opts.queues };
        if nqueues == 0 || nqueues > info.max_qpairs as usize {
            return Err(Error::invalid("queues", format!("must be 1..={} on this controller", info.max_qpairs)));
        }
        if opts.depth < 2 || opts.depth > info.max_queue_entries {
            return Err(Error::invalid("depth", format!("must be 2..={}", info.max_queue_entries)));
        }
        let status = StatusView::map(fd.raw())?;
        let (epoch, _) = queue::read_status(&status);
        let db_len = (4096usize)
            .max(((2 * info.max_qpairs as usize + 2) * info.doorbell_stride as usize).next_multiple_of(4096));
        let doorbells = Arc::new(Doorbells::map(fd.raw(), db_len)?);
        let mut queues = Vec::with_capacity(nqueues);
        for _ in 0..nqueues {
            queues.push(create_queue_pair(&fd, opts.depth, opts.interrupts, &doorbells, epoch)?);
        }
        let mdts = if info.mdts_bytes == 0 { u64::MAX } else { info.mdts_bytes as u64 };
        Ok(Device {
            inner: Arc::new(Inner {
                fd,
                info,
                status,
                doorbells,
                queues,
                timeout: opts.timeout,
                max_cmd_bytes: mdts.min(MAX_CMD_BYTES),
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
        let ns = self.namespaces().into_iter().find(|n| n.info.nsid == nsid).ok_or(Error::NoNamespace(nsid))?;
        metadata_free(&ns.info)?;
        Ok(ns)
    }

    /// The status page: (epoch, faulted).
    pub fn status(&self) -> (u64, bool) {
        queue::read_status(&self.inner.status)
    }

    /// Counters from the status page.
    pub fn counters(&self) -> StatusPage {
        self.inner.status.snapshot()
    }

    /// Allocates `len` bytes of page-aligned host memory (rounded up to 4 KiB) and registers it.
    pub fn alloc(&self, len: usize) -> Result<Registration> {
        if len == 0 {
            return Err(Error::invalid("len", "must be non-zero"));
        }
        let mem = HostMemory::new(len.next_multiple_of(4096))?;
        let mut a =
            RegisterHost { addr: mem.as_ptr() as u64, len: mem.len() as u64, handle: RegistrationHandle::default() };
        self.inner.fd.ioctl(req::RegisterHost, &mut a)?;
        self.finish_registration(a.handle, mem.len() as u64, Some(mem))
    }

    /// Registers caller-owned host memory `[addr, addr + len)` (page aligned, a multiple of
    /// 4 KiB). The registration exposes no slice of it.
    ///
    /// # Safety
    ///
    /// The memory must stay mapped for the registration's lifetime, and the caller must not hold
    /// Rust references to any part of it while a read into it is running (the SSD writes it).
    pub unsafe fn register_host(&self, addr: *mut u8, len: usize) -> Result<Registration> {
        if !(addr as usize).is_multiple_of(4096) || len == 0 || !len.is_multiple_of(4096) {
            return Err(Error::invalid("addr", "address and length must be non-zero multiples of 4096"));
        }
        let mut a = RegisterHost { addr: addr as u64, len: len as u64, handle: RegistrationHandle::default() };
        self.inner.fd.ioctl(req::RegisterHost, &mut a)?;
        self.finish_registration(a.handle, len as u64, None)
    }

    /// Registers `[offset, offset + len)` of a dma-buf (GPU memory, udmabuf, dma-heap buffer).
    pub fn register_dmabuf(&self, fd: i32, offset: u64, len: u64) -> Result<Registration> {
        let mut a = RegisterDmabuf { fd, reserved: 0, offset, len, handle: RegistrationHandle::default() };
        self.inner.fd.ioctl(req::RegisterDmabuf, &mut a)?;
        self.finish_registration(a.handle, len, None)
    }

    fn finish_registration(&self, h: RegistrationHandle, len: u64, mem: Option<HostMemory>) -> Result<Registration> {
        let mut segments = vec![Segment::default(); h.nsegs as usize];
        let mut g = GetSegments {
            id: h.id,
            generation: h.generation,
            first: 0,
            count: h.nsegs,
            segments: segments.as_mut_ptr() as u64,
        };
        // Built before GET_SEGMENTS so that a failure still deregisters (on drop).
        let mut reg = Registration {
            dev: self.inner.clone(),
            handle: h,
            segments: Vec::new(),
            len,
            mem,
            inflight: AtomicU32::new(0),
            views: AtomicU64::new(0),
        };
        // SAFETY: `g.segments` points to `segments`, a live vector of `g.count` segments that
        // nothing else references during the call.
        let n = unsafe { self.inner.fd.ioctl_unchecked(req::GetSegments, &mut g) }?;
        segments.truncate(n as usize);
        reg.segments = segments;
        Ok(reg)
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

    /// Checks a data request against the namespace and the registration; the error names the
    /// argument.
    fn check_request(&self, reg: &Registration, reg_offset: u64, dev_offset: u64, len: u64) -> Result<()> {
        self.check_range(dev_offset, len)?;
        if !Arc::ptr_eq(&reg.dev, &self.dev) {
            return Err(Error::invalid("reg", "registered on another device"));
        }
        if reg_offset.checked_add(len).is_none_or(|e| e > reg.len) {
            return Err(Error::invalid(
                "reg_offset",
                format!("[{reg_offset}, +{len}) runs past the {}-byte registration", reg.len),
            ));
        }
        if !reg_offset.is_multiple_of(4) {
            return Err(Error::invalid("reg_offset", "must be a multiple of 4 (PRP alignment)"));
        }
        Ok(())
    }

    /// Checks a single-command request (batches): [`Namespace::check_request`] plus the
    /// per-command size limit. Returns the starting LBA and block count.
    pub(crate) fn check_io(
        &self,
        reg: &Registration,
        reg_offset: u64,
        dev_offset: u64,
        len: u64,
    ) -> Result<(u64, u32)> {
        self.check_request(reg, reg_offset, dev_offset, len)?;
        let shift = self.info.lba_shift;
        let blocks = len >> shift;
        let per_cmd = self.dev.max_cmd_bytes.min(65536 << shift);
        if len > per_cmd {
            return Err(Error::invalid("len", format!("{len} bytes exceed one command's {per_cmd}")));
        }
        Ok((dev_offset >> shift, blocks as u32))
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

    /// Reads `len` bytes at `dev_offset` into `reg` at `reg_offset`.
    pub fn read(&self, reg: &mut Registration, reg_offset: u64, dev_offset: u64, len: u64) -> Result<()> {
        self.rw(false, reg, reg_offset, dev_offset, len)
    }

    /// Writes `len` bytes from `reg` at `reg_offset` to `dev_offset`.
    pub fn write(&self, reg: &Registration, reg_offset: u64, dev_offset: u64, len: u64) -> Result<()> {
        self.rw(true, reg, reg_offset, dev_offset, len)
    }

    pub(crate) fn rw(&self, write: bool, reg: &Registration, reg_offset: u64, dev_offset: u64, len: u64) -> Result<()> {
        self.check_request(reg, reg_offset, dev_offset, len)?;
        let shift = self.info.lba_shift;
        let per_cmd = self.dev.max_cmd_bytes.min(65536 << shift) & !(self.block_size() - 1);
        let mut done = 0u64;
        let burst_max = MAX_BURST.min(self.queue().depth() as usize - 1);
        while done < len {
            let mut burst = [cmd::Flush::new().build(); MAX_BURST];
            let mut n = 0;
            while n < burst_max && done < len {
                let chunk = per_cmd.min(len - done);
                let (slba, nlb) = ((dev_offset + done) >> shift, (chunk >> shift) as u32);
                // SAFETY: `reg` is registered and borrowed for the whole call, and `submit`
                // counts the commands in flight on it (a timed-out one stays counted, so the
                // registration is not released); reads borrow it exclusively (`read` takes
                // `&mut Registration`); `chunk` is exactly `nlb` blocks.
                let data = unsafe { DmaRange::new(&reg.segments, reg_offset + done, chunk) };
                burst[n] = if write {
                    cmd::Write::new(slba, nlb, data).build()
                } else {
                    cmd::Read::new(slba, nlb, data).build()
                };
                n += 1;
                done += chunk;
            }
            self.submit(reg, &burst[..n])?;
        }
        Ok(())
    }

    fn submit(&self, reg: &Registration, cmds: &[Command<'_>]) -> Result<()> {
        reg.inflight.fetch_add(cmds.len() as u32, Ordering::AcqRel);
        let r = self.execute(cmds);
        // Commands that timed out may still run unless the reset below confirmed the
        // controller stopped: until then they stay counted, so the registration refuses to be
        // released and its memory stays pinned.
        match &r {
            Err(Error::Timeout { .. }) if self.recover() => {
                reg.inflight.fetch_sub(cmds.len() as u32, Ordering::AcqRel);
            }
            Err(Error::Timeout { .. }) => {}
            _ => {
                reg.inflight.fetch_sub(cmds.len() as u32, Ordering::AcqRel);
            }
        }
        r
    }

    fn execute(&self, cmds: &[Command<'_>]) -> Result<()> {
        self.queue().execute(self.info.nsid, cmds, &self.dev.status, self.timeout)
    }

    /// After a timeout: reset the controller (the module disables it, waits for CSTS.RDY=0,
    /// re-enables it and re-creates every live queue). True when the controller is known to
    /// have stopped, so memory of the timed-out commands is safe again.
    fn recover(&self) -> bool {
        let ok = self.dev.fd.ioctl(req::Reset, &mut ()).is_ok();
        if ok {
            self.queue().resync(&self.dev.status);
        }
        ok
    }

    fn no_data(&self, cmd: Command<'_>) -> Result<()> {
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

/// Memory the controller may DMA into or out of. Deregistered on drop.
///
/// Reads take `&mut Registration` and writes `&Registration`, so no Rust reference to the
/// memory can exist while the SSD writes it. Each registration counts its commands in flight;
/// a registration whose commands timed out is never released (its memory stays pinned and
/// mapped) because the SSD may still write it.
#[derive(Debug)]
pub struct Registration {
    dev: Arc<Inner>,
    handle: RegistrationHandle,
    segments: Vec<Segment>,
    len: u64,
    mem: Option<HostMemory>,
    inflight: AtomicU32,
    /// CPU views (`as_slice` guards) in the high 32 bits, device writes into the memory (reads
    /// from the SSD) in flight in the low 32 bits: the two never overlap.
    views: AtomicU64,
}

/// A read-only CPU view of a registration's host memory; while it lives, no batch may read
/// from the SSD into the registration.
#[derive(Debug)]
pub struct HostView<'a> {
    reg: &'a Registration,
    bytes: &'a [u8],
}

impl std::ops::Deref for HostView<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl Drop for HostView<'_> {
    fn drop(&mut self) {
        self.reg.views.fetch_sub(1 << 32, Ordering::AcqRel);
    }
}

impl Registration {
    /// Marks `n` device writes (reads from the SSD into this memory) in flight; refused while a
    /// CPU view exists.
    pub(crate) fn begin_device_writes(&self, n: u32) -> Result<()> {
        let mut cur = self.views.load(Ordering::Acquire);
        loop {
            if cur >> 32 != 0 {
                return Err(Error::RegistrationBusy { id: self.handle.id, inflight: (cur >> 32) as u32 });
            }
            match self.views.compare_exchange_weak(cur, cur + n as u64, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(v) => cur = v,
            }
        }
    }

    /// Ends `n` device writes.
    pub(crate) fn end_device_writes(&self, n: u32) {
        self.views.fetch_sub(n as u64, Ordering::AcqRel);
    }

    /// Counts `n` commands in flight that name this registration.
    pub(crate) fn add_inflight(&self, n: u32) {
        self.inflight.fetch_add(n, Ordering::AcqRel);
    }

    /// Uncounts `n` commands.
    pub(crate) fn sub_inflight(&self, n: u32) {
        self.inflight.fetch_sub(n, Ordering::AcqRel);
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when empty (never, for a live registration).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The id and generation the module knows it by.
    pub fn handle(&self) -> RegistrationHandle {
        self.handle
    }

    /// Its DMA segments.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Commands in flight that name it.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Acquire)
    }

    /// A view of the host memory: `None` for a dma-buf or caller-owned registration, and
    /// while a batch is reading from the SSD into it.
    pub fn as_slice(&self) -> Option<HostView<'_>> {
        let m = self.mem.as_ref()?;
        let mut cur = self.views.load(Ordering::Acquire);
        loop {
            if cur & 0xFFFF_FFFF != 0 {
                return None;
            }
            match self.views.compare_exchange_weak(cur, cur + (1 << 32), Ordering::AcqRel, Ordering::Acquire) {
                // SAFETY: the view's lease is held: device writes are refused until it ends
                // (`begin_device_writes`), so nothing writes the memory while the slice lives.
                Ok(_) => return Some(HostView { reg: self, bytes: unsafe { m.as_slice() } }),
                Err(v) => cur = v,
            }
        }
    }

    /// The host memory, mutable (None for a dma-buf registration).
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        // SAFETY: `&mut self`: no I/O can name this registration while the borrow lives (I/O
        // borrows it shared, batches through an `Arc` that makes `&mut` impossible).
        self.mem.as_mut().map(|m| unsafe { m.as_mut_slice() })
    }

    /// Deregisters now; when commands are in flight, refuses and hands the registration back
    /// with [`Error::RegistrationBusy`].
    #[allow(clippy::result_large_err)]
    pub fn deregister(self) -> std::result::Result<(), Box<(Self, Error)>> {
        let n = self.inflight();
        if n > 0 {
            let id = self.handle.id;
            return Err(Box::new((self, Error::RegistrationBusy { id, inflight: n })));
        }
        drop(self);
        Ok(())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.inflight() > 0 {
            // The SSD may still write this memory: keep it pinned and mapped for good.
            if let Some(m) = self.mem.take() {
                std::mem::forget(m);
            }
            return;
        }
        let mut d = Deregister { id: self.handle.id, generation: self.handle.generation };
        // SAFETY: no command names the registration any more: none is in flight (checked
        // above), and a timed-out one keeps `inflight` raised until a reset confirmed the
        // controller stopped.
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
        use super::metadata_free;
        use ugds_uapi::ioctl::NamespaceInfo;
        let plain = NamespaceInfo { nsid: 1, lba_shift: 12, size_lbas: 8, ..Default::default() };
        assert!(metadata_free(&plain).is_ok());
        let md = NamespaceInfo { metadata_bytes: 8, ..plain };
        let e = metadata_free(&md).unwrap_err().to_string();
        assert!(e.contains("8 bytes of metadata") && e.contains("nvme format"), "{e}");
        assert!(metadata_free(&NamespaceInfo { pi_type: 1, ..plain }).is_err());
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

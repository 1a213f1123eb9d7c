//! An in-memory NVMe device for host tests, fuzzing and the data-path cost benchmark. The real
//! [`QueuePair`] runs over shared memory (memfd mappings) exactly as it runs over the module's;
//! on the other side a device model ([`model`]) fetches the submission entries, decodes Read,
//! Write, Flush, Write Zeroes and Dataset Management, follows PRPs or SGLs to move data between a
//! backing store and host memory, and posts completions, respecting the CQ head doorbell. It
//! can also misbehave ([`Fault`]). Never a substitute for the VM tests against QEMU's NVMe.
//!
//! Typical use (a test of this crate, or with the `test-utils` feature):
//!
//! ```ignore
//! let m = MockQueue::with(MockConfig { block_size: 512, ..MockConfig::default() })?;
//! m.host_write(0, &data);
//! // SAFETY: the mock's segments name its own memory, which only its device model touches.
//! let range = unsafe { DmaRange::new(m.segments(), 0, 4096) };
//! m.qp.execute(1, &[Write::new(0, 8, range).build()], &m.status, Duration::from_secs(5))?;
//! assert_eq!(m.backing(0, 8), data);
//! ```

mod model;
#[cfg(test)]
mod sgl_tests;
#[cfg(test)]
mod tests;

pub use model::MockStats;

use crate::cmd::DptrPolicy;
use crate::error::{Error, Result};
use crate::mem::{DeviceShared, QueueMemory};
use crate::mmio::{Doorbells, StatusView};
use crate::prp::PAGE;
use crate::queue::{QueuePair, QueueWait, Waiting};
use crate::sgl::DataPointers;
use model::Model;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use ugds_uapi::ioctl::{ControllerState, CreateQpair, Segment, StatusPage, ABI_VERSION, STATUS_MAGIC};

/// Bus address of the mock's PRP-list pool.
const PRP_BUS: u64 = 0x10_0000_0000;
/// Bus address where the mock's host memory starts (its segments lie from here).
const HOST_BUS: u64 = 0x2000_0000;

/// A completion the device posts before the honest one for a command.
#[derive(Debug, Clone, Copy)]
pub struct HostileCqe {
    /// Command id to claim (may be unknown or a duplicate).
    pub cid: u16,
    /// SQ head to report (may be out of range).
    pub sq_head: u16,
    /// Raw 15-bit status field.
    pub status: u16,
}

/// What the device does to one command (in the order it fetches them).
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Nothing: complete it honestly.
    None,
    /// Post this completion first, then the honest one.
    Extra(HostileCqe),
    /// Complete it with this raw 15-bit status (after moving its data, if any).
    Status(u16),
    /// Post its completion with the previous pass's phase tag (the host must never take it,
    /// nor anything the device posts after it).
    BadPhase,
    /// Never complete it.
    Never,
}

/// How the device answers.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Completes every command as the spec says.
    Honest,
    /// Posts these completions first, one before each command's honest completion, then
    /// behaves honestly.
    Hostile(Vec<HostileCqe>),
    /// Applies these faults, one per command in fetch order, then behaves honestly.
    Script(Vec<Fault>),
}

/// The device's geometry and behaviour.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Queue depth (2..=4096 here).
    pub depth: u32,
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Namespace capacity in blocks.
    pub blocks: u64,
    /// Host memory: `segments` segments of `segment_bytes` each (a multiple of 4096).
    pub segment_bytes: u64,
    /// See `segment_bytes`.
    pub segments: u64,
    /// Place the segments in reverse order in bus memory, so a transfer that crosses a
    /// segment boundary is discontiguous on the bus (PRP lists then name scattered pages).
    pub scatter: bool,
    /// A null device: keeps no data (reads leave host memory as is, writes vanish). PRPs are
    /// still followed and checked. For the cost benchmark.
    pub null: bool,
    /// The device runs only when [`MockQueue::step`] is called, on the caller's thread
    /// (deterministic, countable); otherwise a thread runs it, polling the doorbells.
    pub stepped: bool,
    /// How it answers.
    pub behaviour: Behaviour,
    /// Identify SGLS as the device reports it (bits 1:0: 0 no SGLs, 1 supported, 2 supported
    /// with dword alignment); the model refuses SGL commands without it (Invalid Field).
    pub sgls: u32,
    /// What the queue pair is asked to use (combined with `sgls` as a device open does).
    pub data_pointers: DataPointers,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            depth: 8,
            block_size: 4096,
            blocks: 256,
            segment_bytes: 1 << 20,
            segments: 1,
            scatter: false,
            null: false,
            stepped: false,
            behaviour: Behaviour::Honest,
            sgls: 1,
            data_pointers: DataPointers::Auto,
        }
    }
}

/// How host memory lies in bus memory.
#[derive(Debug, Clone, Copy)]
struct HostLayout {
    seg_bytes: u64,
    nsegs: u64,
    scatter: bool,
}

impl HostLayout {
    /// Bus slot of segment `k` (its own inverse).
    fn slot(&self, k: u64) -> u64 {
        if self.scatter {
            self.nsegs - 1 - k
        } else {
            k
        }
    }

    fn segments(&self) -> Vec<Segment> {
        (0..self.nsegs)
            .map(|k| Segment { dma_addr: HOST_BUS + self.slot(k) * self.seg_bytes, len: self.seg_bytes })
            .collect()
    }

    /// The host memory offset of `[bus, bus + n)`, which must lie inside one segment.
    fn host_offset(&self, bus: u64, n: u64) -> Option<usize> {
        let rel = bus.checked_sub(HOST_BUS)?;
        if self.nsegs == 1 {
            // CAST: inside the host memory's mapping.
            return (rel.checked_add(n)? <= self.seg_bytes).then_some(rel as usize);
        }
        let (slot, within) = (rel / self.seg_bytes, rel % self.seg_bytes);
        if slot >= self.nsegs || within.checked_add(n)? > self.seg_bytes {
            return None;
        }
        // CAST: inside the host memory's mapping.
        Some((self.slot(slot) * self.seg_bytes + within) as usize)
    }
}

/// Shared memory of `len` bytes (a memfd), to map once for the host side and once for the
/// device side.
pub(crate) fn memfd(len: usize) -> Result<OwnedFd> {
    // SAFETY: a valid NUL-terminated name; the fd is owned below.
    let fd = unsafe { libc::memfd_create(c"ugds-mock".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::Control { op: "memfd_create", source: io::Error::last_os_error() });
    }
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // CAST: test sizes fit off_t.
    // SAFETY: plain system call on our fd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(Error::Control { op: "ftruncate", source: io::Error::last_os_error() });
    }
    Ok(fd)
}

/// Two views of one new shared region: (host side, device side).
fn shared(len: usize, bus: u64) -> Result<(DeviceShared, DeviceShared)> {
    let fd = memfd(len)?;
    Ok((
        DeviceShared::map(fd.as_raw_fd(), 0, len, bus, "mock")?,
        DeviceShared::map(fd.as_raw_fd(), 0, len, bus, "mock")?,
    ))
}

/// A queue pair wired to the in-memory device.
pub struct MockQueue {
    /// The queue pair under test (namespace id 1).
    pub qp: QueuePair,
    /// The status page (epoch 1, not faulted, until the test changes it).
    pub status: StatusView,
    doorbells: Arc<Doorbells>,
    dev: MockDevice,
}

/// The device side of a [`MockQueue`]: the model, its thread and the host memory it moves
/// data to and from. Stops the thread on drop.
pub(crate) struct MockDevice {
    model: Arc<Mutex<Model>>,
    host: DeviceShared,
    segments: Vec<Segment>,
    block_size: u32,
    stop: Arc<AtomicBool>,
    device: Option<JoinHandle<()>>,
}

thread_local! {
    /// The models a stepped mock's waits run on this thread (see [`MockDevice::step_on_idle_polls`]).
    static STEP_ON_IDLE: std::cell::RefCell<Vec<Arc<Mutex<Model>>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs the models registered for this thread, if any: called by a wait each time its poll
/// found nothing, so a stepped mock behind a [`crate::Device`] answers synchronous I/O on the
/// caller's thread. Never inlined, so a profiler (`cargo xtask cost`) counts the models' work,
/// and the walk over them, apart from the engine's.
#[inline(never)]
pub(crate) fn on_idle_poll() {
    STEP_ON_IDLE.with(|models| {
        for m in models.borrow().iter() {
            step_model(m);
        }
    });
}

/// One step of `m`.
fn step_model(m: &Mutex<Model>) -> usize {
    m.lock().unwrap_or_else(|p| p.into_inner()).step()
}

/// Whether a model runs on this thread's idle polls.
#[cfg(test)]
pub(crate) fn stepping_on_idle_polls() -> bool {
    STEP_ON_IDLE.with(|m| !m.borrow().is_empty())
}

/// Sets or clears `model`'s status page's faulted flag.
fn set_faulted(model: &Mutex<Model>, on: bool) {
    let m = model.lock().unwrap_or_else(|p| p.into_inner());
    let off = std::mem::offset_of!(StatusPage, state);
    let s = ControllerState(m.status.load64(off));
    m.status.store64(off, ControllerState::new(s.epoch(), on).0);
}

/// Stops running a model on this thread's idle polls.
pub(crate) fn stop_stepping_on_idle_polls() {
    STEP_ON_IDLE.with(|m| m.borrow_mut().clear());
}

impl MockDevice {
    /// From now on each step posts at most `n` completions (at least 1), the rest waiting for
    /// later steps: commands that finish a few at a time, as on a device with many in flight.
    pub(crate) fn post_at_most(&self, n: usize) {
        self.model.lock().unwrap_or_else(|p| p.into_inner()).posts_per_step = n.max(1);
    }

    /// From now on, every wait of this thread that polls and finds nothing steps this (stepped)
    /// model once.
    pub(crate) fn step_on_idle_polls(&self) {
        STEP_ON_IDLE.with(|m| *m.borrow_mut() = vec![self.model.clone()]);
    }

    /// [`MockDevice::step_on_idle_polls`], besides the models stepped already (a volume's
    /// members, each stepped once per idle poll).
    pub(crate) fn also_step_on_idle_polls(&self) {
        STEP_ON_IDLE.with(|m| m.borrow_mut().push(self.model.clone()));
    }

    /// The DMA segments of the mock's host memory.
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Bytes of host memory.
    pub(crate) fn host_len(&self) -> usize {
        self.host.len()
    }

    /// Copies `len` bytes of host memory at `off` (dword aligned, a whole number of dwords).
    pub(crate) fn host_read(&self, off: usize, len: usize) -> Vec<u8> {
        (0..len / 4).flat_map(|i| self.host.load32(off + 4 * i).to_le_bytes()).collect()
    }

    /// Copies `data` into host memory at `off` (dword aligned, a whole number of dwords).
    pub(crate) fn host_write(&self, off: usize, data: &[u8]) {
        for (i, w) in data.chunks_exact(4).enumerate() {
            self.host.store32(off + 4 * i, u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        }
    }

    /// The namespace's data: `blocks` blocks at `lba` (empty on a null device).
    pub(crate) fn backing(&self, lba: u64, blocks: u64) -> Vec<u8> {
        let m = self.model.lock().unwrap_or_else(|p| p.into_inner());
        let bs = self.block_size as u64;
        let (a, b) = ((lba * bs) as usize, ((lba + blocks) * bs) as usize);
        m.backing.get(a..b).map(<[u8]>::to_vec).unwrap_or_default()
    }

    /// Runs the device once (see [`MockQueue::step`]).
    #[cfg(test)]
    pub(crate) fn step(&self) -> usize {
        step_model(&self.model)
    }

    /// The SQ tail and CQ head doorbells as the device sees them.
    pub(crate) fn doorbells(&self) -> (u32, u32) {
        let m = self.model.lock().unwrap_or_else(|p| p.into_inner());
        (m.doorbells.load32(m.sq_db), m.doorbells.load32(m.cq_db))
    }

    /// What the device did so far.
    #[cfg(test)]
    pub(crate) fn stats(&self) -> MockStats {
        self.model.lock().unwrap_or_else(|p| p.into_inner()).stats
    }

    /// Resets the controller as the module does (see [`MockQueue::reset_controller`]).
    #[cfg(test)]
    pub(crate) fn reset_controller(&self) {
        let mut m = self.model.lock().unwrap_or_else(|p| p.into_inner());
        m.reset(std::mem::offset_of!(StatusPage, state));
    }

    /// Sets or clears the status page's faulted flag.
    pub(crate) fn set_faulted(&self, on: bool) {
        set_faulted(&self.model, on);
    }

    /// Sets the status page's faulted flag from another thread once `after` passed: a fault
    /// that arrives while this thread waits.
    pub(crate) fn fault_after(&self, after: std::time::Duration) -> JoinHandle<()> {
        let model = self.model.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            set_faulted(&model, true);
        })
    }

    /// Steps this (stepped) model from another thread every `period` until the returned
    /// [`Stepper`] is dropped: commands that come back a few at a time (see
    /// [`MockDevice::post_at_most`]), slowly, while the host waits.
    #[cfg(test)]
    pub(crate) fn step_every(&self, period: std::time::Duration) -> Stepper {
        let (model, stop) = (self.model.clone(), Arc::new(AtomicBool::new(false)));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(period);
                step_model(&model);
            }
        });
        Stepper { stop, thread: Some(thread) }
    }

    /// Overwrites the namespace's data at block `lba`.
    pub(crate) fn set_backing(&self, lba: u64, data: &[u8]) {
        let mut m = self.model.lock().unwrap_or_else(|p| p.into_inner());
        let a = (lba * self.block_size as u64) as usize;
        if let Some(dst) = m.backing.get_mut(a..a + data.len()) {
            dst.copy_from_slice(data);
        }
    }
}

/// A thread stepping a model (see [`MockDevice::step_every`]); dropping it stops and joins it.
#[cfg(test)]
pub(crate) struct Stepper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

#[cfg(test)]
impl Drop for Stepper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for MockQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MockQueue(qid {}, depth {})", self.qp.qid(), self.qp.depth())
    }
}

impl MockQueue {
    /// A queue of `depth` entries answered by a device thread with `behaviour` (4096-byte
    /// blocks, 1 MiB of host memory in one segment).
    pub fn new(depth: u32, behaviour: Behaviour) -> Result<Self> {
        Self::with(MockConfig { depth, behaviour, ..MockConfig::default() })
    }

    /// A queue whose device runs only when [`MockQueue::step`] is called, on the caller's
    /// thread: deterministic, for instruction counting.
    pub fn stepped(depth: u32) -> Result<Self> {
        Self::with(MockConfig { depth, stepped: true, ..MockConfig::default() })
    }

    /// A queue and device as `cfg` says.
    pub fn with(cfg: MockConfig) -> Result<Self> {
        if !(2..=4096).contains(&cfg.depth)
            || !matches!(cfg.block_size, 512 | 4096)
            || cfg.segments == 0
            || cfg.segment_bytes == 0
            || !cfg.segment_bytes.is_multiple_of(PAGE)
        {
            return Err(Error::invalid("cfg", format!("unsupported mock geometry {cfg:?}")));
        }
        let d = cfg.depth as usize;
        let layout = HostLayout { seg_bytes: cfg.segment_bytes, nsegs: cfg.segments, scatter: cfg.scatter };
        // CAST: test sizes fit usize.
        let host_len = (cfg.segment_bytes * cfg.segments) as usize;
        let (sq, dsq) = shared(d * 64, 0)?;
        let (cq, dcq) = shared(d * 16, 0)?;
        let (prp, dprp) = shared(d * PAGE as usize, PRP_BUS)?;
        let (host, dhost) = shared(host_len, 0)?;
        let dbfd = memfd(4096)?;
        let doorbells = Arc::new(Doorbells::over(dbfd.as_raw_fd(), 4096, None)?);
        let ddb = DeviceShared::map(dbfd.as_raw_fd(), 0, 4096, 0, "mock")?;
        let stfd = memfd(4096)?;
        let status = StatusView::over(stfd.as_raw_fd())?;
        let dstatus = DeviceShared::map(stfd.as_raw_fd(), 0, 4096, 0, "mock")?;
        dstatus.store32(std::mem::offset_of!(StatusPage, magic), STATUS_MAGIC);
        dstatus.store32(std::mem::offset_of!(StatusPage, abi_version), ABI_VERSION);
        dstatus.store64(std::mem::offset_of!(StatusPage, state), ControllerState::new(1, false).0);
        let args = CreateQpair {
            depth: cfg.depth,
            qid: 1,
            prp_dma: PRP_BUS,
            sq_doorbell: 0,
            cq_doorbell: 4,
            ..Default::default()
        };
        let policy = DptrPolicy::new(cfg.data_pointers, cfg.sgls);
        let qp =
            QueuePair::new(&args, sq, cq, prp, &doorbells, 1, QueueWait::new(Waiting::Poll, None, u64::MAX), policy)?;
        let script = match cfg.behaviour {
            Behaviour::Honest => Vec::new(),
            Behaviour::Hostile(v) => v.into_iter().map(Fault::Extra).collect(),
            Behaviour::Script(v) => v,
        };
        let model = Model::new(
            [dsq, dcq, dprp, dhost, ddb, dstatus],
            cfg.depth,
            (0, 4),
            PRP_BUS,
            layout,
            cfg.block_size.trailing_zeros(),
            cfg.blocks,
            cfg.null,
            script,
            cfg.sgls,
        );
        let model = Arc::new(Mutex::new(model));
        let stop = Arc::new(AtomicBool::new(false));
        let device = if cfg.stepped {
            None
        } else {
            let (m, s) = (model.clone(), stop.clone());
            Some(std::thread::spawn(move || run(&m, &s)))
        };
        let dev = MockDevice { model, host, segments: layout.segments(), block_size: cfg.block_size, stop, device };
        Ok(MockQueue { qp, status, doorbells, dev })
    }

    /// The queue pair, its status page and doorbells, and the device side, apart (for a test
    /// [`crate::Device`] over them).
    pub(crate) fn into_parts(self) -> (QueuePair, StatusView, Arc<Doorbells>, MockDevice) {
        (self.qp, self.status, self.doorbells, self.dev)
    }

    fn model(&self) -> MutexGuard<'_, Model> {
        self.dev.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the device once: fetches everything submitted so far and posts what completions
    /// fit the CQ. Returns how many completions it posted. Never inlined, so a profiler
    /// (`cargo xtask cost`) can count the model's work apart from the engine's.
    #[inline(never)]
    pub fn step(&self) -> usize {
        self.model().step()
    }

    /// The DMA segments of the mock's host memory (for [`crate::cmd::DmaRange::new`]).
    pub fn segments(&self) -> &[Segment] {
        self.dev.segments()
    }

    /// Bytes of host memory.
    pub fn host_len(&self) -> usize {
        self.dev.host_len()
    }

    /// The namespace's block size.
    pub fn block_size(&self) -> u32 {
        self.dev.block_size
    }

    /// Copies `data` into host memory at `off` (dword aligned, a whole number of dwords).
    pub fn host_write(&self, off: usize, data: &[u8]) {
        self.dev.host_write(off, data)
    }

    /// The first 8 bytes (opcode, command id, namespace) of SQ slot `slot`, as the device sees it.
    pub fn sq_word(&self, slot: usize) -> u64 {
        self.model().sq.load64(slot * 64)
    }

    /// Copies `len` bytes of host memory at `off` (dword aligned, a whole number of dwords).
    pub fn host_read(&self, off: usize, len: usize) -> Vec<u8> {
        self.dev.host_read(off, len)
    }

    /// The namespace's data: `blocks` blocks at `lba` (empty on a null device).
    pub fn backing(&self, lba: u64, blocks: u64) -> Vec<u8> {
        self.dev.backing(lba, blocks)
    }

    /// Overwrites the namespace's data at block `lba`.
    pub fn set_backing(&self, lba: u64, data: &[u8]) {
        self.dev.set_backing(lba, data)
    }

    /// The SQ tail and CQ head doorbells as the device sees them.
    pub fn doorbells(&self) -> (u32, u32) {
        self.dev.doorbells()
    }

    /// What the device did so far.
    pub fn stats(&self) -> MockStats {
        self.model().stats
    }

    /// Sets or clears the status page's faulted flag.
    pub fn set_faulted(&self, on: bool) {
        self.dev.set_faulted(on)
    }

    /// Resets the controller as the module does: the queue is re-created empty (its commands
    /// are lost) and the epoch moves on.
    pub fn reset_controller(&self) {
        self.model().reset(std::mem::offset_of!(StatusPage, state));
    }
}

/// The device thread: steps the model while anything is to do, yielding when idle.
fn run(model: &Mutex<Model>, stop: &AtomicBool) {
    let mut idle = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let n = model.lock().unwrap_or_else(|p| p.into_inner()).step();
        if n > 0 {
            idle = 0;
        } else {
            idle = idle.saturating_add(1);
            if idle > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Drop for MockDevice {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(d) = self.device.take() {
            let _ = d.join();
        }
    }
}

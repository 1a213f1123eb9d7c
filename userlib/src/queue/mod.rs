//! The queue pair engine: the SQ and CQ rings ([`crate::ring`]) over the module's DMA memory, a
//! [`Submission`] guard that writes commands ([`crate::cmd`]) straight into SQ slots and
//! publishes the tail with one doorbell write when dropped, and [`Completions`], an iterator
//! over posted completion entries that writes the CQ head doorbell once when dropped.
//!
//! Locking: one mutex per queue pair, held only to write entries or reap completions, never
//! while waiting; whoever polls reaps every completion of the queue and records it for its
//! owner (the command id stays reserved until [`QueuePair::collect`] hands its status over).
//! The hot path allocates nothing and makes no system call while its waits spin (a wait that
//! sleeps on the queue's interrupt arms it and polls its eventfd: [`wait`]); the clock is read
//! only once a wait has to wait, and the controller's epoch once per submission and per reap
//! that finds completions.

mod cids;
mod held;
mod reap;
mod wait;

pub(crate) use held::{ClaimableQueue, Held, HeldOrShared, RequestQueue, RingsClaim};
#[cfg(any(test, feature = "test-utils"))]
pub use reap::Completion;
#[cfg(feature = "test-utils")]
pub use reap::Completions;
pub use wait::Waiting;
pub(crate) use wait::{Deadline, Interrupt, QueueWait, Waiter};

use crate::cmd::{Command, Dptr, DptrPolicy, ListPage};
use crate::error::{Error, Result};
use crate::mem::{DeviceShared, QueueMemory};
use crate::mmio::{Doorbell, Doorbells, StatusView};
use crate::prp::PAGE;
use crate::ring::cq::Cq;
use crate::ring::sq::{Sq, SQE_BYTES};
use crate::sys::DeviceFd;
use cids::Cids;
use parking_lot::{Mutex, MutexGuard};
use std::ops::DerefMut;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds_uapi::ioctl::CreateQpair;
use ugds_uapi::Status;

/// Most commands one call keeps in flight at once (larger requests go in rounds).
pub const MAX_BURST: usize = 64;

/// Polls between clock reads while waiting.
pub(crate) const SPINS_PER_CHECK: u32 = 4096;

/// Ring state; plain data, guarded by the queue pair's mutex.
#[derive(Debug)]
pub struct Rings {
    sq: Sq,
    cq: Cq,
    cids: Cids,
    /// The controller epoch these rings belong to.
    epoch: u64,
    /// A protocol violation was seen: the queue is unusable until the controller is reset.
    broken: bool,
    /// The queue exists on the controller. A reset deletes every queue there; the first user of
    /// the new epoch re-arms it while it holds the rings, so no submitter of the old epoch can
    /// still write a tail into the re-created queue.
    armed: bool,
    /// Polls that found nothing since the epoch was last read.
    idle: u32,
}

/// Transfers (reads and writes) a queue pair wrote, by the kind of data pointer they got: what
/// tests read to know SGLs were really used, not only allowed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DptrCounts {
    /// Transfers described by PRPs.
    pub prp: u64,
    /// Transfers described by an SGL.
    pub sgl: u64,
    /// Of those, SGLs with a segment in the list page (more than one data block).
    pub sgl_lists: u64,
}

/// [`DptrCounts`] kept beside the rings, readable without them (a thread's claimed queue holds
/// its rings for good). Only a holder of the rings writes them (under the lock, or as their
/// single owner or claimer), so an increment is a load and a store, not an atomic
/// read-modify-write, and loses nothing.
#[derive(Debug, Default)]
struct DptrCounters {
    /// Transfers written, indexed by their [`Dptr`] (one indexed increment per command).
    by_kind: [AtomicU64; 4],
}

impl DptrCounters {
    #[inline]
    fn bump(&self, kind: Dptr) {
        // CAST: a fieldless enum's discriminant, below 4.
        let c = &self.by_kind[kind as usize];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    fn get(&self) -> DptrCounts {
        let n = |k: Dptr| self.by_kind[k as usize].load(Ordering::Relaxed);
        let lists = n(Dptr::SglList);
        DptrCounts { prp: n(Dptr::Prp), sgl: n(Dptr::Sgl) + lists, sgl_lists: lists }
    }
}

impl std::ops::AddAssign for DptrCounts {
    fn add_assign(&mut self, o: DptrCounts) {
        self.prp += o.prp;
        self.sgl += o.sgl;
        self.sgl_lists += o.sgl_lists;
    }
}

/// An I/O queue pair mapped into this process.
///
/// Two ways to use it: shared (`&self`: [`QueuePair::submit_tagged`], [`QueuePair::collect_tagged`];
/// the rings behind a mutex, so threads may share the queue) and single-owner (`&mut self`:
/// [`QueuePair::submit_owned`], [`QueuePair::collect_owned`]; the borrow checker proves nobody
/// else holds the queue, so the rings are used with no lock and no atomic read-modify-write:
/// SPDK's one-queue-per-thread model, for a queue batch that owns its queue pair).
#[derive(Debug)]
pub struct QueuePair {
    core: Core,
    rings: Mutex<Rings>,
}

/// What a queue pair is besides its ring state: its memory, doorbells and settings, immutable
/// after creation, so a [`Submission`] or a reap reads them while the ring state is borrowed.
///
/// # Invariants
///
/// `sq_mem` holds `depth` entries, `cq_mem` `depth` entries and `prp` `depth` pages (one per
/// command id). Every [`Rings`] a `Core` is used with (its queue pair's, moved together into a
/// [`ClaimableQueue`], lent together as a [`Held`], a [`Submission`] or a reap) has rings of
/// `depth` slots: both are made from one depth in [`QueuePair::new`], a ring's depth never
/// changes, and rings are only reached through their own queue (a [`RingsClaim`] is opaque).
#[derive(Debug)]
struct Core {
    qid: u16,
    depth: u32,
    sq_mem: DeviceShared,
    cq_mem: DeviceShared,
    prp: DeviceShared,
    sq_db: Doorbell,
    cq_db: Doorbell,
    /// PRPs or SGLs, per command.
    policy: DptrPolicy,
    /// How its waiters wait, with the eventfd its MSI-X vector signals when it has one (an
    /// `Arc`: a [`Waiter`] holds it from its first pause on, borrowing no queue).
    wait: Arc<QueueWait>,
    /// The module's file, to re-arm the queue after a reset (`None` over the device model,
    /// which re-creates its queue itself).
    fd: Option<Arc<DeviceFd>>,
    /// Transfers written, by data pointer.
    dptr: DptrCounters,
}

impl Core {
    /// Re-creates the queue on the controller after a reset (`REARM_QPAIR`). Only ever called
    /// with the rings held, i.e. by the queue's only submitter at that moment.
    #[cold]
    fn rearm(&self) -> Result<()> {
        let Some(fd) = &self.fd else { return Ok(()) };
        let mut a = ugds_uapi::ioctl::DeleteQpair { qid: u32::from(self.qid), reserved: 0 };
        fd.ioctl(crate::sys::req::RearmQpair, &mut a).map(drop)
    }
}

impl QueuePair {
    /// Maps the SQ, CQ and PRP pool of a queue pair that `CREATE_QPAIR` returned in `args`.
    pub(crate) fn map(
        fd: &Arc<DeviceFd>,
        args: &CreateQpair,
        doorbells: &Arc<Doorbells>,
        epoch: u64,
        wait: QueueWait,
        policy: DptrPolicy,
    ) -> Result<Self> {
        // CAST: the module reports region sizes of a few MiB at most.
        let sq = DeviceShared::map(fd.raw(), args.sq_offset, args.sq_size as usize, 0, "mmap SQ")?;
        let cq = DeviceShared::map(fd.raw(), args.cq_offset, args.cq_size as usize, 0, "mmap CQ")?;
        let prp = DeviceShared::map(fd.raw(), args.prp_offset, args.prp_size as usize, args.prp_dma, "mmap PRP pool")?;
        let mut qp = Self::new(args, sq, cq, prp, doorbells, epoch, wait, policy)?;
        qp.core.fd = Some(fd.clone());
        Ok(qp)
    }

    /// Wraps a queue pair's mapped regions; checks that they hold `args.depth` entries (and
    /// PRP pages) and that its doorbells lie in the doorbell mapping.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        args: &CreateQpair,
        sq_mem: DeviceShared,
        cq_mem: DeviceShared,
        prp: DeviceShared,
        doorbells: &Arc<Doorbells>,
        epoch: u64,
        wait: QueueWait,
        policy: DptrPolicy,
    ) -> Result<Self> {
        let depth = args.depth;
        let bad = |what: &str| Error::DeviceProtocol(format!("queue {}: {what} for depth {depth}", args.qid));
        let (Some(sq), Some(cq)) = (Sq::new(depth), Cq::new(depth)) else { return Err(bad("invalid depth")) };
        // The rings' own test of their memory: what their unchecked calls rely on (`Core`).
        if !sq.fits(&sq_mem) || !cq.fits(&cq_mem) || prp.len() < depth as usize * PAGE as usize {
            return Err(bad("queue memory too small"));
        }
        // CAST: queue ids are 16-bit in NVMe.
        let qid = u16::try_from(args.qid).map_err(|_| bad("queue id out of range"))?;
        // The module maps its doorbells at the first fault: take it now, at setup. Both values
        // are the empty queue's own (tail 0, head 0), so the controller sees no change.
        let (sq_db, cq_db) =
            (doorbells.doorbell(args.sq_doorbell, depth)?, doorbells.doorbell(args.cq_doorbell, depth)?);
        sq_db.ring(0);
        cq_db.ring(0);
        // INVARIANT: memory sizes checked above; both rings have `depth` slots.
        Ok(QueuePair {
            core: Core {
                qid,
                depth,
                sq_mem,
                cq_mem,
                prp,
                sq_db,
                cq_db,
                policy,
                wait: Arc::new(wait),
                fd: None,
                dptr: DptrCounters::default(),
            },
            rings: Mutex::new(Rings { sq, cq, cids: Cids::new(depth), epoch, broken: false, armed: true, idle: 0 }),
        })
    }

    /// Queue id.
    pub fn qid(&self) -> u16 {
        self.core.qid
    }

    /// Queue depth in entries (at most depth - 1 commands wait in the SQ at once).
    pub fn depth(&self) -> u32 {
        self.core.depth
    }

    /// Transfers written so far, by data pointer (PRPs or an SGL).
    pub fn dptr_counts(&self) -> DptrCounts {
        self.core.dptr.get()
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, Rings> {
        // No poisoning: a panic while holding the lock cannot leave the rings half-written in
        // a way that matters more than the panic itself; the next user goes on with them.
        self.rings.lock()
    }

    /// After this process reset the controller itself: adopt the new epoch silently (the
    /// module re-created the queue empty; our timed-out commands are gone).
    pub fn resync(&self, status: &StatusView) {
        let mut r = self.lock();
        let _ = check_epoch(&self.core, &mut r, status);
    }

    /// Opens a submission for namespace `nsid`: checks the epoch (once for the whole burst)
    /// and holds the queue until dropped, which publishes what was pushed with one doorbell
    /// write.
    #[inline(always)]
    pub fn submission(&self, nsid: u32, status: &StatusView) -> Result<Submission<'_>> {
        let mut rings = self.lock();
        check_epoch(&self.core, &mut rings, status)?;
        Ok(Submission { core: &self.core, rings, nsid, pushed: 0 })
    }

    /// Reaps posted completions and hands each to the caller: its command id is free again
    /// once it is yielded. For a caller that owns every command of the queue (single-owner
    /// use); completions already recorded by [`QueuePair::collect`]'s reaping stay there.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn completions(&self, status: &StatusView) -> Result<reap::Completions<'_>> {
        let mut rings = self.lock();
        check_epoch(&self.core, &mut rings, status)?;
        Ok(reap::Completions::new(&self.core, rings))
    }

    /// Writes `cmds` into free slots (waiting for room up to `timeout`) and rings the doorbell
    /// once; their command ids go to `cids[..cmds.len()]`. Nothing is published on error.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn submit(
        &self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> Result<()> {
        self.submit_tagged(nsid, cmds, status, timeout, cids).map(|_| ())
    }

    /// [`QueuePair::submit`], returning the epoch of the rings the burst went into: pass it to
    /// [`QueuePair::collect_tagged`], so a reset by another user of this queue (which frees
    /// every command id) can never hand this burst another burst's completions.
    pub fn submit_tagged(
        &self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> Result<u64> {
        let n = self.check_burst(cmds, cids)?;
        if n == 0 {
            return Ok(self.lock().epoch);
        }
        self.submission_with_room(nsid, n, status, timeout, &cmds[0])?.push_all(cmds, cids)
    }

    /// [`QueuePair::submit_tagged`] for the queue's single owner: no lock, no atomic
    /// read-modify-write (the `&mut` borrow is the proof that nobody else uses the rings).
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn submit_owned(
        &mut self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> Result<u64> {
        self.held().submit(nsid, cmds, status, timeout, cids)
    }

    /// A submission with room for `n` commands (waiting for it up to `timeout`; `first`, the
    /// burst's first command, names the timeout), for the queue's single owner: it pushes each
    /// command as it builds it (no slice of commands to gather first), and dropping the
    /// submission publishes them with one doorbell write.
    #[inline]
    pub(crate) fn submission_owned(
        &mut self,
        nsid: u32,
        n: usize,
        status: &StatusView,
        timeout: Duration,
        first: &Command<'_>,
    ) -> Result<Submission<'_, &mut Rings>> {
        check_burst_len(&self.core, n, n)?;
        self.held().into_submission_with_room(nsid, n, status, timeout, first)
    }

    /// Writes one command into a free slot (waiting for room up to `timeout`) and rings the
    /// doorbell: a synchronous request of one command, without a burst's slices. Returns its
    /// [`Ticket`] for [`QueuePair::collect_one`]. Nothing is published on error.
    #[inline]
    pub fn submit_one(&self, nsid: u32, cmd: &Command<'_>, status: &StatusView, timeout: Duration) -> Result<Ticket> {
        self.submission_with_room(nsid, 1, status, timeout, cmd)?.push_one(cmd)
    }

    /// [`QueuePair::submit_one`] for the queue's single owner: no lock.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    #[inline]
    pub fn submit_one_owned(
        &mut self,
        nsid: u32,
        cmd: &Command<'_>,
        status: &StatusView,
        timeout: Duration,
    ) -> Result<Ticket> {
        self.held().submit_one(nsid, cmd, status, timeout)
    }

    /// A submission with room for `n` commands (reaping what completed), waiting for room up to
    /// `timeout` and letting the other users of the queue in meanwhile; `first` names the
    /// request in a timeout's error.
    #[inline(always)]
    fn submission_with_room(
        &self,
        nsid: u32,
        n: usize,
        status: &StatusView,
        timeout: Duration,
        first: &Command<'_>,
    ) -> Result<Submission<'_>> {
        let mut sub = self.submission(nsid, status)?;
        if sub.space() < n {
            let mut wait = Wait::default();
            while !sub.make_room(n, status)? {
                // Let the other users of the queue in while the device works.
                drop(sub);
                wait.spin(first, timeout)?;
                sub = self.submission(nsid, status)?;
            }
        }
        Ok(sub)
    }

    /// Reaps the queue and returns the status of the command `t` names once it completed (its id
    /// is free again then); `None` while it runs. `EpochChanged` once a reset wiped it.
    #[inline]
    pub fn collect_one(&self, t: Ticket, status: &StatusView) -> Result<Option<Status>> {
        collect_one_in(&self.core, &mut self.lock(), t, status)
    }

    /// [`QueuePair::collect_one`] for the queue's single owner: no lock.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    #[inline]
    pub fn collect_one_owned(&mut self, t: Ticket, status: &StatusView) -> Result<Option<Status>> {
        self.held().collect_one(t, status)
    }

    /// The burst's length, when it fits the queue and `cids`.
    fn check_burst(&self, cmds: &[Command<'_>], cids: &[u16]) -> Result<usize> {
        check_burst(&self.core, cmds, cids)
    }

    /// Reaps the queue and collects the completions of `cids` that arrived: for each `i` with
    /// `out[i]` still `None` whose command completed, stores its status in `out[i]` and frees its
    /// id. Returns how many were collected by this call.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn collect(&self, cids: &[u16], status: &StatusView, out: &mut [Option<Status>]) -> Result<usize> {
        let mut r = self.lock();
        let epoch = r.epoch;
        collect_in(&self.core, &mut r, epoch, cids, status, out)
    }

    /// Takes what the device posted off the CQ and hands each completion to `sink` as its
    /// command id (free again) and status, for the queue's single owner that keeps its commands
    /// by id: a reap costs what it found, whatever is in flight. Returns how many entries it
    /// consumed. A protocol violation breaks the queue (as any reap's does).
    pub(crate) fn reap_owned(&mut self, status: &StatusView, sink: impl FnMut(u16, Status)) -> Result<usize> {
        self.held().reap(status, sink)
    }

    /// [`QueuePair::collect`] for the queue's single owner: no lock.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn collect_owned(&mut self, cids: &[u16], status: &StatusView, out: &mut [Option<Status>]) -> Result<usize> {
        self.held().collect(cids, status, out)
    }

    /// [`QueuePair::collect`] for a burst [`QueuePair::submit_tagged`] put into the rings of
    /// `epoch`: `EpochChanged` once the rings started over (a reset wiped the burst and freed
    /// its command ids, which may name other commands now).
    pub fn collect_tagged(
        &self,
        epoch: u64,
        cids: &[u16],
        status: &StatusView,
        out: &mut [Option<Status>],
    ) -> Result<usize> {
        collect_in(&self.core, &mut self.lock(), epoch, cids, status, out)
    }

    /// Its waiting state, for [`Waiter::pause`].
    #[inline]
    pub(crate) fn wait_state(&self) -> &Arc<QueueWait> {
        &self.core.wait
    }

    /// Submits `cmds` (at most [`MAX_BURST`]) with one doorbell write and waits for all of them.
    /// Returns the first failure (all commands have completed or been abandoned by then).
    pub fn execute(&self, nsid: u32, cmds: &[Command<'_>], status: &StatusView, timeout: Duration) -> Result<()> {
        let n = cmds.len().min(MAX_BURST);
        let cmds = &cmds[..n];
        let mut cids = [0u16; MAX_BURST];
        let epoch = self.submit_tagged(nsid, cmds, status, timeout, &mut cids)?;
        let mut out = [None; MAX_BURST];
        let mut got = 0;
        let mut start: Option<Instant> = None;
        let mut wait = Waiter::new(cmds.iter().map(|c| c.bytes()).sum());
        loop {
            got += self.collect_tagged(epoch, &cids[..n], status, &mut out[..n])?;
            if got == n {
                wait.done();
                for (i, st) in out[..n].iter().enumerate() {
                    if let Some(st) = st.filter(|s| !s.is_success()) {
                        return Err(Error::Nvme { op: cmds[i].name(), slba: cmds[i].slba(), status: st });
                    }
                }
                return Ok(());
            }
            // The clock is read only every few thousand polls and after each sleep (the
            // deadline counts from the first read).
            if wait.pause(&self.core.wait) {
                let since = *start.get_or_insert_with(Instant::now);
                if since.elapsed() > timeout {
                    // The uncollected commands stay in flight: their ids and PRP pages are not
                    // reused, and the registration keeps counting them. A reset clears them.
                    return Err(timeout_error(&cmds[0], timeout));
                }
            }
        }
    }
}

/// The burst's length, when it fits the queue and `cids`.
fn check_burst(core: &Core, cmds: &[Command<'_>], cids: &[u16]) -> Result<usize> {
    check_burst_len(core, cmds.len(), cids.len())
}

/// [`check_burst`] by lengths: `n` commands, room for `ids` of their ids.
#[inline]
fn check_burst_len(core: &Core, n: usize, ids: usize) -> Result<usize> {
    if n >= core.depth as usize || ids < n {
        return Err(Error::invalid("cmds", format!("{n} commands do not fit a {}-entry queue", core.depth)));
    }
    Ok(n)
}

/// Checks the controller's epoch and fault flag against the rings' (one load: the module
/// publishes both in one word). On a new epoch the controller lost this queue: the rings start
/// over, the queue is re-armed (zeroed and re-created on the controller) and the caller learns
/// that its commands were lost. The caller holds the rings, so no other submitter of this queue
/// can be between its own epoch check and its doorbell write.
#[inline(always)]
fn check_epoch(core: &Core, r: &mut Rings, status: &StatusView) -> Result<()> {
    let s = status.state();
    // The common case in one comparison: the rings' epoch, not faulted, the queue usable.
    if s == ugds_uapi::ioctl::ControllerState::new(r.epoch, false) && !(r.broken | !r.armed) {
        return Ok(());
    }
    check_epoch_slow(core, r, s)
}

/// [`check_epoch`] once something differs.
#[cold]
fn check_epoch_slow(core: &Core, r: &mut Rings, s: ugds_uapi::ioctl::ControllerState) -> Result<()> {
    if s.faulted() {
        return Err(Error::DeviceFaulted);
    }
    if s.epoch() != r.epoch {
        return Err(new_epoch(core, r, s.epoch()));
    }
    if r.broken || !r.armed {
        return not_ready(core, r);
    }
    Ok(())
}

/// The rings of a new epoch: start over and re-arm (a failed re-arm is retried by the next
/// user).
#[cold]
fn new_epoch(core: &Core, r: &mut Rings, epoch: u64) -> Error {
    let old = r.epoch;
    r.sq.reset();
    r.cq.reset();
    r.cids.reset();
    r.epoch = epoch;
    r.broken = false;
    r.armed = core.rearm().is_ok();
    Error::EpochChanged { old, new: epoch }
}

/// A broken queue (until a reset), or one whose re-arm failed: retry that.
#[cold]
fn not_ready(core: &Core, r: &mut Rings) -> Result<()> {
    if !r.broken && core.rearm().is_ok() {
        r.armed = true;
        return Ok(());
    }
    Err(Error::DeviceFaulted)
}

/// Reaps the rings, then collects the statuses of `cids` (see [`QueuePair::collect_tagged`]).
#[inline]
fn collect_in(
    core: &Core,
    r: &mut Rings,
    epoch: u64,
    cids: &[u16],
    status: &StatusView,
    out: &mut [Option<Status>],
) -> Result<usize> {
    reap::record_all(core, r, status)?;
    if r.epoch != epoch {
        return Err(Error::EpochChanged { old: epoch, new: r.epoch });
    }
    let mut n = 0;
    for (c, o) in cids.iter().zip(out.iter_mut()) {
        if o.is_none() {
            if let Some(raw) = r.cids.take(*c) {
                *o = Some(reap::decode(raw));
                n += 1;
            }
        }
    }
    Ok(n)
}

/// A command in flight on a queue pair: its id and the epoch of the rings it went into (a
/// reset frees every id, which may name other commands afterwards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    cid: u16,
    epoch: u64,
}

impl Ticket {
    /// Its command id.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn cid(&self) -> u16 {
        self.cid
    }
}

/// Reaps the rings, then collects the status of the one command `t` names.
#[inline(always)]
fn collect_one_in(core: &Core, r: &mut Rings, t: Ticket, status: &StatusView) -> Result<Option<Status>> {
    reap::record_all(core, r, status)?;
    if r.epoch != t.epoch {
        return Err(Error::EpochChanged { old: t.epoch, new: r.epoch });
    }
    Ok(r.cids.take(t.cid).map(reap::decode))
}

/// A wait for queue room: spins, reading the clock only every [`SPINS_PER_CHECK`] spins (the
/// deadline counts from the first read).
#[derive(Default)]
struct Wait {
    spins: u32,
    start: Option<Instant>,
}

impl Wait {
    fn spin(&mut self, first: &Command<'_>, timeout: Duration) -> Result<()> {
        std::hint::spin_loop();
        self.spins = self.spins.wrapping_add(1);
        if self.spins.is_multiple_of(SPINS_PER_CHECK) {
            let since = *self.start.get_or_insert_with(Instant::now);
            if since.elapsed() > timeout {
                return Err(timeout_error(first, timeout));
            }
        }
        Ok(())
    }
}

/// The error of a command that did not complete within `timeout`.
pub(crate) fn timeout_error(cmd: &Command<'_>, timeout: Duration) -> Error {
    // CAST: a deadline of more than 2^64 ms is not a deadline.
    Error::Timeout { op: cmd.name(), slba: cmd.slba(), timeout_ms: timeout.as_millis() as u64 }
}

/// Commands being written into a queue pair. While it lives the rings are held (locked, or
/// borrowed by their single owner); dropping it publishes every pushed entry with one tail
/// doorbell write ([`Submission::cancel`] withdraws them instead).
#[derive(Debug)]
pub struct Submission<'q, G: DerefMut<Target = Rings> = MutexGuard<'q, Rings>> {
    core: &'q Core,
    rings: G,
    nsid: u32,
    pushed: u32,
}

impl<G: DerefMut<Target = Rings>> Submission<'_, G> {
    /// Commands that can still be pushed (free SQ slots and free command ids).
    #[inline]
    pub fn space(&self) -> usize {
        (self.rings.sq.space() as usize).min(self.rings.cids.available())
    }

    /// Entries pushed so far.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn len(&self) -> usize {
        self.pushed as usize
    }

    /// True when nothing was pushed.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn is_empty(&self) -> bool {
        self.pushed == 0
    }

    /// Whether `n` commands fit now, after reaping what completed (recorded for its owners).
    #[inline]
    fn make_room(&mut self, n: usize, status: &StatusView) -> Result<bool> {
        if self.space() >= n {
            return Ok(true);
        }
        reap::record_all(self.core, &mut self.rings, status)?;
        Ok(self.space() >= n)
    }

    /// Pushes every command of a burst that fits (see [`Submission::make_room`]) and publishes
    /// them on drop; on a failure withdraws them all. Returns the rings' epoch.
    #[inline]
    fn push_all(mut self, cmds: &[Command<'_>], cids: &mut [u16]) -> Result<u64> {
        for (i, cmd) in cmds.iter().enumerate() {
            match self.push(cmd) {
                Ok(cid) => cids[i] = cid,
                Err(e) => {
                    self.withdraw();
                    return Err(e);
                }
            }
        }
        // Published with this epoch when `self` drops (the doorbell write).
        Ok(self.rings.epoch)
    }

    /// Pushes one command that fits (see [`Submission::make_room`]) and publishes it on drop.
    #[inline]
    fn push_one(mut self, cmd: &Command<'_>) -> Result<Ticket> {
        let cid = self.push(cmd)?;
        Ok(Ticket { cid, epoch: self.rings.epoch })
    }

    /// Writes `cmd` into the next SQ slot (and its list page); returns its command id. The
    /// device sees it once the submission is dropped. Fails, writing nothing, when the queue
    /// is full or PRPs cannot describe the command's memory.
    // Always inlined: a queue batch's submit calls it in its loop, where a call (its register
    // saves, its result through memory) cost about 40 instructions per command.
    #[inline(always)]
    pub fn push(&mut self, cmd: &Command<'_>) -> Result<u16> {
        let core = self.core;
        let r = &mut *self.rings;
        // Memory an exporter may revoke is only named in the epoch it was checked in: a
        // revocation resets the controller first, so a command built before it never runs.
        if let Err(old) = cmd.valid_in(r.epoch) {
            return Err(Error::EpochChanged { old, new: r.epoch });
        }
        // SAFETY: `sq_mem` holds `depth` entries and `r.sq` has `depth` slots (`Core`'s
        // invariant: these rings are this core's).
        let Some(slot) = (unsafe { r.sq.push_unchecked(&core.sq_mem) }) else {
            return Err(Error::invalid("cmds", "the queue is full"));
        };
        let Some(cid) = r.cids.alloc() else {
            r.sq.unpush(1);
            return Err(Error::invalid("cmds", "the queue is full"));
        };
        let page = ListPage {
            mem: &core.prp,
            off: cid as usize * PAGE as usize,
            bus: core.prp.bus(cid as usize * PAGE as usize),
        };
        match cmd.write(&slot, cid, self.nsid, &page, core.policy) {
            Ok(kind) => core.dptr.bump(kind),
            Err(e) => {
                r.cids.release(cid);
                r.sq.unpush(1);
                return Err(Error::invalid(
                    "reg_offset",
                    format!("cannot describe the buffer with PRPs or an SGL: {e:?}"),
                ));
            }
        }
        self.pushed += 1;
        Ok(cid)
    }

    /// Withdraws every entry pushed through this submission (never published): the tail goes
    /// back and their command ids are free again. The queue is let go.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn cancel(mut self) {
        self.withdraw();
    }

    /// [`Submission::cancel`] keeping the queue held.
    fn withdraw(&mut self) {
        let core = self.core;
        let r = &mut *self.rings;
        for _ in 0..self.pushed {
            r.sq.unpush(1);
            // The id is read back from the slot we wrote (the device never reads an
            // unpublished slot).
            // CAST: CDW0 bits 31:16.
            let cid = (core.sq_mem.load32(r.sq.tail() as usize * SQE_BYTES) >> 16) as u16;
            r.cids.release(cid);
        }
        self.pushed = 0;
    }
}

impl<G: DerefMut<Target = Rings>> Drop for Submission<'_, G> {
    #[inline]
    fn drop(&mut self) {
        if self.pushed > 0 {
            // Orders the slot and list-page stores before the doorbell store, so the device
            // never fetches a half-written entry. ugds runs on x86-64, where stores are not
            // reordered with older stores (uncached MMIO included): this keeps the compiler
            // from reordering; a weakly ordered CPU would need a device-scope barrier here.
            reap::make_room(self.core, &mut self.rings);
            fence(Ordering::Release);
            let tail = u32::from(self.rings.sq.tail());
            // Fewer entries pushed than the ring has slots: the tail this submission started at
            // (no division: this runs for every submission).
            let before = if tail >= self.pushed { tail - self.pushed } else { tail + self.core.depth - self.pushed };
            // CAST: ring indexes, below depth (at most 65536), fit 16 bits.
            self.core.sq_db.publish(tail as u16, before as u16);
        }
    }
}

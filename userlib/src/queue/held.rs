//! Rings held by one user, used with no lock: [`Held`], borrowed by a queue pair's single owner
//! or by the thread whose claim holds a [`ClaimableQueue`]'s rings (a device's per-thread
//! queues, SPDK's queue pair per thread handed out at run time). [`RequestQueue`] is what a
//! request needs of a queue either way, held or shared (locked per call).

use super::{
    check_burst, check_epoch, collect_in, collect_one_in, reap, Core, DptrCounts, QueuePair, QueueWait, Rings,
    Submission, Ticket, Wait,
};
use crate::cmd::Command;
use crate::error::Result;
use crate::mmio::StatusView;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use ugds_uapi::Status;

/// A queue pair's rings held by one user, used with no lock and no atomic read-modify-write:
/// borrowed from a [`QueuePair`] by its single owner ([`QueuePair::held`]) or from a
/// [`ClaimableQueue`] by the thread whose claim holds its rings ([`ClaimableQueue::held`]).
#[derive(Debug)]
pub(crate) struct Held<'q> {
    core: &'q Core,
    rings: &'q mut Rings,
}

impl<'q> Held<'q> {
    /// Entries per ring.
    #[inline]
    pub(crate) fn depth(&self) -> u32 {
        self.core.depth
    }

    /// Its waiting state, for [`Waiter::pause`].
    #[inline]
    pub(crate) fn wait_state(&self) -> &Arc<QueueWait> {
        &self.core.wait
    }

    /// [`QueuePair::resync`] on the held rings.
    pub(crate) fn resync(&mut self, status: &StatusView) {
        let _ = check_epoch(self.core, self.rings, status);
    }

    /// A submission on the held rings (see [`QueuePair::submission`]).
    #[inline]
    fn into_submission(self, nsid: u32, status: &StatusView) -> Result<Submission<'q, &'q mut Rings>> {
        check_epoch(self.core, self.rings, status)?;
        Ok(Submission { core: self.core, rings: self.rings, nsid, pushed: 0 })
    }

    /// The same rings, borrowed for a shorter while.
    #[inline(always)]
    fn reborrow(&mut self) -> Held<'_> {
        Held { core: self.core, rings: &mut *self.rings }
    }

    /// [`QueuePair::submission_with_room`] on the held rings (the wait for room only spins),
    /// keeping their borrow (see [`QueuePair::submission_owned`]). `n` must be below the depth
    /// (the wait would never end).
    #[inline(always)]
    pub(crate) fn into_submission_with_room(
        self,
        nsid: u32,
        n: usize,
        status: &StatusView,
        timeout: Duration,
        first: &Command<'_>,
    ) -> Result<Submission<'q, &'q mut Rings>> {
        let mut sub = self.into_submission(nsid, status)?;
        if sub.space() < n {
            let mut wait = Wait::default();
            while !sub.make_room(n, status)? {
                wait.spin(first, timeout)?;
            }
        }
        Ok(sub)
    }

    /// [`QueuePair::submit_owned`].
    #[inline]
    pub(crate) fn submit(
        &mut self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> Result<u64> {
        let n = check_burst(self.core, cmds, cids)?;
        if n == 0 {
            // As the shared call: an empty burst only reads the epoch.
            return Ok(self.rings.epoch);
        }
        self.reborrow().into_submission_with_room(nsid, n, status, timeout, &cmds[0])?.push_all(cmds, cids)
    }

    /// [`QueuePair::submit_one_owned`].
    #[inline]
    pub(crate) fn submit_one(
        &mut self,
        nsid: u32,
        cmd: &Command<'_>,
        status: &StatusView,
        timeout: Duration,
    ) -> Result<Ticket> {
        self.reborrow().into_submission_with_room(nsid, 1, status, timeout, cmd)?.push_one(cmd)
    }

    /// [`QueuePair::reap_owned`].
    #[inline]
    pub(crate) fn reap(&mut self, status: &StatusView, sink: impl FnMut(u16, Status)) -> Result<usize> {
        reap::hand_out_all(self.core, self.rings, status, sink)
    }

    /// [`QueuePair::collect_owned`].
    #[inline]
    pub(crate) fn collect(&mut self, cids: &[u16], status: &StatusView, out: &mut [Option<Status>]) -> Result<usize> {
        let epoch = self.rings.epoch;
        collect_in(self.core, self.rings, epoch, cids, status, out)
    }

    /// [`QueuePair::collect_one_owned`].
    #[inline]
    pub(crate) fn collect_one(&mut self, t: Ticket, status: &StatusView) -> Result<Option<Status>> {
        collect_one_in(self.core, self.rings, t, status)
    }
}

/// What a request needs of a queue pair, whichever way it reaches it: shared with other threads
/// (`&QueuePair`: every call takes the lock) or held ([`Held`]: no lock, no atomic
/// read-modify-write). A request's logic is written once over this.
pub(crate) trait RequestQueue {
    /// Entries per ring.
    fn depth(&self) -> u32;
    /// Its waiting state, for [`super::Waiter::pause`].
    fn wait_state(&self) -> &Arc<QueueWait>;
    /// Adopts the controller's new epoch after this thread's own reset (see
    /// [`QueuePair::resync`]).
    fn resync(&mut self, status: &StatusView);
    /// Submits a burst (see [`QueuePair::submit_tagged`]); returns the rings' epoch.
    fn submit(
        &mut self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> Result<u64>;
    /// Collects what completed of a burst submitted in `epoch` (see
    /// [`QueuePair::collect_tagged`]).
    fn collect(&mut self, epoch: u64, cids: &[u16], status: &StatusView, out: &mut [Option<Status>]) -> Result<usize>;
    /// Submits one command (see [`QueuePair::submit_one`]).
    fn submit_one(&mut self, nsid: u32, cmd: &Command<'_>, status: &StatusView, timeout: Duration) -> Result<Ticket>;
    /// Its status once it completed (see [`QueuePair::collect_one`]).
    fn collect_one(&mut self, t: Ticket, status: &StatusView) -> Result<Option<Status>>;
}

impl RequestQueue for &QueuePair {
    fn depth(&self) -> u32 {
        QueuePair::depth(self)
    }

    fn wait_state(&self) -> &Arc<QueueWait> {
        QueuePair::wait_state(self)
    }

    fn resync(&mut self, status: &StatusView) {
        QueuePair::resync(self, status)
    }

    #[inline]
    fn submit(
        &mut self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> Result<u64> {
        QueuePair::submit_tagged(self, nsid, cmds, status, timeout, cids)
    }

    #[inline]
    fn collect(&mut self, epoch: u64, cids: &[u16], status: &StatusView, out: &mut [Option<Status>]) -> Result<usize> {
        QueuePair::collect_tagged(self, epoch, cids, status, out)
    }

    #[inline]
    fn submit_one(&mut self, nsid: u32, cmd: &Command<'_>, status: &StatusView, timeout: Duration) -> Result<Ticket> {
        QueuePair::submit_one(self, nsid, cmd, status, timeout)
    }

    #[inline]
    fn collect_one(&mut self, t: Ticket, status: &StatusView) -> Result<Option<Status>> {
        QueuePair::collect_one(self, t, status)
    }
}

/// Untagged collection is exact on held rings: only the holder's own calls reset them (a new
/// epoch seen by its submit or reap, reported to it as `EpochChanged`, or its own `resync`
/// after its own reset), so the command ids of a burst cannot name another burst's commands.
impl RequestQueue for Held<'_> {
    fn depth(&self) -> u32 {
        Held::depth(self)
    }

    fn wait_state(&self) -> &Arc<QueueWait> {
        Held::wait_state(self)
    }

    fn resync(&mut self, status: &StatusView) {
        Held::resync(self, status)
    }

    #[inline]
    fn submit(
        &mut self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> Result<u64> {
        Held::submit(self, nsid, cmds, status, timeout, cids)
    }

    #[inline]
    fn collect(&mut self, _epoch: u64, cids: &[u16], status: &StatusView, out: &mut [Option<Status>]) -> Result<usize> {
        Held::collect(self, cids, status, out)
    }

    #[inline]
    fn submit_one(&mut self, nsid: u32, cmd: &Command<'_>, status: &StatusView, timeout: Duration) -> Result<Ticket> {
        Held::submit_one(self, nsid, cmd, status, timeout)
    }

    #[inline]
    fn collect_one(&mut self, t: Ticket, status: &StatusView) -> Result<Option<Status>> {
        Held::collect_one(self, t, status)
    }
}

/// A queue reached either way, where one request's lanes mix them (a striped volume whose
/// thread holds a queue of its own on some members and shares on others).
#[derive(Debug)]
pub(crate) enum HeldOrShared<'q> {
    /// The thread's own rings.
    Held(Held<'q>),
    /// A queue shared with other threads.
    Shared(&'q QueuePair),
}

/// Each call is the one its way's own implementation makes (untagged on held rings, tagged and
/// locked on a shared queue): only the choice of way is made here.
impl RequestQueue for HeldOrShared<'_> {
    fn depth(&self) -> u32 {
        match self {
            Self::Held(q) => RequestQueue::depth(q),
            Self::Shared(q) => RequestQueue::depth(q),
        }
    }

    fn wait_state(&self) -> &Arc<QueueWait> {
        match self {
            Self::Held(q) => RequestQueue::wait_state(q),
            Self::Shared(q) => RequestQueue::wait_state(q),
        }
    }

    fn resync(&mut self, status: &StatusView) {
        match self {
            Self::Held(q) => RequestQueue::resync(q, status),
            Self::Shared(q) => RequestQueue::resync(q, status),
        }
    }

    #[inline]
    fn submit(
        &mut self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> Result<u64> {
        match self {
            Self::Held(q) => RequestQueue::submit(q, nsid, cmds, status, timeout, cids),
            Self::Shared(q) => RequestQueue::submit(q, nsid, cmds, status, timeout, cids),
        }
    }

    #[inline]
    fn collect(&mut self, epoch: u64, cids: &[u16], status: &StatusView, out: &mut [Option<Status>]) -> Result<usize> {
        match self {
            Self::Held(q) => RequestQueue::collect(q, epoch, cids, status, out),
            Self::Shared(q) => RequestQueue::collect(q, epoch, cids, status, out),
        }
    }

    #[inline]
    fn submit_one(&mut self, nsid: u32, cmd: &Command<'_>, status: &StatusView, timeout: Duration) -> Result<Ticket> {
        match self {
            Self::Held(q) => RequestQueue::submit_one(q, nsid, cmd, status, timeout),
            Self::Shared(q) => RequestQueue::submit_one(q, nsid, cmd, status, timeout),
        }
    }

    #[inline]
    fn collect_one(&mut self, t: Ticket, status: &StatusView) -> Result<Option<Status>> {
        match self {
            Self::Held(q) => RequestQueue::collect_one(q, t, status),
            Self::Shared(q) => RequestQueue::collect_one(q, t, status),
        }
    }
}

/// A thread's hold on a [`ClaimableQueue`]'s rings: their lock, taken once when the thread
/// claimed the queue and kept until the claim is dropped. The guard keeps the rings (plain
/// data) alive by itself, so a claim outliving its queue's memory (the device closed) names
/// nothing that is gone; it is only of use with the queue it came from.
///
/// Opaque: nothing outside this module reaches the rings through it (no `DerefMut`), so no code
/// can swap one queue's rings for another's and pair a queue's memory with rings of another
/// depth; [`ClaimableQueue::held`] is the only way in.
pub(crate) struct RingsClaim(parking_lot::ArcMutexGuard<parking_lot::RawMutex, Rings>);

impl std::fmt::Debug for RingsClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RingsClaim").field(&*self.0).finish()
    }
}

/// A queue pair for one thread at a time (a device's per-thread queues): the thread that claims
/// it ([`ClaimableQueue::try_claim`]) holds its rings' lock for as long as it keeps the claim,
/// so its commands take no lock: SPDK's queue pair per thread, handed out at run time.
#[derive(Debug)]
pub(crate) struct ClaimableQueue {
    core: Core,
    rings: Arc<Mutex<Rings>>,
}

impl QueuePair {
    /// The rings held by the queue's single owner (the `&mut` borrow), with no lock.
    #[inline]
    pub(crate) fn held(&mut self) -> Held<'_> {
        Held { core: &self.core, rings: self.rings.get_mut() }
    }

    /// This queue pair as a [`ClaimableQueue`] (the same memory, rings and settings).
    pub(crate) fn into_claimable(self) -> ClaimableQueue {
        ClaimableQueue { core: self.core, rings: Arc::new(self.rings) }
    }
}

impl ClaimableQueue {
    /// Claims the queue: `None` while another claim holds it.
    pub(crate) fn try_claim(&self) -> Option<RingsClaim> {
        self.rings.try_lock_arc().map(RingsClaim)
    }

    /// The rings held by `claim`, for lock-free use; `None` when `claim` is another queue's.
    #[inline]
    pub(crate) fn held<'a>(&'a self, claim: &'a mut RingsClaim) -> Option<Held<'a>> {
        if !Arc::ptr_eq(parking_lot::ArcMutexGuard::mutex(&claim.0), &self.rings) {
            return None;
        }
        // INVARIANT: this queue's own rings (the same mutex), made with its memory's depth.
        Some(Held { core: &self.core, rings: &mut claim.0 })
    }

    /// Queue id.
    pub(crate) fn qid(&self) -> u16 {
        self.core.qid
    }

    /// Transfers written so far, by data pointer (read without the rings).
    pub(crate) fn dptr_counts(&self) -> DptrCounts {
        self.core.dptr.get()
    }
}

#[cfg(test)]
mod tests {
    use super::RequestQueue;
    use crate::cmd::{DmaRange, Flush, Read, Write};
    use crate::error::Error;
    use crate::mmio::StatusView;
    use crate::mock::{Behaviour, MockQueue};
    use crate::pattern;
    use std::time::{Duration, Instant};
    use ugds_uapi::ioctl::Segment;

    const T: Duration = Duration::from_secs(10);

    /// Submits one command through `q` and collects it (the device thread answers).
    fn one(q: &mut impl RequestQueue, status: &StatusView, cmd: crate::cmd::Command<'_>) -> crate::error::Result<()> {
        let mut cids = [0u16; 1];
        let epoch = q.submit(1, &[cmd], status, T, &mut cids)?;
        let mut out = [None; 1];
        let start = Instant::now();
        while q.collect(epoch, &cids, status, &mut out)? == 0 {
            assert!(start.elapsed() < T, "no completion");
            std::hint::spin_loop();
        }
        assert!(out[0].is_some_and(|s| s.is_success()), "{out:?}");
        Ok(())
    }

    /// Writes 8 KiB from host offset 0 to LBA 3 and reads it back to host offset 64 KiB.
    fn round_trip(q: &mut impl RequestQueue, status: &StatusView, segs: &[Segment]) {
        assert_eq!(q.depth(), 8);
        // SAFETY: the mock's segments name its own memory, which only its device model touches;
        // each range is exactly the command's 2 blocks of 4096 bytes.
        let (src, dst) = unsafe { (DmaRange::new(segs, 0, 8192), DmaRange::new(segs, 65536, 8192)) };
        one(q, status, Write::new(3, 2, src).build()).unwrap();
        one(q, status, Read::new(3, 2, dst).build()).unwrap();
    }

    /// Held rings move the same data as the shared queue, through the single-owner calls.
    #[test]
    fn shared_and_held_queues_move_the_same_data() {
        for owned in [false, true] {
            let mut m = MockQueue::new(8, Behaviour::Honest).unwrap();
            let mut data = vec![0u8; 8192];
            pattern::fill(31, 0, &mut data);
            m.host_write(0, &data);
            let segs = m.segments().to_vec();
            if owned {
                round_trip(&mut m.qp.held(), &m.status, &segs);
            } else {
                round_trip(&mut &m.qp, &m.status, &segs);
            }
            assert_eq!(m.host_read(65536, 8192), data, "owned: {owned}");
            assert_eq!(m.backing(3, 2), data, "owned: {owned}");
        }
    }

    /// One command through `m`'s queue pair, held or shared.
    fn flush(m: &mut MockQueue, owned: bool, resync: bool) -> crate::error::Result<()> {
        let status = &m.status;
        if owned {
            let mut q = m.qp.held();
            if resync {
                q.resync(status);
            }
            one(&mut q, status, Flush::new().build())
        } else {
            let mut q = &m.qp;
            if resync {
                q.resync(status);
            }
            one(&mut q, status, Flush::new().build())
        }
    }

    /// After a controller reset both ways report the epoch change once to their next
    /// submission, then carry on; after a reset this thread made itself, `resync` adopts the
    /// new epoch silently on either.
    #[test]
    fn both_ways_see_a_reset_once_and_resync_after_their_own() {
        for owned in [false, true] {
            let mut m = MockQueue::new(8, Behaviour::Honest).unwrap();
            flush(&mut m, owned, false).unwrap();
            m.reset_controller();
            let e = flush(&mut m, owned, false);
            assert!(matches!(e, Err(Error::EpochChanged { old: 1, new: 2 })), "owned {owned}: {e:?}");
            flush(&mut m, owned, false).unwrap();
            // Another reset, this time "ours": resync, and the next command goes through.
            m.reset_controller();
            flush(&mut m, owned, true).unwrap();
        }
    }
}

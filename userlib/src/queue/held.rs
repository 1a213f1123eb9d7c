//! Rings held by one user, used with no lock: [`Held`], borrowed by a queue pair's single owner
//! or by the thread whose claim holds a [`ClaimableQueue`]'s rings (a device's per-thread
//! queues, SPDK's queue pair per thread handed out at run time).

use super::{
    check_burst, check_epoch, collect_in, collect_one_in, Core, DptrCounts, QueuePair, QueueWait, Rings, Submission,
    Ticket, Wait,
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

    /// [`QueuePair::submission_with_room`] on the held rings: the wait for room only spins.
    #[inline(always)]
    fn submission_with_room(
        &mut self,
        nsid: u32,
        n: usize,
        status: &StatusView,
        timeout: Duration,
        first: &Command<'_>,
    ) -> Result<Submission<'_, &mut Rings>> {
        let mut sub = Held { core: self.core, rings: &mut *self.rings }.into_submission(nsid, status)?;
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
        self.submission_with_room(nsid, n, status, timeout, &cmds[0])?.push_all(cmds, cids)
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
        self.submission_with_room(nsid, 1, status, timeout, cmd)?.push_one(cmd)
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

/// A thread's hold on a [`ClaimableQueue`]'s rings: their lock, taken once when the thread
/// claimed the queue and kept until the claim is dropped. The guard keeps the rings (plain
/// data) alive by itself, so a claim outliving its queue's memory (the device closed) names
/// nothing that is gone; it is only of use with the queue it came from.
pub(crate) type RingsClaim = parking_lot::ArcMutexGuard<parking_lot::RawMutex, Rings>;

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
        self.rings.try_lock_arc()
    }

    /// The rings held by `claim`, for lock-free use; `None` when `claim` is another queue's.
    #[inline]
    pub(crate) fn held<'a>(&'a self, claim: &'a mut RingsClaim) -> Option<Held<'a>> {
        if !Arc::ptr_eq(RingsClaim::mutex(claim), &self.rings) {
            return None;
        }
        Some(Held { core: &self.core, rings: &mut *claim })
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

//! A queue pair one thread owns on a namespace (SPDK's model: a queue pair is not thread-safe
//! by contract, each thread gets its own): synchronous requests run on it through the same
//! logic as on the device's shared queues ([`Namespace::rw_on`]), with no lock and no atomic
//! read-modify-write per command. The storage-level face is [`crate::OwnedQueue`].

use super::{create_queue_pair, delete_queue_pair, Namespace, Registration};
use crate::error::Result;
use crate::inflight::IoResult;
use crate::queue::{DptrCounts, QueuePair};
use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::time::Duration;

/// A queue pair created for one owner on a namespace's controller, deleted on drop.
///
/// `Send` (it can be handed to the thread that will use it) but not `Sync`: every I/O call takes
/// `&mut self`, so the rings are used by one thread at a time without a lock.
///
/// # Invariants
///
/// Nothing is in flight on `qp` between calls unless a call's failure carried an `InFlight`
/// token (a timeout the controller reset could not confirm); their memory is then kept for
/// good with it, and dropping the queue pair deletes it in the module first, which stops
/// the controller using it (or leaks the queue memory when even that fails).
#[derive(Debug)]
pub(crate) struct OwnedQueuePair {
    /// Dropped (unmapped) before `ns`, which may hold the device's last reference; leaked in a
    /// child forked after it was made (its mappings are the parent's, not inherited).
    qp: ManuallyDrop<QueuePair>,
    ns: Namespace,
    /// Not `Sync` (SPDK's contract, made a type): `Cell` is `Send` and `!Sync`.
    _not_sync: PhantomData<Cell<()>>,
}

impl Namespace {
    /// Creates a queue pair of its own for the caller on this namespace's controller, as deep as
    /// the device's synchronous queues and waiting the same way, with this
    /// namespace's deadline. Fails when the controller has no queue pair left.
    pub(crate) fn owned_queue(&self) -> Result<OwnedQueuePair> {
        let dev = &self.dev;
        dev.born.check("device")?;
        let epoch = dev.status.state().epoch();
        let qp = create_queue_pair(&dev.fd, self.queue_depth(), self.wait_policy(), &dev.doorbells, epoch, dev.dptr)?;
        Ok(OwnedQueuePair { qp: ManuallyDrop::new(qp), ns: self.clone(), _not_sync: PhantomData })
    }
}

impl OwnedQueuePair {
    /// The namespace its commands go to.
    pub(crate) fn namespace(&self) -> &Namespace {
        &self.ns
    }

    /// Queue id on the controller.
    pub(crate) fn qid(&self) -> u16 {
        self.qp.qid()
    }

    /// Entries per ring.
    pub(crate) fn depth(&self) -> u32 {
        self.qp.depth()
    }

    /// Per-command deadline of its requests.
    pub(crate) fn timeout(&self) -> Duration {
        self.ns.timeout
    }

    /// Sets the per-command deadline of its requests.
    pub(crate) fn set_timeout(&mut self, timeout: Duration) {
        self.ns.timeout = timeout;
    }

    /// Transfers it wrote, by data pointer.
    pub(crate) fn dptr_counts(&self) -> DptrCounts {
        self.qp.dptr_counts()
    }

    /// [`Namespace::rw`] on this queue pair: the same commands, deadlines, reset and failure
    /// reporting, through the single-owner queue calls.
    pub(crate) fn rw(
        &mut self,
        write: bool,
        reg: &Registration,
        reg_offset: u64,
        dev_offset: u64,
        len: u64,
    ) -> IoResult<()> {
        self.ns.rw_on(self.qp.held(), write, reg, reg_offset, dev_offset, len)
    }
}

impl Drop for OwnedQueuePair {
    fn drop(&mut self) {
        if self.ns.dev.born.in_child() {
            // The parent's queue pair: neither deleted nor unmapped from here.
            return;
        }
        // Nothing is in flight (see the invariants), or a token keeps the memory of commands left
        // running for good: give the queue pair back. The module deletes it on the controller
        // before freeing its memory and revokes our mappings of it; `qp` unmaps them after this.
        delete_queue_pair(&self.ns.dev.fd, self.qp.qid());
        // SAFETY: dropped once, here; `self` is going away.
        unsafe { ManuallyDrop::drop(&mut self.qp) };
    }
}

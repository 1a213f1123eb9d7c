//! The in-kernel admin queue: one command at a time, polled with a bounded wait. The admin
//! queue never leaves the kernel.
//!
//! Its doorbells share a page with the I/O queues' doorbells, which user space maps, so a
//! process can write any value to them. Nothing it writes can make the controller touch freed
//! memory: every entry is zeroed once its command completed (a zeroed entry is an invalid
//! command), command id 0 (the one a zeroed entry carries) is never used, completions nobody
//! waits for are ignored and logged, and the data buffers admin commands name live as long as
//! the queue.

use crate::shim::delay::read_poll_timeout;
use crate::shim::dma::{CoherentAllocation, DmaAddress};
use crate::shim::pci::Device;
use crate::uapi::identify::{IdentifyController, IdentifyNamespace};
use crate::uapi::queue::{Cqe, Sqe};
use crate::uapi::regs::{cq_head_doorbell, sq_tail_doorbell};
use crate::Bar0;
use core::sync::atomic::{fence, Ordering};
use kernel::prelude::*;

/// Entries in the admin SQ and CQ.
pub(crate) const ADMIN_DEPTH: u16 = 32;

/// Sleep between two looks at the completion queue, in microseconds.
const POLL_US: u32 = 20;

/// The data buffers of the Identify commands (one page each). They live as long as the admin
/// queue: an Identify entry that a stray tail write made the controller run again, or one that
/// timed out and completes late, writes memory that is still ours.
pub(crate) struct IdentifyBuffers {
    /// Identify Controller.
    pub(crate) controller: CoherentAllocation<IdentifyController>,
    /// Active namespace list: up to 1024 NSIDs.
    pub(crate) nsids: CoherentAllocation<u32>,
    /// Identify Namespace.
    pub(crate) namespace: CoherentAllocation<IdentifyNamespace>,
}

/// The admin submission and completion queues and their ring state.
pub(crate) struct AdminQueue {
    /// Buffers admin commands name (freed with the queue, after the controller stopped).
    pub(crate) ident: IdentifyBuffers,
    sq: CoherentAllocation<Sqe>,
    cq: CoherentAllocation<Cqe>,
    sq_tail: u16,
    cq_head: u16,
    phase: bool,
    next_cid: u16,
    dstrd: u8,
    /// Completions seen for no command we were waiting for (stray doorbell writes).
    strays: u64,
    /// Set when a command timed out: the ring state no longer matches the device's, so only a
    /// controller reset (which calls [`AdminQueue::reset_state`]) makes the queue usable again.
    broken: bool,
}

impl AdminQueue {
    /// Allocates the queues.
    pub(crate) fn new(dev: &Device, dstrd: u8) -> Result<Self> {
        Ok(AdminQueue {
            ident: IdentifyBuffers {
                controller: CoherentAllocation::alloc_coherent(dev, 1)?,
                nsids: CoherentAllocation::alloc_coherent(dev, 1024)?,
                namespace: CoherentAllocation::alloc_coherent(dev, 1)?,
            },
            sq: CoherentAllocation::alloc_coherent(dev, ADMIN_DEPTH as usize)?,
            cq: CoherentAllocation::alloc_coherent(dev, ADMIN_DEPTH as usize)?,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
            next_cid: 1,
            dstrd,
            strays: 0,
            broken: false,
        })
    }

    /// Bus addresses of the SQ and CQ (for ASQ/ACQ).
    pub(crate) fn dma_addrs(&self) -> (DmaAddress, DmaAddress) {
        (self.sq.dma_handle(), self.cq.dma_handle())
    }

    /// Forgets all ring state, for a controller that was just disabled (the device has stopped
    /// using the queues).
    pub(crate) fn reset_state(&mut self) -> Result {
        for i in 0..self.cq.len() {
            self.cq.write(i, &Cqe::default())?;
        }
        for i in 0..self.sq.len() {
            self.sq.write(i, &Sqe::default())?;
        }
        self.sq_tail = 0;
        self.cq_head = 0;
        self.phase = true;
        self.broken = false;
        Ok(())
    }

    /// True after a command timed out, until a reset: the controller may still run it.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Submits one command and polls for its completion for at most `timeout_ms`.
    ///
    /// Errors: `ETIMEDOUT` (the queue is then broken until a reset), `EIO` for a completion
    /// with an error status (logged by name).
    pub(crate) fn submit(&mut self, bar: &Bar0, mut sqe: Sqe, timeout_ms: u32) -> Result<Cqe> {
        if self.broken {
            return Err(EIO);
        }
        let cid = self.next_cid;
        // Never 0: a zeroed (completed) entry carries command id 0.
        self.next_cid = self.next_cid.checked_add(1).unwrap_or(1);
        sqe.set_cid(cid);
        let slot = self.sq_tail as usize;
        self.sq.write(slot, &sqe)?;
        self.sq_tail = (self.sq_tail + 1) % ADMIN_DEPTH;
        // The entry must be in memory before the device sees the new tail.
        fence(Ordering::SeqCst);
        // Our CQ head first: a stray write may have left the controller believing the CQ is
        // full (then it would never post our completion).
        bar.try_write32(cq_head_doorbell(0, self.dstrd), self.cq_head as u32)?;
        bar.try_write32(sq_tail_doorbell(0, self.dstrd), self.sq_tail as u32)?;

        let strays_before = self.strays;
        let polled = read_poll_timeout(|| self.reap_one(bar, cid), |c| c.is_some(), POLL_US, timeout_ms as u64 * 1000);
        if self.strays != strays_before {
            pr_warn!(
                "admin queue: ignored {} completion(s) nobody waited for (stray admin doorbell writes?)\n",
                self.strays - strays_before
            );
        }
        let cqe = match polled {
            Ok(Some(cqe)) => cqe,
            Ok(None) | Err(_) => {
                // The entry stays: the controller may still fetch and run it (its data buffers
                // live as long as the queue). Only a reset makes the queue usable again.
                pr_err!("admin opcode {:#04x} timed out after {} ms\n", sqe.opcode(), timeout_ms);
                self.broken = true;
                return Err(crate::errno::etimedout());
            }
        };
        // Completed: the controller fetched the entry, so a replay through a stray tail write
        // now finds nothing to run.
        self.sq.write(slot, &Sqe::default())?;
        let st = cqe.status();
        if !st.is_success() {
            pr_err!(
                "admin opcode {:#04x} failed: {} (SCT {:#x} SC {:#04x})\n",
                sqe.opcode(),
                st.name().unwrap_or("unknown status"),
                st.sct.bits(),
                st.sc
            );
            return Err(EIO);
        }
        Ok(cqe)
    }

    /// Looks at the next CQ entry once: consumes it if posted (moving the head and ringing the
    /// CQ head doorbell) and returns it when it is the completion of `cid`; a completion of any
    /// other id is counted as a stray and dropped.
    fn reap_one(&mut self, bar: &Bar0, cid: u16) -> Result<Option<Cqe>> {
        let head = self.cq_head as usize;
        if self.cq.read(head)?.phase() != self.phase {
            return Ok(None);
        }
        // Read the entry again after seeing its phase bit: a volatile read of the whole entry
        // has no order among its fields, so the first one may pair the new phase with old data.
        fence(Ordering::Acquire);
        let cqe = self.cq.read(head)?;
        self.cq_head += 1;
        if self.cq_head == ADMIN_DEPTH {
            self.cq_head = 0;
            self.phase = !self.phase;
        }
        bar.try_write32(cq_head_doorbell(0, self.dstrd), self.cq_head as u32)?;
        if cqe.cid() != cid {
            self.strays += 1;
            return Ok(None);
        }
        Ok(Some(cqe))
    }
}

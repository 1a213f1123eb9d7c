//! The in-kernel admin queue: one command at a time, polled with a bounded wait. The admin
//! queue never leaves the kernel.

use crate::shim::delay::read_poll_timeout;
use crate::shim::dma::{CoherentAllocation, DmaAddress};
use crate::shim::pci::Device;
use crate::uapi::queue::{Cqe, Sqe};
use crate::uapi::regs::{cq_head_doorbell, sq_tail_doorbell};
use crate::Bar0;
use core::sync::atomic::{fence, Ordering};
use kernel::prelude::*;

/// Entries in the admin SQ and CQ.
pub(crate) const ADMIN_DEPTH: u16 = 32;

/// Sleep between two looks at the completion queue, in microseconds.
const POLL_US: u32 = 20;

/// The admin submission and completion queues and their ring state.
pub(crate) struct AdminQueue {
    sq: CoherentAllocation<Sqe>,
    cq: CoherentAllocation<Cqe>,
    sq_tail: u16,
    cq_head: u16,
    phase: bool,
    next_cid: u16,
    dstrd: u8,
    /// Set when a command timed out: the ring state no longer matches the device's, so only a
    /// controller reset (which calls [`AdminQueue::reset_state`]) makes the queue usable again.
    broken: bool,
}

impl AdminQueue {
    /// Allocates the queues.
    pub(crate) fn new(dev: &Device, dstrd: u8) -> Result<Self> {
        Ok(AdminQueue {
            sq: CoherentAllocation::alloc_coherent(dev, ADMIN_DEPTH as usize)?,
            cq: CoherentAllocation::alloc_coherent(dev, ADMIN_DEPTH as usize)?,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
            next_cid: 0,
            dstrd,
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
        self.sq_tail = 0;
        self.cq_head = 0;
        self.phase = true;
        self.broken = false;
        Ok(())
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
        self.next_cid = self.next_cid.wrapping_add(1);
        sqe.set_cid(cid);
        self.sq.write(self.sq_tail as usize, &sqe)?;
        self.sq_tail = (self.sq_tail + 1) % ADMIN_DEPTH;
        // The entry must be in memory before the device sees the new tail.
        fence(Ordering::SeqCst);
        bar.try_write32(sq_tail_doorbell(0, self.dstrd), self.sq_tail as u32)?;

        let (head, phase) = (self.cq_head as usize, self.phase);
        let cq = &self.cq;
        let polled = read_poll_timeout(|| cq.read(head), |c| c.phase() == phase, POLL_US, timeout_ms as u64 * 1000);
        if let Err(e) = polled {
            pr_err!("admin opcode {:#04x} timed out after {} ms\n", sqe.opcode(), timeout_ms);
            self.broken = true;
            return Err(e);
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
            pr_err!("admin completion for cid {} while waiting for {}\n", cqe.cid(), cid);
            self.broken = true;
            return Err(EIO);
        }
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
}

//! The in-kernel admin queue: one command at a time, polled with a bounded wait. The admin
//! queue never leaves the kernel.

use crate::bindings;
use crate::shim::dma::CoherentAllocation;
use crate::shim::pci::Device;
use crate::uapi::queue::{Cqe, Sqe};
use crate::uapi::regs::{cq_head_doorbell, sq_tail_doorbell};
use crate::Bar0;
use core::sync::atomic::{fence, Ordering};
use kernel::prelude::*;

/// Entries in the admin SQ and CQ.
pub(crate) const ADMIN_DEPTH: u16 = 32;

/// The admin submission and completion queues and their ring state.
pub(crate) struct AdminQueue {
    sq: CoherentAllocation,
    cq: CoherentAllocation,
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
            sq: CoherentAllocation::alloc(dev, ADMIN_DEPTH as usize * 64)?,
            cq: CoherentAllocation::alloc(dev, ADMIN_DEPTH as usize * 16)?,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
            next_cid: 0,
            dstrd,
            broken: false,
        })
    }

    /// Bus addresses of the SQ and CQ (for ASQ/ACQ).
    pub(crate) fn dma_addrs(&self) -> (u64, u64) {
        (self.sq.dma_handle(), self.cq.dma_handle())
    }

    /// Forgets all ring state, for a controller that was just disabled (the device has stopped
    /// using the queues).
    pub(crate) fn reset_state(&mut self) -> Result {
        for i in 0..(self.cq.size() / 4) {
            self.cq.write32(i * 4, 0)?;
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
        let slot = self.sq_tail as usize * 64;
        for (i, w) in sqe.to_dwords().iter().enumerate() {
            self.sq.write32(slot + 4 * i, *w)?;
        }
        self.sq_tail = (self.sq_tail + 1) % ADMIN_DEPTH;
        // The entry must be in memory before the device sees the new tail.
        fence(Ordering::SeqCst);
        bar.try_write32(sq_tail_doorbell(0, self.dstrd), self.sq_tail as u32)?;

        let mut waited_us: u64 = 0;
        loop {
            let off = self.cq_head as usize * 16;
            let dw3 = self.cq.read32(off + 12)?;
            if ((dw3 >> 16) & 1 != 0) == self.phase {
                // Read the rest of the entry only after seeing its phase bit.
                fence(Ordering::Acquire);
                let cqe = Cqe::from_dwords([self.cq.read32(off)?, self.cq.read32(off + 4)?, self.cq.read32(off + 8)?, dw3]);
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
                return Ok(cqe);
            }
            if waited_us >= timeout_ms as u64 * 1000 {
                pr_err!("admin opcode {:#04x} timed out after {} ms\n", sqe.opcode(), timeout_ms);
                self.broken = true;
                return Err(crate::errno::etimedout());
            }
            // SAFETY: sleeping is allowed: callers hold only a sleeping mutex.
            unsafe { bindings::usleep_range_state(20, 50, kernel::bindings::TASK_UNINTERRUPTIBLE) };
            waited_us += 50;
        }
    }
}

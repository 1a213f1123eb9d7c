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
use crate::uapi::args::{admin_data_pages, admin_guard_entry, admin_page_of, ADMIN_PAGE, PRP_ENTRIES};
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
    pub(crate) fn submit(&mut self, bar: &Bar0, sqe: Sqe, timeout_ms: u32) -> Result<Cqe> {
        let opcode = sqe.opcode();
        let cqe = self.submit_raw(bar, sqe, timeout_ms)?;
        let st = cqe.status();
        if !st.is_success() {
            pr_err!(
                "admin opcode {:#04x} failed: {} (SCT {:#x} SC {:#04x})\n",
                opcode,
                st.name().unwrap_or("unknown status"),
                st.sct.bits(),
                st.sc
            );
            return Err(EIO);
        }
        Ok(cqe)
    }

    /// Submits one command and polls for its completion for at most `timeout_ms`; the
    /// completion comes back whatever its status (the caller decides what an error status
    /// means: the pass-through hands it to user space).
    ///
    /// Errors: `EIO` while the queue is broken, `ETIMEDOUT` (the queue is then broken until a
    /// reset, and the controller may still run the command: its memory must stay).
    pub(crate) fn submit_raw(&mut self, bar: &Bar0, mut sqe: Sqe, timeout_ms: u32) -> Result<Cqe> {
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

/// The memory of one pass-through command (`ADMIN_CMD`): `n` data pages followed by one guard
/// page holding a PRP list, all in one coherent allocation owned by the module (the layout:
/// uapi `args::admin_data_pages`, `admin_guard_entry`, `admin_page_of`, host-tested there
/// against a model of a controller's PRP walk).
///
/// PRP1 names data page 0 and PRP2 the guard page. The guard page's entries name the data pages
/// 1, 2, ..., n-1, 0, 1, ... in turn, and its last entry (the one a controller follows to a next
/// list page) names the guard page itself. So whatever transfer length a controller derives
/// from the command (a Get Features of a vendor feature may carry more data than the caller
/// asked for), every address it can reach through PRP1, PRP2 and the lists lies in this
/// allocation: a page it treats as data is ours, a list it follows is ours. (A two-page
/// transfer puts its second page in the guard page, which it then does not read as a list.)
///
/// # Invariants
///
/// `mem` holds `(n + 1) * PRP_ENTRIES` entries, `n = admin_data_pages(len) >= 1`; the guard
/// page (page `n`) holds the list described above from `new` on, until a command that takes
/// it for data (a transfer of two pages) writes it.
pub(crate) struct PassthruBuffer {
    mem: CoherentAllocation<u64>,
    len: u32,
}

impl PassthruBuffer {
    /// Allocates (zeroed) room for a transfer of `len` bytes (at least one page) and writes the
    /// guard list.
    pub(crate) fn new(dev: &Device, len: u32) -> Result<Self> {
        let pages = admin_data_pages(len);
        let mem = CoherentAllocation::alloc_coherent(dev, (pages + 1) * PRP_ENTRIES)?;
        let base = mem.dma_handle();
        for i in 0..PRP_ENTRIES {
            // CAST: page indexes below 18 (MAX_ADMIN_DATA / ADMIN_PAGE + 2) as u64.
            let page = admin_guard_entry(pages, i) as u64;
            mem.write(pages * PRP_ENTRIES + i, &(base + page * ADMIN_PAGE as u64).to_le())?;
        }
        Ok(PassthruBuffer { mem, len })
    }

    /// PRP1 and PRP2 for the command.
    pub(crate) fn prps(&self) -> (DmaAddress, DmaAddress) {
        let base = self.mem.dma_handle();
        // CAST: page indexes below 18 as u64.
        (base, base + (admin_data_pages(self.len) * ADMIN_PAGE) as u64)
    }

    /// The `len` bytes of the transfer (`len` as given to [`PassthruBuffer::new`]), as the
    /// controller left them, gathered from the pages they land in.
    pub(crate) fn copy_out(&self) -> Result<KVVec<u8>> {
        // CAST: u32 to usize widens on x86-64.
        let len = self.len as usize;
        let mut out = KVVec::with_capacity(len, GFP_KERNEL)?;
        let mut off = 0;
        while off < len {
            let page = admin_page_of(self.len, off / ADMIN_PAGE);
            let index = page * PRP_ENTRIES + (off % ADMIN_PAGE) / 8;
            // Bytes as the controller wrote them: native order of the element read back.
            let bytes = self.mem.read(index)?.to_ne_bytes();
            let take = (len - off).min(8);
            out.extend_from_slice(&bytes[..take], GFP_KERNEL)?;
            off += 8;
        }
        Ok(out)
    }
}

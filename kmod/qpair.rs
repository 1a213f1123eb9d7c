//! I/O queue pairs handed to user space: SQ, CQ and PRP-list pool in coherent DMA memory, created
//! and deleted through the admin queue.

use crate::admin::AdminQueue;
use crate::ctrl::ADMIN_TIMEOUT_MS;
use crate::shim::chrdev::FileHandle;
use crate::shim::dma::CoherentAllocation;
use crate::shim::irq::EventfdIrq;
use crate::shim::pci::Device;
use crate::uapi::ioctl::{mmap_offset, MmapKind, QPAIR_FLAG_IRQ};
use crate::uapi::queue::{admin, Sqe};
use crate::Bar0;
use kernel::prelude::*;

/// One I/O queue pair (SQ and CQ share `qid`) owned by an open file.
pub(crate) struct Qpair {
    /// The interrupt handler signalling the owner's eventfd (first: freed before the memory).
    pub(crate) irq: Option<EventfdIrq>,
    /// `QPAIR_FLAG_*` it was created with.
    pub(crate) flags: u32,
    /// The open file that created it.
    pub(crate) owner: FileHandle,
    /// Queue id (1-based).
    pub(crate) qid: u16,
    /// Entries per queue.
    pub(crate) depth: u32,
    /// Submission queue: `depth` × 64 bytes (page rounded).
    pub(crate) sq: CoherentAllocation,
    /// Completion queue: `depth` × 16 bytes (page rounded).
    pub(crate) cq: CoherentAllocation,
    /// PRP-list pool: one 4 KiB page per SQ slot.
    pub(crate) prp: CoherentAllocation,
}

impl Qpair {
    /// Allocates the memory (zeroed) for a queue pair.
    pub(crate) fn alloc(dev: &Device, owner: FileHandle, qid: u16, depth: u32, flags: u32) -> Result<Self> {
        let d = depth as usize;
        Ok(Qpair {
            irq: None,
            flags,
            owner,
            qid,
            depth,
            sq: CoherentAllocation::alloc(dev, d * 64)?,
            cq: CoherentAllocation::alloc(dev, d * 16)?,
            prp: CoherentAllocation::alloc(dev, d * 4096)?,
        })
    }

    /// Creates the CQ, then the SQ, on the controller (interrupts off). A failed SQ creation
    /// deletes the CQ again.
    pub(crate) fn create_on_device(&self, bar: &Bar0, adminq: &mut AdminQueue) -> Result {
        let mut c = Sqe::new(admin::CREATE_IO_CQ, 0);
        c.set_prps(self.cq.dma_handle(), 0);
        c.set_cdw(10, (self.depth - 1) << 16 | self.qid as u32);
        // PC (physically contiguous); with interrupts: IEN and vector = qid.
        let irq = if self.flags & QPAIR_FLAG_IRQ != 0 { (self.qid as u32) << 16 | 1 << 1 } else { 0 };
        c.set_cdw(11, irq | 1);
        adminq.submit(bar, c, ADMIN_TIMEOUT_MS)?;
        let mut s = Sqe::new(admin::CREATE_IO_SQ, 0);
        s.set_prps(self.sq.dma_handle(), 0);
        s.set_cdw(10, (self.depth - 1) << 16 | self.qid as u32);
        // CQID in bits 31:16, PC.
        s.set_cdw(11, (self.qid as u32) << 16 | 1);
        if let Err(e) = adminq.submit(bar, s, ADMIN_TIMEOUT_MS) {
            let _ = Self::delete_queue(bar, adminq, admin::DELETE_IO_CQ, self.qid);
            return Err(e);
        }
        Ok(())
    }

    fn delete_queue(bar: &Bar0, adminq: &mut AdminQueue, opcode: u8, qid: u16) -> Result {
        let mut c = Sqe::new(opcode, 0);
        c.set_cdw(10, qid as u32);
        adminq.submit(bar, c, ADMIN_TIMEOUT_MS).map(|_| ())
    }

    /// Deletes the SQ (the controller completes or aborts its commands first), then the CQ.
    pub(crate) fn delete_on_device(&self, bar: &Bar0, adminq: &mut AdminQueue) -> Result {
        Self::delete_queue(bar, adminq, admin::DELETE_IO_SQ, self.qid)?;
        Self::delete_queue(bar, adminq, admin::DELETE_IO_CQ, self.qid)
    }

    /// Forgets completions (after a controller reset, before re-creating it).
    pub(crate) fn clear_cq(&self) -> Result {
        for i in 0..self.cq.size() / 4 {
            self.cq.write32(i * 4, 0)?;
        }
        Ok(())
    }

    /// The region of `kind` (SQ, CQ or PRP pool).
    pub(crate) fn region(&self, kind: MmapKind) -> Option<&CoherentAllocation> {
        match kind {
            MmapKind::Sq => Some(&self.sq),
            MmapKind::Cq => Some(&self.cq),
            MmapKind::PrpPool => Some(&self.prp),
            MmapKind::Doorbells | MmapKind::Status => None,
        }
    }

    /// Removes the owner's user mappings of this queue pair's memory.
    pub(crate) fn zap_user_mappings(&self) {
        for kind in [MmapKind::Sq, MmapKind::Cq, MmapKind::PrpPool] {
            if let Some(r) = self.region(kind) {
                self.owner.zap(mmap_offset(kind, self.qid), r.size() as u64);
            }
        }
    }
}

//! I/O queue pairs handed to user space: SQ, CQ and PRP-list pool in coherent DMA memory, created
//! and deleted through the admin queue.

use crate::admin::AdminQueue;
use crate::ctrl::ADMIN_TIMEOUT_MS;
use crate::shim::chrdev::FileHandle;
use crate::shim::dma::CoherentAllocation;
use crate::shim::irq::EventfdIrq;
use crate::shim::mm::Vma;
use crate::shim::pci::Device;
use crate::uapi::ioctl::{mmap_offset, MmapKind, QPAIR_FLAG_IRQ};
use crate::uapi::queue::{admin, Cqe, Sqe};
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
    /// Submission queue: `depth` entries (page rounded). User space writes it.
    pub(crate) sq: CoherentAllocation<Sqe>,
    /// Completion queue: `depth` entries (page rounded). The controller writes it.
    pub(crate) cq: CoherentAllocation<Cqe>,
    /// PRP-list pool: one list page per SQ slot. User space writes it.
    pub(crate) prp: CoherentAllocation<PrpList>,
}

/// One PRP list: a page of 512 PRP entries.
pub(crate) type PrpList = [u64; 512];

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
            sq: CoherentAllocation::alloc_coherent(dev, d)?,
            cq: CoherentAllocation::alloc_coherent(dev, d)?,
            prp: CoherentAllocation::alloc_coherent(dev, d)?,
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
        for i in 0..self.cq.len() {
            self.cq.write(i, &Cqe::default())?;
        }
        Ok(())
    }

    /// Size in bytes of the region of `kind` (SQ, CQ or PRP pool), as mapped.
    pub(crate) fn region_size(&self, kind: MmapKind) -> Option<usize> {
        match kind {
            MmapKind::Sq => Some(self.sq.size()),
            MmapKind::Cq => Some(self.cq.size()),
            MmapKind::PrpPool => Some(self.prp.size()),
            MmapKind::Doorbells | MmapKind::Status => None,
        }
    }

    /// Maps the region of `kind` (SQ, CQ or PRP pool) into `vma`.
    ///
    /// # Safety
    ///
    /// The caller must remove the mapping (see [`Qpair::zap_user_mappings`]) before this queue
    /// pair is dropped.
    pub(crate) unsafe fn mmap_region(&self, kind: MmapKind, vma: &mut Vma) -> Result {
        match kind {
            // SAFETY: the caller zaps the mapping before `self`, and so the SQ, is dropped.
            MmapKind::Sq => unsafe { self.sq.mmap(vma) },
            // SAFETY: the caller zaps the mapping before `self`, and so the CQ, is dropped.
            MmapKind::Cq => unsafe { self.cq.mmap(vma) },
            // SAFETY: the caller zaps the mapping before `self`, and so the pool, is dropped.
            MmapKind::PrpPool => unsafe { self.prp.mmap(vma) },
            MmapKind::Doorbells | MmapKind::Status => Err(EINVAL),
        }
    }

    /// Removes the owner's user mappings of this queue pair's memory.
    pub(crate) fn zap_user_mappings(&self) {
        for kind in [MmapKind::Sq, MmapKind::Cq, MmapKind::PrpPool] {
            if let Some(size) = self.region_size(kind) {
                self.owner.zap(mmap_offset(kind, self.qid), size as u64);
            }
        }
    }
}

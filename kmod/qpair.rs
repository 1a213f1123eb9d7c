//! I/O queue pairs handed to user space: SQ, CQ and PRP-list pool in coherent DMA memory, created
//! and deleted through the admin queue.

use crate::admin::AdminQueue;
use crate::ctrl::ADMIN_TIMEOUT_MS;
use crate::shim::chrdev::FileHandle;
use crate::shim::dma::CoherentAllocation;
use crate::shim::irq::EventfdIrq;
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
    /// True while the queues exist on the controller. A reset deletes them all (disabling the
    /// controller) and leaves this false until the owner re-arms the queue pair, so a tail that
    /// was computed before the reset never reaches a re-created queue.
    pub(crate) armed: bool,
    /// Submission queue: `depth` entries (page rounded). User space writes it.
    pub(crate) sq: CoherentAllocation<Sqe>,
    /// Completion queue: `depth` entries (page rounded). The controller writes it.
    pub(crate) cq: CoherentAllocation<Cqe>,
    /// PRP-list pool: one list page per SQ slot. User space writes it.
    pub(crate) prp: CoherentAllocation<PrpList>,
}

/// Why creating a queue pair on the controller failed.
pub(crate) struct CreateFailed {
    /// The error for the caller.
    pub(crate) err: Error,
    /// The controller may still own (part of) the queue memory: it must be stopped before the
    /// memory is freed.
    pub(crate) controller_may_own: bool,
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
            armed: false,
            sq: CoherentAllocation::alloc_coherent(dev, d)?,
            cq: CoherentAllocation::alloc_coherent(dev, d)?,
            prp: CoherentAllocation::alloc_coherent(dev, d)?,
        })
    }

    /// Creates the CQ, then the SQ, on the controller (interrupts off). A failed SQ creation
    /// deletes the CQ again. On failure, says whether the controller may still own any of the
    /// memory (a command timed out, or the cleanup failed): then only a stopped controller
    /// makes it safe to free.
    pub(crate) fn create_on_device(&self, bar: &Bar0, adminq: &mut AdminQueue) -> core::result::Result<(), CreateFailed> {
        let mut c = Sqe::new(admin::CREATE_IO_CQ, 0);
        c.set_prps(self.cq.dma_handle(), 0);
        c.set_cdw(10, (self.depth - 1) << 16 | self.qid as u32);
        // PC (physically contiguous); with interrupts: IEN and vector = qid.
        let irq = if self.flags & QPAIR_FLAG_IRQ != 0 { (self.qid as u32) << 16 | 1 << 1 } else { 0 };
        c.set_cdw(11, irq | 1);
        if let Err(e) = adminq.submit(bar, c, ADMIN_TIMEOUT_MS) {
            // An error completion means the CQ was not created; no completion means it may be.
            return Err(CreateFailed { err: e, controller_may_own: adminq.is_broken() });
        }
        let mut s = Sqe::new(admin::CREATE_IO_SQ, 0);
        s.set_prps(self.sq.dma_handle(), 0);
        s.set_cdw(10, (self.depth - 1) << 16 | self.qid as u32);
        // CQID in bits 31:16, PC.
        s.set_cdw(11, (self.qid as u32) << 16 | 1);
        if let Err(e) = adminq.submit(bar, s, ADMIN_TIMEOUT_MS) {
            let sq_may_exist = adminq.is_broken();
            let cq_gone = Self::delete_queue(bar, adminq, admin::DELETE_IO_CQ, self.qid).is_ok();
            return Err(CreateFailed { err: e, controller_may_own: sq_may_exist || !cq_gone });
        }
        Ok(())
    }

    fn delete_queue(bar: &Bar0, adminq: &mut AdminQueue, opcode: u8, qid: u16) -> Result {
        let mut c = Sqe::new(opcode, 0);
        c.set_cdw(10, qid as u32);
        adminq.submit(bar, c, ADMIN_TIMEOUT_MS).map(|_| ())
    }

    /// Deletes the SQ (the controller completes or aborts its commands first), then the CQ;
    /// nothing to do for a queue pair that is not armed (its queues do not exist).
    pub(crate) fn delete_on_device(&self, bar: &Bar0, adminq: &mut AdminQueue) -> Result {
        if !self.armed {
            return Ok(());
        }
        Self::delete_queue(bar, adminq, admin::DELETE_IO_SQ, self.qid)?;
        Self::delete_queue(bar, adminq, admin::DELETE_IO_CQ, self.qid)
    }

    /// Zeroes the SQ, the CQ and the PRP-list pool (the controller must not be using them: the
    /// queues are not armed). A zeroed SQ entry asks for nothing (a Flush of namespace 0, which
    /// the controller fails), so a stale tail can make no old command run again.
    pub(crate) fn clear_all(&self) -> Result {
        for i in 0..self.sq.len() {
            self.sq.write(i, &Sqe::default())?;
        }
        for i in 0..self.cq.len() {
            self.cq.write(i, &Cqe::default())?;
        }
        for i in 0..self.prp.len() {
            self.prp.write(i, &[0u64; 512])?;
        }
        Ok(())
    }

    /// The page frame at byte `offset` of the region of `kind`, for a user mapping.
    pub(crate) fn region_pfn(&self, kind: MmapKind, offset: u64) -> Result<u64> {
        match kind {
            MmapKind::Sq => self.sq.pfn(offset),
            MmapKind::Cq => self.cq.pfn(offset),
            MmapKind::PrpPool => self.prp.pfn(offset),
            _ => Err(EINVAL),
        }
    }

    /// Size in bytes of the region of `kind` (SQ, CQ or PRP pool), as mapped.
    pub(crate) fn region_size(&self, kind: MmapKind) -> Option<usize> {
        match kind {
            MmapKind::Sq => Some(self.sq.size()),
            MmapKind::Cq => Some(self.cq.size()),
            MmapKind::PrpPool => Some(self.prp.size()),
            _ => None,
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

//! Shadow doorbells (Doorbell Buffer Config, NVMe 1.3 and later): two pages of host memory in
//! the doorbells' layout. Software writes a queue's SQ tail and CQ head into the first; the
//! controller reads them there and writes into the second, for each queue, the value past which
//! it wants a doorbell register write. A controller that advertises the command (OACS bit 8:
//! emulated and virtual controllers) then needs a register write only when it has caught up.
//!
//! Both pages are given to the controller at every enable (probe and reset). A queue's entries
//! are zeroed before the queue is created: the controller reads the shadow tail of a queue it
//! processes, so a value left from an earlier queue of that id would name entries that were
//! never written.

use crate::admin::AdminQueue;
use crate::ctrl::ADMIN_TIMEOUT_MS;
use crate::shim::dma::CoherentAllocation;
use crate::shim::pci::Device;
use crate::uapi::ioctl::MmapKind;
use crate::uapi::queue::{admin, Sqe};
use crate::Bar0;
use kernel::prelude::*;

/// 32-bit entries in one page.
const ENTRIES: usize = 1024;

/// The shadow doorbell page and the event index page of a controller.
///
/// # Invariants
///
/// Both allocations hold [`ENTRIES`] entries; `stride_words` is the doorbell stride in 32-bit
/// words, and every queue id below `queues` has its two entries inside them.
pub(crate) struct ShadowDoorbells {
    doorbells: CoherentAllocation<u32>,
    event_indexes: CoherentAllocation<u32>,
    stride_words: usize,
    queues: u32,
}

impl ShadowDoorbells {
    /// Allocates the pages for `queues` queue ids (the admin queue's included) at a doorbell
    /// stride of `stride` bytes; `None` when they do not fit one page each.
    pub(crate) fn alloc(dev: &Device, queues: u32, stride: u32) -> Result<Option<Self>> {
        let stride_words = (stride / 4) as usize;
        if stride_words == 0 || (queues as usize) * 2 * stride_words > ENTRIES {
            return Ok(None);
        }
        // INVARIANT: one page each, every queue's entries inside (checked above).
        Ok(Some(ShadowDoorbells {
            doorbells: CoherentAllocation::alloc_coherent(dev, ENTRIES)?,
            event_indexes: CoherentAllocation::alloc_coherent(dev, ENTRIES)?,
            stride_words,
            queues,
        }))
    }

    /// Zeroes both pages and gives them to the controller (after every enable: a reset forgets
    /// them). Errors: the admin command's.
    pub(crate) fn configure(&self, bar: &Bar0, adminq: &mut AdminQueue) -> Result {
        for i in 0..ENTRIES {
            self.doorbells.write(i, &0)?;
            self.event_indexes.write(i, &0)?;
        }
        let mut c = Sqe::new(admin::DOORBELL_BUFFER_CONFIG, 0);
        // PRP1: the shadow doorbells; PRP2: the event indexes (each one page, page aligned).
        c.set_prps(self.doorbells.dma_handle(), self.event_indexes.dma_handle());
        adminq.submit(bar, c, ADMIN_TIMEOUT_MS).map(|_| ())
    }

    /// Zeroes queue `qid`'s SQ tail and CQ head entries in both pages, before the queue is
    /// created (the controller is not using them: the queue does not exist).
    pub(crate) fn clear_queue(&self, qid: u16) -> Result {
        if u32::from(qid) >= self.queues {
            return Err(EINVAL);
        }
        let sq = 2 * qid as usize * self.stride_words;
        for i in [sq, sq + self.stride_words] {
            self.doorbells.write(i, &0)?;
            self.event_indexes.write(i, &0)?;
        }
        Ok(())
    }

    /// The page frame of `kind`'s page at byte `offset`, for a user mapping.
    pub(crate) fn pfn(&self, kind: MmapKind, offset: u64) -> Result<u64> {
        match kind {
            MmapKind::ShadowDoorbells => self.doorbells.pfn(offset),
            MmapKind::EventIndexes => self.event_indexes.pfn(offset),
            _ => Err(EINVAL),
        }
    }

    /// Bytes of one page, as mapped.
    pub(crate) fn size(&self) -> usize {
        self.doorbells.size()
    }
}

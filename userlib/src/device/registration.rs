//! `Registration`: memory the module pinned or attached for one controller's DMA.

use super::{revocation, Inner};
use crate::cmd::DmaRange;
use crate::error::Result;
use crate::sys::req;
use std::sync::Arc;
use ugds_uapi::ioctl::*;

/// Memory the module pinned (host pages) or attached (dma-buf) for this controller's DMA: its
/// handle and DMA segments. Deregistered on drop. It owns no memory and counts nothing: the
/// [`crate::Buffer`] that holds it owns the memory and the lease that says whether the SSD may
/// be using it, and drops its registrations only when no lease is outstanding. A command that
/// may still run after its I/O gave up leaves an [`InFlight`] token behind, which keeps that
/// lease for good: so a registration is dropped only once nothing in flight names it.
#[derive(Debug)]
pub(crate) struct Registration {
    pub(super) dev: Arc<Inner>,
    pub(super) handle: RegistrationHandle,
    pub(super) segments: Vec<Segment>,
    /// A dma-buf, which its exporter may revoke; `None`: pinned host pages, never revoked.
    pub(super) live: Option<revocation::Liveness>,
}

impl Registration {
    /// [`Error::Revoked`] once the exporter revoked it (checked once per controller epoch).
    pub(crate) fn alive(&self) -> Result<()> {
        self.valid_epoch().map(drop)
    }

    /// The controller epoch its segments may be named in: any (`None`, host pages), or the
    /// current one once it is known alive in it.
    #[inline]
    fn valid_epoch(&self) -> Result<Option<u64>> {
        self.live.as_ref().map(|l| l.epoch(&self.dev, self.handle)).transpose()
    }

    /// How many contiguous bus ranges the module found the memory in.
    pub(crate) fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Bytes `[off, off + len)` of the registration for one command: checked alive first where
    /// its exporter may revoke it, and then valid only in the controller epoch of that check.
    ///
    /// # Safety
    ///
    /// As [`DmaRange::new`], except that the registration's liveness is checked here.
    #[inline]
    pub(crate) unsafe fn range(&self, off: u64, len: u64) -> Result<DmaRange<'_>> {
        // SAFETY: the caller's contract; a revocable registration is named only in the epoch it
        // was found alive in (a revocation resets the controller first, moving the epoch on).
        let r = unsafe { DmaRange::new(&self.segments, off, len) };
        Ok(match self.valid_epoch()? {
            None => r,
            Some(epoch) => r.only_in(epoch),
        })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.dev.born.in_child() {
            // The parent's registration: deregistering it from here would unpin the parent's
            // memory under its commands (the module refuses a non-opener anyway).
            return;
        }
        let mut d = Deregister { id: self.handle.id, generation: self.handle.generation };
        // SAFETY: no command names the registration any more: its buffer drops it only with no
        // I/O lease outstanding, and a command that may still run keeps its lease for good (an
        // `InFlight` token) unless a reset confirmed the controller stopped.
        let _ = unsafe { self.dev.fd.ioctl_unchecked(req::Deregister, &mut d) };
    }
}

//! Whether a dma-buf registration may still be named in a command.
//!
//! The exporter of device memory may revoke it at any time (vfio-pci when its device is reset, a
//! GPU driver moving memory). The module then resets the controller before the mapping goes
//! (no command of before can run), counts the revocation in the status page and refuses the
//! registration's segments from then on (`EKEYREVOKED`). Here, a registration is checked once
//! per controller epoch: in the epoch it was last checked in, its segments are valid; after an
//! epoch change it is asked again, with a system call only when a revocation was counted since.
//! Commands carry the epoch they were checked in ([`crate::cmd::DmaRange::only_in`]), and a
//! queue refuses them in any other epoch.

use super::Inner;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use ugds_uapi::ioctl::{RegistrationHandle, Segment};

/// The liveness of one revocable registration.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// The epoch it was last known alive in (0: never checked; epochs start at 1).
    epoch: AtomicU64,
    /// The status page's revocation count at that check.
    revocations: AtomicU64,
    /// Revoked: for good.
    revoked: AtomicBool,
}

impl Liveness {
    /// Starts checked in the epoch and revocation count read before the registration was made
    /// (a revocation after that moves at least one of them).
    pub(crate) fn checked_at(epoch: u64, revocations: u64) -> Liveness {
        Liveness {
            epoch: AtomicU64::new(epoch),
            revocations: AtomicU64::new(revocations),
            revoked: AtomicBool::new(false),
        }
    }

    /// The epoch in which the registration may be named: the current one, once it is known
    /// alive in it; [`Error::Revoked`] once its exporter revoked it.
    #[inline]
    pub(crate) fn epoch(&self, dev: &Inner, handle: RegistrationHandle) -> Result<u64> {
        let epoch = dev.status.state().epoch();
        if self.epoch.load(Ordering::Acquire) == epoch {
            return Ok(epoch);
        }
        self.recheck(dev, handle, epoch)
    }

    /// A new epoch: alive unless a revocation was counted since the last check and the module
    /// says it was this one. The epoch was read first: the module counts a revocation before
    /// it publishes the epoch of its reset, so a revocation not seen here comes with a later
    /// epoch, in which a command checked now is refused.
    #[cold]
    fn recheck(&self, dev: &Inner, handle: RegistrationHandle, epoch: u64) -> Result<u64> {
        if self.revoked.load(Ordering::Acquire) {
            return Err(Error::Revoked);
        }
        let revocations = dev.status.revocations();
        if revocations != self.revocations.load(Ordering::Acquire) && is_revoked(dev, handle)? {
            self.revoked.store(true, Ordering::Release);
            return Err(Error::Revoked);
        }
        self.revocations.store(revocations, Ordering::Release);
        self.epoch.store(epoch, Ordering::Release);
        Ok(epoch)
    }
}

/// Asks the module whether the registration was revoked (its first segment: `EKEYREVOKED`).
fn is_revoked(dev: &Inner, handle: RegistrationHandle) -> Result<bool> {
    match dev.segments_into(handle, &mut [Segment::default()]) {
        Ok(_) => Ok(false),
        Err(Error::Control { source, .. }) if source.raw_os_error() == Some(libc::EKEYREVOKED) => Ok(true),
        Err(e) => Err(e),
    }
}

//! Registrations: memory an open file made reachable by the controller, with the generation user
//! space names it by (its id is its slot in the controller's table plus one, found in constant
//! time; the generation tells a reused slot apart).

use crate::shim::chrdev::FileHandle;
use crate::shim::dmabuf::DmabufMapping;
use crate::shim::pin::PinnedUserMemory;
use crate::shim::task::LockedCharge;
use crate::uapi::ioctl::Segment;

/// What backs a registration.
pub(crate) enum Backing {
    /// Pinned host pages of the owner's address space, charged to it (`locked_vm`). Fields
    /// drop in order: the pages are unmapped and unpinned, then the charge is returned (which
    /// takes the owner's `mmap_lock`: never drop a registration under the controller mutex).
    Host {
        /// The pinned, mapped pages.
        mem: PinnedUserMemory,
        /// Their charge to the opener's `locked_vm`.
        _charge: LockedCharge,
    },
    /// An imported dma-buf range (GPU memory, udmabuf, a dma-heap buffer).
    Dmabuf(DmabufMapping),
}

/// One registration.
pub(crate) struct Registration {
    /// The open file that made it.
    pub(crate) owner: FileHandle,
    /// Generation, unique per controller: a stale (id, generation) never matches a new one.
    pub(crate) generation: u32,
    /// The memory.
    pub(crate) backing: Backing,
}

impl Registration {
    /// DMA segments.
    pub(crate) fn segments(&self) -> &[Segment] {
        match &self.backing {
            Backing::Host { mem, .. } => mem.segments(),
            Backing::Dmabuf(d) => d.segments(),
        }
    }

    /// Whether an exporter revoked it (its segments are stale: the controller was reset first).
    pub(crate) fn revoked(&self) -> bool {
        match &self.backing {
            Backing::Host { .. } => false,
            Backing::Dmabuf(d) => d.revoked(),
        }
    }

    /// Pinned pages (for the counters).
    pub(crate) fn npages(&self) -> usize {
        match &self.backing {
            Backing::Host { mem, .. } => mem.npages(),
            Backing::Dmabuf(d) => d.npages(),
        }
    }
}

//! Registrations: memory an open file made reachable by the controller, with the id and
//! generation user space names it by.

use crate::shim::chrdev::FileHandle;
use crate::shim::dmabuf::DmabufMapping;
use crate::shim::pin::PinnedUserMemory;
use crate::uapi::ioctl::Segment;

/// What backs a registration.
pub(crate) enum Backing {
    /// Pinned host pages of the owner's address space.
    Host(PinnedUserMemory),
    /// An imported dma-buf range (GPU memory, udmabuf, a dma-heap buffer).
    Dmabuf(DmabufMapping),
}

/// One registration.
pub(crate) struct Registration {
    /// The open file that made it.
    pub(crate) owner: FileHandle,
    /// Id, unique among the owner's live registrations.
    pub(crate) id: u32,
    /// Generation, unique per controller: a stale (id, generation) never matches a new one.
    pub(crate) generation: u32,
    /// The memory.
    pub(crate) backing: Backing,
}

impl Registration {
    /// DMA segments.
    pub(crate) fn segments(&self) -> &[Segment] {
        match &self.backing {
            Backing::Host(p) => p.segments(),
            Backing::Dmabuf(d) => d.segments(),
        }
    }

    /// Pinned pages (for the counters).
    pub(crate) fn npages(&self) -> usize {
        match &self.backing {
            Backing::Host(p) => p.npages(),
            Backing::Dmabuf(d) => d.npages(),
        }
    }
}

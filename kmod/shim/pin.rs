//! Pinned, DMA-mapped user memory: `pin_user_pages_fast(FOLL_LONGTERM)`, a scatter-gather table,
//! `dma_map_sgtable` for the controller. Undone in reverse order on drop.

use super::dma::DMA_BIDIRECTIONAL;
use super::pci::Device;
use super::scatterlist::dma_segments;
use crate::bindings;
use crate::uapi::ioctl::Segment;
use kernel::prelude::*;

// From the target kernel's headers (bindgen), not copied values.
const FOLL_WRITE: u32 = bindings::FOLL_WRITE as u32;
const FOLL_LONGTERM: u32 = bindings::FOLL_LONGTERM as u32;
/// Largest scatter-gather segment: 2 GiB, page aligned, fits the 32-bit length field.
const MAX_SEGMENT: u32 = 1 << 31;

/// User pages pinned and mapped for one device.
///
/// # Invariants
///
/// `pages[..]` are pinned (`pin_user_pages_fast`), `sgt` describes them and is DMA-mapped for
/// `dev` with `DMA_BIDIRECTIONAL`; all undone exactly once in `Drop`.
pub(crate) struct PinnedUserMemory {
    dev: Device,
    pages: KVVec<*mut bindings::page>,
    sgt: bindings::sg_table,
    segments: KVVec<Segment>,
}

// SAFETY: page pointers and the table are only touched in `Drop` (needs ownership) and
// `segments` is plain data.
unsafe impl Send for PinnedUserMemory {}
// SAFETY: `&self` only reads `segments`.
unsafe impl Sync for PinnedUserMemory {}

impl PinnedUserMemory {
    /// Pins `[addr, addr + len)` (both page aligned, already validated by the caller) of the
    /// current process and maps it for `dev`.
    ///
    /// Errors: `EFAULT` when part of the range is not mapped user memory, `ENOMEM`.
    pub(crate) fn pin(dev: &Device, addr: u64, len: u64) -> Result<Self> {
        let npages = (len / 4096) as usize;
        let nr = i32::try_from(npages).map_err(|_| EINVAL)?;
        let mut pages: KVVec<*mut bindings::page> = KVVec::from_elem(core::ptr::null_mut(), npages, GFP_KERNEL)?;
        // SAFETY: `pages` has room for `npages` pointers; the range is user memory of the
        // current process (validated page-aligned by the caller; the core checks access).
        let got =
            unsafe { bindings::pin_user_pages_fast(addr as _, nr, FOLL_WRITE | FOLL_LONGTERM, pages.as_mut_ptr()) };
        if got < 0 {
            return Err(Error::from_errno(got));
        }
        if got as usize != npages {
            // SAFETY: exactly these `got` pages were pinned above.
            unsafe { bindings::unpin_user_pages(pages.as_mut_ptr(), got as _) };
            return Err(EFAULT);
        }
        // SAFETY: an all-zero sg_table is the empty table sg_alloc_* expects.
        let mut sgt: bindings::sg_table = unsafe { core::mem::zeroed() };
        // SAFETY: `pages` holds `npages` pinned pages; `sgt` is empty.
        let ret = unsafe {
            bindings::sg_alloc_table_from_pages_segment(
                &mut sgt,
                pages.as_mut_ptr(),
                npages as _,
                0,
                len as _,
                MAX_SEGMENT,
                kernel::bindings::GFP_KERNEL,
            )
        };
        if ret != 0 {
            // SAFETY: the pages were pinned above and nothing else refers to them.
            unsafe { bindings::unpin_user_pages(pages.as_mut_ptr(), npages as _) };
            return Err(Error::from_errno(ret));
        }
        // SAFETY: `sgt` was just built; the device is live.
        let ret = unsafe { bindings::dma_map_sgtable(dev.as_device_ptr(), &mut sgt, DMA_BIDIRECTIONAL, 0) };
        if ret != 0 {
            // SAFETY: undo the table and the pins, in reverse order.
            unsafe {
                bindings::sg_free_table(&mut sgt);
                bindings::unpin_user_pages(pages.as_mut_ptr(), npages as _);
            }
            return Err(Error::from_errno(ret));
        }
        // INVARIANT: pinned, tabled and mapped. From here `Drop` undoes everything.
        let mut me = PinnedUserMemory { dev: dev.clone(), pages, sgt, segments: KVVec::new() };
        me.collect_segments()?;
        Ok(me)
    }

    fn collect_segments(&mut self) -> Result {
        // SAFETY: `sgt` is DMA-mapped for as long as `self` lives (invariant).
        for (dma_addr, len) in unsafe { dma_segments(&self.sgt) } {
            self.segments.push(Segment { dma_addr, len }, GFP_KERNEL)?;
        }
        Ok(())
    }

    /// The DMA segments, in address order of the user range.
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Number of pinned pages.
    pub(crate) fn npages(&self) -> usize {
        self.pages.len()
    }
}

/// Makes the unmapping of this device's DMA addresses take effect now. A DMA domain with a flush
/// queue (`iommu.strict=0`, the x86 default) clears the IOMMU page tables at unmap time but
/// invalidates the IOTLB later, in batches; until then the device could still reach the pages
/// through a stale IOTLB entry. Callers unpin or release the memory right after, so they flush
/// first: a late DMA then faults instead of landing in memory that may be reused. Strict domains
/// (and no IOMMU) need nothing.
pub(super) fn flush_deferred_iotlb(dev: &Device) {
    #[cfg(CONFIG_IOMMU_API)]
    // SAFETY: the device is live; its domain (if any) lives while the device is bound to us, and
    // `flush_iotlb_all` is the domain driver's own operation for exactly this (what the kernel's
    // static inline `iommu_flush_iotlb_all` calls).
    unsafe {
        let d = bindings::iommu_get_domain_for_dev(dev.as_device_ptr());
        if !d.is_null() && (*d).type_ & bindings::__IOMMU_DOMAIN_DMA_FQ != 0 && !(*d).ops.is_null() {
            if let Some(flush) = (*(*d).ops).flush_iotlb_all {
                flush(d);
            }
        }
    }
    #[cfg(not(CONFIG_IOMMU_API))]
    let _ = dev;
}

impl Drop for PinnedUserMemory {
    /// The controller must no longer access this memory (no command naming it can run).
    fn drop(&mut self) {
        // SAFETY: by the invariant the table is mapped for `dev` and the pages are pinned; each
        // is undone exactly once, in reverse order.
        unsafe {
            bindings::dma_unmap_sg_attrs(
                self.dev.as_device_ptr(),
                self.sgt.sgl,
                self.sgt.orig_nents as _,
                DMA_BIDIRECTIONAL,
                0,
            );
        }
        // Before the pages go back: no late DMA through a stale IOTLB entry.
        flush_deferred_iotlb(&self.dev);
        // SAFETY: as above; the table is unmapped now.
        unsafe {
            bindings::sg_free_table(&mut self.sgt);
            bindings::unpin_user_pages(self.pages.as_mut_ptr(), self.pages.len() as _);
        }
    }
}

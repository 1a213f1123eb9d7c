//! Walking the DMA side of a mapped scatter-gather table (shaped like upstream
//! `kernel::scatterlist::SGTable::iter`, 6.17+, which yields entries with `dma_address()` and
//! `dma_len()`).

use crate::bindings;
use core::marker::PhantomData;

/// The mapped entries of an `sg_table` as (device address, length) pairs, following chained
/// tables.
///
/// # Invariants
///
/// `sg` is null or an entry of a DMA-mapped table borrowed for `'a` that stays mapped while
/// this iterator lives; `left` of its mapped entries remain, starting at `sg`.
pub(super) struct DmaSegments<'a> {
    sg: *mut bindings::scatterlist,
    left: u32,
    _table: PhantomData<&'a bindings::sg_table>,
}

/// The mapped entries of `sgt` (its first `nents` entries carry device addresses).
///
/// # Safety
///
/// `sgt` must be DMA-mapped (`dma_map_sgtable`, or the table an exporter's
/// `dma_buf_map_attachment` returned) and stay mapped while the iterator is used.
pub(super) unsafe fn dma_segments(sgt: &bindings::sg_table) -> DmaSegments<'_> {
    // INVARIANT: the caller's contract; `sgl` starts the `nents` mapped entries.
    DmaSegments { sg: sgt.sgl, left: sgt.nents, _table: PhantomData }
}

impl Iterator for DmaSegments<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        if self.left == 0 || self.sg.is_null() {
            return None;
        }
        // SAFETY: `sg` is a mapped entry of a live, mapped table (invariant).
        let seg = unsafe { ((*self.sg).dma_address, (*self.sg).dma_length as u64) };
        self.left -= 1;
        // SAFETY: `sg` is an entry of that table.
        // INVARIANT: one entry consumed, `left` counts down with it.
        self.sg = unsafe { sg_next(self.sg) };
        Some(seg)
    }
}

/// The entry after `sg`, following a chain link, or null after the last entry: C's `sg_next`
/// (exported on 6.12, a static inline on 7.3), from the `page_link` bits of the target kernel's
/// include/linux/scatterlist.h.
///
/// # Safety
///
/// `sg` is an entry of a live scatterlist table.
unsafe fn sg_next(sg: *mut bindings::scatterlist) -> *mut bindings::scatterlist {
    let (chain, end) = (bindings::SG_CHAIN as usize, bindings::SG_END as usize);
    // SAFETY: `sg` is a live entry (contract).
    if unsafe { (*sg).page_link } as usize & end != 0 {
        return core::ptr::null_mut();
    }
    // SAFETY: an entry that is not the last is followed by another entry or a chain link in
    // the same array.
    let next = unsafe { sg.add(1) };
    // SAFETY: `next` is an entry of the array (above).
    let link = unsafe { (*next).page_link } as usize;
    if link & chain != 0 {
        // CAST: a chain link's `page_link` is the next array's address with the flag bits set.
        (link & !(chain | end)) as *mut bindings::scatterlist
    } else {
        next
    }
}

//! Coherent DMA memory, typed (shaped like upstream `kernel::dma::CoherentAllocation<T>`, 6.14+).
//!
//! A `CoherentAllocation<T>` is an array of `T` shared with the device: the controller reads and
//! writes it whenever it likes, so every CPU access is volatile, element by element or field by
//! field ([`dma_read!`], [`dma_write!`]); no `&`/`&mut` to its contents is ever handed out.

use super::pci::Device;
use super::Plain;
use crate::bindings;
use core::mem::size_of;
use core::ptr::NonNull;
use kernel::page::PAGE_SIZE;
use kernel::prelude::*;

/// DMA_BIDIRECTIONAL (bindgen, from the target kernel's headers; upstream
/// `DataDirection::Bidirectional`): the controller both reads memory (writes to disk) and writes
/// it (reads from disk).
pub(super) const DMA_BIDIRECTIONAL: bindings::dma_data_direction = bindings::dma_data_direction_DMA_BIDIRECTIONAL;

/// A bus address the device uses to reach memory.
pub(crate) type DmaAddress = bindings::dma_addr_t;

/// `count` elements of `T` in coherent DMA memory of one device, zeroed when allocated.
///
/// # Invariants
///
/// `cpu` and `dma` are the CPU and device addresses of a live `dma_alloc_attrs` allocation of
/// `size` bytes for `dev`, freed only in `Drop`. `size` is a whole number of pages and at least
/// `count * size_of::<T>()`; `cpu` is page aligned (the DMA API aligns coherent allocations to
/// at least a page), so every element is aligned for `T` (whose alignment is at most a page).
pub(crate) struct CoherentAllocation<T: Plain> {
    dev: Device,
    cpu: NonNull<T>,
    dma: DmaAddress,
    count: usize,
    size: usize,
}

// SAFETY: `T` is plain data (no pointers, no thread affinity); freeing needs ownership and
// works from any thread.
unsafe impl<T: Plain> Send for CoherentAllocation<T> {}
// SAFETY: `&CoherentAllocation` allows only volatile, in-bounds element and field accesses, which
// the kernel memory model treats like READ_ONCE/WRITE_ONCE (the device accesses this memory
// concurrently in any case); no reference into the memory is handed out.
unsafe impl<T: Plain> Sync for CoherentAllocation<T> {}

impl<T: Plain> CoherentAllocation<T> {
    /// Allocates `count` zeroed elements (the allocation is rounded up to whole pages, all of
    /// which a user mapping covers, through [`CoherentAllocation::pfn`]).
    pub(crate) fn alloc_coherent(dev: &Device, count: usize) -> Result<Self> {
        const { assert!(size_of::<T>() != 0 && core::mem::align_of::<T>() <= PAGE_SIZE) };
        if count == 0 {
            return Err(EINVAL);
        }
        let size =
            count.checked_mul(size_of::<T>()).and_then(|b| b.checked_next_multiple_of(PAGE_SIZE)).ok_or(EINVAL)?;
        let mut dma: DmaAddress = 0;
        // SAFETY: the device is live (`Device` holds a reference); `dma` is a valid out pointer.
        let cpu = unsafe {
            bindings::dma_alloc_attrs(
                dev.as_device_ptr(),
                size,
                &mut dma,
                kernel::bindings::GFP_KERNEL | kernel::bindings::__GFP_ZERO,
                0,
            )
        };
        let cpu = NonNull::new(cpu.cast::<T>()).ok_or(ENOMEM)?;
        // INVARIANT: a fresh, page-aligned allocation of `size >= count * size_of::<T>()` bytes.
        Ok(CoherentAllocation { dev: dev.clone(), cpu, dma, count, size })
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Size of the allocation in bytes (whole pages): what `mmap` maps.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The device address of element 0.
    pub(crate) fn dma_handle(&self) -> DmaAddress {
        self.dma
    }

    /// A pointer to element `index`, for [`dma_read!`] and [`dma_write!`], which project it to a
    /// field and access that volatile; `EINVAL` when out of bounds.
    pub(crate) fn item_from_index(&self, index: usize) -> Result<*mut T> {
        if index >= self.count {
            return Err(EINVAL);
        }
        // SAFETY: `index < count`, so the offset stays inside the allocation (invariant).
        Ok(unsafe { self.cpu.as_ptr().add(index) })
    }

    /// Reads element `index` (volatile).
    pub(crate) fn read(&self, index: usize) -> Result<T> {
        let item = self.item_from_index(index)?;
        // SAFETY: `item` is an in-bounds, aligned element of the live allocation; any bits are a
        // valid `T` (`Plain`).
        Ok(unsafe { self.field_read(item) })
    }

    /// Writes element `index` (volatile).
    pub(crate) fn write(&self, index: usize, value: &T) -> Result {
        let item = self.item_from_index(index)?;
        // SAFETY: `item` is an in-bounds, aligned element of the live allocation.
        unsafe { self.field_write(item, *value) };
        Ok(())
    }

    /// Reads the value at `field` (volatile). Use [`dma_read!`], which builds `field` safely.
    ///
    /// # Safety
    ///
    /// `field` must be derived from [`CoherentAllocation::item_from_index`] of this allocation
    /// and point to (a field of) that element, aligned for `F`.
    pub(crate) unsafe fn field_read<F: Plain>(&self, field: *const F) -> F {
        // SAFETY: in bounds and aligned (the caller's contract); the memory is live while `self`
        // is, and initialised (zeroed at allocation, then written only with plain values); any
        // bits are a valid `F` (`Plain`).
        unsafe { core::ptr::read_volatile(field) }
    }

    /// Writes `value` at `field` (volatile). Use [`dma_write!`], which builds `field` safely.
    ///
    /// # Safety
    ///
    /// As for [`CoherentAllocation::field_read`].
    pub(crate) unsafe fn field_write<F: Plain>(&self, field: *mut F, value: F) {
        // SAFETY: in bounds and aligned (the caller's contract); the memory is live while `self`
        // is and only ever accessed volatile, so no reference to it is invalidated.
        unsafe { core::ptr::write_volatile(field, value) }
    }

    /// The page frame number of the page at byte `offset` (for a user mapping filled at fault
    /// time); `EINVAL` past the allocation. The frame stays this allocation's until it drops:
    /// whoever maps it must revoke the mapping first.
    pub(crate) fn pfn(&self, offset: u64) -> Result<u64> {
        let off = usize::try_from(offset).map_err(|_| EINVAL)?;
        if off >= self.size {
            return Err(EINVAL);
        }
        // SAFETY: `cpu + off` lies inside the live allocation (invariant, checked above). The
        // page-table walk of `slow_virt_to_phys` serves both kinds of coherent memory the DMA
        // API hands out: the linear map (dma-direct) and remapped pages (iommu-dma).
        let phys = unsafe { bindings::slow_virt_to_phys(self.cpu.as_ptr().cast::<u8>().add(off).cast()) };
        Ok(phys >> kernel::page::PAGE_SHIFT)
    }
}

impl<T: Plain> Drop for CoherentAllocation<T> {
    /// The device must have stopped using this memory (its queue deleted, or the controller
    /// disabled with CSTS.RDY=0 observed: docs/design.md, memory invariant 2) and no user mapping
    /// of it may remain. An owner that cannot confirm that must leak the allocation
    /// (`core::mem::forget`) instead of dropping it.
    fn drop(&mut self) {
        // SAFETY: by the invariant the allocation is live; freed exactly once, here.
        unsafe { bindings::dma_free_attrs(self.dev.as_device_ptr(), self.size, self.cpu.as_ptr().cast(), self.dma, 0) };
    }
}

/// Reads element `idx`, or a field of it, of a [`CoherentAllocation`] (volatile):
/// `dma_read!(alloc[idx])`, `dma_read!(self.buf[0].field.sub)`. Evaluates to `Result<F>`
/// (`EINVAL` when `idx` is out of bounds). The allocation must be named by a path of
/// identifiers (it is evaluated twice).
macro_rules! dma_read {
    ($($alloc:ident).+ [ $idx:expr ] $(.$field:ident)*) => {
        match $($alloc).+.item_from_index($idx) {
            ::core::result::Result::Ok(item) => ::core::result::Result::Ok(
                // SAFETY: `item` points to an in-bounds, aligned element of the allocation; the
                // projection names one of its fields (the compiler checks it), so the pointer
                // stays inside that element and is aligned for the field's type.
                unsafe { $($alloc).+.field_read(::core::ptr::addr_of!((*item)$(.$field)*)) },
            ),
            ::core::result::Result::Err(e) => ::core::result::Result::Err(e),
        }
    };
}
pub(crate) use dma_read;

/// Writes element `idx`, or a field of it, of a [`CoherentAllocation`] (volatile):
/// `dma_write!(self.status[0].epoch = value)`. Evaluates to `Result` (`EINVAL` when `idx` is out
/// of bounds). The allocation must be named by a path of identifiers (it is evaluated twice).
macro_rules! dma_write {
    ($($alloc:ident).+ [ $idx:expr ] $(.$field:ident)* = $val:expr) => {
        match $($alloc).+.item_from_index($idx) {
            ::core::result::Result::Ok(item) => {
                // Evaluated outside the `unsafe` block below.
                let value = $val;
                // SAFETY: `item` points to an in-bounds, aligned element of the allocation; the
                // projection names one of its fields (the compiler checks it), so the pointer
                // stays inside that element and is aligned for the field's type.
                unsafe { $($alloc).+.field_write(::core::ptr::addr_of_mut!((*item)$(.$field)*), value) };
                ::core::result::Result::Ok(())
            }
            ::core::result::Result::Err(e) => ::core::result::Result::Err(e),
        }
    };
}
pub(crate) use dma_write;

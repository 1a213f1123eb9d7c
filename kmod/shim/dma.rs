//! Coherent DMA memory (shaped like upstream `kernel::dma::CoherentAllocation`).
//!
//! The memory is shared with the device, so every CPU access is volatile and field by field;
//! no `&`/`&mut` to its contents is ever handed out.

use crate::bindings;
use crate::shim::chrdev::Vma;
use crate::shim::pci::Device;
use kernel::prelude::*;

/// A coherent DMA allocation for one device.
///
/// # Invariants
///
/// `cpu` is the CPU address and `dma` the device address of a live `dma_alloc_attrs`
/// allocation of `size` bytes for `dev`, freed only in `Drop`.
pub(crate) struct CoherentAllocation {
    dev: Device,
    cpu: *mut u8,
    dma: u64,
    size: usize,
}

// SAFETY: the allocation is plain memory; all CPU accesses are volatile and need no thread
// affinity; freeing needs ownership.
unsafe impl Send for CoherentAllocation {}
// SAFETY: `&CoherentAllocation` only allows volatile accesses within bounds.
unsafe impl Sync for CoherentAllocation {}

impl CoherentAllocation {
    /// Allocates `size` zeroed bytes (rounded up to whole pages).
    pub(crate) fn alloc(dev: &Device, size: usize) -> Result<Self> {
        let size = size.checked_next_multiple_of(4096).ok_or(EINVAL)?;
        if size == 0 {
            return Err(EINVAL);
        }
        let mut dma: bindings::dma_addr_t = 0;
        // SAFETY: the device is live; `dma` is a valid out pointer.
        let cpu = unsafe {
            bindings::dma_alloc_attrs(dev.as_device_ptr(), size, &mut dma, kernel::bindings::GFP_KERNEL | kernel::bindings::__GFP_ZERO, 0)
        }
        .cast::<u8>();
        if cpu.is_null() {
            return Err(ENOMEM);
        }
        // INVARIANT: a fresh allocation of `size` bytes.
        Ok(CoherentAllocation { dev: dev.clone(), cpu, dma, size })
    }

    /// The device (bus) address.
    pub(crate) fn dma_handle(&self) -> u64 {
        self.dma
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    fn check(&self, off: usize, len: usize, align: usize) -> Result {
        if off % align != 0 || off.checked_add(len).map_or(true, |e| e > self.size) {
            return Err(EINVAL);
        }
        Ok(())
    }

    /// Volatile 32-bit read at `off`.
    pub(crate) fn read32(&self, off: usize) -> Result<u32> {
        self.check(off, 4, 4)?;
        // SAFETY: in bounds and aligned (checked); the memory is live by the invariant.
        Ok(unsafe { core::ptr::read_volatile(self.cpu.add(off).cast::<u32>()) })
    }

    /// Volatile 32-bit write at `off`.
    pub(crate) fn write32(&self, off: usize, v: u32) -> Result {
        self.check(off, 4, 4)?;
        // SAFETY: in bounds and aligned (checked); the memory is live by the invariant.
        unsafe { core::ptr::write_volatile(self.cpu.add(off).cast::<u32>(), v) };
        Ok(())
    }

    /// Volatile 64-bit write at `off`.
    pub(crate) fn write64(&self, off: usize, v: u64) -> Result {
        self.check(off, 8, 8)?;
        // SAFETY: in bounds and aligned (checked); the memory is live by the invariant.
        unsafe { core::ptr::write_volatile(self.cpu.add(off).cast::<u64>(), v) };
        Ok(())
    }

    /// Copies `dst.len()` bytes out from `off` (volatile, byte by byte order unspecified).
    pub(crate) fn read_bytes(&self, off: usize, dst: &mut [u8]) -> Result {
        self.check(off, dst.len(), 1)?;
        for (i, b) in dst.iter_mut().enumerate() {
            // SAFETY: in bounds (checked above).
            *b = unsafe { core::ptr::read_volatile(self.cpu.add(off + i)) };
        }
        Ok(())
    }

    /// Maps the whole allocation into `vma` (which must be exactly `size` bytes).
    ///
    /// # Safety
    ///
    /// `vma` must be the VMA being set up by the `mmap` file operation that calls this, and the
    /// caller must zap the mapping (`unmap_mapping_range`) before this allocation is dropped.
    pub(crate) unsafe fn mmap(&self, vma: &mut Vma) -> Result {
        if vma.len() != self.size {
            return Err(EINVAL);
        }
        let raw = vma.as_raw();
        // dma_mmap_attrs reads vm_pgoff as an offset into the buffer; ours encodes the region,
        // so present 0 for the call and restore it (the file offset is what later zaps match).
        // SAFETY: the VMA is live during mmap (caller's contract); the allocation is live and
        // exactly as long as the VMA.
        let ret = unsafe {
            let pgoff = (*raw).vm_pgoff;
            (*raw).vm_pgoff = 0;
            let r = bindings::dma_mmap_attrs(self.dev.as_device_ptr(), raw, self.cpu.cast(), self.dma, self.size, 0);
            (*raw).vm_pgoff = pgoff;
            r
        };
        kernel::error::to_result(ret)
    }
}

impl Drop for CoherentAllocation {
    /// The device must no longer access this memory (its queue deleted or the controller
    /// disabled) and no user mapping of it may remain.
    fn drop(&mut self) {
        // SAFETY: by the invariant the allocation is live; freed exactly once here.
        unsafe { bindings::dma_free_attrs(self.dev.as_device_ptr(), self.size, self.cpu.cast(), self.dma, 0) };
    }
}

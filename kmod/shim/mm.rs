//! The VMA that an `mmap` file operation sets up (shaped like upstream
//! `kernel::mm::virt::VmaNew`, 6.16+: flags, offset, length, clearing `VM_MAYWRITE`).

use crate::bindings;
use core::ptr::NonNull;
use kernel::prelude::*;

/// VMA flag bits, from the target kernel's include/linux/mm.h (bindgen).
const VM_WRITE: u64 = bindings::VM_WRITE as u64;
const VM_SHARED: u64 = bindings::VM_SHARED as u64;
const VM_MAYWRITE: u64 = bindings::VM_MAYWRITE as u64;

/// Page shift of `vm_pgoff`.
const PAGE_SHIFT: u32 = kernel::page::PAGE_SHIFT as u32;

/// A VMA being set up by the `mmap` file operation.
///
/// # Invariants
///
/// `ptr` is the VMA passed to the `mmap` file operation that is running now. `->mmap` runs
/// before the VMA is stored in the VMA tree (6.12 mm/mmap.c: `mmap_file` precedes
/// `vma_iter_store`/`vma_link_file`), so it is live and has no other user; a `Vma` is only lent
/// (`&mut`) to `FileOps::mmap` for that call and never outlives it.
pub(crate) struct Vma {
    ptr: NonNull<bindings::vm_area_struct>,
}

impl Vma {
    /// Wraps the VMA of the running `mmap` file operation.
    ///
    /// # Safety
    ///
    /// `ptr` must be the VMA passed to the `mmap` file operation running now, and the `Vma` must
    /// not outlive that call.
    pub(super) unsafe fn from_raw(ptr: NonNull<bindings::vm_area_struct>) -> Self {
        // INVARIANT: the caller's contract.
        Vma { ptr }
    }

    fn raw(&self) -> *mut bindings::vm_area_struct {
        self.ptr.as_ptr()
    }

    fn flags(&self) -> u64 {
        // SAFETY: the VMA is live and unshared (invariant).
        unsafe { (*self.raw()).__bindgen_anon_2.__vm_flags as u64 }
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        // SAFETY: the VMA is live and unshared (invariant).
        unsafe {
            let a = (*self.raw()).__bindgen_anon_1.__bindgen_anon_1;
            (a.vm_end - a.vm_start) as usize
        }
    }

    /// The file offset it maps, in bytes.
    pub(crate) fn offset(&self) -> u64 {
        // SAFETY: the VMA is live and unshared (invariant).
        (unsafe { (*self.raw()).vm_pgoff } as u64) << PAGE_SHIFT
    }

    /// True when the mapping is shared (MAP_SHARED); private mappings are refused.
    pub(crate) fn is_shared(&self) -> bool {
        self.flags() & VM_SHARED != 0
    }

    /// True when the mapping asks for write access.
    pub(crate) fn is_writable(&self) -> bool {
        self.flags() & VM_WRITE != 0
    }

    /// Forbids a later mprotect to writable (clears `VM_MAYWRITE`).
    pub(crate) fn deny_write(&mut self) {
        // SAFETY: the VMA is not yet in the VMA tree (invariant), so it has no other user and
        // needs no VMA lock: exactly the case the kernel's own `__vm_flags_mod` (a plain update
        // through `vm_flags_init`) is for; `vm_flags_clear` would only add the per-VMA write
        // lock that an unreachable VMA does not need.
        unsafe { (*self.raw()).__bindgen_anon_2.__vm_flags &= !(VM_MAYWRITE as bindings::vm_flags_t) };
    }

    /// Runs `f` on the raw VMA with `vm_pgoff` reading 0, then restores it. `dma_mmap_attrs`
    /// and `vm_iomap_memory` read `vm_pgoff` as an offset into the memory they map; ours encodes
    /// which region is mapped, and the file offset is what later zaps match, so it must stay.
    pub(super) fn with_zero_pgoff<R>(&mut self, f: impl FnOnce(*mut bindings::vm_area_struct) -> R) -> R {
        let raw = self.raw();
        // SAFETY: the VMA is live and unshared (invariant).
        let pgoff = unsafe { core::mem::replace(&mut (*raw).vm_pgoff, 0) };
        let r = f(raw);
        // SAFETY: the VMA is live and unshared for the whole `mmap` call (invariant).
        unsafe { (*raw).vm_pgoff = pgoff };
        r
    }

    /// Maps `len` bytes of device memory at physical `phys` uncached (UC-).
    ///
    /// # Safety
    ///
    /// `[phys, phys + len)` must be MMIO the caller owns, and the caller must zap the mapping
    /// before giving that MMIO up.
    pub(super) unsafe fn map_io_uncached(&mut self, phys: u64, len: usize) -> Result {
        // SAFETY: the VMA is live and not yet visible (invariant); adding the UC- cache bits to
        // its protection is what pgprot_noncached does on x86.
        unsafe {
            let uc = bindings::cachemode2protval(bindings::page_cache_mode__PAGE_CACHE_MODE_UC_MINUS);
            (*self.raw()).vm_page_prot.pgprot |= uc as bindings::pgprotval_t;
        }
        let ret = self.with_zero_pgoff(|raw| {
            // SAFETY: the caller owns the MMIO range; vm_iomap_memory checks the VMA fits it.
            unsafe { bindings::vm_iomap_memory(raw, phys as _, len as _) }
        });
        kernel::error::to_result(ret)
    }
}

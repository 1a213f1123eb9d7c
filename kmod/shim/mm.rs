//! The VMA that an `mmap` file operation sets up (shaped like upstream
//! `kernel::mm::virt::VmaNew`, 6.16+: flags, offset, length, clearing `VM_MAYWRITE`), and the page
//! fault that later fills it (VFIO's `vfio_pci_mmap_fault` pattern: pages are inserted at fault
//! time under the lock that revocation takes, never at mmap time).

use super::chrdev::VmOpsTable;
use crate::bindings;
use core::ptr::NonNull;
use kernel::prelude::*;

/// VMA flag bits, from the target kernel's include/linux/mm.h (bindgen, through the constants
/// of bindings_helper.h).
const VM_WRITE: u64 = bindings::UGDS_VM_WRITE as u64;
const VM_SHARED: u64 = bindings::UGDS_VM_SHARED as u64;
const VM_MAYWRITE: u64 = bindings::UGDS_VM_MAYWRITE as u64;
const VM_IO: u64 = bindings::UGDS_VM_IO as u64;
const VM_PFNMAP: u64 = bindings::UGDS_VM_PFNMAP as u64;
const VM_DONTEXPAND: u64 = bindings::UGDS_VM_DONTEXPAND as u64;
const VM_DONTCOPY: u64 = bindings::UGDS_VM_DONTCOPY as u64;
const VM_DONTDUMP: u64 = bindings::UGDS_VM_DONTDUMP as u64;

/// The `vm_flags` word of a VMA. Its union member is `__vm_flags` on 6.12 and `vm_flags` on 7.3
/// (where the other member became the `vma_flags_t` bitmap; word 0 is the same bits).
///
/// # Safety
///
/// `vma` points to a live VMA.
unsafe fn vm_flags_word(vma: *mut bindings::vm_area_struct) -> *mut bindings::vm_flags_t {
    #[cfg(ugds_linux_6_12)]
    // SAFETY: `vma` is live (contract); taking a field's address reads nothing.
    let p = unsafe { core::ptr::addr_of_mut!((*vma).__bindgen_anon_2.__vm_flags) };
    #[cfg(not(ugds_linux_6_12))]
    // SAFETY: as above.
    let p = unsafe { core::ptr::addr_of_mut!((*vma).__bindgen_anon_2.vm_flags) };
    p
}

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
        unsafe { *vm_flags_word(self.raw()) as u64 }
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
        unsafe { *vm_flags_word(self.raw()) &= !(VM_MAYWRITE as bindings::vm_flags_t) };
    }

    /// Sets the VMA up to be filled at fault time by `ops` (whose `fault` inserts its pages
    /// under the lock that revocation takes, so a revocation can never miss a mapping made a
    /// moment earlier: VFIO's rule). `tag` is kept in `vm_private_data` for the fault handler
    /// (the file offset of the region the VMA maps; a split VMA keeps it).
    ///
    /// Flags: `VM_IO | VM_PFNMAP` (raw page frames, no struct page references, never pinned by
    /// get_user_pages), `VM_DONTEXPAND` (mremap cannot grow it past what was checked),
    /// `VM_DONTCOPY` (a child made by fork inherits nothing), `VM_DONTDUMP`.
    pub(crate) fn fill_on_fault(&mut self, ops: &'static VmOpsTable, tag: u64) {
        let raw = self.raw();
        // SAFETY: the VMA is not yet in the VMA tree (invariant), so it has no other user; the
        // plain update is what `vm_flags_init` does for such a VMA. `ops` is a static that
        // outlives every VMA.
        unsafe {
            *vm_flags_word(raw) |= (VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTCOPY | VM_DONTDUMP)
                as bindings::vm_flags_t;
            (*raw).vm_ops = ops.as_raw();
            // CAST: a tag, never dereferenced.
            (*raw).vm_private_data = tag as usize as *mut core::ffi::c_void;
        }
    }

    /// Makes the pages this VMA gets uncached (UC-: MMIO such as doorbells).
    pub(crate) fn set_uncached(&mut self) {
        // SAFETY: the VMA is live and not yet visible (invariant); adding the UC- cache bits to
        // its protection is what pgprot_noncached does on x86.
        unsafe {
            let uc = bindings::cachemode2protval(bindings::page_cache_mode__PAGE_CACHE_MODE_UC_MINUS);
            (*self.raw()).vm_page_prot.pgprot |= uc as bindings::pgprotval_t;
        }
    }
}

/// A page fault in a VMA set up by [`Vma::fill_on_fault`].
///
/// # Invariants
///
/// `ptr` is the `vm_fault` of the `fault` callback running now (its VMA is live and read-locked
/// for the call); a `Fault` is only lent to the handler and never outlives the call.
pub(crate) struct Fault {
    ptr: NonNull<bindings::vm_fault>,
}

impl Fault {
    /// The handler's result: pages inserted, nothing for the core to map.
    pub(super) const NOPAGE: bindings::vm_fault_t = bindings::vm_fault_reason_VM_FAULT_NOPAGE as bindings::vm_fault_t;
    /// The handler's result: the mapping is revoked or invalid; the process gets SIGBUS.
    pub(super) const SIGBUS: bindings::vm_fault_t = bindings::vm_fault_reason_VM_FAULT_SIGBUS as bindings::vm_fault_t;
    /// The handler's result: out of memory.
    pub(super) const OOM: bindings::vm_fault_t = bindings::vm_fault_reason_VM_FAULT_OOM as bindings::vm_fault_t;
    /// The error bits of a `vm_fault_t` (`VM_FAULT_ERROR`).
    const ERROR: bindings::vm_fault_t = (bindings::vm_fault_reason_VM_FAULT_OOM
        | bindings::vm_fault_reason_VM_FAULT_SIGBUS
        | bindings::vm_fault_reason_VM_FAULT_SIGSEGV
        | bindings::vm_fault_reason_VM_FAULT_HWPOISON
        | bindings::vm_fault_reason_VM_FAULT_HWPOISON_LARGE
        | bindings::vm_fault_reason_VM_FAULT_FALLBACK) as bindings::vm_fault_t;

    /// Wraps the `vm_fault` of the running `fault` callback.
    ///
    /// # Safety
    ///
    /// `ptr` must be the `vm_fault` passed to the `fault` callback running now, and the `Fault`
    /// must not outlive that call.
    pub(super) unsafe fn from_raw(ptr: NonNull<bindings::vm_fault>) -> Self {
        // INVARIANT: the caller's contract.
        Fault { ptr }
    }

    fn vma(&self) -> *mut bindings::vm_area_struct {
        // SAFETY: the `vm_fault` is live for the call (invariant).
        unsafe { (*self.ptr.as_ptr()).__bindgen_anon_1.vma }
    }

    /// The file the VMA maps (it holds a reference on it).
    pub(super) fn file(&self) -> *mut bindings::file {
        // SAFETY: the VMA is live and read-locked (invariant); `vm_file` does not change.
        unsafe { (*self.vma()).vm_file }
    }

    /// The tag [`Vma::fill_on_fault`] stored.
    pub(crate) fn tag(&self) -> u64 {
        // SAFETY: as in `file`; `vm_private_data` was set at mmap and never changes.
        unsafe { (*self.vma()).vm_private_data as usize as u64 }
    }

    /// Inserts a page frame for every page of the VMA (not only the faulting one, so a mapping
    /// takes one fault in its life): `pfn_of(file offset)` names the frame that backs each
    /// page, or fails (then nothing more is inserted and the error is returned). Call it under
    /// the lock that revocation takes.
    pub(crate) fn fill(&mut self, mut pfn_of: impl FnMut(u64) -> Result<u64>) -> Result {
        let vma = self.vma();
        // SAFETY: the VMA is live and read-locked (invariant): its bounds and offset are stable.
        let (start, end, pgoff) = unsafe {
            let a = (*vma).__bindgen_anon_1.__bindgen_anon_1;
            (a.vm_start, a.vm_end, (*vma).vm_pgoff)
        };
        let mut addr = start;
        while addr < end {
            let off = ((pgoff as u64) << PAGE_SHIFT) + (addr - start) as u64;
            let pfn = pfn_of(off)?;
            // SAFETY: `addr` lies in the live, read-locked VMA, which is `VM_PFNMAP` and shared
            // (set up by `fill_on_fault`, and `mmap` refuses private mappings), as
            // vmf_insert_pfn requires; `pfn` backs memory the caller owns until it revokes the
            // mapping (it holds the lock that revocation takes).
            let ret = unsafe { bindings::vmf_insert_pfn(vma, addr as _, pfn as _) };
            if ret & Self::ERROR != 0 {
                return Err(if ret & Self::OOM != 0 { ENOMEM } else { EFAULT });
            }
            addr += 1 << PAGE_SHIFT;
        }
        Ok(())
    }
}

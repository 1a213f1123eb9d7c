//! The calling process: its address space as an identity (shaped like upstream
//! `kernel::mm::MmGrab`, 6.13+) and the accounting of memory it pins for DMA (what io_uring and
//! VFIO charge: `mm->pinned_vm` against `RLIMIT_MEMLOCK`, unless the caller has
//! `CAP_IPC_LOCK`).

use crate::bindings;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicI32, AtomicI64, Ordering};
use kernel::prelude::*;

const CAP_IPC_LOCK: i32 = bindings::CAP_IPC_LOCK as i32;
const RLIMIT_MEMLOCK: usize = bindings::RLIMIT_MEMLOCK as usize;
const PAGE_SHIFT: u32 = kernel::page::PAGE_SHIFT as u32;

/// The current task (the kernel crate's helper; its `task_struct` is the same C struct as ours).
fn current_task() -> *mut bindings::task_struct {
    // SAFETY: an FFI call without preconditions; the result is the running task, live for the
    // rest of this call.
    unsafe { kernel::bindings::get_current() }.cast()
}

/// A counted reference to an address space (`mmgrab`): it keeps the `mm_struct` allocated, so
/// its address stays a unique identity, without keeping the address space itself alive.
///
/// # Invariants
///
/// `mm` points to an `mm_struct` on which this object holds one `mm_count` reference.
pub(crate) struct MmGrab {
    mm: NonNull<bindings::mm_struct>,
}

// SAFETY: an `mm_count` reference may be dropped from any thread; `&MmGrab` only compares the
// address and updates the atomic `pinned_vm` counter.
unsafe impl Send for MmGrab {}
// SAFETY: see `Send`.
unsafe impl Sync for MmGrab {}

impl MmGrab {
    /// The address space of the calling process; `None` in a kernel thread or a process that is
    /// exiting (no `mm` any more).
    pub(crate) fn current() -> Option<Self> {
        // SAFETY: the current task is live; its `mm` is stable while it runs (only the task
        // itself changes it, at exec and exit).
        let mm = NonNull::new(unsafe { (*current_task()).mm })?;
        // SAFETY: `mm` is the current task's live address space, so its `mm_count` is non-zero.
        unsafe { Self::grab(mm) };
        // INVARIANT: grabbed above.
        Some(MmGrab { mm })
    }

    /// `mmgrab`: takes an `mm_count` reference.
    ///
    /// # Safety
    ///
    /// `mm` must be live (its `mm_count` non-zero).
    unsafe fn grab(mm: NonNull<bindings::mm_struct>) {
        // SAFETY: `mm_count` is an aligned `atomic_t` of a live `mm_struct`; the kernel only
        // ever updates it atomically.
        let count = unsafe {
            AtomicI32::from_ptr(core::ptr::addr_of_mut!((*mm.as_ptr()).__bindgen_anon_1.__bindgen_anon_1.mm_count.counter))
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// True when the calling process is the one whose address space this is.
    pub(crate) fn is_current(&self) -> bool {
        // SAFETY: the current task is live.
        let cur = unsafe { (*current_task()).mm };
        cur == self.mm.as_ptr()
    }

    fn pinned_vm(&self) -> &AtomicI64 {
        // SAFETY: `pinned_vm` is an aligned `atomic64_t` of the `mm_struct` we hold a reference
        // on (invariant), updated by the kernel only atomically.
        unsafe { AtomicI64::from_ptr(core::ptr::addr_of_mut!((*self.mm.as_ptr()).__bindgen_anon_1.pinned_vm.counter)) }
    }

    /// Charges `pages` pinned pages to this address space (`pinned_vm`, shown as `VmPin` in
    /// /proc/PID/status). Without `CAP_IPC_LOCK` the total must stay within the calling
    /// process's `RLIMIT_MEMLOCK` (`ENOMEM` otherwise, as io_uring says). Uncharged when the
    /// returned charge drops.
    pub(crate) fn charge_pinned(&self, pages: usize) -> Result<PinnedCharge> {
        let pages = i64::try_from(pages).map_err(|_| ENOMEM)?;
        // SAFETY: an FFI call without preconditions.
        let unlimited = unsafe { bindings::capable(CAP_IPC_LOCK) };
        // SAFETY: the current task and its signal struct are live while it runs; the limit is
        // read once, as the kernel's `rlimit()` does.
        let limit = unsafe {
            core::ptr::read_volatile(&(*(*current_task()).signal).rlim[RLIMIT_MEMLOCK].rlim_cur)
        } as u64;
        let limit_pages = i64::try_from(limit >> PAGE_SHIFT).unwrap_or(i64::MAX);
        let counter = self.pinned_vm();
        let mut cur = counter.load(Ordering::Relaxed);
        loop {
            let new = cur.checked_add(pages).ok_or(ENOMEM)?;
            if !unlimited && new > limit_pages {
                return Err(ENOMEM);
            }
            match counter.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        Ok(PinnedCharge { mm: self.clone(), pages })
    }
}

impl Clone for MmGrab {
    fn clone(&self) -> Self {
        // SAFETY: we hold a reference (invariant), so the count is non-zero.
        unsafe { Self::grab(self.mm) };
        // INVARIANT: grabbed above.
        MmGrab { mm: self.mm }
    }
}

impl Drop for MmGrab {
    fn drop(&mut self) {
        // SAFETY: as in `grab`; this drops our reference (invariant), exactly once.
        let count = unsafe {
            AtomicI32::from_ptr(core::ptr::addr_of_mut!(
                (*self.mm.as_ptr()).__bindgen_anon_1.__bindgen_anon_1.mm_count.counter
            ))
        };
        // A full barrier, as `atomic_dec_and_test` implies (the membarrier rules `mmdrop` cites).
        if count.fetch_sub(1, Ordering::SeqCst) == 1 {
            // SAFETY: ours was the last reference: `mmdrop` frees the struct here.
            unsafe { bindings::__mmdrop(self.mm.as_ptr()) };
        }
    }
}

/// Pages charged to an address space's `pinned_vm`; uncharged on drop.
pub(crate) struct PinnedCharge {
    mm: MmGrab,
    pages: i64,
}

impl Drop for PinnedCharge {
    fn drop(&mut self) {
        self.mm.pinned_vm().fetch_sub(self.pages, Ordering::Relaxed);
    }
}

//! The calling process: its address space as an identity (shaped like upstream
//! `kernel::mm::MmGrab`, 6.13+) and the accounting of memory it pins for DMA (what VFIO charges:
//! `mm->locked_vm` against `RLIMIT_MEMLOCK`, unless the caller has `CAP_IPC_LOCK`, through the
//! kernel's own `account_locked_vm`).
//!
//! No field of `task_struct` or `mm_struct` is read through the bindings: bindgen's layout of
//! `task_struct` was seen wrong on the test kernel (the kernel crate's own `Task::pid` read the
//! low half of a pointer there), so only exported functions are used, and the one inline
//! operation needed, `mmgrab`, touches `mm_count`, the first member of `mm_struct` (a C layout
//! fact of include/linux/mm_types.h, checked by the `mmdrop` that frees it).

use crate::bindings;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicI32, Ordering};
use kernel::prelude::*;

/// The current task (the kernel crate's helper; the pointer is only passed to C).
fn current_task() -> *mut bindings::task_struct {
    // SAFETY: an FFI call without preconditions; the result is the running task, live for the
    // rest of this call.
    unsafe { kernel::bindings::get_current() }.cast()
}

/// The `mm_count` of `mm`: the first member of `struct mm_struct`.
///
/// # Safety
///
/// `mm` must point to an `mm_struct` whose `mm_count` is non-zero for the returned lifetime.
unsafe fn mm_count<'a>(mm: NonNull<bindings::mm_struct>) -> &'a AtomicI32 {
    // SAFETY: `mm_count` (an `atomic_t`, aligned) is at offset 0 of the live `mm_struct` (caller),
    // and the kernel only ever updates it atomically.
    unsafe { AtomicI32::from_ptr(mm.as_ptr().cast::<i32>()) }
}

/// The calling process's address space with `mm_users` raised (`get_task_mm`), or `None` for a
/// kernel thread or an exiting task. Give it back with `mmput`.
fn current_mm_users() -> Option<NonNull<bindings::mm_struct>> {
    // SAFETY: the current task is live; `get_task_mm` takes its own task lock.
    NonNull::new(unsafe { bindings::get_task_mm(current_task()) })
}

/// A counted reference to an address space (`mmgrab`): it keeps the `mm_struct` allocated, so
/// its address stays a unique identity, without keeping the address space itself alive (an open
/// file holding `mm_users` would keep its own mappings, and so itself, alive forever).
///
/// # Invariants
///
/// `mm` points to an `mm_struct` on which this object holds one `mm_count` reference.
pub(crate) struct MmGrab {
    mm: NonNull<bindings::mm_struct>,
}

// SAFETY: an `mm_count` reference may be dropped from any thread; `&MmGrab` only compares the
// address and calls `account_locked_vm`, which takes the mm's own lock.
unsafe impl Send for MmGrab {}
// SAFETY: see `Send`.
unsafe impl Sync for MmGrab {}

impl MmGrab {
    /// The address space of the calling process; `None` in a kernel thread or a process that is
    /// exiting (no `mm` any more).
    pub(crate) fn current() -> Option<Self> {
        let mm = current_mm_users()?;
        // SAFETY: `get_task_mm` returned it live (`mm_users`, and so `mm_count`, non-zero).
        unsafe { mm_count(mm) }.fetch_add(1, Ordering::Relaxed);
        // SAFETY: gives back the `mm_users` reference `get_task_mm` took; ours is `mm_count`.
        unsafe { bindings::mmput(mm.as_ptr()) };
        // INVARIANT: grabbed above.
        Some(MmGrab { mm })
    }

    /// True when the calling process is the one whose address space this is.
    pub(crate) fn is_current(&self) -> bool {
        let Some(cur) = current_mm_users() else { return false };
        let same = cur == self.mm;
        // SAFETY: gives back the reference `get_task_mm` took.
        unsafe { bindings::mmput(cur.as_ptr()) };
        same
    }

    /// Charges `pages` pinned pages to this address space (`locked_vm`, shown as `VmLck` in
    /// /proc/PID/status, as VFIO does). Without `CAP_IPC_LOCK` the total must stay within the
    /// calling process's `RLIMIT_MEMLOCK` (`ENOMEM` otherwise). Uncharged when the returned charge
    /// drops, which must not happen under a lock that a page fault of this module takes (the
    /// controller mutex): `account_locked_vm` takes the mm's `mmap_lock`.
    pub(crate) fn charge_locked(&self, pages: usize) -> Result<LockedCharge> {
        // SAFETY: the `mm_struct` is allocated (our `mm_count`); `account_locked_vm` checks the
        // limit of the current task and takes the mm's lock itself.
        let ret = unsafe { bindings::account_locked_vm(self.mm.as_ptr(), pages as _, true) };
        kernel::error::to_result(ret)?;
        Ok(LockedCharge { mm: self.clone(), pages })
    }
}

impl Clone for MmGrab {
    fn clone(&self) -> Self {
        // SAFETY: we hold a reference (invariant), so the count is non-zero.
        unsafe { mm_count(self.mm) }.fetch_add(1, Ordering::Relaxed);
        // INVARIANT: grabbed above.
        MmGrab { mm: self.mm }
    }
}

impl Drop for MmGrab {
    fn drop(&mut self) {
        // A full barrier, as `atomic_dec_and_test` implies (the membarrier rules `mmdrop` cites).
        // SAFETY: we hold a reference until this decrement (invariant).
        if unsafe { mm_count(self.mm) }.fetch_sub(1, Ordering::SeqCst) == 1 {
            // SAFETY: ours was the last reference: `mmdrop` frees the struct here.
            unsafe { bindings::__mmdrop(self.mm.as_ptr()) };
        }
    }
}

/// Pages charged to an address space's `locked_vm`; uncharged on drop.
pub(crate) struct LockedCharge {
    mm: MmGrab,
    pages: usize,
}

impl Drop for LockedCharge {
    fn drop(&mut self) {
        // SAFETY: the `mm_struct` is allocated (the grab); an uncharge never fails.
        unsafe { bindings::account_locked_vm(self.mm.mm.as_ptr(), self.pages as _, false) };
    }
}

/// The calling process's id (its thread group id, `PIDTYPE_TGID`) in its own pid namespace,
/// through the exported `__task_pid_nr_ns` (never a `task_struct` field: see the module docs);
/// 0 if it has none (an exiting task).
pub(crate) fn current_tgid() -> u32 {
    // SAFETY: the current task is live for this call; `__task_pid_nr_ns` takes the RCU read lock
    // itself, and a null namespace means the caller's active one.
    let nr = unsafe {
        bindings::__task_pid_nr_ns(current_task(), bindings::pid_type_PIDTYPE_TGID, core::ptr::null_mut())
    };
    u32::try_from(nr).unwrap_or(0)
}

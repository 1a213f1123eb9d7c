//! The library's test build counts the heap allocations each thread makes, for tests that a
//! hot path allocates nothing: a counting wrapper around the system allocator, counting only on
//! a thread inside [`allocations_in`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting on threads that asked.
struct Counting;

thread_local! {
    /// `Some(n)`: this thread counts, `n` so far.
    static COUNT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Counts one allocation when this thread counts (never during its teardown).
fn note() {
    let _ = COUNT.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
}

// SAFETY: every call is passed to `System` unchanged, with the caller's own contract; counting
// touches only a const-initialized thread-local cell, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract for `realloc`: `ptr` came from this allocator, which is
        // `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, as `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Runs `f` and returns its result with the allocations (and reallocations) this thread made
/// meanwhile.
pub(crate) fn allocations_in<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let outer = COUNT.with(|c| c.replace(Some(0)));
    let r = f();
    let n = COUNT.with(|c| c.replace(outer)).unwrap_or(0);
    (r, n)
}

//! fork() safety. A child made by `fork` inherits the parent's memory, so it inherits every
//! ugds object too: a device's queue pairs, doorbells and command ids, a file target's io_uring,
//! a remote target's connections, registrations of the parent's pinned pages. None of them may
//! be used from the child: its commands would land in the parent's queues and its reads would
//! DMA into the parent's pages.
//!
//! A `pthread_atfork` child handler (registered once, by [`watch`], when the first storage or
//! device is made) bumps a process-wide fork generation. Every object that holds state bound to
//! its process records the generation it was made in ([`Born`]); each entry point checks it
//! (one relaxed load and a compare) and fails with [`Error::ForkedChild`] before touching
//! anything. Dropped in a child, such an object touches nothing of the device's (no ioctl, no
//! doorbell, no `munmap` of a mapping the child never had: ugds mappings and the library's own
//! DMA memory are not inherited); it leaks its bookkeeping instead. A child opens the device
//! afresh and uses that normally; the parent is not disturbed.
//!
//! The library's own DMA memory (host buffers it allocates, staging chunks, bounce buffers) is
//! marked `MADV_DONTFORK` ([`dont_fork`]), so a child does not inherit it; memory the caller
//! registered stays the caller's.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

/// Bumped in every child, by the fork handler.
static GENERATION: AtomicU32 = AtomicU32::new(0);
/// Whether the fork handler is registered.
static WATCHING: AtomicBool = AtomicBool::new(false);

extern "C" fn in_child() {
    // Async-signal-safe: one atomic add, nothing else (the child of a multi-threaded parent may
    // only do such things until it execs).
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Registers the fork handler (once per process) and returns the current generation. Called by
/// whatever makes the first object of a process (a storage, a device); the objects made from
/// those take [`Born::now`].
pub(crate) fn watch() -> Result<Born> {
    if !WATCHING.load(Ordering::Acquire) {
        static REGISTER: Mutex<()> = Mutex::new(());
        let _g = REGISTER.lock().unwrap_or_else(|e| e.into_inner());
        if !WATCHING.load(Ordering::Acquire) {
            // SAFETY: registers a handler that does one atomic add (async-signal-safe), with no
            // prepare or parent handler; the function lives for the life of the process.
            let r = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
            if r != 0 {
                return Err(Error::Io {
                    op: "pthread_atfork (the fork handler)".into(),
                    source: std::io::Error::from_raw_os_error(r),
                });
            }
            WATCHING.store(true, Ordering::Release);
        }
    }
    Ok(Born::now())
}

/// The fork generation an object was made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Born(u32);

impl Born {
    /// The current generation (the handler is registered by [`watch`]: every object that holds
    /// process-bound state descends from a storage or device made through it).
    #[inline]
    pub(crate) fn now() -> Born {
        Born(GENERATION.load(Ordering::Relaxed))
    }

    /// True in a child forked after the object was made.
    #[inline]
    pub(crate) fn in_child(self) -> bool {
        GENERATION.load(Ordering::Relaxed) != self.0
    }

    /// [`Error::ForkedChild`] naming `object` in a child forked after the object was made.
    #[inline]
    pub(crate) fn check(self, object: &'static str) -> Result<()> {
        if self.in_child() {
            return Err(Error::ForkedChild { object });
        }
        Ok(())
    }
}

/// Marks `[ptr, ptr + len)` (page aligned, the library's own mapping) `MADV_DONTFORK`: a child
/// does not inherit it. A kernel built without `madvise` (CONFIG_ADVISE_SYSCALLS off: ENOSYS)
/// lets the child inherit the memory: the objects that own it still refuse use there, and
/// dropping them there leaks it.
///
/// # Safety
///
/// The range is a mapping this library made and owns (never the caller's memory): after a
/// fork the child has nothing there.
pub(crate) unsafe fn dont_fork(ptr: *mut u8, len: usize) -> Result<()> {
    // SAFETY: changes only how fork treats our own mapping (caller); no memory changes here.
    if unsafe { libc::madvise(ptr.cast(), len, libc::MADV_DONTFORK) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            return Ok(());
        }
        return Err(Error::Io { op: "madvise(MADV_DONTFORK)".into(), source: e });
    }
    Ok(())
}

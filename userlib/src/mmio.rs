//! Shared mappings of device memory (doorbells), DMA memory (SQ, CQ, PRP pool) and the status
//! page, with volatile accessors; and page-aligned anonymous host memory for registrations.

use crate::error::{Error, Result};
use std::io;

/// A shared mapping; every access is volatile (the device reads or writes it concurrently).
///
/// # Invariants
///
/// `ptr` is the start of a live mapping of `len` bytes, unmapped only in `Drop`.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: all accesses are volatile reads/writes of plain integers; the mapping is process-wide.
unsafe impl Send for Mapping {}
// SAFETY: as above; concurrent volatile accesses to distinct or the same words are what the
// device does too, and callers synchronise ring state themselves.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes at `offset` of `fd`, shared (crate-private: the module's queue, PRP,
    /// doorbell and status mappings).
    pub(crate) fn map(fd: i32, offset: u64, len: usize, writable: bool, what: &'static str) -> Result<Self> {
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a new mapping placed by the kernel; no existing memory is affected.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, offset as libc::off_t) };
        if p == libc::MAP_FAILED {
            return Err(Error::Control { op: what, source: io::Error::last_os_error() });
        }
        // INVARIANT: a fresh mapping of len bytes.
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// Anonymous, private, zeroed memory of `len` bytes (page aligned).
    pub fn anonymous(len: usize) -> Result<Self> {
        // SAFETY: a new anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Control { op: "mmap (host buffer)", source: io::Error::last_os_error() });
        }
        // INVARIANT: a fresh mapping of len bytes.
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    #[inline]
    fn check(&self, off: usize, size: usize) {
        // A bug in ring arithmetic must not become a wild write.
        assert!(off.is_multiple_of(size) && off + size <= self.len, "mapping access {off}+{size} out of {}", self.len);
    }

    /// Volatile 32-bit load.
    #[inline]
    pub fn load32(&self, off: usize) -> u32 {
        self.check(off, 4);
        // SAFETY: in bounds and aligned (checked), live by the invariant.
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u32>()) }
    }

    /// Volatile 64-bit load.
    #[inline]
    pub fn load64(&self, off: usize) -> u64 {
        self.check(off, 8);
        // SAFETY: in bounds and aligned (checked), live by the invariant.
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u64>()) }
    }

    /// Volatile 32-bit store.
    #[inline]
    pub fn store32(&self, off: usize, v: u32) {
        self.check(off, 4);
        // SAFETY: in bounds and aligned (checked), live by the invariant.
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<u32>(), v) }
    }

    /// Volatile 64-bit store.
    #[inline]
    pub fn store64(&self, off: usize, v: u64) {
        self.check(off, 8);
        // SAFETY: in bounds and aligned (checked), live by the invariant.
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<u64>(), v) }
    }

    /// Volatile stores of consecutive dwords starting at `off` (one bounds check).
    #[inline]
    pub fn store_dwords(&self, off: usize, v: &[u32]) {
        self.check(off, 4);
        assert!(off + 4 * v.len() <= self.len, "mapping access {off}+{} out of {}", 4 * v.len(), self.len);
        for (i, w) in v.iter().enumerate() {
            // SAFETY: in bounds and aligned (checked above), live by the invariant.
            unsafe { std::ptr::write_volatile(self.ptr.add(off + 4 * i).cast::<u32>(), *w) }
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped exactly once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

//! Memory-mapped I/O (shaped like upstream `kernel::io::Io`): a mapped BAR with volatile
//! accessors. Offsets known at compile time are checked at compile time; `try_` twins check at
//! run time.

use crate::bindings;
use kernel::prelude::*;

/// A mapping of `len` bytes of device memory, at least `SIZE` long.
///
/// # Invariants
///
/// `addr` is the start of a live `ioremap` mapping of `len >= SIZE` bytes, unmapped only in
/// `Drop`.
pub(crate) struct IoMem<const SIZE: usize> {
    addr: *mut u8,
    len: usize,
}

// SAFETY: MMIO accesses are plain volatile loads/stores, valid from any thread; the mapping is
// only unmapped on drop, which needs ownership.
unsafe impl<const SIZE: usize> Send for IoMem<SIZE> {}
// SAFETY: `&IoMem` only allows volatile, in-bounds MMIO accesses, valid from any thread.
unsafe impl<const SIZE: usize> Sync for IoMem<SIZE> {}

impl<const SIZE: usize> IoMem<SIZE> {
    /// Maps `len` bytes of physical address `phys` (uncached).
    ///
    /// # Safety
    ///
    /// `[phys, phys + len)` must be device memory this driver owns (a requested BAR region)
    /// for the lifetime of the returned object.
    pub(super) unsafe fn map(phys: u64, len: usize) -> Result<Self> {
        if len < SIZE {
            return Err(ENOMEM);
        }
        // SAFETY: the caller guarantees the range is a BAR region we own.
        let addr = unsafe { bindings::ioremap(phys, len as _) }.cast::<u8>();
        if addr.is_null() {
            return Err(ENOMEM);
        }
        // INVARIANT: `addr` is a fresh mapping of `len >= SIZE` bytes.
        Ok(IoMem { addr, len })
    }

    /// Length of the mapping.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Reads a 32-bit register at a compile-time offset.
    pub(crate) fn read32<const OFF: usize>(&self) -> u32 {
        const { assert!(OFF + 4 <= SIZE && OFF % 4 == 0) };
        // SAFETY: in bounds and aligned (checked at compile time against SIZE <= len).
        unsafe { core::ptr::read_volatile(self.addr.add(OFF).cast::<u32>()) }
    }

    /// Reads a 64-bit register at a compile-time offset.
    pub(crate) fn read64<const OFF: usize>(&self) -> u64 {
        const { assert!(OFF + 8 <= SIZE && OFF % 8 == 0) };
        // SAFETY: in bounds and aligned (checked at compile time against SIZE <= len).
        unsafe { core::ptr::read_volatile(self.addr.add(OFF).cast::<u64>()) }
    }

    /// Writes a 32-bit register at a compile-time offset.
    pub(crate) fn write32<const OFF: usize>(&self, v: u32) {
        const { assert!(OFF + 4 <= SIZE && OFF % 4 == 0) };
        // SAFETY: in bounds and aligned (checked at compile time against SIZE <= len).
        unsafe { core::ptr::write_volatile(self.addr.add(OFF).cast::<u32>(), v) }
    }

    /// Writes a 32-bit register at a run-time offset.
    pub(crate) fn try_write32(&self, off: usize, v: u32) -> Result {
        if off % 4 != 0 || off.checked_add(4).map_or(true, |end| end > self.len) {
            return Err(EINVAL);
        }
        // SAFETY: bounds and alignment checked above.
        unsafe { core::ptr::write_volatile(self.addr.add(off).cast::<u32>(), v) };
        Ok(())
    }
}

impl<const SIZE: usize> Drop for IoMem<SIZE> {
    fn drop(&mut self) {
        // SAFETY: by the invariant, `addr` is a live mapping, unmapped exactly once here.
        unsafe { bindings::iounmap(self.addr.cast()) };
    }
}

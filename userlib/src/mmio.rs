//! The module's mappings that are not DMA memory: the owner of every `mmap` ([`Mmap`]), the
//! controller's doorbells (MMIO, store-only, offsets checked once) and the read-only status page.
//! DMA memory shared with the device and host buffers are typed in [`crate::mem`].

use crate::error::{Error, Result};
use std::io;
use std::mem::{offset_of, size_of};
use std::ptr::NonNull;
use std::sync::Arc;
use ugds_uapi::ioctl::{ControllerState, StatusPage, MMAP_DOORBELLS, MMAP_STATUS};

/// An owned mapping of `len` bytes, unmapped on drop. It has no accessors of its own: the typed
/// views ([`Doorbells`], [`StatusView`], [`crate::mem::DeviceShared`], [`crate::mem::HostMemory`])
/// decide how the memory may be touched.
///
/// # Invariants
///
/// `ptr` is the page-aligned start of a live mapping of `len` bytes (`len > 0`), readable, and
/// writable when made with `writable`; it is unmapped only in `Drop`.
#[derive(Debug)]
pub(crate) struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Mmap` only owns an address range; it hands out no references. Each view that wraps it
// states the access rules (volatile fields, or `unsafe` slices), which hold from any thread.
unsafe impl Send for Mmap {}
// SAFETY: as for `Send`: a shared `&Mmap` gives access to nothing but the address and length.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Maps `len` bytes at `offset` of `fd`, shared.
    pub(crate) fn shared(fd: i32, offset: u64, len: usize, writable: bool, what: &'static str) -> Result<Self> {
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        Self::new(fd, offset, len, prot, libc::MAP_SHARED, what)
    }

    /// Anonymous, private, zeroed memory of `len` bytes (page aligned).
    pub(crate) fn anonymous(len: usize) -> Result<Self> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        Self::new(-1, 0, len, libc::PROT_READ | libc::PROT_WRITE, flags, "mmap (host buffer)")
    }

    fn new(fd: i32, offset: u64, len: usize, prot: i32, flags: i32, what: &'static str) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid("len", "a mapping must be non-empty"));
        }
        // CAST: mmap offsets of the module's ABI fit off_t (they are below 2^48).
        let off = offset as libc::off_t;
        // SAFETY: a new mapping placed by the kernel (no address hint); no existing memory changes.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(Error::Control { op: what, source: io::Error::last_os_error() });
        }
        let ptr =
            NonNull::new(p.cast()).ok_or(Error::Control { op: what, source: io::Error::other("null mapping") })?;
        // INVARIANT: a fresh mapping of `len` bytes, page aligned by mmap.
        Ok(Mmap { ptr, len })
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The start address.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: our own mapping (invariant), unmapped exactly once. Unmapping user memory never
        // affects what a device may still write: DMA memory belongs to the kernel, and host
        // buffers are kept mapped by their owners while commands may name them.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A controller's doorbell registers (MMIO, mapped uncached): the host only ever writes them.
///
/// # Invariants
///
/// `map` is writable.
#[derive(Debug)]
pub struct Doorbells {
    map: Mmap,
}

impl Doorbells {
    /// Maps `len` bytes of the device's doorbells.
    pub(crate) fn map(fd: i32, len: usize) -> Result<Self> {
        // INVARIANT: mapped writable.
        Ok(Doorbells { map: Mmap::shared(fd, MMAP_DOORBELLS, len, true, "mmap doorbells")? })
    }

    /// Doorbells over any shared writable memory object (the device model's doorbell page).
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn over(fd: i32, len: usize) -> Result<Self> {
        // INVARIANT: mapped writable.
        Ok(Doorbells { map: Mmap::shared(fd, 0, len, true, "mmap doorbells")? })
    }

    /// The doorbell at byte `off`, checked here once (dword aligned, inside the mapping) so that
    /// ringing it needs no check.
    pub(crate) fn doorbell(self: &Arc<Self>, off: u64) -> Result<Doorbell> {
        let ok = off.is_multiple_of(4) && off.checked_add(4).is_some_and(|end| end <= self.map.len() as u64);
        if !ok {
            return Err(Error::DeviceProtocol(format!(
                "doorbell offset {off:#x} outside the {}-byte doorbell mapping",
                self.map.len()
            )));
        }
        // CAST: below the mapping's length (checked), so it fits usize.
        // INVARIANT: aligned and in range, checked above.
        Ok(Doorbell { dbs: self.clone(), off: off as usize })
    }
}

/// One doorbell register (an SQ tail or a CQ head).
///
/// # Invariants
///
/// `off` is a multiple of 4 and `off + 4 <= dbs.map.len()`.
#[derive(Debug)]
pub struct Doorbell {
    dbs: Arc<Doorbells>,
    off: usize,
}

impl Doorbell {
    /// Writes `value` to the register (one 32-bit MMIO store).
    #[inline]
    pub(crate) fn ring(&self, value: u32) {
        // SAFETY: in range and aligned (invariant) in a live writable mapping (`Doorbells`'
        // invariant, kept alive by the `Arc`); a volatile store is how MMIO is written.
        unsafe { std::ptr::write_volatile(self.dbs.map.ptr().add(self.off).cast::<u32>(), value.to_le()) }
    }
}

/// The module's read-only status page (controller epoch, faulted flag, counters), written by
/// the kernel at any time: read field by field with volatile loads.
///
/// # Invariants
///
/// `map` is at least `size_of::<StatusPage>()` bytes.
#[derive(Debug)]
pub struct StatusView {
    map: Mmap,
}

impl StatusView {
    /// Maps the status page of an open `/dev/ugds_drvN`.
    pub(crate) fn map(fd: i32) -> Result<Self> {
        // INVARIANT: one page, larger than `StatusPage`.
        let v = StatusView { map: Mmap::shared(fd, MMAP_STATUS, 4096, false, "mmap status page")? };
        // The module fills its mappings at the first fault: take it now, not on the data path.
        v.load32(offset_of!(StatusPage, magic));
        Ok(v)
    }

    /// A status page over any shared memory object (the device model's).
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn over(fd: i32) -> Result<Self> {
        // INVARIANT: one page, larger than `StatusPage`.
        Ok(StatusView { map: Mmap::shared(fd, 0, 4096, false, "mmap status page")? })
    }

    #[inline]
    fn load32(&self, off: usize) -> u32 {
        debug_assert!(off + 4 <= size_of::<StatusPage>() && off.is_multiple_of(4));
        // SAFETY: callers pass field offsets of `StatusPage` (aligned, inside it), and the
        // mapping holds a whole `StatusPage` (invariant).
        u32::from_le(unsafe { std::ptr::read_volatile(self.map.ptr().add(off).cast::<u32>()) })
    }

    #[inline]
    fn load64(&self, off: usize) -> u64 {
        debug_assert!(off + 8 <= size_of::<StatusPage>() && off.is_multiple_of(8));
        // SAFETY: as in `load32`, for the 8-byte fields.
        u64::from_le(unsafe { std::ptr::read_volatile(self.map.ptr().add(off).cast::<u64>()) })
    }

    /// The controller's epoch and fault flag, read in one load: both as the module last
    /// published them (see [`ControllerState`]).
    #[inline]
    pub fn state(&self) -> ControllerState {
        ControllerState(self.load64(offset_of!(StatusPage, state)))
    }

    /// dma-buf registrations revoked since probe (published before the epoch of the reset that
    /// came with each).
    #[inline]
    pub fn revocations(&self) -> u64 {
        self.load64(offset_of!(StatusPage, revocations))
    }

    /// Every field, each read once.
    pub fn snapshot(&self) -> StatusPage {
        StatusPage {
            magic: self.load32(offset_of!(StatusPage, magic)),
            abi_version: self.load32(offset_of!(StatusPage, abi_version)),
            state: self.state().0,
            pinned_pages: self.load64(offset_of!(StatusPage, pinned_pages)),
            registrations: self.load64(offset_of!(StatusPage, registrations)),
            qpairs: self.load64(offset_of!(StatusPage, qpairs)),
            resets: self.load64(offset_of!(StatusPage, resets)),
            timeouts: self.load64(offset_of!(StatusPage, timeouts)),
            revocations: self.revocations(),
        }
    }
}

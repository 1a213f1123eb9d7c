//! The module's mappings that are not DMA memory: the owner of every `mmap` ([`Mmap`]), the
//! controller's doorbells (MMIO, store-only, offsets checked once) and the read-only status page.
//! DMA memory shared with the device and host buffers are typed in [`crate::mem`].

use crate::error::{Error, Result};
use std::io;
use std::mem::{offset_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use ugds_uapi::ioctl::{
    ControllerState, StatusPage, MMAP_DOORBELLS, MMAP_EVENT_INDEXES, MMAP_SHADOW_DOORBELLS, MMAP_STATUS,
};

/// The huge page size [`Mmap::anonymous_huge`] maps.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

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

    /// As [`Mmap::anonymous`], starting on a [`HUGE_PAGE`] boundary and marked for transparent
    /// huge pages (`MADV_HUGEPAGE`): where the kernel gives them on request (its setting
    /// `always` or `madvise`; a best effort, never an error), each 2 MiB of it is then one
    /// physically contiguous page once touched, as hugetlb pages are, without a reserved pool.
    pub(crate) fn anonymous_thp(len: usize) -> Result<Self> {
        // The mapping covers whole pages; the ends cut off are whole pages too.
        let pages = len
            .checked_next_multiple_of(4096)
            .filter(|p| p.checked_add(HUGE_PAGE).is_some())
            .ok_or_else(|| Error::invalid("len", format!("{len} bytes cannot be mapped")))?;
        let over = pages + HUGE_PAGE;
        let m = Self::anonymous(over)?;
        let base = m.ptr() as usize;
        let head = base.next_multiple_of(HUGE_PAGE) - base;
        let tail = over - head - pages;
        // The aligned middle is kept; `m` must not unmap the whole on drop.
        std::mem::forget(m);
        // SAFETY: `[base, base + head)` and `[base + head + pages, base + over)` are the two ends
        // of the fresh mapping above, which nothing refers to; both are whole pages (`base`,
        // `HUGE_PAGE` and `pages` are page multiples).
        unsafe {
            if head > 0 {
                libc::munmap(base as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((base + head + pages) as *mut libc::c_void, tail);
            }
        }
        let start = (base + head) as *mut u8;
        // SAFETY: an advice on the mapping just trimmed, which changes no contents.
        if unsafe { libc::madvise(start.cast(), len, libc::MADV_HUGEPAGE) } != 0 {
            log::debug!("no transparent huge pages for a host buffer: {}", io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(start).ok_or(Error::Control { op: "mmap (host buffer)", source: io::Error::other("null") })?;
        // INVARIANT: `[start, start + len)` is a live mapping owned here alone (its ends were
        // unmapped), page aligned.
        Ok(Mmap { ptr, len })
    }

    /// As [`Mmap::anonymous`], from the system's reserved 2 MiB huge pages (hugetlb): `len` must
    /// be a multiple of [`HUGE_PAGE`]. The pages are reserved by the mmap itself, so it fails
    /// (`ENOMEM`) when too few are free, rather than faulting later.
    pub(crate) fn anonymous_huge(len: usize) -> Result<Self> {
        if !len.is_multiple_of(HUGE_PAGE) {
            return Err(Error::invalid("len", format!("{len} bytes are not whole 2 MiB huge pages")));
        }
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
        Self::new(-1, 0, len, libc::PROT_READ | libc::PROT_WRITE, flags, "mmap (huge page host buffer)")
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
/// Where the controller takes shadow doorbells, also the shadow doorbell page (written by the
/// host) and the event index page (written by the controller), in the registers' layout.
///
/// # Invariants
///
/// `map` is writable; `shadow`'s doorbell page is writable and both its pages are as long as
/// each other.
#[derive(Debug)]
pub struct Doorbells {
    map: Mmap,
    shadow: Option<Shadow>,
}

/// The two pages of shadow doorbells.
#[derive(Debug)]
struct Shadow {
    doorbells: Mmap,
    event_indexes: Mmap,
}

impl Shadow {
    /// Maps one page of each (file, offset): the shadow doorbells writable, the event indexes
    /// read-only.
    fn map(doorbells: (i32, u64), event_indexes: (i32, u64)) -> Result<Self> {
        Ok(Shadow {
            doorbells: Mmap::shared(doorbells.0, doorbells.1, 4096, true, "mmap shadow doorbells")?,
            event_indexes: Mmap::shared(event_indexes.0, event_indexes.1, 4096, false, "mmap event indexes")?,
        })
    }
}

/// Largest ring whose indexes [`need_event`] compares exactly in 16 bits (one wrap of the ring
/// must stay below half of 65536).
const SHADOW_MAX_DEPTH: u32 = 32768;

impl Doorbells {
    /// Maps `len` bytes of the device's doorbells and, with `shadow`, its shadow doorbell and
    /// event index pages.
    pub(crate) fn map(fd: i32, len: usize, shadow: bool) -> Result<Self> {
        let shadow =
            if shadow { Some(Shadow::map((fd, MMAP_SHADOW_DOORBELLS), (fd, MMAP_EVENT_INDEXES))?) } else { None };
        // INVARIANT: mapped writable; the shadow pages one page each, its doorbells writable.
        Ok(Doorbells { map: Mmap::shared(fd, MMAP_DOORBELLS, len, true, "mmap doorbells")?, shadow })
    }

    /// Doorbells over any shared writable memory object (the device model's doorbell page),
    /// with shadow doorbell and event index pages over two more where given.
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn over(fd: i32, len: usize, shadow: Option<(i32, i32)>) -> Result<Self> {
        let shadow = match shadow {
            Some((d, e)) => Some(Shadow::map((d, 0), (e, 0))?),
            None => None,
        };
        // INVARIANT: as in `map`.
        Ok(Doorbells { map: Mmap::shared(fd, 0, len, true, "mmap doorbells")?, shadow })
    }

    /// The doorbell at byte `off` of a ring of `depth` slots, checked here once (dword aligned,
    /// inside the mappings) so that ringing it needs no check. It uses the shadow doorbells
    /// where the controller takes them and the ring is small enough for their comparison.
    pub(crate) fn doorbell(self: &Arc<Self>, off: u64, depth: u32) -> Result<Doorbell> {
        let inside = |len: usize| off.is_multiple_of(4) && off.checked_add(4).is_some_and(|end| end <= len as u64);
        if !inside(self.map.len()) || self.shadow.as_ref().is_some_and(|s| !inside(s.doorbells.len())) {
            return Err(Error::DeviceProtocol(format!(
                "doorbell offset {off:#x} outside the {}-byte doorbell mapping",
                self.map.len()
            )));
        }
        // CAST: below the mappings' lengths (checked), so it fits usize.
        let off = off as usize;
        // SAFETY: `off + 4` lies inside each mapping this is called with (checked above), so the
        // address stays in bounds.
        let at = |m: &Mmap| unsafe { m.ptr.add(off) }.cast::<u32>();
        let reg = at(&self.map);
        let shadow = match &self.shadow {
            Some(s) if depth <= SHADOW_MAX_DEPTH => Some((at(&s.doorbells), at(&s.event_indexes))),
            _ => None,
        };
        // INVARIANT: aligned, inside the mappings `self` keeps (checked above); the register and
        // the shadow entry in writable ones.
        Ok(Doorbell { _dbs: self.clone(), reg, shadow })
    }
}

/// True when a doorbell value moving from `old` to `new` passes the controller's event index
/// `event`: the controller has consumed up to there and waits for a register write (the
/// comparison of virtio's used-event index, which the NVMe shadow doorbells share). Exact for
/// ring indexes below [`SHADOW_MAX_DEPTH`].
#[inline]
pub(crate) fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// One doorbell register (an SQ tail or a CQ head), its address resolved once: ringing it is
/// one store (two and a load with shadow doorbells), with no lookup through the mappings.
///
/// # Invariants
///
/// `reg`, and with `shadow` its shadow entry and event index, are 4-byte aligned addresses
/// inside the mappings `_dbs` keeps alive; `reg` and the shadow entry are writable.
#[derive(Debug)]
pub struct Doorbell {
    _dbs: Arc<Doorbells>,
    reg: NonNull<u32>,
    /// The shadow doorbell entry and the controller's event index, where the controller takes
    /// shadow doorbells and the ring is small enough for their comparison.
    shadow: Option<(NonNull<u32>, NonNull<u32>)>,
}

// SAFETY: the pointers name device-shared memory that the `Arc` keeps mapped for as long as the
// doorbell lives, accessed only by volatile loads and stores, which any thread may make (the
// device makes its own at any time); callers order their stores (the queue's lock or owner).
unsafe impl Send for Doorbell {}
// SAFETY: as for `Send`: `&Doorbell` allows only volatile accesses to that memory.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// Writes `value` to the register (one 32-bit MMIO store), and to the shadow doorbell
    /// first where there is one.
    #[inline]
    pub(crate) fn ring(&self, value: u32) {
        if let Some((entry, _)) = self.shadow {
            // SAFETY: the shadow entry: writable, aligned and mapped while `self` lives
            // (invariant); the controller reads it at any time, so the store is volatile.
            unsafe { std::ptr::write_volatile(entry.as_ptr(), value.to_le()) };
        }
        self.store_reg(value);
    }

    /// Moves the doorbell from `old` to `new` (ring indexes). With shadow doorbells the value
    /// goes to the shadow page, and to the register only when the controller's event index
    /// says it waits for one ([`need_event`]); otherwise to the register.
    #[inline]
    pub(crate) fn publish(&self, new: u16, old: u16) {
        let Some((entry, event)) = self.shadow else {
            self.store_reg(u32::from(new));
            return;
        };
        // SAFETY: as in `ring`.
        unsafe { std::ptr::write_volatile(entry.as_ptr(), u32::from(new).to_le()) };
        // The shadow store must be visible before the event index is read: otherwise the
        // controller may have read the old value and published an index this store then skips
        // past, and nobody rings (a store-load order: a full fence).
        fence(Ordering::SeqCst);
        // SAFETY: aligned and inside the live event index page (invariant), which the
        // controller writes at any time: a volatile load.
        let event = u32::from_le(unsafe { std::ptr::read_volatile(event.as_ptr()) });
        // CAST: indexes of rings below 65536 slots.
        if need_event(event as u16, new, old) {
            self.store_reg(u32::from(new));
        }
    }

    /// One volatile 32-bit store to the register (an MMIO store).
    #[inline(always)]
    fn store_reg(&self, value: u32) {
        // SAFETY: the register: writable, aligned and mapped while `self` lives (invariant);
        // the device reads it at any time, so the store is volatile.
        unsafe { std::ptr::write_volatile(self.reg.as_ptr(), value.to_le()) }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::memfd;
    use proptest::prelude::*;
    use std::os::fd::AsRawFd;

    /// A page of a memory file seen from the test (the device's side).
    fn page(fd: i32) -> Mmap {
        Mmap::shared(fd, 0, 4096, true, "test page").unwrap()
    }

    fn load(m: &Mmap, off: usize) -> u32 {
        // SAFETY: in the page, aligned; the memory is plain shared memory.
        unsafe { std::ptr::read_volatile(m.ptr().add(off).cast::<u32>()) }
    }

    fn store(m: &Mmap, off: usize, v: u32) {
        // SAFETY: as in `load`, writable.
        unsafe { std::ptr::write_volatile(m.ptr().add(off).cast::<u32>(), v) }
    }

    proptest! {
        /// The controller waits for a register write exactly when its event index lies in the
        /// slots the doorbell moved over (`old..new`, around the ring).
        #[test]
        fn need_event_is_the_event_index_inside_the_move(depth in 2u32..=SHADOW_MAX_DEPTH, a: u32, b: u32, e: u32) {
            let (old, new, event) = ((a % depth) as u16, (b % depth) as u16, (e % depth) as u16);
            let moved = (u32::from(new) + depth - u32::from(old)) % depth;
            let passed = (u32::from(event) + depth - u32::from(old)) % depth;
            prop_assert_eq!(need_event(event, new, old), passed < moved);
        }
    }

    #[test]
    fn a_shadowed_doorbell_writes_the_register_only_when_the_controller_waits() {
        let (reg, dbs, eis) = (memfd(4096).unwrap(), memfd(4096).unwrap(), memfd(4096).unwrap());
        let d = Arc::new(Doorbells::over(reg.as_raw_fd(), 4096, Some((dbs.as_raw_fd(), eis.as_raw_fd()))).unwrap());
        let (regs, shadow, events) = (page(reg.as_raw_fd()), page(dbs.as_raw_fd()), page(eis.as_raw_fd()));
        let db = d.doorbell(8, 16).unwrap();
        // The controller has consumed up to 3 and waits there: moving 3 -> 5 passes it.
        store(&events, 8, 3);
        db.publish(5, 3);
        assert_eq!((load(&shadow, 8), load(&regs, 8)), (5, 5));
        // Still busy at 3 (it will read the shadow value): 5 -> 7 needs no register write.
        db.publish(7, 5);
        assert_eq!((load(&shadow, 8), load(&regs, 8)), (7, 5));
        // Across the wrap: the controller waits at 15, the doorbell moves 14 -> 1.
        store(&events, 8, 15);
        db.publish(1, 14);
        assert_eq!((load(&shadow, 8), load(&regs, 8)), (1, 1));
        assert_eq!(load(&shadow, 0), 0, "another queue's entry untouched");
    }

    #[test]
    fn without_shadow_pages_or_for_a_huge_ring_every_move_writes_the_register() {
        let (reg, dbs, eis) = (memfd(4096).unwrap(), memfd(4096).unwrap(), memfd(4096).unwrap());
        let plain = Arc::new(Doorbells::over(reg.as_raw_fd(), 4096, None).unwrap());
        let regs = page(reg.as_raw_fd());
        plain.doorbell(4, 16).unwrap().publish(9, 8);
        assert_eq!(load(&regs, 4), 9);
        let d = Arc::new(Doorbells::over(reg.as_raw_fd(), 4096, Some((dbs.as_raw_fd(), eis.as_raw_fd()))).unwrap());
        d.doorbell(4, 65536).unwrap().publish(10, 9);
        assert_eq!(load(&regs, 4), 10, "a ring past the comparison's range rings every time");
        assert_eq!(load(&page(dbs.as_raw_fd()), 4), 0);
    }
}

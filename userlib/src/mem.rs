//! Memory by owner. [`DeviceShared`]: DMA memory the device reads and writes concurrently (SQ, CQ,
//! PRP-list pool): volatile field-wise access only, never a slice, bus address crate-private.
//! [`HostMemory`]: anonymous memory of this process for buffers (registered for DMA, so slices of
//! it are `unsafe`). [`QueueMemory`]: the small trait the ring and command code is written
//! against, so it runs on DMA memory and, in tests, on ordinary memory ([`TestMemory`]).

use crate::error::{Error, Result};
use crate::fork::Born;
use crate::mmio::{Mmap, HUGE_PAGE};
use std::mem::ManuallyDrop;

/// Memory holding queue entries or PRP lists, accessed one aligned field at a time.
///
/// Accesses are not ordered with each other by this trait: callers put a fence, with a comment
/// saying what it orders, where the device must see (or we must see) one write before another.
/// Offsets are relative to the start, which implementations align to at least 8 bytes.
///
/// # Panics
///
/// Every accessor panics on an offset that is unaligned or past [`QueueMemory::len`]: that is a
/// bug in ring arithmetic (offsets derive from indices checked against the depth), and must not
/// become a wild access.
pub trait QueueMemory {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when the memory has no bytes.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Loads the little-endian dword at `off`.
    fn load32(&self, off: usize) -> u32;
    /// Loads the little-endian quadword at `off`.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    fn load64(&self, off: usize) -> u64;
    /// Stores `v` little-endian at `off`.
    fn store32(&self, off: usize, v: u32);
    /// Stores `v` little-endian at `off`.
    fn store64(&self, off: usize, v: u64);

    /// [`QueueMemory::load32`] without the check, for callers that checked a whole entry once.
    ///
    /// # Safety
    ///
    /// `off` is a multiple of 4 and `off + 4 <= self.len()`.
    #[inline]
    unsafe fn load32_unchecked(&self, off: usize) -> u32 {
        self.load32(off)
    }

    /// [`QueueMemory::store64`] without the check, for callers that checked a whole entry once.
    ///
    /// # Safety
    ///
    /// `off` is a multiple of 8 and `off + 8 <= self.len()`.
    #[inline]
    unsafe fn store64_unchecked(&self, off: usize, v: u64) {
        self.store64(off, v)
    }

    /// Stores the eight quadwords `q` at `off..off + 64` in order, each once, without checks.
    ///
    /// # Safety
    ///
    /// `off` is a multiple of 8 and `off + 64 <= self.len()`.
    #[inline]
    unsafe fn store_entry_unchecked(&self, off: usize, q: &[u64; 8]) {
        for (i, v) in q.iter().enumerate() {
            // SAFETY: `off + 8 * i + 8 <= off + 64 <= len` (caller), 8-byte aligned.
            unsafe { self.store64_unchecked(off + 8 * i, *v) }
        }
    }
}

#[inline]
#[track_caller]
fn check(len: usize, off: usize, size: usize) {
    // A bug in ring arithmetic must not become a wild access.
    assert!(off.is_multiple_of(size) && off < len && size <= len - off, "access {off}+{size} out of {len}");
}

/// DMA memory shared with the device: a queue or a PRP-list pool that the module allocated and
/// mapped into this process. The device may read or write any byte at any time, so no Rust
/// reference to its bytes ever exists: each access is one volatile load or store of an aligned
/// field. Its bus address stays inside the crate (it goes into commands only).
///
/// Dropping it only unmaps this process's view; the memory stays the kernel's, freed after the
/// controller has stopped using it (the module deletes the queue first).
///
/// # Invariants
///
/// `map` is readable and writable.
#[derive(Debug)]
pub struct DeviceShared {
    map: Mmap,
    bus: u64,
}

impl DeviceShared {
    /// Maps `len` bytes at `offset` of the module's `fd`; `bus` is the region's DMA address
    /// (0 where the module does not report one: SQ and CQ).
    pub(crate) fn map(fd: i32, offset: u64, len: usize, bus: u64, what: &'static str) -> Result<Self> {
        // INVARIANT: mapped readable and writable.
        let m = DeviceShared { map: Mmap::shared(fd, offset, len, true, what)?, bus };
        // The module fills a mapping on its first fault (all of it at once): take that fault
        // here, at setup, so the data path never does.
        m.load32(0);
        Ok(m)
    }

    /// The bus address of byte `off` (crate-private: only commands carry bus addresses).
    #[inline]
    pub(crate) fn bus(&self, off: usize) -> u64 {
        // CAST: usize to u64 is lossless on every supported target.
        self.bus + off as u64
    }

    #[inline]
    fn at<T>(&self, off: usize) -> *mut T {
        check(self.map.len(), off, size_of::<T>());
        // SAFETY: `off` is inside the mapping (checked above), so the result stays in bounds.
        unsafe { self.map.ptr().add(off).cast() }
    }
}

impl QueueMemory for DeviceShared {
    fn len(&self) -> usize {
        self.map.len()
    }
    #[inline]
    fn load32(&self, off: usize) -> u32 {
        let p = self.at::<u32>(off);
        // SAFETY: aligned and in bounds (checked in `at`) in a live readable mapping (invariant);
        // volatile, because the device writes this memory behind the compiler's back.
        u32::from_le(unsafe { std::ptr::read_volatile(p) })
    }
    #[inline]
    fn load64(&self, off: usize) -> u64 {
        let p = self.at::<u64>(off);
        // SAFETY: as in `load32`.
        u64::from_le(unsafe { std::ptr::read_volatile(p) })
    }
    #[inline]
    fn store32(&self, off: usize, v: u32) {
        let p = self.at::<u32>(off);
        // SAFETY: aligned and in bounds (checked in `at`) in a live writable mapping (invariant);
        // volatile, because the device reads this memory behind the compiler's back.
        unsafe { std::ptr::write_volatile(p, v.to_le()) }
    }
    #[inline]
    fn store64(&self, off: usize, v: u64) {
        let p = self.at::<u64>(off);
        // SAFETY: as in `store32`.
        unsafe { std::ptr::write_volatile(p, v.to_le()) }
    }
    #[inline]
    unsafe fn load32_unchecked(&self, off: usize) -> u32 {
        // SAFETY: aligned and in bounds (caller; the mapping is page aligned) in a live readable
        // mapping (invariant); volatile, as in `load32`.
        u32::from_le(unsafe { std::ptr::read_volatile(self.map.ptr().add(off).cast::<u32>()) })
    }
    #[inline]
    unsafe fn store64_unchecked(&self, off: usize, v: u64) {
        // SAFETY: aligned and in bounds (caller; the mapping is page aligned) in a live writable
        // mapping (invariant); volatile, as in `store32`.
        unsafe { std::ptr::write_volatile(self.map.ptr().add(off).cast::<u64>(), v.to_le()) }
    }
    #[inline]
    unsafe fn store_entry_unchecked(&self, off: usize, q: &[u64; 8]) {
        // The base is read once: the volatile stores below could otherwise make the compiler
        // reload it before each one.
        // SAFETY: `off..off + 64` is in bounds and 8-byte aligned (caller) in a live writable
        // mapping (invariant).
        let p = unsafe { self.map.ptr().add(off).cast::<u64>() };
        for (i, v) in q.iter().enumerate() {
            // SAFETY: `p + i` for `i < 8` lies in the 64 bytes checked by the caller; volatile,
            // as in `store32`.
            unsafe { std::ptr::write_volatile(p.add(i), v.to_le()) }
        }
    }
}

/// Page-aligned anonymous memory of this process, for buffers. Once registered with the module
/// the device may write it during a read, so slices of it are `unsafe` (the caller states that
/// no device write runs while the slice lives); otherwise it is handed around as a pointer.
/// It has no bus address: a registration's DMA segments come from the module.
///
/// The library's own DMA memory, so it is `MADV_DONTFORK`: a child made by `fork` does not
/// inherit it, and dropped there it is leaked (nothing is mapped at its address in the child,
/// or something else of the child's is).
///
/// A length of whole 2 MiB pages comes from the system's reserved huge pages while enough are
/// free (`/proc/sys/vm/nr_hugepages`), as SPDK's buffers do, and from ordinary pages otherwise:
/// a huge page is physically contiguous, so a command inside one names one DMA segment (one SGL
/// data block) where ordinary pages need one per 4 KiB. Ordinary pages of 2 MiB or more start on
/// a huge-page boundary and ask for transparent huge pages (`MADV_HUGEPAGE`), which a kernel set
/// to give them on request backs the memory with as it is touched.
#[derive(Debug)]
pub struct HostMemory {
    map: ManuallyDrop<Mmap>,
    born: Born,
}

impl HostMemory {
    /// The huge page size: a length that is a multiple of it may come from huge pages.
    pub const HUGE_PAGE: usize = HUGE_PAGE;

    /// `len` zeroed bytes (`len > 0`; whole pages are mapped), not inherited by a forked child;
    /// from huge pages where `len` is a multiple of 2 MiB and enough are free.
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid("len", "must be non-zero"));
        }
        let huge = if len.is_multiple_of(HUGE_PAGE) {
            Mmap::anonymous_huge(len)
                .inspect_err(|e| log::debug!("{len} bytes from ordinary pages: no huge pages ({e})"))
                .ok()
        } else {
            None
        };
        let map = match huge {
            Some(m) => m,
            // Where the pool has none, transparent huge pages where the kernel gives them.
            None if len >= HUGE_PAGE => Mmap::anonymous_thp(len)?,
            None => Mmap::anonymous(len)?,
        };
        // SAFETY: our own fresh mapping of `map.len()` bytes.
        unsafe { crate::fork::dont_fork(map.ptr(), map.len()) }?;
        Ok(HostMemory { map: ManuallyDrop::new(map), born: Born::now() })
    }

    /// The start address (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never: it holds at least one page.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        if self.born.in_child() {
            // Not inherited (MADV_DONTFORK): whatever the child has at this address is its own.
            return;
        }
        // SAFETY: dropped once, here; `self` is going away.
        unsafe { ManuallyDrop::drop(&mut self.map) };
    }
}

/// Ordinary memory behind [`QueueMemory`], for unit and property tests of the ring and command
/// code (and fuzzing): relaxed atomics, so it may be shared with a thread playing the device.
#[cfg(any(test, feature = "test-utils"))]
#[derive(Debug)]
pub struct TestMemory {
    words: Box<[std::sync::atomic::AtomicU32]>,
}

#[cfg(any(test, feature = "test-utils"))]
impl TestMemory {
    /// `len` zeroed bytes (rounded up to 8).
    pub fn new(len: usize) -> Self {
        let words = (0..len.div_ceil(8) * 2).map(|_| std::sync::atomic::AtomicU32::new(0)).collect();
        TestMemory { words }
    }
}

#[cfg(any(test, feature = "test-utils"))]
impl QueueMemory for TestMemory {
    fn len(&self) -> usize {
        self.words.len() * 4
    }
    fn load32(&self, off: usize) -> u32 {
        check(self.len(), off, 4);
        self.words[off / 4].load(std::sync::atomic::Ordering::Relaxed)
    }
    fn load64(&self, off: usize) -> u64 {
        check(self.len(), off, 8);
        self.load32(off) as u64 | (self.load32(off + 4) as u64) << 32
    }
    fn store32(&self, off: usize, v: u32) {
        check(self.len(), off, 4);
        self.words[off / 4].store(v, std::sync::atomic::Ordering::Relaxed)
    }
    fn store64(&self, off: usize, v: u64) {
        check(self.len(), off, 8);
        // CAST: the low and high dwords.
        self.store32(off, v as u32);
        self.store32(off + 4, (v >> 32) as u32);
    }
}

/// The value of field `name` (in kB: `KernelPageSize`, `AnonHugePages`, ...) of this process's
/// mapping that holds `at`, from `/proc/self/smaps` (tests: what pages memory came in).
#[cfg(any(test, feature = "test-utils"))]
pub fn smaps_kb(at: *const u8, name: &str) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        // A mapping's first line starts with its range, `start-end` in hex.
        let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
        if let Some((a, b)) =
            range.and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?)))
        {
            inside = (a..b).contains(&(at as usize));
        } else if inside {
            if let Some(v) = line.strip_prefix(name).and_then(|v| v.strip_prefix(':')) {
                return v.trim().strip_suffix("kB")?.trim().parse().ok();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_are_checked_and_little_endian() {
        let m = TestMemory::new(16);
        assert!(!m.is_empty() && m.len() == 16);
        m.store64(8, 0x1122_3344_5566_7788);
        assert_eq!(m.load32(8), 0x5566_7788);
        assert_eq!(m.load32(12), 0x1122_3344);
        assert!(std::panic::catch_unwind(|| m.load32(16)).is_err());
        assert!(std::panic::catch_unwind(|| m.load64(4)).is_err());
        assert!(std::panic::catch_unwind(|| m.store32(usize::MAX - 1, 0)).is_err());
    }

    #[test]
    fn host_memory_is_page_aligned_and_zeroed() {
        let h = HostMemory::new(5000).unwrap();
        assert!((h.as_ptr() as usize).is_multiple_of(4096));
        // SAFETY: `h` owns `len()` bytes and was never registered: nothing else can touch them.
        let s = unsafe { std::slice::from_raw_parts(h.as_ptr(), h.len()) };
        assert!(s.len() >= 5000 && s.iter().all(|b| *b == 0));
        assert!(HostMemory::new(0).is_err());
    }

    #[test]
    fn whole_huge_pages_are_asked_for_and_ordinary_pages_stand_in() {
        assert!(matches!(Mmap::anonymous_huge(HUGE_PAGE + 4096), Err(Error::InvalidArgument { .. })));
        // Huge pages or not (the host's pool decides), 2 MiB of zeroes come back.
        let h = HostMemory::new(HUGE_PAGE).unwrap();
        // SAFETY: `h` owns `len()` bytes and was never registered: nothing else can touch them.
        let s = unsafe { std::slice::from_raw_parts(h.as_ptr(), h.len()) };
        assert!(s.len() == HUGE_PAGE && s.iter().all(|b| *b == 0));
    }

    /// Host memory of at least one huge page on ordinary pages starts on a huge-page boundary
    /// and asks for transparent huge pages: where the kernel gives them on request (its setting
    /// `always` or `madvise`), the memory, once touched, is backed by them, so a registration
    /// sees a contiguous run per 2 MiB where it would see up to 512 pages.
    #[test]
    fn host_memory_asks_for_transparent_huge_pages() {
        let h = HostMemory::new(8 << 20).unwrap();
        if smaps_kb(h.as_ptr(), "KernelPageSize") == Some(2048) {
            // The host's reserved huge pages (hugetlb) gave it: nothing to ask for.
            return;
        }
        assert!((h.as_ptr() as usize).is_multiple_of(HUGE_PAGE), "{:p}", h.as_ptr());
        // SAFETY: `h` owns `len()` bytes and was never registered: nothing else can touch them.
        let s = unsafe { std::slice::from_raw_parts_mut(h.as_ptr(), h.len()) };
        for page in s.chunks_mut(4096) {
            page[0] = 1;
        }
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        let offered = thp.contains("[always]") || thp.contains("[madvise]");
        let huge = smaps_kb(h.as_ptr(), "AnonHugePages").unwrap_or(0);
        if offered {
            assert!(huge >= 2048, "{huge} kB of transparent huge pages with THP {}", thp.trim());
        }
    }
}

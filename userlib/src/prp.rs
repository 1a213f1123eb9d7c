//! Physical Region Page construction (NVMe base spec 2.0, section 4.1.1), pure and testable:
//! from a registration's DMA segments, a byte offset and a length, compute PRP1, PRP2 and the
//! PRP list entries.
//!
//! Rules: PRP1 may start anywhere dword aligned; every later entry names a whole page
//! (page aligned); a transfer covering two pages puts the second page in PRP2; more pages put
//! the list's address in PRP2. The data inside one page must be contiguous in bus memory, so a
//! segment boundary inside the transfer must fall on a page boundary.

use ugds_uapi::ioctl::Segment;

/// Controller memory page size (CC.MPS = 0).
pub const PAGE: u64 = 4096;

/// PRP entries that fit one list page.
pub const LIST_ENTRIES: usize = (PAGE / 8) as usize;

/// Why PRPs cannot describe a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrpError {
    /// The offset is not dword aligned (PRP1's low two bits must be zero).
    Unaligned,
    /// The range runs past the registration.
    OutOfRange,
    /// A segment boundary falls inside a page of the transfer (needs SGLs).
    Discontiguous,
    /// More pages than one list page holds.
    TooLarge,
    /// Zero length.
    Empty,
}

/// The PRP fields of one command; list entries are written to the caller's slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prps {
    /// PRP entry 1.
    pub prp1: u64,
    /// PRP entry 2 (0, the second page, or the list's bus address).
    pub prp2: u64,
    /// Number of list entries written (0 when no list is used).
    pub list_len: usize,
}

/// Finds the bus address of byte `off` of a registration and how many bytes stay contiguous
/// from there. `cursor` caches the segment index and its starting offset for forward walks.
#[inline]
pub(crate) fn locate(segs: &[Segment], off: u64, cursor: &mut (usize, u64)) -> Option<(u64, u64)> {
    if off < cursor.1 {
        *cursor = (0, 0);
    }
    while cursor.0 < segs.len() {
        let s = &segs[cursor.0];
        if off < cursor.1 + s.len {
            let within = off - cursor.1;
            return Some((s.dma_addr + within, s.len - within));
        }
        cursor.1 += s.len;
        cursor.0 += 1;
    }
    None
}

/// Where the bytes of one transfer lie on the bus. The builders ask for positions of the
/// transfer (0 is its first byte) in increasing order.
pub trait Walk {
    /// The bus address of byte `pos` of the transfer and how many bytes from there are
    /// contiguous on the bus within the same piece of memory; `None` past the memory.
    fn at(&mut self, pos: u64) -> Option<(u64, u64)>;
}

/// A transfer over one range of a registration: its bytes from `off` on, of the memory `segs`
/// map.
#[derive(Debug, Clone)]
pub struct OneRange<'a> {
    segs: &'a [Segment],
    off: u64,
    cur: (usize, u64),
}

impl<'a> OneRange<'a> {
    /// The transfer starting at byte `off` of the memory `segs` map.
    #[inline(always)]
    pub fn new(segs: &'a [Segment], off: u64) -> Self {
        OneRange { segs, off, cur: (0, 0) }
    }
}

impl Walk for OneRange<'_> {
    #[inline(always)]
    fn at(&mut self, pos: u64) -> Option<(u64, u64)> {
        locate(self.segs, self.off.checked_add(pos)?, &mut self.cur)
    }
}

/// Builds PRPs for `[off, off + len)` of a registration made of `segs`. `list` receives the
/// list entries (it must hold [`LIST_ENTRIES`]); `list_bus` is the list page's bus address.
#[cfg(test)]
pub fn build(segs: &[Segment], off: u64, len: u64, list: &mut [u64], list_bus: u64) -> Result<Prps, PrpError> {
    let cap = list.len().min(LIST_ENTRIES);
    build_with(OneRange::new(segs, off), len, list_bus, cap, |i, a| list[i] = a)
}

/// Builds PRPs for the `len` bytes `walk` finds, handing each list entry `(index, bus address)`
/// to `sink` (the data path writes them straight into the command's PRP page, with no
/// intermediate buffer). At most `cap` entries are produced. On error, entries already handed
/// out are garbage to ignore.
///
/// The one- or two-page case (the common small transfer) is inlined into the caller; only a
/// list is built out of line.
#[inline(always)]
pub fn build_with<W: Walk>(
    mut walk: W,
    len: u64,
    list_bus: u64,
    cap: usize,
    sink: impl FnMut(usize, u64),
) -> Result<Prps, PrpError> {
    if len == 0 {
        return Err(PrpError::Empty);
    }
    let (first, contig) = walk.at(0).ok_or(PrpError::OutOfRange)?;
    // PRP1's low two bits must be zero.
    if first % 4 != 0 {
        return Err(PrpError::Unaligned);
    }
    // Bytes up to the end of PRP1's page.
    let head = (PAGE - (first % PAGE)).min(len);
    if contig < head {
        return Err(PrpError::Discontiguous);
    }
    // One or two pages inside one contiguous run: PRP1 and PRP2 directly, no list. The second
    // page starts right after PRP1's page, in bus memory too.
    if len - head <= PAGE && contig >= len {
        let prp2 = if len == head { 0 } else { first + head };
        return Ok(Prps { prp1: first, prp2, list_len: 0 });
    }
    build_list(walk, len, (first, head), list_bus, cap, sink)
}

/// The rest of [`build_with`]: the pages after PRP1's (`head` bytes from bus address `first`).
#[inline(never)]
fn build_list<W: Walk>(
    mut walk: W,
    len: u64,
    (first, head): (u64, u64),
    list_bus: u64,
    cap: usize,
    mut sink: impl FnMut(usize, u64),
) -> Result<Prps, PrpError> {
    let mut pos = head;
    let mut pages = 0usize;
    let mut second = 0u64;
    while pos < len {
        let (addr, contig) = walk.at(pos).ok_or(PrpError::OutOfRange)?;
        let chunk = PAGE.min(len - pos);
        if addr % PAGE != 0 || contig < chunk {
            return Err(PrpError::Discontiguous);
        }
        if pages == 0 {
            second = addr;
        }
        if pages >= cap {
            return Err(PrpError::TooLarge);
        }
        sink(pages, addr);
        pages += 1;
        pos += chunk;
    }
    Ok(match pages {
        0 => Prps { prp1: first, prp2: 0, list_len: 0 },
        1 => Prps { prp1: first, prp2: second, list_len: 0 },
        n => Prps { prp1: first, prp2: list_bus, list_len: n },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seg(dma_addr: u64, len: u64) -> Segment {
        Segment { dma_addr, len }
    }

    #[test]
    fn one_page_two_pages_and_a_list() {
        let segs = [seg(0x10_0000, 64 * 1024)];
        let mut list = [0u64; LIST_ENTRIES];
        assert_eq!(build(&segs, 0, 4096, &mut list, 0xAAA000).unwrap(), Prps { prp1: 0x10_0000, prp2: 0, list_len: 0 });
        assert_eq!(
            build(&segs, 0, 8192, &mut list, 0xAAA000).unwrap(),
            Prps { prp1: 0x10_0000, prp2: 0x10_1000, list_len: 0 }
        );
        let p = build(&segs, 0, 12288, &mut list, 0xAAA000).unwrap();
        assert_eq!(p, Prps { prp1: 0x10_0000, prp2: 0xAAA000, list_len: 2 });
        assert_eq!(&list[..2], &[0x10_1000, 0x10_2000]);
        // An offset inside the first page: PRP1 carries it, the rest are whole pages.
        let p = build(&segs, 512, 4096, &mut list, 0xAAA000).unwrap();
        assert_eq!(p, Prps { prp1: 0x10_0200, prp2: 0x10_1000, list_len: 0 });
    }

    #[test]
    fn scattered_segments_and_errors() {
        let segs = [seg(0x5000, 4096), seg(0x9000, 8192), seg(0x2_0000, 4096)];
        let mut list = [0u64; LIST_ENTRIES];
        let p = build(&segs, 0, 16384, &mut list, 0xF000).unwrap();
        assert_eq!(p.prp1, 0x5000);
        assert_eq!(&list[..p.list_len], &[0x9000, 0xA000, 0x2_0000]);
        assert_eq!(build(&segs, 2, 8, &mut list, 0), Err(PrpError::Unaligned));
        assert_eq!(build(&segs, 0, 0, &mut list, 0), Err(PrpError::Empty));
        assert_eq!(build(&segs, 4096, 16384, &mut list, 0), Err(PrpError::OutOfRange));
        // A segment ending mid-page inside the transfer.
        let bad = [seg(0x5000, 2048), seg(0x9000, 4096)];
        assert_eq!(build(&bad, 0, 4096, &mut list, 0), Err(PrpError::Discontiguous));
        assert_eq!(build(&[seg(0, 4 << 20)], 0, 4 << 20, &mut list, 0), Err(PrpError::TooLarge));
    }

    #[test]
    fn two_pages_straddling_a_segment_boundary_take_the_general_path() {
        // PRP1's page ends the first segment; the second page is elsewhere in bus memory.
        let segs = [seg(0x5000, 4096), seg(0x9000, 4096)];
        let mut list = [0u64; LIST_ENTRIES];
        assert_eq!(build(&segs, 1024, 4096, &mut list, 0).unwrap(), Prps { prp1: 0x5400, prp2: 0x9000, list_len: 0 });
        assert_eq!(build(&segs, 0, 8192, &mut list, 0).unwrap(), Prps { prp1: 0x5000, prp2: 0x9000, list_len: 0 });
        // Inside one segment: PRP2 is the next page of the same segment.
        let one = [seg(0x7000, 3 * 4096)];
        assert_eq!(build(&one, 4092, 8, &mut list, 0).unwrap(), Prps { prp1: 0x7FFC, prp2: 0x8000, list_len: 0 });
        assert_eq!(build(&one, 4096, 4096, &mut list, 0).unwrap(), Prps { prp1: 0x8000, prp2: 0, list_len: 0 });
    }

    proptest! {
        /// For any geometry (4 KiB, 64 KiB or 2 MiB segments, scattered), offset and length,
        /// the PRPs name exactly the bus addresses of the requested bytes, page by page.
        #[test]
        fn prps_cover_exactly_the_range(
            seg_kind in 0usize..3,
            nsegs in 1usize..12,
            base_pages in proptest::collection::vec(1u64..1_000_000, 12),
            off_words in 0u64..1_000_000,
            len in 1u64..(1 << 21),
        ) {
            let seg_len = [4096u64, 65536, 2 << 20][seg_kind];
            let segs: Vec<Segment> = (0..nsegs).map(|i| seg(base_pages[i] << 21, seg_len)).collect();
            let total = seg_len * nsegs as u64;
            let off = (off_words * 4) % total;
            let len = len.min(total - off);
            let mut list = [0u64; LIST_ENTRIES];
            match build(&segs, off, len, &mut list, 0xDEAD_0000) {
                Ok(p) => {
                    // Reconstruct the page addresses the device would use and compare with the
                    // bus address of every page-start byte of the range.
                    let mut pages = vec![p.prp1];
                    match p.list_len {
                        0 if p.prp2 != 0 => pages.push(p.prp2),
                        0 => {}
                        n => { prop_assert_eq!(p.prp2, 0xDEAD_0000); pages.extend_from_slice(&list[..n]); }
                    }
                    let mut cur = (0, 0);
                    let mut pos = off;
                    for (i, a) in pages.iter().enumerate() {
                        let (want, _) = locate(&segs, pos, &mut cur).unwrap();
                        prop_assert_eq!(*a, want);
                        if i > 0 { prop_assert_eq!(a % PAGE, 0); }
                        pos = (pos + PAGE - (want % PAGE)).min(off + len);
                    }
                    prop_assert_eq!(pos, off + len);
                }
                Err(PrpError::TooLarge) => prop_assert!(len.div_ceil(PAGE) > LIST_ENTRIES as u64 - 1),
                Err(e) => prop_assert!(false, "unexpected {:?}", e),
            }
        }
    }
}

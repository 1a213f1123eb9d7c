//! Scatter-Gather List construction (NVMe base spec 2.0, section 4.1.2), pure and testable: from
//! a registration's DMA segments, a byte offset and a length, compute SGL1 (the descriptor in the
//! command's DPTR) and the descriptors of the segments it points to.
//!
//! One Data Block descriptor per contiguous run of bus memory (segments that touch on the bus
//! merge; a run longer than [`MAX_BLOCK`] is split). One run: SGL1 is that Data Block and no list
//! is written. More runs: SGL1 points to a segment at the start of the first list page. A page
//! holds [`PER_PAGE`] descriptors; when more runs remain than fit, the page's last descriptor is
//! a Segment descriptor naming the next page (chaining). The last segment is named by a Last
//! Segment descriptor and holds data blocks only. Compared with PRPs, a contiguous 2 MiB run
//! costs one 16-byte descriptor instead of a 4 KiB list, and a segment boundary may fall anywhere.

use crate::prp::{PrpError, Walk, PAGE};

/// Bytes of one SGL descriptor.
pub const DESC_BYTES: usize = 16;

/// Descriptors that fit one list page.
pub const PER_PAGE: usize = PAGE as usize / DESC_BYTES;

/// Longest data block built (Data Block lengths are 32-bit; kept a multiple of the page).
pub const MAX_BLOCK: u64 = 0xFFFF_F000;

/// How the commands of a queue pair describe their memory (see the README's "PRPs and SGLs").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataPointers {
    /// Per command: PRPs for one or two pages; for larger transfers an SGL where the controller
    /// supports SGLs and the SGL needs fewer descriptor bytes than the PRP list (few large
    /// contiguous runs), or where PRPs cannot describe the memory at all.
    #[default]
    Auto,
    /// PRPs only (what every controller supports).
    PrpOnly,
    /// An SGL for every data transfer the controller and the command's list page allow; PRPs
    /// otherwise. For tests and benchmarks.
    SglPreferred,
}

/// Identify Controller SGLS bits 1:0 (base spec 2.0, figure 275): the controller's SGL support
/// for NVM I/O commands, and whether data blocks must be dword aligned. `None`: no SGLs.
pub fn alignment_from_sgls(sgls: u32) -> Option<Alignment> {
    match sgls & 3 {
        1 => Some(Alignment::Any),
        2 => Some(Alignment::Dword),
        _ => None,
    }
}

/// What the controller requires of data block addresses and lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alignment {
    /// Byte granularity.
    Any,
    /// Dword alignment and granularity (SGLS bits 1:0 = 10b).
    Dword,
}

/// SGL descriptor types used here (byte 15 bits 7:4; sub type 0h, address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Data Block: `len` bytes of data at `addr`.
    DataBlock = 0x0,
    /// Segment: `len` bytes of descriptors at `addr`, the last of which names the next segment.
    Segment = 0x2,
    /// Last Segment: `len` bytes of data block descriptors at `addr`.
    LastSegment = 0x3,
}

/// One SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    /// Bus address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Type.
    pub kind: Kind,
}

impl Desc {
    /// The descriptor as its two quadwords (bytes 0..8: address; 8..12: length; byte 15:
    /// type in bits 7:4, sub type 0h in bits 3:0).
    #[inline]
    pub const fn qwords(self) -> [u64; 2] {
        [self.addr, self.len as u64 | (self.kind as u64) << 60]
    }

    /// Decodes two quadwords; `None` for a type or sub type this module does not build.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn decode(q: [u64; 2]) -> Option<Desc> {
        // CAST: bytes 8..12 and byte 15 of the descriptor.
        let (len, id) = (q[1] as u32, (q[1] >> 56) as u8);
        let kind = match id {
            0x00 => Kind::DataBlock,
            0x20 => Kind::Segment,
            0x30 => Kind::LastSegment,
            _ => return None,
        };
        Some(Desc { addr: q[0], len, kind })
    }
}

/// The SGL of one command: SGL1 for DPTR, and how many descriptors went to the list pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sgl {
    /// The descriptor that goes into DPTR.
    pub sgl1: Desc,
    /// Descriptor slots written in the list pages (data blocks and chaining Segment descriptors;
    /// slot `i` lies in page `i / PER_PAGE`, at byte `16 * (i % PER_PAGE)`).
    pub slots: usize,
    /// Data block descriptors in all.
    pub blocks: usize,
}

/// Where descriptors go while an SGL is built.
struct Writer<'p, F> {
    pages: &'p [u64],
    max_blocks: usize,
    sink: F,
    /// The next free slot.
    slot: usize,
    blocks: usize,
    /// The slot of the (not yet written) descriptor that names the current segment; `None`:
    /// SGL1 names it.
    ptr_slot: Option<usize>,
    /// The pointer to the first segment, once it is known to be a full page.
    sgl1: Option<Desc>,
}

impl<F: FnMut(usize, Desc)> Writer<'_, F> {
    /// Appends a data block that is not the last one: when it would take the last slot of a
    /// page, that slot chains to the next page instead.
    #[inline]
    fn push(&mut self, d: Desc) -> Result<(), PrpError> {
        if self.blocks + 1 >= self.max_blocks {
            // This one and the one after it would exceed the budget.
            return Err(PrpError::TooLarge);
        }
        if self.slot % PER_PAGE == PER_PAGE - 1 {
            if self.pages.len() <= self.slot / PER_PAGE + 1 {
                return Err(PrpError::TooLarge);
            }
            // The current segment is full: whatever names it names a whole page, and more follows.
            let page = self.pages[self.slot / PER_PAGE];
            self.name_segment(Desc { addr: page, len: PAGE as u32, kind: Kind::Segment });
            // This slot names the next page; its length and type are known once that segment
            // closes.
            self.ptr_slot = Some(self.slot);
            self.slot += 1;
        }
        self.put(d)
    }

    #[inline]
    fn put(&mut self, d: Desc) -> Result<(), PrpError> {
        if self.slot / PER_PAGE >= self.pages.len() {
            return Err(PrpError::TooLarge);
        }
        (self.sink)(self.slot, d);
        self.slot += 1;
        self.blocks += 1;
        Ok(())
    }

    fn name_segment(&mut self, ptr: Desc) {
        match self.ptr_slot {
            None => self.sgl1 = Some(ptr),
            Some(s) => (self.sink)(s, ptr),
        }
    }

    /// Appends the last data block and closes the last segment.
    fn finish(mut self, last: Desc) -> Result<Sgl, PrpError> {
        if self.blocks == 0 {
            return Ok(Sgl { sgl1: last, slots: 0, blocks: 1 });
        }
        self.put(last)?;
        let page = (self.slot - 1) / PER_PAGE;
        // CAST: at most PER_PAGE descriptors of 16 bytes.
        let len = ((self.slot - page * PER_PAGE) * DESC_BYTES) as u32;
        self.name_segment(Desc { addr: self.pages[page], len, kind: Kind::LastSegment });
        let sgl1 = self.sgl1.ok_or(PrpError::TooLarge)?;
        Ok(Sgl { sgl1, slots: self.slot, blocks: self.blocks })
    }
}

/// Builds the SGL for the `len` bytes `walk` finds (one range of a registration, or several
/// gathered). `pages` are the bus addresses of the list pages the command may use, in order;
/// each list slot `(index, descriptor)` goes to `sink` (a slot may be handed out twice: the later
/// value counts). At most `max_blocks` data blocks (and never more than the pages hold); beyond
/// that `TooLarge`, so a caller can bound the SGL by what the PRP list would cost. On error,
/// slots already handed out are garbage to ignore.
#[inline]
pub fn build_with<W: Walk>(
    mut walk: W,
    len: u64,
    pages: &[u64],
    align: Alignment,
    max_blocks: usize,
    sink: impl FnMut(usize, Desc),
) -> Result<Sgl, PrpError> {
    if len == 0 {
        return Err(PrpError::Empty);
    }
    if max_blocks == 0 {
        return Err(PrpError::TooLarge);
    }
    let unaligned = |a: u64, n: u64| align == Alignment::Dword && (!a.is_multiple_of(4) || !n.is_multiple_of(4));
    let mut w = Writer { pages, max_blocks, sink, slot: 0, blocks: 0, ptr_slot: None, sgl1: None };
    let mut pos = 0u64;
    let end = len;
    // The run being gathered: (bus address, length).
    let mut run: Option<(u64, u64)> = None;
    while pos < end {
        let (addr, contig) = walk.at(pos).ok_or(PrpError::OutOfRange)?;
        let mut take = contig.min(end - pos);
        if let Some((a, n)) = run.as_mut() {
            if *a + *n == addr && *n < MAX_BLOCK {
                // Touches the run on the bus: it grows.
                let add = take.min(MAX_BLOCK - *n);
                *n += add;
                pos += add;
                continue;
            }
            if unaligned(*a, *n) {
                return Err(PrpError::Unaligned);
            }
            // CAST: runs are at most MAX_BLOCK bytes.
            w.push(Desc { addr: *a, len: *n as u32, kind: Kind::DataBlock })?;
        }
        take = take.min(MAX_BLOCK);
        run = Some((addr, take));
        pos += take;
    }
    let (a, n) = run.ok_or(PrpError::Empty)?;
    if unaligned(a, n) {
        return Err(PrpError::Unaligned);
    }
    // CAST: runs are at most MAX_BLOCK bytes.
    w.finish(Desc { addr: a, len: n as u32, kind: Kind::DataBlock })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prp::{locate, OneRange};
    use proptest::prelude::*;
    use std::collections::HashMap;
    use ugds_uapi::ioctl::Segment;

    fn seg(dma_addr: u64, len: u64) -> Segment {
        Segment { dma_addr, len }
    }

    /// Builds into a map of slots (later writes win, as in memory).
    fn build(
        segs: &[Segment],
        off: u64,
        len: u64,
        pages: &[u64],
        align: Alignment,
        max: usize,
    ) -> Result<(Sgl, HashMap<usize, Desc>), PrpError> {
        let mut slots = HashMap::new();
        let s = build_with(OneRange::new(segs, off), len, pages, align, max, |i, d| {
            slots.insert(i, d);
        })?;
        Ok((s, slots))
    }

    /// Follows an SGL as a controller does (base spec 2.0, section 4.1.2.1): the data blocks in
    /// order. Checks that segments are 16-byte multiples, that only the last descriptor of a
    /// segment chains, and that a last segment holds data blocks only.
    fn walk(s: &Sgl, slots: &HashMap<usize, Desc>, pages: &[u64]) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut d = s.sgl1;
        loop {
            match d.kind {
                Kind::DataBlock => {
                    out.push((d.addr, d.len as u64));
                    return out;
                }
                Kind::Segment | Kind::LastSegment => {
                    assert!(d.len > 0 && (d.len as usize).is_multiple_of(DESC_BYTES), "segment length {}", d.len);
                    let page = pages.iter().position(|&p| p == d.addr).expect("a segment starts a list page");
                    let n = d.len as usize / DESC_BYTES;
                    assert!(n <= PER_PAGE);
                    let mut next = None;
                    for i in 0..n {
                        let e = slots[&(page * PER_PAGE + i)];
                        match e.kind {
                            Kind::DataBlock => out.push((e.addr, e.len as u64)),
                            _ => {
                                assert_eq!(d.kind, Kind::Segment, "a last segment holds data blocks only");
                                assert_eq!(i, n - 1, "only a segment's last descriptor chains");
                                next = Some(e);
                            }
                        }
                    }
                    match next {
                        Some(e) => d = e,
                        None => {
                            assert_eq!(d.kind, Kind::LastSegment, "a segment without a chain is the last");
                            return out;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn one_run_is_a_data_block_in_dptr() {
        let segs = [seg(0x10_0000, 4 << 20)];
        let (s, slots) = build(&segs, 4096, 2 << 20, &[0xA000], Alignment::Any, PER_PAGE).unwrap();
        assert_eq!(s, Sgl { sgl1: Desc { addr: 0x10_1000, len: 2 << 20, kind: Kind::DataBlock }, slots: 0, blocks: 1 });
        assert!(slots.is_empty(), "no list page");
        assert_eq!(Desc::decode(s.sgl1.qwords()), Some(s.sgl1), "the encoding round-trips: {:x?}", s.sgl1.qwords());
        assert_eq!(Desc { addr: 1, len: 16, kind: Kind::LastSegment }.qwords()[1], 16 | 0x30 << 56);
    }

    #[test]
    fn touching_segments_merge_and_scattered_ones_take_a_last_segment() {
        // Two segments adjacent on the bus, then one elsewhere; an unaligned start (SGLs allow
        // it where PRPs do not) and an end inside a page.
        let segs = [seg(0x5000, 4096), seg(0x6000, 8192), seg(0x2_0000, 4096)];
        let (s, slots) = build(&segs, 1, 14000, &[0xF000], Alignment::Any, PER_PAGE).unwrap();
        assert_eq!(s.sgl1, Desc { addr: 0xF000, len: 32, kind: Kind::LastSegment });
        assert_eq!((s.slots, s.blocks), (2, 2));
        assert_eq!(slots[&0], Desc { addr: 0x5001, len: 12287, kind: Kind::DataBlock });
        assert_eq!(slots[&1], Desc { addr: 0x2_0000, len: 14000 - 12287, kind: Kind::DataBlock });
        // A segment boundary mid-page, which PRPs refuse.
        let bad_for_prps = [seg(0x5000, 2048), seg(0x9000, 4096)];
        let (s, _) = build(&bad_for_prps, 0, 4096, &[0xF000], Alignment::Any, PER_PAGE).unwrap();
        assert_eq!(s.blocks, 2);
    }

    #[test]
    fn errors_alignment_and_budget() {
        let segs = [seg(0x5000, 4096), seg(0x9000, 4096), seg(0xD000, 4096)];
        let one = [0xF000];
        assert_eq!(build(&segs, 0, 0, &one, Alignment::Any, 8).unwrap_err(), PrpError::Empty);
        assert_eq!(build(&segs, 4096, 3 * 4096, &one, Alignment::Any, 8).unwrap_err(), PrpError::OutOfRange);
        assert_eq!(build(&segs, u64::MAX, 2, &one, Alignment::Any, 8).unwrap_err(), PrpError::OutOfRange);
        // Dword granularity: an odd address or length is refused; byte granularity takes it.
        assert_eq!(build(&segs, 2, 8, &one, Alignment::Dword, 8).unwrap_err(), PrpError::Unaligned);
        assert_eq!(build(&segs, 0, 4097, &one, Alignment::Dword, 8).unwrap_err(), PrpError::Unaligned);
        assert!(build(&segs, 2, 8, &one, Alignment::Any, 8).is_ok());
        assert!(build(&segs, 4, 8192, &one, Alignment::Dword, 8).is_ok());
        // Three runs: a budget of two blocks (or no page at all) is too small.
        assert_eq!(build(&segs, 0, 3 * 4096, &one, Alignment::Any, 2).unwrap_err(), PrpError::TooLarge);
        assert_eq!(build(&segs, 0, 3 * 4096, &[], Alignment::Any, 8).unwrap_err(), PrpError::TooLarge);
        assert_eq!(build(&segs, 0, 3 * 4096, &one, Alignment::Any, 3).unwrap().0.blocks, 3);
        // One run needs no page.
        assert_eq!(build(&segs, 0, 4096, &[], Alignment::Any, 1).unwrap().0.blocks, 1);
    }

    #[test]
    fn a_full_page_chains_to_the_next() {
        // 256 scattered pages fill one page exactly; 257 need a second page.
        let segs: Vec<Segment> = (0..600).map(|i| seg(0x100_0000 + i * 0x2000, 4096)).collect();
        let pages = [0xA000, 0xB000, 0xC000];
        let (s, slots) = build(&segs, 0, 256 * 4096, &pages, Alignment::Any, usize::MAX).unwrap();
        assert_eq!(s.sgl1, Desc { addr: 0xA000, len: 4096, kind: Kind::LastSegment });
        assert_eq!((s.slots, s.blocks), (256, 256));
        let (s, slots2) = build(&segs, 0, 257 * 4096, &pages, Alignment::Any, usize::MAX).unwrap();
        assert_eq!(s.sgl1, Desc { addr: 0xA000, len: 4096, kind: Kind::Segment });
        assert_eq!(slots2[&255], Desc { addr: 0xB000, len: 32, kind: Kind::LastSegment });
        assert_eq!((s.slots, s.blocks), (258, 257));
        assert_eq!(walk(&s, &slots2, &pages).len(), 257);
        assert_eq!(
            walk(&build(&segs, 0, 256 * 4096, &pages, Alignment::Any, 300).unwrap().0, &slots, &pages).len(),
            256
        );
        // 600 pages need three; two pages hold at most 255 + 256.
        assert_eq!(
            build(&segs, 0, 512 * 4096, &pages[..2], Alignment::Any, usize::MAX).unwrap_err(),
            PrpError::TooLarge
        );
        assert_eq!(build(&segs, 0, 511 * 4096, &pages[..2], Alignment::Any, usize::MAX).unwrap().0.slots, 512);
    }

    proptest! {
        /// For any geometry (segments of 1 to 16 pages, some touching on the bus, some not), byte
        /// offset and length, and any number of list pages: the data blocks, followed as a
        /// controller does, name exactly the bus addresses of the requested bytes in order, each
        /// block contiguous, lengths summing to the transfer; segments chain only through a
        /// page's last slot; descriptors never exceed the pages. `TooLarge` only when the runs
        /// truly do not fit.
        #[test]
        fn sgl_covers_exactly_the_range(
            lens in proptest::collection::vec(1u64..16, 1..40),
            touch in proptest::collection::vec(any::<bool>(), 40),
            off in 0u64..(1 << 20),
            len in 1u64..(1 << 21),
            npages in 0usize..4,
            dword in any::<bool>(),
        ) {
            let mut segs = Vec::new();
            let mut bus = 0x1_0000_0000u64;
            for (i, l) in lens.iter().enumerate() {
                if !touch[i] { bus += 0x10_0000; }
                segs.push(seg(bus, l * 4096));
                bus += l * 4096;
            }
            let total: u64 = segs.iter().map(|s| s.len).sum();
            let off = off % total;
            let len = len.min(total - off);
            let pages: Vec<u64> = (0..npages as u64).map(|p| 0xDEAD_0000 + p * 4096).collect();
            let align = if dword { Alignment::Dword } else { Alignment::Any };
            // Contiguous runs of the range, as the reference.
            let mut runs: Vec<(u64, u64)> = Vec::new();
            let (mut cur, mut pos) = ((0, 0), off);
            while pos < off + len {
                let (a, c) = locate(&segs, pos, &mut cur).unwrap();
                let n = c.min(off + len - pos);
                match runs.last_mut() {
                    Some((ra, rn)) if *ra + *rn == a => *rn += n,
                    _ => runs.push((a, n)),
                }
                pos += n;
            }
            let fits = runs.len() == 1 || runs.len() <= npages * PER_PAGE - npages.saturating_sub(1);
            match build(&segs, off, len, &pages, align, usize::MAX) {
                Ok((s, slots)) => {
                    prop_assert!(fits);
                    let got = walk(&s, &slots, &pages);
                    prop_assert_eq!(&got, &runs);
                    prop_assert_eq!(got.iter().map(|r| r.1).sum::<u64>(), len);
                    prop_assert_eq!(s.blocks, runs.len());
                    prop_assert!(slots.keys().all(|&k| k < s.slots && k / PER_PAGE < npages));
                    if dword { prop_assert!(got.iter().all(|&(a, n)| a % 4 == 0 && n % 4 == 0)); }
                }
                Err(PrpError::TooLarge) => prop_assert!(!fits),
                Err(PrpError::Unaligned) => {
                    prop_assert!(dword && runs.iter().any(|&(a, n)| a % 4 != 0 || n % 4 != 0));
                }
                Err(e) => prop_assert!(false, "unexpected {:?}", e),
            }
        }
    }
}

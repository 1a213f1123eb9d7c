//! NVM command builders (NVM command set spec 1.0, section 3): required fields in `new`,
//! optional ones as chainable setters, `build()` starting from a zeroed entry. Building is safe;
//! what lets the device touch memory is a [`DmaRange`], which only `unsafe` code can make.
//!
//! A built [`Command`] is written straight into its SQ slot by [`Command::write`], which also
//! fills the command's own list page: the PRP list of a transfer over more than two pages, the
//! SGL segment of a transfer over several runs of bus memory, or the range list of a Dataset
//! Management command. Whether a transfer uses PRPs or an SGL is chosen per command
//! ([`DptrPolicy`]).
//!
//! Optional setters the library does not use yet are kept for tests and fuzzing
//! (`allow(dead_code)` outside those builds), as is the rest of the engine's test surface.

use crate::mem::QueueMemory;
use crate::prp::{self, OneRange, PrpError, Walk, LIST_ENTRIES, PAGE};
use crate::ring::sq::SqSlot;
use crate::sgl::{self, Alignment, DataPointers};
use ugds_uapi::ioctl::Segment;
use ugds_uapi::queue::nvm;

/// A byte range of a registration, described by the registration's DMA segments: what a read
/// or write command transfers.
#[derive(Debug, Clone, Copy)]
pub struct DmaRange<'a> {
    segs: &'a [Segment],
    off: u64,
    len: u64,
    /// The controller epoch the segments are known valid in (a dma-buf its exporter may
    /// revoke); `None`: valid for as long as the registration lives.
    epoch: Option<u64>,
    /// The pieces it gathers: `stride.first < len`; else one range from `off`.
    stride: Stride,
}

/// Pieces of a buffer at a fixed distance, as one command gathers them: `first` bytes, then
/// pieces of `piece` bytes, each starting `gap` bytes after the end of the one before, as far as
/// the command's length reaches. A striped volume member's chunks of one request lie so: `gap`
/// is the other members' chunks between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stride {
    /// Bytes of the first piece.
    pub first: u64,
    /// Bytes of every later piece (the last one as far as the length reaches).
    pub piece: u64,
    /// Bytes between the end of a piece and the start of the next.
    pub gap: u64,
}

impl Stride {
    /// One range of `len` bytes (no further pieces yet).
    pub(crate) const fn one(len: u64) -> Self {
        Stride { first: len, piece: 0, gap: 0 }
    }

    /// Takes a next piece that starts `gap` bytes after the end of the last one (`last` bytes
    /// long) and has `avail` bytes, with `room` bytes left in the command; returns how many it
    /// takes, 0 where the piece does not keep the stride. The first further piece sets the
    /// stride (its length and distance); after it a piece must follow a whole piece at the same
    /// distance, and no more of it is taken than a piece (past it, another command goes on).
    /// `jumps` says whether the data may jump there (asked last: it may cost a lookup).
    pub(crate) fn take_next(
        &mut self,
        last: u64,
        gap: u64,
        avail: u64,
        room: u64,
        jumps: impl FnOnce() -> bool,
    ) -> u64 {
        let first_jump = self.piece == 0;
        if avail == 0 || !(first_jump || (last == self.piece && gap == self.gap)) || !jumps() {
            return 0;
        }
        if first_jump {
            (self.piece, self.gap) = (avail, gap);
        }
        room.min(avail).min(self.piece)
    }
}

impl<'a> DmaRange<'a> {
    /// Bytes `[off, off + len)` of the memory that `segs` map.
    ///
    /// # Safety
    ///
    /// A command built with this range lets the device read or write that memory, so until every
    /// such command has completed (or the controller was reset after it):
    /// - `segs` are the DMA segments of a registration that stays registered (pinned and
    ///   mapped for this controller);
    /// - for a read, nothing else reads or writes the range, and no Rust reference to it exists;
    /// - `len` is exactly the command's transfer length (its blocks times the block size), so
    ///   the device moves no byte outside the range.
    pub unsafe fn new(segs: &'a [Segment], off: u64, len: u64) -> Self {
        DmaRange { segs, off, len, epoch: None, stride: Stride::one(len) }
    }

    /// `len` bytes gathered from pieces of the memory `segs` map, the first at `off`, laid out
    /// as `stride` says. One command then moves a namespace's run of blocks from or to pieces
    /// that lie apart in the buffer (a striped volume member's chunks). A piece outside `segs`
    /// makes the command fail when it is written.
    ///
    /// # Safety
    ///
    /// As [`DmaRange::new`], for every byte of every piece (up to `len` bytes in all), and
    /// `len` is exactly the command's transfer length.
    pub(crate) unsafe fn gather(segs: &'a [Segment], off: u64, stride: Stride, len: u64) -> Self {
        // A first piece of no bytes would start the data `gap` bytes in.
        debug_assert!(stride.first > 0 && (stride.piece > 0 || stride.first >= len), "{stride:?} over {len}");
        DmaRange { segs, off, len, epoch: None, stride }
    }

    /// Whether it gathers several pieces.
    #[inline(always)]
    fn gathers(&self) -> bool {
        self.stride.first < self.len
    }

    /// Its bytes piece by piece, as the data pointer builders walk them.
    fn pieces(&self) -> Pieces<'a> {
        let first = (self.off, self.stride.first);
        Pieces { segs: self.segs, cur: (0, 0), stride: self.stride, first, at: (0, first) }
    }

    /// The segments it is walked in and its offset into the first of them (tests).
    #[cfg(test)]
    pub(crate) fn parts(&self) -> (&'a [Segment], u64) {
        (self.segs, self.off)
    }

    /// The same range, valid only while the controller is in `epoch`: an exporter's revocation
    /// resets the controller (a new epoch), and a queue refuses a command tagged with an older
    /// epoch than its own ([`Command::valid_in`]).
    pub(crate) fn only_in(self, epoch: u64) -> Self {
        DmaRange { epoch: Some(epoch), ..self }
    }
}

/// A gathered [`DmaRange`]'s bytes on the bus, piece by piece.
struct Pieces<'a> {
    segs: &'a [Segment],
    cur: (usize, u64),
    stride: Stride,
    /// The first piece: its offset in `segs`, its bytes.
    first: (u64, u64),
    /// Where the last position asked for was: the transfer byte where its piece starts, and
    /// the piece's offset in `segs` and bytes.
    at: (u64, (u64, u64)),
}

impl Walk for Pieces<'_> {
    fn at(&mut self, pos: u64) -> Option<(u64, u64)> {
        if pos < self.at.0 {
            // Asked backwards (the builders do not): from the first piece again.
            self.at = (0, self.first);
        }
        loop {
            let (start, (off, len)) = self.at;
            let within = pos - start;
            if within < len {
                let (addr, contig) = prp::locate(self.segs, off.checked_add(within)?, &mut self.cur)?;
                return Some((addr, contig.min(len - within)));
            }
            // Pieces of no bytes would never reach `pos`.
            if self.stride.piece == 0 {
                return None;
            }
            let next = off.checked_add(len)?.checked_add(self.stride.gap)?;
            self.at = (start + len, (next, self.stride.piece));
        }
    }
}

/// One Dataset Management range (16 bytes on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmRange {
    /// Context attributes (access hints); 0 for none.
    pub attributes: u32,
    /// Starting LBA.
    pub slba: u64,
    /// Length in blocks (a count, not zero-based).
    pub nlb: u32,
}

impl DsmRange {
    /// `nlb` blocks at `slba`, without context attributes.
    pub const fn new(slba: u64, nlb: u32) -> Self {
        DsmRange { attributes: 0, slba, nlb }
    }
}

/// Most ranges one Dataset Management command carries (one 4 KiB page of 16-byte ranges).
pub const DSM_MAX_RANGES: usize = 256;

/// What a command points at besides its dwords.
#[derive(Debug, Clone, Copy)]
enum Data<'a> {
    None,
    Prp(DmaRange<'a>),
    Ranges(&'a [DsmRange]),
}

/// A built NVM I/O command: opcode, command dwords 10..=15 and what it points at. The command
/// id, namespace and data pointers are filled in when it is written into a slot.
#[derive(Debug, Clone, Copy)]
pub struct Command<'a> {
    opcode: u8,
    cdw: [u32; 6],
    data: Data<'a>,
}

/// What the data pointer of a queue pair's transfers may be: fixed when the queue pair is made,
/// from the caller's [`DataPointers`] and the controller's Identify SGLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DptrPolicy {
    /// SGLs allowed, under this alignment rule; `None`: PRPs only.
    sgl: Option<Alignment>,
    /// SGL for every transfer that fits (else only where it costs fewer descriptor bytes).
    prefer: bool,
}

impl DptrPolicy {
    /// PRPs only.
    pub const PRP_ONLY: DptrPolicy = DptrPolicy { sgl: None, prefer: false };

    /// The policy for `mode` on a controller reporting `sgls` (Identify Controller SGLS): SGLs
    /// only where bits 1:0 say the controller supports them for NVM commands.
    pub fn new(mode: DataPointers, sgls: u32) -> DptrPolicy {
        match (mode, sgl::alignment_from_sgls(sgls)) {
            (DataPointers::PrpOnly, _) | (_, None) => Self::PRP_ONLY,
            (DataPointers::Auto, a) => DptrPolicy { sgl: a, prefer: false },
            (DataPointers::SglPreferred, a) => DptrPolicy { sgl: a, prefer: true },
        }
    }

    /// True when SGLs may be used.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn sgls(&self) -> bool {
        self.sgl.is_some()
    }
}

/// What a written command's data pointer turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dptr {
    /// No data, or a DSM range list (PRP1 names the list page).
    Other,
    /// PRP1/PRP2, maybe with a PRP list.
    Prp,
    /// An SGL (PSDT 01b) of one data block, in DPTR.
    Sgl,
    /// An SGL whose data blocks are in a segment of the list page.
    SglList,
}

/// CDW0 PSDT (bits 15:14) = 01b: SGLs for the data, a contiguous buffer for metadata.
const PSDT_SGL: u64 = 1 << 14;

impl Dptr {
    /// Its CDW0 PSDT bits: [`PSDT_SGL`] for the SGL kinds, else 0. Computed from the
    /// discriminant's bit 1, which only the SGL kinds have (checked below): two instructions
    /// instead of a compare and select on every command.
    #[inline(always)]
    const fn psdt(self) -> u64 {
        // CAST: a fieldless enum's discriminant, below 4.
        ((self as u64) & 2) << 13
    }
}

const _: () = {
    assert!(Dptr::Other.psdt() == 0 && Dptr::Prp.psdt() == 0);
    assert!(Dptr::Sgl.psdt() == PSDT_SGL && Dptr::SglList.psdt() == PSDT_SGL);
};

/// The page of the queue's PRP-list pool that belongs to a command id: it holds the command's
/// PRP list, SGL segment or DSM range list.
#[derive(Debug)]
pub struct ListPage<'m, M: ?Sized> {
    /// The pool.
    pub mem: &'m M,
    /// The page's byte offset in the pool.
    pub off: usize,
    /// The page's bus address.
    pub bus: u64,
}

impl<'a> Command<'a> {
    /// Whether the command may be written into the rings of `epoch`: its memory is not one that
    /// was only known valid in an earlier epoch.
    #[inline]
    pub(crate) fn valid_in(&self, epoch: u64) -> Result<(), u64> {
        match self.data {
            Data::Prp(DmaRange { epoch: Some(e), .. }) if e != epoch => Err(e),
            _ => Ok(()),
        }
    }

    /// A zeroed command with `opcode`.
    const fn zeroed(opcode: u8) -> Self {
        Command { opcode, cdw: [0; 6], data: Data::None }
    }

    fn set_cdw(&mut self, n: usize, v: u32) {
        self.cdw[n - 10] = v;
    }

    fn set_slba_nlb(&mut self, slba: u64, nlb: u32) {
        // CAST: the low and high dwords of the LBA; the zero-based 16-bit block count.
        self.set_cdw(10, slba as u32);
        self.set_cdw(11, (slba >> 32) as u32);
        self.cdw[2] = (self.cdw[2] & 0xFFFF_0000) | (nlb.wrapping_sub(1) & 0xFFFF);
    }

    /// Command dword `n` (10..=15).
    pub fn cdw(&self, n: usize) -> u32 {
        self.cdw.get(n.wrapping_sub(10)).copied().unwrap_or(0)
    }

    /// The command's name, for errors.
    pub fn name(&self) -> &'static str {
        match self.opcode {
            nvm::READ => "read",
            nvm::WRITE => "write",
            nvm::FLUSH => "flush",
            nvm::WRITE_ZEROES => "write zeroes",
            nvm::DATASET_MANAGEMENT if self.cdw(11) & DSM_DEALLOCATE != 0 => "deallocate",
            nvm::DATASET_MANAGEMENT => "dataset management",
            _ => "command",
        }
    }

    /// The bytes it moves (0 for a command without data).
    #[inline]
    pub fn bytes(&self) -> u64 {
        match self.data {
            Data::Prp(r) => r.len,
            _ => 0,
        }
    }

    /// The first LBA the command names (0 when it names none), for errors.
    pub fn slba(&self) -> u64 {
        match self.data {
            Data::Ranges(r) => r.first().map_or(0, |r| r.slba),
            _ if self.opcode == nvm::FLUSH => 0,
            _ => self.cdw(10) as u64 | (self.cdw(11) as u64) << 32,
        }
    }

    /// Writes the command into `slot` with command id `cid` and namespace `nsid`: first its
    /// list page (a PRP list, an SGL segment, or DSM ranges), then each of the slot's eight
    /// quadwords once. A transfer's data pointer follows `policy`; what it became is returned.
    /// On error the slot is untouched (the list page may hold garbage, which nothing names).
    #[inline(always)]
    pub fn write<M, P>(
        &self,
        slot: &SqSlot<'_, M>,
        cid: u16,
        nsid: u32,
        page: &ListPage<'_, P>,
        policy: DptrPolicy,
    ) -> Result<Dptr, PrpError>
    where
        M: QueueMemory + ?Sized,
        P: QueueMemory + ?Sized,
    {
        let (dptr, kind) = self.data_pointers(page, policy)?;
        let psdt = kind.psdt();
        slot.store_all([
            (self.opcode as u64 | psdt | (cid as u64) << 16) | (nsid as u64) << 32,
            0,
            0,
            dptr[0],
            dptr[1],
            self.cdw[0] as u64 | (self.cdw[1] as u64) << 32,
            self.cdw[2] as u64 | (self.cdw[3] as u64) << 32,
            self.cdw[4] as u64 | (self.cdw[5] as u64) << 32,
        ]);
        Ok(kind)
    }

    /// DPTR (PRP1 and PRP2, or SGL1), writing the list page where one is needed.
    #[inline(always)]
    fn data_pointers<P: QueueMemory + ?Sized>(
        &self,
        page: &ListPage<'_, P>,
        policy: DptrPolicy,
    ) -> Result<([u64; 2], Dptr), PrpError> {
        match &self.data {
            Data::None => Ok(([0, 0], Dptr::Other)),
            Data::Prp(r) => {
                let Some(align) = policy.sgl else { return prps(r, page) };
                // Descriptor budget: the SGL is used when its list costs fewer bytes than the PRP
                // list would (16 per data block, none for a single block, against 8 per page
                // after the first, none for one or two pages). Pages counted from the offset
                // inside the registration, whose segments start on page boundaries.
                // Saturating: a range past the registration is refused by the builders below.
                let span = (r.off % PAGE).saturating_add(r.len);
                let budget = match (policy.prefer, span) {
                    (true, _) => sgl::PER_PAGE,
                    // One or two pages: no list either way.
                    (false, s) if s <= 2 * PAGE => 0,
                    // CAST: at most a few thousand pages per command.
                    (false, s) => ((s.div_ceil(PAGE) as usize - 2) / 2).max(1),
                };
                if budget > 0 {
                    if let Ok(s) = sgls(r, page, align, budget) {
                        return Ok(s);
                    }
                }
                match prps(r, page) {
                    // A segment boundary inside a page: only an SGL can describe it.
                    Err(PrpError::Discontiguous) if budget < sgl::PER_PAGE => sgls(r, page, align, sgl::PER_PAGE),
                    other => other,
                }
            }
            Data::Ranges(ranges) => {
                if ranges.is_empty() || ranges.len() > DSM_MAX_RANGES {
                    return Err(PrpError::TooLarge);
                }
                for (i, r) in ranges.iter().enumerate() {
                    let off = page.off + 16 * i;
                    page.mem.store32(off, r.attributes);
                    page.mem.store32(off + 4, r.nlb);
                    page.mem.store64(off + 8, r.slba);
                }
                // The range list fills at most the page, so PRP1 alone describes it.
                Ok(([page.bus, 0], Dptr::Other))
            }
        }
    }
}

/// PRP1 and PRP2 of `r`, the list (if any) written to `page`.
#[inline(always)]
fn prps<P: QueueMemory + ?Sized>(r: &DmaRange<'_>, page: &ListPage<'_, P>) -> Result<([u64; 2], Dptr), PrpError> {
    if r.gathers() {
        return gathered(r, page, None);
    }
    prps_of(OneRange::new(r.segs, r.off), r.len, page)
}

/// SGL1 of `r` with at most `budget` data blocks, the segment (if any) written to `page`.
#[inline]
fn sgls<P: QueueMemory + ?Sized>(
    r: &DmaRange<'_>,
    page: &ListPage<'_, P>,
    align: Alignment,
    budget: usize,
) -> Result<([u64; 2], Dptr), PrpError> {
    if r.gathers() {
        return gathered(r, page, Some((align, budget)));
    }
    sgls_of(OneRange::new(r.segs, r.off), r.len, page, align, budget)
}

/// [`prps`] (`sgl` none) or [`sgls`] of a gathered range, out of line: the one-range case,
/// every command's, stays short.
#[inline(never)]
fn gathered<P: QueueMemory + ?Sized>(
    r: &DmaRange<'_>,
    page: &ListPage<'_, P>,
    sgl: Option<(Alignment, usize)>,
) -> Result<([u64; 2], Dptr), PrpError> {
    match sgl {
        None => prps_of(r.pieces(), r.len, page),
        Some((align, budget)) => sgls_of(r.pieces(), r.len, page, align, budget),
    }
}

/// PRP1 and PRP2 of the `len` bytes `walk` finds, the list (if any) written to `page`.
#[inline(always)]
fn prps_of<P: QueueMemory + ?Sized>(
    walk: impl Walk,
    len: u64,
    page: &ListPage<'_, P>,
) -> Result<([u64; 2], Dptr), PrpError> {
    let p = prp::build_with(walk, len, page.bus, LIST_ENTRIES, |i, a| page.mem.store64(page.off + 8 * i, a))?;
    Ok(([p.prp1, p.prp2], Dptr::Prp))
}

/// SGL1 of the `len` bytes `walk` finds, the segment (if any) written to `page`.
#[inline(always)]
fn sgls_of<P: QueueMemory + ?Sized>(
    walk: impl Walk,
    len: u64,
    page: &ListPage<'_, P>,
    align: Alignment,
    budget: usize,
) -> Result<([u64; 2], Dptr), PrpError> {
    let s = sgl::build_with(walk, len, &[page.bus], align, budget, |i, d| {
        let [a, b] = d.qwords();
        page.mem.store64(page.off + sgl::DESC_BYTES * i, a);
        page.mem.store64(page.off + sgl::DESC_BYTES * i + 8, b);
    })?;
    Ok((s.sgl1.qwords(), if s.blocks > 1 { Dptr::SglList } else { Dptr::Sgl }))
}

/// CDW12 bit 30: Force Unit Access.
const FUA: u32 = 1 << 30;
/// Write Zeroes CDW12 bit 25: deallocate the blocks.
const DEAC: u32 = 1 << 25;
/// Dataset Management CDW11 bit 2: Attribute – Deallocate.
const DSM_DEALLOCATE: u32 = 1 << 2;

/// Read or write `nlb` blocks at `slba` into or from a [`DmaRange`]; `OPCODE` says which
/// ([`Read`] and [`Write`] name the two).
#[derive(Debug, Clone, Copy)]
pub struct Transfer<'a, const OPCODE: u8> {
    slba: u64,
    nlb: u32,
    data: DmaRange<'a>,
    fua: bool,
}

/// Read `nlb` blocks at `slba` into a [`DmaRange`].
pub type Read<'a> = Transfer<'a, { nvm::READ }>;
/// Write `nlb` blocks at `slba` from a [`DmaRange`].
pub type Write<'a> = Transfer<'a, { nvm::WRITE }>;

impl<'a, const OP: u8> Transfer<'a, OP> {
    /// The opcode.
    pub const OPCODE: u8 = OP;

    /// `nlb` (1..=65536) blocks at `slba`, into or from `data`.
    pub fn new(slba: u64, nlb: u32, data: DmaRange<'a>) -> Self {
        Transfer { slba, nlb, data, fua: false }
    }

    /// Force Unit Access: read from, or complete only once written to, non-volatile media.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn fua(mut self, on: bool) -> Self {
        self.fua = on;
        self
    }

    /// The command.
    pub fn build(self) -> Command<'a> {
        let mut c = Command::zeroed(Self::OPCODE);
        c.set_slba_nlb(self.slba, self.nlb);
        if self.fua {
            c.cdw[2] |= FUA;
        }
        c.data = Data::Prp(self.data);
        c
    }
}

/// Flush the volatile write cache.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flush;

impl Flush {
    /// The opcode.
    pub const OPCODE: u8 = nvm::FLUSH;

    /// A flush.
    pub const fn new() -> Self {
        Flush
    }

    /// The command.
    pub const fn build(self) -> Command<'static> {
        Command::zeroed(Self::OPCODE)
    }
}

/// Write zeroes to `nlb` blocks at `slba` (no data transfer).
#[derive(Debug, Clone, Copy)]
pub struct WriteZeroes {
    slba: u64,
    nlb: u32,
    deallocate: bool,
    fua: bool,
}

impl WriteZeroes {
    /// The opcode.
    pub const OPCODE: u8 = nvm::WRITE_ZEROES;

    /// `nlb` (1..=65536) blocks at `slba`.
    pub fn new(slba: u64, nlb: u32) -> Self {
        WriteZeroes { slba, nlb, deallocate: false, fua: false }
    }

    /// Let the controller deallocate the blocks (they still read as zeroes).
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn deallocate(mut self, on: bool) -> Self {
        self.deallocate = on;
        self
    }

    /// Force Unit Access.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn fua(mut self, on: bool) -> Self {
        self.fua = on;
        self
    }

    /// The command.
    pub fn build(self) -> Command<'static> {
        let mut c = Command::zeroed(Self::OPCODE);
        c.set_slba_nlb(self.slba, self.nlb);
        if self.deallocate {
            c.cdw[2] |= DEAC;
        }
        if self.fua {
            c.cdw[2] |= FUA;
        }
        c
    }
}

/// Dataset Management over up to [`DSM_MAX_RANGES`] ranges (written into the command's list
/// page); with [`DatasetManagement::deallocate`], a trim.
#[derive(Debug, Clone, Copy)]
pub struct DatasetManagement<'a> {
    ranges: &'a [DsmRange],
    deallocate: bool,
}

impl<'a> DatasetManagement<'a> {
    /// The opcode.
    pub const OPCODE: u8 = nvm::DATASET_MANAGEMENT;

    /// A command over `ranges` (1..=256 of them; others fail when the command is written).
    pub fn new(ranges: &'a [DsmRange]) -> Self {
        DatasetManagement { ranges, deallocate: false }
    }

    /// Deallocate (trim) the ranges.
    pub fn deallocate(mut self, on: bool) -> Self {
        self.deallocate = on;
        self
    }

    /// The command.
    pub fn build(self) -> Command<'a> {
        let mut c = Command::zeroed(Self::OPCODE);
        // CAST: NR is the zero-based range count in CDW10 bits 7:0 (at most 255 when valid).
        c.set_cdw(10, (self.ranges.len().wrapping_sub(1) & 0xFF) as u32);
        if self.deallocate {
            c.set_cdw(11, DSM_DEALLOCATE);
        }
        c.data = Data::Ranges(self.ranges);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::TestMemory;
    use crate::ring::sq::{Sq, SQE_BYTES};
    use crate::sgl::DataPointers;
    use ugds_uapi::Sqe;

    const SEGS: [Segment; 1] = [Segment { dma_addr: 0x10_0000, len: 1 << 20 }];

    fn range(off: u64, len: u64) -> DmaRange<'static> {
        // SAFETY: never handed to a device: the commands are only encoded into test memory.
        unsafe { DmaRange::new(&SEGS, off, len) }
    }

    /// Writes `c` into slot 0 of a fresh ring; returns the entry as dwords and the list page.
    fn encode(c: &Command<'_>, cid: u16, nsid: u32) -> Result<([u32; 16], TestMemory), PrpError> {
        let sqm = TestMemory::new(2 * SQE_BYTES);
        let pool = TestMemory::new(4096);
        let mut sq = Sq::new(2).unwrap();
        let slot = sq.push(&sqm).unwrap();
        c.write(&slot, cid, nsid, &ListPage { mem: &pool, off: 0, bus: 0xAB000 }, DptrPolicy::PRP_ONLY)?;
        Ok((std::array::from_fn(|i| sqm.load32(4 * i).to_le()), pool))
    }

    /// The same command through uapi's `Sqe` setters: an independent encoding.
    fn reference(opcode: u8, cid: u16, nsid: u32, prps: (u64, u64), cdw: [(usize, u32); 3]) -> [u32; 16] {
        let mut s = Sqe::new(opcode, cid);
        s.set_nsid(nsid);
        s.set_prps(prps.0, prps.1);
        for (n, v) in cdw {
            s.set_cdw(n, v);
        }
        s.to_dwords()
    }

    #[test]
    fn read_write_encode_as_the_spec_says() {
        let (got, _) = encode(&Read::new(0x1_2345_6789, 8, range(512, 4096)).build(), 7, 1).unwrap();
        let want = reference(nvm::READ, 7, 1, (0x10_0200, 0x10_1000), [(10, 0x2345_6789), (11, 1), (12, 7)]);
        assert_eq!(got, want);
        let c = Write::new(5, 65536, range(0, 4096)).fua(true).build();
        assert_eq!((c.name(), c.slba(), c.cdw(12)), ("write", 5, FUA | 0xFFFF));
        let (got, _) = encode(&c, 3, 2).unwrap();
        assert_eq!(got, reference(nvm::WRITE, 3, 2, (0x10_0000, 0), [(10, 5), (11, 0), (12, FUA | 0xFFFF)]));
    }

    #[test]
    fn memory_checked_in_one_epoch_is_refused_in_another() {
        // Host memory: any epoch.
        assert_eq!(Read::new(0, 1, range(0, 4096)).build().valid_in(7), Ok(()));
        // A revocable registration checked alive in epoch 3.
        let c = Read::new(0, 1, range(0, 4096).only_in(3)).build();
        assert_eq!(c.valid_in(3), Ok(()));
        assert_eq!(c.valid_in(5), Err(3), "a reset since the check may have been a revocation");
        // Commands without data carry no memory to check.
        assert_eq!(Flush::new().build().valid_in(9), Ok(()));
    }

    #[test]
    fn long_transfers_write_their_list_page() {
        let (got, pool) = encode(&Read::new(0, 4, range(0, 16384)).build(), 1, 1).unwrap();
        assert_eq!((got[6], got[8]), (0x10_0000, 0xAB000), "PRP1 the first page, PRP2 the list");
        assert_eq!([pool.load64(0), pool.load64(8), pool.load64(16)], [0x10_1000, 0x10_2000, 0x10_3000]);
        // Not describable: the slot stays untouched.
        assert_eq!(encode(&Read::new(0, 1, range(2, 512)).build(), 1, 1).unwrap_err(), PrpError::Unaligned);
    }

    /// Writes `c` under `policy` into slot 0 with a list page at bus 0xAB000.
    fn encode_with(c: &Command<'_>, policy: DptrPolicy) -> Result<([u32; 16], TestMemory, Dptr), PrpError> {
        let sqm = TestMemory::new(2 * SQE_BYTES);
        let pool = TestMemory::new(4096);
        let mut sq = Sq::new(2).unwrap();
        let slot = sq.push(&sqm).unwrap();
        let kind = c.write(&slot, 5, 1, &ListPage { mem: &pool, off: 0, bus: 0xAB000 }, policy)?;
        Ok((std::array::from_fn(|i| sqm.load32(4 * i).to_le()), pool, kind))
    }

    #[test]
    fn sgl_transfers_set_psdt_and_put_sgl1_in_dptr() {
        let sgl = DptrPolicy::new(DataPointers::SglPreferred, 1);
        // One contiguous run: a Data Block in DPTR, PSDT 01b, nothing in the list page.
        let (got, pool, kind) = encode_with(&Read::new(0, 16, range(4096, 65536)).build(), sgl).unwrap();
        assert_eq!(kind, Dptr::Sgl);
        assert_eq!(got[0], nvm::READ as u32 | 1 << 14 | 5 << 16);
        assert_eq!([got[6], got[7], got[8], got[9]], [0x10_1000, 0, 65536, 0], "a data block, type 0h");
        assert_eq!(pool.load64(0), 0);
        // Two runs: a Last Segment descriptor naming the list page, which holds both blocks.
        let segs = [Segment { dma_addr: 0x40_0000, len: 8192 }, Segment { dma_addr: 0x80_0000, len: 8192 }];
        // SAFETY: never handed to a device: the command is only encoded into test memory.
        let r = unsafe { DmaRange::new(&segs, 4096, 8192) };
        let (got, pool, kind) = encode_with(&Write::new(0, 2, r).build(), sgl).unwrap();
        assert_eq!(kind, Dptr::SglList);
        assert_eq!([got[6], got[7], got[8], got[9]], [0xAB000, 0, 32, 0x3000_0000], "a last segment of 32 bytes");
        assert_eq!([pool.load64(0), pool.load64(8)], [0x40_1000, 4096]);
        assert_eq!([pool.load64(16), pool.load64(24)], [0x80_0000, 4096]);
        // PRP-only and SGL-less controllers: PSDT 00b, PRPs.
        for p in [DptrPolicy::new(DataPointers::PrpOnly, 1), DptrPolicy::new(DataPointers::SglPreferred, 0)] {
            assert!(!p.sgls());
            let (got, _, kind) = encode_with(&Read::new(0, 16, range(4096, 65536)).build(), p).unwrap();
            assert_eq!((kind, got[0] >> 14 & 3, got[6], got[8]), (Dptr::Prp, 0, 0x10_1000, 0xAB000));
        }
        // Auto: one or two pages stay PRPs; a large contiguous run becomes one data block.
        let auto = DptrPolicy::new(DataPointers::Auto, 1);
        assert_eq!(encode_with(&Read::new(0, 2, range(0, 8192)).build(), auto).unwrap().2, Dptr::Prp);
        assert_eq!(encode_with(&Read::new(0, 1, range(512, 4096)).build(), auto).unwrap().2, Dptr::Prp);
        assert_eq!(encode_with(&Read::new(0, 2, range(512, 8192)).build(), auto).unwrap().2, Dptr::Sgl, "3 pages");
        assert_eq!(encode_with(&Read::new(0, 3, range(0, 12288)).build(), auto).unwrap().2, Dptr::Sgl);
        // No data: no data pointer to choose.
        assert_eq!(encode_with(&Flush::new().build(), sgl).unwrap().2, Dptr::Other);
    }

    /// A gathered range's data pointer names its pieces in order, each as far as the range's
    /// length reaches, whether as PRPs (interior boundaries on pages) or as an SGL's blocks.
    #[test]
    fn a_gathered_range_names_its_pieces_in_order() {
        fn r(off: u64, first: u64, len: u64) -> DmaRange<'static> {
            // Pieces of 8 KiB, 24 KiB apart (as 8 KiB chunks of a 4-member volume).
            let stride = Stride { first, piece: 0x2000, gap: 0x6000 };
            // SAFETY: never handed to a device, only encoded into test memory.
            unsafe { DmaRange::gather(&SEGS, off, stride, len) }
        }
        let prp = DptrPolicy::PRP_ONLY;
        let (got, pool, kind) = encode_with(&Read::new(0, 6, r(0, 0x2000, 0x6000)).build(), prp).unwrap();
        assert_eq!((kind, got[6], got[8]), (Dptr::Prp, 0x10_0000, 0xAB000));
        let list: Vec<u64> = (0..5).map(|i| pool.load64(8 * i)).collect();
        assert_eq!(list, [0x10_1000, 0x10_8000, 0x10_9000, 0x11_0000, 0x11_1000]);
        // The length ends inside the last piece; a first piece shorter than the others.
        let (_, pool, _) = encode_with(&Read::new(0, 4, r(0x1000, 0x1000, 0x4000)).build(), prp).unwrap();
        assert_eq!([pool.load64(0), pool.load64(8), pool.load64(16)], [0x10_8000, 0x10_9000, 0x11_0000]);
        // As an SGL: one data block per piece.
        let sgl = DptrPolicy::new(DataPointers::SglPreferred, 1);
        let (got, pool, kind) = encode_with(&Write::new(0, 6, r(0, 0x2000, 0x6000)).build(), sgl).unwrap();
        assert_eq!((kind, got[6], got[8]), (Dptr::SglList, 0xAB000, 48));
        let blocks: Vec<(u64, u64)> = (0..3).map(|i| (pool.load64(16 * i), pool.load64(16 * i + 8))).collect();
        assert_eq!(blocks, [(0x10_0000, 0x2000), (0x10_8000, 0x2000), (0x11_0000, 0x2000)]);
        // A jump inside a page: no PRPs can name it; an SGL can.
        let odd = r(0x800, 0x1000, 0x3000);
        assert_eq!(encode_with(&Read::new(0, 7, odd).build(), prp).unwrap_err(), PrpError::Discontiguous);
        assert_eq!(encode_with(&Read::new(0, 7, odd).build(), sgl).unwrap().2, Dptr::SglList);
        // Pieces past the segments (1 MiB) are refused.
        let past = r(0xF_E000, 0x2000, 0x4000);
        assert_eq!(encode_with(&Read::new(0, 4, past).build(), prp).unwrap_err(), PrpError::OutOfRange);
        assert_eq!(encode_with(&Read::new(0, 4, past).build(), sgl).unwrap_err(), PrpError::OutOfRange);
    }

    proptest::proptest! {
        /// For any stride (whole pages, scattered segments) and any length its pieces reach, a
        /// gathered range's PRPs name the bus page of every page of every piece, in order, and
        /// nothing else.
        #[test]
        fn gathered_prps_name_every_page_of_every_piece(
            start in 0u64..4,
            first in 1u64..4,
            piece in 1u64..4,
            gap in 0u64..4,
            pages in 1u64..16,
        ) {
            // 64 scattered pages.
            let segs: Vec<Segment> =
                (0..64u64).map(|i| Segment { dma_addr: 0x100_0000 + ((i * 37) % 64) * PAGE, len: PAGE }).collect();
            let stride = Stride { first: first * PAGE, piece: piece * PAGE, gap: gap * PAGE };
            // SAFETY: never handed to a device, only encoded into test memory.
            let r = unsafe { DmaRange::gather(&segs, start * PAGE, stride, pages * PAGE) };
            let c = Read::new(0, pages as u32, r).build();
            let (got, pool, _) = encode_with(&c, DptrPolicy::PRP_ONLY).unwrap();
            // The registration pages the pieces cover, in order.
            let mut want = Vec::new();
            let (mut at, mut n) = (start, first);
            while (want.len() as u64) < pages {
                want.extend((at..at + n).map(|p| segs[p as usize].dma_addr));
                (at, n) = (at + n + gap, piece);
            }
            want.truncate(pages as usize);
            let mut named = vec![got[6] as u64 | (got[7] as u64) << 32];
            let prp2 = got[8] as u64 | (got[9] as u64) << 32;
            match want.len() {
                1 => proptest::prop_assert_eq!(prp2, 0),
                2 => named.push(prp2),
                n => {
                    proptest::prop_assert_eq!(prp2, 0xAB000);
                    named.extend((0..n - 1).map(|i| pool.load64(8 * i)));
                }
            }
            proptest::prop_assert_eq!(named, want);
        }
    }

    #[test]
    fn no_data_commands() {
        let (got, _) = encode(&Flush::new().build(), 9, 1).unwrap();
        assert_eq!(got, reference(nvm::FLUSH, 9, 1, (0, 0), [(10, 0), (11, 0), (12, 0)]));
        assert_eq!(Read::new(0, 1, range(0, 4096)).fua(true).build().cdw(12), FUA);
        assert_eq!(WriteZeroes::new(0, 1).fua(true).build().cdw(12), FUA);
        let c = WriteZeroes::new(100, 16).deallocate(true).build();
        assert_eq!((c.name(), c.slba()), ("write zeroes", 100));
        let (got, _) = encode(&c, 2, 1).unwrap();
        assert_eq!(got, reference(nvm::WRITE_ZEROES, 2, 1, (0, 0), [(10, 100), (11, 0), (12, DEAC | 15)]));
    }

    #[test]
    fn dataset_management_writes_its_ranges() {
        let ranges = [DsmRange::new(10, 8), DsmRange { attributes: 0x5, slba: 1 << 33, nlb: 1 }];
        let c = DatasetManagement::new(&ranges).deallocate(true).build();
        assert_eq!((c.name(), c.slba()), ("deallocate", 10));
        let (got, pool) = encode(&c, 4, 1).unwrap();
        assert_eq!(got, reference(nvm::DATASET_MANAGEMENT, 4, 1, (0xAB000, 0), [(10, 1), (11, 4), (12, 0)]));
        assert_eq!([pool.load32(0), pool.load32(4), pool.load32(16), pool.load32(20)], [0, 8, 5, 1]);
        assert_eq!([pool.load64(8), pool.load64(24)], [10, 1 << 33]);
        assert_eq!(DatasetManagement::new(&ranges).build().name(), "dataset management");
        assert_eq!(encode(&DatasetManagement::new(&[]).build(), 1, 1).unwrap_err(), PrpError::TooLarge);
        let many = [DsmRange::new(0, 1); DSM_MAX_RANGES + 1];
        assert_eq!(encode(&DatasetManagement::new(&many).build(), 1, 1).unwrap_err(), PrpError::TooLarge);
        assert!(encode(&DatasetManagement::new(&many[..DSM_MAX_RANGES]).build(), 1, 1).is_ok());
    }
}

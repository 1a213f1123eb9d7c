//! The device side of the mock: an NVMe controller model over the queue pair's shared memory.
//! It fetches submission entries up to the SQ tail doorbell, decodes Read, Write, Flush, Write
//! Zeroes and Dataset Management, follows PRP1, PRP2 and PRP lists (chained lists too), or SGLs
//! (Data Block, Segment and Last Segment descriptors, chained), to move data between its backing
//! store and host memory, and posts completions with the right phase
//! tag, never into a slot the host has not released through the CQ head doorbell.

use super::{Fault, HostLayout};
use crate::mem::{DeviceShared, QueueMemory};
use crate::prp::PAGE;
use crate::ring::cq::CQE_BYTES;
use crate::ring::next;
use crate::ring::sq::SQE_BYTES;
use crate::sgl::{Desc, Kind, DESC_BYTES};
use std::collections::VecDeque;
use std::sync::atomic::{fence, Ordering};
use ugds_uapi::queue::nvm;

/// Generic status codes the model reports (base spec 2.0, figure 100; NVM spec for 0x80).
mod sc {
    pub const INVALID_OPCODE: u16 = 0x01;
    pub const INVALID_FIELD: u16 = 0x02;
    pub const DATA_TRANSFER_ERROR: u16 = 0x04;
    pub const INVALID_NAMESPACE: u16 = 0x0B;
    pub const PRP_OFFSET_INVALID: u16 = 0x13;
    pub const INVALID_SGL_COUNT: u16 = 0x0E;
    pub const DATA_SGL_LENGTH_INVALID: u16 = 0x0F;
    pub const SGL_TYPE_INVALID: u16 = 0x11;
    pub const LBA_OUT_OF_RANGE: u16 = 0x80;
}

/// What the model did, for tests to check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MockStats {
    /// Submission entries fetched.
    pub fetched: u64,
    /// Completion entries posted (hostile ones included).
    pub posted: u64,
    /// Times the model had a completion to post and found the CQ full.
    pub cq_full: u64,
    /// Reads, writes, flushes, write-zeroes and DSM commands, by opcode.
    pub reads: u64,
    /// See `reads`.
    pub writes: u64,
    /// See `reads`.
    pub flushes: u64,
    /// See `reads`.
    pub write_zeroes: u64,
    /// See `reads`.
    pub dsm: u64,
    /// Blocks deallocated by Dataset Management.
    pub deallocated_blocks: u64,
    /// Commands completed with an error status by the model itself (not scripted).
    pub errors: u64,
    /// Commands whose data pointer was an SGL (PSDT 01b).
    pub sgl_commands: u64,
    /// SGL data block descriptors followed.
    pub sgl_blocks: u64,
}

/// A completion waiting for room in the CQ.
#[derive(Debug, Clone, Copy)]
struct Post {
    cid: u16,
    /// The 15-bit status field.
    status: u16,
    /// Report this SQ head instead of the current one (hostile completions).
    sq_head: Option<u16>,
    /// Post with the phase tag of the previous pass (the host must never take it).
    bad_phase: bool,
}

/// Where a bus address lands.
#[derive(Debug, Clone, Copy)]
enum Region {
    Prp,
    Host,
}

/// One page-bounded piece of a transfer: `len` bytes at `off` of `region`, at byte `pos` of
/// the transfer.
#[derive(Debug, Clone, Copy)]
struct Piece {
    region: Region,
    off: usize,
    pos: u64,
    len: u64,
}

/// The model. Device-side views of the shared memory; plain data otherwise.
pub(super) struct Model {
    pub(super) sq: DeviceShared,
    pub(super) cq: DeviceShared,
    pub(super) prp: DeviceShared,
    pub(super) host: DeviceShared,
    pub(super) doorbells: DeviceShared,
    pub(super) status: DeviceShared,
    pub(super) depth: u32,
    pub(super) sq_db: usize,
    pub(super) cq_db: usize,
    pub(super) prp_bus: u64,
    pub(super) layout: HostLayout,
    pub(super) nsid: u32,
    pub(super) block_shift: u32,
    pub(super) blocks: u64,
    /// Identify SGLS as reported (bits 1:0).
    sgls: u32,
    /// The namespace's data; empty for a null device (reads leave memory as is, writes vanish).
    pub(super) backing: Vec<u8>,
    pub(super) script: VecDeque<Fault>,
    pub(super) sq_head: u16,
    pub(super) cq_tail: u16,
    pub(super) phase: bool,
    pending: VecDeque<Post>,
    /// The most completions one step posts (the rest wait for later steps), as a device whose
    /// commands finish a few at a time: `usize::MAX` unless set.
    pub(super) posts_per_step: usize,
    /// Reused for every transfer's pieces.
    scratch: Vec<Piece>,
    pub(super) stats: MockStats,
}

impl Model {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        queues: [DeviceShared; 6],
        depth: u32,
        (sq_db, cq_db): (usize, usize),
        prp_bus: u64,
        layout: HostLayout,
        block_shift: u32,
        blocks: u64,
        null: bool,
        script: Vec<Fault>,
        sgls: u32,
    ) -> Self {
        let [sq, cq, prp, host, doorbells, status] = queues;
        // CAST: test capacities are small.
        let backing = if null { Vec::new() } else { vec![0u8; (blocks << block_shift) as usize] };
        Model {
            sq,
            cq,
            prp,
            host,
            doorbells,
            status,
            depth,
            sq_db,
            cq_db,
            prp_bus,
            layout,
            nsid: 1,
            block_shift,
            blocks,
            sgls,
            backing,
            script: script.into(),
            sq_head: 0,
            cq_tail: 0,
            phase: true,
            pending: VecDeque::with_capacity(depth as usize * 2),
            posts_per_step: usize::MAX,
            scratch: Vec::with_capacity(PAGE as usize / 8 + 1),
            stats: MockStats::default(),
        }
    }

    /// Runs the device once: fetches and executes every entry up to the SQ tail doorbell (a
    /// controller fetches commands whether or not the CQ has room), then posts what
    /// completions fit the CQ, each reporting the SQ head after the fetch. Returns how many
    /// entries it posted.
    pub(super) fn step(&mut self) -> usize {
        let posted = self.stats.posted;
        let tail = self.doorbells.load32(self.sq_db);
        // A tail doorbell beyond the queue is ignored (a real controller reports an
        // asynchronous event instead).
        if tail < self.depth {
            // Orders the doorbell's load before the loads of the entries it publishes.
            fence(Ordering::Acquire);
            while self.sq_head as u32 != tail {
                let off = self.sq_head as usize * SQE_BYTES;
                assert!(off + SQE_BYTES <= self.sq.len(), "the model's SQ holds its depth");
                // The dwords the model decodes (0, 1, 6..=12); the others stay 0.
                let mut sqe = [0u32; 16];
                for i in [0, 1, 6, 7, 8, 9, 10, 11, 12] {
                    // SAFETY: the entry lies in the SQ (asserted above); `off` is a multiple of 64.
                    sqe[i] = unsafe { self.sq.load32_unchecked(off + 4 * i) };
                }
                self.sq_head = next(self.sq_head, self.depth);
                self.stats.fetched += 1;
                // CAST: CDW0 bits 31:16.
                let cid = (sqe[0] >> 16) as u16;
                let status = self.execute(&sqe);
                let honest = Post { cid, status, sq_head: None, bad_phase: false };
                match self.script.pop_front().unwrap_or(Fault::None) {
                    Fault::None => self.pending.push_back(honest),
                    Fault::Extra(h) => {
                        let extra =
                            Post { cid: h.cid, status: h.status & 0x7FFF, sq_head: Some(h.sq_head), bad_phase: false };
                        self.pending.push_back(extra);
                        self.pending.push_back(honest);
                    }
                    Fault::Status(s) => self.pending.push_back(Post { status: s & 0x7FFF, ..honest }),
                    Fault::BadPhase => self.pending.push_back(Post { bad_phase: true, ..honest }),
                    Fault::Never => {}
                }
            }
        }
        self.post_pending();
        // CAST: at most the entries fetched in this step plus those pending.
        (self.stats.posted - posted) as usize
    }

    /// True when the CQ has a slot the host released: posting into it does not make the tail
    /// reach the head (full). A head doorbell beyond the queue releases nothing.
    fn room(&self) -> bool {
        let head = self.doorbells.load32(self.cq_db);
        head < self.depth && next(self.cq_tail, self.depth) as u32 != head
    }

    /// Posts pending completions while the CQ has room.
    fn post_pending(&mut self) {
        let mut budget = self.posts_per_step;
        while let Some(p) = self.pending.front().copied() {
            if budget == 0 {
                break;
            }
            budget -= 1;
            if !self.room() {
                self.stats.cq_full += 1;
                break;
            }
            self.pending.pop_front();
            self.post(p);
        }
    }

    fn post(&mut self, p: Post) {
        let off = self.cq_tail as usize * CQE_BYTES;
        let phase = self.phase != p.bad_phase;
        let sq_head = p.sq_head.unwrap_or(self.sq_head);
        self.cq.store32(off, 0);
        self.cq.store32(off + 4, 0);
        self.cq.store32(off + 8, sq_head as u32 | 1 << 16);
        // Orders the entry's body before its phase tag: the host reads the body only after it.
        fence(Ordering::Release);
        self.cq.store32(off + 12, p.cid as u32 | ((p.status << 1 | phase as u16) as u32) << 16);
        self.cq_tail = next(self.cq_tail, self.depth);
        if self.cq_tail == 0 {
            self.phase = !self.phase;
        }
        self.stats.posted += 1;
    }

    /// Executes one entry; returns its 15-bit status field (0: success).
    fn execute(&mut self, sqe: &[u32; 16]) -> u16 {
        let r = self.decode(sqe);
        if r != 0 {
            self.stats.errors += 1;
        }
        r
    }

    fn decode(&mut self, sqe: &[u32; 16]) -> u16 {
        // CAST: CDW0 bits 7:0 are the opcode.
        let opcode = sqe[0] as u8;
        let (fuse, psdt) = ((sqe[0] >> 8) & 3, (sqe[0] >> 14) & 3);
        // PSDT 01b (SGL for data) only where SGLS says the controller takes SGLs.
        if fuse != 0 || psdt > 1 || (psdt == 1 && !matches!(self.sgls & 3, 1 | 2)) {
            return sc::INVALID_FIELD;
        }
        let sgl = psdt == 1;
        if sgl {
            self.stats.sgl_commands += 1;
        }
        if sqe[1] != self.nsid {
            return sc::INVALID_NAMESPACE;
        }
        let prp1 = sqe[6] as u64 | (sqe[7] as u64) << 32;
        let prp2 = sqe[8] as u64 | (sqe[9] as u64) << 32;
        let (cdw10, cdw11, cdw12) = (sqe[10], sqe[11], sqe[12]);
        let slba = cdw10 as u64 | (cdw11 as u64) << 32;
        let nlb = (cdw12 & 0xFFFF) as u64 + 1;
        match opcode {
            nvm::READ | nvm::WRITE => {
                if !self.in_range(slba, nlb) {
                    return sc::LBA_OUT_OF_RANGE;
                }
                let write = opcode == nvm::WRITE;
                if write {
                    self.stats.writes += 1;
                } else {
                    self.stats.reads += 1;
                }
                let mut pieces = std::mem::take(&mut self.scratch);
                let st = self.data(sgl, [prp1, prp2], nlb << self.block_shift, &mut pieces);
                if st == 0 && !self.backing.is_empty() {
                    let base = (slba << self.block_shift) as usize;
                    for p in &pieces {
                        let mem = match p.region {
                            Region::Prp => &self.prp,
                            Region::Host => &self.host,
                        };
                        let at = base + p.pos as usize;
                        for i in (0..p.len as usize).step_by(4) {
                            let b = &mut self.backing[at + i..at + i + 4];
                            if write {
                                b.copy_from_slice(&mem.load32(p.off + i).to_le_bytes());
                            } else {
                                mem.store32(p.off + i, u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                            }
                        }
                    }
                }
                self.scratch = pieces;
                st
            }
            nvm::FLUSH => {
                self.stats.flushes += 1;
                0
            }
            nvm::WRITE_ZEROES => {
                if !self.in_range(slba, nlb) {
                    return sc::LBA_OUT_OF_RANGE;
                }
                self.stats.write_zeroes += 1;
                self.zero(slba, nlb);
                0
            }
            nvm::DATASET_MANAGEMENT => {
                self.stats.dsm += 1;
                let nr = (cdw10 & 0xFF) as u64 + 1;
                let mut pieces = std::mem::take(&mut self.scratch);
                let st = self.data(sgl, [prp1, prp2], nr * 16, &mut pieces);
                let mut list = vec![0u32; nr as usize * 4];
                for p in pieces.iter().filter(|_| st == 0) {
                    let mem = self.mem(p.region);
                    for i in (0..p.len as usize).step_by(4) {
                        list[(p.pos as usize + i) / 4] = mem.load32(p.off + i);
                    }
                }
                self.scratch = pieces;
                if st != 0 {
                    return st;
                }
                let ranges: Vec<(u64, u64)> =
                    list.chunks(4).map(|r| (r[2] as u64 | (r[3] as u64) << 32, r[1] as u64)).collect();
                if ranges.iter().any(|&(s, n)| !self.in_range(s, n)) {
                    return sc::LBA_OUT_OF_RANGE;
                }
                if cdw11 & (1 << 2) != 0 {
                    for (s, n) in ranges {
                        // Deallocated blocks read as zeroes (as QEMU's model reports in DLFEAT).
                        self.zero(s, n);
                        self.stats.deallocated_blocks += n;
                    }
                }
                0
            }
            _ => sc::INVALID_OPCODE,
        }
    }

    fn in_range(&self, slba: u64, nlb: u64) -> bool {
        slba.checked_add(nlb).is_some_and(|end| end <= self.blocks)
    }

    fn zero(&mut self, slba: u64, nlb: u64) {
        if !self.backing.is_empty() {
            let (a, b) = ((slba << self.block_shift) as usize, ((slba + nlb) << self.block_shift) as usize);
            self.backing[a..b].fill(0);
        }
    }

    /// Resolves `[bus, bus + n)` to memory of this model; it must lie in one region and, for
    /// host memory, in one segment (no real memory backs the gaps between them).
    fn translate(&self, bus: u64, n: u64) -> Option<(Region, usize)> {
        let end = bus.checked_add(n)?;
        let pool = self.prp.len() as u64;
        if bus >= self.prp_bus && end <= self.prp_bus + pool {
            // CAST: inside the pool's mapping.
            return Some((Region::Prp, (bus - self.prp_bus) as usize));
        }
        self.layout.host_offset(bus, n).map(|off| (Region::Host, off))
    }

    fn mem(&self, r: Region) -> &DeviceShared {
        match r {
            Region::Prp => &self.prp,
            Region::Host => &self.host,
        }
    }

    /// Resolves a `len`-byte transfer's DPTR (PRP1 and PRP2, or SGL1) into `out`.
    fn data(&mut self, sgl: bool, dptr: [u64; 2], len: u64, out: &mut Vec<Piece>) -> u16 {
        if sgl {
            self.sgl_pieces(dptr, len, out)
        } else {
            self.pieces(dptr[0], dptr[1], len, out)
        }
    }

    /// Takes one data block of a `len`-byte transfer at transfer position `*pos`: checks SGLS 10b's
    /// dword granularity and that it stays inside the transfer, then appends its pieces.
    fn data_block(&mut self, d: Desc, len: u64, pos: &mut u64, out: &mut Vec<Piece>) -> u16 {
        if self.sgls & 3 == 2 && (!d.addr.is_multiple_of(4) || !d.len.is_multiple_of(4)) {
            return sc::INVALID_FIELD;
        }
        if *pos + d.len as u64 > len {
            return sc::DATA_SGL_LENGTH_INVALID;
        }
        self.stats.sgl_blocks += 1;
        self.block_pieces(d, pos, out)
    }

    /// Appends the pieces of one data block at transfer position `*pos`: page by page, each
    /// resolved (no real memory backs the gaps between host segments).
    fn block_pieces(&self, d: Desc, pos: &mut u64, out: &mut Vec<Piece>) -> u16 {
        let (mut bus, mut left) = (d.addr, d.len as u64);
        while left > 0 {
            let n = left.min(PAGE - bus % PAGE);
            let Some((region, off)) = self.translate(bus, n) else { return sc::DATA_TRANSFER_ERROR };
            out.push(Piece { region, off, pos: *pos, len: n });
            (bus, left, *pos) = (bus + n, left - n, *pos + n);
        }
        0
    }

    /// Follows an SGL (base spec 2.0, section 4.1.2): SGL1 is a Data Block, or names a Segment
    /// or Last Segment; a segment's last descriptor may name the next one; a Last Segment holds
    /// data blocks only. The data blocks must add up to exactly `len` bytes; with SGLS 10b their
    /// addresses and lengths must be dword multiples. Fills `out` (all resolved before anything
    /// moves); returns the status.
    fn sgl_pieces(&mut self, sgl1: [u64; 2], len: u64, out: &mut Vec<Piece>) -> u16 {
        out.clear();
        let Some(mut d) = Desc::decode(sgl1) else { return sc::SGL_TYPE_INVALID };
        let mut pos = 0u64;
        // Descriptors followed, bounded: a chain that loops fails instead of hanging.
        let mut budget = 1usize << 16;
        loop {
            match d.kind {
                Kind::DataBlock => {
                    let st = self.data_block(d, len, &mut pos, out);
                    if st != 0 {
                        return st;
                    }
                    // A data block in SGL1: the end.
                    break;
                }
                Kind::Segment | Kind::LastSegment => {
                    let n = d.len as usize / DESC_BYTES;
                    if n == 0 || !(d.len as usize).is_multiple_of(DESC_BYTES) || !d.addr.is_multiple_of(16) {
                        return sc::INVALID_SGL_COUNT;
                    }
                    let mut next = None;
                    for i in 0..n {
                        budget = match budget.checked_sub(1) {
                            Some(b) => b,
                            None => return sc::INVALID_SGL_COUNT,
                        };
                        let at = d.addr + (DESC_BYTES * i) as u64;
                        let Some((r, off)) = self.translate(at, DESC_BYTES as u64) else {
                            return sc::DATA_TRANSFER_ERROR;
                        };
                        let q = [self.mem(r).load64(off), self.mem(r).load64(off + 8)];
                        let Some(e) = Desc::decode(q) else { return sc::SGL_TYPE_INVALID };
                        match e.kind {
                            Kind::DataBlock => {
                                let st = self.data_block(e, len, &mut pos, out);
                                if st != 0 {
                                    return st;
                                }
                            }
                            // Only a segment's last descriptor chains, and never from the last.
                            _ if i + 1 == n && d.kind == Kind::Segment => next = Some(e),
                            _ => return sc::SGL_TYPE_INVALID,
                        }
                    }
                    match next {
                        Some(e) => d = e,
                        None if d.kind == Kind::LastSegment => break,
                        // A Segment must chain on.
                        None => return sc::SGL_TYPE_INVALID,
                    }
                }
            }
        }
        if pos != len {
            return sc::DATA_SGL_LENGTH_INVALID;
        }
        0
    }

    /// Walks the PRPs of a `len`-byte transfer (base spec 2.0, section 4.1.1): PRP1 up to its
    /// page's end, then PRP2 as the second page or as a list pointer, a list's last entry
    /// chaining to the next list page when more entries follow. Fills `out` with the pieces
    /// (all resolved before anything moves). Returns the status (0: success).
    fn pieces(&self, prp1: u64, prp2: u64, len: u64, out: &mut Vec<Piece>) -> u16 {
        out.clear();
        if prp1 & 3 != 0 {
            return sc::PRP_OFFSET_INVALID;
        }
        let first = len.min(PAGE - prp1 % PAGE);
        let Some((region, off)) = self.translate(prp1, first) else { return sc::DATA_TRANSFER_ERROR };
        out.push(Piece { region, off, pos: 0, len: first });
        let mut rest = len - first;
        if rest == 0 {
            return 0;
        }
        if rest <= PAGE {
            if !prp2.is_multiple_of(PAGE) {
                return sc::PRP_OFFSET_INVALID;
            }
            let Some((region, off)) = self.translate(prp2, rest) else { return sc::DATA_TRANSFER_ERROR };
            out.push(Piece { region, off, pos: first, len: rest });
            return 0;
        }
        if prp2 & 7 != 0 {
            return sc::PRP_OFFSET_INVALID;
        }
        let (mut entry, mut pos) = (prp2, first);
        while rest > 0 {
            let Some((r, off)) = self.translate(entry, 8) else { return sc::DATA_TRANSFER_ERROR };
            let value = self.mem(r).load64(off);
            if entry % PAGE == PAGE - 8 && rest > PAGE {
                // The page's last entry, with more than one page to go: the next list.
                if value & 7 != 0 {
                    return sc::PRP_OFFSET_INVALID;
                }
                entry = value;
                continue;
            }
            if !value.is_multiple_of(PAGE) {
                return sc::PRP_OFFSET_INVALID;
            }
            let n = rest.min(PAGE);
            let Some((region, off)) = self.translate(value, n) else { return sc::DATA_TRANSFER_ERROR };
            out.push(Piece { region, off, pos, len: n });
            pos += n;
            rest -= n;
            entry += 8;
        }
        0
    }

    /// A controller reset: the queue is re-created empty (CQ zeroed, doorbells at 0), queued
    /// completions are dropped, and the epoch moves on.
    pub(super) fn reset(&mut self, state_off: usize) {
        for i in 0..self.depth as usize * CQE_BYTES / 4 {
            self.cq.store32(4 * i, 0);
        }
        self.doorbells.store32(self.sq_db, 0);
        self.doorbells.store32(self.cq_db, 0);
        self.pending.clear();
        self.script.clear();
        (self.sq_head, self.cq_tail, self.phase) = (0, 0, true);
        let s = ugds_uapi::ioctl::ControllerState(self.status.load64(state_off));
        self.status.store64(state_off, ugds_uapi::ioctl::ControllerState::new(s.epoch() + 1, s.faulted()).0);
    }
}

//! The completion ring: the head and the phase tag that tells a newly posted entry from last
//! pass's.

use super::{next, MAX_DEPTH};
use crate::mem::QueueMemory;
use std::sync::atomic::{fence, Ordering};
/// Bytes of one completion queue entry.
pub const CQE_BYTES: usize = 16;

/// A posted completion entry, read from its slot (DW1 is reserved and not read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Command-specific result.
    pub dw0: u32,
    /// The device's SQ head when it posted the entry.
    pub sq_head: u16,
    /// The SQ the command came from.
    pub sq_id: u16,
    /// Command id.
    pub cid: u16,
    /// The 15-bit status field (decoded by `ugds_uapi::Status::from_field`).
    pub status: u16,
}

/// Completion ring state (no memory: the slots are passed to [`Cq::pop`], or by a queue pair,
/// whose memory was checked against the depth once, to [`Cq::pop_unchecked`]).
///
/// # Invariants
///
/// `2 <= depth <= MAX_DEPTH`, `head < depth`, `released < depth`, and `unreleased` is the
/// number of slots from `released` up to `head` (modulo `depth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cq {
    depth: u32,
    head: u16,
    /// The phase tag of entries posted in this pass over the ring (starts at 1, flips at
    /// every wrap).
    phase: bool,
    /// The head the device was last given: the slots from here up to `head` are consumed but
    /// still occupied as far as the device knows.
    released: u16,
    /// How many slots that is, counted as they are consumed: asked for before every submission
    /// and after every reap, where working it out from the two heads took a division.
    unreleased: u32,
}

impl Cq {
    /// An empty ring of `depth` slots; `None` outside `2..=65536`.
    pub fn new(depth: u32) -> Option<Self> {
        // INVARIANT: depth checked; the head starts at 0, released.
        (2..=MAX_DEPTH).contains(&depth).then_some(Cq { depth, head: 0, phase: true, released: 0, unreleased: 0 })
    }

    /// The next slot to read.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn head(&self) -> u16 {
        self.head
    }

    /// Consumed slots the device has not been given back yet (the head doorbell lags the head
    /// by this many).
    #[inline]
    pub fn unreleased(&self) -> u32 {
        self.unreleased
    }

    /// Marks every consumed slot given back; returns the head the doorbell had and the one it
    /// gets now.
    #[inline]
    pub fn release(&mut self) -> (u16, u16) {
        let old = self.released;
        // INVARIANT: `head < depth`; nothing lies between the two now.
        self.released = self.head;
        self.unreleased = 0;
        (old, self.head)
    }

    /// The phase tag expected at the head.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn phase(&self) -> bool {
        self.phase
    }

    /// True when `mem` holds every slot of the ring (what the unchecked calls require).
    #[inline]
    pub fn fits<M: QueueMemory + ?Sized>(&self, mem: &M) -> bool {
        self.depth as usize * CQE_BYTES <= mem.len()
    }

    /// The entry at the head's dword 3 (command id, phase tag, status).
    ///
    /// # Safety
    ///
    /// `mem` holds `depth` entries.
    #[inline(always)]
    unsafe fn dw3_unchecked<M: QueueMemory + ?Sized>(&self, mem: &M) -> (usize, u32) {
        let off = self.head as usize * CQE_BYTES;
        // SAFETY: `head < depth` (invariant) and `mem` holds `depth` entries (caller), so the
        // slot lies in `mem`; `off` is a multiple of 16.
        (off, unsafe { mem.load32_unchecked(off + 12) })
    }

    /// True when the device has posted the entry at the head (false when `mem` cannot hold the
    /// ring).
    #[cfg_attr(not(test), allow(dead_code))]
    #[inline]
    pub fn ready<M: QueueMemory + ?Sized>(&self, mem: &M) -> bool {
        // SAFETY: `fits` checked that `mem` holds `depth` entries.
        self.fits(mem) && unsafe { self.ready_unchecked(mem) }
    }

    /// [`Cq::ready`] without the size check: one load and one comparison, for a queue pair
    /// whose memory was checked when it was made.
    ///
    /// # Safety
    ///
    /// `mem` holds `depth` entries.
    #[inline(always)]
    pub unsafe fn ready_unchecked<M: QueueMemory + ?Sized>(&self, mem: &M) -> bool {
        // SAFETY: the caller's contract is `dw3_unchecked`'s.
        let (_, dw3) = unsafe { self.dw3_unchecked(mem) };
        ((dw3 >> 16) & 1 != 0) == self.phase
    }

    /// The entry at the head, if the device has posted it (its phase tag is the current one);
    /// the head advances past it, flipping the phase at the wrap. The slot may be overwritten by
    /// the device once the head doorbell says so. `None` too when `mem` cannot hold the ring.
    #[cfg_attr(not(test), allow(dead_code))]
    #[inline]
    pub fn pop<M: QueueMemory + ?Sized>(&mut self, mem: &M) -> Option<Entry> {
        if !self.fits(mem) {
            return None;
        }
        // SAFETY: `fits` checked that `mem` holds `depth` entries.
        unsafe { self.pop_unchecked(mem) }
    }

    /// [`Cq::pop`] without the size check.
    ///
    /// # Safety
    ///
    /// `mem` holds `depth` entries.
    #[inline(always)]
    pub unsafe fn pop_unchecked<M: QueueMemory + ?Sized>(&mut self, mem: &M) -> Option<Entry> {
        // SAFETY: the caller's contract is `dw3_unchecked`'s.
        let (off, dw3) = unsafe { self.dw3_unchecked(mem) };
        if ((dw3 >> 16) & 1 != 0) != self.phase {
            return None;
        }
        // Orders the phase tag's load before the loads of the entry's other fields (the device
        // writes them first).
        fence(Ordering::Acquire);
        // SAFETY: the slot at the head lies in `mem` (as in `dw3_unchecked`); `off` is a
        // multiple of 16.
        let (dw0, dw2) = unsafe { (mem.load32_unchecked(off), mem.load32_unchecked(off + 8)) };
        // INVARIANT: `next` stays below depth; one more slot consumed and not given back (at
        // most depth - 1: the device posts into a slot only once it was given back).
        self.head = next(self.head, self.depth);
        self.unreleased += 1;
        if self.head == 0 {
            self.phase = !self.phase;
        }
        // CAST: the halves of dwords 2 and 3 (base spec 2.0, figure 89).
        Some(Entry { dw0, sq_head: dw2 as u16, sq_id: (dw2 >> 16) as u16, cid: dw3 as u16, status: (dw3 >> 17) as u16 })
    }

    /// Back to empty (the controller re-created the queue, zeroed).
    pub fn reset(&mut self) {
        // INVARIANT: 0 < depth.
        self.head = 0;
        self.phase = true;
        self.released = 0;
        self.unreleased = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::TestMemory;
    use proptest::prelude::*;
    use ugds_uapi::{Cqe, Status};

    /// Posts `cqe` at `tail` as a device does: the body, then the dword with the phase tag.
    fn post(mem: &TestMemory, tail: u16, cqe: &Cqe) {
        let off = tail as usize * CQE_BYTES;
        let d = [cqe.dw0(), 0, cqe.sq_head() as u32 | (cqe.sq_id() as u32) << 16];
        for (i, w) in d.iter().enumerate() {
            mem.store32(off + 4 * i, *w);
        }
        let st = (cqe.status().to_field() << 1 | cqe.phase() as u16) as u32;
        mem.store32(off + 12, cqe.cid() as u32 | st << 16);
    }

    #[test]
    fn stale_phase_entries_are_not_taken() {
        let mem = TestMemory::new(2 * CQE_BYTES);
        let mut cq = Cq::new(2).unwrap();
        assert!(cq.pop(&mem).is_none(), "zeroed memory has phase 0");
        post(&mem, 0, &Cqe::new(7, 1, 1, 42, Status::SUCCESS, true));
        let c = cq.pop(&mem).unwrap();
        assert_eq!(c, Entry { dw0: 7, sq_head: 1, sq_id: 1, cid: 42, status: 0 });
        assert!(cq.pop(&mem).is_none());
        let st = Status::from_field(0x281);
        post(&mem, 1, &Cqe::new(0, 0, 1, 43, st, true));
        assert_eq!(cq.pop(&mem).unwrap(), Entry { dw0: 0, sq_head: 0, sq_id: 1, cid: 43, status: 0x281 });
        assert_eq!((cq.head(), cq.phase()), (0, false));
        assert!(cq.pop(&mem).is_none(), "slot 0 still holds last pass's entry");
        post(&mem, 0, &Cqe::new(0, 0, 1, 44, Status::SUCCESS, false));
        assert_eq!(cq.pop(&mem).unwrap().cid, 44);
    }

    #[test]
    fn consumed_slots_stay_unreleased_until_released_across_the_wrap() {
        let mem = TestMemory::new(4 * CQE_BYTES);
        let mut cq = Cq::new(4).unwrap();
        for (tail, cid) in [(0, 1), (1, 2), (2, 3)] {
            post(&mem, tail, &Cqe::new(0, 0, 1, cid, Status::SUCCESS, true));
        }
        assert_eq!(cq.unreleased(), 0);
        cq.pop(&mem).unwrap();
        cq.pop(&mem).unwrap();
        assert_eq!(cq.unreleased(), 2);
        assert_eq!(cq.release(), (0, 2), "the doorbell moves to the head");
        assert_eq!(cq.unreleased(), 0);
        cq.pop(&mem).unwrap();
        post(&mem, 3, &Cqe::new(0, 0, 1, 4, Status::SUCCESS, true));
        post(&mem, 0, &Cqe::new(0, 0, 1, 5, Status::SUCCESS, false));
        cq.pop(&mem).unwrap();
        cq.pop(&mem).unwrap();
        assert_eq!((cq.head(), cq.unreleased()), (1, 3), "counted across the wrap");
        cq.reset();
        assert_eq!(cq.unreleased(), 0, "a re-created queue starts released");
    }

    #[test]
    fn memory_that_cannot_hold_the_ring_is_never_read() {
        // One slot short: even the head's slot (which fits) is not read, since the safe calls
        // check the whole ring, what the unchecked ones rely on.
        let mem = TestMemory::new(3 * CQE_BYTES);
        post(&mem, 0, &Cqe::new(7, 1, 1, 42, Status::SUCCESS, true));
        let mut cq = Cq::new(4).unwrap();
        assert!(!cq.ready(&mem));
        assert!(cq.pop(&mem).is_none());
        assert_eq!((cq.head(), cq.phase()), (0, true), "nothing consumed");
        let big = TestMemory::new(4 * CQE_BYTES);
        post(&big, 0, &Cqe::new(7, 1, 1, 42, Status::SUCCESS, true));
        assert!(cq.ready(&big));
        assert_eq!(cq.pop(&big).unwrap().cid, 42);
    }

    proptest! {
        /// A device posting `n` entries in rounds of random size over many wraps: every entry is
        /// popped once, in order, with its fields; nothing is popped that was not posted.
        #[test]
        fn pops_exactly_what_was_posted(depth in 2u32..20, rounds in proptest::collection::vec(0usize..25, 1..40)) {
            let mem = TestMemory::new(depth as usize * CQE_BYTES);
            let mut cq = Cq::new(depth).unwrap();
            let (mut tail, mut phase, mut seq) = (0u16, true, 0u32);
            for k in rounds {
                // The device never posts more than depth - 1 unreaped entries.
                let k = k.min(depth as usize - 1);
                for _ in 0..k {
                    post(&mem, tail, &Cqe::new(seq, tail, 1, seq as u16, Status::SUCCESS, phase));
                    seq += 1;
                    tail = next(tail, depth);
                    if tail == 0 { phase = !phase; }
                }
                for j in 0..k {
                    let c = cq.pop(&mem).unwrap();
                    prop_assert_eq!(c.dw0, seq - k as u32 + j as u32);
                    prop_assert_eq!(c.cid as u32, c.dw0 & 0xFFFF);
                }
                prop_assert!(cq.pop(&mem).is_none());
                prop_assert_eq!(cq.head(), tail);
            }
        }
    }
}

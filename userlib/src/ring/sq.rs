//! The submission ring: where the next entry goes, how much room is left, and how far the
//! device has consumed (as its completions report).

use super::{next, MAX_DEPTH};
use crate::mem::QueueMemory;

/// Bytes of one submission queue entry.
pub const SQE_BYTES: usize = 64;

/// Submission ring state (no memory: the slots are passed to [`Sq::push`], or by a queue pair,
/// whose memory was checked against the depth once, to [`Sq::push_unchecked`]).
///
/// # Invariants
///
/// `2 <= depth <= MAX_DEPTH`, `tail < depth`, `head < depth`, `used` is the distance from `head`
/// to `tail` (so `used < depth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sq {
    depth: u32,
    /// The next slot to write.
    tail: u16,
    /// The device's head as last reported by a completion: slots from here to the tail are
    /// (or may still be) unread by the device.
    head: u16,
    /// Slots from the head to the tail (kept, not computed: it is read on every push).
    used: u32,
}

impl Sq {
    /// An empty ring of `depth` slots; `None` outside `2..=65536`.
    pub fn new(depth: u32) -> Option<Self> {
        // INVARIANT: depth checked; both indices start at 0.
        (2..=MAX_DEPTH).contains(&depth).then_some(Sq { depth, tail: 0, head: 0, used: 0 })
    }

    /// Slots in the ring.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The next slot to write (the value the tail doorbell is given).
    pub fn tail(&self) -> u16 {
        self.tail
    }

    /// The device's head as last reported.
    pub fn head(&self) -> u16 {
        self.head
    }

    /// Entries written and not yet reported consumed.
    #[inline]
    pub fn used(&self) -> u32 {
        self.used
    }

    /// Slots free for new entries: one slot always stays empty, to tell a full ring from an
    /// empty one.
    #[inline]
    pub fn space(&self) -> u32 {
        self.depth - 1 - self.used()
    }

    /// True when `mem` holds every slot of the ring (what [`Sq::push_unchecked`] requires).
    #[inline]
    pub fn fits<M: QueueMemory + ?Sized>(&self, mem: &M) -> bool {
        self.depth as usize * SQE_BYTES <= mem.len()
    }

    /// Claims the slot at the tail and advances the tail; the entry is written through the
    /// returned slot. `None` when the ring is full (or `mem` cannot hold the ring, which a
    /// queue pair rules out when it is made).
    #[cfg_attr(not(test), allow(dead_code))]
    #[inline]
    pub fn push<'m, M: QueueMemory + ?Sized>(&mut self, mem: &'m M) -> Option<SqSlot<'m, M>> {
        if !self.fits(mem) {
            return None;
        }
        // SAFETY: checked above: `mem` holds `depth` entries.
        unsafe { self.push_unchecked(mem) }
    }

    /// [`Sq::push`] without the size check, for a queue pair whose memory was checked when it
    /// was made.
    ///
    /// # Safety
    ///
    /// `mem` holds `depth` entries.
    #[inline(always)]
    pub unsafe fn push_unchecked<'m, M: QueueMemory + ?Sized>(&mut self, mem: &'m M) -> Option<SqSlot<'m, M>> {
        if self.space() == 0 {
            return None;
        }
        self.used += 1;
        let off = self.tail as usize * SQE_BYTES;
        // INVARIANT: `off` is a multiple of 64 and the slot lies inside `mem` (`tail < depth`,
        // and `mem` holds `depth` entries: the caller).
        let slot = SqSlot { mem, off, index: self.tail };
        // INVARIANT: `next` stays below depth.
        self.tail = next(self.tail, self.depth);
        Some(slot)
    }

    /// Gives back the last `n` claimed slots, which were never published (the tail moves back).
    /// Returns false, changing nothing, when fewer than `n` entries are outstanding.
    pub fn unpush(&mut self, n: u32) -> bool {
        if n > self.used {
            return false;
        }
        self.used -= n;
        // CAST: the result is below depth <= 65536.
        // INVARIANT: below depth (modulo).
        self.tail = ((self.tail as u32 + self.depth - n) % self.depth) as u16;
        true
    }

    /// Records the device's head from a completion. Refused (false, nothing changes) unless it
    /// lies between the last reported head and the tail: a device cannot have consumed entries
    /// that were never written, nor un-consume entries.
    #[inline]
    pub fn set_head(&mut self, head: u16) -> bool {
        if head as u32 >= self.depth {
            return false;
        }
        let consumed = distance(self.head, head, self.depth);
        if consumed > self.used {
            return false;
        }
        self.used -= consumed;
        // INVARIANT: below depth (checked).
        self.head = head;
        true
    }

    /// Back to empty (the controller re-created the queue).
    pub fn reset(&mut self) {
        // INVARIANT: 0 < depth.
        self.tail = 0;
        self.head = 0;
        self.used = 0;
    }
}

/// Slots from `from` forward to `to` in a ring of `depth` (both below `depth`). No division:
/// it runs for every command.
#[inline]
fn distance(from: u16, to: u16, depth: u32) -> u32 {
    let d = to as u32 + depth - from as u32;
    if d >= depth {
        d - depth
    } else {
        d
    }
}

/// One claimed SQ slot. The command is written into it in one call, each of the entry's eight
/// quadwords exactly once (built in registers, not in a 64-byte entry elsewhere that is copied).
///
/// # Invariants
///
/// `off` is a multiple of [`SQE_BYTES`] and `off + SQE_BYTES <= mem.len()`.
#[derive(Debug)]
pub struct SqSlot<'m, M: ?Sized> {
    mem: &'m M,
    off: usize,
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    index: u16,
}

impl<M: QueueMemory + ?Sized> SqSlot<'_, M> {
    /// Stores the whole entry, quadword `i` from `q[i]`, each once.
    #[inline]
    pub fn store_all(&self, q: [u64; 8]) {
        // SAFETY: the slot's 64 bytes lie in `mem`, 64-byte aligned (invariant).
        unsafe { self.mem.store_entry_unchecked(self.off, &q) }
    }

    /// The slot's index in the ring.
    #[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
    pub fn index(&self) -> u16 {
        self.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::TestMemory;
    use proptest::prelude::*;

    #[test]
    fn one_slot_stays_empty_and_the_tail_wraps() {
        let mem = TestMemory::new(3 * SQE_BYTES);
        let mut sq = Sq::new(3).unwrap();
        assert_eq!((sq.depth(), sq.space()), (3, 2));
        for want in [0, 1] {
            let slot = sq.push(&mem).unwrap();
            assert_eq!(slot.index(), want);
            slot.store_all([0, 0, 0, 0, 0, 0, 0, 0xABCD]);
        }
        assert!(sq.push(&mem).is_none(), "full at depth - 1");
        assert_eq!(mem.load64(SQE_BYTES + 56), 0xABCD);
        assert!(sq.set_head(2));
        assert_eq!(sq.push(&mem).unwrap().index(), 2);
        assert_eq!(sq.push(&mem).unwrap().index(), 0, "wrapped");
        assert_eq!((sq.tail(), sq.space()), (1, 0));
        assert!(Sq::new(1).is_none() && Sq::new(65537).is_none() && Sq::new(65536).is_some());
    }

    #[test]
    fn memory_that_cannot_hold_the_ring_gets_no_slot() {
        // The tail's slot fits, the ring does not: refused, and the tail stays.
        let mem = TestMemory::new(3 * SQE_BYTES);
        let mut sq = Sq::new(4).unwrap();
        assert!(sq.push(&mem).is_none());
        assert_eq!((sq.tail(), sq.space()), (0, 3));
        let big = TestMemory::new(4 * SQE_BYTES);
        assert_eq!(sq.push(&big).unwrap().index(), 0);
    }

    #[test]
    fn heads_outside_the_window_are_refused() {
        let mem = TestMemory::new(8 * SQE_BYTES);
        let mut sq = Sq::new(8).unwrap();
        for _ in 0..3 {
            sq.push(&mem).unwrap();
        }
        assert!(!sq.set_head(4), "past the tail");
        assert!(!sq.set_head(8), "out of range");
        assert!(sq.set_head(2));
        assert!(!sq.set_head(1), "backwards");
        assert!(sq.set_head(3) && sq.used() == 0);
        assert!(!sq.unpush(1));
        sq.push(&mem).unwrap();
        assert!(sq.unpush(1) && sq.tail() == 3);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push,
        Unpush(u32),
        Consume(u32),
        Head(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Push),
            1 => (0u32..4).prop_map(Op::Unpush),
            2 => (0u32..6).prop_map(Op::Consume),
            1 => any::<u16>().prop_map(Op::Head),
        ]
    }

    proptest! {
        /// Against a model (free-running counters of pushed and consumed entries): the ring never
        /// hands out a slot the device has not consumed, never exceeds depth - 1 entries, and
        /// refuses any head outside what was written.
        #[test]
        fn ring_matches_a_counter_model(depth in 2u32..40, ops in proptest::collection::vec(op(), 1..300)) {
            let mem = TestMemory::new(depth as usize * SQE_BYTES);
            let mut sq = Sq::new(depth).unwrap();
            let (mut pushed, mut consumed) = (0u64, 0u64);
            for op in ops {
                match op {
                    Op::Push => match sq.push(&mem) {
                        Some(slot) => {
                            prop_assert_eq!(slot.index() as u64, pushed % depth as u64);
                            pushed += 1;
                        }
                        None => prop_assert_eq!(pushed - consumed, depth as u64 - 1),
                    },
                    Op::Unpush(n) => {
                        let ok = sq.unpush(n);
                        prop_assert_eq!(ok, n as u64 <= pushed - consumed);
                        if ok { pushed -= n as u64; }
                    }
                    Op::Consume(n) => {
                        let n = (n as u64).min(pushed - consumed);
                        consumed += n;
                        prop_assert!(sq.set_head((consumed % depth as u64) as u16));
                    }
                    Op::Head(h) => {
                        let advance = (h as u64 + depth as u64 - consumed % depth as u64) % depth as u64;
                        let valid = (h as u32) < depth && advance <= pushed - consumed;
                        prop_assert_eq!(sq.set_head(h), valid);
                        if valid { consumed += advance; }
                    }
                }
                prop_assert_eq!(sq.used() as u64, pushed - consumed);
                prop_assert_eq!(sq.tail() as u64, pushed % depth as u64);
                prop_assert_eq!(sq.head() as u64, consumed % depth as u64);
            }
        }
    }
}

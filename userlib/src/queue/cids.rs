//! Command ids of one queue pair: a fixed stack of free ids and one state word per id, both
//! allocated when the queue is created, so a command costs no allocation.

/// Per-id state: free, in flight, or completed with its raw 15-bit status (kept until its
/// owner collects it).
const FREE: u32 = 0;
const BUSY: u32 = 1;
const DONE: u32 = 2;

/// The id table.
///
/// # Invariants
///
/// `free[..nfree]` are exactly the ids whose state is `FREE`, each once; `state.len() ==
/// free.len() <= 65536`.
pub(crate) struct Cids {
    free: Box<[u16]>,
    nfree: usize,
    state: Box<[u32]>,
}

impl std::fmt::Debug for Cids {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the tables: a queue may have 65536 ids.
        write!(f, "Cids({} of {} free)", self.nfree, self.state.len())
    }
}

impl Cids {
    /// Ids `0..n` (`n <= 65536`), all free; id 0 is handed out first.
    pub(crate) fn new(n: u32) -> Self {
        let n = n.min(65536);
        // CAST: ids below n <= 65536 fit u16.
        let free = (0..n).rev().map(|i| i as u16).collect();
        // INVARIANT: every id free and on the stack once.
        Cids { free, nfree: n as usize, state: vec![FREE; n as usize].into_boxed_slice() }
    }

    /// Free ids.
    #[inline]
    pub(crate) fn available(&self) -> usize {
        self.nfree
    }

    /// Takes a free id; it is in flight from now on.
    #[inline]
    pub(crate) fn alloc(&mut self) -> Option<u16> {
        self.nfree = self.nfree.checked_sub(1)?;
        let cid = self.free[self.nfree];
        self.state[cid as usize] = BUSY;
        // INVARIANT: popped from the stack and no longer FREE.
        Some(cid)
    }

    /// True when `cid` is in flight (not completed, not free).
    #[inline]
    pub(crate) fn in_flight(&self, cid: u16) -> bool {
        self.state.get(cid as usize) == Some(&BUSY)
    }

    /// Marks an in-flight id completed with `raw` status, to be collected by its owner.
    /// False (nothing changes) when it was not in flight: an unknown or duplicate completion.
    #[inline]
    pub(crate) fn complete(&mut self, cid: u16, raw: u16) -> bool {
        match self.state.get_mut(cid as usize) {
            Some(s) if *s == BUSY => {
                *s = DONE | (raw as u32) << 16;
                true
            }
            _ => false,
        }
    }

    /// The status of a completed id, which becomes free; `None` while it is in flight.
    #[inline]
    pub(crate) fn take(&mut self, cid: u16) -> Option<u16> {
        let s = *self.state.get(cid as usize)?;
        if s & 0xFFFF != DONE {
            return None;
        }
        self.put(cid);
        // CAST: the raw status stored in the high half.
        Some((s >> 16) as u16)
    }

    /// Frees an id that is in flight or completed (a withdrawn submission, or a completion the
    /// reaper handed straight to its caller). False when it was already free.
    #[inline]
    pub(crate) fn release(&mut self, cid: u16) -> bool {
        match self.state.get(cid as usize) {
            Some(s) if *s != FREE => {
                self.put(cid);
                true
            }
            _ => false,
        }
    }

    fn put(&mut self, cid: u16) {
        self.state[cid as usize] = FREE;
        self.free[self.nfree] = cid;
        // INVARIANT: the id was not FREE, so it was not on the stack, and the stack has room.
        self.nfree += 1;
    }

    /// Every id free again (the controller re-created the queue; its commands are gone).
    pub(crate) fn reset(&mut self) {
        *self = Cids::new(self.state.len() as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_cycle_through_their_states_once() {
        let mut c = Cids::new(3);
        assert_eq!([c.alloc(), c.alloc(), c.alloc(), c.alloc()], [Some(0), Some(1), Some(2), None]);
        assert!(c.in_flight(1) && !c.in_flight(3));
        assert!(c.complete(1, 0x7FFF));
        assert!(!c.complete(1, 0), "duplicate");
        assert!(!c.complete(9, 0), "unknown");
        assert_eq!(c.take(0), None, "still in flight");
        assert_eq!(c.take(1), Some(0x7FFF));
        assert_eq!(c.take(1), None, "taken once");
        assert!(c.release(2) && !c.release(2));
        assert_eq!(c.available(), 2);
        assert_eq!(c.alloc(), Some(2));
        c.reset();
        assert_eq!(c.available(), 3);
        assert_eq!(c.alloc(), Some(0));
    }
}

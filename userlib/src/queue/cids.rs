//! Command ids of one queue pair: a fixed stack of free ids and one state word per id, both
//! allocated when the queue is created, so a command costs no allocation.

/// Per-id state: free, in flight, or completed with its raw 15-bit status (kept until its
/// owner collects it).
const FREE: u32 = 0;
const BUSY: u32 = 1;
const DONE: u32 = 2;
/// Id 0: reserved, never handed out.
const BUSY_NEVER: u32 = 3;

/// The id table.
///
/// # Invariants
///
/// `free[..nfree]` are exactly the ids whose state is `FREE`, each once; `free.len() + 1 ==
/// state.len() <= 65536` (id 0 is never on the stack).
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
    /// Ids `1..n` (`n <= 65536`), all free; id 1 is handed out first. Id 0 is never handed
    /// out: it is what a zeroed (disarmed) SQ entry carries, so its completion names no command
    /// (`n - 1` ids are as many as a queue of depth `n` holds at once).
    pub(crate) fn new(n: u32) -> Self {
        let n = n.clamp(1, 65536);
        // CAST: ids below n <= 65536 fit u16. Id 1 ends up on top of the stack.
        let free: Box<[u16]> = (1..n).rev().map(|i| i as u16).collect();
        let mut state = vec![FREE; n as usize].into_boxed_slice();
        // Id 0 is never free, never in flight: completions for it are strays.
        state[0] = BUSY_NEVER;
        // INVARIANT: every id but 0 free and on the stack once.
        Cids { nfree: free.len(), free, state }
    }

    /// Free ids.
    #[inline]
    pub(crate) fn available(&self) -> usize {
        self.nfree
    }

    /// Takes a free id; it is in flight from now on.
    #[inline]
    pub(crate) fn alloc(&mut self) -> Option<u16> {
        let top = self.nfree.checked_sub(1)?;
        // SAFETY: `top < nfree <= free.len()` (invariant), so the read is in bounds.
        let cid = unsafe { *self.free.get_unchecked(top) };
        self.nfree = top;
        // SAFETY: every id on the stack is below `state.len()` (invariant: the stack holds ids of
        // `state`, each once).
        unsafe { *self.state.get_unchecked_mut(cid as usize) = BUSY };
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
            Some(s) if *s != FREE && *s != BUSY_NEVER => {
                self.put(cid);
                true
            }
            _ => false,
        }
    }

    /// Frees `cid`, which callers found not FREE (and not id 0) in `state`.
    #[inline]
    fn put(&mut self, cid: u16) {
        self.state[cid as usize] = FREE;
        // An id that was not FREE was not on the stack, so the stack has room: `nfree <
        // free.len()` by the invariant (`free.len() + 1 == state.len()` ids, id 0 never on it).
        // Checked anyway where that does not hold (a caller breaking it), without unsafe code.
        if let Some(slot) = self.free.get_mut(self.nfree) {
            *slot = cid;
            // INVARIANT: the id was not FREE, so it was not on the stack, and the stack has room.
            self.nfree += 1;
        }
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
        let mut c = Cids::new(4);
        assert_eq!([c.alloc(), c.alloc(), c.alloc(), c.alloc()], [Some(1), Some(2), Some(3), None]);
        assert!(c.in_flight(1) && !c.in_flight(4));
        assert!(!c.in_flight(0) && !c.complete(0, 0) && !c.release(0), "id 0 is never a command");
        assert!(c.complete(2, 0x7FFF));
        assert!(!c.complete(2, 0), "duplicate");
        assert!(!c.complete(9, 0), "unknown");
        assert_eq!(c.take(1), None, "still in flight");
        assert_eq!(c.take(2), Some(0x7FFF));
        assert_eq!(c.take(2), None, "taken once");
        // A completed id given up without being collected is free again.
        assert!(c.complete(3, 0));
        assert!(c.release(3) && !c.release(3));
        assert_eq!(c.available(), 2);
        assert_eq!(c.alloc(), Some(3));
        c.reset();
        assert_eq!(c.available(), 3);
        assert_eq!(c.alloc(), Some(1));
    }
}

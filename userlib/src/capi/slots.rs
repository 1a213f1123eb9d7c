//! Generation-checked handle tables: what a C caller holds is a slot index plus a generation,
//! never an address of ours. A stale handle (its object was released and the slot reused) or a
//! forged one is a lookup miss, so it can never reach another object's state.

use std::sync::{Arc, RwLock};

/// One slot: the generation of its current (or last) occupant.
struct Slot<T> {
    generation: u32,
    value: Option<Arc<T>>,
}

/// A table of `Arc<T>` addressed by opaque 64-bit handles. Lookups take a read lock only
/// (concurrent I/O threads do not serialise on it); insert and remove take the write lock.
pub(crate) struct Slots<T> {
    inner: RwLock<Inner<T>>,
}

struct Inner<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

/// Index in the low 32 bits (plus one, so no handle is 0 = NULL), generation in the high 32.
fn encode(index: u32, generation: u32) -> usize {
    // CAST: 64-bit targets only (the C ABI's handles are pointers).
    ((u64::from(generation) << 32) | (u64::from(index) + 1)) as usize
}

fn decode(h: usize) -> Option<(usize, u32)> {
    let h = h as u64;
    let low = (h & 0xffff_ffff) as u32;
    let index = low.checked_sub(1)?;
    Some((index as usize, (h >> 32) as u32))
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots { inner: RwLock::new(Inner { slots: Vec::new(), free: Vec::new() }) }
    }
}

impl<T> Slots<T> {
    /// Stores `value`; returns its handle.
    pub(crate) fn insert(&self, value: Arc<T>) -> usize {
        let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = g.free.pop() {
            let slot = &mut g.slots[i as usize];
            // A new generation for every occupant: the previous occupant's handles miss.
            slot.generation = slot.generation.wrapping_add(1).max(1);
            slot.value = Some(value);
            return encode(i, slot.generation);
        }
        // CAST: more than 2^32 live objects is not a real workload; the index wraps into a
        // handle that never matches (lookups compare the whole slot).
        let i = g.slots.len() as u32;
        g.slots.push(Slot { generation: 1, value: Some(value) });
        encode(i, 1)
    }

    /// The object behind `h`, if `h` names a live one.
    pub(crate) fn get(&self, h: usize) -> Option<Arc<T>> {
        let (i, gen) = decode(h)?;
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let slot = g.slots.get(i)?;
        (slot.generation == gen).then(|| slot.value.clone()).flatten()
    }

    /// Removes the object behind `h` if `ok` accepts it; returns it. `Err(None)` when `h` names
    /// nothing, `Err(Some(obj))` when `ok` refused (the object stays).
    pub(crate) fn remove_if(&self, h: usize, ok: impl FnOnce(&Arc<T>) -> bool) -> Result<Arc<T>, Option<Arc<T>>> {
        let (i, gen) = decode(h).ok_or(None)?;
        let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let slot = g.slots.get_mut(i).ok_or(None)?;
        if slot.generation != gen {
            return Err(None);
        }
        let v = slot.value.as_ref().ok_or(None)?;
        if !ok(v) {
            return Err(Some(v.clone()));
        }
        let v = slot.value.take().ok_or(None)?;
        // CAST: `i` came from a u32 index.
        g.free.push(i as u32);
        Ok(v)
    }

    /// Removes the object behind `h`.
    pub(crate) fn remove(&self, h: usize) -> Option<Arc<T>> {
        self.remove_if(h, |_| true).ok()
    }

    /// Every live object with its handle.
    pub(crate) fn all(&self) -> Vec<(usize, Arc<T>)> {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        g.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.value.as_ref().map(|v| (encode(i as u32, s.generation), v.clone())))
            .collect()
    }

    /// Removes everything; returns what was there.
    pub(crate) fn drain(&self) -> Vec<Arc<T>> {
        let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        let mut freed = Vec::new();
        for (i, s) in g.slots.iter_mut().enumerate() {
            if let Some(v) = s.value.take() {
                out.push(v);
                freed.push(i as u32);
            }
        }
        g.free.extend(freed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_slot_does_not_answer_to_the_old_handle() {
        let s = Slots::default();
        let a = s.insert(Arc::new(1));
        assert_eq!(s.get(a).as_deref(), Some(&1));
        assert!(s.remove(a).is_some());
        let b = s.insert(Arc::new(2));
        assert_ne!(a, b, "same slot, new generation");
        assert!(s.get(a).is_none(), "stale handle must miss");
        assert_eq!(s.get(b).as_deref(), Some(&2));
    }

    #[test]
    fn null_and_forged_handles_miss() {
        let s: Slots<u8> = Slots::default();
        let a = s.insert(Arc::new(7));
        assert!(s.get(0).is_none());
        assert!(s.get(a + 1).is_none());
        assert!(s.get(a ^ (1 << 40)).is_none());
        assert!(s.get(usize::MAX).is_none());
        assert!(s.remove(0).is_none());
    }

    #[test]
    fn remove_if_keeps_a_refused_object() {
        let s = Slots::default();
        let a = s.insert(Arc::new(3));
        assert!(matches!(s.remove_if(a, |_| false), Err(Some(_))));
        assert!(s.get(a).is_some());
        assert!(s.remove_if(a, |_| true).is_ok());
        assert!(matches!(s.remove_if(a, |_| true), Err(None)));
    }
}

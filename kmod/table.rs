//! A small slot table (6.12's `KVec` has no remove): removal empties a slot, insertion reuses
//! the first empty one. Control-plane sizes are small (queue pairs, registrations, files).

use kernel::prelude::*;

/// Slots holding `T`s.
pub(crate) struct Table<T> {
    slots: KVec<Option<T>>,
}

impl<T> Table<T> {
    /// An empty table.
    pub(crate) fn new() -> Self {
        Table { slots: KVec::new() }
    }

    /// Makes sure the next [`Table::insert`] finds a free slot without allocating, so a caller
    /// can do irreversible work between this and the insert.
    pub(crate) fn reserve_one(&mut self) -> Result {
        if self.slots.iter().any(|s| s.is_none()) {
            return Ok(());
        }
        self.slots.push(None, GFP_KERNEL)?;
        Ok(())
    }

    /// Inserts `v` into the first free slot; returns the slot's index (stable until removal).
    pub(crate) fn insert(&mut self, v: T) -> Result<usize> {
        if let Some((i, slot)) = self.slots.iter_mut().enumerate().find(|(_, s)| s.is_none()) {
            *slot = Some(v);
            return Ok(i);
        }
        self.slots.push(Some(v), GFP_KERNEL)?;
        Ok(self.slots.len() - 1)
    }

    /// The slot of the first entry matching `pred`.
    pub(crate) fn find_index(&self, mut pred: impl FnMut(&T) -> bool) -> Option<usize> {
        self.slots.iter().position(|s| s.as_ref().is_some_and(&mut pred))
    }

    /// The entry in slot `i`, if any.
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.slots.get(i)?.as_ref()
    }

    /// Removes and returns the entry in slot `i`, if any.
    pub(crate) fn take(&mut self, i: usize) -> Option<T> {
        self.slots.get_mut(i)?.take()
    }

    /// The live entries.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.as_ref())
    }

    /// The live entries, mutable.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().filter_map(|s| s.as_mut())
    }

    /// Number of live entries.
    pub(crate) fn len(&self) -> usize {
        self.iter().count()
    }

    /// Removes and returns the first entry matching `pred`.
    pub(crate) fn remove_first(&mut self, mut pred: impl FnMut(&T) -> bool) -> Option<T> {
        let slot = self.slots.iter_mut().find(|s| s.as_ref().is_some_and(&mut pred))?;
        slot.take()
    }

    /// Removes every entry matching `pred` and returns them. Space for the result is reserved
    /// first; if that fails, nothing is removed.
    pub(crate) fn remove_all(&mut self, mut pred: impl FnMut(&T) -> bool) -> Result<KVec<T>> {
        let n = self.iter().filter(|v| pred(v)).count();
        let mut out = KVec::with_capacity(n, GFP_KERNEL)?;
        for slot in self.slots.iter_mut() {
            if slot.as_ref().is_some_and(&mut pred) {
                if let Some(v) = slot.take() {
                    // Cannot fail: capacity for all `n` matches was reserved above.
                    let _ = out.push(v, GFP_KERNEL);
                }
            }
        }
        Ok(out)
    }
}

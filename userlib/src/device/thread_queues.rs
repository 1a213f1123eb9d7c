//! Queue pairs of a thread's own for synchronous I/O (SPDK's queue pair per thread, handed out
//! at run time): a thread's first synchronous request on a device claims one of the device's
//! per-thread queues, creating it while the controller has queue pairs to spare, and keeps it
//! until the thread exits; its requests then take no lock and no atomic read-modify-write.
//! Without a spare queue a thread uses the device's shared queues (locked), and looks again once
//! another thread let its queue go.
//!
//! Lifetimes: the device owns every per-thread queue (its memory and its queue on the
//! controller: deleted with the device's other queues when the device closes). A thread holds
//! only a claim, in a thread-local: the queue's rings (plain data) behind their lock, which the
//! claim holds, and a weak reference to the device's set of queues. So a closed device is never
//! kept open by a thread, and a thread never reaches a closed device's queue: it finds its claim
//! only through a device that is open (the set's address, kept from reuse by the weak
//! reference). A reset re-creates the claimed queue on the controller like every other; its
//! holder sees the new epoch once, as a shared queue's user does. After a fork the claims copied
//! into the child are never used (every request checks the fork generation first) and name
//! nothing of the parent's device.

use super::PerDevice;
use crate::error::Result;
use crate::queue::{ClaimableQueue, Held, QueuePair, RingsClaim};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A device's per-thread queues: at most `slots.len()`, created as threads first need them.
#[derive(Debug)]
pub(crate) struct ThreadQueues {
    slots: Box<[OnceLock<ClaimableQueue>]>,
    /// Creating a queue is serialised (rare: a thread's first request while none is free).
    creating: Mutex<()>,
    /// The controller refused a queue pair: no more are created.
    exhausted: AtomicBool,
    /// Claims let go so far: a thread that found no queue looks again once this moved.
    released: AtomicU64,
}

/// A thread's claim on one device's per-thread queue, or the note that none was free.
struct Claim {
    /// The device's queues' address, what a request looks its claim up by: the weak reference
    /// in `set` keeps it from being reused.
    key: *const ThreadQueues,
    /// The device's queues.
    set: Weak<ThreadQueues>,
    /// The claimed slot and its rings; `None`: no queue was free when `seen` was read.
    held: Option<(usize, RingsClaim)>,
    /// `released` when this thread last looked for a queue.
    seen: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some((_, rings)) = self.held.take() {
            // The queue is free from here on (the lock is the claim).
            drop(rings);
            if let Some(set) = self.set.upgrade() {
                set.released.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

thread_local! {
    /// This thread's claims, one per device it did synchronous I/O on (dropped at thread exit).
    static CLAIMS: RefCell<Vec<Claim>> = const { RefCell::new(Vec::new()) };
}

impl ThreadQueues {
    /// Room for `max` queues, the first of them `ready` (made already; the rest are created on
    /// demand).
    pub(crate) fn new(max: usize, ready: Vec<QueuePair>) -> Self {
        let slots: Box<[OnceLock<ClaimableQueue>]> = (0..max.max(ready.len())).map(|_| OnceLock::new()).collect();
        for (s, q) in slots.iter().zip(ready) {
            let _ = s.set(q.into_claimable());
        }
        ThreadQueues { slots, creating: Mutex::new(()), exhausted: AtomicBool::new(false), released: AtomicU64::new(0) }
    }

    /// Queues made so far, claimed or not.
    pub(crate) fn made(&self) -> impl Iterator<Item = &ClaimableQueue> {
        self.slots.iter().filter_map(OnceLock::get)
    }

    /// Claims a free queue, creating one with `create` when none is free and there is room;
    /// `None` when neither works.
    #[cold]
    fn claim(&self, create: impl FnOnce() -> Result<QueuePair>) -> Option<(usize, RingsClaim)> {
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(rings) = s.get().and_then(ClaimableQueue::try_claim) {
                return Some((i, rings));
            }
        }
        if self.exhausted.load(Ordering::Relaxed) {
            return None;
        }
        let _g = self.creating.lock().unwrap_or_else(|e| e.into_inner());
        let i = self.slots.iter().position(|s| s.get().is_none())?;
        match create() {
            Ok(qp) => {
                let q = qp.into_claimable();
                let rings = q.try_claim()?;
                log::debug!("queue {} is a thread's own for synchronous I/O", q.qid());
                // Slots are only set here, under `creating`: `i` is still empty.
                self.slots[i].set(q).ok()?;
                Some((i, rings))
            }
            Err(e) => {
                log::debug!("no queue pair of its own for a thread ({e}): threads share the device's queues");
                self.exhausted.store(true, Ordering::Relaxed);
                None
            }
        }
    }
}

/// Runs `f` on the calling thread's own queue of the device whose per-thread queues are `set`
/// (claimed on the thread's first request, made with `create` while the controller has queues
/// to spare). `None` when the thread has none (no spare queue, or the thread is exiting), so
/// the caller uses a shared queue.
#[inline]
pub(super) fn with_own<R>(
    set: &Arc<ThreadQueues>,
    create: impl FnOnce() -> Result<QueuePair>,
    f: impl FnOnce(Held<'_>) -> R,
) -> Option<R> {
    if set.slots.is_empty() {
        return None;
    }
    CLAIMS
        .try_with(|claims| {
            // Busy only if `f` reentered, which synchronous I/O never does: share then.
            let mut claims = claims.try_borrow_mut().ok()?;
            let i = claim_in(&mut claims, set, create)?;
            let (slot, rings) = claims[i].held.as_mut()?;
            let held = set.slots.get(*slot)?.get()?.held(rings)?;
            Some(f(held))
        })
        .ok()
        .flatten()
}

/// [`with_own`] on several devices at once (a striped volume's members): `f` gets, per set in
/// `sets`, the calling thread's own queue of that device, or `None` where it has none (that
/// member's lane then uses a shared queue). `create(i)` makes a queue for `sets[i]`. `None`
/// when the thread's claims cannot be looked at (it is exiting, or `f` reentered), so every
/// lane shares.
pub(super) fn with_own_each<R>(
    sets: &[&Arc<ThreadQueues>],
    create: impl Fn(usize) -> Result<QueuePair>,
    f: impl FnOnce(PerDevice<Option<Held<'_>>>) -> R,
) -> Option<R> {
    CLAIMS
        .try_with(|claims| {
            let mut claims = claims.try_borrow_mut().ok()?;
            // Every set's claim first: adding one drops closed devices' claims, which moves the
            // indices of those after them (never ours: our sets are open).
            for set in sets.iter().filter(|s| !s.slots.is_empty()) {
                if !claims.iter().any(|c| c.key == Arc::as_ptr(set)) {
                    new_claim(&mut claims, set);
                }
            }
            // The claim each set's queue is held by; a set named twice is held once (the second
            // lane shares, and the lane driver refuses two lanes on one controller anyway).
            let mut at: PerDevice<Option<usize>> = PerDevice::with_capacity(sets.len());
            for (k, set) in sets.iter().enumerate() {
                let i = if set.slots.is_empty() { None } else { claim_in(&mut claims, set, || create(k)) };
                at.push(i.filter(|i| !at.contains(&Some(*i))));
            }
            // Disjoint borrows of the claims, in the sets' order.
            let mut mine: PerDevice<Option<&mut Claim>> = sets.iter().map(|_| None).collect();
            for (i, c) in claims.iter_mut().enumerate() {
                if let Some(k) = at.iter().position(|&a| a == Some(i)) {
                    mine[k] = Some(c);
                }
            }
            let held = mine
                .into_iter()
                .zip(sets)
                .map(|(c, set)| {
                    let (slot, rings) = c?.held.as_mut()?;
                    set.slots.get(*slot)?.get()?.held(rings)
                })
                .collect();
            Some(f(held))
        })
        .ok()
        .flatten()
}

/// The index in `claims` of this thread's claim on `set` once it holds a queue (claimed now,
/// made with `create`, while one is free or can be made); `None` when it holds none.
#[inline]
fn claim_in(
    claims: &mut Vec<Claim>,
    set: &Arc<ThreadQueues>,
    create: impl FnOnce() -> Result<QueuePair>,
) -> Option<usize> {
    let i = match claims.iter().position(|c| c.key == Arc::as_ptr(set)) {
        Some(i) => i,
        None => new_claim(claims, set),
    };
    let claim = &mut claims[i];
    if claim.held.is_none() {
        let now = set.released.load(Ordering::Relaxed);
        if claim.seen == now {
            return None;
        }
        claim.seen = now;
        claim.held = set.claim(create);
    }
    claim.held.as_ref().map(|_| i)
}

/// Adds an empty claim of this thread on `set`, after dropping its claims on devices that
/// closed; returns its index.
#[cold]
fn new_claim(claims: &mut Vec<Claim>, set: &Arc<ThreadQueues>) -> usize {
    claims.retain(|c| c.set.strong_count() > 0);
    // `seen` differs from any count: the first request looks for a queue.
    claims.push(Claim { key: Arc::as_ptr(set), set: Arc::downgrade(set), held: None, seen: u64::MAX });
    claims.len() - 1
}

/// The slot of the queue the calling thread holds among `set`, if any (tests).
#[cfg(test)]
pub(super) fn own_slot(set: &Arc<ThreadQueues>) -> Option<usize> {
    CLAIMS.with(|c| {
        let c = c.borrow();
        let claim = c.iter().find(|c| c.key == Arc::as_ptr(set))?;
        claim.held.as_ref().map(|(slot, _)| *slot)
    })
}

/// This thread's claims, devices closed since included (tests).
#[cfg(test)]
pub(super) fn claims_held() -> usize {
    CLAIMS.with(|c| c.borrow().len())
}

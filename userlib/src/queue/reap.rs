//! Reaping: completion entries taken off the CQ by phase tag, checked against the commands in
//! flight, and either recorded for their owners or handed to the caller; the CQ head doorbell
//! gives the consumed slots back a quarter of the ring at a time.

use super::{check_epoch, Core, Rings};
use crate::error::{Error, Result};
use crate::mem::QueueMemory;
use crate::mmio::StatusView;
use crate::ring::sq::SQE_BYTES;
use parking_lot::MutexGuard;
use ugds_uapi::Status;

/// Empty polls between epoch reads: a reset re-creates the queue empty, so the completions a
/// waiter expects never come and it must notice the new epoch.
const IDLE_POLLS_PER_EPOCH_CHECK: u32 = 64;

/// One completed command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Its command id.
    pub cid: u16,
    /// Its status.
    pub status: Status,
}

/// A completion of one of our commands: its id, raw status field and the SQ head it reports.
type Reaped = (u16, u16, u16);

/// What was wrong with a completion entry (kept small: it is returned per entry).
#[derive(Debug, Clone, Copy)]
enum Violation {
    /// Its command id is not in flight (unknown, or completed already).
    Cid(u16),
    /// Its SQ head lies outside what was submitted.
    SqHead(u16),
}

impl Violation {
    fn error(self, qp: &Core, r: &Rings) -> Error {
        Error::DeviceProtocol(match self {
            Violation::Cid(cid) => format!("queue {}: completion for command id {cid} that is not in flight", qp.qid),
            Violation::SqHead(h) => format!(
                "queue {}: SQ head {h} outside the submitted entries (head {}, tail {})",
                qp.qid,
                r.sq.head(),
                r.sq.tail()
            ),
        })
    }
}

/// Takes the next posted entry off the CQ, if any, and checks its command id, which must be in
/// flight. A good completion is recorded for its owner (`hand_out: false`) or its id freed for
/// the caller (`hand_out: true`); a bad one marks the queue broken. Each `Some` means one entry
/// was consumed. Returns the command id, the raw status field and the SQ head the entry
/// reports (checked by the caller: see [`apply_sq_head`]).
///
/// Command id 0 is never handed out: an entry for it is the controller running a zeroed slot
/// (an SQ entry the library disarmed after it completed) because something else wrote this
/// queue's tail doorbell (another process of the controller's trust domain, or a stale tail
/// after a reset). It is consumed and otherwise ignored (`Ok(None)`), its SQ head too.
#[inline(always)]
fn reap_one(qp: &Core, r: &mut Rings, hand_out: bool) -> Option<std::result::Result<Option<Reaped>, Violation>> {
    // SAFETY: `cq_mem` holds `depth` entries and `r.cq` has `depth` slots (`Core`'s invariant:
    // these rings are this core's).
    let e = unsafe { r.cq.pop_unchecked(&qp.cq_mem) }?;
    let cid = e.cid;
    if cid == 0 {
        return Some(Ok(None));
    }
    let ok = if hand_out { r.cids.in_flight(cid) && r.cids.release(cid) } else { r.cids.complete(cid, e.status) };
    if !ok {
        r.broken = true;
        return Some(Err(Violation::Cid(cid)));
    }
    Some(Ok(Some((cid, e.status, e.sq_head))))
}

/// Moves the SQ head to what a completion reported; it must lie inside what was submitted,
/// else the queue is broken. A reap applies only its last entry's head: each entry's head
/// supersedes the ones before it, and the SQ's free slots are only read after the reap.
///
/// The controller has fetched every entry before `head`: each is disarmed (its first 8 bytes,
/// opcode, command id and namespace, zeroed: a Flush of no namespace, which the controller fails
/// without touching memory), so a stray tail doorbell write replays no old command. One store
/// per command.
#[inline(always)]
fn apply_sq_head(qp: &Core, r: &mut Rings, head: u16) -> std::result::Result<(), Violation> {
    let old = r.sq.head();
    if !r.sq.set_head(head) {
        r.broken = true;
        return Err(Violation::SqHead(head));
    }
    // The entries from the old head up to the new one, in at most two runs (the ring wraps).
    let (old, head) = (usize::from(old), usize::from(head));
    if head == old + 1 {
        // One entry (a synchronous request's): no loop to set up.
        // SAFETY: `old` is the ring's head before, below depth (`Sq`'s invariant), and
        // `sq_mem` holds `depth` entries (`Core`'s invariant): the first 8 bytes of entry
        // `old` lie in it, 8-byte aligned.
        unsafe { qp.sq_mem.store64_unchecked(old * SQE_BYTES, 0) };
    } else if head >= old {
        disarm(qp, old, head);
    } else {
        // CAST: depth <= 65536.
        disarm(qp, old, qp.depth as usize);
        disarm(qp, 0, head);
    }
    Ok(())
}

/// Zeroes the first 8 bytes of SQ entries `from..to`, which lie below the ring's depth (the
/// old head, below depth by `Sq`'s invariant, and the new one, checked by `Sq::set_head`, or
/// the depth itself).
#[inline(always)]
fn disarm(qp: &Core, from: usize, to: usize) {
    // CAST: depth <= 65536.
    let to = to.min(qp.depth as usize);
    for i in from..to {
        // SAFETY: `i < depth` (clamped above) and `sq_mem` holds `depth` entries (`Core`'s
        // invariant), so the first 8 bytes of entry `i` lie in it, 8-byte aligned.
        unsafe { qp.sq_mem.store64_unchecked(i * SQE_BYTES, 0) };
    }
}

/// Gives consumed CQ slots back to the device, with one head doorbell write, once a quarter of
/// the ring is waiting (every reap on a ring of fewer than 8 slots).
///
/// Not at every reap: a head doorbell written the moment a completion is seen reaches the
/// device while it is still busy posting that completion (under emulation, a wait for the
/// emulator's lock at every command; SPDK, with shadow doorbells, writes almost none). The
/// device never goes without room: a submission that would leave it without gives the slots
/// back first ([`make_room`]), and a full CQ is reaped until a quarter of it is waiting.
#[inline]
fn release_slots(qp: &Core, r: &mut Rings) {
    if r.cq.unreleased() >= (qp.depth / 4).max(1) {
        give_back(qp, r);
    }
}

/// Gives the consumed CQ slots back before a submission publishes its entries, where the
/// commands the device will then hold could otherwise find the CQ full: those in flight
/// and the unreleased slots together may fill the ring's `depth - 1` usable slots, no more.
/// The ids not free (of `depth - 1`) count as in flight: the completed ones among them, whose
/// status waits to be collected, only make it give back a little early, and counting them
/// apart cost every command an update.
#[inline]
pub(super) fn make_room(qp: &Core, r: &mut Rings) {
    if r.cq.unreleased() as usize > r.cids.available() {
        give_back(qp, r);
    }
}

/// Gives every consumed CQ slot back: the head doorbell moves to the head.
#[inline]
fn give_back(qp: &Core, r: &mut Rings) {
    let (old, new) = r.cq.release();
    qp.cq_db.publish(new, old);
}

/// Reaps every posted completion, recording each for its owner. Returns how many. The epoch is
/// checked before anything is consumed (a reset leaves a zeroed CQ that must not be read as
/// completions), and on every 64th poll that finds nothing.
///
/// The poll that finds nothing (most polls of a wait) is inlined into the caller; the reap
/// itself is not (a call's register saves cost more than the empty poll itself).
#[inline(always)]
pub(super) fn record_all(qp: &Core, r: &mut Rings, status: &StatusView) -> Result<usize> {
    if !posted(qp, r, status)? {
        return Ok(0);
    }
    take_posted::<false>(qp, r, status, |_, _| {})
}

/// Reaps every posted completion and hands each to `sink` as its command id (free again) and
/// status: for a queue's single owner that keeps its own table of commands by id, so that a
/// reap costs what it found rather than what is in flight. Returns how many entries it
/// consumed. Epoch checks and the empty poll as in [`record_all`].
#[inline(always)]
pub(super) fn hand_out_all(
    qp: &Core,
    r: &mut Rings,
    status: &StatusView,
    sink: impl FnMut(u16, Status),
) -> Result<usize> {
    if !posted(qp, r, status)? {
        return Ok(0);
    }
    take_posted::<true>(qp, r, status, sink)
}

/// Whether an entry is posted. A poll that finds none counts itself and reads the epoch every
/// 64th time (or at once on a broken queue).
#[inline(always)]
fn posted(qp: &Core, r: &mut Rings, status: &StatusView) -> Result<bool> {
    // SAFETY: as in `reap_one`.
    if r.broken || !unsafe { r.cq.ready_unchecked(&qp.cq_mem) } {
        r.idle = r.idle.wrapping_add(1);
        if r.broken || r.idle.is_multiple_of(IDLE_POLLS_PER_EPOCH_CHECK) {
            check_epoch(qp, r, status)?;
        }
        return Ok(false);
    }
    Ok(true)
}

/// [`record_all`] or [`hand_out_all`] (`HAND_OUT`, a constant so that each has its own copy
/// without the other's branches) once an entry is posted.
#[inline(never)]
fn take_posted<const HAND_OUT: bool>(
    qp: &Core,
    r: &mut Rings,
    status: &StatusView,
    mut sink: impl FnMut(u16, Status),
) -> Result<usize> {
    check_epoch(qp, r, status)?;
    let (mut consumed, mut bad, mut head) = (0u32, None, None);
    while let Some(c) = reap_one(qp, r, HAND_OUT) {
        consumed += 1;
        match c {
            Ok(Some((cid, raw, h))) => {
                if HAND_OUT {
                    sink(cid, decode(raw));
                }
                head = Some(h);
            }
            Ok(None) => {}
            Err(v) => {
                bad = Some(v);
                break;
            }
        }
    }
    // The head came from entries before any bad one, so its violation is the earlier one.
    if let Some(Err(v)) = head.map(|h| apply_sq_head(qp, r, h)) {
        bad = Some(v);
    }
    release_slots(qp, r);
    // Completions recorded here may be a sleeping waiter's, whose interrupt woke somebody else.
    qp.wait.reaped();
    match bad {
        Some(v) => Err(v.error(qp, r)),
        // CAST: at most depth entries.
        None => Ok(consumed as usize),
    }
}

/// A status field decoded, with success (the common case) decoded for free.
#[inline]
pub(super) fn decode(raw: u16) -> Status {
    if raw == 0 {
        Status::SUCCESS
    } else {
        Status::from_field(raw)
    }
}

/// Posted completions as an iterator (from [`QueuePair::completions`]): each yielded command
/// id is free again. A protocol violation is yielded as an error, after which the iterator
/// ends and the queue is broken until a reset. Dropping it gives the consumed CQ slots back as
/// a reap does.
#[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
#[derive(Debug)]
pub struct Completions<'q> {
    qp: &'q Core,
    rings: MutexGuard<'q, Rings>,
    done: bool,
}

#[cfg_attr(not(any(test, feature = "test-utils")), allow(dead_code))]
impl<'q> Completions<'q> {
    pub(super) fn new(qp: &'q Core, rings: MutexGuard<'q, Rings>) -> Self {
        Completions { qp, rings, done: false }
    }
}

impl Iterator for Completions<'_> {
    type Item = Result<Completion>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let c = loop {
            let c = reap_one(self.qp, &mut self.rings, true)?;
            match c {
                Ok(None) => continue,
                Ok(Some(c)) => break Ok(c),
                Err(v) => break Err(v),
            }
        };
        // One entry at a time: its SQ head is applied at once.
        let c = c.and_then(|(cid, raw, head)| apply_sq_head(self.qp, &mut self.rings, head).map(|()| (cid, raw)));
        self.done = c.is_err();
        Some(match c {
            Ok((cid, raw)) => Ok(Completion { cid, status: decode(raw) }),
            Err(v) => Err(v.error(self.qp, &self.rings)),
        })
    }
}

impl Drop for Completions<'_> {
    fn drop(&mut self) {
        release_slots(self.qp, &mut self.rings);
    }
}

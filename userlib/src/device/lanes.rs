//! Runs a request's commands on one or more namespaces at once, from the calling thread. A
//! lane is a namespace, a registration on its controller and the extents to move; each lane
//! keeps a burst of commands in flight on its own queue (one doorbell per burst), and the thread
//! polls every lane in turn, refilling each as its burst completes. A synchronous request on
//! one namespace that needs more than one command is one lane (one command goes to the queue
//! directly: [`Namespace::rw_on`]); a striped volume's request is one lane per member it
//! touches, so all members work at once with no thread per member.
//!
//! A lane reaches its queue through a [`RequestQueue`]: the thread's own queue of its
//! controller or rings the caller holds (no lock and no atomic read-modify-write per command),
//! or the device's shared queue for this thread (locked per call). The logic here is the same
//! for all of them.

use super::{thread_queues, Namespace, PerDevice, Registration};
use crate::cmd::{self, Command, Stride};
use crate::error::Error;
use crate::inflight::Failed;
use crate::queue::{self, Held, HeldOrShared, RequestQueue, Waiter, MAX_BURST};
use smallvec::SmallVec;
use std::sync::Arc;
use std::time::Instant;
use ugds_uapi::Status;

/// One entry per command of a lane's burst: inline up to 4 commands.
type PerCommand<T> = SmallVec<[T; 4]>;

/// Bytes between a registration and a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    /// Byte offset in the registration.
    pub(crate) reg_offset: u64,
    /// Byte offset on the namespace.
    pub(crate) dev_offset: u64,
    /// Bytes (a multiple of the block size; checked by `Storage`).
    pub(crate) len: u64,
}

/// One namespace's share of a request.
#[derive(Debug)]
pub(crate) struct Lane<'a> {
    /// Where the commands go.
    pub(crate) ns: &'a Namespace,
    /// The memory they name (registered on `ns`'s controller).
    pub(crate) reg: &'a Registration,
    /// What to move, in order.
    pub(crate) extents: &'a [Extent],
}

/// Why a lane failed, and at which byte of its namespace.
#[derive(Debug)]
pub(crate) struct LaneFailure {
    /// The failure (with a token when its commands may still run).
    pub(crate) failure: Failed,
    /// The namespace byte offset of the first failed command (or of the burst that timed out).
    pub(crate) dev_offset: u64,
}

/// A lane's progress.
struct State<'a> {
    /// Next extent, and bytes of it already issued.
    next: (usize, u64),
    /// The burst in flight: its commands, their ids, the statuses collected so far, one entry
    /// per command, as long as the burst (at most [`MAX_BURST`]). Arrays of [`MAX_BURST`] cost
    /// every request 6 KiB of stores and copies (under QEMU's TCG about 70 us a request: a
    /// 256 KiB read over two chunks of a volume took 3.4x its node's time).
    burst: PerCommand<Command<'a>>,
    cids: PerCommand<u16>,
    out: PerCommand<Option<Status>>,
    got: usize,
    /// The queue's epoch when the burst went out (a reset since wiped it).
    epoch: u64,
    /// When this burst's deadline started counting (first clock read while it waited).
    since: Option<Instant>,
    result: Option<Result<(), LaneFailure>>,
}

impl<'a> State<'a> {
    fn new() -> Self {
        State {
            next: (0, 0),
            burst: PerCommand::new(),
            cids: PerCommand::new(),
            out: PerCommand::new(),
            got: 0,
            epoch: 0,
            since: None,
            result: None,
        }
    }

    /// Commands in flight (0: none, the next burst is due).
    fn in_flight(&self) -> usize {
        self.burst.len()
    }

    /// The namespace byte offset of burst command `k`.
    fn dev_offset(&self, lane: &Lane<'_>, k: usize) -> u64 {
        self.burst[k].slba() << lane.ns.info.lba_shift
    }

    /// Fills the next burst of `lane`'s commands; returns how many, or why none can be built
    /// (the registration was revoked) and at which device offset.
    fn fill(&mut self, write: bool, lane: &Lane<'a>, depth: u32) -> Result<usize, (Error, u64)> {
        let ns = lane.ns;
        let shift = ns.info.lba_shift;
        let per_cmd = ns.max_command_bytes() & !(ns.block_size() - 1);
        let burst_max = MAX_BURST.min(depth as usize - 1);
        self.burst.clear();
        self.cids.clear();
        self.out.clear();
        while self.burst.len() < burst_max {
            let Some(e) = lane.extents.get(self.next.0) else { break };
            let done = self.next.1;
            if done >= e.len {
                self.next = (self.next.0 + 1, 0);
                continue;
            }
            // The command takes the rest of this extent up to the largest command, and gathers
            // the extents after it that continue it on the namespace while it has room: a
            // striped volume member's chunks, which lie in the buffer at a fixed distance (the
            // other members' chunks between them). One command where there were one per chunk.
            let (chunk, last, last_end, stride) = gathered(lane, self.next, per_cmd);
            let (slba, nlb) = ((e.dev_offset + done) >> shift, (chunk >> shift) as u32);
            let start = e.reg_offset + done;
            // SAFETY: `lane.reg` is held by a buffer whose I/O lease the caller holds for the
            // call (the CPU cannot touch the memory) and keeps for good when the commands may
            // outlive it (the failure's `InFlight` token), so the registration stays while the
            // SSD may use it; `chunk` is exactly `nlb` blocks, those of the extents it takes,
            // whose buffer ranges `stride` lays out.
            let data = unsafe {
                match stride {
                    None => lane.reg.range(start, chunk),
                    Some(stride) => lane.reg.gather(start, stride, chunk),
                }
            }
            .map_err(|err| (err, e.dev_offset + done))?;
            self.burst.push(if write {
                cmd::Write::new(slba, nlb, data).build()
            } else {
                cmd::Read::new(slba, nlb, data).build()
            });
            self.cids.push(0);
            self.out.push(None);
            self.next = (last, last_end);
        }
        Ok(self.burst.len())
    }

    fn fail(&mut self, failure: Failed, dev_offset: u64) {
        self.burst.clear();
        self.result = Some(Err(LaneFailure { failure, dev_offset }));
    }
}

/// The next command of `lane` from `next` (an extent and bytes of it already issued), at most
/// `per_cmd` bytes: its bytes, the extent and the end within it where it stops, and how its
/// buffer pieces lie when it takes more than one extent. It takes the following extents while
/// they continue the namespace's blocks, lie at one distance from each other in the buffer
/// (every extent between the first and the last as long as the second), and the buffer jumps
/// from the end of a bus page to the start of one, as PRP list entries need (SGLs could jump
/// anywhere; PRPs are what every controller takes).
fn gathered(lane: &Lane<'_>, next: (usize, u64), per_cmd: u64) -> (u64, usize, u64, Option<Stride>) {
    let (i, done) = next;
    let mut chunk = per_cmd.min(lane.extents[i].len - done);
    let (mut last, mut last_end) = (i, done + chunk);
    let mut stride = Stride::one(chunk);
    while chunk < per_cmd && last_end == lane.extents[last].len {
        let (p, Some(f)) = (&lane.extents[last], lane.extents.get(last + 1)) else { break };
        let p_end = p.reg_offset + p.len;
        let Some(gap) = f.reg_offset.checked_sub(p_end) else { break };
        if f.dev_offset != p.dev_offset + p.len {
            break;
        }
        let piece = if last == i { chunk } else { p.len };
        let jumps = || lane.reg.jumps_between_pages(p_end, f.reg_offset);
        let take = stride.take_next(piece, gap, f.len, per_cmd - chunk, jumps);
        if take == 0 {
            break;
        }
        (chunk, last, last_end) = (chunk + take, last + 1, take);
    }
    (chunk, last, last_end, (last > i).then_some(stride))
}

/// Moves every lane's extents (reads into or writes from its registration), all lanes at once,
/// each on the calling thread's own queue of its controller where the thread has one (as a
/// namespace's request, [`Namespace::rw`]), else on this thread's shared queue there. Returns
/// one result per lane. After the first failure no lane starts another burst, but every burst
/// already in flight is waited for (or left in flight with a token), so nothing the caller's
/// memory is named by runs after this returns unless a failure's token says so.
pub(crate) fn run(write: bool, lanes: &[Lane<'_>]) -> PerDevice<Result<(), LaneFailure>> {
    // Before the thread's claims are looked at: a forked child's claims are its parent's.
    if lanes.iter().any(|l| l.ns.dev.born.in_child()) {
        return fail_all(lanes, || Error::ForkedChild { object: "device" }.into());
    }
    let sets: PerDevice<_> = lanes.iter().map(|l| &*l.ns.dev.threads).collect();
    let create = |i: usize| lanes[i].ns.dev.create_thread_queue();
    let none = || lanes.iter().map(|_| None).collect();
    match thread_queues::with_own_each(&sets, create, |own| run_on(write, lanes, own)) {
        Some(r) => r,
        None => run_on(write, lanes, none()),
    }
}

/// [`run`] with `own[i]` the thread's own queue for lane `i`, or `None` to share.
fn run_on(write: bool, lanes: &[Lane<'_>], own: PerDevice<Option<Held<'_>>>) -> PerDevice<Result<(), LaneFailure>> {
    let mut queues = PerDevice::with_capacity(lanes.len());
    for (l, held) in lanes.iter().zip(own) {
        match (held, l.ns.queue()) {
            (Some(h), _) => queues.push(HeldOrShared::Held(h)),
            (None, Ok(q)) => queues.push(HeldOrShared::Shared(q)),
            // Nothing started: every lane fails, at its first byte, with why.
            (None, Err(_)) => return fail_all(lanes, || super::namespace::no_shared_queue().into()),
        }
    }
    let mut states: PerDevice<State<'_>> = lanes.iter().map(|_| State::new()).collect();
    drive(write, lanes, &mut queues, &mut states);
    states.iter_mut().map(|s| s.result.take().unwrap_or(Ok(()))).collect()
}

/// Every lane failed at its first byte, with `failure()`, nothing started.
fn fail_all(lanes: &[Lane<'_>], failure: impl Fn() -> Failed) -> PerDevice<Result<(), LaneFailure>> {
    lanes
        .iter()
        .map(|l| Err(LaneFailure { failure: failure(), dev_offset: l.extents.first().map_or(0, |e| e.dev_offset) }))
        .collect()
}

/// [`run`] for one lane on queue `q` (this thread's shared queue of the lane's controller, or
/// a queue pair on it the caller owns): a namespace's synchronous request of more than one
/// command (one command needs no lane: [`Namespace::rw_on`]).
pub(crate) fn run_one(write: bool, lane: &Lane<'_>, q: impl RequestQueue) -> Result<(), LaneFailure> {
    let mut state = [State::new()];
    drive(write, std::slice::from_ref(lane), &mut [q], &mut state);
    let [s] = state;
    s.result.unwrap_or(Ok(()))
}

/// Runs `lanes` to the end, lane `i` on `queues[i]`; each lane's outcome is left in its
/// state's `result`.
fn drive<'a, Q: RequestQueue>(write: bool, lanes: &[Lane<'a>], queues: &mut [Q], states: &mut [State<'a>]) {
    for (l, st) in lanes.iter().zip(states.iter_mut()) {
        if !Arc::ptr_eq(&l.reg.dev, &l.ns.dev) {
            st.result = Some(Err(LaneFailure {
                failure: Error::invalid("buf", "registered on another device").into(),
                dev_offset: l.extents.first().map_or(0, |e| e.dev_offset),
            }));
        }
    }
    // Two lanes on one controller would share its queue: one's burst can wait for room the
    // other's uncollected completions hold, and one's reset wipes the other's commands. Volumes
    // refuse a device named twice; refuse it here too, before anything is submitted.
    for (i, l) in lanes.iter().enumerate() {
        if lanes[..i].iter().any(|o| Arc::ptr_eq(&o.ns.dev, &l.ns.dev)) {
            for (l, st) in lanes.iter().zip(states.iter_mut()) {
                st.result = Some(Err(LaneFailure {
                    failure: Error::invalid("lanes", "two lanes on one controller").into(),
                    dev_offset: l.extents.first().map_or(0, |e| e.dev_offset),
                }));
            }
            return;
        }
    }
    let mut failed = states.iter().any(|s| s.result.is_some());
    let bytes = lanes.iter().map(|l| l.extents.iter().map(|e| e.len).sum::<u64>()).max().unwrap_or(0);
    let mut wait = Waiter::new(bytes);
    loop {
        let mut progressed = false;
        let mut waiting: Option<usize> = None;
        for (i, ((lane, st), q)) in lanes.iter().zip(states.iter_mut()).zip(queues.iter_mut()).enumerate() {
            if st.result.is_some() {
                continue;
            }
            let ns = lane.ns;
            if st.in_flight() == 0 {
                let n = if failed {
                    0
                } else {
                    match st.fill(write, lane, q.depth()) {
                        Ok(n) => n,
                        Err((e, off)) => {
                            // Nothing of the burst was built: nothing is in flight.
                            st.fail(ns.failure(q, e), off);
                            failed = true;
                            continue;
                        }
                    }
                };
                if n == 0 {
                    st.result = Some(Ok(()));
                    continue;
                }
                match q.submit(ns.info.nsid, &st.burst, &ns.dev.status, ns.timeout, &mut st.cids[..n]) {
                    Ok(epoch) => st.epoch = epoch,
                    Err(e) => {
                        // Nothing of the burst was published.
                        let off = st.dev_offset(lane, 0);
                        st.fail(ns.failure(q, e), off);
                        failed = true;
                        continue;
                    }
                }
                (st.got, st.since) = (0, None);
                progressed = true;
            }
            let n = st.in_flight();
            match q.collect(st.epoch, &st.cids[..n], &ns.dev.status, &mut st.out[..n]) {
                Ok(k) => {
                    st.got += k;
                    progressed |= k > 0;
                }
                Err(e) => {
                    let off = st.dev_offset(lane, 0);
                    st.fail(ns.failure(q, e), off);
                    failed = true;
                    continue;
                }
            }
            if st.got == n {
                let bad =
                    st.out[..n].iter().enumerate().find_map(|(k, s)| s.filter(|s| !s.is_success()).map(|s| (k, s)));
                if let Some((k, status)) = bad {
                    let err = Error::Nvme { op: st.burst[k].name(), slba: st.burst[k].slba(), status };
                    let off = st.dev_offset(lane, k);
                    st.fail(err.into(), off);
                    failed = true;
                }
                st.burst.clear();
            } else {
                waiting.get_or_insert(i);
            }
        }
        if states.iter().all(|s| s.result.is_some()) {
            wait.done();
            break;
        }
        if progressed {
            // A burst completed: the wait for the next one starts over (and this one's length
            // feeds the spin budget).
            std::mem::replace(&mut wait, Waiter::new(bytes)).done();
            continue;
        }
        let Some(w) = waiting else { continue };
        // The clock is read only every few thousand polls and after each sleep (each lane's
        // deadline counts from the first read after its burst went out).
        if wait.pause(queues[w].wait_state()) {
            let now = Instant::now();
            for ((lane, st), q) in lanes.iter().zip(states.iter_mut()).zip(queues.iter_mut()) {
                if st.result.is_some() || st.in_flight() == 0 || st.got == st.in_flight() {
                    continue;
                }
                let since = *st.since.get_or_insert(now);
                if now.duration_since(since) > lane.ns.timeout {
                    // The uncollected commands stay in flight until the reset clears them.
                    let err = queue::timeout_error(&st.burst[0], lane.ns.timeout);
                    let off = st.dev_offset(lane, 0);
                    st.fail(lane.ns.failure(q, err), off);
                    failed = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane's state is what every request of more than one command builds, moves and drops:
    /// it has room for a few commands inline, not arrays of a whole burst. With arrays of
    /// [`MAX_BURST`] it was 6224 bytes, and a 256 KiB read over two chunks of a volume took 3.4x
    /// its node's time under QEMU's TCG. (552 bytes with 4 commands inline, each with the
    /// stride of the pieces it may gather.)
    #[test]
    fn a_lane_state_is_small() {
        let size = std::mem::size_of::<State<'static>>();
        assert!(size <= 576, "a lane's state is {size} bytes");
    }
}

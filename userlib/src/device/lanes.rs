//! Runs a request's commands on one or more namespaces at once, from the calling thread. A
//! lane is a namespace, a registration on its controller and the extents to move; each lane
//! keeps a burst of commands in flight on its own queue (one doorbell per burst), and the thread
//! polls every lane in turn, refilling each as its burst completes. A synchronous request on
//! one namespace is one lane; a striped volume's request is one lane per member it touches, so
//! all members work at once with no thread per member.
//!
//! How a lane reaches its queue is a [`LaneQueue`]: the device's shared queue for this thread
//! ([`Shared`], locked per call) or a queue pair the caller owns ([`Owned`], no lock and no
//! atomic read-modify-write per command). The logic here is the same for both.

use super::{Namespace, Registration};
use crate::cmd::{self, Command};
use crate::error::Error;
use crate::inflight::{Failed, InFlight, Why};
use crate::mmio::StatusView;
use crate::queue::{self, Held, QueuePair, QueueWait, Ticket, Waiter, MAX_BURST};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds_uapi::Status;

/// How a lane submits to and collects from its queue pair.
pub(crate) trait LaneQueue {
    /// Entries per ring.
    fn depth(&self) -> u32;
    /// Its waiting state, for [`Waiter::pause`].
    fn wait_state(&self) -> &Arc<QueueWait>;
    /// Adopts the controller's new epoch after this thread's own reset (see
    /// [`QueuePair::resync`]).
    fn resync(&mut self, status: &StatusView);
    /// Submits a burst (see [`QueuePair::submit_tagged`]); returns the rings' epoch.
    fn submit(
        &mut self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> crate::error::Result<u64>;
    /// Collects what completed of a burst submitted in `epoch` (see
    /// [`QueuePair::collect_tagged`]).
    fn collect(
        &mut self,
        epoch: u64,
        cids: &[u16],
        status: &StatusView,
        out: &mut [Option<Status>],
    ) -> crate::error::Result<usize>;
    /// Submits one command (see [`QueuePair::submit_one`]).
    fn submit_one(
        &mut self,
        nsid: u32,
        cmd: &Command<'_>,
        status: &StatusView,
        timeout: Duration,
    ) -> crate::error::Result<Ticket>;
    /// Its status once it completed (see [`QueuePair::collect_one`]).
    fn collect_one(&mut self, t: Ticket, status: &StatusView) -> crate::error::Result<Option<Status>>;
}

/// A queue pair shared with other threads: every call takes its lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shared<'q>(pub(crate) &'q QueuePair);

impl LaneQueue for Shared<'_> {
    fn depth(&self) -> u32 {
        self.0.depth()
    }

    fn wait_state(&self) -> &Arc<QueueWait> {
        self.0.wait_state()
    }

    fn resync(&mut self, status: &StatusView) {
        self.0.resync(status)
    }

    #[inline]
    fn submit(
        &mut self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> crate::error::Result<u64> {
        self.0.submit_tagged(nsid, cmds, status, timeout, cids)
    }

    #[inline]
    fn collect(
        &mut self,
        epoch: u64,
        cids: &[u16],
        status: &StatusView,
        out: &mut [Option<Status>],
    ) -> crate::error::Result<usize> {
        self.0.collect_tagged(epoch, cids, status, out)
    }

    #[inline]
    fn submit_one(
        &mut self,
        nsid: u32,
        cmd: &Command<'_>,
        status: &StatusView,
        timeout: Duration,
    ) -> crate::error::Result<Ticket> {
        self.0.submit_one(nsid, cmd, status, timeout)
    }

    #[inline]
    fn collect_one(&mut self, t: Ticket, status: &StatusView) -> crate::error::Result<Option<Status>> {
        self.0.collect_one(t, status)
    }
}

/// A queue pair's rings this thread holds (a queue pair it owns, or the device's queue it
/// claimed): the borrow proves nobody else uses them, so they are used with no lock.
///
/// Untagged collection is exact here: only the holder's own calls reset the rings (a new epoch
/// seen by its submit or reap, reported to it as `EpochChanged`, or its own `resync` after its
/// own reset), so the command ids of a burst cannot name another burst's commands.
#[derive(Debug)]
pub(crate) struct Owned<'q>(pub(crate) Held<'q>);

impl LaneQueue for Owned<'_> {
    fn depth(&self) -> u32 {
        self.0.depth()
    }

    fn wait_state(&self) -> &Arc<QueueWait> {
        self.0.wait_state()
    }

    fn resync(&mut self, status: &StatusView) {
        self.0.resync(status)
    }

    #[inline]
    fn submit(
        &mut self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &StatusView,
        timeout: Duration,
        cids: &mut [u16],
    ) -> crate::error::Result<u64> {
        self.0.submit(nsid, cmds, status, timeout, cids)
    }

    #[inline]
    fn collect(
        &mut self,
        _epoch: u64,
        cids: &[u16],
        status: &StatusView,
        out: &mut [Option<Status>],
    ) -> crate::error::Result<usize> {
        self.0.collect(cids, status, out)
    }

    #[inline]
    fn submit_one(
        &mut self,
        nsid: u32,
        cmd: &Command<'_>,
        status: &StatusView,
        timeout: Duration,
    ) -> crate::error::Result<Ticket> {
        self.0.submit_one(nsid, cmd, status, timeout)
    }

    #[inline]
    fn collect_one(&mut self, t: Ticket, status: &StatusView) -> crate::error::Result<Option<Status>> {
        self.0.collect_one(t, status)
    }
}

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
    /// The burst in flight: commands, their ids, statuses collected so far.
    burst: [Command<'a>; MAX_BURST],
    dev_offsets: [u64; MAX_BURST],
    cids: [u16; MAX_BURST],
    out: [Option<Status>; MAX_BURST],
    n: usize,
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
            burst: [cmd::Flush::new().build(); MAX_BURST],
            dev_offsets: [0; MAX_BURST],
            cids: [0; MAX_BURST],
            out: [None; MAX_BURST],
            n: 0,
            got: 0,
            epoch: 0,
            since: None,
            result: None,
        }
    }

    /// Fills the next burst of `lane`'s commands; returns how many, or why none can be built
    /// (the registration was revoked) and at which device offset.
    fn fill(&mut self, write: bool, lane: &Lane<'a>, depth: u32) -> Result<usize, (Error, u64)> {
        let ns = lane.ns;
        let shift = ns.info.lba_shift;
        let per_cmd = ns.max_command_bytes() & !(ns.block_size() - 1);
        let burst_max = MAX_BURST.min(depth as usize - 1);
        let mut n = 0;
        while n < burst_max {
            let Some(e) = lane.extents.get(self.next.0) else { break };
            let done = self.next.1;
            if done >= e.len {
                self.next = (self.next.0 + 1, 0);
                continue;
            }
            let chunk = per_cmd.min(e.len - done);
            let (slba, nlb) = ((e.dev_offset + done) >> shift, (chunk >> shift) as u32);
            // SAFETY: `lane.reg` is held by a buffer whose I/O lease the caller holds for the
            // call (the CPU cannot touch the memory) and keeps for good when the commands may
            // outlive it (the failure's `InFlight` token), so the registration stays while the
            // SSD may use it; `chunk` is exactly `nlb` blocks.
            let data =
                unsafe { lane.reg.range(e.reg_offset + done, chunk) }.map_err(|err| (err, e.dev_offset + done))?;
            self.burst[n] =
                if write { cmd::Write::new(slba, nlb, data).build() } else { cmd::Read::new(slba, nlb, data).build() };
            self.dev_offsets[n] = e.dev_offset + done;
            self.next.1 = done + chunk;
            n += 1;
        }
        Ok(n)
    }

    fn fail(&mut self, failure: Failed, dev_offset: u64) {
        self.n = 0;
        self.result = Some(Err(LaneFailure { failure, dev_offset }));
    }
}

/// The failure for `error`: a timeout, a faulted controller or a completion the queue could not
/// believe may leave commands running (an [`InFlight`] token), unless a reset confirms the
/// controller stopped (then `q`, the queue the caller was using, adopts the new epoch, as the
/// shared path's does).
fn failure(ns: &Namespace, q: &mut impl LaneQueue, error: Error) -> Failed {
    match error {
        e @ (Error::Timeout { .. } | Error::DeviceFaulted | Error::DeviceProtocol(_)) => {
            if ns.reset_controller() {
                q.resync(&ns.dev.status);
                return e.into();
            }
            Failed::running(e, InFlight::new(Why::Command))
        }
        e => e.into(),
    }
}

/// Moves every lane's extents (reads into or writes from its registration), all lanes at once,
/// each on this thread's shared queue of its controller. Returns one result per lane. After the
/// first failure no lane starts another burst, but every burst already in flight is waited for
/// (or left in flight with a token), so nothing the caller's memory is named by runs after this
/// returns unless a failure's token says so.
pub(crate) fn run(write: bool, lanes: &[Lane<'_>]) -> Vec<Result<(), LaneFailure>> {
    let mut states: Vec<State<'_>> = lanes.iter().map(|_| State::new()).collect();
    let mut queues: Vec<Shared<'_>> = lanes.iter().map(|l| Shared(l.ns.queue())).collect();
    drive(write, lanes, &mut queues, &mut states);
    states.into_iter().map(|s| s.result.unwrap_or(Ok(()))).collect()
}

/// [`run`] for one lane on queue `q` (this thread's shared queue of the lane's controller, or
/// a queue pair on it the caller owns), its state on the stack: a namespace's synchronous
/// request allocates nothing.
#[inline]
pub(crate) fn run_one(write: bool, lane: &Lane<'_>, mut q: impl LaneQueue) -> Result<(), LaneFailure> {
    if let [e] = lane.extents {
        if e.len > 0 && e.len <= lane.ns.max_command_bytes() && Arc::ptr_eq(&lane.reg.dev, &lane.ns.dev) {
            return one_command(write, lane.ns, lane.reg, e, &mut q)
                .map_err(|failure| LaneFailure { failure, dev_offset: e.dev_offset });
        }
    }
    let mut state = [State::new()];
    drive(write, std::slice::from_ref(lane), &mut [q], &mut state);
    let [s] = state;
    s.result.unwrap_or(Ok(()))
}

/// A request that one command carries (the common synchronous read or write): built, submitted
/// and waited for with no burst state, so its cost is the queue's own. Failures map as
/// [`drive`]'s do.
#[inline]
fn one_command(
    write: bool,
    ns: &Namespace,
    reg: &Registration,
    e: &Extent,
    q: &mut impl LaneQueue,
) -> Result<(), Failed> {
    let shift = ns.info.lba_shift;
    let (slba, nlb) = (e.dev_offset >> shift, (e.len >> shift) as u32);
    // SAFETY: as in `State::fill`: the caller's lease keeps the registration and its memory
    // for the call (and for good, through the failure's token, when the command may outlive it);
    // `e.len` is exactly `nlb` blocks.
    let data = unsafe { reg.range(e.reg_offset, e.len) }.map_err(|err| failure(ns, q, err))?;
    let cmd = if write { cmd::Write::new(slba, nlb, data).build() } else { cmd::Read::new(slba, nlb, data).build() };
    let status = &ns.dev.status;
    let t = q.submit_one(ns.info.nsid, &cmd, status, ns.timeout).map_err(|err| failure(ns, q, err))?;
    let mut wait = Waiter::new(e.len);
    let mut since: Option<Instant> = None;
    loop {
        match q.collect_one(t, status) {
            Ok(Some(st)) => {
                wait.done();
                if !st.is_success() {
                    return Err(Error::Nvme { op: cmd.name(), slba, status: st }.into());
                }
                return Ok(());
            }
            Ok(None) => {}
            Err(err) => return Err(failure(ns, q, err)),
        }
        // The clock is read only every few thousand polls and after each sleep.
        if wait.pause(q.wait_state()) {
            let now = Instant::now();
            if now.duration_since(*since.get_or_insert(now)) > ns.timeout {
                // The command stays in flight until the reset clears it.
                return Err(failure(ns, q, queue::timeout_error(&cmd, ns.timeout)));
            }
        }
    }
}

/// Runs `lanes` to the end, lane `i` on `queues[i]`; each lane's outcome is left in its
/// state's `result`.
fn drive<'a, Q: LaneQueue>(write: bool, lanes: &[Lane<'a>], queues: &mut [Q], states: &mut [State<'a>]) {
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
            if st.n == 0 {
                let n = if failed {
                    0
                } else {
                    match st.fill(write, lane, q.depth()) {
                        Ok(n) => n,
                        Err((e, off)) => {
                            // Nothing of the burst was built: nothing is in flight.
                            st.fail(failure(ns, q, e), off);
                            failed = true;
                            continue;
                        }
                    }
                };
                if n == 0 {
                    st.result = Some(Ok(()));
                    continue;
                }
                match q.submit(ns.info.nsid, &st.burst[..n], &ns.dev.status, ns.timeout, &mut st.cids) {
                    Ok(epoch) => st.epoch = epoch,
                    Err(e) => {
                        // Nothing of the burst was published.
                        let off = st.dev_offsets[0];
                        st.fail(failure(ns, q, e), off);
                        failed = true;
                        continue;
                    }
                }
                (st.n, st.got, st.since) = (n, 0, None);
                st.out[..n].iter_mut().for_each(|o| *o = None);
                progressed = true;
            }
            let n = st.n;
            match q.collect(st.epoch, &st.cids[..n], &ns.dev.status, &mut st.out[..n]) {
                Ok(k) => {
                    st.got += k;
                    progressed |= k > 0;
                }
                Err(e) => {
                    let off = st.dev_offsets[0];
                    st.fail(failure(ns, q, e), off);
                    failed = true;
                    continue;
                }
            }
            if st.got == n {
                st.n = 0;
                let bad =
                    st.out[..n].iter().enumerate().find_map(|(k, s)| s.filter(|s| !s.is_success()).map(|s| (k, s)));
                if let Some((k, status)) = bad {
                    let err = Error::Nvme { op: st.burst[k].name(), slba: st.burst[k].slba(), status };
                    let off = st.dev_offsets[k];
                    st.fail(err.into(), off);
                    failed = true;
                }
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
                if st.result.is_some() || st.n == 0 || st.got == st.n {
                    continue;
                }
                let since = *st.since.get_or_insert(now);
                if now.duration_since(since) > lane.ns.timeout {
                    // The uncollected commands stay in flight until the reset clears them.
                    let err = queue::timeout_error(&st.burst[0], lane.ns.timeout);
                    let off = st.dev_offsets[0];
                    st.fail(failure(lane.ns, q, err), off);
                    failed = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LaneQueue, Owned, Shared};
    use crate::cmd::{DmaRange, Flush, Read, Write};
    use crate::error::Error;
    use crate::mmio::StatusView;
    use crate::mock::{Behaviour, MockQueue};
    use crate::pattern;
    use std::time::{Duration, Instant};
    use ugds_uapi::ioctl::Segment;

    const T: Duration = Duration::from_secs(10);

    /// Submits one command through `q` and collects it (the device thread answers).
    fn one(q: &mut impl LaneQueue, status: &StatusView, cmd: crate::cmd::Command<'_>) -> crate::error::Result<()> {
        let mut cids = [0u16; 1];
        let epoch = q.submit(1, &[cmd], status, T, &mut cids)?;
        let mut out = [None; 1];
        let start = Instant::now();
        while q.collect(epoch, &cids, status, &mut out)? == 0 {
            assert!(start.elapsed() < T, "no completion");
            std::hint::spin_loop();
        }
        assert!(out[0].is_some_and(|s| s.is_success()), "{out:?}");
        Ok(())
    }

    /// Writes 8 KiB from host offset 0 to LBA 3 and reads it back to host offset 64 KiB.
    fn round_trip(q: &mut impl LaneQueue, status: &StatusView, segs: &[Segment]) {
        assert_eq!(q.depth(), 8);
        // SAFETY: the mock's segments name its own memory, which only its device model touches;
        // each range is exactly the command's 2 blocks of 4096 bytes.
        let (src, dst) = unsafe { (DmaRange::new(segs, 0, 8192), DmaRange::new(segs, 65536, 8192)) };
        one(q, status, Write::new(3, 2, src).build()).unwrap();
        one(q, status, Read::new(3, 2, dst).build()).unwrap();
    }

    /// The owned adapter moves the same data as the shared one, through the single-owner calls.
    #[test]
    fn shared_and_owned_lanes_move_the_same_data() {
        for owned in [false, true] {
            let mut m = MockQueue::new(8, Behaviour::Honest).unwrap();
            let mut data = vec![0u8; 8192];
            pattern::fill(31, 0, &mut data);
            m.host_write(0, &data);
            let segs = m.segments().to_vec();
            if owned {
                round_trip(&mut Owned(m.qp.held()), &m.status, &segs);
            } else {
                round_trip(&mut Shared(&m.qp), &m.status, &segs);
            }
            assert_eq!(m.host_read(65536, 8192), data, "owned: {owned}");
            assert_eq!(m.backing(3, 2), data, "owned: {owned}");
        }
    }

    /// One command through the owned or the shared adapter of `m`'s queue pair.
    fn flush(m: &mut MockQueue, owned: bool, resync: bool) -> crate::error::Result<()> {
        let status = &m.status;
        if owned {
            let mut q = Owned(m.qp.held());
            if resync {
                q.resync(status);
            }
            one(&mut q, status, Flush::new().build())
        } else {
            let mut q = Shared(&m.qp);
            if resync {
                q.resync(status);
            }
            one(&mut q, status, Flush::new().build())
        }
    }

    /// After a controller reset both adapters report the epoch change once to their next
    /// submission, then carry on; after a reset this thread made itself, `resync` adopts the
    /// new epoch silently on either.
    #[test]
    fn both_lanes_see_a_reset_once_and_resync_after_their_own() {
        for owned in [false, true] {
            let mut m = MockQueue::new(8, Behaviour::Honest).unwrap();
            flush(&mut m, owned, false).unwrap();
            m.reset_controller();
            let e = flush(&mut m, owned, false);
            assert!(matches!(e, Err(Error::EpochChanged { old: 1, new: 2 })), "owned {owned}: {e:?}");
            flush(&mut m, owned, false).unwrap();
            // Another reset, this time "ours": resync, and the next command goes through.
            m.reset_controller();
            flush(&mut m, owned, true).unwrap();
        }
    }
}

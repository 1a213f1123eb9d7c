//! A batch on the remote path (NVMe/TCP or NVMe/RDMA): entries go to I/O queues the batch holds
//! for its life (each a connection of its own), every one of their commands in flight at once, as
//! deep as the queues are, instead of one I/O per queue on the storage's worker threads. An
//! entry is one command per piece of at most the largest command, all on one queue; its event
//! comes when its last piece completes. Completions are matched by command identifier and
//! read straight into the entry's memory. A batch holds as many queues as its capacity needs
//! (127 commands each): small entries fill the first with room, large ones go to the queue
//! with the fewest bytes in flight. Large entries, where the machine has CPUs to spare, go to
//! threads of the batch's own instead, one queue each (`remote::spread`): one thread reading
//! every connection does all their receive work on one core.
//!
//! Waiting blocks in `ppoll` on the queues' sockets (or RDMA completion and connection
//! channels): the target (on a small machine, the same cores) needs the CPU more than a
//! spinning reader does. A queue that stays silent with commands in flight for the URI's
//! timeout is closed, and its entries fail by name.
//!
//! Rules: an entry holds its lease until its event; a queue whose commands might still move
//! data is closed for good (`Pipelined::abandon`) before any of its entries' leases go.

use super::fabrics::Controller;
use super::spread::Spread;
use super::transport::{Done, Pipelined, RawData};
use super::Link;
use crate::batch::{Entry, EventSink, IoEvent, IoStatus, Op};
use crate::buffer::{Mem, Path};
use crate::error::{Error, Result};
use crate::sys::EventFd;
use std::collections::{HashMap, VecDeque};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds_uapi::queue::nvm;
use ugds_uapi::Sqe;

/// Entries whose pieces are this many commands or fewer run here (see [`RemoteBatch::takes`]).
const MAX_PIECES: u64 = 16;
/// Entries this large go to the queue with the fewest bytes in flight; smaller ones to the
/// first queue with room, so small I/O stays on as few sockets as it needs.
const LARGE_ENTRY: u64 = 64 << 10;
/// Over RDMA, queues a batch opens for large entries while every one it holds has data in
/// flight: the NIC (soft-RoCE: the kernel) moves each queue pair's data on its own, so large
/// I/O spread over several queue pairs moves in parallel at no cost to the calling thread.
const RDMA_LARGE_LANES: usize = 4;

/// One held I/O queue.
struct Lane {
    /// The controller the queue belongs to (it goes back there).
    ctrl: Arc<Controller>,
    q: super::fabrics::Queue,
    /// The entry each command identifier belongs to and its data bytes, while in flight.
    owner: Vec<Option<(u64, u64)>>,
    /// Data bytes in flight.
    bytes: u64,
    /// When the queue last made progress (or went from idle to busy).
    quiet_since: Instant,
}

impl Lane {
    fn pipe(&mut self) -> Option<&mut dyn Pipelined> {
        self.q.pipelined()
    }
}

/// An entry with commands in flight.
struct Pending {
    entry: Entry,
    /// Pieces not yet completed.
    remaining: usize,
    failure: Option<(IoStatus, Error)>,
}

/// A batch's queues on a remote namespace.
pub(crate) struct RemoteBatch {
    link: Arc<Link>,
    lanes: Vec<Lane>,
    /// Queues it aims to hold.
    want: usize,
    /// The largest command's data.
    piece: u64,
    pending: HashMap<u64, Pending>,
    /// Entries waiting for room on a queue, in submission order.
    waiting: VecDeque<(u64, Entry)>,
    ready: Vec<(IoEvent, Path)>,
    next_id: u64,
    reaped: Vec<(u16, Done)>,
    /// Threads running the entries of [`LARGE_ENTRY`] bytes or more, once one came.
    spread: Option<Spread>,
    /// Whether large entries may still get threads (not on a thread's own batch, nor after
    /// the machine could not give them).
    may_spread: bool,
    /// On a thread's batch: signalled when the thread has orders; a wait ends on it.
    inbox: Option<Arc<EventFd>>,
    /// The inbox was signalled during the current wait.
    woken: bool,
}

impl std::fmt::Debug for RemoteBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RemoteBatch({} queues, {} pending, {} waiting)",
            self.lanes.len(),
            self.pending.len(),
            self.waiting.len()
        )
    }
}

impl RemoteBatch {
    /// A batch of up to `capacity` entries on `link`'s namespace: `None` when no queue can be
    /// spared or connected for it.
    pub(crate) fn new(link: &Arc<Link>, capacity: usize) -> Option<RemoteBatch> {
        Self::with(link, capacity, true)
    }

    /// A batch of one queue that keeps every entry on it: the one a spreading thread runs.
    pub(crate) fn single(link: &Arc<Link>) -> Option<RemoteBatch> {
        Self::with(link, 1, false)
    }

    /// Makes every later wait of this batch end when `inbox` is signalled (it is cleared then).
    pub(crate) fn end_waits_on(&mut self, inbox: Arc<EventFd>) {
        self.inbox = Some(inbox);
    }

    fn with(link: &Arc<Link>, capacity: usize, may_spread: bool) -> Option<RemoteBatch> {
        let mut b = RemoteBatch {
            link: link.clone(),
            lanes: Vec::new(),
            want: 1,
            piece: link.max_command_bytes(),
            pending: HashMap::new(),
            waiting: VecDeque::new(),
            ready: Vec::new(),
            next_id: 0,
            reaped: Vec::new(),
            spread: None,
            may_spread,
            inbox: None,
            woken: false,
        };
        if !b.add_lane() {
            return None;
        }
        // Enough queues for `capacity` one-command entries.
        let per_queue = b.lanes.first().map_or(1, |l| l.owner.len().max(1));
        b.want = capacity.div_ceil(per_queue).max(1);
        while b.lanes.len() < b.want && b.add_lane() {}
        Some(b)
    }

    /// Whether an entry of `len` bytes in `mem` runs here: host memory (a socket cannot reach
    /// GPU memory; over RDMA, GPU memory goes through the worker threads' calls, which register
    /// its dma-buf), in at most [`MAX_PIECES`] commands.
    pub(crate) fn takes(&self, mem: &Mem, len: u64) -> bool {
        matches!(mem, Mem::Host { .. }) && len.div_ceil(self.piece.max(1)) <= MAX_PIECES
    }

    /// Entries started or waiting.
    pub(crate) fn in_flight(&self) -> usize {
        self.pending.len() + self.waiting.len() + self.spread.as_ref().map_or(0, Spread::in_flight)
    }

    /// Starts `entries` (checked, leased, each [`RemoteBatch::takes`]); those that find no
    /// room wait for it, in order.
    pub(crate) fn submit(&mut self, entries: impl IntoIterator<Item = Entry>) -> Result<()> {
        for e in entries {
            if e.len >= LARGE_ENTRY && self.spread_ready() {
                // The caller's queues count as one thread more.
                let own = self.pending.len() + self.waiting.len();
                if let Some(s) = self.spread.as_mut().filter(|s| s.least() < own) {
                    s.submit(e);
                    continue;
                }
            }
            let id = self.next_id;
            self.next_id += 1;
            self.waiting.push_back((id, e));
        }
        if let Some(s) = self.spread.as_mut() {
            s.wake_owed();
        }
        self.start_waiting();
        Ok(())
    }

    /// Waits until at least `min` events are ready (or `timeout` passed, or nothing runs) and
    /// appends every ready event to `out`.
    pub(crate) fn status_into(&mut self, min: usize, timeout: Duration, out: &mut impl EventSink) -> Result<()> {
        let deadline = Instant::now() + timeout;
        // Whatever already arrived is handled first, without waiting.
        self.progress(Duration::ZERO);
        loop {
            self.start_waiting();
            self.take_spread_events();
            let now = Instant::now();
            let woken = std::mem::take(&mut self.woken);
            if self.ready.len() >= min || self.in_flight() == 0 || now >= deadline || woken {
                out.put_all(&mut self.ready);
                return Ok(());
            }
            self.progress(deadline - now);
        }
    }

    /// Waits for every entry with commands in flight (they cannot be recalled from the target);
    /// entries still waiting for room are cancelled. Returns every event.
    pub(crate) fn cancel(&mut self) -> Result<Vec<(IoEvent, Path)>> {
        for (_, e) in std::mem::take(&mut self.waiting) {
            let ev = IoEvent { cookie: e.cookie, status: IoStatus::Canceled, bytes: 0, error: None };
            self.ready.push((ev, Path::Remote));
        }
        if let Some(s) = &self.spread {
            s.cancel();
        }
        // The threads' entries and this thread's own are waited for together.
        loop {
            self.take_spread_events();
            if self.pending.is_empty() && self.spread.as_ref().is_none_or(|s| s.in_flight() == 0) {
                return Ok(std::mem::take(&mut self.ready));
            }
            // Bounded: a silent queue is closed after the URI's timeout, here and on the threads.
            self.progress(self.link.timeout());
        }
    }

    /// Takes the events the threads sent back; entries a thread ended without answering fail
    /// by name.
    fn take_spread_events(&mut self) {
        let Some(s) = self.spread.as_mut() else { return };
        for cookie in s.drain(&mut self.ready) {
            let err = self.no_queue("batch I/O (the batch's thread for its queue ended)".into(), libc::ECONNABORTED);
            let ev = IoEvent { cookie, status: IoStatus::Failed, bytes: 0, error: Some(err) };
            self.ready.push((ev, Path::Remote));
        }
    }

    /// Whether large entries have threads, starting them at the first one.
    fn spread_ready(&mut self) -> bool {
        if self.spread.is_none() && self.may_spread {
            // Whatever happens, tried once.
            self.may_spread = false;
            self.spread = Spread::new(&self.link);
        }
        self.spread.is_some()
    }

    /// One more queue, if the controller spares one.
    fn add_lane(&mut self) -> bool {
        let Ok(ctrl) = self.link.controller() else { return false };
        let Ok(Some(mut q)) = ctrl.take_spare_queue() else { return false };
        let Some(room) = q.pipelined().map(|p| p.room()) else {
            ctrl.put_queue(q);
            return false;
        };
        self.lanes.push(Lane { owner: vec![None; room], bytes: 0, ctrl, q, quiet_since: Instant::now() });
        true
    }

    /// Starts waiting entries while a queue has room for all of an entry's pieces.
    fn start_waiting(&mut self) {
        // More than one command to start: each queue holds its sends until all are started,
        // so they leave together (see `Pipelined::hold_sends`).
        let hold = self.waiting.len() > 1 || self.waiting.front().is_some_and(|(_, e)| e.len > self.piece);
        if hold {
            self.lanes.iter_mut().filter_map(Lane::pipe).for_each(|p| p.hold_sends(true));
        }
        self.start_each();
        if hold {
            self.lanes.iter_mut().filter_map(Lane::pipe).for_each(|p| p.hold_sends(false));
        }
    }

    /// [`RemoteBatch::start_waiting`]'s loop.
    fn start_each(&mut self) {
        while let Some((_, e)) = self.waiting.front() {
            let pieces = e.len.div_ceil(self.piece).max(1) as usize;
            let large = e.len >= LARGE_ENTRY;
            let best = |lanes: &mut Vec<Lane>| {
                let fits = lanes.iter_mut().enumerate().filter_map(|(i, l)| {
                    let room = l.pipe().map_or(0, |p| p.room());
                    (room >= pieces).then_some((i, l.bytes))
                });
                if large {
                    fits.min_by_key(|&(_, b)| b).map(|(i, _)| i)
                } else {
                    fits.map(|(i, _)| i).next()
                }
            };
            let spread_rdma = large
                && self.link.spec.transport == super::uri::Transport::Rdma
                && self.lanes.len() < RDMA_LARGE_LANES
                && self.lanes.iter().all(|l| l.bytes > 0);
            let lane = match best(&mut self.lanes) {
                Some(_) if spread_rdma && self.add_lane() => self.lanes.len() - 1,
                Some(i) => i,
                None if self.lanes.len() < self.want && self.add_lane() => self.lanes.len() - 1,
                None if self.lanes.is_empty() => {
                    // No queue at all (each broke and none is spared now): the entries fail
                    // by name rather than wait for ever.
                    let Some((id, e)) = self.waiting.pop_front() else { return };
                    let err = self.no_queue("batch I/O (no I/O queue is connected)".into(), libc::ENOTCONN);
                    self.fail_unstarted(id, e, err);
                    continue;
                }
                None => return,
            };
            if let Some((id, e)) = self.waiting.pop_front() {
                self.start(lane, id, e, pieces);
            }
        }
    }

    /// Sends entry `id`'s `pieces` commands on lane `li` (which has room for them).
    fn start(&mut self, li: usize, id: u64, entry: Entry, pieces: usize) {
        let Mem::Host { ptr, .. } = entry.lease.buffer().mem() else {
            let err = Error::invalid("buf", "the remote batch takes host memory only");
            self.fail_unstarted(id, entry, err);
            return;
        };
        let ns = *self.link.ns();
        let (write, op) = match entry.op {
            Op::Write => (true, "write"),
            Op::Read => (false, "read"),
        };
        // CAST: the storage checked `[buf_offset, +len)` against the buffer's length.
        let base = ptr.wrapping_add(entry.buf_offset as usize);
        let (len, dev_offset) = (entry.len, entry.dev_offset);
        self.pending.insert(id, Pending { entry, remaining: 0, failure: None });
        let lane = &mut self.lanes[li];
        if lane.pipe().is_some_and(|p| p.in_flight() == 0) {
            lane.quiet_since = Instant::now();
        }
        let mut at = 0u64;
        let mut broke = None;
        for _ in 0..pieces {
            let n = self.piece.min(len - at);
            let mut sqe = Sqe::new(if write { nvm::WRITE } else { nvm::READ }, 0);
            sqe.set_nsid(ns.nsid);
            sqe.set_slba((dev_offset + at) / ns.block_size);
            // CAST: a piece is at most the largest command (1 MiB), under 65536 blocks.
            sqe.set_nlb((n / ns.block_size) as u32);
            // CAST: `at` and `n` lie within the entry, which lies within the buffer.
            let p = NonNull::new(base.wrapping_add(at as usize)).unwrap_or(NonNull::dangling());
            let data =
                if write { RawData::Out { ptr: p, len: n as usize } } else { RawData::In { ptr: p, len: n as usize } };
            let Some(pipe) = lane.q.pipelined() else {
                broke = Some(Error::invalid("queue", "its commands cannot stay in flight"));
                break;
            };
            // SAFETY: the piece lies in the entry's buffer, which the entry's lease keeps
            // alive and out of every CPU reference until its event; the event comes only after
            // this command completed, or after its queue was abandoned (`fail_lane`).
            match unsafe { pipe.start(sqe, data, op) } {
                Ok(cid) => {
                    lane.owner[usize::from(cid)] = Some((id, n));
                    lane.bytes += n;
                    if let Some(p) = self.pending.get_mut(&id) {
                        p.remaining += 1;
                    }
                }
                Err(e) => {
                    broke = Some(e);
                    break;
                }
            }
            at += n;
        }
        match broke {
            Some(e) if self.lanes[li].q.is_broken() => {
                self.fail_lane(li, e);
                // An entry none of whose commands went out was on no queue to fail with.
                if self.pending.contains_key(&id) {
                    let err = self.no_queue("batch I/O (its queue failed)".into(), libc::ECONNABORTED);
                    self.finish_failed(id, IoStatus::Failed, err);
                }
            }
            Some(e) => {
                // The queue is fine; this entry is not: it fails once its started pieces end.
                if let Some(p) = self.pending.get_mut(&id) {
                    p.failure.get_or_insert((IoStatus::Failed, e));
                }
                if self.pending.get(&id).is_some_and(|p| p.remaining == 0) {
                    self.finish(id);
                }
            }
            None => {}
        }
    }

    /// Handles what came back on busy queues, waiting up to `wait` for something to arrive.
    fn progress(&mut self, wait: Duration) {
        let busy: Vec<usize> =
            (0..self.lanes.len()).filter(|&i| self.lanes[i].pipe().is_some_and(|p| p.in_flight() > 0)).collect();
        if busy.is_empty() {
            // Entries with nothing in flight anywhere would wait for ever (and `cancel` spin):
            // they fail by name. The bookkeeping should never leave one.
            let orphans: Vec<u64> = self.pending.keys().copied().collect();
            for id in orphans {
                let err = self.no_queue("batch I/O (its commands were lost)".into(), libc::ECONNABORTED);
                self.finish_failed(id, IoStatus::Failed, err);
            }
            // Only the threads' entries run: wait for their events.
            if let Some(s) = self.spread.as_ref().filter(|s| s.in_flight() > 0) {
                s.wait(wait);
            }
            return;
        }
        let ready = self.readable(&busy, wait);
        // Highest index first: a failed lane is swap-removed, which moves only the last one.
        for &li in ready.iter().rev() {
            let mut reaped = std::mem::take(&mut self.reaped);
            let r = self.lanes[li].pipe().map_or(Ok(()), |p| p.reap(&mut reaped, "batch I/O"));
            self.lanes[li].quiet_since = Instant::now();
            for (cid, d) in reaped.drain(..) {
                let lane = &mut self.lanes[li];
                let owner = lane.owner.get_mut(usize::from(cid)).and_then(Option::take);
                if let Some((id, n)) = owner {
                    lane.bytes -= n;
                    self.piece_done(id, d);
                }
            }
            self.reaped = reaped;
            if let Err(e) = r {
                self.fail_lane(li, e);
            }
        }
        // A queue silent for the whole timeout with commands in flight is taken for dead.
        let limit = self.link.timeout();
        for li in (0..self.lanes.len()).rev() {
            let l = &mut self.lanes[li];
            if l.pipe().is_some_and(|p| p.in_flight() > 0) && l.quiet_since.elapsed() > limit {
                let err = Error::RemoteTransport {
                    target: self.link.spec.address(),
                    op: "batch I/O".into(),
                    source: std::io::Error::from_raw_os_error(libc::ETIMEDOUT),
                };
                self.fail_lane(li, err);
            }
        }
    }

    /// The lanes of `busy` that have something to handle, waiting up to `wait` (ascending).
    fn readable(&mut self, busy: &[usize], wait: Duration) -> Vec<usize> {
        let now: Vec<usize> = busy
            .iter()
            .copied()
            .filter(|&i| self.lanes[i].pipe().is_some_and(|p| p.buffered() || p.poll_fd().is_none()))
            .collect();
        if !now.is_empty() {
            return now;
        }
        let mut fds: Vec<libc::pollfd> = busy
            .iter()
            .map(|&i| libc::pollfd {
                fd: self.lanes[i].pipe().and_then(|p| p.poll_fd()).unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // Last: what else ends the wait (a thread's orders, or events from the threads).
        let other = match (&self.inbox, &self.spread) {
            (Some(inbox), _) => Some(&**inbox),
            (None, Some(s)) if s.in_flight() > 0 => Some(s.wake()),
            _ => None,
        };
        if let Some(e) = other {
            fds.push(libc::pollfd { fd: e.raw(), events: libc::POLLIN, revents: 0 });
        }
        let ts = libc::timespec {
            // CAST: a wait of more than 2^63 seconds is not asked for; clamp anyway.
            tv_sec: wait.as_secs().min(i64::MAX as u64) as libc::time_t,
            // CAST: below 10^9.
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries for the call's duration;
        // `ts` is a valid timespec; no signal mask is passed.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
        if n <= 0 {
            return Vec::new();
        }
        if let Some(e) = other.filter(|_| fds.last().is_some_and(|f| f.revents != 0)) {
            // Cleared here; the threads' events are taken by `status`, a thread's orders by
            // its loop once the wait ends.
            e.wait(0);
            self.woken = self.inbox.is_some();
        }
        // Errors and hang-ups are read too: the read names them.
        busy.iter().zip(&fds).filter(|(_, f)| f.revents != 0).map(|(&i, _)| i).collect()
    }

    /// Closes lane `li` for good (its commands may never move data again), fails every entry
    /// that had a command on it (the first gets `e`, the rest an error naming it) and gives
    /// the queue back broken.
    fn fail_lane(&mut self, li: usize, e: Error) {
        let mut lane = self.lanes.swap_remove(li);
        if let Some(p) = lane.pipe() {
            p.abandon();
        }
        let mut ids: Vec<u64> = lane.owner.iter().flatten().map(|&(id, _)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        let reason = e.to_string();
        let code = match &e {
            Error::RemoteTransport { source, .. } => source.raw_os_error(),
            _ => None,
        };
        // A queue that timed out times out all its entries.
        let status = if code == Some(libc::ETIMEDOUT) { IoStatus::Timeout } else { IoStatus::Failed };
        let mut first = Some(e);
        for id in ids {
            let err = first.take().unwrap_or_else(|| {
                self.no_queue(format!("batch I/O (the queue failed: {reason})"), code.unwrap_or(libc::ECONNABORTED))
            });
            self.finish_failed(id, status, err);
        }
        // The connection broke: the controller may be gone with it.
        lane.ctrl.probe();
        lane.ctrl.put_queue(lane.q);
    }

    /// The error of an entry whose queue is gone: `op` says why.
    fn no_queue(&self, op: String, errno: i32) -> Error {
        Error::RemoteTransport {
            target: self.link.spec.address(),
            op,
            source: std::io::Error::from_raw_os_error(errno),
        }
    }

    /// One of entry `id`'s pieces completed with `d`.
    fn piece_done(&mut self, id: u64, d: Done) {
        let Some(p) = self.pending.get_mut(&id) else { return };
        p.remaining = p.remaining.saturating_sub(1);
        if !d.status.is_success() && p.failure.is_none() {
            let op = if p.entry.op == Op::Write { "write" } else { "read" };
            let slba = p.entry.dev_offset / self.link.ns().block_size;
            p.failure = Some((IoStatus::Failed, Error::Nvme { op, slba, status: d.status }));
        }
        if p.remaining == 0 {
            self.finish(id);
        }
    }

    /// Entry `id`, none of whose commands went out, fails now with `e`.
    fn fail_unstarted(&mut self, id: u64, entry: Entry, e: Error) {
        self.pending.insert(id, Pending { entry, remaining: 0, failure: None });
        self.finish_failed(id, IoStatus::Failed, e);
    }

    /// Entry `id` fails now with `e` (its commands are done or abandoned).
    fn finish_failed(&mut self, id: u64, status: IoStatus, e: Error) {
        if let Some(p) = self.pending.get_mut(&id) {
            p.remaining = 0;
            p.failure.get_or_insert((status, e));
        }
        self.finish(id);
    }

    /// Entry `id`'s event: its lease goes with it.
    fn finish(&mut self, id: u64) {
        let Some(p) = self.pending.remove(&id) else { return };
        let ev = match p.failure {
            None => IoEvent { cookie: p.entry.cookie, status: IoStatus::Complete, bytes: p.entry.len, error: None },
            Some((status, e)) => IoEvent { cookie: p.entry.cookie, status, bytes: 0, error: Some(e) },
        };
        self.ready.push((ev, Path::Remote));
    }
}

impl Drop for RemoteBatch {
    fn drop(&mut self) {
        // Queues with commands in flight are closed before the entries' leases go.
        for mut lane in self.lanes.drain(..) {
            if let Some(p) = lane.pipe().filter(|p| p.in_flight() > 0) {
                p.abandon();
            }
            lane.ctrl.put_queue(lane.q);
        }
    }
}

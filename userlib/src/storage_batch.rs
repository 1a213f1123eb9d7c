//! Batches over any [`Storage`] path (cuFile's batch API). On the direct path, entries of
//! registered memory that fit one command go to a queue batch (a queue pair of its own, one
//! doorbell per submit), and larger ones, split into commands, to a second queue pair of its
//! own (made at the first such entry); on a striped volume, entries of registered memory of any
//! size go to queue pairs of the batch's own on every member, split into per-member pieces (see
//! [`crate::volume_batch`]); on the fallback path, host memory and GPU memory up to a staging
//! chunk go to an io_uring of the batch's own (see [`crate::fallback_batch`]); on NVMe/TCP, host
//! memory goes to I/O queues the batch holds (see `remote::batch`); the rest (staged GPU memory,
//! larger entries on a namespace whose controller grants no second queue pair, RDMA) run
//! concurrently on the storage's worker threads.
//! Events are collected with `status`.
//!
//! Rules: `submit` checks every entry (the storage's one check); invalid entries become
//! `Invalid` events and the rest run. Every running entry holds a lease on its buffer. Dropping
//! the batch waits for its entries.

use crate::batch::{Entry, EventSink, IoEvent, IoStatus, Op};
use crate::buffer::{Buffer, Lease, Path};
use crate::error::{Error, Result};
#[cfg(feature = "fallback")]
use crate::fallback_batch::RingBatch;
use crate::fork::Born;
use crate::queue::Deadline;
use crate::queue_batch::QueueBatch;
use crate::remote::batch::RemoteBatch;
use crate::storage::{ConcretePath, Storage};
use crate::volume_batch::{member_depth, MemberProgress, VolumeQueueBatch};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// An entry running on a worker thread; dropping it finishes the entry: its request lets go of
/// its buffer first (whoever waited for the entry may deregister the buffer at once; found by
/// the `capi` fuzz target), then its event goes to the batch, a failed one where the job
/// stopped before it had one (it panicked).
struct PooledRun {
    state: Arc<(Mutex<State>, Condvar)>,
    cookie: u64,
    req: Option<IoRequest>,
    event: Option<IoEvent>,
}

impl Drop for PooledRun {
    fn drop(&mut self) {
        drop(self.req.take());
        let ev = self.event.take().unwrap_or_else(|| IoEvent {
            cookie: self.cookie,
            status: IoStatus::Failed,
            bytes: 0,
            error: Some(Error::Io {
                op: "a batch entry on an I/O worker".into(),
                source: std::io::Error::other("the worker's job panicked"),
            }),
        });
        let (m, cv) = &*self.state;
        let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
        st.running -= 1;
        st.events.push(ev);
        cv.notify_all();
    }
}

/// Whether this process has run [`StorageBatch::warm_up`].
static WARM: AtomicBool = AtomicBool::new(false);

/// One entry.
#[derive(Debug, Clone)]
pub struct IoRequest {
    /// Read or write.
    pub op: Op,
    /// The memory.
    pub buf: Arc<Buffer>,
    /// Offset in the buffer.
    pub buf_offset: u64,
    /// Offset in the file or namespace.
    pub file_offset: u64,
    /// Bytes.
    pub len: u64,
    /// Returned with the event.
    pub cookie: u64,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    events: Vec<IoEvent>,
}

/// A reusable batch of up to `capacity` entries in flight.
#[derive(Debug)]
pub struct StorageBatch {
    storage: Arc<Storage>,
    capacity: usize,
    state: Arc<(Mutex<State>, Condvar)>,
    native: Option<Native>,
    /// A node's entries larger than its largest command, split into commands on a queue pair
    /// of their own.
    large: LargeEntries,
    /// Checked entries on their way to the queue batch for large entries.
    large_entries: Vec<Entry>,
    /// Checked entries on their way to the queue batch (kept: a submit allocates nothing).
    entries: Vec<Entry>,
    /// Events not reported yet: entries refused at submit, and what a failed wait had gathered.
    ready: Vec<IoEvent>,
    /// Whether completed entries count in the storage's path counts (not the warm-up's).
    counts: bool,
    /// Entries handed to the worker threads since it was made: until one is, nothing else
    /// touches `state`, and this thread leaves its lock alone.
    pooled: u64,
    /// The fork generation it was made in.
    born: Born,
}

/// A storage batch's caller's events, taken from its queue batch: the completed ones are
/// counted in the storage's path counts, which every thread shares, once per path and wait
/// rather than once per event.
struct Counted<'a> {
    out: &'a mut Vec<IoEvent>,
    storage: &'a Storage,
    counts: bool,
    /// Completed I/Os and their bytes on one path, not counted yet.
    tally: Option<(Path, u64, u64)>,
}

impl<'a> Counted<'a> {
    fn new(out: &'a mut Vec<IoEvent>, storage: &'a Storage, counts: bool) -> Self {
        Counted { out, storage, counts, tally: None }
    }
}

impl EventSink for Counted<'_> {
    #[inline]
    fn put(&mut self, ev: IoEvent, path: Path) {
        if ev.status == IoStatus::Complete && self.counts {
            match &mut self.tally {
                Some((p, ios, bytes)) if *p == path => {
                    *ios += 1;
                    *bytes += ev.bytes;
                }
                tally => {
                    if let Some((p, ios, bytes)) = tally.replace((path, 1, ev.bytes)) {
                        self.storage.count_many(p, ios, bytes);
                    }
                }
            }
        }
        self.out.push(ev);
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if let Some((p, ios, bytes)) = self.tally.take() {
            self.storage.count_many(p, ios, bytes);
        }
    }
}

/// The queue batch behind a storage batch (and behind stream-ordered groups on a volume or a
/// file): a namespace's own queue pair, one on every member of a striped volume, or an io_uring
/// of its own on a file or block device.
#[derive(Debug)]
pub(crate) enum Native {
    One(Box<QueueBatch>),
    Volume(Box<VolumeQueueBatch>),
    #[cfg(feature = "fallback")]
    Ring(Box<RingBatch>),
    Remote(Box<RemoteBatch>),
}

impl Native {
    /// The queue batch for `capacity` entries on `storage`'s path, when it grants one; `one`:
    /// also on a single namespace or a remote one (stream-ordered groups there stay on the
    /// worker threads).
    pub(crate) fn new(storage: &Arc<Storage>, capacity: usize, one: bool) -> Option<Native> {
        match storage.concrete_path() {
            ConcretePath::Direct(d) if one => {
                QueueBatch::new(&d.dev, &d.ns, capacity).ok().map(|q| Native::One(Box::new(q)))
            }
            ConcretePath::Direct(_) => None,
            ConcretePath::Volume(v) => VolumeQueueBatch::new(v, capacity).map(|b| Native::Volume(Box::new(b))),
            #[cfg(feature = "fallback")]
            ConcretePath::File(_) => RingBatch::new(storage, capacity).ok().map(|r| Native::Ring(Box::new(r))),
            // Queues of its own on NVMe/TCP and NVMe/RDMA.
            ConcretePath::Remote(r) if one => RemoteBatch::new(r.link(), capacity).map(|b| Native::Remote(Box::new(b))),
            ConcretePath::Remote(_) => None,
        }
    }

    /// How long a command of this batch may run before it counts as hung, on queue pairs of
    /// its own; a remote target's queues fail their entries after the URI's timeout
    /// themselves, and a file's ring waits as the kernel's own reads of the file do.
    pub(crate) fn command_timeout(&self) -> Option<Duration> {
        match self {
            Native::One(q) => Some(q.command_timeout()),
            Native::Volume(v) => Some(v.command_timeout()),
            #[cfg(feature = "fallback")]
            Native::Ring(_) => None,
            Native::Remote(_) => None,
        }
    }

    /// A volume's progress per member into `out` (replacing what it held; see
    /// [`VolumeQueueBatch::member_progress`]). Empty elsewhere: each entry's event is its progress.
    pub(crate) fn member_progress(&self, out: &mut Vec<MemberProgress>) {
        out.clear();
        if let Native::Volume(v) = self {
            out.extend(v.member_progress());
        }
    }

    fn in_flight(&self) -> usize {
        match self {
            Native::One(q) => q.in_flight(),
            Native::Volume(v) => v.in_flight(),
            #[cfg(feature = "fallback")]
            Native::Ring(r) => r.in_flight(),
            Native::Remote(r) => r.in_flight(),
        }
    }

    /// Whether it runs an (unchecked) entry of `len` bytes at `buf_offset` of `buf`, on a path
    /// whose largest command is `max_cmd` bytes; the rest go to the worker threads. A volume's
    /// batch splits entries of any size into pieces of at most one command each.
    // Only the ring looks at the buffer offset.
    #[cfg_attr(not(feature = "fallback"), allow(unused_variables))]
    pub(crate) fn takes(&mut self, buf: &Buffer, buf_offset: u64, len: u64, max_cmd: u64) -> bool {
        match self {
            Native::One(_) => buf.registration().is_some() && len <= max_cmd,
            Native::Volume(_) => buf.registration().is_some(),
            #[cfg(feature = "fallback")]
            Native::Ring(q) => q.takes(buf, buf_offset, len),
            Native::Remote(q) => q.takes(buf.mem(), len),
        }
    }

    pub(crate) fn submit<I>(&mut self, entries: I) -> Result<()>
    where
        I: IntoIterator<Item = Entry>,
        I::IntoIter: ExactSizeIterator,
    {
        match self {
            Native::One(q) => q.submit(entries),
            Native::Volume(v) => v.submit(entries),
            #[cfg(feature = "fallback")]
            Native::Ring(r) => r.submit(entries),
            Native::Remote(r) => r.submit(entries),
        }
    }

    /// Waits until at least `min` events are available (or `timeout` passed, or nothing runs)
    /// and appends every available event to `out`, with the path its data took.
    pub(crate) fn status_into(&mut self, min: usize, timeout: Duration, out: &mut impl EventSink) -> Result<()> {
        match self {
            Native::One(q) => q.status_into(min, timeout, out),
            Native::Volume(v) => v.status_into(min, timeout, out),
            #[cfg(feature = "fallback")]
            Native::Ring(r) => r.status_into(min, timeout, out),
            Native::Remote(r) => r.status_into(min, timeout, out),
        }
    }

    pub(crate) fn cancel(&mut self) -> Result<Vec<(IoEvent, Path)>> {
        match self {
            Native::One(q) => q.cancel(),
            Native::Volume(v) => v.cancel(),
            #[cfg(feature = "fallback")]
            Native::Ring(r) => r.cancel(),
            Native::Remote(r) => r.cancel(),
        }
    }
}

/// `r` checked against `storage` and its buffer leased for the I/O: the entry a queue batch
/// runs.
#[inline(always)]
fn entry(storage: &Storage, r: &IoRequest) -> Result<Entry> {
    storage.check(&r.buf, r.buf_offset, r.file_offset, r.len)?;
    Ok(Entry {
        op: r.op,
        lease: Lease::new(r.buf.clone())?,
        buf_offset: r.buf_offset,
        dev_offset: r.file_offset,
        len: r.len,
        cookie: r.cookie,
    })
}

/// The event of request `r`, refused by the checks with `error`.
fn refused(r: &IoRequest, error: Error) -> IoEvent {
    IoEvent { cookie: r.cookie, status: IoStatus::Invalid, bytes: 0, error: Some(error) }
}

/// The queue pair for a node's batch entries larger than one command.
#[derive(Debug)]
enum LargeEntries {
    /// No such entry came yet.
    NotTried,
    /// Made at the first such entry.
    Made(Box<VolumeQueueBatch>),
    /// The controller refused one: such entries go to the worker threads.
    Refused,
}

impl StorageBatch {
    /// A batch on `storage` (its worker threads start here, not at the first submit).
    pub fn new(storage: &Arc<Storage>, capacity: usize) -> Result<StorageBatch> {
        if capacity == 0 {
            return Err(Error::invalid("capacity", "must be at least 1"));
        }
        storage.engine()?;
        // A queue pair of its own on the direct path (when the controller grants one that deep),
        // one on every member of a volume, a ring of its own on a file (when io_uring works).
        let native = Native::new(storage, capacity, true);
        let queue = matches!(native, Some(Native::One(_) | Native::Volume(_)));
        if queue && !WARM.swap(true, Ordering::AcqRel) {
            // Best effort: a failure here only means the first real batch runs cold, and the
            // batch below reports its own errors when used.
            let _ = Self::warm_up(storage, capacity);
        }
        Ok(Self::with_native(storage, capacity, native))
    }

    /// A batch whose queue batch is `q` (over the device model, which has no control plane to
    /// create a queue pair), for tests and the cost benchmark; no warm-up.
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn over_queue(storage: &Arc<Storage>, q: QueueBatch) -> Result<StorageBatch> {
        storage.engine()?;
        Ok(Self::with_native(storage, q.capacity(), Some(Native::One(Box::new(q)))))
    }

    /// A batch whose native batch is the volume batch `v` (over the device model), for the cost
    /// benchmark; no warm-up.
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn over_volume(storage: &Arc<Storage>, v: VolumeQueueBatch, capacity: usize) -> Result<StorageBatch> {
        storage.engine()?;
        Ok(Self::with_native(storage, capacity, Some(Native::Volume(Box::new(v)))))
    }

    /// A fresh batch of `capacity` entries on `storage` with `native` behind it.
    fn with_native(storage: &Arc<Storage>, capacity: usize, native: Option<Native>) -> StorageBatch {
        StorageBatch {
            storage: storage.clone(),
            capacity,
            state: Arc::default(),
            native,
            large: LargeEntries::NotTried,
            large_entries: Vec::new(),
            entries: Vec::with_capacity(capacity.min(1024)),
            ready: Vec::new(),
            counts: true,
            pooled: 0,
            born: Born::now(),
        }
    }

    /// Once per process, runs a few reads through a throwaway batch on a queue pair:
    /// `submit` and `status` down to the queue batch's code are then resident (under an
    /// emulator: translated), so the first real batch does not pay for that. It goes through
    /// this type's `submit` and `status`, because the queue batch's code is compiled into them:
    /// warming a copy elsewhere does not warm these. At most `capacity` entries (a controller
    /// that granted a queue that deep grants another); their reads are not counted in the
    /// storage's path counts, and nothing runs when no queue pair is granted (the worker
    /// threads would count them).
    fn warm_up(storage: &Arc<Storage>, capacity: usize) -> Result<()> {
        let n = capacity.min(8);
        let mut w = StorageBatch::new(storage, n)?;
        if !w.is_native() {
            return Ok(());
        }
        w.counts = false;
        let buf = Arc::new(storage.alloc_host(n * 4096)?);
        let bs = storage.block_size().min(4096);
        let reqs: Vec<IoRequest> = (0..n as u64)
            .map(|i| IoRequest {
                op: Op::Read,
                buf: buf.clone(),
                buf_offset: i * 4096,
                file_offset: 0,
                len: bs,
                cookie: i,
            })
            .collect();
        w.submit(&reqs)?;
        // Dropping `w` waits for anything this leaves running.
        w.status(reqs.len(), Duration::from_secs(10))?;
        Ok(())
    }

    /// Capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries running.
    #[inline]
    pub fn in_flight(&self) -> usize {
        self.pool_running() + self.native.as_ref().map_or(0, Native::in_flight) + self.large_in_flight()
    }

    /// Entries running on the queue pair for a node's large entries.
    fn large_in_flight(&self) -> usize {
        match &self.large {
            LargeEntries::Made(l) => l.in_flight(),
            _ => 0,
        }
    }

    /// Whether an entry the queue batch refused goes to the queue pair for a node's large
    /// entries (made here at the first one) rather than to the worker threads: registered
    /// memory, larger than one command, on a node whose controller grants that queue pair.
    fn splits(&mut self, buf: &Buffer, len: u64, max_cmd: u64) -> bool {
        if !matches!(self.native, Some(Native::One(_))) || buf.registration().is_none() || len <= max_cmd {
            return false;
        }
        if matches!(self.large, LargeEntries::NotTried) {
            let made = match self.storage.concrete_path() {
                ConcretePath::Direct(d) => {
                    let depth = member_depth(self.capacity, d.dev.info().max_queue_entries);
                    QueueBatch::new(&d.dev, &d.ns, depth)
                        .inspect_err(|e| log::debug!("large batch entries go to the worker threads: {e}"))
                        .ok()
                }
                _ => None,
            };
            self.large = match made {
                Some(q) => LargeEntries::Made(Box::new(VolumeQueueBatch::for_node(q, self.capacity))),
                None => LargeEntries::Refused,
            };
        }
        matches!(self.large, LargeEntries::Made(_))
    }

    /// Entries running on the worker threads.
    fn pool_running(&self) -> usize {
        if self.pooled == 0 {
            return 0;
        }
        self.state.0.lock().unwrap_or_else(|e| e.into_inner()).running
    }

    /// Whether a queue batch (a queue pair of its own, one doorbell per submit) or, on a file,
    /// a ring of its own (every entry in flight at once, no worker thread) is in use.
    pub fn is_native(&self) -> bool {
        self.native.is_some()
    }

    /// Entries the batch's own ring has taken since it was made (0 off the fallback path): the
    /// rest ran on the storage's worker threads.
    #[cfg(feature = "fallback")]
    pub fn ring_entries(&self) -> u64 {
        match &self.native {
            Some(Native::Ring(r)) => r.taken(),
            _ => 0,
        }
    }

    /// Entries the storage's worker threads took since the batch was made (each as one
    /// synchronous request); the rest ran on the batch's own queue pairs or ring.
    pub fn pooled_entries(&self) -> u64 {
        self.pooled
    }

    /// Submits `reqs`. A request the checks refuse becomes an `Invalid` event; the rest run.
    /// Fails as a whole (nothing submitted, and no event for any of `reqs` later) when they
    /// exceed the free capacity or the device refuses the submission (a reset, a fault).
    pub fn submit(&mut self, reqs: &[IoRequest]) -> Result<()> {
        self.born.check("batch")?;
        self.storage.alive()?;
        let busy = self.in_flight();
        if busy + reqs.len() > self.capacity {
            return Err(Error::invalid(
                "reqs",
                format!(
                    "{} entries exceed the batch's free capacity ({} of {})",
                    reqs.len(),
                    self.capacity - busy,
                    self.capacity
                ),
            ));
        }
        // Checked entries the queue batch can carry take it (see `Native::takes`).
        let max_cmd = self.storage.max_command_bytes();
        // The usual batch: every entry for a namespace's own queue pair. Each is checked and
        // leased as the queue batch takes it, one pass from request to command.
        let all_one = match &mut self.native {
            Some(n @ Native::One(_)) => reqs.iter().all(|r| n.takes(&r.buf, r.buf_offset, r.len, max_cmd)),
            _ => false,
        };
        if all_one {
            if let Some(Native::One(q)) = &mut self.native {
                let ready_before = self.ready.len();
                let (storage, ready) = (&self.storage, &mut self.ready);
                let entries = reqs.iter().filter_map(|r| match entry(storage, r) {
                    Ok(e) => Some(e),
                    Err(e) => {
                        ready.push(refused(r, e));
                        None
                    }
                });
                let submitted = q.submit(entries);
                if submitted.is_err() {
                    self.ready.truncate(ready_before);
                }
                return submitted;
            }
        }
        let mut pooled = Vec::new();
        self.entries.clear();
        // A call that fails as a whole takes back the events of its refused entries too.
        let ready_before = self.ready.len();
        for r in reqs {
            let large = if self.native.as_mut().is_some_and(|n| n.takes(&r.buf, r.buf_offset, r.len, max_cmd)) {
                false
            } else if self.splits(&r.buf, r.len, max_cmd) {
                true
            } else {
                pooled.push(r);
                continue;
            };
            let to = if large { &mut self.large_entries } else { &mut self.entries };
            match entry(&self.storage, r) {
                Ok(e) => to.push(e),
                Err(e) => self.ready.push(refused(r, e)),
            }
        }
        // The worker threads, when any entry goes to them (before anything is submitted: the
        // call fails as a whole or not at all).
        let engine = if pooled.is_empty() {
            None
        } else {
            match self.storage.engine() {
                Ok(e) => Some(e),
                Err(e) => {
                    self.entries.clear();
                    self.large_entries.clear();
                    self.ready.truncate(ready_before);
                    return Err(e);
                }
            }
        };
        // The large entries first: their batch fails only for want of room, which was checked
        // above, so nothing is left half submitted.
        if let LargeEntries::Made(l) = &mut self.large {
            if !self.large_entries.is_empty() {
                if let Err(e) = l.submit(self.large_entries.drain(..)) {
                    self.entries.clear();
                    self.ready.truncate(ready_before);
                    return Err(e);
                }
            }
        }
        if let Some(q) = self.native.as_mut() {
            if !self.entries.is_empty() {
                if let Err(e) = q.submit(self.entries.drain(..)) {
                    self.ready.truncate(ready_before);
                    return Err(e);
                }
            }
        }
        // Every entry that goes to the worker threads found them above.
        let Some(engine) = engine else { return Ok(()) };
        for r in pooled {
            if let Err(e) = self.storage.check(&r.buf, r.buf_offset, r.file_offset, r.len) {
                self.ready.push(refused(r, e));
                continue;
            }
            self.pooled += 1;
            self.state.0.lock().unwrap_or_else(|e| e.into_inner()).running += 1;
            let (s, state, r2) = (self.storage.clone(), self.state.clone(), r.clone());
            let job = move || {
                // From here the entry finishes once, whatever happens: a job that panics
                // (the worker survives it) still counts as finished, as a failed entry.
                let mut run = PooledRun { state, cookie: r2.cookie, req: Some(r2), event: None };
                let Some(r) = run.req.as_ref() else { return };
                #[cfg(test)]
                if r.cookie == tests::PANICKING_COOKIE {
                    panic!("a test's pooled entry panics on purpose");
                }
                let res = s.rw(r.op == Op::Write, &r.buf, r.buf_offset, r.file_offset, r.len);
                let ev = match res {
                    Ok(n) => IoEvent { cookie: r.cookie, status: IoStatus::Complete, bytes: n, error: None },
                    // A volume's timeout arrives naming its member.
                    Err(e) if matches!(e.root(), Error::Timeout { .. }) => {
                        IoEvent { cookie: r.cookie, status: IoStatus::Timeout, bytes: 0, error: Some(e) }
                    }
                    Err(e) => IoEvent { cookie: r.cookie, status: IoStatus::Failed, bytes: 0, error: Some(e) },
                };
                run.event = Some(ev);
            };
            if let Err(e) = engine.spawn(job) {
                // The job never ran: the entry finishes here, failed with why.
                let error = Some(e);
                let event = Some(IoEvent { cookie: r.cookie, status: IoStatus::Failed, bytes: 0, error });
                drop(PooledRun { state: self.state.clone(), cookie: r.cookie, req: None, event });
            }
        }
        Ok(())
    }

    /// Waits until at least `min` events are available (or `timeout` passed, or nothing is
    /// running) and returns all available events.
    pub fn status(&mut self, min: usize, timeout: Duration) -> Result<Vec<IoEvent>> {
        let mut out = Vec::new();
        self.status_into(min, timeout, &mut out)?;
        Ok(out)
    }

    /// [`StorageBatch::status`] appending the events to `out`; returns how many it appended. A
    /// caller that keeps `out` between calls (clearing or draining it) allocates nothing here.
    pub fn status_into(&mut self, min: usize, timeout: Duration, out: &mut Vec<IoEvent>) -> Result<usize> {
        self.born.check("batch")?;
        let before = out.len();
        if let Err(e) = self.wait_into(min.saturating_sub(self.ready.len()), timeout, out) {
            // What this wait gathered before it failed (a worker's entry finished, then a look
            // at the queue batch failed) goes out with a later wait.
            self.ready.extend(out.drain(before..));
            return Err(e);
        }
        // Events kept back (entries refused at submit, a failed wait's) go out with a wait
        // that succeeded.
        out.append(&mut self.ready);
        Ok(out.len() - before)
    }

    /// Waits for at least `min` events of running entries (see [`StorageBatch::status`]) and
    /// appends every one available to `out`.
    fn wait_into(&mut self, min: usize, timeout: Duration, out: &mut Vec<IoEvent>) -> Result<()> {
        if self.pooled == 0 && self.large_in_flight() == 0 {
            // Nothing ever went to the worker threads or the queue pair for large entries: the
            // queue batch (if any) is all there is to wait for, and it polls and waits by itself.
            if let Some(q) = self.native.as_mut() {
                q.status_into(min, timeout, &mut Counted::new(out, &self.storage, self.counts))?;
            }
            return Ok(());
        }
        let before = out.len();
        // The clock is read only once this waits: a status that finds what it wants, or hands
        // the wait to the queue batch (which reads it lazily), reads none.
        let mut deadline = Deadline::new(timeout);
        loop {
            if let Some(q) = self.native.as_mut() {
                q.status_into(0, Duration::ZERO, &mut Counted::new(out, &self.storage, self.counts))?;
            }
            if let LargeEntries::Made(l) = &mut self.large {
                if l.in_flight() > 0 {
                    l.status_into(0, Duration::ZERO, &mut Counted::new(out, &self.storage, self.counts))?;
                }
            }
            let (m, cv) = &*self.state;
            let mut pool = m.lock().unwrap_or_else(|e| e.into_inner());
            out.append(&mut pool.events);
            let running = pool.running;
            let native_busy = self.native.as_ref().is_some_and(|q| q.in_flight() > 0);
            let large_busy = self.large_in_flight() > 0;
            let left = deadline.left();
            let got = out.len() - before;
            if got >= min || (running == 0 && !native_busy && !large_busy) || left.is_zero() {
                return Ok(());
            }
            if running == 0 && !(native_busy && large_busy) {
                // One queue batch runs: let it poll for what is missing (no system call).
                drop(pool);
                let mut sink = Counted::new(out, &self.storage, self.counts);
                match (self.native.as_mut(), &mut self.large) {
                    (Some(q), _) if native_busy => q.status_into(min - got, left, &mut sink)?,
                    (_, LargeEntries::Made(l)) => l.status_into(min - got, left, &mut sink)?,
                    _ => {}
                }
                return Ok(());
            }
            deadline.start();
            if native_busy || large_busy {
                // More than one runs: poll the queues, and let the workers run.
                drop(pool);
                std::thread::yield_now();
            } else {
                let _ = cv.wait_timeout(pool, left.min(Duration::from_millis(10)));
            }
        }
    }

    /// Waits for every running entry (they cannot be recalled from the kernel or the SSD) and
    /// returns all events.
    pub fn cancel(&mut self) -> Result<Vec<IoEvent>> {
        self.born.check("batch")?;
        let mut out = std::mem::take(&mut self.ready);
        // The queue batch waits up to its deadline, then resets the controller (or keeps its
        // entries' leases for good). The worker threads' entries are waited for either way.
        let native = self.native.as_mut().map(Native::cancel).transpose();
        let large = match &mut self.large {
            LargeEntries::Made(l) => l.cancel().map(Some),
            _ => Ok(None),
        };
        let pool = {
            let (m, cv) = &*self.state;
            let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
            while st.running > 0 {
                st = cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            std::mem::take(&mut st.events)
        };
        let mut native = native?.unwrap_or_default();
        native.extend(large?.unwrap_or_default());
        Counted::new(&mut out, &self.storage, self.counts).put_all(&mut native);
        out.extend(pool);
        Ok(out)
    }
}

impl Drop for StorageBatch {
    fn drop(&mut self) {
        if self.born.in_child() {
            // A forked child: the queue pair or ring is the parent's, and the worker threads
            // running the rest are not in this process (waiting for them would never end).
            std::mem::forget(self.native.take());
            std::mem::forget(std::mem::replace(&mut self.large, LargeEntries::NotTried));
            return;
        }
        let _ = self.cancel();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::device::mock_device::MockBatch;
    use crate::mock::MockConfig;

    /// The cookie of an entry whose job on a worker thread panics (for the tests of what a
    /// panicking job leaves behind).
    pub(crate) const PANICKING_COOKIE: u64 = u64::MAX - 0x9a1c;

    fn event(cookie: u64, status: IoStatus, bytes: u64) -> IoEvent {
        IoEvent { cookie, status, bytes, error: None }
    }

    /// The events a storage batch takes from its queue batch reach the caller in order, and
    /// the completed ones are counted on their paths (runs of one path counted together, the
    /// last run when the wait ends); a batch that does not count (the warm-up's) counts none.
    #[test]
    fn events_taken_from_the_queue_batch_are_counted_on_their_paths() {
        let m = MockBatch::stepped(MockConfig::default(), 8).unwrap();
        let storage = m.batch.storage.clone();
        let before = storage.path_counts();
        let mut out = Vec::new();
        {
            let mut sink = Counted::new(&mut out, &storage, true);
            sink.put(event(0, IoStatus::Complete, 4096), Path::DirectHost);
            sink.put(event(1, IoStatus::Complete, 8192), Path::DirectP2p);
            sink.put(event(2, IoStatus::Complete, 4096), Path::DirectHost);
            sink.put(event(3, IoStatus::Failed, 0), Path::DirectHost);
            sink.put(event(4, IoStatus::Complete, 4096), Path::DirectHost);
        }
        let cookies: Vec<u64> = out.iter().map(|e| e.cookie).collect();
        assert_eq!(cookies, [0, 1, 2, 3, 4]);
        let after = storage.path_counts();
        assert_eq!(after.direct_host - before.direct_host, 3, "{after:?}");
        assert_eq!(after.direct_p2p - before.direct_p2p, 1, "{after:?}");
        assert_eq!(after.bytes - before.bytes, 3 * 4096 + 8192, "{after:?}");
        {
            let mut sink = Counted::new(&mut out, &storage, false);
            sink.put(event(5, IoStatus::Complete, 4096), Path::DirectHost);
        }
        assert_eq!(out.len(), 6);
        assert_eq!(storage.path_counts(), after, "a batch that does not count counted");
    }

    /// On a node, an entry larger than one command runs split into commands on the batch's
    /// queue pair for large entries (here over a model of its own, which counts its reads), not
    /// on the worker threads; a small entry still runs on the queue batch. (A thread steps one
    /// model on its idle polls, so the two run one after the other here.)
    #[test]
    fn a_large_entry_on_a_node_runs_split_on_a_queue_pair_of_its_own() {
        use crate::device::mock_device::mock_batch_device;
        use crate::volume_batch::member_depth;
        let cfg = MockConfig { null: true, segments: 2, blocks: 1024, ..MockConfig::default() };
        let mut m = MockBatch::stepped(cfg.clone(), 4).unwrap();
        let depth = member_depth(4, 4096);
        let ring = crate::queue_batch::ring_depth(depth, 4096).unwrap();
        let (dev, qp, large) =
            mock_batch_device(MockConfig { stepped: true, depth: ring, ..cfg }, Duration::from_secs(5)).unwrap();
        let q = QueueBatch::over(&dev, &dev.namespace(1).unwrap(), qp, depth, 0);
        m.batch.large = LargeEntries::Made(Box::new(VolumeQueueBatch::for_node(q, 4)));
        let buf = m.buffer.clone();
        let read = |cookie: u64, file_offset: u64, len: u64| IoRequest {
            op: Op::Read,
            buf: buf.clone(),
            buf_offset: 0,
            file_offset,
            len,
            cookie,
        };
        let one = |m: &mut MockBatch, r: IoRequest| {
            m.batch.submit(&[r]).unwrap();
            let ev = m.batch.status(1, Duration::from_secs(5)).unwrap();
            ev.iter().map(|e| (e.cookie, e.status, e.bytes)).collect::<Vec<_>>()
        };
        // 1 MiB and 8 KiB: two commands of at most 1 MiB (the model's largest).
        let big = (1 << 20) + 8192;
        large.step_on_idle_polls();
        assert_eq!(one(&mut m, read(1, 1 << 20, big)), [(1, IoStatus::Complete, big)]);
        assert_eq!(large.stats().reads, 2, "the large entry's two commands");
        assert_eq!(m.batch.pooled_entries(), 0, "nothing ran on the worker threads");
        m.step_on_idle_polls(true);
        assert_eq!(one(&mut m, read(0, 0, 4096)), [(0, IoStatus::Complete, 4096)]);
        assert_eq!(large.stats().reads, 2, "the small entry ran on the queue batch");
        assert_eq!(m.batch.in_flight(), 0);
    }
}

//! Stream-ordered I/O (cuFile's `cuFileReadAsync`/`cuFileWriteAsync`), without blocking the
//! GPU runtime's callback thread for an I/O's duration.
//!
//! A group of operations becomes stream entries: a store of the group's first ticket into a
//! host-mapped word, which the registration's dispatcher thread ([`crate::stream_dispatch`])
//! sees when the stream reaches it, and then reads each operation's late-bound arguments (size,
//! file offset, buffer offset) from host memory and hands the I/O to worker threads (on a file
//! or a striped volume: puts the group in flight on a queue batch of the registration's own); a
//! wait on a host-mapped completion word, advanced as operations finish (in ticket order, so
//! the word means "every operation up to this ticket is done"). Work queued after the
//! group starts only when all of the group's I/O is done; the operations of one group overlap
//! their device time. [`StreamIo::read_async`] is a group of one. The stream also waits on a
//! second word the host stores as operations finish: a read's copy into GPU memory may advance
//! the completion word from its own queue (see [`crate::stream_tail`]), and the stream passes
//! only once both say so. Results (bytes, or a negative errno) are written to each operation's
//! [`AsyncArgs::bytes`] before the host's word advances; an invalid argument found at execution
//! time is reported there and later operations still run. The waits and the mark that the
//! stream passed the group are queued as one batch where the runtime takes batches.

use crate::batch::{Entry, IoEvent, IoStatus, Op};
use crate::buffer::{Buffer, Lease, Path};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::gpu::stream::{CompletionWord, Stream};
use crate::inflight::{InFlight, Why};
use crate::storage::{ConcretePath, Storage};
use crate::storage_batch::Native;
use crate::stream_dispatch::Dispatcher;
use crate::stream_tail::{Copies, Offer, Release};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Late-bound arguments and the result of one stream-ordered operation. They are read when the
/// stream reaches the operation, so kernels or host code queued before it may set them.
#[derive(Debug, Default)]
#[repr(C)]
pub struct AsyncArgs {
    /// Bytes to move.
    pub size: AtomicU64,
    /// Offset in the file or namespace.
    pub file_offset: AtomicI64,
    /// Offset in the buffer.
    pub buf_offset: AtomicI64,
    /// The result: bytes moved, or a negative errno. Written before the operation counts as done.
    pub bytes: AtomicI64,
}

impl AsyncArgs {
    /// New arguments.
    pub fn new(size: u64, file_offset: i64, buf_offset: i64) -> Arc<AsyncArgs> {
        let a = AsyncArgs::default();
        a.set(size, file_offset, buf_offset);
        Arc::new(a)
    }

    /// Sets the arguments (before the stream reaches the operation).
    pub fn set(&self, size: u64, file_offset: i64, buf_offset: i64) {
        self.size.store(size, Ordering::Release);
        self.file_offset.store(file_offset, Ordering::Release);
        self.buf_offset.store(buf_offset, Ordering::Release);
    }
}

/// Where an operation's late-bound arguments live and its result goes: [`AsyncArgs`], or the
/// caller's own words (the C ABI's `size_p`, `file_offset_p`, ... pointers).
pub trait AsyncParams: Send + Sync + std::fmt::Debug {
    /// Reads (size, file offset, buffer offset) when the stream reaches the operation.
    fn load(&self) -> (u64, i64, i64);
    /// Stores the result: bytes, or a negative errno.
    fn store_result(&self, v: i64);
    /// The result stored last.
    fn result(&self) -> i64;
}

impl AsyncParams for AsyncArgs {
    fn load(&self) -> (u64, i64, i64) {
        (
            self.size.load(Ordering::Acquire),
            self.file_offset.load(Ordering::Acquire),
            self.buf_offset.load(Ordering::Acquire),
        )
    }

    fn store_result(&self, v: i64) {
        self.bytes.store(v, Ordering::Release)
    }

    fn result(&self) -> i64 {
        self.bytes.load(Ordering::Acquire)
    }
}

/// One operation of a group.
#[derive(Debug, Clone)]
pub struct AsyncOp {
    /// Read or write.
    pub op: Op,
    /// The memory.
    pub buf: Arc<Buffer>,
    /// Its arguments and result slot.
    pub args: Arc<dyn AsyncParams>,
}

/// Completion tickets: the word carries the largest ticket up to which everything is done.
#[derive(Debug, Default)]
struct Tickets {
    prefix: u32,
    done: BTreeSet<u32>,
}

/// Stream-ordered I/O on one stream (cuFile's registered stream).
///
/// Dropping it never calls the stream (the application may have destroyed it already): it
/// waits until the stream has passed every group queued through it, which the stream itself
/// reports (it writes a second word after each group's wait), and only then frees the words the
/// stream reads and writes.
#[derive(Debug)]
pub struct StreamIo {
    stream: Arc<dyn Stream>,
    word: CompletionWord,
    tickets: Arc<Mutex<Tickets>>,
    next: Mutex<u32>,
    /// The last ticket whose group the stream has passed (its wait included), written by the
    /// stream after each group's wait.
    passed: CompletionWord,
    /// The ticket up to which the host has finished every job (stored its result, let go of
    /// what it held or handed that to a copy), written by the host. The stream waits for it as
    /// well as for `word`, which a copy's queue may store before the job is over (see
    /// [`crate::stream_tail`]).
    finished: CompletionWord,
    /// Starts each group when the stream reaches it.
    dispatch: Dispatcher,
    /// Copies into GPU memory whose queues store `word` (see [`crate::stream_tail`]), until
    /// each is over.
    copies: Arc<Copies>,
    /// The queue batch groups on a file or volume target run on (made at the first, again when
    /// a group is larger or on another target).
    group: Arc<Mutex<Option<GroupBatch>>>,
    /// The fork generation it was registered in.
    born: crate::fork::Born,
}

/// One operation of a group as a job: it runs on a worker thread once the stream reaches the
/// group; it reads its own arguments and stores its own result.
pub type StreamJob = Box<dyn FnOnce() + Send + 'static>;

/// How long dropping a [`StreamIo`] waits for the stream to pass its groups before it gives
/// up and leaves the completion word allocated (a stream that never runs again).
const DROP_WAIT: Duration = Duration::from_secs(60);

/// Finishes one ticket when dropped.
struct Finish {
    tickets: Arc<Mutex<Tickets>>,
    word: CompletionWord,
    /// The registration's `finished` word.
    finished: CompletionWord,
    ticket: u32,
    /// A copy's queue stores the word (this ticket's value) once the copy is done: the host
    /// only counts the ticket.
    stored_by_device: bool,
}

impl Finish {
    fn new(tickets: &Arc<Mutex<Tickets>>, word: &CompletionWord, finished: &CompletionWord, ticket: u32) -> Finish {
        let (tickets, word, finished) = (tickets.clone(), word.clone(), finished.clone());
        Finish { tickets, word, finished, ticket, stored_by_device: false }
    }

    /// Whether every earlier ticket is done: finishing this one then moves the word to it.
    fn is_next(&self) -> bool {
        self.tickets.lock().unwrap_or_else(|e| e.into_inner()).prefix == self.ticket.wrapping_sub(1)
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        finish(&self.tickets, self.ticket, (!self.stored_by_device).then_some(&self.word), &self.finished);
    }
}

/// Counts `ticket` done and stores the ticket up to which all are done into `word` (when
/// given) and `finished`, under the lock: stores made after it is released could land out of
/// order and move a word back.
fn finish(tickets: &Mutex<Tickets>, ticket: u32, word: Option<&CompletionWord>, finished: &CompletionWord) {
    let mut t = tickets.lock().unwrap_or_else(|e| e.into_inner());
    t.done.insert(ticket);
    loop {
        let n = t.prefix.wrapping_add(1);
        if !t.done.remove(&n) {
            break;
        }
        t.prefix = n;
    }
    if let Some(w) = word {
        w.store(t.prefix);
    }
    finished.store(t.prefix);
}

impl StreamIo {
    /// Registers a stream for stream-ordered I/O. The thread that will start its groups is set
    /// up at once (its context bound, its io_uring made), so the first group does not wait for
    /// that.
    pub fn new(stream: Arc<dyn Stream>) -> Result<StreamIo> {
        let born = crate::fork::watch()?;
        let word = stream.completion_word()?;
        word.store(0);
        let passed = stream.completion_word()?;
        passed.store(0);
        let finished = stream.completion_word()?;
        finished.store(0);
        let copies = Arc::new(Copies::default());
        let c = copies.clone();
        let dispatch = Dispatcher::new(&*stream, Box::new(move || c.tidy()))?;
        let sio = StreamIo {
            stream,
            word,
            tickets: Arc::default(),
            next: Mutex::new(0),
            passed,
            finished,
            dispatch,
            copies,
            group: Arc::default(),
            born,
        };
        sio.prepare();
        Ok(sio)
    }

    /// Sets up the thread that starts this registration's groups (the stream's context bound
    /// on it, its io_uring made) now rather than at the first group, whose latency it would
    /// be.
    fn prepare(&self) {
        let stream = self.stream.clone();
        self.dispatch.prepare(Box::new(move || {
            if let Err(e) = stream.bind_thread() {
                log::debug!("binding a stream's context on its dispatcher: {e}");
            }
            #[cfg(feature = "fallback")]
            crate::fallback::prepare_thread();
        }));
    }

    /// The stream.
    pub fn stream(&self) -> &Arc<dyn Stream> {
        &self.stream
    }

    /// Queues a read of `args.size` bytes at `args.file_offset` into `buf` at `args.buf_offset`.
    pub fn read_async(&self, storage: &Arc<Storage>, buf: &Arc<Buffer>, args: &Arc<AsyncArgs>) -> Result<()> {
        self.submit(storage, &[AsyncOp { op: Op::Read, buf: buf.clone(), args: args.clone() }])
    }

    /// Queues a write.
    pub fn write_async(&self, storage: &Arc<Storage>, buf: &Arc<Buffer>, args: &Arc<AsyncArgs>) -> Result<()> {
        self.submit(storage, &[AsyncOp { op: Op::Write, buf: buf.clone(), args: args.clone() }])
    }

    /// Queues `f` on the stream after everything queued so far.
    pub fn then(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        self.born.check("stream")?;
        self.stream.host_fn(Box::new(f))
    }

    /// Queues a group: its operations run concurrently once the stream reaches it, and later
    /// stream work waits for all of them. On a file or block device the whole group is one job
    /// that puts its operations in flight at once on a ring of this registration's own (see
    /// [`crate::fallback_batch`]), on a striped volume on queue pairs of its own on every member
    /// (see [`crate::volume_batch`]); elsewhere each operation is a job of its own.
    pub fn submit(&self, storage: &Arc<Storage>, ops: &[AsyncOp]) -> Result<()> {
        self.born.check("stream")?;
        let batched = match storage.concrete_path() {
            #[cfg(feature = "fallback")]
            ConcretePath::File(_) => true,
            ConcretePath::Volume(_) => true,
            _ => false,
        };
        #[cfg(feature = "fallback")]
        if let ([o], ConcretePath::File(_)) = (ops, storage.concrete_path()) {
            if o.op == Op::Read && matches!(o.buf.mem(), crate::buffer::Mem::Gpu(_)) {
                return self.submit_jobs(&storage.engine()?, vec![read_alone(storage, o)]);
            }
        }
        if batched && !ops.is_empty() {
            return self.submit_to_batch(storage, ops);
        }
        let jobs = ops
            .iter()
            .map(|o| {
                let (o, s) = (o.clone(), storage.clone());
                Box::new(move || run_op(&s, &o)) as StreamJob
            })
            .collect();
        self.submit_jobs(&storage.engine()?, jobs)
    }

    /// [`StreamIo::submit`] on a file or volume target: one ticket for the group, which runs on
    /// the registration's dispatcher (nothing else runs there until the stream passes the
    /// group: its wait comes before the next group's start).
    fn submit_to_batch(&self, storage: &Arc<Storage>, ops: &[AsyncOp]) -> Result<()> {
        let engine = storage.engine()?;
        let (s, ops, group) = (storage.clone(), ops.to_vec(), self.group.clone());
        let (word, finished, tickets) = (self.word.clone(), self.finished.clone(), self.tickets.clone());
        self.queue(1, move |first, cancelled| {
            // Finishes the ticket once the group and any job it handed work to are over (or
            // were dropped unrun).
            let done = Arc::new(Finish::new(&tickets, &word, &finished, first));
            if !cancelled.load(Ordering::Acquire) {
                run_group(&s, &engine, &group, &ops, &done);
            }
        })
    }

    /// Queues a group of jobs (the general form of [`StreamIo::submit`]: the C faces' jobs
    /// resolve their memory and choose their path when they run).
    pub fn submit_jobs(&self, engine: &Arc<Engine>, jobs: Vec<StreamJob>) -> Result<()> {
        self.born.check("stream")?;
        if jobs.is_empty() {
            return Err(Error::invalid("ops", "empty group"));
        }
        let (engine, word, tickets) = (engine.clone(), self.word.clone(), self.tickets.clone());
        let (copies, finished) = (self.copies.clone(), self.finished.clone());
        // CAST: a group's jobs are counted in u32 tickets (wrapping is how tickets work).
        self.queue(jobs.len() as u32, move |first, cancelled| {
            let single = jobs.len() == 1;
            for (i, job) in jobs.into_iter().enumerate() {
                let ticket = first.wrapping_add(i as u32);
                // Finishes the ticket however the job ends (returns, panics, or is dropped
                // unrun), so the stream's wait is always released.
                let done = Finish::new(&tickets, &word, &finished, ticket);
                if single {
                    run_alone(job, done, &cancelled, &copies);
                    continue;
                }
                let cancelled = cancelled.clone();
                let work = move || {
                    let _done = done;
                    if !cancelled.load(Ordering::Acquire) {
                        job();
                    }
                };
                // A refused spawn drops `work` and with it `done`: the ticket still finishes.
                let _ = engine.spawn(work);
            }
        })
    }

    /// Queues a group of `count` tickets on the stream: `run(first, cancelled)`, which must
    /// see to it that tickets `first..first + count` finish, when the stream reaches the
    /// group, then the wait for them. `cancelled` is set when queuing the group's wait failed
    /// after its start was queued: the caller is told the operation failed, so its I/O
    /// must not start (it would use memory the caller may free). A group started at once on an
    /// idle stream is over by the time the call fails; one the stream starts may have started
    /// before the flag was set, and cannot be recalled.
    fn queue(&self, count: u32, run: impl FnOnce(u32, Arc<AtomicBool>) + Send + 'static) -> Result<()> {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let first = next.wrapping_add(1);
        let last = next.wrapping_add(count);
        let cancelled = Arc::new(AtomicBool::new(false));
        let cancel = cancelled.clone();
        // Asked before anything of this group is queued: on an idle stream everything queued
        // before (earlier groups' waits included) is done, so the group may start now.
        let at_once = self.stream.is_idle();
        self.dispatch.queue(&*self.stream, first, Box::new(move || run(first, cancelled)), at_once)?;
        // Whatever happens next, the group's start queued above finishes these tickets.
        *next = last;
        if at_once {
            // Started before its wait is queued, which takes this thread a microsecond or more
            // (a failed wait is seen to below).
            self.dispatch.release(first);
        }
        // The waits, and behind them the mark that the stream passed the group: written by the
        // stream, not a host function, which would be a second round trip to a host thread on
        // every synchronize's critical path.
        let waits = [(&self.word, last), (&self.finished, last)];
        let queued = self.stream.waits_then_write(&waits, &self.passed, last);
        if queued.is_err() {
            cancel.store(true, Ordering::Release);
            if at_once {
                // The group may have started: its caller, told that it failed, may free its
                // memory at once, so the call returns only once the group is over.
                self.wait_finished(last);
            }
            // The mark may not be queued yet; dropping the registration waits for it (a wait
            // queued before the failure is passed: the group's tickets finish whatever happens).
            let _ = self.stream.write_word(&self.passed, last);
        }
        queued
    }

    /// Waits until every ticket up to `last` is finished (a group that started, or saw that it
    /// was cancelled before it could), and the copies left running are over: a read's copy
    /// into GPU memory writes the caller's memory after its ticket finished, and the store
    /// behind it must land before a later group's store of the word.
    fn wait_finished(&self, last: u32) {
        let finished = || {
            let prefix = self.tickets.lock().unwrap_or_else(|e| e.into_inner()).prefix;
            // Cyclic, as tickets are.
            prefix.wrapping_sub(last) as i32 >= 0
        };
        while !finished() {
            std::thread::sleep(Duration::from_micros(20));
        }
        self.settle_copies();
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.born.check("stream")?;
        self.stream.synchronize()?;
        // The copies that released the stream are over: what they kept busy goes now.
        self.settle_copies();
        Ok(())
    }

    /// Waits for the copies that release the stream to be over and lets go of what they kept
    /// (memory, buffers counted busy). They never wait for the stream (each is a copy of at
    /// most a staging chunk, started when its read completed), so this is short. The dispatcher
    /// lets go of them on its own within microseconds; a caller about to tell whether a
    /// buffer is in use settles them first, so that a buffer whose stream has passed its I/O
    /// is never reported busy.
    pub(crate) fn settle_copies(&self) {
        // In a forked child the copies (and their queues) are the parent's: touched by no one.
        if self.born.in_child() {
            return;
        }
        drop(self.copies.take_all());
    }

    /// Copies that released the stream so far (tests).
    #[cfg(all(test, feature = "fallback"))]
    pub(crate) fn copies_signalled(&self) -> u64 {
        self.copies.signalled()
    }

    /// Whether the stream has passed every group queued through this registration.
    pub fn idle(&self) -> bool {
        let next = *self.next.lock().unwrap_or_else(|e| e.into_inner());
        self.passed.reached(next)
    }
}

/// Runs a group of one job on the dispatcher (no hand-off to a worker: the dispatcher is idle
/// until the stream passes this group anyway). When the job's one I/O leaves its copy into GPU
/// memory running ([`crate::stream_tail`]), the copy's queue stores the word behind it (queued
/// with the copy); the host's finished mark, which the stream waits for too, follows once the
/// job has stored its result and the copy is listed.
fn run_alone(job: StreamJob, mut done: Finish, cancelled: &AtomicBool, copies: &Copies) {
    if cancelled.load(Ordering::Acquire) {
        return;
    }
    // Only when every earlier ticket is done: the device then stores what the host would.
    let offer = done.is_next().then(|| Offer::new(Release { word: done.word.clone(), value: done.ticket }));
    job();
    if let Some(c) = offer.and_then(Offer::take) {
        done.stored_by_device = copies.signal(c, &done.word, done.ticket);
    }
}

/// A group of one read into GPU memory on a file or block device, as a job of its own: run on
/// the dispatcher as the job's one I/O, so on the fallback path the read's copy is left running
/// and its queue releases the stream ([`crate::stream_tail`]), as the C faces' reads do. The
/// result is stored when the read is done, before the copy is; the buffer stays counted in use
/// until the copy is over.
#[cfg(feature = "fallback")]
fn read_alone(storage: &Arc<Storage>, o: &AsyncOp) -> StreamJob {
    let (s, o) = (storage.clone(), o.clone());
    Box::new(move || {
        // Taken before the I/O: a buffer that cannot be leased fails the I/O by name there.
        let busy = Lease::new(o.buf.clone()).ok();
        crate::stream_tail::one_io(|| run_op(&s, &o));
        if let Some(l) = busy {
            crate::stream_tail::keep_while_copying(Box::new(l));
        }
    })
}

/// An operation's late-bound arguments, read once and checked: (size, file offset, buffer
/// offset).
fn load_checked(s: &Storage, o: &AsyncOp) -> Result<(u64, u64, u64)> {
    let (size, foff, boff) = o.args.load();
    if foff < 0 {
        return Err(Error::invalid("file_offset", format!("{foff} is negative")));
    }
    if boff < 0 {
        return Err(Error::invalid("buf_offset", format!("{boff} is negative")));
    }
    s.check(&o.buf, boff as u64, foff as u64, size)?;
    Ok((size, foff as u64, boff as u64))
}

/// Runs one operation synchronously and stores its result.
fn run_op(s: &Storage, o: &AsyncOp) {
    let r = load_checked(s, o).and_then(|(size, foff, boff)| s.rw(o.op == Op::Write, &o.buf, boff, foff, size));
    o.args.store_result(r.map(|n| n as i64).unwrap_or_else(|e| e.errno() as i64));
}

/// A registration's queue batch for its groups, and what it was made for.
#[derive(Debug)]
struct GroupBatch {
    storage: Arc<Storage>,
    capacity: usize,
    batch: Native,
}

impl GroupBatch {
    /// Whether it can run a group of `n` operations on `storage`.
    fn fits(&self, storage: &Arc<Storage>, n: usize) -> bool {
        Arc::ptr_eq(&self.storage, storage) && self.capacity >= n
    }
}

/// Runs a group on a file or volume target: every operation the registration's queue batch
/// takes in flight on it at once, each other one on a worker of its own (holding the group's
/// ticket), then the batch's events stored as the operations' results. Groups of one
/// registration run one after another (stream order), so the batch is never shared.
fn run_group(
    s: &Arc<Storage>,
    engine: &Engine,
    group: &Mutex<Option<GroupBatch>>,
    ops: &[AsyncOp],
    done: &Arc<Finish>,
) {
    let mut slot = group.lock().unwrap_or_else(|e| e.into_inner());
    if !slot.as_ref().is_some_and(|g| g.fits(s, ops.len())) {
        // The old batch (if any) is idle: its groups are over. It goes first: its controllers
        // may have no queue pair to spare for both.
        *slot = None;
        *slot =
            Native::new(s, ops.len(), false).map(|batch| GroupBatch { storage: s.clone(), capacity: ops.len(), batch });
    }
    let max_cmd = s.max_command_bytes();
    let mut entries = Vec::with_capacity(ops.len());
    for (i, o) in ops.iter().enumerate() {
        let (size, foff, boff) = match load_checked(s, o) {
            Ok(v) => v,
            Err(e) => {
                o.args.store_result(e.errno() as i64);
                continue;
            }
        };
        if slot.as_mut().is_some_and(|g| g.batch.takes(&o.buf, boff, size, max_cmd)) {
            match Lease::new(o.buf.clone()) {
                Ok(lease) => entries.push(Entry {
                    op: o.op,
                    lease,
                    buf_offset: boff,
                    dev_offset: foff,
                    len: size,
                    cookie: i as u64,
                }),
                Err(e) => o.args.store_result(e.errno() as i64),
            }
            continue;
        }
        // A worker of its own, holding the group's ticket.
        let (s, o, done) = (s.clone(), o.clone(), done.clone());
        let job = move || {
            let _done = done;
            let r = s.rw(o.op == Op::Write, &o.buf, boff, foff, size);
            o.args.store_result(r.map(|n| n as i64).unwrap_or_else(|e| e.errno() as i64));
        };
        if let Err(e) = engine.spawn(job) {
            ops[i].args.store_result(e.errno() as i64);
        }
    }
    // A batch a failure left unsound (events or entries of this group still in it) serves no
    // later group. It goes before the group is over: its drop waits for the commands it still
    // has (or resets the controller, or keeps their memory leased for good), so the stream
    // does not pass the group while one of them may still move data.
    let sound = slot.as_mut().is_none_or(|g| run_on_batch(s, &mut g.batch, entries, ops));
    if !sound {
        *slot = None;
    }
}

/// Runs `entries` (operations of `ops`, each entry's cookie its index there) on a group's
/// queue batch and stores each operation's result as its event comes. When the batch refuses
/// the entries or a wait of it fails, every one of them whose event did not come gets that
/// failure's errno: no result is left at the 0 it started with, which would read as a
/// transfer of nothing. When no command of the batch came back for its command timeout, or on
/// a volume none of one member's while it had some in flight, the rest are hung: the batch
/// cancels them, on every member (resetting the controller if they still do not finish; memory
/// of commands it cannot confirm stopped stays leased), and they fail with `ETIMEDOUT`, as a
/// synchronous request would, instead of holding the stream for good.
/// Returns whether the batch is sound for another group (false after any of these).
fn run_on_batch(s: &Storage, r: &mut Native, entries: Vec<Entry>, ops: &[AsyncOp]) -> bool {
    let n = entries.len();
    if n == 0 {
        return true;
    }
    let mut waiting: Vec<usize> = entries.iter().map(|e| e.cookie as usize).collect();
    let fail_rest = |waiting: &[usize], errno: i32| {
        for o in waiting.iter().filter_map(|&i| ops.get(i)) {
            o.args.store_result(errno as i64);
        }
    };
    if let Err(e) = r.submit(entries) {
        // Nothing of the call was placed.
        fail_rest(&waiting, e.errno());
        return false;
    }
    // Stores an event's result (an event of no operation still waiting is dropped).
    let store = |waiting: &mut Vec<usize>, e: IoEvent, path: Path| {
        let i = e.cookie as usize;
        let Some(at) = waiting.iter().position(|&w| w == i) else { return };
        waiting.swap_remove(at);
        let Some(o) = ops.get(i) else { return };
        let v = match (e.status, e.error) {
            (IoStatus::Complete, _) => {
                s.count(path, e.bytes);
                e.bytes as i64
            }
            (IoStatus::Canceled, _) => -(libc::ETIMEDOUT as i64),
            (_, Some(err)) => err.errno() as i64,
            (_, None) => -(libc::EIO as i64),
        };
        o.args.store_result(v);
    };
    let hung_after = r.command_timeout();
    // The group's quiet time, since an event came or a command came back; on a volume each
    // member keeps its own too, since one member's pieces coming back say nothing of another's.
    // The oldest counts.
    let (mut events, mut quiet_since) = (Vec::with_capacity(n), Instant::now());
    let mut progress = Vec::new();
    r.member_progress(&mut progress);
    let mut members: Vec<MemberQuiet> =
        progress.iter().map(|p| MemberQuiet { done: p.done, since: quiet_since }).collect();
    while !waiting.is_empty() {
        let before = waiting.len();
        let waited = r.status_into(waiting.len(), Duration::from_secs(1), &mut events);
        for (e, path) in events.drain(..) {
            store(&mut waiting, e, path);
        }
        if let Err(e) = waited {
            // Entries the batch finished but had not handed out yet fail with the rest.
            fail_rest(&waiting, e.errno());
            return false;
        }
        let now = Instant::now();
        r.member_progress(&mut progress);
        let mut moved = waiting.len() != before;
        for (p, m) in progress.iter().zip(members.iter_mut()) {
            moved |= p.done != m.done;
            // A member with nothing in flight is not waited for.
            if p.in_flight == 0 || p.done != m.done {
                *m = MemberQuiet { done: p.done, since: now };
            }
        }
        if moved {
            quiet_since = now;
        }
        let quiet = members.iter().map(|m| m.since).fold(quiet_since, Instant::min);
        if hung_after.is_some_and(|t| now.duration_since(quiet) > t) {
            log::warn!("stream-ordered I/O: {} operations of a group hung; canceled", waiting.len());
            match r.cancel() {
                Ok(evs) => evs.into_iter().for_each(|(e, path)| store(&mut waiting, e, path)),
                // The batch keeps the memory of what it could not stop leased for good.
                Err(e) => log::warn!("stream-ordered I/O: canceling the hung operations failed: {e}"),
            }
            fail_rest(&waiting, -libc::ETIMEDOUT);
            return false;
        }
    }
    true
}

/// A volume member's quiet time in a group's wait: its count of pieces back when it last moved
/// (or had nothing in flight), and when that was.
struct MemberQuiet {
    done: u64,
    since: Instant,
}

impl Drop for StreamIo {
    fn drop(&mut self) {
        if self.born.in_child() {
            // The stream and the workers are the parent's: nothing will pass the groups here.
            // The completion words (pinned memory of the parent's runtime) and the queue batch stay.
            std::mem::forget(self.word.clone());
            std::mem::forget(self.passed.clone());
            std::mem::forget(self.finished.clone());
            std::mem::forget(self.copies.clone());
            self.dispatch.forget();
            std::mem::forget(self.group.clone());
            return;
        }
        let deadline = Instant::now() + DROP_WAIT;
        while !self.idle() {
            if Instant::now() >= deadline {
                // The stream may still read its words and write `passed`: a token keeps their
                // memory allocated.
                let words =
                    (self.word.clone(), self.passed.clone(), self.dispatch.word().clone(), self.finished.clone());
                // Copies not over may yet store the word.
                InFlight::new(Why::Stream).holding((words, self.copies.take_all())).keep();
                // Its thread ends on its own should the stream ever reach what is queued.
                self.dispatch.stop(false);
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        // The stream passed every group, so every copy that released one is over.
        self.settle_copies();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::stream::{CpuStream, HostFn};

    /// A CPU stream that cannot queue waits (and takes a while to say so, as a driver call may).
    #[derive(Debug)]
    struct NoWaits(Arc<CpuStream>);

    impl Stream for NoWaits {
        fn completion_word(&self) -> Result<CompletionWord> {
            self.0.completion_word()
        }
        fn host_fn(&self, f: HostFn) -> Result<()> {
            self.0.host_fn(f)
        }
        fn wait_word(&self, _: &CompletionWord, _: u32) -> Result<()> {
            std::thread::sleep(Duration::from_millis(20));
            Err(Error::Gpu { op: "wait", reason: "refused (test)".into() })
        }
        fn synchronize(&self) -> Result<()> {
            self.0.synchronize()
        }
        fn is_idle(&self) -> bool {
            self.0.is_idle()
        }
        fn raw(&self) -> usize {
            self.0.raw()
        }
    }

    /// A group of three 4 KiB reads (operation `i` at block `i`) and their entries, for a queue
    /// batch of 8 on the device model made as `cfg` says, its commands timing out after
    /// `timeout`.
    struct ModelGroup {
        st: Arc<Storage>,
        batch: Native,
        ops: Vec<AsyncOp>,
        entries: Vec<Entry>,
        buf: Arc<Buffer>,
        mock: crate::mock::MockDevice,
        _dev: crate::device::Device,
    }

    fn model_group(cfg: crate::mock::MockConfig, timeout: Duration) -> ModelGroup {
        use crate::device::mock_device::{mock_batch_device, mock_buffer};
        let (dev, qp, mock) = mock_batch_device(cfg, timeout).unwrap();
        let ns = dev.namespace(1).unwrap();
        let st = Storage::direct(&dev, 1).unwrap();
        let buf = Arc::new(mock_buffer(&st, &dev, &mock).unwrap());
        let batch = Native::One(Box::new(crate::queue_batch::QueueBatch::over(&dev, &ns, qp, 8, 0)));
        let ops = (0..3u64)
            .map(|i| AsyncOp { op: Op::Read, buf: buf.clone(), args: AsyncArgs::new(4096, i as i64 * 4096, 0) })
            .collect();
        let entries = (0..3u64).map(|i| read_entry(&buf, i, i * 4096, 4096)).collect();
        ModelGroup { st, batch, ops, entries, buf, mock, _dev: dev }
    }

    /// Entry `i` of a group: a read of `len` bytes at `dev_offset` into page `i` of `buf`, its
    /// cookie `i`, with the buffer leased.
    fn read_entry(buf: &Arc<Buffer>, i: u64, dev_offset: u64, len: u64) -> Entry {
        Entry {
            op: Op::Read,
            lease: Lease::new(buf.clone()).unwrap(),
            buf_offset: i * 4096,
            dev_offset,
            len,
            cookie: i,
        }
    }

    /// A group's queue batch on a controller that faults before its submission, or while its
    /// wait runs: every operation's result is the failure's errno, none the 0 of a transfer of
    /// nothing (nothing was stored when the batch failed).
    #[test]
    fn a_failed_group_batch_stores_an_error_for_every_operation() {
        use crate::mock::MockConfig;
        for fault_before_submit in [true, false] {
            let cfg = MockConfig { depth: 9, stepped: true, ..MockConfig::default() };
            let mut g = model_group(cfg, Duration::from_millis(500));
            // The model never answers (stepped, never stepped): the wait polls until it sees
            // the fault.
            let faulting = if fault_before_submit {
                g.mock.set_faulted(true);
                None
            } else {
                Some(g.mock.fault_after(Duration::from_millis(50)))
            };
            let sound = run_on_batch(&g.st, &mut g.batch, std::mem::take(&mut g.entries), &g.ops);
            assert!(!sound, "a failed batch is retired");
            if let Some(t) = faulting {
                t.join().unwrap();
            }
            let want = Error::DeviceFaulted.errno() as i64;
            let got: Vec<i64> = g.ops.iter().map(|o| o.args.result()).collect();
            assert_eq!(got, vec![want; 3], "faulted before the submission: {fault_before_submit}");
            g.mock.set_faulted(false);
        }
    }

    /// A group's queue batch whose command never completes: once no command came back for the
    /// device's command timeout, the batch is canceled (a controller reset asked for) and the
    /// hung operation fails with ETIMEDOUT while the others keep their bytes; the group ends
    /// instead of holding the stream for good.
    #[test]
    fn a_hung_operation_of_a_group_times_out() {
        use crate::mock::{Behaviour, Fault, MockConfig};
        let behaviour = Behaviour::Script(vec![Fault::None, Fault::Never, Fault::None]);
        let cfg = MockConfig { depth: 9, behaviour, ..MockConfig::default() };
        let mut g = model_group(cfg, Duration::from_millis(300));
        let (ops, buf) = (g.ops.clone(), g.buf.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let run = std::thread::spawn(move || {
            let sound = run_on_batch(&g.st, &mut g.batch, std::mem::take(&mut g.entries), &g.ops);
            let _ = tx.send(sound);
            // Kept until the results are checked: dropping it is not what ends the wait.
            g
        });
        let sound = rx.recv_timeout(Duration::from_secs(20)).expect("the group still waits for its hung command");
        assert!(!sound, "a batch that had to cancel is retired");
        drop(run.join().unwrap());
        let got: Vec<i64> = ops.iter().map(|o| o.args.result()).collect();
        assert_eq!(got, vec![4096, -(libc::ETIMEDOUT as i64), 4096]);
        // The model's reset cannot confirm the controller stopped (its ioctls fail): the hung
        // read's memory stays leased.
        assert_eq!(buf.inflight(), 1);
    }

    /// A volume's entry of many pieces, one command at a time on its member, each answered well
    /// within the command timeout but all of them taking longer than it: the group waits for
    /// it, counting each piece that comes back as progress, and it completes.
    #[test]
    fn a_volume_entry_slower_than_the_timeout_but_progressing_completes() {
        use crate::device::mock_device::{mock_batch_device, mock_volume_buffer};
        use crate::mock::MockConfig;
        use crate::queue_batch::QueueBatch;
        use crate::volume_batch::VolumeQueueBatch;
        const MIB: u64 = 1 << 20;
        let cfg = MockConfig {
            depth: 2,
            stepped: true,
            null: true,
            blocks: 4096,
            segment_bytes: 16 * MIB,
            ..MockConfig::default()
        };
        let (dev, qp, mock) = mock_batch_device(cfg, Duration::from_millis(300)).unwrap();
        let ns = dev.namespace(1).unwrap();
        let st = Storage::direct(&dev, 1).unwrap();
        let buf = Arc::new(mock_volume_buffer(&st, &[(&dev, &mock)]).unwrap());
        // One piece in flight at a time: 16 commands of 1 MiB, one after another.
        let member = QueueBatch::over(&dev, &ns, qp, 1, 0);
        let mut batch = Native::Volume(Box::new(VolumeQueueBatch::over(vec![member], vec!["m0".into()], 128 << 10, 1)));
        let ops = [AsyncOp { op: Op::Read, buf: buf.clone(), args: AsyncArgs::new(16 * MIB, 0, 0) }];
        let entry = read_entry(&buf, 0, 0, 16 * MIB);
        // The device answers every 150 ms: 2.4 s for the entry, well past the first 1 s round of
        // the group's wait.
        let stepper = mock.step_every(Duration::from_millis(150));
        let sound = run_on_batch(&st, &mut batch, vec![entry], &ops);
        drop(stepper);
        assert_eq!(ops[0].args.result(), 16 * MIB as i64);
        assert!(sound);
    }

    /// A striped volume's group where one member's command never completes while the other
    /// member's completes: once nothing came back for the command timeout, every member is
    /// canceled, the hung operation fails with ETIMEDOUT, the other keeps its bytes, and the
    /// group ends (it does not hold the stream for good because another member answered).
    #[test]
    fn a_hung_piece_on_one_member_of_a_volume_times_out_the_group() {
        use crate::device::mock_device::{mock_batch_device, mock_volume_buffer};
        use crate::mock::{Behaviour, Fault, MockConfig};
        use crate::queue_batch::QueueBatch;
        use crate::volume_batch::VolumeQueueBatch;
        let chunk = 64 << 10;
        let (mut members, mut mocks, mut devs) = (Vec::new(), Vec::new(), Vec::new());
        for m in 0..2 {
            // Member 1's first command never completes.
            let behaviour = if m == 1 { Behaviour::Script(vec![Fault::Never]) } else { Behaviour::Honest };
            let cfg = MockConfig { depth: 5, blocks: 1024, segment_bytes: 4 << 20, behaviour, ..MockConfig::default() };
            let (dev, qp, mock) = mock_batch_device(cfg, Duration::from_millis(300)).unwrap();
            let ns = dev.namespace(1).unwrap();
            members.push(QueueBatch::over(&dev, &ns, qp, 4, m));
            mocks.push(mock);
            devs.push(dev);
        }
        let st = Storage::direct(&devs[0], 1).unwrap();
        let pairs: Vec<_> = devs.iter().zip(&mocks).collect();
        let buf = Arc::new(mock_volume_buffer(&st, &pairs).unwrap());
        let names = vec!["m0".into(), "m1".into()];
        let mut batch = Native::Volume(Box::new(VolumeQueueBatch::over(members, names, chunk, 2)));
        // Operation 0 in the first chunk (member 0), operation 1 in the second (member 1).
        let ops: Vec<AsyncOp> = (0..2i64)
            .map(|i| AsyncOp { op: Op::Read, buf: buf.clone(), args: AsyncArgs::new(4096, i * chunk as i64, 0) })
            .collect();
        let entries = (0..2u64).map(|i| read_entry(&buf, i, i * chunk, 4096)).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let run_ops = ops.clone();
        let run = std::thread::spawn(move || {
            let sound = run_on_batch(&st, &mut batch, entries, &run_ops);
            let _ = tx.send(sound);
            // Kept until the results are checked.
            (batch, st, mocks, devs)
        });
        let sound = rx.recv_timeout(Duration::from_secs(20)).expect("the group still waits for its hung piece");
        assert!(!sound, "a batch that had to cancel is retired");
        drop(run.join().unwrap());
        let got: Vec<i64> = ops.iter().map(|o| o.args.result()).collect();
        assert_eq!(got, vec![4096, -(libc::ETIMEDOUT as i64)]);
        // Member 1's reset cannot confirm its controller stopped: that read's memory stays
        // leased; member 0's read gave its lease back.
        assert_eq!(buf.inflight(), 1);
    }

    /// A striped volume's group: member 1's command never completes while member 0's come back
    /// one at a time, each well within the command timeout (100 ms against 300), for 4 s. The
    /// hang is found by member 1's own quiet time, not after member 0's work is over; member 0's
    /// operations not done by then are canceled with it.
    #[test]
    fn a_member_that_hangs_while_another_keeps_completing_times_out_the_group() {
        use crate::device::mock_device::{mock_batch_device, mock_volume_buffer};
        use crate::mock::{Behaviour, Fault, MockConfig};
        use crate::queue_batch::QueueBatch;
        use crate::volume_batch::VolumeQueueBatch;
        let (chunk, slow) = (64 << 10, 40usize);
        let (mut members, mut mocks, mut devs) = (Vec::new(), Vec::new(), Vec::new());
        for m in 0..2 {
            let (behaviour, stepped) =
                if m == 1 { (Behaviour::Script(vec![Fault::Never]), false) } else { (Behaviour::Honest, true) };
            let cfg = MockConfig {
                depth: 16,
                blocks: 1024,
                segment_bytes: 4 << 20,
                behaviour,
                stepped,
                ..MockConfig::default()
            };
            let (dev, qp, mock) = mock_batch_device(cfg, Duration::from_millis(300)).unwrap();
            let ns = dev.namespace(1).unwrap();
            // Member 0's queue holds fewer pieces than it gets: the rest wait in the volume batch.
            members.push(QueueBatch::over(&dev, &ns, qp, 12, m));
            mocks.push(mock);
            devs.push(dev);
        }
        mocks[0].post_at_most(1);
        let stepper = mocks[0].step_every(Duration::from_millis(100));
        let st = Storage::direct(&devs[0], 1).unwrap();
        let pairs: Vec<_> = devs.iter().zip(&mocks).collect();
        let buf = Arc::new(mock_volume_buffer(&st, &pairs).unwrap());
        let names = vec!["m0".into(), "m1".into()];
        let mut batch = Native::Volume(Box::new(VolumeQueueBatch::over(members, names, chunk, 64)));
        // Operations 0..slow in even chunks (member 0), the last in the second chunk (member 1).
        let at = |i: usize| if i < slow { 2 * i as u64 * chunk } else { chunk };
        let ops: Vec<AsyncOp> = (0..=slow)
            .map(|i| AsyncOp { op: Op::Read, buf: buf.clone(), args: AsyncArgs::new(4096, at(i) as i64, 0) })
            .collect();
        let entries = (0..=slow).map(|i| read_entry(&buf, i as u64, at(i), 4096)).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let run_ops = ops.clone();
        let started = Instant::now();
        let run = std::thread::spawn(move || {
            let sound = run_on_batch(&st, &mut batch, entries, &run_ops);
            let _ = tx.send((sound, started.elapsed()));
            (batch, st, mocks, devs)
        });
        let (sound, took) = rx.recv_timeout(Duration::from_secs(20)).expect("the group still waits for its hung piece");
        drop(stepper);
        assert!(!sound, "a batch that had to cancel is retired");
        // Member 0's pieces alone take 4 s; until its last, any piece of it ended the group's
        // quiet time.
        assert!(took < Duration::from_secs(3), "the hang was found after {took:?}");
        drop(run.join().unwrap());
        let got: Vec<i64> = ops.iter().map(|o| o.args.result()).collect();
        let timed_out = -(libc::ETIMEDOUT as i64);
        assert_eq!(got[slow], timed_out, "{got:?}");
        assert!(got[..slow].iter().all(|&r| r == 4096 || r == timed_out), "{got:?}");
        assert!(got[..slow].contains(&timed_out), "member 0 was still at work: {got:?}");
    }

    #[test]
    fn a_group_started_at_once_is_over_before_its_failed_wait_is_reported() {
        let sio = StreamIo::new(Arc::new(NoWaits(CpuStream::new().unwrap()))).unwrap();
        let engine = Engine::new(1).unwrap();
        // (started, finished)
        let seen = Arc::new(Mutex::new((false, false)));
        let s = seen.clone();
        let job: StreamJob = Box::new(move || {
            s.lock().unwrap().0 = true;
            // I/O that takes a while, into memory the caller would free on hearing of a failure.
            std::thread::sleep(Duration::from_millis(100));
            s.lock().unwrap().1 = true;
        });
        assert!(sio.submit_jobs(&engine, vec![job]).is_err(), "the wait could not be queued");
        let (started, finished) = *seen.lock().unwrap();
        assert!(!started || finished, "reported failed while its I/O still ran");
    }
}

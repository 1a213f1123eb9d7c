//! The fallback path's batch: a [`crate::StorageBatch`] on a file or block device owns an
//! io_uring of its own, sized to its capacity, and puts every entry's reads and writes in flight
//! on it at once: no worker thread, no hand-off per entry. Entries larger than one command
//! ([`PIECE`]) become several, all in flight. GPU memory is staged: a read lands in pinned
//! memory of the batch's own and its copy to the device starts as soon as the read completes; a
//! write's copy to the host runs first, then the write. An entry is reported when its last step
//! is done; `status` polls the copy queues and never blocks on them.
//!
//! Memory rules (docs/design.md, memory invariants 1 and 2): every entry holds its buffer's lease until the kernel and its copy
//! are done with the memory. When the ring must be given up with requests in it (an
//! `io_uring_enter` error), an `InFlight` token keeps the ring, and one per entry keeps those
//! entries' leases and staging memory, as on the synchronous path; when a copy queue fails,
//! tokens keep the queue and its entries' leases and staging memory for good. Dropping the batch
//! waits for everything in flight.

use crate::batch::{Entry, EventSink, IoEvent, IoStatus, Op};
use crate::buffer::{Mem, Path};
use crate::error::{Error, Result};
use crate::fallback::{io_err, PIECE};
use crate::gpu::STAGING_CHUNK;
use crate::inflight::{InFlight, Why};
use crate::mem::HostMemory;
use crate::storage::{ConcretePath, Storage};
use io_uring::{opcode, types, IoUring};
use staging_slots::{Stage, Staging};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod staging_slots;
#[cfg(test)]
mod tests;

/// Unaligned host entries up to this size bounce through aligned memory of their own; larger
/// ones are left to the worker threads (whose bounce is one reused piece).
const BOUNCE_MAX: u64 = 4 << 20;
/// Most commands in the ring at once (also its size, so the completion queue never overflows).
const MAX_RING: usize = 1024;

/// Where an entry's disk transfer reads or writes.
#[derive(Debug)]
enum Via {
    /// The buffer's own host memory (aligned for O_DIRECT).
    Host,
    /// Aligned memory of the entry's own (host memory that is not aligned).
    Bounce(HostMemory),
    /// Pinned staging memory (GPU memory).
    Staged(Stage),
}

/// The step an entry is at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A write's copy from the device into its staging memory runs.
    ToHost,
    /// The disk transfer: pieces waiting for room in the ring, or in it.
    Disk,
    /// A read's copy from its staging memory to the device runs.
    ToDevice,
}

/// An entry in flight.
struct Req {
    e: Entry,
    via: Via,
    phase: Phase,
    /// Bytes whose pieces went to the ring (set to the length once a piece failed or came up
    /// short: nothing after it is data).
    queued: u64,
    /// Its pieces in the ring.
    in_ring: u32,
    /// The end of the data when a piece came up short (end of file).
    short: Option<u64>,
    /// The first failure.
    error: Option<Error>,
}

impl Req {
    fn bytes(&self) -> u64 {
        self.short.unwrap_or(self.e.len)
    }
}

/// A batch's own io_uring on a file target and the entries in flight on it.
///
/// # Invariants
///
/// `fd` is the descriptor of the file target of `storage`, which the batch holds. Memory an
/// entry's pieces name stays valid and untouched by the CPU while the pieces are in the ring:
/// an entry is finished only once `in_ring` is 0, or leaked together with the ring.
pub(crate) struct RingBatch {
    /// Held so that the file target, and with it `fd`, stays open.
    storage: Arc<Storage>,
    fd: i32,
    path: String,
    direct: bool,
    align: u64,
    ring: Option<IoUring>,
    ring_size: u32,
    /// Commands in the ring.
    in_ring: u32,
    reqs: Vec<Option<Req>>,
    free: Vec<usize>,
    /// Entries with pieces waiting for room in the ring, in order.
    waiting: VecDeque<usize>,
    ready: Vec<(IoEvent, Path)>,
    /// Staging for the one GPU whose memory this batch stages (the first it saw).
    stage: Option<Staging>,
    /// Entries taken since the batch was made (tests tell the ring from the worker threads).
    taken: u64,
}

impl std::fmt::Debug for RingBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RingBatch({} of {} in flight, {} commands in the ring)",
            self.in_flight(),
            self.reqs.len(),
            self.in_ring
        )
    }
}

fn ring(entries: u32) -> Result<IoUring> {
    IoUring::new(entries).map_err(|e| io_err("io_uring_setup", e))
}

impl RingBatch {
    /// A batch of `capacity` entries on `storage`, which must be a file target.
    pub(crate) fn new(storage: &Arc<Storage>, capacity: usize) -> Result<RingBatch> {
        let ConcretePath::File(f) = storage.concrete_path() else {
            return Err(Error::invalid("storage", "not a file target"));
        };
        // CAST: at most MAX_RING.
        let ring_size = capacity.next_power_of_two().clamp(8, MAX_RING) as u32;
        Ok(RingBatch {
            fd: f.raw_fd(),
            path: f.path().to_string(),
            direct: f.direct(),
            align: f.align(),
            storage: storage.clone(),
            ring: Some(ring(ring_size)?),
            ring_size,
            in_ring: 0,
            reqs: (0..capacity).map(|_| None).collect(),
            free: (0..capacity).rev().collect(),
            waiting: VecDeque::with_capacity(capacity),
            ready: Vec::with_capacity(capacity),
            stage: None,
            taken: 0,
        })
    }

    /// Entries in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.reqs.len() - self.free.len()
    }

    /// Entries taken since the batch was made.
    pub(crate) fn taken(&self) -> u64 {
        self.taken
    }

    /// Whether this batch runs an entry of `len` bytes at `buf_offset` of `buf` (the rest go to
    /// the worker threads): host memory (unaligned only up to [`BOUNCE_MAX`]), and GPU memory
    /// up to a staging chunk, of the one GPU the batch stages.
    pub(crate) fn takes(&mut self, buf: &crate::Buffer, buf_offset: u64, len: u64) -> bool {
        match buf.mem() {
            Mem::Host { ptr, .. } => {
                let aligned = (*ptr as u64).wrapping_add(buf_offset).is_multiple_of(self.align);
                !self.direct || aligned || len <= BOUNCE_MAX
            }
            Mem::Gpu(g) if len <= STAGING_CHUNK as u64 => {
                self.stage.get_or_insert_with(|| Staging::new(g.gpu().clone())).is_for(g.gpu())
            }
            Mem::Gpu(_) => false,
        }
    }

    /// Puts `entries` in flight (the caller checked they fit the capacity and that the batch
    /// takes each); an entry that cannot start becomes a failed event.
    pub(crate) fn submit(&mut self, entries: impl IntoIterator<Item = Entry>) -> Result<()> {
        for e in entries {
            let Some(idx) = self.free.pop() else {
                let error = Some(Error::invalid("reqs", "the batch is full"));
                let ev = IoEvent { cookie: e.cookie, status: IoStatus::Failed, bytes: 0, error };
                self.ready.push((ev, e.lease.buffer().path()));
                continue;
            };
            self.taken += 1;
            let (cookie, path) = (e.cookie, e.lease.buffer().path());
            match self.start(idx, e) {
                Ok(()) => {}
                Err(err) if self.reqs[idx].is_some() => self.finish(idx, Err(err), None),
                // Refused before it held anything (its lease went with it).
                Err(err) => {
                    self.free.push(idx);
                    let ev = IoEvent { cookie, status: IoStatus::Failed, bytes: 0, error: Some(err) };
                    self.ready.push((ev, path));
                }
            }
        }
        self.pump();
        Ok(())
    }

    /// Sets up entry `idx`: its staging or bounce memory, and a write's first copy.
    fn start(&mut self, idx: usize, e: Entry) -> Result<()> {
        let len = e.len as usize;
        let write = e.op == Op::Write;
        let via = match e.lease.buffer().mem() {
            Mem::Host { ptr, .. } => {
                let p = ptr.wrapping_add(e.buf_offset as usize);
                if !self.direct || (p as u64).is_multiple_of(self.align) {
                    Via::Host
                } else {
                    let b = HostMemory::new(len)?;
                    if write {
                        // SAFETY: `p..p+len` lies in the leased buffer (the storage checked the
                        // range), which the I/O lease keeps out of other CPU hands; `b` is a
                        // fresh mapping of at least `len` bytes.
                        unsafe { std::ptr::copy_nonoverlapping(p, b.as_ptr(), len) };
                    }
                    Via::Bounce(b)
                }
            }
            Mem::Gpu(_) => {
                let st =
                    self.stage.as_mut().ok_or_else(|| Error::invalid("buf", "GPU memory the batch did not take"))?;
                Via::Staged(st.take(len)?)
            }
        };
        let dev = match e.lease.buffer().mem() {
            Mem::Gpu(g) => Some(g.device_ptr() + e.buf_offset),
            Mem::Host { .. } => None,
        };
        let phase = if write && dev.is_some() { Phase::ToHost } else { Phase::Disk };
        self.reqs[idx] = Some(Req { e, via, phase, queued: 0, in_ring: 0, short: None, error: None });
        match (phase, dev) {
            (Phase::ToHost, Some(src)) => self.copy(idx, true, src, len),
            _ => {
                self.waiting.push_back(idx);
                Ok(())
            }
        }
    }

    /// Starts entry `idx`'s copy of `len` bytes between its staging memory and device address
    /// `dev` (to the host when `to_host`).
    fn copy(&mut self, idx: usize, to_host: bool, dev: u64, len: usize) -> Result<()> {
        let (Some(Req { via: Via::Staged(s), .. }), Some(st)) = (self.reqs[idx].as_ref(), self.stage.as_mut()) else {
            return Err(Error::invalid("staging", "the entry has no staging memory"));
        };
        // SAFETY: `dev..dev+len` lies in the entry's GPU buffer (the storage checked the range),
        // of the GPU this staging is for (`takes`), which the entry's lease keeps allocated; `s`
        // holds at least `len` bytes (a slot for entries up to a slot, else a chunk) and stays
        // with the entry until `poll` reports it.
        unsafe { st.copy(idx, s, to_host, dev, len) }
    }

    /// Ends entry `idx` with `outcome`. With a token (`in_flight`), the kernel or a copy may
    /// still use its memory: the token keeps its lease and staging or bounce memory for good.
    fn finish(&mut self, idx: usize, outcome: Result<u64>, mut in_flight: Option<InFlight>) {
        let Some(r) = self.reqs[idx].take() else { return };
        self.free.push(idx);
        let (cookie, path) = (r.e.cookie, r.e.lease.buffer().path());
        match (r.via, in_flight.as_mut()) {
            (Via::Staged(stage), t) => {
                if let Some(st) = self.stage.as_mut() {
                    st.release(stage, t);
                }
            }
            (Via::Bounce(b), Some(t)) => t.hold(b),
            (Via::Bounce(_) | Via::Host, _) => {}
        }
        match in_flight {
            Some(t) => t.holding(r.e.lease).keep(),
            // The entry lets go of its buffer before it counts as finished: whoever waits for
            // it may deregister the buffer at once.
            None => drop(r.e),
        }
        let ev = match outcome {
            Ok(bytes) => IoEvent { cookie, status: IoStatus::Complete, bytes, error: None },
            Err(e) => IoEvent { cookie, status: IoStatus::Failed, bytes: 0, error: Some(e) },
        };
        self.ready.push((ev, path));
    }

    /// Queues waiting pieces while the ring has room, and submits them.
    fn pump(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        if self.ring.is_none() {
            match ring(self.ring_size) {
                Ok(r) => self.ring = Some(r),
                Err(e) => {
                    // Nothing of these entries is in a ring: they end normally.
                    let msg = e.to_string();
                    while let Some(idx) = self.waiting.pop_front() {
                        let err = Error::invalid("ring", format!("a new ring after a failed one: {msg}"));
                        self.finish(idx, Err(err), None);
                    }
                    return;
                }
            }
        }
        let Some(ring) = self.ring.as_mut() else { return };
        let fd = types::Fd(self.fd);
        let mut stuck = Vec::new();
        while self.in_ring < self.ring_size {
            let Some(&idx) = self.waiting.front() else { break };
            let Some(r) = self.reqs[idx].as_mut().filter(|r| r.phase == Phase::Disk && r.queued < r.e.len) else {
                self.waiting.pop_front();
                continue;
            };
            let at = r.queued;
            // CAST: a piece is at most PIECE (1 MiB) bytes.
            let n = (PIECE as u64).min(r.e.len - at) as u32;
            let base = match &r.via {
                Via::Host => match r.e.lease.buffer().mem() {
                    Mem::Host { ptr, .. } => Some(ptr.wrapping_add(r.e.buf_offset as usize)),
                    Mem::Gpu(_) => None,
                },
                Via::Bounce(b) => Some(b.as_ptr()),
                Via::Staged(stage) => self.stage.as_ref().map(|st| st.ptr(stage)),
            };
            let Some(base) = base else {
                // Cannot happen (`start` pairs memory and staging): end the entry, not the batch.
                r.error.get_or_insert(Error::invalid("buf", "no memory for the transfer"));
                r.queued = r.e.len;
                self.waiting.pop_front();
                if r.in_ring == 0 {
                    stuck.push(idx);
                }
                continue;
            };
            let p = base.wrapping_add(at as usize);
            let user_data = ((idx as u64) << 32) | (at / PIECE as u64);
            let sqe = match r.e.op {
                Op::Write => opcode::Write::new(fd, p, n).offset(r.e.dev_offset + at).build(),
                Op::Read => opcode::Read::new(fd, p, n).offset(r.e.dev_offset + at).build(),
            }
            .user_data(user_data);
            // SAFETY: `p..p+n` is the entry's memory (its leased buffer, or bounce or staging
            // memory it owns), valid and untouched by the CPU until this piece is reaped: the
            // entry is finished only when none of its pieces is in the ring, or leaked with it.
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                break;
            }
            r.queued += u64::from(n);
            r.in_ring += 1;
            self.in_ring += 1;
            if r.queued >= r.e.len {
                self.waiting.pop_front();
            }
        }
        let submitted = loop {
            match ring.submit() {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // No room for completions now: the next wait submits them.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN)) => break Ok(()),
                Err(e) => break Err(e),
                Ok(_) => break Ok(()),
            }
        };
        stuck.into_iter().for_each(|idx| self.disk_done(idx));
        self.flush_copies();
        if let Err(e) = submitted {
            self.abandon(e);
        }
    }

    /// Reaps what the ring completed, without waiting.
    fn reap(&mut self) {
        let Some(ring) = self.ring.as_mut() else { return };
        let done: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (user_data, res) in done {
            self.in_ring -= 1;
            let idx = (user_data >> 32) as usize;
            let at = (user_data & 0xffff_ffff) * PIECE as u64;
            let Some(r) = self.reqs.get_mut(idx).and_then(Option::as_mut) else { continue };
            r.in_ring -= 1;
            let n = (PIECE as u64).min(r.e.len - at);
            if res < 0 {
                let what = if r.e.op == Op::Write { "write" } else { "read" };
                let e = io_err(
                    format!("{what} {} at {}", self.path, r.e.dev_offset + at),
                    std::io::Error::from_raw_os_error(-res),
                );
                r.error.get_or_insert(e);
                r.queued = r.e.len;
            } else if (res as u64) < n {
                let end = at + res as u64;
                r.short = Some(r.short.map_or(end, |s| s.min(end)));
                r.queued = r.e.len;
            }
            if r.in_ring == 0 && r.queued >= r.e.len {
                self.disk_done(idx);
            }
        }
        self.flush_copies();
    }

    /// Starts the copies to the device that completed reads asked for (one call for all); an
    /// entry whose copy failed ends with the failure, its memory kept for good when the copy
    /// may still run.
    fn flush_copies(&mut self) {
        let Some(st) = self.stage.as_mut() else { return };
        let mut failed = Vec::new();
        st.flush(&mut failed);
        self.copies_failed(failed);
    }

    /// Ends the entries whose copies failed, each with its reason and, when its copy may still
    /// run, a token.
    fn copies_failed(&mut self, failed: Vec<(usize, String, Option<InFlight>)>) {
        for (idx, reason, in_flight) in failed {
            self.finish(idx, Err(Error::Gpu { op: "staging copy", reason }), in_flight);
        }
    }

    /// Entry `idx`'s disk transfer is over: unbounce, start its copy to the device, or end it.
    fn disk_done(&mut self, idx: usize) {
        let Some(r) = self.reqs[idx].as_mut() else { return };
        if let Some(e) = r.error.take() {
            return self.finish(idx, Err(e), None);
        }
        let bytes = r.bytes();
        let read = r.e.op == Op::Read;
        match (&r.via, r.e.lease.buffer().mem()) {
            (Via::Bounce(b), Mem::Host { ptr, .. }) if read => {
                // SAFETY: the bounce memory holds the `bytes` just read; the destination lies in
                // the leased buffer (range checked by the storage), out of other CPU hands.
                unsafe {
                    std::ptr::copy_nonoverlapping(b.as_ptr(), ptr.wrapping_add(r.e.buf_offset as usize), bytes as usize)
                };
                self.finish(idx, Ok(bytes), None)
            }
            (Via::Staged(_), Mem::Gpu(g)) if read && bytes > 0 => {
                r.phase = Phase::ToDevice;
                let dev = g.device_ptr() + r.e.buf_offset;
                if let Err(e) = self.copy(idx, false, dev, bytes as usize) {
                    self.finish(idx, Err(e), None);
                }
            }
            _ => self.finish(idx, Ok(bytes), None),
        }
    }

    /// Polls the copy queues: finished writes' copies send them to disk, finished reads'
    /// copies end them. A failed queue's entries are leaked with its staging memory.
    fn poll_copies(&mut self) -> bool {
        let Some(st) = self.stage.as_mut() else { return false };
        let (mut done, mut failed) = (Vec::new(), Vec::new());
        let busy = st.poll(&mut done, &mut failed);
        for idx in done {
            let Some(r) = self.reqs[idx].as_mut() else { continue };
            if r.phase == Phase::ToHost {
                r.phase = Phase::Disk;
                self.waiting.push_back(idx);
            } else {
                let bytes = r.bytes();
                self.finish(idx, Ok(bytes), None);
            }
        }
        self.copies_failed(failed);
        busy
    }

    /// Gives up the ring after `e`: it is leaked with the entries that have pieces in it (their
    /// requests may still move data); the others carry on on a new ring.
    fn abandon(&mut self, e: std::io::Error) {
        if let Some(ring) = self.ring.take() {
            InFlight::new(Why::Ring).holding(ring).keep();
        }
        self.in_ring = 0;
        for idx in 0..self.reqs.len() {
            if self.reqs[idx].as_ref().is_some_and(|r| r.in_ring > 0) {
                let os = e.raw_os_error().map(std::io::Error::from_raw_os_error);
                let err = io_err("io_uring_enter", os.unwrap_or_else(|| std::io::Error::new(e.kind(), e.to_string())));
                self.finish(idx, Err(err), Some(InFlight::new(Why::Ring)));
            }
        }
    }

    /// Waits up to `timeout` for a completion (submitting what is queued).
    fn wait_ring(&mut self, timeout: Duration) {
        let Some(ring) = self.ring.as_mut() else { return };
        let r = if ring.params().is_feature_ext_arg() {
            let ts = types::Timespec::from(timeout);
            let args = types::SubmitArgs::new().timespec(&ts);
            ring.submitter().submit_with_args(1, &args)
        } else {
            // Kernels before 5.11 wait without a timeout: poll instead.
            let r = ring.submit();
            std::thread::sleep(timeout.min(Duration::from_micros(50)));
            r
        };
        match r {
            // Timed out, interrupted (the caller's loop retries), or no room for completions
            // until some are reaped.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)) => {}
            Err(e) => self.abandon(e),
            Ok(_) => {}
        }
    }

    /// One round of progress without waiting.
    fn progress(&mut self) -> bool {
        self.reap();
        let copying = self.poll_copies();
        self.pump();
        copying
    }

    /// Waits until at least `min` events are available (or `timeout` passed, or nothing is in
    /// flight) and appends all available events to `out` with the path their data took.
    pub(crate) fn status_into(&mut self, min: usize, timeout: Duration, out: &mut impl EventSink) -> Result<()> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let copying = self.progress();
            if self.ready.len() >= min || self.in_flight() == 0 {
                break;
            }
            let left = deadline.map_or(Duration::from_secs(1), |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                break;
            }
            if copying {
                // Copies take microseconds: poll them, reaping the ring meanwhile.
                std::hint::spin_loop();
            } else if self.in_ring > 0 {
                self.wait_ring(left.min(Duration::from_secs(1)));
            } else if self.waiting.is_empty() {
                // Nothing can progress (every entry ended): cannot happen while in flight.
                break;
            }
        }
        out.put_all(&mut self.ready);
        Ok(())
    }

    /// Waits for every entry in flight (the kernel and copies cannot be recalled) and returns
    /// all events.
    pub(crate) fn cancel(&mut self) -> Result<Vec<(IoEvent, Path)>> {
        let mut out = std::mem::take(&mut self.ready);
        while self.in_flight() > 0 {
            self.status_into(usize::MAX, Duration::from_secs(1), &mut out)?;
        }
        out.append(&mut self.ready);
        Ok(out)
    }
}

impl Drop for RingBatch {
    fn drop(&mut self) {
        if self.storage.in_forked_child() {
            // The parent's ring (its memory is shared with the parent) and staging: neither
            // cancelled nor torn down from a forked child.
            std::mem::forget(self.ring.take());
            std::mem::forget(self.stage.take());
            return;
        }
        // The ring and the staging memory are dropped after this wait: nothing uses them then
        // (or the ring was leaked with its requests, and their memory with it).
        let _ = self.cancel();
    }
}

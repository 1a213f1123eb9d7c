//! Batches of the C faces. A uGDS batch belongs to one handle; a cuFile batch's entries each
//! name their handle. Entries on registered memory that the storage takes as they are go to
//! that handle's [`StorageBatch`] (on the direct path: a queue pair of the batch's own, one
//! doorbell per submit); the rest (cuFile's unregistered or unaligned entries) run as staged
//! I/O on the storage's workers. Events are kept until `GetStatus` hands them out.

use super::library::{Face, IoKind, Library, Memory};
use super::types::uGDSIOSegParams;
use super::types::uGDSOpError::*;
use super::{CResult, Fail, Handle};
use crate::batch::{IoEvent, IoStatus, Op};
use crate::storage_batch::{IoRequest, StorageBatch};
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Largest batch (uGDS's and cuFile's default `max_batch_io_size`).
pub const MAX_BATCH: usize = 128;

/// A `GetStatus` timeout: NULL waits without limit; negative parts count as zero.
///
/// # Safety
///
/// `t` must be NULL or point to a valid `timespec`.
pub unsafe fn timeout_of(t: *const libc::timespec) -> Option<Duration> {
    if t.is_null() {
        return None;
    }
    // SAFETY: non-null, valid by the caller's contract.
    let t = unsafe { *t };
    Some(Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32))
}

/// How an entry ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventStatus {
    /// Done; `ret` is the bytes moved.
    Complete,
    /// The device or the OS failed it; `ret` is a negative errno.
    Failed,
    /// Refused before it ran; `ret` is a negative errno.
    Invalid,
    /// Cancelled before it ran.
    Canceled,
    /// Timed out (the controller was reset).
    Timeout,
}

/// One finished entry.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    /// The caller's cookie.
    pub cookie: *mut c_void,
    /// How it ended.
    pub status: EventStatus,
    /// Bytes, or a negative errno.
    pub ret: isize,
}

// SAFETY: the cookie is the caller's opaque value, handed back and never dereferenced.
unsafe impl Send for Event {}

/// One entry as a face hands it over.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// The handle (uGDS: the batch's).
    pub fh: usize,
    /// Write (else read).
    pub write: bool,
    /// Memory base.
    pub base: usize,
    /// Offset from the base.
    pub buf_offset: i64,
    /// Offset in the file.
    pub file_offset: i64,
    /// Bytes.
    pub size: usize,
    /// Returned with its event.
    pub cookie: *mut c_void,
}

/// A copy of a vectored entry's segments, moved to the worker that runs it.
struct Segs(Vec<super::types::uGDSIoSegment>);

// SAFETY: the segment bases are the caller's registered memory, used only as addresses to look
// up registrations; the memory's validity is the submit contract.
unsafe impl Send for Segs {}

/// Events of entries run as staged jobs, and how many still run.
#[derive(Default)]
struct Side {
    running: usize,
    events: Vec<Event>,
}

/// A batch.
pub struct CBatch {
    /// uGDS: the batch's handle (0 for cuFile).
    pub(crate) handle: usize,
    capacity: usize,
    per_handle: HashMap<usize, (Arc<Handle>, StorageBatch)>,
    side: Arc<(Mutex<Side>, Condvar)>,
    ready: VecDeque<Event>,
    /// The storage batches' events as `collect` takes them (kept: it allocates nothing).
    reaped: Vec<IoEvent>,
    /// Native entries: the caller's cookie, direction and submit time, by our id.
    cookies: HashMap<u64, (*mut c_void, bool, Instant)>,
    next: u64,
    /// Entries submitted since every earlier one was reported (uGDS's capacity rule).
    outstanding: usize,
    /// uGDS: the handle stays busy while the batch exists.
    hold: Option<Arc<Handle>>,
}

// SAFETY: the cookies are the caller's opaque values, never dereferenced; the rest is Send.
unsafe impl Send for CBatch {}

impl Drop for CBatch {
    fn drop(&mut self) {
        // Entries cannot be recalled: wait for them (StorageBatch's drop), then the side jobs.
        self.per_handle.clear();
        let (m, cv) = &*self.side;
        let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
        while st.running > 0 {
            st = cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(h) = self.hold.take() {
            h.inflight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn status_of(s: IoStatus) -> EventStatus {
    match s {
        IoStatus::Complete => EventStatus::Complete,
        IoStatus::Invalid => EventStatus::Invalid,
        IoStatus::Timeout => EventStatus::Timeout,
        IoStatus::Canceled => EventStatus::Canceled,
        IoStatus::Pending | IoStatus::Failed => EventStatus::Failed,
    }
}

impl Library {
    /// `BatchIOSetUp`: uGDS passes the handle; cuFile passes 0.
    pub fn batch_setup(&self, fh: usize, nr: u32) -> CResult<usize> {
        if self.face == Face::CuFile {
            self.require_open()?;
        }
        if nr == 0 || nr as usize > self.options().max_batch {
            return Err(Fail::Code(UGDS_INVALID_VALUE));
        }
        let mut b = CBatch {
            handle: fh,
            capacity: nr as usize,
            per_handle: HashMap::new(),
            side: Arc::default(),
            ready: VecDeque::new(),
            reaped: Vec::new(),
            cookies: HashMap::new(),
            next: 0,
            outstanding: 0,
            hold: None,
        };
        if self.face == Face::Ugds {
            let h = self.handle(fh).ok_or(Fail::Code(UGDS_INVALID_VALUE))?;
            // The queue pair is made here, not at the first submit.
            let sb = StorageBatch::new(&h.storage, nr as usize)?;
            h.inflight.fetch_add(1, Ordering::AcqRel);
            b.hold = Some(h.clone());
            b.per_handle.insert(fh, (h, sb));
        }
        Ok(self.batches.insert(Arc::new(Mutex::new(b))))
    }

    /// `BatchIOSubmit`. uGDS: an entry with a bad value refuses the whole call; an entry on
    /// memory that is not registered fails alone (its event says -EINVAL). cuFile: any memory,
    /// any alignment.
    ///
    /// # Safety
    ///
    /// The entries' memory must be valid for their ranges (registered memory is).
    pub unsafe fn batch_submit(&'static self, batch: usize, entries: &[Entry]) -> CResult<()> {
        let b = self.batches.get(batch).ok_or(Fail::Code(UGDS_INVALID_VALUE))?;
        let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
        if b.ready.is_empty() && b.in_flight() == 0 {
            b.outstanding = 0;
        }
        if entries.len() > b.capacity || b.outstanding + entries.len() > b.capacity {
            return Err(Fail::Code(UGDS_BATCH_CAPACITY_EXCEEDED));
        }
        if self.face == Face::Ugds {
            let h = b.hold.clone().ok_or(Fail::Code(UGDS_INVALID_VALUE))?;
            let bs = h.storage.block_size();
            let bad = |e: &Entry| {
                e.base == 0
                    || e.size == 0
                    || e.file_offset < 0
                    || e.buf_offset < 0
                    || !(e.file_offset as u64).is_multiple_of(bs)
                    || !(e.size as u64).is_multiple_of(bs)
            };
            if entries.iter().any(bad) {
                return Err(Fail::Code(UGDS_INVALID_VALUE));
            }
        }
        b.outstanding += entries.len();
        // Group the plain entries per handle; the rest run staged.
        let mut plain: HashMap<usize, Vec<IoRequest>> = HashMap::new();
        for e in entries {
            match self.batch_entry(&mut b, e) {
                Ok(Some(req)) => plain.entry(e.fh).or_default().push(req),
                Ok(None) => {}
                Err(f) => {
                    let st = if self.face == Face::Ugds { EventStatus::Failed } else { EventStatus::Invalid };
                    b.ready.push_back(Event { cookie: e.cookie, status: st, ret: f.ret_for(self.face) });
                }
            }
        }
        // A group the storage refuses after others went in is reported per entry (cancelled,
        // with an event each), so no entry is left without one; the call still says it failed.
        let mut refused = Vec::new();
        for (fh, reqs) in plain {
            let (_, sb) = b.per_handle.get_mut(&fh).ok_or(Fail::Code(UGDS_INTERNAL_ERROR))?;
            if sb.submit(&reqs).is_err() {
                refused.extend(reqs.iter().map(|r| r.cookie));
            }
        }
        if refused.is_empty() {
            return Ok(());
        }
        for id in refused {
            let cookie = b.cookies.remove(&id).map_or(std::ptr::null_mut(), |c| c.0);
            b.ready.push_back(Event { cookie, status: EventStatus::Failed, ret: -(libc::ECANCELED as isize) });
        }
        Err(Fail::Code(UGDS_INTERNAL_ERROR))
    }

    /// Prepares one entry: `Some` for the handle's storage batch, `None` when it was started as
    /// a staged job.
    fn batch_entry(&'static self, b: &mut CBatch, e: &Entry) -> CResult<Option<IoRequest>> {
        let h = self.handle(e.fh).ok_or(Fail::Errno(libc::EBADF))?;
        h.access.check(e.write)?;
        if e.file_offset < 0 || e.buf_offset < 0 || e.base == 0 {
            return Err(Fail::Errno(libc::EINVAL));
        }
        let bs = h.storage.block_size();
        let addr = e.base.checked_add(e.buf_offset as usize).ok_or(Fail::Errno(libc::EINVAL))?;
        let aligned =
            (e.file_offset as u64).is_multiple_of(bs) && (e.size as u64).is_multiple_of(bs) && addr.is_multiple_of(4);
        let reg = match self.buffer(e.base) {
            Some(entry) if aligned && e.size > 0 => {
                if (e.buf_offset as usize).checked_add(e.size).is_none_or(|end| end > entry.len) {
                    return Err(Fail::Errno(libc::EINVAL));
                }
                let off = match entry.mem {
                    Memory::Host => (entry.base & 4095) as u64,
                    Memory::Gpu(_) => 0,
                };
                Some((self.registration(&h, &entry)?, off))
            }
            _ if self.face == Face::Ugds => return Err(Fail::Errno(libc::EINVAL)),
            _ => None,
        };
        let Some((buf, off)) = reg else {
            // Staged: the sync path on a worker, with cuFile's rules. Its event carries the
            // caller's cookie directly.
            let entry = *e;
            // SAFETY: the submit contract covers the entry's memory until its event is read.
            b.spawn_side(self.face, &h, entry.cookie, move || unsafe {
                self.rw_as(
                    IoKind::Batch,
                    entry.write,
                    entry.fh,
                    entry.base,
                    entry.size,
                    entry.file_offset,
                    entry.buf_offset,
                )
            })?;
            return Ok(None);
        };
        // The handle's storage batch (on the direct path, a queue pair) is made for the first
        // entry that needs it, not for staged ones.
        if !b.per_handle.contains_key(&e.fh) {
            let sb = StorageBatch::new(&h.storage, b.capacity)?;
            b.per_handle.insert(e.fh, (h.clone(), sb));
        }
        b.next += 1;
        let id = b.next;
        b.cookies.insert(id, (e.cookie, e.write, Instant::now()));
        Ok(Some(IoRequest {
            op: if e.write { Op::Write } else { Op::Read },
            buf,
            buf_offset: off + e.buf_offset as u64,
            file_offset: e.file_offset as u64,
            len: e.size as u64,
            cookie: id,
        }))
    }

    /// `BatchIOSubmitv` (uGDS): vectored entries, each run as one vectored I/O. A bad value in
    /// any entry refuses the whole call; an entry whose segments are not registered fails
    /// alone (-EINVAL in its event).
    ///
    /// # Safety
    ///
    /// Each entry's `segs` must point to `nr_segs` segments.
    pub unsafe fn batch_submitv(&'static self, batch: usize, fh: usize, ps: &[uGDSIOSegParams]) -> CResult<()> {
        let b = self.batches.get(batch).ok_or(Fail::Code(UGDS_INVALID_VALUE))?;
        let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
        if b.ready.is_empty() && b.in_flight() == 0 {
            b.outstanding = 0;
        }
        if ps.len() > b.capacity || b.outstanding + ps.len() > b.capacity {
            return Err(Fail::Code(UGDS_BATCH_CAPACITY_EXCEEDED));
        }
        let h = self.handle(fh).ok_or(Fail::Code(UGDS_INVALID_VALUE))?;
        let bs = h.storage.block_size();
        let mut plans = Vec::with_capacity(ps.len());
        for p in ps {
            // SAFETY: the caller passes `nr_segs` segments per entry.
            let segs = unsafe { std::slice::from_raw_parts(p.segs, p.nr_segs as usize) }.to_vec();
            let bad = segs.iter().any(|g| {
                g.base.is_null()
                    || g.size == 0
                    || g.offset < 0
                    || g.offset % 4096 != 0
                    || !(g.size as u64).is_multiple_of(bs)
            });
            if bad || p.file_offset < 0 || !(p.file_offset as u64).is_multiple_of(bs) {
                return Err(Fail::Code(UGDS_INVALID_VALUE));
            }
            plans.push((Segs(segs), p.file_offset, p.opcode.0 == 1, p.cookie));
        }
        b.outstanding += plans.len();
        for (segs, foff, write, cookie) in plans {
            b.spawn_side(self.face, &h, cookie, move || {
                let segs = segs;
                // SAFETY: `segs` is our copy; the memory is registered (checked when it runs).
                unsafe { self.rwv(write, fh, segs.0.as_ptr(), segs.0.len() as u32, foff) }
            })?;
        }
        Ok(())
    }

    /// `BatchIOGetStatus`: waits until `min_nr` events are ready (or `timeout` passed; `None`
    /// waits without limit) and returns up to `max` of them (0: the batch's capacity).
    pub fn batch_status(
        &self,
        batch: usize,
        min_nr: usize,
        max: usize,
        timeout: Option<Duration>,
    ) -> CResult<Vec<Event>> {
        let batch = self.batches.get(batch).ok_or(Fail::Code(UGDS_INVALID_VALUE))?;
        let (max, side) = {
            let b = batch.lock().unwrap_or_else(|e| e.into_inner());
            (if max == 0 { b.capacity } else { max }, b.side.clone())
        };
        let want = min_nr.min(max);
        // A timeout too large to represent is no timeout.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            let now = {
                let mut b = batch.lock().unwrap_or_else(|e| e.into_inner());
                // Counted before collecting: an entry that finishes in between is then either
                // collected now or still counted as running, never neither (found by uGDS's
                // test_batch_basic on the GPU machine: "got 0 of 1").
                let running = b.in_flight();
                b.collect(self, Duration::ZERO)?;
                let now = Instant::now();
                if b.ready.len() >= want || running == 0 || deadline.is_some_and(|d| now >= d) {
                    let n = b.ready.len().min(max);
                    return Ok(b.ready.drain(..n).collect());
                }
                now
            };
            // Wait without the batch's lock (a submitter on another thread is not held up):
            // on the staged jobs' condition variable, or briefly while native entries complete.
            let slice = deadline.map_or(Duration::from_millis(1), |d| (d - now).min(Duration::from_millis(1)));
            let (m, cv) = &*side;
            let st = m.lock().unwrap_or_else(|e| e.into_inner());
            if st.events.is_empty() && st.running > 0 {
                let _ = cv.wait_timeout(st, slice);
            } else {
                drop(st);
                std::thread::yield_now();
            }
        }
    }

    /// `BatchIOCancel` (cuFile): entries cannot be recalled from the SSD or the kernel, so this
    /// waits until every submitted entry has finished; their events stay collectable.
    pub fn batch_cancel(&self, batch: usize) -> CResult<()> {
        let b = self.batches.get(batch).ok_or(Fail::Code(UGDS_INVALID_VALUE))?;
        let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
        while b.in_flight() > 0 {
            b.collect(self, Duration::from_millis(1))?;
        }
        b.collect(self, Duration::ZERO)
    }

    /// `BatchIODestroy`: waits for the batch's entries, then forgets it.
    pub fn batch_destroy(&self, batch: usize) {
        drop(self.batches.remove(batch));
    }
}

impl CBatch {
    /// Runs `f` on the storage's workers; its result becomes an event with `cookie`.
    fn spawn_side(
        &mut self,
        face: Face,
        h: &Handle,
        cookie: *mut c_void,
        f: impl FnOnce() -> CResult<usize> + Send + 'static,
    ) -> CResult<()> {
        struct Cookie(*mut c_void);
        // SAFETY: the caller's opaque value, handed back, never dereferenced.
        unsafe impl Send for Cookie {}
        let engine = h.storage.engine()?;
        let side = self.side.clone();
        side.0.lock().unwrap_or_else(|e| e.into_inner()).running += 1;
        let c = Cookie(cookie);
        let job = move || {
            let c = c;
            let ev = match f() {
                Ok(n) => Event { cookie: c.0, status: EventStatus::Complete, ret: n as isize },
                Err(f) => Event { cookie: c.0, status: EventStatus::Failed, ret: f.ret_for(face) },
            };
            let (m, cv) = &*side;
            let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
            st.running -= 1;
            st.events.push(ev);
            cv.notify_all();
        };
        if let Err(err) = engine.spawn(job) {
            self.side.0.lock().unwrap_or_else(|e| e.into_inner()).running -= 1;
            return Err(Fail::Lib(err));
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        let side = self.side.0.lock().unwrap_or_else(|e| e.into_inner()).running;
        side + self.per_handle.values().map(|(_, sb)| sb.in_flight()).sum::<usize>()
    }

    /// Moves finished entries to `ready`, waiting up to `wait` for the side jobs.
    fn collect(&mut self, lib: &Library, wait: Duration) -> CResult<()> {
        let mut evs = std::mem::take(&mut self.reaped);
        for (_, sb) in self.per_handle.values_mut() {
            sb.status_into(0, Duration::ZERO, &mut evs)?;
        }
        for e in evs.drain(..) {
            let (cookie, write, since) =
                self.cookies.remove(&e.cookie).unwrap_or((std::ptr::null_mut(), false, Instant::now()));
            let status = status_of(e.status);
            let ret = match status {
                EventStatus::Complete => e.bytes as isize,
                _ => e.error.as_ref().map_or(-(libc::EIO as isize), |x| x.errno() as isize),
            };
            // Latency from submit to collection (an upper bound: it includes the reap delay).
            lib.observe(
                IoKind::Batch,
                write,
                e.bytes,
                since.elapsed().as_nanos() as u64,
                status == EventStatus::Complete,
            );
            self.ready.push_back(Event { cookie, status, ret });
        }
        self.reaped = evs;
        let (m, cv) = &*self.side;
        let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
        if st.events.is_empty() && st.running > 0 && !wait.is_zero() {
            st = cv.wait_timeout(st, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
        self.ready.extend(st.events.drain(..));
        Ok(())
    }
}

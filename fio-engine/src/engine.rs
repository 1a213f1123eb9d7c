//! The engine's state and I/O, in safe Rust over plain values: one [`Thread`] per fio job
//! thread (fio's `td->io_ops_data`), one [`Target`] per file of the job, opened by the library's
//! target resolver (`Storage::open_with`). The `extern "C"` ops in `lib.rs` translate fio's
//! structures to the calls here and back.

use crate::options::{QueueMode, Settings};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::{Buffer, Error, HostMemory, IoEvent, IoRequest, IoStatus, Op, OwnedQueue, Storage, StorageBatch};

/// fio's I/O buffers (`td->orig_buffer`), allocated by the engine (`iomem_alloc`) so that it
/// decides how long they stay mapped: never shorter than a registration that names them.
pub(crate) struct IoMem {
    /// `None` only once handed to `Drop`.
    mem: Option<HostMemory>,
    /// The bytes asked for, in whole pages: what is registered (the mapping is longer when
    /// rounded up to huge pages, and pinning the rest would only count against the job).
    len: usize,
    /// A registration of it may still be in use by the device (a lease kept for good after a
    /// failure the controller reset could not confirm): the mapping then stays for the life of
    /// the process, as `Storage::register_host` requires.
    keep: bool,
}

impl IoMem {
    /// At least `len` bytes of zeroed, page-aligned memory: the library's host memory of whole
    /// 2 MiB pages, so it comes from huge pages where the system has enough free (else from
    /// ordinary pages). A command's memory inside one huge page is one contiguous range, one
    /// data descriptor, where ordinary pages may take one per 4 KiB.
    pub(crate) fn new(len: usize) -> Result<IoMem, Error> {
        let len = len.max(1);
        let mem = HostMemory::new(len.next_multiple_of(HostMemory::HUGE_PAGE))?;
        Ok(IoMem { mem: Some(mem), len: len.next_multiple_of(4096), keep: false })
    }

    /// The start (what fio gets as `td->orig_buffer`).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.mem.as_ref().map_or(std::ptr::null_mut(), HostMemory::as_ptr)
    }

    /// Its length in bytes (the whole pages asked for).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The offset of `p` in the memory when `[p, p + len)` lies inside it.
    pub(crate) fn offset_of(&self, p: *const u8, len: u64) -> Option<u64> {
        let off = (p as usize).checked_sub(self.ptr() as usize)? as u64;
        (off.checked_add(len)? <= self.len() as u64).then_some(off)
    }
}

impl Drop for IoMem {
    fn drop(&mut self) {
        if self.keep {
            log::warn!("keeping fio's I/O buffers mapped: an I/O into them may still run on the device");
            // Leaked, so never unmapped.
            std::mem::forget(self.mem.take());
        }
        // Otherwise `mem` unmaps itself: every registration of it is gone
        // (`Thread::release_targets` ran first), so neither Rust nor the device refers to it.
    }
}

/// Where one fio file's I/O goes.
pub(crate) struct Target {
    name: String,
    storage: Arc<Storage>,
    /// fio's I/O buffers registered for this storage (absent for a job that moves no data).
    buf: Option<Arc<Buffer>>,
    /// iodepth 1 with `ugds_queue=owned`.
    owned: Option<OwnedQueue>,
    /// iodepth > 1: the thread's batch queue on this target.
    batch: Option<StorageBatch>,
    /// Queued since the last commit.
    pending: Vec<IoRequest>,
}

/// What a finished I/O reports to fio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    /// The I/O's key (the `io_u` address).
    pub(crate) key: u64,
    /// Bytes transferred.
    pub(crate) bytes: u64,
    /// errno, 0 on success.
    pub(crate) error: i32,
}

/// What `queue` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done now.
    Completed(Done),
    /// In the batch; reported by `getevents`.
    Queued,
    /// No room (or a flush waiting for I/O in flight): commit and reap first.
    Busy,
}

/// One fio request, as the engine sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Request {
    /// Read or write `len` bytes at `offset`, memory at `mem` in fio's buffers.
    Rw { write: bool, offset: u64, len: u64, mem: *const u8 },
    /// fsync / fdatasync.
    Flush,
    /// Anything else (trim, sync_file_range).
    Other(&'static str),
}

/// One fio job thread's engine state.
pub(crate) struct Thread {
    settings: Settings,
    depth: usize,
    mem: Option<IoMem>,
    /// By fio's file number.
    targets: Vec<Option<Target>>,
    /// Finished and not yet handed to fio.
    ready: VecDeque<Done>,
    /// What the last `getevents` returned, for `event(i)`.
    pub(crate) events: Vec<Done>,
    /// A batch's events as a reap takes them (kept: a reap allocates nothing).
    reaped: Vec<IoEvent>,
}

/// The errno for a library error (EIO for what has none).
fn errno(e: &Error) -> i32 {
    match e.errno() {
        0 => libc::EIO,
        n => n.abs(),
    }
}

/// A missing regular file that fio would create: a path whose directory exists, outside /dev
/// (where a missing name is a node that is not there, not a file to make).
fn creatable(name: &str) -> bool {
    let p = std::path::Path::new(name);
    !name.starts_with("/dev/")
        && !name.contains("://")
        && p.parent().is_some_and(|d| d.as_os_str().is_empty() || d.is_dir())
        && !p.exists()
}

/// Whether `name` is an NVMe/RDMA URI.
pub(crate) fn is_rdma_uri(name: &str) -> bool {
    name.starts_with("nvmeof://rdma/")
}

/// Why a job that fio runs as a process cannot reach an NVMe/RDMA target: fio sizes the target
/// in its main process and then forks the job, and the RDMA device contexts rdma-core opened
/// there do not work in a forked child (its Fabrics Connect fails with EACCES).
pub(crate) fn rdma_needs_threads(name: &str) -> Error {
    Error::Unsupported {
        what: "an NVMe/RDMA target in a fio job that runs as a process",
        why: format!("{name}: fio forks the job after sizing the target, and RDMA device contexts do not survive fork"),
        fix: "add thread=1 to the job (fio then runs it as a thread of its main process)",
    }
}

/// Opens `name` with the library's one target resolver. A missing regular file is created
/// first at `create_len` bytes (fio lays out files it does not find; the engine does what fio
/// would, since fio leaves files to engines that name their own targets).
pub(crate) fn open_storage(name: &str, s: &Settings, create_len: u64) -> Result<Arc<Storage>, Error> {
    match Storage::open_with(name, s.nsid, &s.device) {
        Err(Error::Open { source, .. }) if source.kind() == std::io::ErrorKind::NotFound && creatable(name) => {
            if create_len == 0 {
                return Err(Error::invalid(
                    "filename",
                    format!("{name} does not exist: give size= (or filesize=) for fio to create it"),
                ));
            }
            let f = std::fs::File::options()
                .write(true)
                .create_new(true)
                .open(name)
                .and_then(|f| f.set_len(create_len).map(|()| f));
            if let Err(source) = f {
                return Err(Error::Open { path: name.to_string(), source });
            }
            log::info!("{name}: created, {create_len} bytes");
            Storage::open_with(name, s.nsid, &s.device)
        }
        r => r,
    }
}

impl Thread {
    /// A thread's state for a job of `depth` (fio's iodepth).
    pub(crate) fn new(settings: Settings, depth: usize) -> Thread {
        Thread {
            settings,
            depth: depth.max(1),
            mem: None,
            targets: Vec::new(),
            ready: VecDeque::new(),
            events: Vec::new(),
            reaped: Vec::new(),
        }
    }

    /// Allocates fio's I/O buffers; returns their start.
    pub(crate) fn alloc_mem(&mut self, len: usize) -> Result<*mut u8, Error> {
        self.release_targets();
        self.mem = None;
        let m = IoMem::new(len)?;
        let p = m.ptr();
        self.mem = Some(m);
        Ok(p)
    }

    /// Drops every target (their batches wait for what they have in flight), then fio's
    /// buffers (kept mapped if a registration of them may still be used).
    pub(crate) fn free_mem(&mut self) {
        self.release_targets();
        self.mem = None;
    }

    /// Drops the targets, noting whether any registration keeps its lease for good.
    fn release_targets(&mut self) {
        for t in self.targets.drain(..).flatten() {
            let Target { storage, buf, owned, batch, pending, .. } = t;
            drop(pending);
            drop(batch);
            drop(owned);
            if let Some(b) = buf {
                if b.inflight() > 0 {
                    if let Some(m) = self.mem.as_mut() {
                        m.keep = true;
                    }
                }
            }
            drop(storage);
        }
    }

    /// The open target of file `fileno`.
    fn target(&mut self, fileno: usize) -> Option<&mut Target> {
        self.targets.get_mut(fileno).and_then(Option::as_mut)
    }

    /// Opens file `fileno` (`name`) unless it is open; returns its capacity.
    pub(crate) fn open(&mut self, fileno: usize, name: &str, create_len: u64) -> Result<u64, Error> {
        if let Some(t) = self.target(fileno) {
            return t.storage.capacity();
        }
        let storage = open_storage(name, &self.settings, create_len)?;
        let buf = match &self.mem {
            // SAFETY: the memory is the thread's IoMem, which outlives every target
            // (`free_mem` drops the targets first, and keeps the mapping for good when a lease
            // is kept); fio reads and writes its buffers only while no I/O on them runs.
            Some(m) => Some(Arc::new(unsafe { storage.register_host(m.ptr(), m.len()) }?)),
            None => None,
        };
        let owned = if self.depth == 1 && self.settings.queue == QueueMode::Owned {
            Some(storage.owned_queue()?)
        } else {
            None
        };
        let batch = if self.depth > 1 { Some(StorageBatch::new(&storage, self.depth)?) } else { None };
        let how = match (&owned, &batch) {
            (Some(q), _) => format!("iodepth 1 on a queue pair of this thread's own (qid {})", q.qid()),
            (_, Some(b)) if b.is_native() => format!("iodepth {}: a batch queue of this thread's own", self.depth),
            (_, Some(_)) => format!("iodepth {}: a batch on the storage's worker threads", self.depth),
            _ => "iodepth 1 on the shared queues".to_string(),
        };
        let mem = buf.as_ref().map(|b| format!(", buffers registered once ({} bytes, {})", b.len(), b.path()));
        log::info!("{name}: {}; {how}{}", storage.describe(), mem.unwrap_or_default());
        if self.depth > 1 && self.settings.queue == QueueMode::Owned {
            log::info!("{name}: ugds_queue=owned applies to iodepth 1; the batch queue is this thread's already");
        }
        let cap = storage.capacity()?;
        if self.targets.len() <= fileno {
            self.targets.resize_with(fileno + 1, || None);
        }
        self.targets[fileno] = Some(Target { name: name.to_string(), storage, buf, owned, batch, pending: Vec::new() });
        Ok(cap)
    }

    /// Starts (or, at iodepth 1, runs) one request of file `fileno`.
    pub(crate) fn queue(&mut self, fileno: usize, key: u64, req: Request) -> Outcome {
        let depth = self.depth;
        let Some(mem) = self.mem.as_ref() else {
            return Outcome::Completed(Done { key, bytes: 0, error: libc::ENOMEM });
        };
        let offset_in = |p, len| mem.offset_of(p, len);
        let Some(t) = self.targets.get_mut(fileno).and_then(Option::as_mut) else {
            log::error!("I/O on file {fileno}, which the engine has not opened");
            return Outcome::Completed(Done { key, bytes: 0, error: libc::EBADF });
        };
        let fail = |t: &Target, what: &str, e: Error| {
            log::error!("{}: {what}: {e}", t.name);
            Outcome::Completed(Done { key, bytes: 0, error: errno(&e) })
        };
        match req {
            Request::Rw { write, offset, len, mem } => {
                let (Some(buf), Some(buf_offset)) = (t.buf.clone(), offset_in(mem, len)) else {
                    let e = Error::invalid("buf", "outside fio's I/O buffers, which the engine registered");
                    return fail(t, "I/O", e);
                };
                let what = if write { "write" } else { "read" };
                if let Some(b) = t.batch.as_ref() {
                    if t.pending.len() + b.in_flight() >= depth {
                        return Outcome::Busy;
                    }
                    let op = if write { Op::Write } else { Op::Read };
                    t.pending.push(IoRequest { op, buf, buf_offset, file_offset: offset, len, cookie: key });
                    return Outcome::Queued;
                }
                let r = match (t.owned.as_mut(), write) {
                    (Some(q), true) => q.write(&buf, buf_offset, offset, len),
                    (Some(q), false) => q.read(&buf, buf_offset, offset, len),
                    (None, true) => t.storage.write(&buf, buf_offset, offset, len),
                    (None, false) => t.storage.read(&buf, buf_offset, offset, len),
                };
                match r {
                    Ok(n) => Outcome::Completed(Done { key, bytes: n, error: 0 }),
                    Err(e) => fail(t, &format!("{what} of {len} bytes at {offset}"), e),
                }
            }
            Request::Flush => {
                // Ordered after the writes before it: wait until they are reaped.
                if !t.pending.is_empty() || t.batch.as_ref().is_some_and(|b| b.in_flight() > 0) {
                    return Outcome::Busy;
                }
                match t.storage.flush() {
                    Ok(()) => Outcome::Completed(Done { key, bytes: 0, error: 0 }),
                    Err(e) => fail(t, "flush", e),
                }
            }
            Request::Other(what) => {
                log::error!("{}: {what} is not supported by the ugds engine", t.name);
                Outcome::Completed(Done { key, bytes: 0, error: libc::EOPNOTSUPP })
            }
        }
    }

    /// Submits what was queued: one call, so one doorbell, per target's batch. While finished
    /// I/Os wait to be handed to fio, the submission waits too, and the first `getevents` those
    /// events cannot answer makes it before it reaps. fio's defaults take one event per
    /// `getevents` and commit each new I/O on its own, which rang the doorbell once per I/O (a
    /// trip through the emulator's lock under QEMU) where one ring can carry every I/O queued
    /// while those events were handed out (4 KiB reads on a null-backed controller: 86k to 99k
    /// IOPS at iodepth 8 to 128 in the VM, 159k to 268k with fio told to take and submit in
    /// batches). Nothing is held back past a wait.
    pub(crate) fn commit(&mut self) {
        if self.ready.is_empty() {
            self.submit_pending();
        }
    }

    /// Submits every target's queued requests.
    fn submit_pending(&mut self) {
        for t in self.targets.iter_mut().flatten() {
            if t.pending.is_empty() {
                continue;
            }
            let Some(b) = t.batch.as_mut() else { continue };
            if let Err(e) = b.submit(&t.pending) {
                log::error!("{}: submitting {} I/Os: {e}", t.name, t.pending.len());
                let error = errno(&e);
                self.ready.extend(t.pending.iter().map(|r| Done { key: r.cookie, bytes: 0, error }));
            }
            t.pending.clear();
        }
    }

    /// Moves finished I/Os into `events` (at most `max`), waiting up to `timeout` (`None`: as
    /// long as it takes) until there are `min`; returns how many.
    pub(crate) fn getevents(&mut self, min: usize, max: usize, timeout: Option<Duration>) -> usize {
        self.events.clear();
        // Events already here answer the call: the device is not asked, and what `commit` held
        // stays queued (see there).
        if max > 0 && self.ready.len() >= max {
            self.events.extend(self.ready.drain(..max));
            return max;
        }
        self.submit_pending();
        let start = Instant::now();
        loop {
            // Counted before reaping: a batch counts an entry that completed but was not reaped
            // (one a worker thread ran, on a volume) as no longer in flight, so an entry that
            // finished between the reap below and a count after it would be left behind, its
            // event never returned (fio then verifies only what came back before it).
            let idle = self.in_flight() == 0;
            for i in 0..self.targets.len() {
                self.reap(i, 0, Duration::ZERO);
            }
            while self.events.len() < max {
                match self.ready.pop_front() {
                    Some(d) => self.events.push(d),
                    None => break,
                }
            }
            // Nothing was in flight: what is here is all there will be.
            if self.events.len() >= min || idle {
                return self.events.len();
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) if !l.is_zero() => l,
                    _ => return self.events.len(),
                },
                // No deadline: wait in slices, so the loop comes round to every target.
                None => Duration::from_secs(1),
            };
            let want = min - self.events.len();
            let busy: Vec<usize> = (0..self.targets.len())
                .filter(|&i| self.targets[i].as_ref().and_then(|t| t.batch.as_ref()).is_some_and(|b| b.in_flight() > 0))
                .collect();
            // One target busy (the usual job): its batch waits (polling, or asleep on the
            // interrupt). Several: each is polled in turn.
            if let [i] = busy[..] {
                self.reap(i, want, left);
            } else {
                for i in busy {
                    self.reap(i, 0, Duration::ZERO);
                }
                std::thread::yield_now();
            }
        }
    }

    /// I/Os in the batches.
    fn in_flight(&self) -> usize {
        self.targets.iter().flatten().filter_map(|t| t.batch.as_ref()).map(StorageBatch::in_flight).sum()
    }

    /// Reaps target `i`'s batch: at least `min` events within `wait`.
    fn reap(&mut self, i: usize, min: usize, wait: Duration) {
        let Some(t) = self.targets.get_mut(i).and_then(Option::as_mut) else { return };
        let Some(b) = t.batch.as_mut() else { return };
        match b.status_into(min, wait, &mut self.reaped) {
            Ok(_) => {
                for e in self.reaped.drain(..) {
                    self.ready.push_back(done(&t.name, e));
                }
            }
            Err(e) => log::error!("{}: waiting for completions: {e}", t.name),
        }
    }
}

/// A batch event as fio's result.
fn done(name: &str, e: IoEvent) -> Done {
    let key = e.cookie;
    if e.status == IoStatus::Complete {
        return Done { key, bytes: e.bytes, error: 0 };
    }
    match &e.error {
        Some(err) => log::error!("{name}: I/O {:?}: {err}", e.status),
        None => log::error!("{name}: I/O {:?}", e.status),
    }
    Done { key, bytes: 0, error: e.error.as_ref().map_or(libc::EIO, errno) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Sleeps this long on every error it is given (0: not at all), so that a test can hold a
    /// thread inside the engine's reaping while other I/O finishes.
    static SLEEP_ON_ERROR_MS: AtomicU64 = AtomicU64::new(0);

    struct SlowOnErrors;

    impl log::Log for SlowOnErrors {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.level() == log::Level::Error
        }
        fn log(&self, r: &log::Record) {
            if r.level() == log::Level::Error {
                std::thread::sleep(Duration::from_millis(SLEEP_ON_ERROR_MS.load(Ordering::Relaxed)));
            }
        }
        fn flush(&self) {}
    }

    #[test]
    fn an_rdma_target_in_a_forked_job_is_refused_by_name() {
        let uri = "nvmeof://rdma/10.0.0.1:4420/nqn.x?nsid=1";
        assert!(is_rdma_uri(uri));
        assert!(!is_rdma_uri("nvmeof://tcp/10.0.0.1:4420/nqn.x?nsid=1") && !is_rdma_uri("/dev/ugds_drv0"));
        let e = rdma_needs_threads(uri).to_string();
        assert!(e.contains(uri) && e.contains("add thread=1"), "{e}");
    }

    /// Free 2 MiB huge pages, from `/proc/meminfo`.
    fn free_huge_pages() -> u64 {
        let m = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        m.lines().find_map(|l| l.strip_prefix("HugePages_Free:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    }

    /// fio's buffers come from huge pages while enough are free, from ordinary pages otherwise;
    /// either way they are zeroed, writable and at least as long as asked.
    #[test]
    fn io_mem_comes_from_huge_pages_while_enough_are_free() {
        let want = 3 << 20;
        let huge = free_huge_pages() >= 2;
        let m = IoMem::new(want).expect("memory");
        // What is registered is what was asked (whole pages), not the huge-page rounding.
        assert_eq!(m.len(), want);
        // SAFETY: `m` owns `m.len()` bytes of readable, writable memory at `m.ptr`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(m.ptr(), m.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[want - 1] = 7;
        assert_eq!(
            ugds::test_utils::smaps_kb(m.ptr(), "KernelPageSize"),
            Some(if huge { 2048 } else { 4 }),
            "huge pages free: {huge}"
        );
    }

    /// A commit made while finished I/Os wait to be handed to fio is held, and goes to the
    /// device (in one submission) only when a `getevents` finds those events gone; an I/O is
    /// never held past a wait.
    #[test]
    fn a_commit_waits_while_finished_ios_wait_for_fio() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        let mut t = Thread::new(Settings::from(None), 4);
        let base = t.alloc_mem(4 * 4096).expect("memory");
        t.open(0, file.to_str().expect("utf-8"), 1 << 20).expect("open");
        // Page `i` of the memory allocated above.
        let read = |i: usize| Request::Rw {
            write: false,
            offset: i as u64 * 4096,
            len: 4096,
            mem: base.wrapping_add(i * 4096),
        };
        let queued = |t: &Thread| t.targets[0].as_ref().map_or(0, |x| x.pending.len());
        let in_flight = |t: &Thread| t.in_flight();
        for k in [1, 2] {
            assert_eq!(t.queue(0, k, read(k as usize)), Outcome::Queued);
        }
        t.commit();
        assert_eq!((queued(&t), in_flight(&t)), (0, 2), "nothing waiting for fio: submitted at once");
        t.reap(0, 2, Duration::from_secs(10));
        assert_eq!(t.ready.len(), 2);
        assert_eq!(t.getevents(1, 1, None), 1);
        assert_eq!(t.queue(0, 3, read(3)), Outcome::Queued);
        t.commit();
        assert_eq!((queued(&t), in_flight(&t)), (1, 0), "held while an event waits for fio");
        assert_eq!(t.getevents(1, 1, None), 1);
        assert_eq!((queued(&t), in_flight(&t)), (1, 0), "answered from the waiting event");
        assert_eq!(t.getevents(1, 1, None), 1);
        assert_eq!(queued(&t), 0, "the wait submitted it");
        assert_eq!(t.events[0], Done { key: 3, bytes: 4096, error: 0 });
    }

    /// An entry that runs on the storage's worker threads (on a file: a read past the batch
    /// ring's bounce limit into memory O_DIRECT cannot take) and finishes while `getevents`
    /// reaps another file's event must still be returned: waiting for both returns both. fio
    /// waits this way once, at the end of a job's writes, and verifies only what came back
    /// (seen in the VM suite on a striped volume: 172 of 256 blocks verified, no error).
    #[test]
    fn an_io_finishing_while_another_files_event_is_reaped_is_returned() {
        const LEN: u64 = (4 << 20) + 4096;
        let _ = log::set_logger(&SlowOnErrors);
        log::set_max_level(log::LevelFilter::Error);
        let dir = tempfile::tempdir().expect("tempdir");
        let (slow, bad) = (dir.path().join("slow"), dir.path().join("small"));
        let mut t = Thread::new(Settings::from(None), 2);
        let base = t.alloc_mem(LEN as usize + 3 * 4096).expect("memory");
        t.open(0, slow.to_str().expect("utf-8"), LEN).expect("open");
        t.open(1, bad.to_str().expect("utf-8"), 4096).expect("open");
        // 8 bytes past a page: no O_DIRECT transfer takes this memory as it is.
        // SAFETY: inside the allocation made above.
        let (slow_mem, bad_mem) = unsafe { (base.add(8), base.add(LEN as usize + 2 * 4096)) };
        let start = Instant::now();
        let read = Request::Rw { write: false, offset: 0, len: LEN, mem: slow_mem };
        assert_eq!(t.queue(0, 1, read), Outcome::Queued);
        t.commit();
        assert_eq!(t.getevents(1, 1, None), 1);
        assert_eq!(t.events[0], Done { key: 1, bytes: LEN, error: 0 });
        let took = start.elapsed();
        // The small file's I/O is not a whole block: its event (an error) is there at once, and
        // reaping it takes (in its log line) longer than the read runs.
        SLEEP_ON_ERROR_MS.store(took.as_millis() as u64 * 3 + 20, Ordering::Relaxed);
        assert_eq!(t.queue(0, 1, read), Outcome::Queued);
        let part_block = Request::Rw { write: false, offset: 0, len: 100, mem: bad_mem };
        assert_eq!(t.queue(1, 2, part_block), Outcome::Queued);
        t.commit();
        let got = t.getevents(2, 2, None);
        SLEEP_ON_ERROR_MS.store(0, Ordering::Relaxed);
        assert_eq!(got, 2, "waiting for 2 I/Os returned {:?}", t.events);
        let mut keys: Vec<u64> = t.events.iter().map(|d| d.key).collect();
        keys.sort_unstable();
        assert_eq!(keys, [1, 2]);
        assert!(t.events.iter().any(|d| d.key == 1 && d.bytes == LEN && d.error == 0), "{:?}", t.events);
        assert!(t.events.iter().any(|d| d.key == 2 && d.error != 0), "{:?}", t.events);
    }
}

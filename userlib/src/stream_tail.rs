//! Ending a stream-ordered I/O on the device. When a stream waits for one I/O whose last step is
//! a copy into GPU memory, the copy's own queue can release the stream: it stores the stream's
//! completion word behind the copy ([`CopyQueue::signal`], CUDA's `cuStreamWriteValue32`), so
//! neither the host's wait for the copy nor its store of the word lies between the copy's end
//! and the stream's next work (on the H200, a 4 KiB copy that way cost a stream-ordered round
//! 4.5 to 6 us less than one the host waited for: `tests/gpu/stream_floor.cu`). The host keeps
//! what the copy uses (its queue, the staging memory, the GPU memory, and whatever the I/O held
//! busy) until the queue says the copy is done ([`Copies::tidy`]).
//!
//! The hand-over is per thread. The registration's dispatcher offers it around a group of one
//! job ([`Offer`]); a job that is exactly one I/O accepts it for that I/O ([`one_io`]); the
//! fallback path's GPU read then leaves its copy running instead of waiting for it
//! ([`defer`]) and queues the store behind it at once; the job hands over what it holds busy
//! ([`keep_while_copying`]) after storing its result; the dispatcher keeps the [`Copying`]
//! (or, where the queue took no store then, queues it now). The stream also waits for the
//! host's mark that the job is over (`StreamIo`'s `finished` word), so it passes the I/O only
//! once the copy is done and the job has stored its result and let go of what it holds: the
//! host's last step is a plain store, not a call into the runtime after the job (on the H100,
//! the store queued after the job came 3.1 us after the copy, and the stream passed 8 us after
//! that: `docs/gpu/run-24.txt`). Everything else waits for its copies as before.

use crate::gpu::stream::CompletionWord;
use crate::gpu::{CopyQueue, Gpu, GpuMemory, PinnedHost};
use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Where this thread's hand-over stands.
enum State {
    /// No offer: I/O waits for its copies.
    Idle,
    /// The dispatcher runs a group of one job that may end on the device.
    Offered(Release),
    /// That job runs its one I/O: a GPU read may leave its copy running.
    Armed(Release),
    /// A GPU read left its copy running.
    Deferred(Copying),
}

thread_local! {
    static STATE: RefCell<State> = const { RefCell::new(State::Idle) };
}

fn replace(s: State) -> State {
    STATE.with(|c| std::mem::replace(&mut *c.borrow_mut(), s))
}

/// How a copy left running releases the stream: its queue stores `value` into `word`.
#[derive(Debug, Clone)]
pub(crate) struct Release {
    pub(crate) word: CompletionWord,
    pub(crate) value: u32,
}

/// A copy into GPU memory left running, and what must outlive it.
pub(crate) struct Copying {
    gpu: Arc<Gpu>,
    queue: Option<Box<dyn CopyQueue>>,
    stage: Vec<PinnedHost>,
    /// The memory the copy writes (kept allocated).
    _mem: Arc<GpuMemory>,
    /// What the I/O held busy (a C face's handle and buffer counts), released after the copy.
    keep: Vec<Box<dyn Any + Send>>,
    /// The word the queue stores behind the copy, once that store is queued (kept allocated
    /// with the rest should the queue fail).
    stores: Option<CompletionWord>,
}

impl std::fmt::Debug for Copying {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Copying({} staging chunks, {} kept)", self.stage.len(), self.keep.len())
    }
}

impl Copying {
    /// A copy queued on `queue` from `stage` into `mem`.
    pub(crate) fn new(gpu: Arc<Gpu>, queue: Box<dyn CopyQueue>, stage: Vec<PinnedHost>, mem: Arc<GpuMemory>) -> Self {
        Copying { gpu, queue: Some(queue), stage, _mem: mem, keep: Vec::new(), stores: None }
    }

    /// Queues the store of `value` into `word` behind the copy; false when the runtime cannot
    /// (or the call failed): the caller then stores it itself, after dropping this (which
    /// waits for the copy).
    fn signal(&mut self, word: &CompletionWord, value: u32) -> bool {
        if self.stores.is_some() {
            return true;
        }
        let Some(q) = self.queue.as_mut() else { return false };
        match q.signal(word, value) {
            Ok(queued) => {
                if queued {
                    self.stores = Some(word.clone());
                }
                queued
            }
            Err(e) => {
                log::debug!("queueing a stream's completion behind its copy: {e}");
                false
            }
        }
    }

    /// Whether the copy is over (then ended: see [`Copying::end`]).
    fn done(&mut self) -> bool {
        let Some(q) = self.queue.as_mut() else { return true };
        let r = match q.poll() {
            Ok(false) => return false,
            Ok(true) => Ok(()),
            Err(e) => Err(e),
        };
        self.end(r);
        true
    }

    /// Ends the copy with its queue's answer `r` ([`Gpu::settle_queue`]): on success the queue
    /// and the staging go back to the GPU's pools; when the queue cannot say the copy is done,
    /// the failure's token keeps the queue, the staging, the memory and the busy counts for
    /// good.
    fn end(&mut self, r: crate::Result<()>) {
        let Some(q) = self.queue.take() else { return };
        let stage = std::mem::take(&mut self.stage);
        match self.gpu.settle_queue(r, q) {
            Ok(()) => self.gpu.put_staging(stage),
            Err(mut f) => {
                log::debug!("a copy behind a stream's completion failed: {}", f.error);
                let keep = std::mem::take(&mut self.keep);
                // A failed queue's token always comes back: nothing is handed back here (the
                // word too: the store behind the copy may still come).
                drop(f.hold_if_running((stage, self._mem.clone(), keep, self.stores.take())));
            }
        }
    }
}

impl Drop for Copying {
    fn drop(&mut self) {
        // What the copy uses goes only once it is over.
        let Some(q) = self.queue.as_mut() else { return };
        let r = q.wait();
        self.end(r);
    }
}

/// The dispatcher's offer around a group of one job; dropping it withdraws the offer (a copy
/// deferred and not taken is waited for).
pub(crate) struct Offer(());

impl Offer {
    /// Offers the hand-over to the job about to run on this thread; a copy it leaves running
    /// releases the stream as `release` says.
    pub(crate) fn new(release: Release) -> Offer {
        replace(State::Offered(release));
        Offer(())
    }

    /// The copy the job left running, if it did.
    pub(crate) fn take(self) -> Option<Copying> {
        match replace(State::Idle) {
            State::Deferred(c) => Some(c),
            _ => None,
        }
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        replace(State::Idle);
    }
}

/// Runs `io`, a job's only I/O, accepting the offer (if any) for it.
pub(crate) fn one_io<R>(io: impl FnOnce() -> R) -> R {
    let offered = STATE.with(|c| {
        let mut s = c.borrow_mut();
        match std::mem::replace(&mut *s, State::Idle) {
            State::Offered(r) => {
                *s = State::Armed(r);
                true
            }
            other => {
                *s = other;
                false
            }
        }
    });
    let r = io();
    if offered {
        // Unused: no later I/O of the job may take it.
        STATE.with(|c| {
            let mut s = c.borrow_mut();
            if matches!(*s, State::Armed(_)) {
                *s = State::Idle;
            }
        });
    }
    r
}

/// Whether this thread's I/O accepted an offer and may leave its copy running ([`defer`]).
pub(crate) fn armed() -> bool {
    STATE.with(|c| matches!(*c.borrow(), State::Armed(_)))
}

/// Leaves `c` running when this thread's I/O accepted an offer; otherwise hands it back (the
/// caller waits for it).
pub(crate) fn defer(mut c: Copying) -> Result<(), Copying> {
    STATE.with(|cell| {
        let mut s = cell.borrow_mut();
        let State::Armed(r) = &*s else { return Err(c) };
        // Behind the copy now, while it runs (the stream also waits for the job to be over).
        c.signal(&r.word, r.value);
        *s = State::Deferred(c);
        Ok(())
    })
}

/// Keeps `x` until the copy this thread's I/O left running is over, or drops it now when there
/// is none.
pub(crate) fn keep_while_copying(x: Box<dyn Any + Send>) {
    let rest = STATE.with(|cell| match &mut *cell.borrow_mut() {
        State::Deferred(c) => {
            c.keep.push(x);
            None
        }
        _ => Some(x),
    });
    drop(rest);
}

/// A registration's copies that release its stream, until each is over.
#[derive(Debug, Default)]
pub(crate) struct Copies {
    running: Mutex<Vec<Copying>>,
    /// How many (read without the lock on every turn of the dispatcher).
    count: AtomicUsize,
    /// Copies that released the stream since the registration was made.
    signalled: AtomicU64,
}

impl Copies {
    /// Queues the store of `value` into `word` behind `c`'s copy (unless queued with the copy)
    /// and keeps `c`; false when that cannot be done: `c` was dropped (its copy waited for) and
    /// the caller stores the word.
    pub(crate) fn signal(&self, c: Copying, word: &CompletionWord, value: u32) -> bool {
        // Listed before the job's ticket is finished: once the stream is released, whoever
        // settles the copies finds this one (and what it keeps busy).
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.push(c);
        // Queued when the copy was, with the same word and value, where the queue could.
        let queued = running.last_mut().is_some_and(|c| c.signal(word, value));
        if !queued {
            drop(running.pop());
        }
        self.count.store(running.len(), Ordering::Release);
        self.signalled.fetch_add(u64::from(queued), Ordering::Relaxed);
        queued
    }

    /// Copies that released the stream so far (tests).
    #[cfg(test)]
    pub(crate) fn signalled(&self) -> u64 {
        self.signalled.load(Ordering::Relaxed)
    }

    /// Lets go of the copies that are over; true while some still run.
    pub(crate) fn tidy(&self) -> bool {
        if self.count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.retain_mut(|c| !c.done());
        self.count.store(running.len(), Ordering::Release);
        !running.is_empty()
    }

    /// Hands every copy over (to a token that keeps them when a stream may never pass them).
    pub(crate) fn take_all(&self) -> Vec<Copying> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        self.count.store(0, Ordering::Release);
        std::mem::take(&mut *running)
    }
}

#[cfg(all(test, feature = "fallback"))]
mod tests {
    use super::*;
    use crate::fallback::tests::TempFile;
    use crate::stream_io::{AsyncArgs, StreamIo, StreamJob};
    use crate::CpuStream;

    /// Something a job holds busy: its count tells whether it was let go.
    fn token() -> (Arc<()>, Box<dyn Any + Send>) {
        let t = Arc::new(());
        (t.clone(), Box::new(t))
    }

    #[test]
    fn a_copy_is_left_running_only_for_an_offered_jobs_one_io() {
        let gpu = Gpu::cpu();
        let mem = Arc::new(gpu.alloc(4096).unwrap());
        let copying = || Copying::new(gpu.clone(), gpu.take_queue().unwrap(), Vec::new(), mem.clone());
        assert!(defer(copying()).is_err(), "no offer");
        assert!(one_io(|| defer(copying())).is_err(), "no offer");
        let release = Release { word: CompletionWord::host(), value: 1 };
        let offer = Offer::new(release);
        assert!(defer(copying()).is_err(), "offered, but not inside the job's one I/O");
        let (t, kept) = token();
        assert!(one_io(|| defer(copying())).is_ok());
        assert!(one_io(|| defer(copying())).is_err(), "taken by the first I/O");
        keep_while_copying(kept);
        assert_eq!(Arc::strong_count(&t), 2, "kept with the copy");
        let c = offer.take().expect("the deferred copy");
        drop(c);
        assert_eq!(Arc::strong_count(&t), 1, "let go with the copy");
        let (t, kept) = token();
        keep_while_copying(kept);
        assert_eq!(Arc::strong_count(&t), 1, "nothing deferred: let go at once");
        assert!(one_io(|| defer(copying())).is_err(), "the offer ended with its take");
    }

    #[test]
    fn a_stream_waiting_for_one_read_into_gpu_memory_is_released_by_its_copy() {
        let f = TempFile::new("tail", 1 << 20);
        let st = f.storage();
        let gpu = Gpu::cpu();
        let mem = Arc::new(gpu.alloc(8192).unwrap());
        let buf = Arc::new(st.register_gpu(mem, false).unwrap());
        let sio = StreamIo::new(CpuStream::new().unwrap()).unwrap();
        let engine = st.engine().unwrap();
        let run = |one: bool, off: u64| {
            let (t, kept) = token();
            let got = Arc::new(AtomicU64::new(0));
            let (st, b, g) = (st.clone(), buf.clone(), got.clone());
            let job: StreamJob = Box::new(move || {
                let read = || st.read(&b, 0, off, 4096).unwrap();
                let n = if one { one_io(read) } else { read() };
                g.store(n, Ordering::Release);
                keep_while_copying(kept);
            });
            sio.submit_jobs(&engine, vec![job]).unwrap();
            sio.synchronize().unwrap();
            assert_eq!(got.load(Ordering::Acquire), 4096);
            assert_eq!(Arc::strong_count(&t), 1, "let go once the stream passed the read");
            let mut out = vec![0u8; 4096];
            buf.copy_out(0, &mut out).unwrap();
            assert_eq!(crate::pattern::first_mismatch(1, off, &out), None);
        };
        run(true, 8192);
        assert_eq!(sio.copies_signalled(), 1, "the read's copy stored the stream's word");
        run(false, 16384);
        assert_eq!(sio.copies_signalled(), 1, "a job that did not say its I/O is its only one waits for its copy");
        run(true, 4096);
        assert_eq!(sio.copies_signalled(), 2);
        assert_eq!(buf.inflight(), 0);
    }

    #[test]
    fn a_copy_queued_with_its_store_releases_the_stream_only_after_the_jobs_result() {
        let f = TempFile::new("tail-result", 1 << 20);
        let st = f.storage();
        let buf = Arc::new(st.register_gpu(Arc::new(Gpu::cpu().alloc(4096).unwrap()), false).unwrap());
        let sio = StreamIo::new(CpuStream::new().unwrap()).unwrap();
        let got = Arc::new(AtomicU64::new(0));
        let (s, b, g) = (st.clone(), buf.clone(), got.clone());
        let job: StreamJob = Box::new(move || {
            let n = one_io(|| s.read(&b, 0, 8192, 4096).unwrap());
            // The copy, and the store queued with it, are done by now; the result is not stored.
            std::thread::sleep(std::time::Duration::from_millis(50));
            g.store(n, Ordering::Release);
        });
        sio.submit_jobs(&st.engine().unwrap(), vec![job]).unwrap();
        sio.synchronize().unwrap();
        assert_eq!(got.load(Ordering::Acquire), 4096, "the stream passed the read before its result");
        assert_eq!(sio.copies_signalled(), 1, "the read's copy stored the stream's word");
    }

    #[test]
    fn a_job_that_panics_after_queueing_its_copy_still_releases_the_stream() {
        let f = TempFile::new("tail-panic", 1 << 20);
        let st = f.storage();
        let buf = Arc::new(st.register_gpu(Arc::new(Gpu::cpu().alloc(4096).unwrap()), false).unwrap());
        let sio = Arc::new(StreamIo::new(CpuStream::new().unwrap()).unwrap());
        let (s, b) = (st.clone(), buf.clone());
        let job: StreamJob = Box::new(move || {
            one_io(|| s.read(&b, 0, 8192, 4096).unwrap());
            panic!("a test's job panics after its I/O on purpose");
        });
        sio.submit_jobs(&st.engine().unwrap(), vec![job]).unwrap();
        // The job never hands over what it holds, nor stores its result.
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = sio.clone();
        std::thread::spawn(move || tx.send(s2.synchronize().is_ok()).unwrap());
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(10)), Ok(true), "the stream was never released");
        assert_eq!(buf.inflight(), 0);
    }

    #[test]
    fn a_rust_face_read_into_gpu_memory_is_released_by_its_copy() {
        let f = TempFile::new("tail-rust", 1 << 20);
        let st = f.storage();
        let gpu = Gpu::cpu();
        let buf = Arc::new(st.register_gpu(Arc::new(gpu.alloc(8192).unwrap()), false).unwrap());
        let sio = StreamIo::new(CpuStream::new().unwrap()).unwrap();
        for (i, off) in [4096u64, 12288].into_iter().enumerate() {
            let args = AsyncArgs::new(4096, off as i64, 4096);
            sio.read_async(&st, &buf, &args).unwrap();
            sio.synchronize().unwrap();
            assert_eq!(args.bytes.load(Ordering::Acquire), 4096);
            assert_eq!(sio.copies_signalled(), i as u64 + 1, "the read's copy stored the stream's word");
            let mut out = vec![0u8; 4096];
            buf.copy_out(4096, &mut out).unwrap();
            assert_eq!(crate::pattern::first_mismatch(1, off, &out), None);
        }
        assert_eq!(buf.inflight(), 0, "let go once the stream passed the reads");
        // Writes, and groups of more than one, still run on the registration's batch.
        let w = AsyncArgs::new(4096, 0, 0);
        sio.write_async(&st, &buf, &w).unwrap();
        sio.synchronize().unwrap();
        assert_eq!(w.bytes.load(Ordering::Acquire), 4096);
        assert_eq!(sio.copies_signalled(), 2);
    }
}

//! Starting a stream-ordered group when the stream reaches it, without a host function: the
//! stream writes the group's first ticket into a host-mapped word (`cuStreamWriteValue32` on
//! CUDA), and a dispatcher thread of the registration, which watches that word, runs the group.
//!
//! A host function costs a round trip through the runtime's callback thread on every group's
//! critical path; a store by the stream is seen by a polling thread within a microsecond. The
//! dispatcher polls only while a group is queued: it spins for a short budget (a group queued
//! right before a synchronize is reached at once), then checks every [`POLL_SLEEP`] (a group
//! queued behind a long kernel). With nothing queued it spins for [`IDLE_SPIN`] (a loop of one
//! stream-ordered I/O and a synchronize queues its next group within microseconds, and waking a
//! sleeping thread costs more than that), then sleeps on a condition variable, which `queue`
//! signals only while it sleeps.

use crate::error::{Error, Result};
use crate::gpu::stream::{CompletionWord, Stream};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long the dispatcher spins for a queued group before it checks at intervals.
const SPIN: Duration = Duration::from_micros(200);
/// The interval of its checks after that.
const POLL_SLEEP: Duration = Duration::from_micros(50);
/// How long the dispatcher spins for the next group before it sleeps.
const IDLE_SPIN: Duration = Duration::from_micros(100);

/// A group's start, run by the dispatcher.
type Start = Box<dyn FnOnce() + Send + 'static>;

/// Housekeeping the dispatcher does between groups and before it sleeps (letting go of what
/// finished copies kept); returns true while some is left, and the thread does not sleep then.
pub(crate) type Tidy = Box<dyn Fn() -> bool + Send + 'static>;

/// Queued groups, in stream order.
struct Queued {
    /// (the value the stream writes when it reaches the group, what starts it)
    groups: VecDeque<(u32, Start)>,
    /// Work for the dispatcher thread itself, run before the next group (not stream-ordered:
    /// setting up the thread, see [`Dispatcher::prepare`]).
    now: Vec<Start>,
    /// The registration is going: exit once nothing is queued.
    stop: bool,
    /// The thread waits on the condition variable (set and read under the lock, so a signal
    /// is never lost).
    sleeping: bool,
}

impl Queued {
    /// Nothing for the thread to do but wait.
    fn idle(&self) -> bool {
        self.groups.is_empty() && self.now.is_empty() && !self.stop
    }
}

/// What the dispatcher thread and the registration share.
struct Shared {
    /// Written by the stream: the first ticket of the last group it reached.
    reached: CompletionWord,
    queued: Mutex<Queued>,
    /// Set under the lock whenever something is queued, cleared by the thread when it takes
    /// the queue empty: what its idle spin watches without the lock.
    pending: AtomicBool,
    wake: Condvar,
    /// Times the thread slept on the condition variable (tests).
    sleeps: AtomicU64,
}

/// A registration's dispatcher: its thread and the word the stream writes.
pub(crate) struct Dispatcher {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dispatcher(reached {})", self.shared.reached.load())
    }
}

impl Dispatcher {
    /// A dispatcher for groups queued on `stream` (its word comes from the stream's runtime),
    /// doing `tidy` while it waits.
    pub(crate) fn new(stream: &dyn Stream, tidy: Tidy) -> Result<Dispatcher> {
        let reached = stream.completion_word()?;
        reached.store(0);
        let shared = Arc::new(Shared {
            reached,
            queued: Mutex::new(Queued { groups: VecDeque::new(), now: Vec::new(), stop: false, sleeping: false }),
            pending: AtomicBool::new(false),
            wake: Condvar::new(),
            sleeps: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ugds-stream".into())
            .spawn(move || run(&s, &*tidy))
            .map_err(|e| Error::Io { op: "spawning a stream dispatcher".into(), source: e })?;
        Ok(Dispatcher { shared, thread: Some(thread) })
    }

    /// Queues `start` to run once `stream` reaches the point queued now; `key` is the group's
    /// first ticket (increasing, cyclic). With `at_once` (the caller found the stream idle, so
    /// it has reached that point already) nothing is queued on the stream: the caller stores
    /// the key with [`Dispatcher::release`] (before it queues the group's wait), and the group
    /// starts without waiting for the stream to get round to a store. On error nothing was
    /// queued on the stream and `start` never runs.
    pub(crate) fn queue(&self, stream: &dyn Stream, key: u32, start: Start, at_once: bool) -> Result<()> {
        // Known to the dispatcher before the key is written.
        let sleeping = self.add(|q| q.groups.push_back((key, start)));
        if at_once {
            // Awake and watching for the key by the time it is released.
            self.wake_if(sleeping);
            return Ok(());
        }
        if let Err(e) = stream.write_word(&self.shared.reached, key) {
            // The caller holds the registration's queue lock, so this group is the last one.
            self.lock().groups.pop_back();
            return Err(e);
        }
        self.wake_if(sleeping);
        Ok(())
    }

    /// Starts the group queued with `at_once` under `key`. An idle stream has written every
    /// earlier key, so the word only moves forward. The thread is awake: `queue` woke it, and it
    /// never sleeps on the condition variable while a group is queued.
    pub(crate) fn release(&self, key: u32) {
        self.shared.reached.store(key);
    }

    /// Runs `f` on the dispatcher thread before the next group, whatever the stream does: for
    /// setting the thread up (its CUDA context, its io_uring), so that the first group does
    /// not pay for it.
    pub(crate) fn prepare(&self, f: Start) {
        let sleeping = self.add(|q| q.now.push(f));
        self.wake_if(sleeping);
    }

    /// Changes the queue under its lock and marks it pending (what the thread's idle spin
    /// watches); returns whether the thread sleeps, and so needs [`Dispatcher::wake_if`].
    fn add(&self, change: impl FnOnce(&mut Queued)) -> bool {
        let mut q = self.lock();
        change(&mut q);
        self.shared.pending.store(true, Ordering::Release);
        q.sleeping
    }

    /// Signals the thread when [`Dispatcher::add`] found it asleep.
    fn wake_if(&self, sleeping: bool) {
        if sleeping {
            self.shared.wake.notify_one();
        }
    }

    /// How many times the thread has slept waiting for work (tests).
    #[cfg(test)]
    pub(crate) fn sleeps(&self) -> u64 {
        self.shared.sleeps.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.shared.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The word the stream writes (kept by whoever must keep the stream's memory alive).
    pub(crate) fn word(&self) -> &CompletionWord {
        &self.shared.reached
    }

    /// Stops the thread once nothing is queued; waits for it when `join` (else it ends on its
    /// own, if the stream ever reaches what is queued).
    pub(crate) fn stop(&mut self, join: bool) {
        // Signalled whether or not the thread sleeps: a lost signal would leave it for good.
        self.add(|q| q.stop = true);
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            if join {
                let _ = t.join();
            }
        }
    }

    /// In a forked child: the thread is the parent's; nothing is joined or freed.
    pub(crate) fn forget(&mut self) {
        std::mem::forget(self.thread.take());
        std::mem::forget(self.shared.clone());
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        // Not after `stop` or `forget` (in a forked child the lock may be the parent's).
        if self.thread.is_some() {
            self.stop(true);
        }
    }
}

/// The dispatcher thread: runs each queued group once the stream has written its key.
fn run(s: &Shared, tidy: &dyn Fn() -> bool) {
    loop {
        // The next group, once queued; returns when told to stop with nothing queued.
        let key = loop {
            let mut q = s.queued.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::mem::take(&mut q.now);
            if !now.is_empty() {
                drop(q);
                for f in now {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
                }
                continue;
            }
            if let Some((k, _)) = q.groups.front() {
                break *k;
            }
            if q.stop {
                return;
            }
            s.pending.store(false, Ordering::Release);
            drop(q);
            let idle = Instant::now();
            while !s.pending.load(Ordering::Acquire) {
                let untidy = tidy();
                if idle.elapsed() < IDLE_SPIN {
                    std::hint::spin_loop();
                } else if untidy {
                    std::thread::sleep(POLL_SLEEP);
                } else {
                    break;
                }
            }
            let mut q = s.queued.lock().unwrap_or_else(|e| e.into_inner());
            if q.idle() {
                q.sleeping = true;
                s.sleeps.fetch_add(1, Ordering::Relaxed);
                while q.idle() {
                    q = s.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                q.sleeping = false;
            }
        };
        let since = Instant::now();
        while !s.reached.reached(key) {
            tidy();
            if since.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(POLL_SLEEP);
            }
        }
        let start = s.queued.lock().unwrap_or_else(|e| e.into_inner()).groups.pop_front();
        if let Some((_, start)) = start {
            // A panicking start must not stop the dispatcher: later groups still need it (the
            // start's own guards finish its tickets).
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(start));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::stream::CpuStream;
    use std::sync::mpsc;

    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn prepared_work_runs_on_the_dispatcher_thread_with_nothing_queued_on_the_stream() {
        let stream = CpuStream::new().unwrap();
        let d = Dispatcher::new(&*stream, Box::new(|| false)).unwrap();
        let (tx, rx) = mpsc::channel();
        d.prepare(Box::new(move || {
            let _ = tx.send(std::thread::current().name().map(String::from));
        }));
        assert_eq!(rx.recv_timeout(WAIT).unwrap().as_deref(), Some("ugds-stream"));
    }

    #[test]
    fn groups_queued_after_the_dispatcher_fell_asleep_still_start() {
        let stream = CpuStream::new().unwrap();
        let d = Dispatcher::new(&*stream, Box::new(|| false)).unwrap();
        let (tx, rx) = mpsc::channel();
        for key in 1..=3u32 {
            // Longer than the idle spin: the thread is asleep when the group comes.
            std::thread::sleep(IDLE_SPIN * 20);
            let tx = tx.clone();
            d.queue(&*stream, key, Box::new(move || tx.send(key).unwrap()), false).unwrap();
            assert_eq!(rx.recv_timeout(WAIT).unwrap(), key);
        }
        assert!(d.sleeps() >= 1, "the dispatcher never slept between groups");
    }
}

//! Starting a stream-ordered group when the stream reaches it, without a host function: the
//! stream writes the group's first ticket into a host-mapped word (`cuStreamWriteValue32` on
//! CUDA), and a dispatcher thread of the registration, which watches that word, runs the group.
//!
//! A host function costs a round trip through the runtime's callback thread on every group's
//! critical path; a store by the stream is seen by a polling thread within a microsecond. The
//! dispatcher polls only while a group is queued: it spins for a short budget (a group queued
//! right before a synchronize is reached at once), then checks every [`POLL_SLEEP`] (a group
//! queued behind a long kernel), and sleeps on a condition variable while nothing is queued.

use crate::error::{Error, Result};
use crate::gpu::stream::{CompletionWord, Stream};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long the dispatcher spins for a queued group before it checks at intervals.
const SPIN: Duration = Duration::from_micros(200);
/// The interval of its checks after that.
const POLL_SLEEP: Duration = Duration::from_micros(50);

/// A group's start, run by the dispatcher.
type Start = Box<dyn FnOnce() + Send + 'static>;

/// Queued groups, in stream order.
struct Queued {
    /// (the value the stream writes when it reaches the group, what starts it)
    groups: VecDeque<(u32, Start)>,
    /// The registration is going: exit once nothing is queued.
    stop: bool,
}

/// What the dispatcher thread and the registration share.
struct Shared {
    /// Written by the stream: the first ticket of the last group it reached.
    reached: CompletionWord,
    queued: Mutex<Queued>,
    wake: Condvar,
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
    /// A dispatcher for groups queued on `stream` (its word comes from the stream's runtime).
    pub(crate) fn new(stream: &dyn Stream) -> Result<Dispatcher> {
        let reached = stream.completion_word()?;
        reached.store(0);
        let shared = Arc::new(Shared {
            reached,
            queued: Mutex::new(Queued { groups: VecDeque::new(), stop: false }),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ugds-stream".into())
            .spawn(move || run(&s))
            .map_err(|e| Error::Io { op: "spawning a stream dispatcher".into(), source: e })?;
        Ok(Dispatcher { shared, thread: Some(thread) })
    }

    /// Queues `start` to run once `stream` reaches the point queued now; `key` is the group's
    /// first ticket (increasing, cyclic). On error nothing was queued on the stream and `start`
    /// never runs.
    pub(crate) fn queue(&self, stream: &dyn Stream, key: u32, start: Start) -> Result<()> {
        // Known to the dispatcher before the stream can write the key.
        self.lock().groups.push_back((key, start));
        if let Err(e) = stream.write_word(&self.shared.reached, key) {
            // The caller holds the registration's queue lock, so this group is the last one.
            self.lock().groups.pop_back();
            return Err(e);
        }
        self.shared.wake.notify_one();
        Ok(())
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
        self.lock().stop = true;
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
fn run(s: &Shared) {
    loop {
        // The next group, once queued; `None` when told to stop with nothing queued.
        let key = {
            let mut q = s.queued.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some((k, _)) = q.groups.front() {
                    break *k;
                }
                if q.stop {
                    return;
                }
                q = s.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let since = Instant::now();
        while !s.reached.reached(key) {
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

//! A remote batch's large entries on threads of their own as well as on the caller's: each
//! thread holds a batch of one queue (one connection) and does everything on it, sending
//! capsules and reading the data back; the batch hands a large entry to the thread with the
//! fewest in flight, or keeps it when the caller's own queues have fewer, and collects the
//! threads' events.
//!
//! Why threads: a connection's receive side is CPU work (the copy out of the socket, and on a
//! target on the same machine, the target's own sending, which follows the CPU the capsules
//! and acknowledgements come from). One thread reading every connection does that work on one
//! core: against a target on the same 2-CPU machine, 1 MiB reads at any depth ran at the
//! rate of depth 1 while a second CPU sat half idle; two threads, each on its own connection,
//! doubled it. Small entries stay on the calling thread's queues, where a hand-off would cost
//! more than the transfer.
//!
//! Rules: an entry's lease goes with the entry to its thread and is released there before its
//! event comes back; a thread's batch closes its queues before dropping its entries (see
//! `remote::batch`), and the batch joins every thread before it is gone.

use super::batch::RemoteBatch;
use super::Link;
use crate::batch::{Entry, IoEvent, IoStatus};
use crate::buffer::Path;
use crate::sys::EventFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The most threads a batch spreads its large entries over.
const MAX_THREADS: usize = 4;

/// What the batch gives one thread.
#[derive(Default)]
struct Orders {
    entries: Vec<Entry>,
    /// Cancel: entries not yet started end `Canceled`, started ones are waited for.
    cancel: bool,
    /// The batch is going: close the queue and exit.
    stop: bool,
}

/// The batch's side of one thread.
struct Inbox {
    orders: Mutex<Orders>,
    /// Signalled when `orders` gets something to do; the thread's waits end on it.
    wake: Arc<EventFd>,
    /// Set before each signal: the thread clears `wake` before it takes its orders only when
    /// this says a signal was given (a clear with none is a system call that finds nothing).
    signalled: AtomicBool,
}

impl Inbox {
    /// Tells the thread it has orders.
    fn signal(&self) {
        self.signalled.store(true, Ordering::Release);
        self.wake.signal();
    }
}

/// Events from every thread, each with its thread's index.
struct Outbox {
    events: Mutex<Vec<(usize, IoEvent, Path)>>,
    /// Signalled whenever an event is added.
    wake: EventFd,
}

/// One thread, as the batch sees it.
struct Worker {
    inbox: Arc<Inbox>,
    thread: Option<JoinHandle<()>>,
    /// The cookies of the entries handed to it whose events have not come back (the batch
    /// answers them itself should the thread end).
    cookies: Vec<u64>,
    /// Orders were handed to it empty since it was last signalled: it is owed one signal.
    owed: bool,
}

/// A batch's threads for large entries.
pub(crate) struct Spread {
    workers: Vec<Worker>,
    out: Arc<Outbox>,
}

impl std::fmt::Debug for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Spread({} threads, {} in flight)", self.workers.len(), self.in_flight())
    }
}

impl Spread {
    /// Threads on `link`, each with one queue (127 entries in flight), one per CPU besides the
    /// caller's (which keeps running large entries on the batch's own queues), at most
    /// [`MAX_THREADS`] in all: `None` on one CPU, or where no queue can be spared.
    pub(crate) fn new(link: &Arc<Link>) -> Option<Spread> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
        let threads = cpus.saturating_sub(1);
        let mut batches = Vec::new();
        while batches.len() < threads {
            match RemoteBatch::single(link) {
                Some(b) => batches.push(b),
                None => break,
            }
        }
        if batches.is_empty() {
            return None;
        }
        let out = Arc::new(Outbox { events: Mutex::new(Vec::new()), wake: EventFd::new().ok()? });
        let mut workers = Vec::new();
        for (i, b) in batches.into_iter().enumerate() {
            let wake = match EventFd::new() {
                Ok(w) => Arc::new(w),
                Err(_) => break,
            };
            let inbox =
                Arc::new(Inbox { orders: Mutex::new(Orders::default()), wake, signalled: AtomicBool::new(false) });
            let (ib, o, timeout) = (inbox.clone(), out.clone(), link.timeout());
            let spawned =
                std::thread::Builder::new().name(format!("ugds-remote-{i}")).spawn(move || run(i, b, &ib, &o, timeout));
            match spawned {
                Ok(t) => workers.push(Worker { inbox, thread: Some(t), cookies: Vec::new(), owed: false }),
                Err(e) => {
                    log::warn!("remote batch: no thread for queue {i}: {e}");
                    break;
                }
            }
        }
        (!workers.is_empty()).then_some(Spread { workers, out })
    }

    /// Entries handed to threads whose events have not come back.
    pub(crate) fn in_flight(&self) -> usize {
        self.workers.iter().map(|w| w.cookies.len()).sum()
    }

    /// The fewest entries in flight on one thread.
    pub(crate) fn least(&self) -> usize {
        self.workers.iter().map(|w| w.cookies.len()).min().unwrap_or(usize::MAX)
    }

    /// Hands `e` to the thread with the fewest entries in flight; [`Spread::wake_owed`] then
    /// signals the threads whose orders were empty. A thread clears its signal before it takes
    /// its orders, all at once, so orders left waiting always have a signal behind them or are
    /// about to be taken (a signal per entry was a system call per entry, and one more for the
    /// thread to clear). The signals wait for the last entry: a thread that took its orders
    /// between two entries would otherwise be signalled again within one submit.
    pub(crate) fn submit(&mut self, e: Entry) {
        // `new` made at least one.
        let Some(w) = self.workers.iter_mut().min_by_key(|w| w.cookies.len()) else { return };
        w.cookies.push(e.cookie);
        let mut orders = lock(&w.inbox.orders);
        w.owed |= orders.entries.is_empty();
        orders.entries.push(e);
    }

    /// Signals every thread handed orders that were empty since its last signal (once each):
    /// called after a submit's last [`Spread::submit`].
    pub(crate) fn wake_owed(&mut self) {
        for w in self.workers.iter_mut().filter(|w| w.owed) {
            w.owed = false;
            w.inbox.signal();
        }
    }

    /// Signalled when an event comes back.
    pub(crate) fn wake(&self) -> &EventFd {
        &self.out.wake
    }

    /// Waits up to `wait` for an event to come back (without taking it).
    pub(crate) fn wait(&self, wait: Duration) {
        // Rounded up: a wait of less than a millisecond would not sleep at all.
        // CAST: clamped to an i32 of milliseconds; a wait is never negative.
        self.out.wake.wait(wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32);
    }

    /// Moves the events that came back into `ready`; returns the cookies of entries whose
    /// thread ended without answering them (it never does while the batch lives), which are
    /// no longer in flight.
    pub(crate) fn drain(&mut self, ready: &mut Vec<(IoEvent, Path)>) -> Vec<u64> {
        let events = std::mem::take(&mut *lock(&self.out.events));
        for (i, ev, path) in events {
            if let Some(w) = self.workers.get_mut(i) {
                if let Some(at) = w.cookies.iter().position(|&c| c == ev.cookie) {
                    w.cookies.swap_remove(at);
                }
            }
            ready.push((ev, path));
        }
        let mut lost = Vec::new();
        for (i, w) in self.workers.iter_mut().enumerate() {
            if w.cookies.is_empty() || !w.thread.as_ref().is_none_or(|t| t.is_finished()) {
                continue;
            }
            log::error!("remote batch: the thread of queue {i} ended with {} entries", w.cookies.len());
            lost.append(&mut w.cookies);
        }
        lost
    }

    /// Tells every thread to cancel its entries not yet started and to wait for the rest (each
    /// thread's wait is bounded by the URI's timeout); their events come back as usual.
    pub(crate) fn cancel(&self) {
        for w in &self.workers {
            lock(&w.inbox.orders).cancel = true;
            w.inbox.signal();
        }
    }
}

impl Drop for Spread {
    fn drop(&mut self) {
        for w in &self.workers {
            lock(&w.inbox.orders).stop = true;
            w.inbox.signal();
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                // A thread's entries (and their leases) are gone once it is joined.
                let _ = t.join();
            }
        }
    }
}

/// Locks `m`, taking it over from a thread that panicked with it (what it guards stays
/// consistent: every change is one assignment or push).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Thread `index`: runs `batch` on the entries `inbox` brings and sends their events out.
fn run(index: usize, mut batch: RemoteBatch, inbox: &Inbox, out: &Outbox, timeout: Duration) {
    batch.end_waits_on(inbox.wake.clone());
    loop {
        // Cleared before the orders are taken: a signal after this is for orders still to come.
        // The flag is set before the orders' signal is written; a signal written after the
        // clear only ends a later wait early.
        if inbox.signalled.swap(false, Ordering::AcqRel) {
            inbox.wake.wait(0);
        }
        let Orders { entries, cancel, stop } = std::mem::take(&mut *lock(&inbox.orders));
        if stop {
            // `batch` drops here: its queues close before its entries' leases go.
            return;
        }
        let mut events = Vec::new();
        if cancel {
            for e in entries {
                let ev = IoEvent { cookie: e.cookie, status: IoStatus::Canceled, bytes: 0, error: None };
                events.push((ev, Path::Remote));
            }
            events.extend(batch.cancel().unwrap_or_default());
        } else {
            if !entries.is_empty() {
                // Never fails: an entry that cannot start fails by its event.
                let _ = batch.submit(entries);
            }
            // Entries that failed as they were submitted (their queue gone and no other
            // connectable) have their events ready already; otherwise this ends early when
            // orders come.
            let (min, wait) = if batch.in_flight() == 0 { (0, Duration::ZERO) } else { (1, timeout) };
            let _ = batch.status_into(min, wait, &mut events);
            if events.is_empty() && batch.in_flight() == 0 {
                // Sleeps until the batch gives orders (a signal already given ends it at once).
                inbox.wake.wait(-1);
                continue;
            }
        }
        if !events.is_empty() {
            // Signalled only when the batch had taken every earlier event: it clears the signal
            // before it takes them, all at once (see `Spread::submit`).
            let mut queued = lock(&out.events);
            let first = queued.is_empty();
            queued.extend(events.into_iter().map(|(ev, p)| (index, ev, p)));
            drop(queued);
            if first {
                out.wake.signal();
            }
        }
    }
}

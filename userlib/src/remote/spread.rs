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
    /// Signalled whenever `orders` changes; the thread's waits end on it.
    wake: Arc<EventFd>,
}

/// Events from every thread, each with its thread's index.
struct Outbox {
    events: Mutex<Vec<(usize, IoEvent, Path)>>,
    /// Signalled whenever an event is added.
    wake: EventFd,
}

struct Worker {
    inbox: Arc<Inbox>,
    thread: Option<JoinHandle<()>>,
    /// Entries handed to it whose events have not come back.
    in_flight: usize,
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
    /// Threads for a batch of `capacity` entries on `link`, one per CPU besides the caller's
    /// (which keeps running large entries on the batch's own queues), at most
    /// [`MAX_THREADS`] in all: `None` on one CPU, or where no queue can be spared.
    pub(crate) fn new(link: &Arc<Link>, capacity: usize) -> Option<Spread> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
        let threads = cpus.saturating_sub(1);
        let per = capacity.div_ceil(cpus).max(1);
        let mut batches = Vec::new();
        while batches.len() < threads {
            match RemoteBatch::single(link, per) {
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
            let inbox = Arc::new(Inbox { orders: Mutex::new(Orders::default()), wake });
            let (ib, o, timeout) = (inbox.clone(), out.clone(), link.timeout());
            let spawned =
                std::thread::Builder::new().name(format!("ugds-remote-{i}")).spawn(move || run(i, b, &ib, &o, timeout));
            match spawned {
                Ok(t) => workers.push(Worker { inbox, thread: Some(t), in_flight: 0 }),
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
        self.workers.iter().map(|w| w.in_flight).sum()
    }

    /// The fewest entries in flight on one thread.
    pub(crate) fn least(&self) -> usize {
        self.workers.iter().map(|w| w.in_flight).min().unwrap_or(usize::MAX)
    }

    /// Hands `e` to the thread with the fewest entries in flight.
    pub(crate) fn submit(&mut self, e: Entry) {
        let Some(w) = self.workers.iter_mut().min_by_key(|w| w.in_flight) else { return };
        w.in_flight += 1;
        lock(&w.inbox.orders).entries.push(e);
        w.inbox.wake.signal();
    }

    /// The descriptor that becomes readable when an event comes back.
    pub(crate) fn wake_fd(&self) -> i32 {
        self.out.wake.raw()
    }

    /// Waits up to `wait` for an event to come back (without taking it).
    pub(crate) fn wait(&self, wait: Duration) {
        // CAST: clamped to an i32 of milliseconds; a wait is never negative.
        self.out.wake.wait(wait.as_millis().min(i32::MAX as u128) as i32);
    }

    /// Moves the events that came back into `ready`.
    pub(crate) fn drain(&mut self, ready: &mut Vec<(IoEvent, Path)>) {
        let events = std::mem::take(&mut *lock(&self.out.events));
        for (i, ev, path) in events {
            if let Some(w) = self.workers.get_mut(i) {
                w.in_flight = w.in_flight.saturating_sub(1);
            }
            ready.push((ev, path));
        }
    }

    /// Cancels every thread's entries not yet started and waits for the rest (each thread's
    /// wait is bounded by the URI's timeout); moves every event into `ready`.
    pub(crate) fn cancel(&mut self, ready: &mut Vec<(IoEvent, Path)>) {
        for w in &self.workers {
            lock(&w.inbox.orders).cancel = true;
            w.inbox.wake.signal();
        }
        loop {
            self.drain(ready);
            // A thread that ended (it never does while its batch lives) returns nothing more.
            if self.workers.iter().all(|w| w.in_flight == 0 || w.thread.as_ref().is_none_or(|t| t.is_finished())) {
                return;
            }
            self.wait(Duration::from_millis(100));
        }
    }
}

impl Drop for Spread {
    fn drop(&mut self) {
        for w in &self.workers {
            lock(&w.inbox.orders).stop = true;
            w.inbox.wake.signal();
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                // A thread's entries (and their leases) are gone once it is joined.
                let _ = t.join();
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Thread `index`: runs `batch` on the entries `inbox` brings and sends their events out.
fn run(index: usize, mut batch: RemoteBatch, inbox: &Inbox, out: &Outbox, timeout: Duration) {
    batch.end_waits_on(inbox.wake.clone());
    loop {
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
            if batch.in_flight() == 0 {
                // Sleeps until the batch gives orders (a signal already given ends it at once).
                inbox.wake.wait(-1);
                continue;
            }
            // Ends early when orders come.
            events = batch.status(1, timeout).unwrap_or_default();
        }
        if !events.is_empty() {
            lock(&out.events).extend(events.into_iter().map(|(ev, p)| (index, ev, p)));
            out.wake.signal();
        }
    }
}

//! Batches over any [`Storage`] path (cuFile's batch API on the portable layer): entries run
//! concurrently on the storage's worker threads; events are collected with `status`. On the
//! direct path, [`crate::Batch`] is the native alternative (one doorbell per submit).
//!
//! Rules as for [`crate::Batch`]: `submit` validates every entry; invalid entries become
//! `Invalid` events and the rest run. Dropping the batch waits for its entries.

use crate::batch::{IoEvent, IoStatus, Op};
use crate::error::{Error, Result};
use crate::storage::{Buffer, Storage};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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
}

impl StorageBatch {
    /// A batch on `storage` (its worker threads start here, not at the first submit).
    pub fn new(storage: &Arc<Storage>, capacity: usize) -> Result<StorageBatch> {
        if capacity == 0 {
            return Err(Error::invalid("capacity", "must be at least 1"));
        }
        storage.engine()?;
        Ok(StorageBatch { storage: storage.clone(), capacity, state: Arc::default() })
    }

    /// Capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries running.
    pub fn in_flight(&self) -> usize {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner()).running
    }

    /// Submits `reqs`. Fails as a whole (nothing submitted) when they exceed the free capacity.
    pub fn submit(&mut self, reqs: &[IoRequest]) -> Result<()> {
        let engine = self.storage.engine()?;
        let (m, cv) = &*self.state;
        {
            let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
            if st.running + reqs.len() > self.capacity {
                return Err(Error::invalid(
                    "reqs",
                    format!(
                        "{} entries exceed the batch's free capacity ({} of {})",
                        reqs.len(),
                        self.capacity - st.running,
                        self.capacity
                    ),
                ));
            }
            st.running += reqs.len();
        }
        for r in reqs {
            let event = |status, bytes, error| IoEvent { cookie: r.cookie, status, bytes, error };
            if let Err(e) = self.storage.check(&r.buf, r.buf_offset, r.file_offset, r.len) {
                let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
                st.running -= 1;
                st.events.push(event(IoStatus::Invalid, 0, Some(e)));
                cv.notify_all();
                continue;
            }
            let (s, state, r2) = (self.storage.clone(), self.state.clone(), r.clone());
            let job = move || {
                let res = s.rw(r2.op == Op::Write, &r2.buf, r2.buf_offset, r2.file_offset, r2.len);
                let ev = match res {
                    Ok(n) => IoEvent { cookie: r2.cookie, status: IoStatus::Complete, bytes: n, error: None },
                    Err(e @ Error::Timeout { .. }) => {
                        IoEvent { cookie: r2.cookie, status: IoStatus::Timeout, bytes: 0, error: Some(e) }
                    }
                    Err(e) => IoEvent { cookie: r2.cookie, status: IoStatus::Failed, bytes: 0, error: Some(e) },
                };
                let (m, cv) = &*state;
                let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
                st.running -= 1;
                st.events.push(ev);
                cv.notify_all();
            };
            if let Err(e) = engine.spawn(job) {
                let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
                st.running -= 1;
                st.events.push(event(IoStatus::Failed, 0, Some(e)));
            }
        }
        Ok(())
    }

    /// Waits until at least `min` events are available (or `timeout` passed, or nothing is
    /// running) and returns all available events.
    pub fn status(&mut self, min: usize, timeout: Duration) -> Result<Vec<IoEvent>> {
        let (m, cv) = &*self.state;
        let deadline = Instant::now() + timeout;
        let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
        while st.events.len() < min && st.running > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = cv.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(std::mem::take(&mut st.events))
    }

    /// Waits for every running entry (they cannot be recalled from the kernel or the SSD) and
    /// returns all events.
    pub fn cancel(&mut self) -> Result<Vec<IoEvent>> {
        self.status(usize::MAX, Duration::MAX.min(Duration::from_secs(3600)))
    }
}

impl Drop for StorageBatch {
    fn drop(&mut self) {
        let _ = self.cancel();
    }
}

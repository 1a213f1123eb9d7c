//! What every batch speaks (the queue batch, the volume's, the fallback path's io_uring batch,
//! [`crate::StorageBatch`] over them, and the C, cuFile and Python faces): an entry's direction,
//! a checked entry, and the events and states a batch reports.

use crate::buffer::{Buffer, Lease, Path};
use crate::error::Error;
use std::sync::Arc;

/// Direction of one batch entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// SSD → memory.
    Read,
    /// Memory → SSD.
    Write,
}

/// State of an entry (cuFile's `CUfileStatus_t` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    /// Submitted, not complete.
    Pending,
    /// Rejected at submit (see the event's error).
    Invalid,
    /// Done; `bytes` transferred.
    Complete,
    /// The device failed it (see the event's error).
    Failed,
    /// Its deadline passed (the controller was reset).
    Timeout,
    /// Cancelled (the batch was cancelled or dropped).
    Canceled,
}

/// A completion event.
#[derive(Debug)]
pub struct IoEvent {
    /// The entry's cookie.
    pub cookie: u64,
    /// Its state.
    pub status: IoStatus,
    /// Bytes transferred (0 unless complete).
    pub bytes: u64,
    /// Why it failed.
    pub error: Option<Error>,
}

/// Where a batch puts its events, each with the path its entry's data took: a vector of both,
/// or a storage batch's caller's events (counted in the storage's path counts on the way).
pub(crate) trait EventSink {
    /// Takes one event.
    fn put(&mut self, ev: IoEvent, path: Path);

    /// Takes every event of `events`, leaving it empty.
    fn put_all(&mut self, events: &mut Vec<(IoEvent, Path)>) {
        for (ev, path) in events.drain(..) {
            self.put(ev, path);
        }
    }
}

impl EventSink for Vec<(IoEvent, Path)> {
    #[inline]
    fn put(&mut self, ev: IoEvent, path: Path) {
        self.push((ev, path));
    }

    fn put_all(&mut self, events: &mut Vec<(IoEvent, Path)>) {
        self.append(events);
    }
}

/// One checked entry: direction, the lease on its buffer, buffer offset, device offset, bytes,
/// cookie.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) op: Op,
    pub(crate) lease: Lease<Arc<Buffer>>,
    pub(crate) buf_offset: u64,
    pub(crate) dev_offset: u64,
    pub(crate) len: u64,
    pub(crate) cookie: u64,
}

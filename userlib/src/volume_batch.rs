//! A striped volume's queue batch: one queue batch per member (each a queue pair of its own,
//! one doorbell per member per submit). An entry of at most one chunk is split at the chunk
//! boundary into at most two pieces, one command each, on the members that hold them; its event
//! comes when its last piece completes: its bytes, or the first failed piece's error naming the
//! member and the offset on it. Larger entries are refused here: `StorageBatch` sends them to
//! the storage's worker threads (the volume's largest command is its chunk), each run as one
//! synchronous request over every member at once.

use crate::batch::{Entry, IoEvent, IoStatus};
use crate::buffer::{Lease, Path};
use crate::error::{Error, Result};
use crate::queue_batch::QueueBatch;
use crate::volume::{pieces, VolumePath};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// An entry whose pieces are in flight.
struct Pending {
    cookie: u64,
    len: u64,
    path: Path,
    /// (member, offset on it) of each piece, by piece index.
    pieces: [(usize, u64); 2],
    remaining: usize,
    failure: Option<(IoStatus, Error)>,
}

/// Queue batches on every member of a volume.
pub(crate) struct VolumeQueueBatch {
    members: Vec<QueueBatch>,
    names: Vec<String>,
    chunk: u64,
    capacity: usize,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    ready: Vec<(IoEvent, Path)>,
}

impl std::fmt::Debug for VolumeQueueBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VolumeQueueBatch({} members, {} pending)", self.members.len(), self.pending.len())
    }
}

/// A piece's cookie in its member's batch: the entry's id and the piece's index.
fn piece_cookie(id: u64, piece: usize) -> u64 {
    id << 1 | piece as u64
}

impl VolumeQueueBatch {
    /// Queue batches of `capacity` entries on every member; `None` when a member's controller
    /// does not grant a queue that deep or a chunk needs more than one command.
    pub(crate) fn new(vol: &VolumePath, capacity: usize) -> Option<Self> {
        let mut members = Vec::with_capacity(vol.members().len());
        for (i, m) in vol.members().iter().enumerate() {
            if m.ns.max_command_bytes() < vol.chunk() {
                return None;
            }
            // An entry crossing a chunk boundary puts two pieces on one member of a
            // one-member volume: room for two per entry.
            members.push(QueueBatch::on_member(&m.dev, &m.ns, 2 * capacity, i).ok()?);
        }
        Some(VolumeQueueBatch {
            members,
            names: vol.names().to_vec(),
            chunk: vol.chunk(),
            capacity,
            next_id: 0,
            pending: HashMap::new(),
            ready: Vec::new(),
        })
    }

    /// Entries in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Submits checked entries (each at most one chunk), one doorbell per member touched.
    pub(crate) fn submit(&mut self, entries: Vec<Entry>) -> Result<()> {
        if self.in_flight() + entries.len() > self.capacity {
            return Err(Error::invalid("ios", format!("{} entries exceed the batch's free capacity", entries.len())));
        }
        let n = self.members.len();
        let mut per_member: Vec<Vec<Entry>> = (0..n).map(|_| Vec::new()).collect();
        for e in entries {
            let id = self.next_id;
            self.next_id += 1;
            let ps: Vec<_> = pieces(n, self.chunk, e.dev_offset, e.len).collect();
            if ps.len() > 2 || e.len > self.chunk {
                let err =
                    Error::invalid("len", format!("{} bytes exceed the volume's {}-byte chunk", e.len, self.chunk));
                self.ready.push((
                    IoEvent { cookie: e.cookie, status: IoStatus::Invalid, bytes: 0, error: Some(err) },
                    e.lease.buffer().path(),
                ));
                continue;
            }
            // Every piece holds its own lease; all are taken before any piece is submitted.
            let leases: Result<Vec<_>> = ps.iter().map(|_| Lease::new(e.lease.holder().clone())).collect();
            let leases = match leases {
                Ok(l) => l,
                Err(err) => {
                    self.ready.push((
                        IoEvent { cookie: e.cookie, status: IoStatus::Failed, bytes: 0, error: Some(err) },
                        e.lease.buffer().path(),
                    ));
                    continue;
                }
            };
            let mut at = [(0usize, 0u64); 2];
            for (k, (p, lease)) in ps.iter().zip(leases).enumerate() {
                at[k] = (p.member, p.member_offset);
                per_member[p.member].push(Entry {
                    op: e.op,
                    lease,
                    buf_offset: e.buf_offset + p.request_offset,
                    dev_offset: p.member_offset,
                    len: p.len,
                    cookie: piece_cookie(id, k),
                });
            }
            let path = e.lease.buffer().path();
            self.pending.insert(
                id,
                Pending { cookie: e.cookie, len: e.len, path, pieces: at, remaining: ps.len(), failure: None },
            );
        }
        for (m, es) in per_member.into_iter().enumerate() {
            if es.is_empty() {
                continue;
            }
            let cookies: Vec<u64> = es.iter().map(|e| e.cookie).collect();
            if let Err(err) = self.members[m].submit(es) {
                // Nothing of this member's share was submitted (its leases went back): those
                // pieces failed.
                let why = err.to_string();
                let evs = cookies
                    .into_iter()
                    .map(|c| {
                        let e = Error::invalid("batch", format!("submitting to the member failed: {why}"));
                        (IoEvent { cookie: c, status: IoStatus::Failed, bytes: 0, error: Some(e) }, Path::DirectHost)
                    })
                    .collect();
                self.absorb(m, evs);
            }
        }
        Ok(())
    }

    /// Takes member `m`'s piece events; entries whose last piece arrived become ready.
    fn absorb(&mut self, m: usize, events: Vec<(IoEvent, Path)>) {
        for (ev, _) in events {
            let id = ev.cookie >> 1;
            let Some(p) = self.pending.get_mut(&id) else { continue };
            p.remaining = p.remaining.saturating_sub(1);
            if ev.status != IoStatus::Complete && p.failure.is_none() {
                let (member, offset) = p.pieces[(ev.cookie & 1) as usize];
                debug_assert_eq!(member, m);
                let source = ev.error.unwrap_or_else(|| Error::invalid("batch", format!("{:?}", ev.status)));
                let err = Error::Member { member: self.names[member].clone(), offset, source: Box::new(source) };
                p.failure = Some((ev.status, err));
            }
            if p.remaining == 0 {
                if let Some(p) = self.pending.remove(&id) {
                    let ev = match p.failure {
                        None => IoEvent { cookie: p.cookie, status: IoStatus::Complete, bytes: p.len, error: None },
                        Some((status, e)) => IoEvent { cookie: p.cookie, status, bytes: 0, error: Some(e) },
                    };
                    self.ready.push((ev, p.path));
                }
            }
        }
    }

    /// Waits until at least `min` entries finished (or `timeout` passed, or none runs) and
    /// returns every finished entry's event with the path its data took.
    pub(crate) fn status(&mut self, min: usize, timeout: Duration) -> Result<Vec<(IoEvent, Path)>> {
        let start = Instant::now();
        loop {
            for m in 0..self.members.len() {
                let evs = self.members[m].status(0, Duration::ZERO)?;
                self.absorb(m, evs);
            }
            if self.ready.len() >= min || self.pending.is_empty() || start.elapsed() > timeout {
                return Ok(std::mem::take(&mut self.ready));
            }
            std::hint::spin_loop();
        }
    }

    /// Waits for every piece in flight (each member's batch resets its controller past its
    /// deadline, or keeps the leases for good) and returns every entry's event.
    pub(crate) fn cancel(&mut self) -> Result<Vec<(IoEvent, Path)>> {
        let mut first_err = None;
        for m in 0..self.members.len() {
            match self.members[m].cancel() {
                Ok(evs) => self.absorb(m, evs),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(std::mem::take(&mut self.ready)),
        }
    }
}

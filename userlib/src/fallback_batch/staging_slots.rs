//! A fallback batch's GPU staging: pinned slots carved from staging chunks (taken from the
//! GPU's pool when the slots run out, kept for the batch's life) for small entries, whole
//! chunks of the pool for larger ones, and a few copy queues ("lanes") whose copies `status`
//! polls instead of waiting for.

use crate::error::{Error, Result};
use crate::gpu::{CopyQueue, Gpu, PinnedHost, ToDevice, STAGING_CHUNK};
use crate::inflight::{InFlight, Why};
use std::sync::Arc;

/// GPU entries up to this size stage through a slot; larger ones (up to a whole chunk) take a
/// chunk of the GPU's pool.
const SLOT: usize = 64 << 10;
const SLOTS_PER_CHUNK: usize = STAGING_CHUNK / SLOT;
/// Copy queues a batch spreads its copies over (a queue is polled as a whole, so entries on an
/// idle queue are not held up by a busy one).
const LANES: usize = 4;

/// One entry's staging memory.
#[derive(Debug)]
pub(super) enum Stage {
    /// Slot `n` of the batch's chunks.
    Slot(usize),
    /// A chunk of the GPU's pool.
    Chunk(PinnedHost),
}

/// A copy queue and the entries whose copies run on it.
#[derive(Debug)]
struct Lane {
    q: Box<dyn CopyQueue>,
    ids: Vec<usize>,
}

/// Staging memory and copy queues of the one GPU whose memory a batch stages.
#[derive(Debug)]
pub(super) struct Staging {
    gpu: Arc<Gpu>,
    chunks: Vec<PinnedHost>,
    free: Vec<usize>,
    lanes: Vec<Lane>,
    /// Copies to the device asked for since the last [`Staging::flush`], started together:
    /// (entry, device address, staging address, bytes). The staging address is kept as a
    /// number so the batch stays `Send`; it points into `chunks` or an entry's chunk.
    pending: Vec<(usize, u64, usize, usize)>,
    /// Set when a slot's memory may still be used by the kernel or a copy (the slot's entry
    /// failed with a token): the chunks then go into this token when the staging is dropped.
    kept: Option<InFlight>,
}

impl Staging {
    /// Staging for `gpu`; nothing is taken until the first entry.
    pub(super) fn new(gpu: Arc<Gpu>) -> Staging {
        Staging { gpu, chunks: Vec::new(), free: Vec::new(), lanes: Vec::new(), pending: Vec::new(), kept: None }
    }

    /// Staging memory for an entry of `len` bytes (at most a staging chunk).
    pub(super) fn take(&mut self, len: usize) -> Result<Stage> {
        if len > SLOT {
            let chunk = self.gpu.take_staging(1)?.pop();
            return chunk.map(Stage::Chunk).ok_or_else(|| Error::invalid("staging", "the pool gave no chunk"));
        }
        if self.free.is_empty() {
            // One more chunk of slots; they stay with the batch.
            self.chunks.extend(self.gpu.take_staging(1)?);
            let base = (self.chunks.len() - 1) * SLOTS_PER_CHUNK;
            self.free.extend((base..base + SLOTS_PER_CHUNK).rev());
        }
        self.free.pop().map(Stage::Slot).ok_or_else(|| Error::invalid("staging", "no slot"))
    }

    /// The start of `s`'s memory.
    pub(super) fn ptr(&self, s: &Stage) -> *mut u8 {
        match s {
            Stage::Slot(n) => self.chunks[n / SLOTS_PER_CHUNK].as_ptr().wrapping_add((n % SLOTS_PER_CHUNK) * SLOT),
            Stage::Chunk(c) => c.as_ptr(),
        }
    }

    /// Takes `s` back; with its entry's token (`in_flight`), the kernel or a copy may still use
    /// it, so it is never reused: a chunk goes into the token, a slot keeps its whole chunk (which
    /// holds other slots) for good.
    pub(super) fn release(&mut self, s: Stage, in_flight: Option<&mut InFlight>) {
        match (s, in_flight) {
            (Stage::Slot(n), None) => self.free.push(n),
            (Stage::Slot(_), Some(t)) => {
                let why = t.why();
                self.kept.get_or_insert_with(|| InFlight::new(why));
            }
            (Stage::Chunk(c), None) => self.gpu.put_staging(vec![c]),
            (Stage::Chunk(c), Some(t)) => t.hold(c),
        }
    }

    /// Copies `len` bytes between `s` and device address `dev` (to the host when `to_host`),
    /// for entry `id`, which [`Staging::poll`] reports once the copy is done. A copy to the
    /// host starts now; one to the device waits for [`Staging::flush`], which starts all of
    /// them in one call (the reads that completed together).
    ///
    /// # Safety
    ///
    /// `len` is at most `s`'s size; `dev..dev+len` is device memory of this staging's GPU that
    /// stays allocated, and `s` stays with the entry, until `poll` reports `id` (or `flush`
    /// reports it failed).
    pub(super) unsafe fn copy(&mut self, id: usize, s: &Stage, to_host: bool, dev: u64, len: usize) -> Result<()> {
        let host = self.ptr(s);
        if !to_host {
            self.pending.push((id, dev, host as usize, len));
            return Ok(());
        }
        let lane = self.lane()?;
        let l = &mut self.lanes[lane];
        // SAFETY: `host` is `s`'s memory, at least `len` bytes, which the batch touches no more
        // until `poll` reports the copy done; the device range is the caller's promise.
        unsafe { l.q.to_host(host, dev, len)? };
        l.ids.push(id);
        Ok(())
    }

    /// Starts the copies to the device that [`Staging::copy`] deferred, on one lane. Entries
    /// that failed go to `failed` with the reason and, when their copies may still run, a
    /// token: when the call fails, those copies and the lane's earlier ones may have started
    /// (the lane is never used again and their memory must be kept for good); when no lane
    /// could be had, none started.
    pub(super) fn flush(&mut self, failed: &mut Vec<(usize, String, Option<InFlight>)>) {
        if self.pending.is_empty() {
            return;
        }
        let lane = match self.lane() {
            Ok(lane) => lane,
            Err(e) => {
                // Nothing started.
                failed.extend(self.pending.drain(..).map(|(id, ..)| (id, e.to_string(), None)));
                return;
            }
        };
        let copies: Vec<ToDevice> =
            self.pending.iter().map(|&(_, dst, host, len)| ToDevice { dst, src: host as *const u8, len }).collect();
        let l = &mut self.lanes[lane];
        l.ids.extend(self.pending.drain(..).map(|(id, ..)| id));
        // SAFETY: each copy was checked by `copy`'s caller (its contract): staging memory of
        // its entry, untouched until the lane reports it, into device memory that stays
        // allocated as long.
        if let Err(e) = unsafe { l.q.to_device_many(&copies) } {
            self.abandon_lane(lane, &e, failed);
        }
    }

    /// Takes lane `i` out of use for good after its queue failed with `e` (its copies may still
    /// run, so a token keeps the queue); its entries go to `failed`, each with a token.
    fn abandon_lane(&mut self, i: usize, e: &Error, failed: &mut Vec<(usize, String, Option<InFlight>)>) {
        let lane = self.lanes.swap_remove(i);
        InFlight::new(Why::Copy).holding(lane.q).keep();
        failed.extend(lane.ids.into_iter().map(|id| (id, e.to_string(), Some(InFlight::new(Why::Copy)))));
    }

    /// The lane for the next copy: an idle one, a new one while fewer than [`LANES`], else the
    /// least busy.
    fn lane(&mut self) -> Result<usize> {
        if let Some(i) = self.lanes.iter().position(|l| l.ids.is_empty()) {
            return Ok(i);
        }
        if self.lanes.len() < LANES {
            self.lanes.push(Lane { q: self.gpu.take_queue()?, ids: Vec::new() });
            return Ok(self.lanes.len() - 1);
        }
        Ok((0..self.lanes.len()).min_by_key(|&i| self.lanes[i].ids.len()).unwrap_or(0))
    }

    /// Polls the lanes without waiting: entries whose copies are done go to `done`; those of a
    /// lane that failed (its copies may still run: the lane is never used again) go to
    /// `failed` with the reason and a token. True while copies still run.
    pub(super) fn poll(&mut self, done: &mut Vec<usize>, failed: &mut Vec<(usize, String, Option<InFlight>)>) -> bool {
        let mut busy = false;
        let mut i = 0;
        while i < self.lanes.len() {
            if self.lanes[i].ids.is_empty() {
                i += 1;
                continue;
            }
            match self.lanes[i].q.poll() {
                Ok(true) => done.append(&mut self.lanes[i].ids),
                Ok(false) => busy = true,
                Err(e) => {
                    self.abandon_lane(i, &e, failed);
                    continue;
                }
            }
            i += 1;
        }
        busy
    }

    /// Whether a failed copy or ring left memory of a slot in use: the chunks are then kept for
    /// good.
    #[cfg(test)]
    pub(super) fn keeps_its_chunks(&self) -> bool {
        self.kept.is_some()
    }

    /// Whether this stages memory of `gpu`.
    pub(super) fn is_for(&self, gpu: &Arc<Gpu>) -> bool {
        Arc::ptr_eq(&self.gpu, gpu)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The batch waited for its entries before dropping this.
        let chunks = std::mem::take(&mut self.chunks);
        match self.kept.take() {
            Some(t) => t.holding(chunks).keep(),
            None => self.gpu.put_staging(chunks),
        }
        for l in self.lanes.drain(..) {
            self.gpu.put_queue(l.q);
        }
    }
}

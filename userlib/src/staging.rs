//! The GPU staging pipeline both paths use when the SSD cannot reach GPU memory itself: data
//! moves through two host chunks, each with its own copy queue, so the disk transfer of one
//! chunk overlaps the copy of the other.

use crate::error::Result;
use crate::gpu::{Gpu, STAGING_CHUNK};
use std::cell::Cell;

thread_local! {
    /// Set when an I/O of this thread failed while data movement it started may still run (a
    /// copy queue that cannot say it is done, a kernel request never reaped): the memory it
    /// names must then stay leased for good.
    static LEFT_RUNNING: Cell<bool> = const { Cell::new(false) };
}

/// Records that the failing I/O of this thread left data movement running.
pub(crate) fn note_left_running() {
    LEFT_RUNNING.with(|c| c.set(true));
}

/// Whether the last failed I/O of this thread left data movement running (and clears it).
pub(crate) fn take_left_running() -> bool {
    LEFT_RUNNING.with(|c| c.replace(false))
}

/// The staging pipeline: two chunks, each with its own copy queue. For reads, the disk fills
/// chunk k+1 while chunk k is copied to the device; for writes, the device copies chunk k+1 out
/// while chunk k goes to disk. `disk(ptr, n, at)` moves `n` bytes between the chunk at `ptr`
/// and the target at relative offset `at`. `chunks` are the caller's own staging chunks (each
/// [`STAGING_CHUNK`] bytes, e.g. registered with the module); by default they come from the
/// GPU's pinned pool.
pub(crate) fn staged(
    gpu: &Gpu,
    write: bool,
    dev_ptr: u64,
    len: usize,
    chunks: Option<[*mut u8; 2]>,
    mut disk: impl FnMut(*mut u8, usize, u64) -> Result<usize>,
) -> Result<usize> {
    let nchunks = len.div_ceil(STAGING_CHUNK);
    // One chunk needs one lane (a small I/O pays for one staging buffer and one queue).
    let lanes = nchunks.clamp(1, 2);
    let pooled = match chunks {
        Some(_) => Vec::new(),
        None => gpu.take_staging(lanes)?,
    };
    let stage: [*mut u8; 2] = match chunks {
        Some(c) => c,
        None => [pooled[0].as_ptr(), pooled.get(1).map_or(std::ptr::null_mut(), |p| p.as_ptr())],
    };
    let mut qs = match gpu.take_queues(lanes) {
        Ok(q) => q,
        Err(e) => {
            gpu.put_staging(pooled);
            return Err(e);
        }
    };
    let piece = |k: usize| (k * STAGING_CHUNK, STAGING_CHUNK.min(len - k * STAGING_CHUNK));
    let mut run = |qs: &mut Vec<Box<dyn crate::gpu::CopyQueue>>| -> Result<usize> {
        let mut done = 0;
        if write {
            let (at, n) = piece(0);
            // SAFETY: chunk 0 holds STAGING_CHUNK >= n bytes and is not touched until wait.
            unsafe { qs[0].to_host(stage[0], dev_ptr + at as u64, n)? };
        }
        for k in 0..nchunks {
            let i = k % 2;
            let (at, n) = piece(k);
            // Chunk i is free again (its previous copy finished) / holds chunk k's data.
            qs[i].wait()?;
            if write {
                if k + 1 < nchunks {
                    let (at1, n1) = piece(k + 1);
                    // SAFETY: the other chunk's previous use (disk write k-1) has returned.
                    unsafe { qs[1 - i].to_host(stage[1 - i], dev_ptr + at1 as u64, n1)? };
                }
                let got = disk(stage[i], n, at as u64)?;
                done += got;
                if got < n {
                    break;
                }
            } else {
                let got = disk(stage[i], n, at as u64)?;
                // SAFETY: chunk i stays untouched until its queue is waited on.
                unsafe { qs[i].to_device(dev_ptr + at as u64, stage[i], got)? };
                done += got;
                if got < n {
                    break;
                }
            }
        }
        for q in qs.iter_mut() {
            gpu.wait_copy(q.as_mut(), len)?;
        }
        Ok(done)
    };
    let r = run(&mut qs);
    // A failed copy queue may still be copying: only healthy ones go back to the pools.
    if r.is_ok() {
        qs.into_iter().for_each(|q| gpu.put_queue(q));
        gpu.put_staging(pooled);
    } else if qs.iter_mut().all(|q| q.wait().is_ok()) {
        gpu.put_staging(pooled);
    } else {
        // A copy may still be running into or out of these chunks (ours or the caller's) and
        // the GPU memory: never free them, and tell the caller to keep its lease.
        std::mem::forget(pooled);
        note_left_running();
    }
    r
}

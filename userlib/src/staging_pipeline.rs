//! The GPU staging pipeline both paths use when the SSD cannot reach GPU memory itself: data
//! moves through two host chunks, each with its own copy queue, so the disk transfer of one
//! chunk overlaps the copy of the other.

use crate::gpu::{Gpu, STAGING_CHUNK};
use crate::inflight::{InFlight, IoResult, Why};

/// The staging pipeline: two chunks, each with its own copy queue. For reads, the disk fills
/// chunk k+1 while chunk k is copied to the device; for writes, the device copies chunk k+1 out
/// while chunk k goes to disk. `disk(ptr, n, at)` moves `n` bytes between the chunk at `ptr`
/// and the target at relative offset `at`. `chunks` are the caller's own staging chunks (each
/// [`STAGING_CHUNK`] bytes, e.g. registered with the module); by default they come from the
/// GPU's pinned pool. When `disk` or a copy leaves data movement running, the failure's token
/// holds the pool's chunks (never returned) and the copy queues that cannot say they are done;
/// the caller's own chunks are the caller's to keep with it.
pub(crate) fn staged(
    gpu: &Gpu,
    write: bool,
    dev_ptr: u64,
    len: usize,
    chunks: Option<[*mut u8; 2]>,
    mut disk: impl FnMut(*mut u8, usize, u64) -> IoResult<usize>,
) -> IoResult<usize> {
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
            return Err(e.into());
        }
    };
    let piece = |k: usize| (k * STAGING_CHUNK, STAGING_CHUNK.min(len - k * STAGING_CHUNK));
    let mut run = |qs: &mut Vec<Box<dyn crate::gpu::CopyQueue>>| -> IoResult<usize> {
        let mut done = 0;
        if write {
            let (at, n) = piece(0);
            // SAFETY: chunk 0 holds STAGING_CHUNK >= n bytes and is not touched until wait.
            unsafe { qs[0].to_host(stage[0], dev_ptr + at as u64, n)? };
        }
        for k in 0..nchunks {
            let i = k % 2;
            let (at, n) = piece(k);
            // Chunk i is free again (its previous copy finished) / holds chunk k's data. A
            // small I/O polls for it, as for the last copy (a blocking wait sleeps for longer
            // than the copy takes).
            gpu.wait_copy(qs[i].as_mut(), len)?;
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
    match run(&mut qs) {
        Ok(n) => {
            qs.into_iter().for_each(|q| gpu.put_queue(q));
            gpu.put_staging(pooled);
            Ok(n)
        }
        Err(mut f) => {
            // A failed copy queue may still be copying into or out of the chunks and the GPU
            // memory: it is kept, never reused or destroyed.
            if !qs.iter_mut().all(|q| q.wait().is_ok()) {
                f.add(InFlight::new(Why::Copy).holding(qs));
            }
            // The pool's chunks go back only when nothing may still use them.
            if let Some(pooled) = f.hold_if_running(pooled) {
                gpu.put_staging(pooled);
            }
            Err(f)
        }
    }
}

//! A stream's one read into GPU memory with its copy queued before its data arrives: the copy
//! queue gets a wait for a word the host stores once the disk read has filled the staging
//! chunk, then the copy, then the store that releases the stream, all while the disk read is in
//! flight. When the read completes, the host's part is one plain store; the runtime calls that
//! queue the copy (3 to 4 us each on the H100) are off the critical path (`docs/gpu/run-24.txt`).
//!
//! Only a read of one staging chunk that the file covers takes this way: a short read would
//! copy the rest of the chunk, which is zeroed then (the file shrank under the read), so that
//! no earlier read's data lands in the buffer.

use super::{io_err, ring_left, with_ring, FileTarget};
use crate::error::Error;
use crate::gpu::stream::CompletionWord;
use crate::gpu::GpuMemory;
use crate::inflight::{InFlight, IoResult, Why};
use crate::stream_tail::{self, Copying, Release};
use io_uring::{opcode, types};
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Stores the value that lets a queue's wait pass when dropped: a queue left waiting would
/// never finish (and whoever waits for it, never return).
struct Gate<'a>(&'a CompletionWord, u32);

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        self.0.store(self.1);
    }
}

impl FileTarget {
    /// [`FileTarget::read_gpu`] for a stream's one I/O of at most one staging chunk, released
    /// as `r` says; `None` when it does not take this way (nothing was done).
    pub(super) fn read_gpu_queued(
        &self,
        mem: &Arc<GpuMemory>,
        dev_ptr: u64,
        len: usize,
        file_offset: u64,
        r: &Release,
    ) -> IoResult<Option<usize>> {
        if !self.covers(file_offset, len)? {
            return Ok(None);
        }
        let gpu = mem.gpu();
        let stage = gpu.take_staging(1)?;
        let mut q = match gpu.take_queue() {
            Ok(q) => q,
            Err(e) => {
                gpu.put_staging(stage);
                return Err(e.into());
            }
        };
        // Queued before the read is submitted (a queue that cannot wait changes nothing).
        match q.wait_word(&r.staged, r.value) {
            Ok(true) => {}
            other => {
                if let Err(e) = other {
                    log::debug!("queueing a copy ahead of its read: {e}");
                }
                gpu.put_queue(q);
                gpu.put_staging(stage);
                return Ok(None);
            }
        }
        let gate = Gate(&r.staged, r.value);
        let chunk = stage[0].as_ptr();
        // (the read's result, whether the store behind the copy is queued)
        let read = with_ring(|ring| -> IoResult<(i32, bool)> {
            let e = opcode::Read::new(types::Fd(self.file.as_raw_fd()), chunk, len as u32)
                .offset(file_offset)
                .build()
                .user_data(0);
            // SAFETY: the chunk stays untouched (the copy waits for the gate) until the read is
            // reaped below.
            if unsafe { ring.submission().push(&e) }.is_err() {
                return Err(Error::invalid("ring", "submission queue full").into());
            }
            // The runtime's calls go in while the disk works.
            if let Err(e) = ring.submit() {
                return Err(ring_left(io_err("io_uring_enter", e)));
            }
            // SAFETY: the chunk holds `len` bytes (read, or zeroed below) before the gate opens,
            // and stays until the queue is over (the copy keeps it).
            let copied = unsafe { q.to_device(dev_ptr, chunk, len) };
            let stored = copied.is_ok()
                && q.signal(&r.word, r.value).unwrap_or_else(|e| {
                    log::debug!("queueing a stream's completion behind its copy: {e}");
                    false
                });
            let res = loop {
                if let Some(c) = ring.completion().next() {
                    break c.result();
                }
                if let Err(e) = self.enter(ring, 1) {
                    return Err(ring_left(io_err("io_uring_enter", e)));
                }
            };
            copied?;
            Ok((res, stored))
        });
        let (res, stored) = match read {
            Ok(x) => x,
            Err(mut f) => {
                // The chunk may still be read into, and the copy from it runs once the gate
                // opens: they, the queue and the memory stay with the failure's token.
                drop(gate);
                f.add(InFlight::new(Why::Copy));
                drop(f.hold_if_running((stage, q, mem.clone())));
                return Err(f);
            }
        };
        let got = usize::try_from(res).unwrap_or(0).min(len);
        if got < len {
            // Short (the file shrank) or failed: what the copy takes beyond the data is zeros,
            // never an earlier read's bytes.
            // SAFETY: the chunk is at least `len` long, and nothing uses it now (the read was
            // reaped; the copy waits for the gate).
            unsafe { std::ptr::write_bytes(chunk.add(got), 0, len - got) };
        }
        drop(gate);
        if res < 0 || !stored {
            // The copy's end is waited for here; without a store behind it the stream's word is
            // the host's to store.
            let waited = q.wait();
            let kept = match gpu.settle_queue(waited, q) {
                Ok(()) => {
                    gpu.put_staging(stage);
                    Ok(())
                }
                Err(mut f) => {
                    drop(f.hold_if_running((stage, mem.clone())));
                    Err(f)
                }
            };
            if res < 0 {
                let e = std::io::Error::from_raw_os_error(-res);
                return Err(io_err(format!("read {} at {file_offset}", self.path), e).into());
            }
            return kept.map(|()| Some(got));
        }
        let c = Copying::new(gpu.clone(), q, stage, mem.clone()).with_store_queued();
        // Offered (the caller checked): left running; were it not, dropping it waits.
        drop(stream_tail::defer(c));
        Ok(Some(got))
    }

    /// Whether the file is known to hold `len` bytes at `file_offset` (its size is asked again
    /// only when the last size known says no).
    fn covers(&self, file_offset: u64, len: usize) -> IoResult<bool> {
        let end = file_offset.saturating_add(len as u64);
        let known = self.known_len.load(std::sync::atomic::Ordering::Relaxed);
        if end <= known {
            return Ok(true);
        }
        let now = self.capacity()?;
        self.known_len.store(now, std::sync::atomic::Ordering::Relaxed);
        Ok(end <= now)
    }
}

#[cfg(test)]
mod tests {
    use crate::fallback::tests::TempFile;
    use crate::gpu::Gpu;
    use crate::storage::ConcretePath;
    use crate::stream_io::{StreamIo, StreamJob};
    use crate::stream_tail::one_io;
    use crate::CpuStream;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_read_past_the_end_the_size_known_promised_copies_zeros_not_an_earlier_reads_bytes() {
        let f = TempFile::new("queued-short", 64 << 10);
        let st = f.storage();
        let ConcretePath::File(t) = st.concrete_path() else { panic!("a file target") };
        let buf = Arc::new(st.register_gpu(Arc::new(Gpu::cpu().alloc(4096).unwrap()), false).unwrap());
        let sio = StreamIo::new(CpuStream::new().unwrap()).unwrap();
        let engine = st.engine().unwrap();
        // A stream-ordered read of 4 KiB at `off` into the buffer; its result.
        let read = |off: u64| {
            let got = Arc::new(AtomicU64::new(u64::MAX));
            let (s, b, g) = (st.clone(), buf.clone(), got.clone());
            let job: StreamJob = Box::new(move || {
                let n = one_io(|| s.read(&b, 0, off, 4096));
                g.store(n.unwrap_or(u64::MAX - 1), Ordering::Release);
            });
            sio.submit_jobs(&engine, vec![job]).unwrap();
            sio.synchronize().unwrap();
            got.load(Ordering::Acquire)
        };
        assert_eq!(read(8192), 4096);
        assert_eq!(sio.copies_signalled(), 1, "the copy was queued with its store");
        // The file was larger when last asked (it shrank since): the read takes this way and
        // comes back short, with its copy already queued.
        t.known_len.store(1 << 20, Ordering::Relaxed);
        assert_eq!(read(64 << 10), 0);
        let mut out = vec![1u8; 4096];
        buf.copy_out(0, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0), "bytes past the end are not zeros (an earlier read's?)");
    }
}

//! Streams: a GPU runtime's ordered work queue, seen through the operations stream-ordered I/O
//! needs — store into a host-mapped 32-bit word (or run a short host function) when the stream
//! reaches a point, and make the stream wait until such a word reaches a value.
//!
//! [`CpuStream`] implements them with a thread, so the ordering logic of
//! [`crate::stream_io`] is tested without a GPU; `gpu::cuda` implements them with
//! `cuStreamWriteValue32`, `cuLaunchHostFunc` and `cuStreamWaitValue32`, and queues a group's
//! waits and its closing store as one `cuStreamBatchMemOp`.

use crate::error::{Error, Result};
use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A 32-bit word in host memory that the stream's device can read (for CUDA: page-locked,
/// device-mapped memory). The library stores completion counters in it; streams wait on it.
#[derive(Clone)]
pub struct CompletionWord {
    inner: Arc<WordInner>,
    /// The runtime that pinned and mapped the word for its devices (none: plain host memory,
    /// which only a host thread may store into).
    mapped_by: Option<super::Vendor>,
}

struct WordInner {
    host: *const AtomicU32,
    device: u64,
    _owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: `host` points into memory owned by `_owner`, which lives as long as this value; the
// word is only accessed atomically.
unsafe impl Send for WordInner {}
// SAFETY: as above.
unsafe impl Sync for WordInner {}

impl std::fmt::Debug for CompletionWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompletionWord({} @ {:#x})", self.load(), self.inner.device)
    }
}

impl CompletionWord {
    /// Wraps a word at `host` (device address `device`) kept alive by `owner`.
    ///
    /// # Safety
    ///
    /// `host` must be valid, 4-byte aligned and only accessed atomically for as long as
    /// `owner` lives.
    pub unsafe fn new(host: *const AtomicU32, device: u64, owner: Box<dyn Any + Send + Sync>) -> Self {
        CompletionWord { inner: Arc::new(WordInner { host, device, _owner: owner }), mapped_by: None }
    }

    /// Says that `vendor`'s runtime pinned and mapped the word (its page-locked, device-mapped
    /// memory), so that its devices may store into it.
    pub(crate) fn mapped_by(mut self, vendor: super::Vendor) -> Self {
        self.mapped_by = Some(vendor);
        self
    }

    /// A word in ordinary host memory (for [`CpuStream`]).
    pub fn host() -> Self {
        let b = Box::new(AtomicU32::new(0));
        let p: *const AtomicU32 = &*b;
        // SAFETY: the box owns the atomic and is kept by the word.
        unsafe { Self::new(p, p as u64, b) }
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: see `new`: valid while `_owner`, held by `inner`, lives.
        unsafe { &*self.inner.host }
    }

    /// Current value.
    pub fn load(&self) -> u32 {
        self.word().load(Ordering::Acquire)
    }

    /// Publishes `v` (Release: everything written before is visible to whoever sees `v`).
    pub fn store(&self, v: u32) {
        self.word().store(v, Ordering::Release)
    }

    /// The address the stream's device uses.
    pub fn device_addr(&self) -> u64 {
        self.inner.device
    }

    /// Whether a device of `vendor`'s runtime may store into the word at its device address
    /// from any context: the runtime mapped it, and that address is its host address (unified
    /// addressing), not one valid in the stream's context only.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn device_writable_by(&self, vendor: super::Vendor) -> bool {
        self.mapped_by == Some(vendor) && self.inner.device == self.inner.host as u64
    }

    /// True when the word has reached `value` (cyclic comparison, as CUDA's GEQ wait: wraps).
    pub fn reached(&self, value: u32) -> bool {
        self.load().wrapping_sub(value) as i32 >= 0
    }
}

/// A host function queued on a stream.
pub type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// An ordered GPU work queue.
pub trait Stream: Send + Sync + std::fmt::Debug {
    /// A word this stream can wait on.
    fn completion_word(&self) -> Result<CompletionWord>;
    /// Queues `f`: it runs (on a runtime thread; it must be short and must not call the
    /// runtime) when everything queued before it is done.
    fn host_fn(&self, f: HostFn) -> Result<()>;
    /// Queues a wait: later work starts once `word` has reached `value` (cyclic `>=`).
    fn wait_word(&self, word: &CompletionWord, value: u32) -> Result<()>;
    /// Queues a store of `value` into `word`, done once everything queued before it is. By
    /// default a host function; a runtime that can write memory from the stream itself
    /// (CUDA's `cuStreamWriteValue32`) spares the round trip to a host thread.
    fn write_word(&self, word: &CompletionWord, value: u32) -> Result<()> {
        let word = word.clone();
        self.host_fn(Box::new(move || word.store(value)))
    }
    /// Queues a wait for each `(word, value)` of `waits` and behind them a store of `stored` into
    /// `out` ([`Stream::wait_word`]s, then [`Stream::write_word`]). On error some waits may
    /// not have been queued. CUDA queues them all as one batch of memory operations, which the
    /// stream also runs sooner than separate ones.
    fn waits_then_write(&self, waits: &[(&CompletionWord, u32)], out: &CompletionWord, stored: u32) -> Result<()> {
        for &(w, v) in waits {
            self.wait_word(w, v)?;
        }
        self.write_word(out, stored)
    }
    /// Makes the stream's context current on the calling thread and leaves it so (a thread of
    /// the library's own that serves the stream: its GPU calls then find the context bound).
    fn bind_thread(&self) -> Result<()> {
        Ok(())
    }
    /// Blocks until everything queued so far is done.
    fn synchronize(&self) -> Result<()>;
    /// Whether the stream has nothing left to do: everything queued on it so far is done, and
    /// so is everything its next work would implicitly wait for (CUDA: the legacy default
    /// stream's work, for a stream that synchronizes with it). False where the runtime cannot
    /// tell, which is always safe: stream-ordered I/O then waits for the stream to reach it.
    fn is_idle(&self) -> bool {
        false
    }
    /// The runtime's handle (`CUstream` for CUDA), for callers that launch their own work.
    fn raw(&self) -> usize;
}

enum Job {
    Run(HostFn),
    Wait(CompletionWord, u32),
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs ever queued (tests tell what stream-ordered I/O queued on the stream).
    pushed: u64,
    /// Jobs taken but not finished (0 or 1).
    running: usize,
    closed: bool,
}

/// A stream run by a thread: host functions run in order, waits spin and then sleep until the
/// word is reached. Work of the "GPU" (kernels in the CUDA tests) is queued with
/// [`CpuStream::launch`].
#[derive(Debug)]
pub struct CpuStream {
    shared: Arc<(Mutex<QueueDebug>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The fork generation its thread was started in.
    born: crate::fork::Born,
}

/// `Queue` with a Debug impl that does not print closures.
struct QueueDebug(Queue);

impl std::fmt::Debug for QueueDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} queued, {} running", self.0.jobs.len(), self.0.running)
    }
}

impl CpuStream {
    /// Starts the stream's thread.
    pub fn new() -> Result<Arc<CpuStream>> {
        let born = crate::fork::watch()?;
        let shared = Arc::new((Mutex::new(QueueDebug(Queue::default())), Condvar::new()));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ugds-cpu-stream".into())
            .spawn(move || Self::run(&s))
            .map_err(|e| Error::Io { op: "spawning the CPU stream thread".into(), source: e })?;
        Ok(Arc::new(CpuStream { shared, thread: Some(thread), born }))
    }

    fn run(shared: &(Mutex<QueueDebug>, Condvar)) {
        let (m, cv) = shared;
        loop {
            let job = {
                let mut q = m.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(j) = q.0.jobs.pop_front() {
                        q.0.running = 1;
                        break j;
                    }
                    if q.0.closed {
                        return;
                    }
                    q = cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            match job {
                Job::Run(f) => f(),
                Job::Wait(w, v) => {
                    let mut spins = 0u32;
                    while !w.reached(v) {
                        spins += 1;
                        if spins < 1000 {
                            std::hint::spin_loop();
                        } else {
                            std::thread::sleep(Duration::from_micros(20));
                        }
                    }
                }
            }
            let mut q = m.lock().unwrap_or_else(|e| e.into_inner());
            q.0.running = 0;
            cv.notify_all();
        }
    }

    fn push(&self, j: Job) -> Result<()> {
        // A forked child has no stream thread: the work would never run.
        self.born.check("stream")?;
        let (m, cv) = &*self.shared;
        let mut q = m.lock().unwrap_or_else(|e| e.into_inner());
        q.0.jobs.push_back(j);
        q.0.pushed += 1;
        cv.notify_all();
        Ok(())
    }

    /// Jobs ever queued on it: host functions, waits and stores, and launched work.
    pub fn jobs_queued(&self) -> u64 {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner()).0.pushed
    }

    /// Queues work standing in for a kernel: it runs in stream order.
    pub fn launch(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        self.push(Job::Run(Box::new(f)))
    }
}

impl Stream for CpuStream {
    fn completion_word(&self) -> Result<CompletionWord> {
        Ok(CompletionWord::host())
    }

    fn host_fn(&self, f: HostFn) -> Result<()> {
        self.push(Job::Run(f))
    }

    fn wait_word(&self, word: &CompletionWord, value: u32) -> Result<()> {
        self.push(Job::Wait(word.clone(), value))
    }

    fn synchronize(&self) -> Result<()> {
        self.born.check("stream")?;
        let (m, cv) = &*self.shared;
        let mut q = m.lock().unwrap_or_else(|e| e.into_inner());
        while !q.0.jobs.is_empty() || q.0.running > 0 {
            q = cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    fn is_idle(&self) -> bool {
        let q = self.shared.0.lock().unwrap_or_else(|e| e.into_inner());
        q.0.jobs.is_empty() && q.0.running == 0
    }

    fn raw(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }
}

impl Drop for CpuStream {
    fn drop(&mut self) {
        if self.born.in_child() {
            // The stream's thread is the parent's: there is nothing to wait for or join here.
            std::mem::forget(self.thread.take());
            return;
        }
        let _ = self.synchronize();
        let (m, cv) = &*self.shared;
        m.lock().unwrap_or_else(|e| e.into_inner()).0.closed = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_hold_later_work_until_the_word_is_reached() {
        let s = CpuStream::new().unwrap();
        let w = s.completion_word().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = log.clone();
        s.launch(move || l.lock().unwrap().push(1)).unwrap();
        s.wait_word(&w, 2).unwrap();
        let l = log.clone();
        s.launch(move || l.lock().unwrap().push(2)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(*log.lock().unwrap(), vec![1]);
        w.store(1);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(*log.lock().unwrap(), vec![1], "1 < 2: still waiting");
        w.store(2);
        s.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), vec![1, 2]);
    }

    #[test]
    fn only_a_word_a_runtime_mapped_at_its_host_address_is_device_writable() {
        use crate::gpu::Vendor;
        let plain = CompletionWord::host();
        assert!(!plain.device_writable_by(Vendor::Cuda), "a CPU stream's word is plain host memory");
        let b = Box::new(AtomicU32::new(0));
        let p: *const AtomicU32 = &*b;
        // SAFETY: the box owns the atomic and is kept by the word.
        let mapped = unsafe { CompletionWord::new(p, p as u64, b) }.mapped_by(Vendor::Cuda);
        assert!(mapped.device_writable_by(Vendor::Cuda));
        assert!(!mapped.device_writable_by(Vendor::Hip), "mapped by another runtime");
        let b = Box::new(AtomicU32::new(0));
        let p: *const AtomicU32 = &*b;
        // SAFETY: as above.
        let elsewhere = unsafe { CompletionWord::new(p, 0x1000, b) }.mapped_by(Vendor::Cuda);
        assert!(!elsewhere.device_writable_by(Vendor::Cuda), "an address valid in one context only");
    }

    #[test]
    fn cyclic_comparison_wraps() {
        let w = CompletionWord::host();
        w.store(u32::MAX);
        assert!(w.reached(u32::MAX - 5));
        assert!(!w.reached(3));
        w.store(3);
        assert!(w.reached(u32::MAX), "3 is after u32::MAX cyclically");
    }
}

//! Worker threads that run I/O for stream-ordered operations and portable batches, so neither
//! the GPU runtime's callback thread nor the caller blocks for an I/O's duration. On the direct
//! path the workers share the storage's queue pairs (each locked while used); on the fallback
//! path each worker thread has its own io_uring ring.

use crate::error::{Error, Result};
use crate::fork::Born;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed pool of I/O worker threads.
#[derive(Debug)]
pub struct Engine {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Jobs queued so far.
    spawned: AtomicU64,
    /// The fork generation the threads were started in.
    born: Born,
}

impl Engine {
    /// Starts `workers` threads (the number of I/Os that overlap).
    pub fn new(workers: usize) -> Result<Arc<Engine>> {
        if workers == 0 {
            return Err(Error::invalid("workers", "must be at least 1"));
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let rx = rx.clone();
            let t = std::thread::Builder::new()
                .name(format!("ugds-io-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    match job {
                        // A panicking job must not take the worker (and the jobs queued
                        // behind it) down; the job's own guards report its failure.
                        Ok(j) => {
                            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(j));
                        }
                        Err(_) => return,
                    }
                })
                .map_err(|e| Error::Io { op: "spawning an I/O worker".into(), source: e })?;
            threads.push(t);
        }
        Ok(Arc::new(Engine { tx: Mutex::new(Some(tx)), threads, spawned: AtomicU64::new(0), born: Born::now() }))
    }

    /// Queues `f` on a worker.
    pub fn spawn(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        // A forked child has none of the workers: the job would never run.
        self.born.check("I/O worker pool")?;
        self.spawned.fetch_add(1, Ordering::Relaxed);
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        match tx.as_ref() {
            Some(tx) => tx.send(Box::new(f)).map_err(|_| Error::invalid("engine", "shut down")),
            None => Err(Error::invalid("engine", "shut down")),
        }
    }

    /// Jobs queued since the engine started (tests tell work done on the workers from work
    /// done elsewhere).
    pub fn spawned(&self) -> u64 {
        self.spawned.load(Ordering::Relaxed)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.born.in_child() {
            // The workers are the parent's threads, not in this process: joining one would wait
            // for ever, and the channel's lock may have been held by one at the fork.
            std::mem::forget(std::mem::take(&mut self.threads));
            if let Ok(tx) = self.tx.get_mut() {
                std::mem::forget(tx.take());
            }
            return;
        }
        // Closing the channel lets each worker finish the queued jobs and exit.
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            // The last owner may be a job on one of these workers: that worker exits on its
            // own once its job returns (the channel is closed); joining itself would fail.
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

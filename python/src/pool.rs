//! The binding's I/O threads: `Storage.pread` / `pwrite` run one synchronous library call on
//! one of them (kvikio runs its `pread`/`pwrite` tasks on a thread pool the same way), so the
//! caller gets a future at once and its thread, holding the GIL or not, is never blocked.

use crate::errors::to_py;
use pyo3::prelude::*;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

/// One call to run.
type Job = Box<dyn FnOnce() + Send>;

/// Threads of the pool: enough to keep several synchronous calls in flight, few enough not to
/// crowd the library's own workers.
const THREADS: usize = 8;

/// The pool's queue, started on first use.
static QUEUE: Mutex<Option<Sender<Job>>> = Mutex::new(None);

/// Runs `job` on one of the pool's threads (starting them on first use).
pub fn spawn(py: Python<'_>, job: impl FnOnce() + Send + 'static) -> PyResult<()> {
    let mut q = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    let tx = match q.as_ref() {
        Some(tx) => tx.clone(),
        None => {
            let tx = start().map_err(|source| {
                to_py(py, ugds::Error::Io { op: "starting the binding's I/O threads".into(), source })
            })?;
            q.insert(tx).clone()
        }
    };
    tx.send(Box::new(job)).map_err(|_| {
        // Every thread has ended (none does on its own): start afresh next time.
        *q = None;
        pyo3::exceptions::PyRuntimeError::new_err("the binding's I/O threads have ended")
    })
}

/// Starts the threads; they run jobs until the queue's sender goes (never, in practice: it is
/// a static, so they live as long as the process).
fn start() -> std::io::Result<Sender<Job>> {
    let (tx, rx) = channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..THREADS {
        let rx = rx.clone();
        std::thread::Builder::new().name(format!("ugds-py-io{i}")).spawn(move || worker(&rx))?;
    }
    Ok(tx)
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        // The lock is held only while taking a job, not while running it.
        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

//! `ugds.Batch`: the library's `StorageBatch` (one doorbell per submit on the direct path),
//! each entry a `concurrent.futures.Future`. A completion thread per batch collects the
//! library's events without the GIL and completes the futures with it; `asyncio` awaits them
//! through `asyncio.wrap_future`.

use crate::errors::to_py;
use crate::storage::{nonneg, operation, PyBuffer, PyStorage};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use ugds::batch::{IoEvent, IoStatus, Op};
use ugds::{IoRequest, StorageBatch};

/// An entry's future and the buffer it uses (held until the entry is over, so its memory lives).
struct Pending {
    fut: Py<PyAny>,
    _buf: Py<PyBuffer>,
}

#[derive(Default)]
struct Table {
    pending: HashMap<u64, Pending>,
    /// Entries whose events arrived and whose futures are being completed.
    completing: usize,
    closed: bool,
}

struct Shared {
    /// The library's batch; locked only without the GIL.
    batch: Mutex<StorageBatch>,
    table: Mutex<Table>,
    wake: Condvar,
}

/// An entry queued by `read`/`write`, not yet submitted.
struct Queued {
    req: IoRequest,
    pending: Pending,
}

/// A reusable batch of up to `capacity` entries in flight on one storage.
///
/// `read`/`write` queue an entry and return its `concurrent.futures.Future`; `submit()` hands
/// every queued entry to the library at once (one doorbell on the direct path). A future's
/// result is the bytes moved; a failed entry's future raises the library's error (an invalid
/// entry fails alone: the rest run). `await batch.submit_async()` is the asyncio form.
#[pyclass(module = "ugds._ugds", name = "Batch", frozen)]
pub struct PyBatch {
    storage: Py<PyStorage>,
    shared: Arc<Shared>,
    queued: Mutex<Vec<Queued>>,
    next_cookie: Mutex<u64>,
}

impl PyBatch {
    fn queue(
        &self,
        py: Python<'_>,
        op: Op,
        buf: &Bound<'_, PyAny>,
        file_offset: i64,
        nbytes: i64,
        buf_offset: i64,
    ) -> PyResult<Py<PyAny>> {
        let o = operation(self.storage.bind(py), op, buf, file_offset, nbytes, buf_offset)?;
        let fut = py.import("concurrent.futures")?.getattr("Future")?.call0()?;
        // Running from now: an entry handed to the SSD cannot be recalled, so cancel() says no.
        fut.call_method0("set_running_or_notify_cancel")?;
        let cookie = {
            let mut c = self.next_cookie.lock().unwrap_or_else(|e| e.into_inner());
            *c += 1;
            *c
        };
        let req = IoRequest {
            op,
            buf: o.target.buf,
            buf_offset: o.target.offset,
            file_offset: o.file_offset,
            len: o.nbytes,
            cookie,
        };
        let fut_ref = fut.clone().unbind();
        self.queued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Queued { req, pending: Pending { fut: fut_ref, _buf: o.buf } });
        Ok(fut.unbind())
    }

    /// Submits everything queued; returns the futures in queue order.
    fn submit_queued<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let queued = std::mem::take(&mut *self.queued.lock().unwrap_or_else(|e| e.into_inner()));
        let futs: Vec<Py<PyAny>> = queued.iter().map(|q| q.pending.fut.clone_ref(py)).collect();
        if queued.is_empty() {
            return PyList::new(py, futs);
        }
        let shared = self.shared.clone();
        let r = py.detach(move || {
            let mut reqs = Vec::with_capacity(queued.len());
            {
                let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
                for q in queued {
                    let cookie = q.req.cookie;
                    reqs.push(q.req);
                    // Entered before the submit, so a fast completion finds its future.
                    t.pending.insert(cookie, q.pending);
                }
            }
            let r = shared.batch.lock().unwrap_or_else(|e| e.into_inner()).submit(&reqs);
            let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
            match r {
                Ok(()) => {
                    shared.wake.notify_all();
                    Ok(())
                }
                // Nothing was submitted: take the entries back (their futures are dropped).
                Err(e) => {
                    let back: Vec<Pending> = reqs.iter().filter_map(|r| t.pending.remove(&r.cookie)).collect();
                    Err((e, back))
                }
            }
        });
        match r {
            Ok(()) => PyList::new(py, futs),
            Err((e, back)) => {
                drop(back);
                Err(to_py(py, e))
            }
        }
    }
}

/// How long one poll of the library's events holds the batch (a submit waits at most this).
const POLL: Duration = Duration::from_millis(2);

/// The completion thread: collects events, completes futures, ends when the batch is closed
/// and nothing is pending.
fn complete_loop(shared: Arc<Shared>) {
    loop {
        {
            let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
            while t.pending.is_empty() {
                if t.closed {
                    return;
                }
                t = shared.wake.wait(t).unwrap_or_else(|e| e.into_inner());
            }
        }
        let events = shared.batch.lock().unwrap_or_else(|e| e.into_inner()).status(1, POLL);
        let events = match events {
            Ok(ev) => ev,
            // The batch itself failed: every pending entry fails with it.
            Err(e) => {
                let all: Vec<Pending> = {
                    let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
                    let all: Vec<Pending> = t.pending.drain().map(|(_, p)| p).collect();
                    t.completing += all.len();
                    all
                };
                let n = all.len();
                let msg = e.to_string();
                Python::attach(|py| {
                    for p in all {
                        let err = ugds::Error::Io {
                            op: format!("collecting the batch's events: {msg}"),
                            source: std::io::Error::from_raw_os_error(libc::EIO),
                        };
                        let _ = p.fut.call_method1(py, "set_exception", (to_py(py, err).into_value(py),));
                    }
                });
                finished(&shared, n);
                continue;
            }
        };
        if events.is_empty() {
            std::thread::yield_now();
            continue;
        }
        let done: Vec<(IoEvent, Option<Pending>)> = {
            let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
            let done: Vec<_> = events
                .into_iter()
                .map(|e| {
                    let p = t.pending.remove(&e.cookie);
                    (e, p)
                })
                .collect();
            t.completing += done.len();
            done
        };
        let n = done.len();
        Python::attach(|py| {
            for (ev, p) in done {
                let Some(p) = p else { continue };
                let r = match ev.status {
                    IoStatus::Complete => p.fut.call_method1(py, "set_result", (ev.bytes,)),
                    _ => {
                        let e = ev.error.unwrap_or_else(|| ugds::Error::Io {
                            op: format!("batch entry ({:?})", ev.status),
                            source: std::io::Error::from_raw_os_error(libc::ECANCELED),
                        });
                        p.fut.call_method1(py, "set_exception", (to_py(py, e).into_value(py),))
                    }
                };
                // A future's callbacks raising is the caller's business (concurrent.futures
                // logs it); nothing else can fail here.
                drop(r);
            }
        });
        finished(&shared, n);
    }
}

/// `n` entries' futures are complete: wakes `close`.
fn finished(shared: &Shared, n: usize) {
    let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
    t.completing -= n;
    shared.wake.notify_all();
}

#[pymethods]
impl PyBatch {
    /// A batch of up to `capacity` entries in flight on `storage`.
    #[new]
    #[pyo3(signature = (storage, capacity = 64))]
    pub fn new(py: Python<'_>, storage: Py<PyStorage>, capacity: i64) -> PyResult<Self> {
        let cap = nonneg(py, "capacity", capacity)? as usize;
        let st = storage.get().st.clone();
        let batch = py.detach(move || StorageBatch::new(&st, cap)).map_err(|e| to_py(py, e))?;
        let shared = Arc::new(Shared { batch: Mutex::new(batch), table: Mutex::default(), wake: Condvar::new() });
        let s = shared.clone();
        std::thread::Builder::new().name("ugds-py-batch".into()).spawn(move || complete_loop(s)).map_err(|e| {
            to_py(py, ugds::Error::Io { op: "starting the batch's completion thread".into(), source: e })
        })?;
        Ok(PyBatch { storage, shared, queued: Mutex::default(), next_cookie: Mutex::new(0) })
    }

    /// Queues a read of `nbytes` at `file_offset` into `buf` at `buf_offset`; returns its future.
    #[pyo3(signature = (buf, file_offset, nbytes, buf_offset = 0))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        file_offset: i64,
        nbytes: i64,
        buf_offset: i64,
    ) -> PyResult<Py<PyAny>> {
        self.queue(py, Op::Read, buf, file_offset, nbytes, buf_offset)
    }

    /// Queues a write of `nbytes` from `buf` at `buf_offset` to `file_offset`; returns its future.
    #[pyo3(signature = (buf, file_offset, nbytes, buf_offset = 0))]
    fn write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        file_offset: i64,
        nbytes: i64,
        buf_offset: i64,
    ) -> PyResult<Py<PyAny>> {
        self.queue(py, Op::Write, buf, file_offset, nbytes, buf_offset)
    }

    /// Submits every queued entry at once; returns their futures (queue order). Raises, and
    /// submits nothing, when they exceed the batch's free capacity.
    fn submit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.submit_queued(py)
    }

    /// The asyncio form of `submit`: `await batch.submit_async()` gives the list of results
    /// (bytes per entry) and raises the first entry's error.
    fn submit_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let futs = self.submit_queued(py)?;
        let asyncio = py.import("asyncio")?;
        let mut wrapped = Vec::with_capacity(futs.len());
        for f in futs.iter() {
            wrapped.push(asyncio.call_method1("wrap_future", (f,))?);
        }
        asyncio.call_method1("gather", PyTuple::new(py, wrapped)?)
    }

    /// Entries queued or in flight.
    #[getter]
    fn in_flight(&self, py: Python<'_>) -> usize {
        let queued = self.queued.lock().unwrap_or_else(|e| e.into_inner()).len();
        let shared = self.shared.clone();
        queued + py.detach(move || shared.table.lock().unwrap_or_else(|e| e.into_inner()).pending.len())
    }

    /// Whether the direct path's native batch (its own queue pair, one doorbell per submit)
    /// is in use.
    #[getter]
    fn is_native(&self, py: Python<'_>) -> bool {
        let shared = self.shared.clone();
        py.detach(move || shared.batch.lock().unwrap_or_else(|e| e.into_inner()).is_native())
    }

    /// Waits until every submitted entry is over (their futures are done). Entries queued but
    /// not submitted are dropped.
    fn close(&self, py: Python<'_>) {
        self.queued.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let shared = self.shared.clone();
        py.detach(move || {
            let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
            while !t.pending.is_empty() || t.completing > 0 {
                t = shared.wake.wait(t).unwrap_or_else(|e| e.into_inner());
            }
        });
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, py: Python<'_>, _t: &Bound<'_, PyAny>, _v: &Bound<'_, PyAny>, _tb: &Bound<'_, PyAny>) {
        self.close(py)
    }
}

impl Drop for PyBatch {
    fn drop(&mut self) {
        // The completion thread finishes what is pending, then ends (dropping the library's
        // batch, which waits for its entries). Never joined here: it may need the GIL.
        let mut t = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        t.closed = true;
        self.shared.wake.notify_all();
    }
}

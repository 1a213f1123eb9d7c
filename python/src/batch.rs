//! `ugds.Batch`: the library's `StorageBatch` (one doorbell per submit on the direct path),
//! each entry a `concurrent.futures.Future`, or, with `run`, a slot of a result list that the
//! caller waits for without the GIL. A completion thread per batch collects the library's
//! events without the GIL, fills `run` slots at once and completes futures with the GIL;
//! `asyncio` awaits the futures through `asyncio.wrap_future`.

use crate::errors::{invalid, to_py};
use crate::storage::{nonneg, operation, Op1, PyBuffer, PyStorage};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use ugds::batch::{IoEvent, IoStatus, Op};
use ugds::{IoRequest, StorageBatch};

/// Who learns an entry's result.
enum Waiter {
    /// A `concurrent.futures.Future` (completed with the GIL).
    Future(Py<PyAny>),
    /// Slot `i` of a `run` call's results (filled without the GIL).
    Run(Arc<RunWait>, usize),
}

/// The results of one `run` call and how many are still missing.
struct RunWait {
    slots: Mutex<(Vec<Option<ugds::Result<u64>>>, usize)>,
    done: Condvar,
}

impl RunWait {
    fn new(n: usize) -> Self {
        RunWait { slots: Mutex::new(((0..n).map(|_| None).collect(), n)), done: Condvar::new() }
    }

    fn set(&self, i: usize, r: ugds::Result<u64>) {
        let mut s = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if s.0[i].is_none() {
            s.0[i] = Some(r);
            s.1 -= 1;
        }
        self.done.notify_all();
    }

    fn wait(&self) -> Vec<Option<ugds::Result<u64>>> {
        let mut s = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        while s.1 > 0 {
            s = self.done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        std::mem::take(&mut s.0)
    }
}

/// An entry's waiter and the buffer it uses (held until the entry is over, so its memory lives).
struct Pending {
    waiter: Waiter,
    _buf: Py<PyBuffer>,
}

#[derive(Default)]
struct Table {
    pending: HashMap<u64, Pending>,
    /// Entries whose events arrived and whose futures are being completed.
    completing: usize,
    closed: bool,
}

/// What a batch's Python object, its completion thread and its storage's `close()` share.
pub struct Shared {
    /// The library's batch; locked only without the GIL. `None` once its storage is closed
    /// (which drops it, and with it the batch's own queue pair).
    batch: Mutex<Option<StorageBatch>>,
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
        let q = self.entry(op, o, Waiter::Future(fut.clone().unbind()));
        self.queued.lock().unwrap_or_else(|e| e.into_inner()).push(q);
        Ok(fut.unbind())
    }

    /// A checked operation as a library request with a fresh cookie, and its waiter.
    fn entry(&self, op: Op, o: Op1, waiter: Waiter) -> Queued {
        let req = IoRequest {
            op,
            buf: o.target.buf,
            buf_offset: o.target.offset,
            file_offset: o.file_offset,
            len: o.nbytes,
            cookie: self.cookie(),
        };
        Queued { req, pending: Pending { waiter, _buf: o.buf } }
    }

    fn cookie(&self) -> u64 {
        let mut c = self.next_cookie.lock().unwrap_or_else(|e| e.into_inner());
        *c += 1;
        *c
    }

    /// Submits everything queued; returns the futures in queue order.
    fn submit_queued<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let queued = std::mem::take(&mut *self.queued.lock().unwrap_or_else(|e| e.into_inner()));
        let futs: Vec<Py<PyAny>> = queued
            .iter()
            .filter_map(|q| match &q.pending.waiter {
                Waiter::Future(f) => Some(f.clone_ref(py)),
                Waiter::Run(..) => None,
            })
            .collect();
        self.submit_entries(py, queued)?;
        PyList::new(py, futs)
    }

    /// Hands `entries` to the library in one submit; on failure nothing was submitted.
    fn submit_entries(&self, py: Python<'_>, entries: Vec<Queued>) -> PyResult<()> {
        if entries.is_empty() {
            return Ok(());
        }
        self.storage.get().storage(py)?;
        let shared = self.shared.clone();
        let r = py.detach(move || {
            let mut reqs = Vec::with_capacity(entries.len());
            {
                let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
                for q in entries {
                    let cookie = q.req.cookie;
                    reqs.push(q.req);
                    // Entered before the submit, so a fast completion finds its waiter.
                    t.pending.insert(cookie, q.pending);
                }
            }
            let r = match shared.batch.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                Some(b) => b.submit(&reqs),
                // Its storage was closed meanwhile (by another thread).
                None => Err(ugds::Error::invalid("batch", "its storage was closed")),
            };
            let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
            match r {
                Ok(()) => {
                    shared.wake.notify_all();
                    Ok(())
                }
                // Nothing was submitted: take the entries back (their waiters are dropped).
                Err(e) => {
                    let back: Vec<Pending> = reqs.iter().filter_map(|r| t.pending.remove(&r.cookie)).collect();
                    Err((e, back))
                }
            }
        });
        r.map_err(|(e, back)| {
            drop(back);
            to_py(py, e)
        })
    }
}

/// An event's result: the bytes moved, or why the entry failed.
fn result_of(ev: IoEvent) -> ugds::Result<u64> {
    match ev.status {
        IoStatus::Complete => Ok(ev.bytes),
        status => Err(ev.error.unwrap_or_else(|| ugds::Error::Io {
            op: format!("batch entry ({status:?})"),
            source: std::io::Error::from_raw_os_error(libc::ECANCELED),
        })),
    }
}

/// Delivers results: `run` slots at once, futures with the GIL (taken only when there are some).
fn deliver(done: Vec<(Pending, ugds::Result<u64>)>) {
    let mut futs = Vec::new();
    for (p, r) in done {
        match p.waiter {
            Waiter::Run(w, i) => w.set(i, r),
            Waiter::Future(f) => futs.push((f, r, p._buf)),
        }
    }
    if futs.is_empty() {
        return;
    }
    Python::attach(|py| {
        for (f, r, _buf) in futs {
            let r = match r {
                Ok(n) => f.call_method1(py, "set_result", (n,)),
                Err(e) => f.call_method1(py, "set_exception", (to_py(py, e).into_value(py),)),
            };
            // A future's callbacks raising is the caller's business (concurrent.futures logs
            // it); nothing else can fail here.
            drop(r);
        }
    });
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
        let events = match shared.batch.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            Some(b) => b.status(1, POLL),
            // Not reached: the storage's close() waits for every pending entry first.
            None => Err(ugds::Error::invalid("batch", "its storage was closed")),
        };
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
                let err = || ugds::Error::Io {
                    op: format!("collecting the batch's events: {msg}"),
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                };
                deliver(all.into_iter().map(|p| (p, Err(err()))).collect());
                finished(&shared, n);
                continue;
            }
        };
        if events.is_empty() {
            std::thread::yield_now();
            continue;
        }
        let done: Vec<(Pending, ugds::Result<u64>)> = {
            let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
            let done: Vec<_> = events
                .into_iter()
                .filter_map(|e| {
                    let p = t.pending.remove(&e.cookie)?;
                    Some((p, result_of(e)))
                })
                .collect();
            t.completing += done.len();
            done
        };
        let n = done.len();
        deliver(done);
        finished(&shared, n);
    }
}

/// Waits (without the GIL) until every submitted entry is over.
fn wait_idle(py: Python<'_>, shared: &Arc<Shared>) {
    let shared = shared.clone();
    py.detach(move || {
        let mut t = shared.table.lock().unwrap_or_else(|e| e.into_inner());
        while !t.pending.is_empty() || t.completing > 0 {
            t = shared.wake.wait(t).unwrap_or_else(|e| e.into_inner());
        }
    });
}

/// Its storage's `close()`: waits for the submitted entries, then drops the library's batch
/// (its queue pair or io_uring) and ends the completion thread.
pub fn shut_down(py: Python<'_>, shared: &Arc<Shared>) {
    wait_idle(py, shared);
    let s = shared.clone();
    py.detach(move || {
        let b = s.batch.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(b);
        let mut t = s.table.lock().unwrap_or_else(|e| e.into_inner());
        t.closed = true;
        s.wake.notify_all();
    });
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
        let st = storage.get().storage(py)?;
        let batch = py.detach(move || StorageBatch::new(&st, cap)).map_err(|e| to_py(py, e))?;
        let shared = Arc::new(Shared { batch: Mutex::new(Some(batch)), table: Mutex::default(), wake: Condvar::new() });
        storage.get().adopt_batch(&shared);
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

    /// Submits `entries` at once and waits (without the GIL) until all are over: each entry is
    /// `(op, buf, file_offset, nbytes)` or `(op, buf, file_offset, nbytes, buf_offset)`, `op`
    /// `"read"` or `"write"`. Returns the bytes moved per entry; when entries failed, raises the
    /// first one's error once all are over. No future per entry: the least Python per batch.
    fn run(&self, py: Python<'_>, entries: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
        self.storage.get().storage(py)?;
        let items: Vec<Bound<'_, PyAny>> = entries.try_iter()?.collect::<PyResult<_>>()?;
        let shape = "each entry is (op, buf, file_offset, nbytes[, buf_offset]) with op \"read\" or \"write\"";
        let w = Arc::new(RunWait::new(items.len()));
        let mut queued = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            let t = it.cast::<PyTuple>().map_err(|_| invalid(py, "entries", shape))?;
            if !(4..=5).contains(&t.len()) {
                return Err(invalid(py, "entries", shape));
            }
            let op = match t.get_item(0)?.extract::<String>().as_deref() {
                Ok("read") => Op::Read,
                Ok("write") => Op::Write,
                _ => return Err(invalid(py, "entries", shape)),
            };
            let boff: i64 = if t.len() == 5 { t.get_item(4)?.extract()? } else { 0 };
            let o = operation(
                self.storage.bind(py),
                op,
                &t.get_item(1)?,
                t.get_item(2)?.extract()?,
                t.get_item(3)?.extract()?,
                boff,
            )?;
            queued.push(self.entry(op, o, Waiter::Run(w.clone(), i)));
        }
        self.submit_entries(py, queued)?;
        let results = py.detach(move || w.wait());
        let mut out = Vec::with_capacity(results.len());
        let mut first_err = None;
        for r in results {
            match r {
                Some(Ok(n)) => out.push(n),
                Some(Err(e)) => {
                    first_err.get_or_insert(e);
                    out.push(0);
                }
                None => out.push(0),
            }
        }
        match first_err {
            Some(e) => Err(to_py(py, e)),
            None => Ok(out),
        }
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
        py.detach(move || {
            shared.batch.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|b| b.is_native())
        })
    }

    /// Waits until every submitted entry is over (their futures are done). Entries queued but
    /// not submitted are dropped.
    fn close(&self, py: Python<'_>) {
        self.queued.lock().unwrap_or_else(|e| e.into_inner()).clear();
        wait_idle(py, &self.shared);
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

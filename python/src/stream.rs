//! Stream-ordered I/O: `Storage.read_async` / `write_async` on a CUDA stream (its integer
//! handle, as `torch.cuda.current_stream().cuda_stream` or `cupy.cuda.Stream.ptr` give it) or
//! on a `ugds.CpuStream`. The I/O starts when the stream reaches it and later stream work
//! waits for it (the library's `StreamIo`); the call itself returns at once with an `AsyncIo`
//! whose `result()` waits, without the GIL, for the bytes moved. `Storage.pread` / `pwrite`
//! (kvikio's calls) return an `AsyncIo` too, run by the binding's I/O threads.
//!
//! An `AsyncIo` is awaitable (`await io`), has a `concurrent.futures.Future`'s methods (code that
//! calls `result`, `exception`, `add_done_callback`, ... on a future takes it), and gives a real
//! `concurrent.futures.Future` (`future()`) for `concurrent.futures.wait` / `as_completed`, which
//! reach into a Future's private state and so take nothing else.

use crate::errors::{invalid, to_py};
use crate::memory::Place;
use crate::storage::{operation, PyBuffer, PyStorage};
use pyo3::exceptions::{PyException, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use ugds::batch::Op;
use ugds::{AsyncOp, AsyncParams, CpuStream, Stream, StreamIo};

/// One operation's arguments (fixed when queued) and its result, with a wake-up for waiters.
#[derive(Debug)]
struct Slot {
    args: (u64, i64, i64),
    /// The operation in words (error messages, `repr`).
    what: String,
    /// Bytes moved, or a negative errno; set once.
    result: Mutex<Option<i64>>,
    /// Why it failed: the library's error where the operation reported one (pread/pwrite; the
    /// stream API reports only an errno), then the exception made of it (raised again by every
    /// later `result()`).
    error: Mutex<Failure>,
    done: Condvar,
    /// The memory, held until the operation is over (also when the AsyncIo is dropped first).
    keep: Mutex<Option<Py<PyBuffer>>>,
    /// The `concurrent.futures.Future` handed out by `future()`, completed with the result.
    /// (An `Arc`, so the worker takes a reference without the GIL while holding the lock.)
    future: Mutex<Option<Arc<Py<PyAny>>>>,
}

/// A failed operation's error, before and after it became a Python exception.
#[derive(Debug, Default)]
enum Failure {
    #[default]
    None,
    Library(ugds::Error),
    Raised(Py<PyAny>),
}

impl Slot {
    fn new(args: (u64, i64, i64), what: String, keep: Py<PyBuffer>) -> Slot {
        Slot {
            args,
            what,
            result: Mutex::new(None),
            error: Mutex::new(Failure::None),
            done: Condvar::new(),
            keep: Mutex::new(Some(keep)),
            future: Mutex::new(None),
        }
    }

    /// Stores the outcome (bytes moved or a negative errno, and the library's error when
    /// known), wakes waiters and completes the future (taking the GIL only when there is one).
    fn finish(&self, v: i64, error: Option<ugds::Error>) {
        if let Some(e) = error {
            *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Failure::Library(e);
        }
        let fut = {
            let mut r = self.result.lock().unwrap_or_else(|e| e.into_inner());
            *r = Some(v);
            // Read under the result lock: `future()` either sees the result or leaves its
            // future here for this call to complete.
            self.future.lock().unwrap_or_else(|e| e.into_inner()).clone()
        };
        self.done.notify_all();
        // Without the GIL (a worker thread): PyO3 defers the reference drop until it is held.
        drop(self.keep.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(f) = fut {
            Python::attach(|py| complete(py, f.bind(py), self, v));
        }
    }

    /// The outcome as Python sees it: bytes moved, or the operation's exception.
    fn outcome(&self, py: Python<'_>, v: i64) -> PyResult<u64> {
        if v >= 0 {
            return Ok(v as u64);
        }
        let mut g = self.error.lock().unwrap_or_else(|e| e.into_inner());
        let err = match std::mem::take(&mut *g) {
            Failure::Raised(exc) => {
                let e = PyErr::from_value(exc.bind(py).clone());
                *g = Failure::Raised(exc);
                return Err(e);
            }
            Failure::Library(e) => e,
            Failure::None => ugds::Error::Io {
                op: self.what.clone(),
                source: std::io::Error::from_raw_os_error(i32::try_from(-v).unwrap_or(libc::EIO)),
            },
        };
        let e = to_py(py, err);
        *g = Failure::Raised(e.value(py).clone().into_any().unbind());
        Err(e)
    }
}

/// Completes `f` with the outcome `v`. A callback of the caller's raising is the caller's
/// business (concurrent.futures logs it): ignored here.
fn complete(py: Python<'_>, f: &Bound<'_, PyAny>, slot: &Slot, v: i64) {
    let r = match slot.outcome(py, v) {
        Ok(n) => f.call_method1("set_result", (n,)),
        Err(e) => f.call_method1("set_exception", (e.into_value(py),)),
    };
    drop(r);
}

impl AsyncParams for Slot {
    fn load(&self) -> (u64, i64, i64) {
        self.args
    }

    fn store_result(&self, v: i64) {
        self.finish(v, None)
    }

    fn result(&self) -> i64 {
        self.result.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or(0)
    }
}

/// A stream run by a thread of this process: stream-ordered I/O without a GPU (tests, and code
/// that orders host work the way it orders GPU work).
#[pyclass(module = "ugds._ugds", name = "CpuStream", frozen)]
pub struct PyCpuStream {
    s: Arc<CpuStream>,
    io: OnceLock<Arc<StreamIo>>,
}

#[pymethods]
impl PyCpuStream {
    /// Starts the stream's thread.
    #[new]
    fn new(py: Python<'_>) -> PyResult<Self> {
        Ok(PyCpuStream { s: CpuStream::new().map_err(|e| to_py(py, e))?, io: OnceLock::new() })
    }

    /// Queues `fn()` (called with the GIL) in stream order, as a kernel would be on a GPU stream.
    fn launch(&self, py: Python<'_>, f: Py<PyAny>) -> PyResult<()> {
        self.s
            .launch(move || {
                Python::attach(|py| {
                    if let Err(e) = f.call0(py) {
                        e.print(py);
                    }
                })
            })
            .map_err(|e| to_py(py, e))
    }

    /// Waits until everything queued on the stream has run.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.s.clone();
        py.detach(move || s.synchronize()).map_err(|e| to_py(py, e))
    }
}

impl Drop for PyCpuStream {
    fn drop(&mut self) {
        // The last reference's drop waits for the stream's queued work, and that work may need
        // the GIL (a launched function, a completion waking an asyncio loop) while the thread
        // dropping this one holds it (a deallocation runs under the GIL): a deadlock, seen in
        // the Python suite. Wait for the work without the GIL first; what is left to drop then
        // has nothing queued.
        let s = self.s.clone();
        Python::attach(|py| py.detach(move || s.synchronize()))
            .unwrap_or_else(|e| log::debug!("a CpuStream's work failed before it was dropped: {e}"));
    }
}

/// A queued operation (stream-ordered, or `pread`/`pwrite`): `done()`, `result(timeout=None)`
/// (kvikio's `get()` too), which waits for the bytes moved (or raises the operation's error),
/// the rest of a `concurrent.futures.Future`'s methods (`exception`, `add_done_callback`,
/// `cancel`, `cancelled`, `running`), `future()`, its real `concurrent.futures.Future`, and
/// `await io`.
#[pyclass(module = "ugds._ugds", name = "AsyncIo", frozen)]
pub struct PyAsyncIo {
    slot: Arc<Slot>,
}

#[pymethods]
impl PyAsyncIo {
    /// Whether the operation has finished (its result is stored).
    fn done(&self) -> bool {
        self.slot.result.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Waits (without the GIL) until the operation has run, up to `timeout` seconds (None: no
    /// limit); returns the bytes moved or raises its error (TimeoutError when the timeout
    /// passed first).
    #[pyo3(signature = (timeout = None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<u64> {
        let v = self.wait(py, timeout)?;
        self.slot.outcome(py, v)
    }

    /// Waits as `result()` does; returns None when the operation succeeded, or the exception
    /// `result()` raises when it failed (the same instance every time), as
    /// `concurrent.futures.Future.exception` does. TimeoutError when `timeout` passes first.
    #[pyo3(signature = (timeout = None))]
    fn exception(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        let v = self.wait(py, timeout)?;
        Ok(self.slot.outcome(py, v).err().map(|e| e.into_value(py).into_any()))
    }

    /// Calls `fn(io)`, with this AsyncIo, once the operation has finished: at once (in this
    /// thread) when it has already, else in the thread that finishes it, as
    /// `concurrent.futures.Future.add_done_callback` does; an exception `fn` raises is logged
    /// (the `concurrent.futures` logger), not raised. Each call adds one call of `fn`.
    fn add_done_callback(slf: &Bound<'_, Self>, r#fn: Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        if slf.get().done() {
            // Not through the future: one made before may not be completed yet (the finishing
            // thread stores the result first, then takes the GIL to complete it), and a callback
            // added to a finished operation runs now.
            return match r#fn.call1(py, (slf,)) {
                Ok(_) => Ok(()),
                Err(e) => log_callback_error(slf.as_any(), e),
            };
        }
        // The future keeps its callbacks after running them, and this one holds the AsyncIo,
        // which holds the future: a cycle the garbage collector cannot see through the Rust
        // fields. Taking the pair on the call breaks it (and makes the call happen once).
        let once = Mutex::new(Some((slf.clone().unbind(), r#fn)));
        let call = PyCFunction::new_closure(py, Some(c"ugds_done_callback"), None, move |args, _kwargs| {
            let taken = once.lock().unwrap_or_else(|e| e.into_inner()).take();
            match taken {
                Some((io, f)) => f.call1(args.py(), (io,)).map(drop),
                None => Ok(()),
            }
        })?;
        slf.get().future(py)?.call_method1(py, "add_done_callback", (call,))?;
        Ok(())
    }

    /// Returns False: queued I/O cannot be recalled (the stream or an I/O thread has it
    /// already), so the operation always runs to its end.
    fn cancel(&self) -> bool {
        false
    }

    /// False: an AsyncIo is never cancelled (see `cancel`).
    fn cancelled(&self) -> bool {
        false
    }

    /// Whether the operation is still under way (`not done()`): it is handed over when queued,
    /// so there is no pending state a Future's `running()` would tell apart.
    fn running(&self) -> bool {
        !self.done()
    }

    /// kvikio's name for `result()`: waits and returns the bytes moved.
    fn get(&self, py: Python<'_>) -> PyResult<u64> {
        self.result(py, None)
    }

    /// The operation as a `concurrent.futures.Future` (the same one on every call), done when
    /// the operation is: for `concurrent.futures.wait` and `as_completed`, or
    /// `asyncio.wrap_future`. It cannot be cancelled (the I/O is handed over already).
    fn future(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(f) = self.slot.future.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Ok(f.clone_ref(py));
        }
        let f = py.import("concurrent.futures")?.getattr("Future")?.call0()?;
        f.call_method0("set_running_or_notify_cancel")?;
        let done = {
            let r = self.slot.result.lock().unwrap_or_else(|e| e.into_inner());
            let mut g = self.slot.future.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(other) = g.as_ref() {
                // Another thread made it meanwhile: that one is the future.
                return Ok(other.clone_ref(py));
            }
            *g = Some(Arc::new(f.clone().unbind()));
            // Not done yet: the worker completes the future when it stores the result.
            *r
        };
        if let Some(v) = done {
            complete(py, &f, &self.slot, v);
        }
        Ok(f.unbind())
    }

    /// `await io`: the bytes moved, or the operation's error (through `asyncio.wrap_future`,
    /// so the event loop is not blocked).
    fn __await__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let f = self.future(py)?;
        py.import("asyncio")?.call_method1("wrap_future", (f,))?.call_method0("__await__")
    }

    fn __repr__(&self) -> String {
        let state = match *self.slot.result.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(v) => format!("done: {v}"),
            None => "pending".into(),
        };
        format!("ugds.AsyncIo({}, {state})", self.slot.what)
    }
}

impl PyAsyncIo {
    /// Waits (without the GIL: the thread that finishes the operation may need it) until the
    /// operation has run, up to `timeout` seconds (None: no limit); returns its stored result
    /// (bytes moved or a negative errno). The only error is TimeoutError when the timeout passed
    /// first, so callers can tell it from the operation's own errors (`ugds.Timeout` is a
    /// TimeoutError too).
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<i64> {
        let slot = self.slot.clone();
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        let v = py.detach(move || {
            let mut r = slot.result.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(v) = *r {
                    return Some(v);
                }
                let wait = match deadline {
                    Some(d) => match d.checked_duration_since(Instant::now()) {
                        Some(left) if !left.is_zero() => left,
                        _ => return None,
                    },
                    None => Duration::from_secs(3600),
                };
                r = slot.done.wait_timeout(r, wait).unwrap_or_else(|e| e.into_inner()).0;
            }
        });
        v.ok_or_else(|| PyTimeoutError::new_err(format!("{} has not run yet", self.slot.what)))
    }
}

/// A done-callback's exception: logged as `concurrent.futures.Future` logs one (its logger, the
/// same words), since the callback is the caller's and the operation itself went fine. Like
/// the Future, only an `Exception` is caught; anything else (KeyboardInterrupt) is raised.
fn log_callback_error(io: &Bound<'_, PyAny>, e: PyErr) -> PyResult<()> {
    let py = io.py();
    if !e.is_instance_of::<PyException>(py) {
        return Err(e);
    }
    let kw = PyDict::new(py);
    kw.set_item("exc_info", e.into_value(py))?;
    py.import("logging")?.call_method1("getLogger", ("concurrent.futures",))?.call_method(
        "error",
        ("exception calling callback for %r", io),
        Some(&kw),
    )?;
    Ok(())
}

/// The library's stream-ordered I/O for a CUDA stream handle, one per (context, handle) for the
/// life of the process (as the C ABI keeps one per registered stream). A stream belongs to the
/// context the driver names for it (`cuStreamGetCtx`); a default stream (0, 1, 2: PyTorch's and
/// CuPy's default streams on every device) to the primary context of the memory's device, or to
/// the calling thread's current context for host memory.
fn cuda_stream_io(py: Python<'_>, place: Place, handle: usize) -> PyResult<Arc<StreamIo>> {
    type Cache = Mutex<Vec<((u64, usize), Arc<StreamIo>)>>;
    static CACHE: Cache = Mutex::new(Vec::new());
    let _caller = ugds::gpu::cuda::CallerContext::keep();
    let cuda = match (handle, place) {
        (0..=2, Place::Cuda(n)) => ugds::gpu::cuda::device_runtime(n),
        (0..=2, Place::Host | Place::Dmabuf) => ugds::gpu::cuda::current_runtime(),
        _ => ugds::gpu::cuda::stream_runtime(handle),
    }
    .map_err(|e| to_py(py, e))?
    .0;
    let key = (cuda.context().id(), handle);
    let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, io)) = c.iter().find(|(k, _)| *k == key) {
        return Ok(io.clone());
    }
    // SAFETY: the stream belongs to `cuda`'s context (asked of the driver, or a default stream
    // used in that context). StreamIo calls the stream only while queuing work (inside the
    // caller's read_async/write_async) and never when dropped, so a stream the caller destroys
    // later is never touched after that.
    let s: Arc<dyn Stream> = unsafe { cuda.wrap_stream(handle) };
    let io = Arc::new(StreamIo::new(s).map_err(|e| to_py(py, e))?);
    c.push((key, io.clone()));
    Ok(io)
}

/// The `StreamIo` for `stream`: a CpuStream, an integer CUDA stream handle, or an object with
/// `cuda_stream` (torch.cuda.Stream) or `ptr` (cupy.cuda.Stream).
fn stream_io(stream: &Bound<'_, PyAny>, place: Place) -> PyResult<Arc<StreamIo>> {
    let py = stream.py();
    if let Ok(c) = stream.cast::<PyCpuStream>() {
        let c = c.get();
        if let Some(io) = c.io.get() {
            return Ok(io.clone());
        }
        let io = Arc::new(StreamIo::new(c.s.clone()).map_err(|e| to_py(py, e))?);
        return Ok(c.io.get_or_init(|| io).clone());
    }
    let handle: usize = match stream.extract() {
        Ok(h) => h,
        Err(_) => stream.getattr("cuda_stream").or_else(|_| stream.getattr("ptr")).and_then(|h| h.extract()).map_err(
            |_| {
                invalid(py, "stream", "give a CUDA stream handle (an int), a torch or cupy stream, or a ugds.CpuStream")
            },
        )?,
    };
    cuda_stream_io(py, place, handle)
}

/// Queues one stream-ordered operation (see the module comment).
#[allow(clippy::too_many_arguments)]
pub fn queue(
    st: &Bound<'_, PyStorage>,
    op: Op,
    buf: &Bound<'_, PyAny>,
    file_offset: i64,
    nbytes: i64,
    buf_offset: i64,
    stream: &Bound<'_, PyAny>,
) -> PyResult<PyAsyncIo> {
    let py = st.py();
    let o = operation(st, op, buf, file_offset, nbytes, buf_offset)?;
    let (b, t, foff, n) = (o.buf, o.target, o.file_offset, o.nbytes);
    // What the library would refuse when the stream gets there is refused now, by name.
    let storage = st.get().storage(py)?;
    let bs = storage.block_size();
    if n == 0 || !n.is_multiple_of(bs) {
        return Err(invalid(py, "nbytes", format!("{n} is not a non-zero multiple of the {bs}-byte block size")));
    }
    if !foff.is_multiple_of(bs) {
        return Err(invalid(py, "file_offset", format!("{foff} is not a multiple of the {bs}-byte block size")));
    }
    let io = stream_io(stream, b.get().place_of())?;
    let what =
        format!("stream-ordered {} of {n} bytes at file offset {foff}", if op == Op::Read { "read" } else { "write" });
    let slot = Arc::new(Slot::new((n, foff as i64, t.offset as i64), what, b.clone_ref(py)));
    let aop = AsyncOp { op, buf: t.buf, args: slot.clone() };
    py.detach(move || {
        let _caller = ugds::gpu::cuda::CallerContext::keep();
        io.submit(&storage, &[aop])
    })
    .map_err(|e| to_py(py, e))?;
    Ok(PyAsyncIo { slot })
}

/// kvikio's `pread` / `pwrite` (`CuFile.pread(buf, size=None, file_offset=0, task_size=None)`)
/// with `(size, file_offset, buf_offset)`: checks the arguments now (by name, as the
/// synchronous calls do), then runs the library's synchronous call on one of the binding's I/O
/// threads; the `AsyncIo` is its future.
pub fn submit(
    st: &Bound<'_, PyStorage>,
    op: Op,
    buf: &Bound<'_, PyAny>,
    (size, file_offset, buf_offset): (Option<i64>, i64, i64),
    task_size: Option<i64>,
) -> PyResult<PyAsyncIo> {
    let py = st.py();
    let storage = st.get().storage(py)?;
    if task_size.is_some_and(|t| t <= 0) {
        return Err(invalid(py, "task_size", "must be positive"));
    }
    let nbytes = match size {
        Some(n) => n,
        // kvikio's default: the whole buffer (from buf_offset on).
        None => {
            let len = match buf.cast::<PyBuffer>() {
                Ok(b) => b.get().object_len(),
                Err(_) => crate::memory::classify(buf)?.len,
            };
            i64::try_from(len).unwrap_or(i64::MAX).saturating_sub(buf_offset)
        }
    };
    let o = operation(st, op, buf, file_offset, nbytes, buf_offset)?;
    let (b, t, foff, n) = (o.buf, o.target, o.file_offset, o.nbytes);
    // The library's own check, now, so a bad argument raises at the call as kvikio's do.
    storage.check_range(foff, n).map_err(|e| to_py(py, e))?;
    let write = op == Op::Write;
    let what = format!("{} of {n} bytes at file offset {foff}", if write { "pwrite" } else { "pread" });
    let slot = Arc::new(Slot::new((n, foff as i64, t.offset as i64), what, b.clone_ref(py)));
    let gpu = b.get().place_of() != Place::Host;
    let s = slot.clone();
    crate::pool::spawn(py, move || {
        let _caller = gpu.then(ugds::gpu::cuda::CallerContext::keep);
        let r = if write { storage.write(&t.buf, t.offset, foff, n) } else { storage.read(&t.buf, t.offset, foff, n) };
        match r {
            Ok(n) => s.finish(i64::try_from(n).unwrap_or(i64::MAX), None),
            Err(e) => s.finish(-i64::from(e.errno().unsigned_abs().max(1)), Some(e)),
        }
    })?;
    Ok(PyAsyncIo { slot })
}

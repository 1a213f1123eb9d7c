//! Stream-ordered I/O: `Storage.read_async` / `write_async` on a CUDA stream (its integer
//! handle, as `torch.cuda.current_stream().cuda_stream` or `cupy.cuda.Stream.ptr` give it) or
//! on a `ugds.CpuStream`. The I/O starts when the stream reaches it and later stream work
//! waits for it (the library's `StreamIo`); the call itself returns at once with an `AsyncIo`
//! whose `result()` waits, without the GIL, for the bytes moved.

use crate::errors::{invalid, to_py};
use crate::memory::Place;
use crate::storage::{operation, PyBuffer, PyStorage};
use pyo3::prelude::*;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use ugds::batch::Op;
use ugds::{AsyncOp, AsyncParams, CpuStream, Stream, StreamIo};

/// One operation's arguments (fixed when queued) and its result, with a wake-up for waiters.
#[derive(Debug)]
struct Slot {
    args: (u64, i64, i64),
    result: Mutex<Option<i64>>,
    done: Condvar,
    /// The memory, held until the operation is over (also when the AsyncIo is dropped first).
    keep: Mutex<Option<Py<PyBuffer>>>,
}

impl AsyncParams for Slot {
    fn load(&self) -> (u64, i64, i64) {
        self.args
    }

    fn store_result(&self, v: i64) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
        self.done.notify_all();
        // Without the GIL (a worker thread): PyO3 defers the reference drop until it is held.
        drop(self.keep.lock().unwrap_or_else(|e| e.into_inner()).take());
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

/// A queued stream-ordered operation: `done()`, and `result(timeout=None)`, which waits for the
/// bytes moved (or raises the operation's error).
#[pyclass(module = "ugds._ugds", name = "AsyncIo", frozen)]
pub struct PyAsyncIo {
    slot: Arc<Slot>,
    what: String,
}

#[pymethods]
impl PyAsyncIo {
    /// Whether the operation has finished (its result is stored).
    fn done(&self) -> bool {
        self.slot.result.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Waits (without the GIL) until the stream has run the operation, up to `timeout`
    /// seconds (None: no limit); returns the bytes moved or raises its error (TimeoutError
    /// when the timeout passed first).
    #[pyo3(signature = (timeout = None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<u64> {
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
        let Some(v) = v else {
            return Err(pyo3::exceptions::PyTimeoutError::new_err(format!("{} has not run yet", self.what)));
        };
        if v < 0 {
            let err = ugds::Error::Io {
                op: self.what.clone(),
                source: std::io::Error::from_raw_os_error(i32::try_from(-v).unwrap_or(libc::EIO)),
            };
            return Err(to_py(py, err));
        }
        Ok(v as u64)
    }

    fn __repr__(&self) -> String {
        let state = match *self.slot.result.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(v) => format!("done: {v}"),
            None => "pending".into(),
        };
        format!("ugds.AsyncIo({}, {state})", self.what)
    }
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
        (0..=2, Place::Host) => ugds::gpu::cuda::current_runtime(),
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
    let bs = st.get().st.block_size();
    if n == 0 || !n.is_multiple_of(bs) {
        return Err(invalid(py, "nbytes", format!("{n} is not a non-zero multiple of the {bs}-byte block size")));
    }
    if !foff.is_multiple_of(bs) {
        return Err(invalid(py, "file_offset", format!("{foff} is not a multiple of the {bs}-byte block size")));
    }
    let io = stream_io(stream, b.get().place_of())?;
    let slot = Arc::new(Slot {
        args: (n, foff as i64, t.offset as i64),
        result: Mutex::new(None),
        done: Condvar::new(),
        keep: Mutex::new(Some(b.clone_ref(py))),
    });
    let what =
        format!("stream-ordered {} of {n} bytes at file offset {foff}", if op == Op::Read { "read" } else { "write" });
    let aop = AsyncOp { op, buf: t.buf, args: slot.clone() };
    let storage = st.get().st.clone();
    py.detach(move || {
        let _caller = ugds::gpu::cuda::CallerContext::keep();
        io.submit(&storage, &[aop])
    })
    .map_err(|e| to_py(py, e))?;
    Ok(PyAsyncIo { slot, what })
}

//! `ugds.Storage` and `ugds.Buffer`: the Rust `Storage` / `Buffer` with the GIL released during
//! every I/O. Each library call is made in one place here, so a change of the library's API
//! touches one function.

use crate::batch::PyBatch;
use crate::errors::{closed, invalid, to_py};
use crate::memory::{classify, cuda, raw_pointer, Memory, Place};
use crate::stream::PyAsyncIo;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::{Arc, Mutex, Weak};
use ugds::batch::Op;
use ugds::gpu::cuda::CallerContext;
use ugds::{Buffer, Storage};

/// Where I/O goes: a namespace of a controller bound to ugds (the direct path), or a file or
/// block device (the fallback path). Opened with `ugds.open(path)`.
#[pyclass(module = "ugds._ugds", name = "Storage", frozen)]
pub struct PyStorage {
    /// The library's storage; `None` once closed.
    st: Mutex<Option<Arc<Storage>>>,
    path: String,
    /// What `close()` releases besides the storage itself.
    owned: Mutex<Owned>,
}

/// The registrations and batches made through one storage (weakly: each lives as long as its
/// Python object), so that `close()` can release them before the caller drops them.
#[derive(Default)]
struct Owned {
    bufs: Vec<Weak<Registration>>,
    batches: Vec<Weak<crate::batch::Shared>>,
}

impl Owned {
    /// Forgets the entries whose objects are gone once the list has doubled since the last
    /// sweep (so registering per call stays amortised O(1)).
    fn sweep<T>(v: &mut Vec<Weak<T>>) {
        if v.len() == v.capacity() {
            v.retain(|w| w.strong_count() > 0);
        }
    }
}

/// A buffer's registration; `None` once deregistered (by `deregister()` or its storage's
/// `close()`).
type Registration = Mutex<Option<Arc<Buffer>>>;

/// Memory registered for one storage: host memory, or GPU memory (peer-to-peer on the direct
/// path when possible, else staged). Holds the object it came from (or its buffer export), so
/// the memory stays valid while registered. Made by `Storage.register` or `Storage.alloc`.
#[pyclass(module = "ugds._ugds", name = "Buffer", frozen)]
pub struct PyBuffer {
    /// The registration; shared with the storage, whose `close()` deregisters it.
    buf: Arc<Registration>,
    /// Where the object's first byte is within the registration (host memory is registered
    /// from the start of its first page).
    base: u64,
    mem: Memory,
}

/// One registered range for one operation: the library buffer and the byte offset in it.
pub struct Target {
    /// The registration.
    pub buf: Arc<Buffer>,
    /// Offset of the operation's first byte in it.
    pub offset: u64,
}

/// One operation's arguments, checked: the buffer (held for the operation), its registration
/// and the offset in it, the file offset and the length.
pub struct Op1 {
    /// The buffer (a registration made for this operation when `buf` was not a Buffer).
    pub buf: Py<PyBuffer>,
    /// Where the bytes are.
    pub target: Target,
    /// Offset in the file or namespace.
    pub file_offset: u64,
    /// Bytes.
    pub nbytes: u64,
}

/// Checks one operation's arguments (negative numbers, the range in the buffer, a read into
/// read-only memory) and registers `buf` when it is not a Buffer yet.
pub fn operation(
    st: &Bound<'_, PyStorage>,
    op: Op,
    buf: &Bound<'_, PyAny>,
    file_offset: i64,
    nbytes: i64,
    buf_offset: i64,
) -> PyResult<Op1> {
    let py = st.py();
    // A closed storage first: its buffers are deregistered too, and `Closed` says why.
    st.get().storage(py)?;
    let (file_offset, nbytes, boff) =
        (nonneg(py, "file_offset", file_offset)?, nonneg(py, "nbytes", nbytes)?, nonneg(py, "buf_offset", buf_offset)?);
    let buf = as_buffer(st, buf)?;
    let target = buf.get().target(py, boff, nbytes, op == Op::Read)?;
    Ok(Op1 { buf, target, file_offset, nbytes })
}

/// A non-negative integer argument.
pub fn nonneg(py: Python<'_>, arg: &'static str, v: i64) -> PyResult<u64> {
    u64::try_from(v).map_err(|_| invalid(py, arg, format!("{v} is negative")))
}

impl PyBuffer {
    /// The registration and the offset of `[buf_offset, +nbytes)` in it, after checking the
    /// range against the object's own length (the registration may be larger: whole pages).
    pub fn target(&self, py: Python<'_>, buf_offset: u64, nbytes: u64, write_into: bool) -> PyResult<Target> {
        if write_into && self.mem.readonly {
            return Err(invalid(py, "buf", format!("{} is read-only: it cannot receive a read", self.mem.what)));
        }
        // A torch tensor resized or set_() since: refused before anything moves.
        self.mem.verify(py)?;
        if buf_offset.checked_add(nbytes).is_none_or(|e| e > self.mem.len) {
            return Err(invalid(
                py,
                "buf_offset",
                format!("[{buf_offset}, +{nbytes}) runs past the {}-byte buffer", self.mem.len),
            ));
        }
        let buf = self.buf.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let buf = buf.ok_or_else(|| invalid(py, "buf", "deregistered"))?;
        Ok(Target { buf, offset: self.base + buf_offset })
    }

    /// The object's length in bytes.
    pub fn object_len(&self) -> u64 {
        self.mem.len
    }

    /// Host memory or which GPU.
    pub fn place_of(&self) -> Place {
        self.mem.place
    }

    /// Whether `[ptr, ptr + len)` overlaps the object's bytes from `offset` on (addresses as
    /// the object has them: host, or a device address, distinct from host ones under CUDA's
    /// unified addressing).
    fn overlaps(&self, offset: u64, ptr: u64, len: u64) -> bool {
        let start = self.mem.ptr.saturating_add(offset);
        let end = self.mem.ptr.saturating_add(self.mem.len);
        len > 0 && start < end && ptr < end && start < ptr.saturating_add(len)
    }
}

/// `buf` as a registered buffer: a `Buffer` as it is, anything else registered now (for the
/// duration of the caller's operation: the returned object holds it).
pub fn as_buffer(st: &Bound<'_, PyStorage>, buf: &Bound<'_, PyAny>) -> PyResult<Py<PyBuffer>> {
    if let Ok(b) = buf.cast::<PyBuffer>() {
        return Ok(b.clone().unbind());
    }
    let b = st.get().register_obj(buf, true)?;
    Py::new(buf.py(), b)
}

impl PyStorage {
    /// The library's storage, or `Closed` once `close()` ran.
    pub fn storage(&self, py: Python<'_>) -> PyResult<Arc<Storage>> {
        self.st.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or_else(|| closed(py, &self.path))
    }

    /// A Buffer of `buf` registered through this storage (and released by its `close()`).
    fn adopt(&self, buf: Buffer, base: u64, mem: Memory) -> PyBuffer {
        let reg = Arc::new(Mutex::new(Some(Arc::new(buf))));
        let mut o = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        Owned::sweep(&mut o.bufs);
        o.bufs.push(Arc::downgrade(&reg));
        PyBuffer { buf: reg, base, mem }
    }

    /// Remembers a batch made on this storage, which `close()` closes.
    pub fn adopt_batch(&self, shared: &Arc<crate::batch::Shared>) {
        let mut o = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        Owned::sweep(&mut o.batches);
        o.batches.push(Arc::downgrade(shared));
    }

    fn register_obj(&self, obj: &Bound<'_, PyAny>, allow_fallback: bool) -> PyResult<PyBuffer> {
        self.register_mem(obj.py(), classify(obj)?, allow_fallback)
    }

    fn register_mem(&self, py: Python<'_>, mem: Memory, allow_fallback: bool) -> PyResult<PyBuffer> {
        if mem.len == 0 {
            return Err(invalid(py, "buf", format!("{} has no bytes", mem.what)));
        }
        let st = self.storage(py)?;
        let (buf, base) = match mem.place {
            Place::Host => {
                // Registered from the start of its first page to the end of its last (the
                // library registers whole pages); I/O stays within the object (`target`).
                let start = mem.ptr & !4095;
                let end = (mem.ptr + mem.len).next_multiple_of(4096);
                let len = (end - start) as usize;
                // SAFETY: `mem.keep` (held by the PyBuffer with the registration) keeps
                // [ptr, ptr+len) allocated, or the caller promised it (register_raw_unsafe); the
                // rest of its pages are mapped (mappings are page-granular) and never
                // transferred: every I/O is checked against the object's range first.
                let r = py.detach(move || unsafe { st.register_host(start as *mut u8, len) });
                (r.map_err(|e| to_py(py, e))?, mem.ptr - start)
            }
            Place::Cuda(ordinal) => {
                let gpu = cuda(py, ordinal)?;
                let (ptr, len) = (mem.ptr, mem.len as usize);
                let r = py.detach(move || {
                    let _caller = CallerContext::keep();
                    // SAFETY: the object (held with the registration) keeps the device memory
                    // allocated, or the caller promised it for raw integers.
                    let m = unsafe { gpu.borrow(ptr, len) }?;
                    st.register_gpu(Arc::new(m), allow_fallback)
                });
                (r.map_err(|e| to_py(py, e))?, 0)
            }
            Place::Dmabuf => return Err(invalid(py, "buf", "a dma-buf registers with register_dmabuf")),
        };
        Ok(self.adopt(buf, base, mem))
    }

    /// Reads or writes through `buf` (a Buffer or an object registered for the call).
    fn rw(
        slf: &Bound<'_, Self>,
        write: bool,
        buf: &Bound<'_, PyAny>,
        file_offset: i64,
        nbytes: i64,
        buf_offset: i64,
    ) -> PyResult<u64> {
        let py = slf.py();
        let o = operation(slf, if write { Op::Write } else { Op::Read }, buf, file_offset, nbytes, buf_offset)?;
        let (t, foff, n) = (o.target, o.file_offset, o.nbytes);
        let st = slf.get().storage(py)?;
        let gpu = o.buf.get().place_of() != Place::Host;
        let r = py.detach(move || {
            let _caller = gpu.then(CallerContext::keep);
            if write {
                st.write(&t.buf, t.offset, foff, n)
            } else {
                st.read(&t.buf, t.offset, foff, n)
            }
        });
        r.map_err(|e| to_py(py, e))
    }
}

#[pymethods]
impl PyStorage {
    /// The path it was opened with.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Which path I/O takes, and on what, in words.
    fn describe(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.storage(py)?.describe())
    }

    /// True on the direct path (a ugds node), false on the fallback path.
    #[getter]
    fn is_direct(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.storage(py)?.is_direct())
    }

    /// False only for a file whose file system has no O_DIRECT (I/O then uses the page cache).
    #[getter]
    fn bypasses_page_cache(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.storage(py)?.bypasses_page_cache())
    }

    /// Capacity in bytes.
    #[getter]
    fn capacity(&self, py: Python<'_>) -> PyResult<u64> {
        self.storage(py)?.capacity().map_err(|e| to_py(py, e))
    }

    /// File offsets and sizes must be multiples of this.
    #[getter]
    fn block_size(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.storage(py)?.block_size())
    }

    /// Registers `obj` for I/O: a torch tensor (CPU or CUDA, contiguous), a numpy or cupy
    /// array, an object with `__dlpack__`, `__cuda_array_interface__` or the buffer protocol.
    /// GPU memory takes the peer-to-peer path when it can; else, with `allow_fallback`, I/O is
    /// staged through host memory (said once on stderr). A torch tensor that is resized or
    /// `set_()` later is refused at its next use (`RegisteredMemoryChanged`). Raw integers:
    /// `register_raw_unsafe`.
    #[pyo3(signature = (obj, allow_fallback = true))]
    fn register(&self, obj: &Bound<'_, PyAny>, allow_fallback: bool) -> PyResult<PyBuffer> {
        self.register_obj(obj, allow_fallback)
    }

    /// Registers raw memory `[ptr, ptr + nbytes)`: device memory of the CUDA device (and
    /// context) that holds it when CUDA says so, else host memory. Unsafe: nothing holds the memory or notices when it moves.
    /// The caller promises it stays allocated, at that address, until the buffer is
    /// deregistered and its I/O is over; otherwise the device reads or writes whatever the
    /// allocator put there since.
    #[pyo3(signature = (ptr, nbytes, allow_fallback = true))]
    fn register_raw_unsafe(&self, py: Python<'_>, ptr: u64, nbytes: u64, allow_fallback: bool) -> PyResult<PyBuffer> {
        self.register_mem(py, raw_pointer(py, ptr, nbytes)?, allow_fallback)
    }

    /// Allocates and registers `nbytes` of page-aligned host memory (a Buffer that supports
    /// `bytes(buf)`-style copies with `copy_in` / `copy_out`).
    fn alloc(&self, py: Python<'_>, nbytes: i64) -> PyResult<PyBuffer> {
        let n = nonneg(py, "nbytes", nbytes)?;
        let st = self.storage(py)?;
        let b = py.detach(move || st.alloc_host(n as usize)).map_err(|e| to_py(py, e))?;
        let ptr = b.host_ptr().map_or(0, |p| p as u64);
        let mem = Memory {
            ptr,
            len: n,
            readonly: false,
            place: Place::Host,
            what: "ugds host buffer".into(),
            keep: crate::memory::Keep::Nothing,
            recheck: crate::memory::Recheck::Nothing,
        };
        Ok(self.adopt(b, 0, mem))
    }

    /// Registers the whole dma-buf `fd` that another driver exported (a device's memory BAR
    /// through vfio-pci, an accelerator's memory): the SSD reads and writes it peer-to-peer, the
    /// CPU never (`copy_in`/`copy_out` refuse). The descriptor is duplicated; the caller keeps
    /// and closes its own. `PeerToPeerRefused` where the kernel allows no peer-to-peer DMA
    /// between the controller and the exporter's device (`ugds doctor` predicts it),
    /// `Unsupported` on a file; I/O on it raises `Revoked` once the exporter revoked it.
    fn register_dmabuf(&self, py: Python<'_>, fd: i32) -> PyResult<PyBuffer> {
        if fd < 0 {
            return Err(invalid(py, "fd", "a negative descriptor"));
        }
        let st = self.storage(py)?;
        let b = py
            .detach(move || {
                // SAFETY: the caller lends an open descriptor for the call (Python ints are
                // checked by the kernel: a closed one is EBADF); the library duplicates it.
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                st.register_dmabuf(fd)
            })
            .map_err(|e| to_py(py, e))?;
        let mem = Memory {
            ptr: 0,
            len: b.len() as u64,
            readonly: false,
            place: Place::Dmabuf,
            what: "another driver's dma-buf".into(),
            keep: crate::memory::Keep::Nothing,
            recheck: crate::memory::Recheck::Nothing,
        };
        Ok(self.adopt(b, 0, mem))
    }

    /// Test hook, not part of the API: `nbytes` of the library's CPU stand-in "GPU" memory
    /// (memfd-backed; exported as a real dma-buf through udmabuf), registered as GPU memory is:
    /// peer-to-peer through the dma-buf on the direct path, staged otherwise (when
    /// `allow_fallback`). Lets the tests drive the dma-buf path without a GPU.
    #[doc(hidden)]
    #[pyo3(signature = (nbytes, allow_fallback = true))]
    fn _alloc_cpu_gpu(&self, py: Python<'_>, nbytes: i64, allow_fallback: bool) -> PyResult<PyBuffer> {
        static CPU: std::sync::OnceLock<Arc<ugds::Gpu>> = std::sync::OnceLock::new();
        let n = nonneg(py, "nbytes", nbytes)?;
        let gpu = CPU.get_or_init(ugds::Gpu::cpu).clone();
        let st = self.storage(py)?;
        let (b, ptr) = py
            .detach(move || {
                // Whole pages, as GPU allocations are (udmabuf exports whole pages only).
                let m = Arc::new(gpu.alloc((n as usize).next_multiple_of(4096))?);
                let ptr = m.device_ptr();
                // The registration holds `m` (the memory lives as long as the Buffer).
                st.register_gpu(m, allow_fallback).map(|b| (b, ptr))
            })
            .map_err(|e| to_py(py, e))?;
        let mem = Memory {
            ptr,
            len: n,
            readonly: false,
            // Host memory underneath: copies are memcpy, no CUDA context is involved.
            place: Place::Host,
            what: "CPU stand-in GPU memory (memfd, dma-buf through udmabuf)".into(),
            keep: crate::memory::Keep::Nothing,
            recheck: crate::memory::Recheck::Nothing,
        };
        Ok(self.adopt(b, 0, mem))
    }

    /// Reads `nbytes` at `file_offset` into `buf` at `buf_offset`; returns the bytes read
    /// (fewer only at the end of a file). `buf`: a Buffer, or anything `register` takes
    /// (registered for this call).
    #[pyo3(signature = (buf, file_offset, nbytes, buf_offset = 0))]
    fn read(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        file_offset: i64,
        nbytes: i64,
        buf_offset: i64,
    ) -> PyResult<u64> {
        Self::rw(slf, false, buf, file_offset, nbytes, buf_offset)
    }

    /// Writes `nbytes` from `buf` at `buf_offset` to `file_offset`; returns the bytes written.
    #[pyo3(signature = (buf, file_offset, nbytes, buf_offset = 0))]
    fn write(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        file_offset: i64,
        nbytes: i64,
        buf_offset: i64,
    ) -> PyResult<u64> {
        Self::rw(slf, true, buf, file_offset, nbytes, buf_offset)
    }

    /// Reads `nbytes` at `file_offset` and returns them as `bytes` (through a host buffer the
    /// call allocates; shorter only at the end of a file).
    fn read_bytes<'py>(&self, py: Python<'py>, file_offset: i64, nbytes: i64) -> PyResult<Bound<'py, PyBytes>> {
        let (foff, n) = (nonneg(py, "file_offset", file_offset)?, nonneg(py, "nbytes", nbytes)?);
        let st = self.storage(py)?;
        let data = py
            .detach(move || -> ugds::Result<Vec<u8>> {
                let b = st.alloc_host(n.max(1) as usize)?;
                let got = st.read(&b, 0, foff, n)?;
                let mut out = vec![0u8; got as usize];
                b.copy_out(0, &mut out)?;
                Ok(out)
            })
            .map_err(|e| to_py(py, e))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Writes the bytes of `data` (any bytes-like object) at `file_offset` through a host
    /// buffer the call allocates; returns the bytes written.
    fn write_bytes(&self, py: Python<'_>, data: &Bound<'_, PyAny>, file_offset: i64) -> PyResult<u64> {
        let foff = nonneg(py, "file_offset", file_offset)?;
        let src = crate::pybuf::export_of(data, "data")?;
        let st = self.storage(py)?;
        py.detach(move || -> ugds::Result<u64> {
            let src = src.as_slice().unwrap_or_default();
            let b = st.alloc_host(src.len().max(1))?;
            b.copy_in(0, src)?;
            st.write(&b, 0, foff, src.len() as u64)
        })
        .map_err(|e| to_py(py, e))
    }

    /// Flushes written data (NVMe Flush, or fdatasync).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let st = self.storage(py)?;
        py.detach(move || st.flush()).map_err(|e| to_py(py, e))
    }

    /// I/Os per path since the storage was opened, and bytes moved: a dict with the keys
    /// `direct_p2p`, `direct_host`, `direct_staged` (GPU memory staged through host memory on the
    /// direct path), `fallback`, `remote`, `remote_staged` (NVMe over Fabrics), `bytes`.
    fn path_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.storage(py)?.path_counts();
        let d = PyDict::new(py);
        d.set_item("direct_p2p", c.direct_p2p)?;
        d.set_item("direct_host", c.direct_host)?;
        d.set_item("direct_staged", c.direct_staged)?;
        d.set_item("fallback", c.fallback)?;
        d.set_item("remote", c.remote)?;
        d.set_item("remote_staged", c.remote_staged)?;
        d.set_item("bytes", c.bytes)?;
        Ok(d)
    }

    /// Queues a read on `stream` (an integer CUDA stream handle such as
    /// `torch.cuda.current_stream().cuda_stream`, a torch or cupy stream object, or a
    /// `ugds.CpuStream`): it runs when the stream gets there, and later work on the stream waits
    /// for it. Returns an AsyncIo; the call itself does not wait.
    #[pyo3(signature = (buf, file_offset, nbytes, buf_offset = 0, *, stream))]
    fn read_async(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        file_offset: i64,
        nbytes: i64,
        buf_offset: i64,
        stream: &Bound<'_, PyAny>,
    ) -> PyResult<PyAsyncIo> {
        crate::stream::queue(slf, Op::Read, buf, file_offset, nbytes, buf_offset, stream)
    }

    /// Queues a write on `stream` (see `read_async`).
    #[pyo3(signature = (buf, file_offset, nbytes, buf_offset = 0, *, stream))]
    fn write_async(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        file_offset: i64,
        nbytes: i64,
        buf_offset: i64,
        stream: &Bound<'_, PyAny>,
    ) -> PyResult<PyAsyncIo> {
        crate::stream::queue(slf, Op::Write, buf, file_offset, nbytes, buf_offset, stream)
    }

    /// kvikio's `pread(buf, size=None, file_offset=0, task_size=None)`: reads `size` bytes
    /// (None: the whole buffer from `buf_offset`) at `file_offset` into `buf` at `buf_offset`
    /// (keyword-only: kvikio's fourth argument is `task_size`), on one of the binding's I/O
    /// threads. Returns an AsyncIo at once: `get()` / `result()` waits for the bytes read,
    /// `done()`, `future()` (a `concurrent.futures.Future`), `await`. Bad arguments raise here,
    /// before anything runs. `task_size` is accepted and unused: one call is one library I/O.
    #[pyo3(signature = (buf, size = None, file_offset = 0, task_size = None, *, buf_offset = 0))]
    fn pread(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        file_offset: i64,
        task_size: Option<i64>,
        buf_offset: i64,
    ) -> PyResult<PyAsyncIo> {
        crate::stream::submit(slf, Op::Read, buf, (size, file_offset, buf_offset), task_size)
    }

    /// kvikio's `pwrite(buf, size=None, file_offset=0, task_size=None)`: writes `size` bytes
    /// (None: the whole buffer from `buf_offset`) of `buf` to `file_offset`; an AsyncIo, as
    /// `pread` gives.
    #[pyo3(signature = (buf, size = None, file_offset = 0, task_size = None, *, buf_offset = 0))]
    fn pwrite(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        file_offset: i64,
        task_size: Option<i64>,
        buf_offset: i64,
    ) -> PyResult<PyAsyncIo> {
        crate::stream::submit(slf, Op::Write, buf, (size, file_offset, buf_offset), task_size)
    }

    /// A batch of up to `capacity` entries in flight (see `Batch`).
    #[pyo3(signature = (capacity = 64))]
    fn batch(slf: Py<Self>, py: Python<'_>, capacity: i64) -> PyResult<PyBatch> {
        PyBatch::new(py, slf, capacity)
    }

    fn __repr__(&self) -> String {
        let st = self.st.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let what = st.map_or_else(|| "closed".to_string(), |s| s.describe());
        format!("ugds.Storage({:?}: {what})", self.path)
    }

    /// Whether `close()` ran.
    #[getter]
    fn closed(&self) -> bool {
        self.st.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Releases the storage now rather than when the last reference goes: closes its batches
    /// (waiting for their submitted entries), deregisters every buffer registered through it,
    /// and lets go of its queues (the last operation in flight, if any, lets go of them when it
    /// ends). Every later use raises `Closed`; closing again does nothing.
    fn close(&self, py: Python<'_>) {
        let Some(st) = self.st.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
        let owned = std::mem::take(&mut *self.owned.lock().unwrap_or_else(|e| e.into_inner()));
        for b in owned.batches.iter().filter_map(Weak::upgrade) {
            crate::batch::shut_down(py, &b);
        }
        let regs: Vec<Arc<Buffer>> = owned
            .bufs
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|r| r.lock().unwrap_or_else(|e| e.into_inner()).take())
            .collect();
        // Deregistration and the queues' teardown are system calls: without the GIL.
        py.detach(move || drop((regs, st)));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, py: Python<'_>, _t: &Bound<'_, PyAny>, _v: &Bound<'_, PyAny>, _tb: &Bound<'_, PyAny>) {
        self.close(py)
    }
}

#[pymethods]
impl PyBuffer {
    /// Length in bytes (of the object; the registration covers whole pages around it).
    #[getter]
    fn nbytes(&self) -> u64 {
        self.mem.len
    }

    /// Its address (host or device).
    #[getter]
    fn ptr(&self) -> u64 {
        self.mem.ptr
    }

    /// `"cpu"` or `"cuda:N"`.
    #[getter]
    fn device(&self) -> String {
        self.mem.place.to_string()
    }

    /// Whether reads into it are refused (a read-only export such as `bytes`).
    #[getter]
    fn readonly(&self) -> bool {
        self.mem.readonly
    }

    /// The path I/O on it takes, in words ("fallback (io_uring + staging)", "direct
    /// (peer-to-peer)", ...).
    #[getter]
    fn path(&self, py: Python<'_>) -> PyResult<String> {
        let b = self.buf.lock().unwrap_or_else(|e| e.into_inner()).clone();
        b.map(|b| b.path().to_string()).ok_or_else(|| invalid(py, "buf", "deregistered"))
    }

    /// Copies `data` (bytes-like) into the buffer at `offset` (refused while I/O on it runs).
    #[pyo3(signature = (data, offset = 0))]
    fn copy_in(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: i64) -> PyResult<()> {
        let off = nonneg(py, "offset", offset)?;
        let src = crate::pybuf::export_of(data, "data")?;
        let t = self.target(py, off, src.len(), true)?;
        let gpu = self.place_of() != Place::Host;
        // `data` over the buffer's own bytes: copied first (the copy below needs two ranges
        // that do not overlap).
        let own = self.overlaps(off, src.ptr(), src.len()).then(|| src.as_slice().unwrap_or_default().to_vec());
        py.detach(move || {
            let _caller = gpu.then(CallerContext::keep);
            let bytes = own.as_deref().unwrap_or_else(|| src.as_slice().unwrap_or_default());
            t.buf.copy_in(t.offset as usize, bytes)
        })
        .map_err(|e| to_py(py, e))
    }

    /// Copies `len(dst)` bytes of the buffer at `offset` into `dst`, a writable contiguous
    /// bytes-like object (a bytearray, a memoryview of pinned memory, ...), without the GIL and
    /// without an intermediate `bytes` (refused while I/O on the buffer runs).
    #[pyo3(signature = (dst, offset = 0))]
    fn copy_out_into(&self, py: Python<'_>, dst: &Bound<'_, PyAny>, offset: i64) -> PyResult<()> {
        let off = nonneg(py, "offset", offset)?;
        let mut out = crate::pybuf::Export::get(dst)
            .filter(|e| e.c_contiguous() && !e.readonly())
            .ok_or_else(|| invalid(py, "dst", "must be a writable contiguous bytes-like object"))?;
        let t = self.target(py, off, out.len(), false)?;
        let gpu = self.place_of() != Place::Host;
        let overlap = self.overlaps(off, out.ptr(), out.len());
        py.detach(move || {
            let _caller = gpu.then(CallerContext::keep);
            let dst = out.as_mut_slice().unwrap_or_default();
            if overlap {
                // `dst` over the buffer's own bytes: through a copy (see `copy_in`).
                let mut v = vec![0u8; dst.len()];
                t.buf.copy_out(t.offset as usize, &mut v)?;
                dst.copy_from_slice(&v);
                return Ok(());
            }
            t.buf.copy_out(t.offset as usize, dst)
        })
        .map_err(|e| to_py(py, e))
    }

    /// Returns `nbytes` of the buffer at `offset` as bytes (refused while I/O on it runs).
    #[pyo3(signature = (nbytes = None, offset = 0))]
    fn copy_out<'py>(&self, py: Python<'py>, nbytes: Option<i64>, offset: i64) -> PyResult<Bound<'py, PyBytes>> {
        let off = nonneg(py, "offset", offset)?;
        let n = match nbytes {
            Some(n) => nonneg(py, "nbytes", n)?,
            None => self.mem.len.saturating_sub(off),
        };
        let t = self.target(py, off, n, false)?;
        let gpu = self.place_of() != Place::Host;
        if !gpu {
            // Host memory: straight into the new bytes object (one copy; memcpy under the GIL).
            return PyBytes::new_with(py, n as usize, |b| {
                t.buf.copy_out(t.offset as usize, b).map_err(|e| to_py(py, e))
            });
        }
        let data = py
            .detach(move || {
                let _caller = gpu.then(CallerContext::keep);
                let mut v = vec![0u8; n as usize];
                t.buf.copy_out(t.offset as usize, &mut v).map(|_| v)
            })
            .map_err(|e| to_py(py, e))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Deregisters now (refused with RegistrationBusy while I/O on it runs); later use raises
    /// InvalidArgument. Dropping the Buffer deregisters too.
    fn deregister(&self, py: Python<'_>) -> PyResult<()> {
        let mut g = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        let Some(b) = g.take() else { return Ok(()) };
        match Arc::try_unwrap(b) {
            Ok(b) => match b.deregister() {
                Ok(()) => Ok(()),
                Err(boxed) => {
                    let (b, e) = *boxed;
                    *g = Some(Arc::new(b));
                    Err(to_py(py, e))
                }
            },
            Err(shared) => {
                let n = shared.inflight();
                *g = Some(shared);
                Err(to_py(py, ugds::Error::RegistrationBusy { id: 0, inflight: n.max(1) }))
            }
        }
    }

    fn __len__(&self) -> usize {
        self.mem.len as usize
    }

    fn __repr__(&self) -> String {
        let path = self.buf.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|b| b.path().to_string());
        format!(
            "ugds.Buffer({}, {} bytes at {:#x}, {})",
            self.mem.what,
            self.mem.len,
            self.mem.ptr,
            path.as_deref().unwrap_or("deregistered")
        )
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.deregister(py)
    }
}

/// `ugds.open(path, ns=1)`: a ugds node (`/dev/ugds_drvN`, namespace `ns`) takes the direct
/// path; a regular file or block device the fallback path; anything else raises NotUgdsNode
/// naming what it is, and a missing path OpenError naming the path.
#[pyfunction]
#[pyo3(signature = (path, ns = 1))]
pub fn open(py: Python<'_>, path: String, ns: u32) -> PyResult<PyStorage> {
    let p = path.clone();
    let st = py.detach(move || Storage::open_ns(&p, ns)).map_err(|e| to_py(py, e))?;
    Ok(PyStorage { st: Mutex::new(Some(st)), path, owned: Mutex::default() })
}

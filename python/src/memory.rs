//! What `register(obj)` accepts, as one address range: torch tensors, objects with
//! `__cuda_array_interface__` (CuPy, Numba), the buffer protocol (bytearray, numpy, mmap,
//! memoryview) and `__dlpack__`; raw `(ptr, nbytes)` integers only through
//! `register_raw_unsafe` ([`raw_pointer`]). Each result keeps what holds the memory alive (the
//! object, its buffer export, or its DLPack capsule) for as long as it lives.
//!
//! A torch tensor can move its memory while registered (`resize_()`, `set_()`): its allocator
//! may then reuse the old bytes for anything. Its registration holds the tensor's storage too
//! and re-reads the tensor's and the storage's address and size before every use
//! ([`Memory::verify`]); a change fails with `RegisteredMemoryChanged` before any byte moves.

use crate::errors::invalid;
use crate::pybuf::Export;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict, PyTuple};
use std::sync::Arc;
use ugds::Gpu;

/// Where the memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Host memory (pageable or pinned).
    Host,
    /// Device memory of CUDA device `ordinal`.
    Cuda(i32),
    /// Another driver's dma-buf: only the SSD reaches it.
    Dmabuf,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Host => f.write_str("cpu"),
            Place::Cuda(n) => write!(f, "cuda:{n}"),
            Place::Dmabuf => f.write_str("dmabuf"),
        }
    }
}

/// What keeps the memory valid (held, never read).
#[allow(dead_code)]
pub enum Keep {
    /// Nothing: raw integers, the caller's promise.
    Nothing,
    /// A reference to the object (torch tensors, `__cuda_array_interface__`, the DLPack capsule).
    Object(Py<PyAny>),
    /// A buffer export: also stops a bytearray from being resized while registered.
    Export(Export),
}

/// One address range and what it is.
pub struct Memory {
    /// Start address (host or device).
    pub ptr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The exporter said it is read-only (reads into it are refused).
    pub readonly: bool,
    /// Host or which GPU.
    pub place: Place,
    /// What it came from, for messages and `repr`.
    pub what: String,
    /// Holds the memory (never read: held for as long as the registration lives).
    #[allow(dead_code)]
    pub keep: Keep,
    /// What must still hold before each use (objects that can move their memory).
    pub recheck: Recheck,
}

/// What a registration re-reads before every use, because its object can move its memory.
pub enum Recheck {
    /// The memory cannot move while held (buffer exports, DLPack capsules, raw pointers).
    Nothing,
    /// A torch tensor and the storage it had when registered (held, so the bytes stay
    /// allocated), with the storage's address and size then (`None`: this torch has no
    /// `untyped_storage`, only the tensor is re-read).
    Torch { tensor: Py<PyAny>, storage: Option<(Py<PyAny>, u64, u64)> },
}

/// A torch tensor's (address, bytes) now.
fn torch_range(t: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
    let numel: u64 = t.call_method0("numel")?.extract()?;
    let esize: u64 = t.call_method0("element_size")?.extract()?;
    Ok((t.call_method0("data_ptr")?.extract()?, numel * esize))
}

/// A torch storage's (address, bytes) now.
fn storage_range(s: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
    Ok((s.call_method0("data_ptr")?.extract()?, s.call_method0("nbytes")?.extract()?))
}

impl Memory {
    /// Checks that the object still has the memory it was registered with; else
    /// `RegisteredMemoryChanged` naming what changed (before any I/O or copy touches it).
    pub fn verify(&self, py: Python<'_>) -> PyResult<()> {
        let Recheck::Torch { tensor, storage } = &self.recheck else { return Ok(()) };
        let t = tensor.bind(py);
        let (ptr, len) = torch_range(t)?;
        let mut changed = Vec::new();
        if ptr != self.ptr {
            changed.push(format!("data_ptr() is {ptr:#x}, was {:#x}", self.ptr));
        }
        if len != self.len {
            changed.push(format!("its size is {len} bytes, was {}", self.len));
        }
        if let Some((held, sptr, slen)) = storage {
            // The storage the tensor has now, and the one it had (a resize of the storage
            // reallocates it in place; set_() gives the tensor another).
            let now = t.call_method0("untyped_storage")?;
            let (nptr, nlen) = storage_range(&now)?;
            let (hptr, hlen) = storage_range(held.bind(py))?;
            if (nptr, nlen) != (*sptr, *slen) || (hptr, hlen) != (*sptr, *slen) {
                changed.push(format!(
                    "its storage is {nlen} bytes at {nptr:#x}, was {slen} bytes at {sptr:#x} (resize_() or set_())"
                ));
            }
        }
        if changed.is_empty() {
            return Ok(());
        }
        Err(crate::errors::memory_changed(
            py,
            &changed.join("; "),
            format!(
                "the registered {} no longer has the memory it was registered with: {}; nothing was read or written                  (register it again)",
                self.what,
                changed.join("; ")
            ),
        ))
    }
}

/// The CUDA device `ordinal` as a [`Gpu`] (its primary context, as PyTorch and CuPy use; the
/// library keeps one per context in the process, shared with the C faces).
pub fn cuda(py: Python<'_>, ordinal: i32) -> PyResult<Arc<Gpu>> {
    Gpu::cuda_device(ordinal).map_err(|e| crate::errors::to_py(py, e))
}

/// Classifies `obj` (see the module comment). A `(ptr, nbytes)` tuple is refused: raw
/// integers go through `register_raw_unsafe`, which says what the caller promises.
pub fn classify(obj: &Bound<'_, PyAny>) -> PyResult<Memory> {
    let py = obj.py();
    if obj.cast::<PyTuple>().is_ok() {
        return Err(invalid(
            py,
            "buf",
            "a (ptr, nbytes) tuple is not registered by register(): nothing keeps raw memory valid or notices when \
             it moves; call register_raw_unsafe(ptr, nbytes) to promise that yourself",
        ));
    }
    let module: String = obj.get_type().getattr("__module__").and_then(|m| m.extract()).unwrap_or_default();
    if module.starts_with("torch") && obj.hasattr("data_ptr")? {
        return torch(obj);
    }
    if let Ok(cai) = obj.getattr("__cuda_array_interface__") {
        return cuda_array(obj, &cai);
    }
    if let Some(b) = Export::get(obj) {
        return buffer(obj, b);
    }
    if obj.hasattr("__dlpack__")? {
        return dlpack(obj);
    }
    let name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    Err(invalid(
        py,
        "buf",
        format!(
            "a {name} is not memory ugds can register: give a torch tensor, a numpy or cupy array, an object with \
             __dlpack__, __cuda_array_interface__ or the buffer protocol, or a (ptr, nbytes) tuple"
        ),
    ))
}

fn typename(obj: &Bound<'_, PyAny>) -> String {
    let t = obj.get_type();
    let m: String = t.getattr("__module__").and_then(|m| m.extract()).unwrap_or_default();
    let n = t.name().map(|n| n.to_string()).unwrap_or_default();
    if m.is_empty() || m == "builtins" {
        n
    } else {
        format!("{m}.{n}")
    }
}

/// Raw `(ptr, nbytes)` (`register_raw_unsafe`): device memory of the CUDA device that holds it
/// when CUDA says so (served by that device's primary context), else host memory. Nothing holds or re-checks it: the caller promises it stays allocated,
/// unmoved, while registered.
pub fn raw_pointer(py: Python<'_>, ptr: u64, len: u64) -> PyResult<Memory> {
    if ptr == 0 || len == 0 {
        return Err(invalid(py, "buf", "(ptr, nbytes) with a null pointer or no bytes"));
    }
    let place = match ugds::gpu::cuda::place_of_pointer(ptr) {
        Ok(ugds::gpu::cuda::PointerPlace::Device { device, .. }) => Place::Cuda(device),
        _ => Place::Host,
    };
    Ok(Memory {
        ptr,
        len,
        readonly: false,
        place,
        what: format!("raw memory at {ptr:#x}"),
        keep: Keep::Nothing,
        recheck: Recheck::Nothing,
    })
}

fn torch(obj: &Bound<'_, PyAny>) -> PyResult<Memory> {
    let py = obj.py();
    let dev = obj.getattr("device")?;
    let dtype: String = dev.getattr("type")?.extract()?;
    let place = match dtype.as_str() {
        "cpu" => Place::Host,
        "cuda" => Place::Cuda(dev.getattr("index")?.extract::<Option<i32>>()?.unwrap_or(0)),
        other => {
            return Err(invalid(
                py,
                "buf",
                format!("a torch tensor on device {other:?}: ugds takes cpu and cuda tensors"),
            ))
        }
    };
    if !obj.call_method0("is_contiguous")?.extract::<bool>()? {
        let shape = obj.getattr("shape")?.str()?.to_string();
        let stride = obj.call_method0("stride")?.str()?.to_string();
        return Err(invalid(
            py,
            "buf",
            format!("a non-contiguous torch tensor ({shape}, stride {stride}): call .contiguous() first"),
        ));
    }
    let (ptr, len) = torch_range(obj)?;
    // The storage, held: a set_() then leaves the old bytes allocated, and a resize shows.
    let storage = match obj.call_method0("untyped_storage") {
        Ok(s) => {
            let (sptr, slen) = storage_range(&s)?;
            Some((s.unbind(), sptr, slen))
        }
        Err(_) => None,
    };
    Ok(Memory {
        ptr,
        len,
        readonly: false,
        place,
        what: format!("torch tensor on {place}"),
        keep: Keep::Object(obj.clone().unbind()),
        recheck: Recheck::Torch { tensor: obj.clone().unbind(), storage },
    })
}

/// Bytes per item of a numpy-style type string (`<f4`, `|u1`).
fn itemsize(typestr: &str) -> Option<u64> {
    typestr.get(2..)?.parse().ok()
}

/// Whether `strides` (bytes) describe a C-contiguous layout of `shape`.
fn c_contiguous(shape: &[u64], strides: &[i64], item: u64) -> bool {
    let mut expect = item as i64;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n > 1 && s != expect {
            return false;
        }
        expect *= n as i64;
    }
    true
}

fn cuda_array(obj: &Bound<'_, PyAny>, cai: &Bound<'_, PyAny>) -> PyResult<Memory> {
    let py = obj.py();
    let d = cai.cast::<PyDict>().map_err(|_| invalid(py, "buf", "__cuda_array_interface__ is not a dict"))?;
    let get = |k: &str| d.get_item(k).ok().flatten();
    let (ptr, readonly): (u64, bool) = get("data").map(|v| v.extract()).transpose()?.unwrap_or((0, false));
    let shape: Vec<u64> = get("shape").map(|v| v.extract()).transpose()?.unwrap_or_default();
    let typestr: String = get("typestr").map(|v| v.extract()).transpose()?.unwrap_or_default();
    let item = itemsize(&typestr).ok_or_else(|| invalid(py, "buf", format!("unknown typestr {typestr:?}")))?;
    if let Some(s) = get("strides").filter(|s| !s.is_none()) {
        let strides: Vec<i64> = s.extract()?;
        if !c_contiguous(&shape, &strides, item) {
            return Err(invalid(
                py,
                "buf",
                format!("a non-contiguous {} (strides {strides:?}): make it contiguous first", typename(obj)),
            ));
        }
    }
    // CuPy and Numba arrays say their device; the interface itself does not.
    let ordinal = obj.getattr("device").and_then(|d| d.getattr("id")).and_then(|i| i.extract()).unwrap_or(0);
    let place = Place::Cuda(ordinal);
    Ok(Memory {
        ptr,
        len: shape.iter().product::<u64>() * item,
        readonly,
        place,
        what: format!("{} on {place}", typename(obj)),
        keep: Keep::Object(obj.clone().unbind()),
        recheck: Recheck::Nothing,
    })
}

fn buffer(obj: &Bound<'_, PyAny>, b: Export) -> PyResult<Memory> {
    let py = obj.py();
    if !b.c_contiguous() {
        return Err(invalid(py, "buf", format!("a non-contiguous {} buffer: make it contiguous first", typename(obj))));
    }
    Ok(Memory {
        ptr: b.ptr(),
        len: b.len(),
        readonly: b.readonly(),
        place: Place::Host,
        what: typename(obj),
        keep: Keep::Export(b),
        recheck: Recheck::Nothing,
    })
}

/// DLPack's C layout (dlpack.h, ABI-stable since v0.6).
#[repr(C)]
struct DlTensor {
    data: *mut u8,
    device_type: i32,
    device_id: i32,
    ndim: i32,
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;
const DL_CUDA_HOST: i32 = 3;

fn dlpack(obj: &Bound<'_, PyAny>) -> PyResult<Memory> {
    let py = obj.py();
    let cap = obj.call_method0("__dlpack__")?;
    let capsule = cap.cast::<PyCapsule>().map_err(|_| invalid(py, "buf", "__dlpack__ did not return a capsule"))?;
    // The capsule owns the tensor until it is consumed; we never consume it, so holding the
    // capsule keeps the memory (its destructor calls the producer's deleter).
    let p = capsule.pointer_checked(Some(c"dltensor"))?.cast::<DlTensor>();
    // SAFETY: a "dltensor" capsule points at a DLManagedTensor, whose first member is the
    // DLTensor laid out as `DlTensor`; it stays valid while the unconsumed capsule lives (held
    // here), and no Python code runs while these fields are read.
    let t = unsafe { p.as_ref() };
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    let shape: Vec<u64> = if ndim == 0 || t.shape.is_null() {
        Vec::new()
    } else {
        // SAFETY: DLPack guarantees `shape` has `ndim` entries.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }.iter().map(|&n| n.max(0) as u64).collect()
    };
    let item = (u64::from(t.dtype_bits) * u64::from(t.dtype_lanes)).div_ceil(8);
    if !t.strides.is_null() && ndim > 0 {
        // SAFETY: when present, `strides` has `ndim` entries (in elements).
        let el: Vec<i64> = unsafe { std::slice::from_raw_parts(t.strides, ndim) }.to_vec();
        let bytes: Vec<i64> = el.iter().map(|s| s * item as i64).collect();
        if !c_contiguous(&shape, &bytes, item) {
            return Err(invalid(
                py,
                "buf",
                format!("a non-contiguous {} (DLPack strides {el:?}): make it contiguous first", typename(obj)),
            ));
        }
    }
    let place = match t.device_type {
        DL_CPU | DL_CUDA_HOST => Place::Host,
        DL_CUDA => Place::Cuda(t.device_id),
        other => {
            return Err(invalid(
                py,
                "buf",
                format!("DLPack device type {other} (ugds takes CPU, CUDA and CUDA host memory)"),
            ))
        }
    };
    Ok(Memory {
        ptr: t.data as u64 + t.byte_offset,
        len: shape.iter().product::<u64>() * item,
        readonly: false,
        place,
        what: format!("{} on {place} (DLPack)", typename(obj)),
        keep: Keep::Object(capsule.clone().into_any().unbind()),
        recheck: Recheck::Nothing,
    })
}

//! The buffer protocol under abi3 for CPython 3.9 and 3.10: `PyObject_GetBuffer` and
//! `PyBuffer_Release` joined the limited API only in 3.11 (so PyO3's `buffer` module is off
//! for an abi3-py39 build), but every CPython 3.x exports both functions with this `Py_buffer`
//! layout (unchanged since 3.3), so an abi3 module may call them on 3.9 and 3.10 too.

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void};

/// CPython's `Py_buffer`.
#[repr(C)]
struct RawView {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

// `PyBUF_STRIDES | PyBUF_FORMAT`: shape and strides filled in, any layout, read-only allowed.
const PYBUF_STRIDES_FORMAT: c_int = 0x0018 | 0x0004;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawView, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawView);
}

/// A buffer export of an object, released on drop. While it lives the exporter keeps the
/// memory where it is (a bytearray refuses to resize).
///
/// # Invariants
///
/// `view` was filled by a successful `PyObject_GetBuffer` and is released exactly once, on drop.
pub struct Export {
    // Boxed: exporters may point fields of the view into the view itself.
    view: Box<RawView>,
}

// SAFETY: the view is plain data describing memory the exporter keeps valid until release;
// release happens with the GIL held (drop attaches), from whichever thread drops it.
unsafe impl Send for Export {}
// SAFETY: shared access only reads the view's fields.
unsafe impl Sync for Export {}

impl Export {
    /// Exports `obj`'s buffer, or `None` (the Python error cleared) when it has none.
    pub fn get(obj: &Bound<'_, PyAny>) -> Option<Export> {
        let mut view = Box::new(RawView {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: `obj` is a live object (we hold the GIL through `Bound`); `view` is a
        // writable Py_buffer that outlives the call.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, PYBUF_STRIDES_FORMAT) };
        if rc != 0 {
            // Not an exporter (TypeError) or it refused: clear the error, the caller tries
            // other protocols.
            drop(PyErr::take(obj.py()));
            return None;
        }
        // INVARIANT: filled by a successful PyObject_GetBuffer.
        Some(Export { view })
    }

    /// The first byte.
    pub fn ptr(&self) -> u64 {
        self.view.buf as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.view.len.max(0) as u64
    }

    /// Whether the exporter refuses writes.
    pub fn readonly(&self) -> bool {
        self.view.readonly != 0
    }

    /// Whether the bytes are one C-contiguous run (no strides, or strides of a C layout).
    pub fn c_contiguous(&self) -> bool {
        let v = &*self.view;
        let ndim = usize::try_from(v.ndim).unwrap_or(0);
        if !v.suboffsets.is_null() {
            return false;
        }
        if v.strides.is_null() || v.shape.is_null() || ndim == 0 {
            return true;
        }
        // SAFETY: with PyBUF_STRIDES the exporter fills `shape` and `strides` with `ndim`
        // entries each, valid until release.
        let (shape, strides) =
            unsafe { (std::slice::from_raw_parts(v.shape, ndim), std::slice::from_raw_parts(v.strides, ndim)) };
        let mut expect = v.itemsize;
        for (&n, &s) in shape.iter().zip(strides).rev() {
            if n > 1 && s != expect {
                return false;
            }
            expect *= n;
        }
        true
    }

    /// The bytes, in place (C-contiguous exports only; else `None`). Valid while the export
    /// lives (the exporter keeps the memory until release), also without the GIL; the caller's
    /// contract, as for any I/O from the object, is that nobody changes them meanwhile.
    pub fn as_slice(&self) -> Option<&[u8]> {
        if !self.c_contiguous() {
            return None;
        }
        if self.len() == 0 {
            return Some(&[]);
        }
        // SAFETY: a C-contiguous export is `len` readable bytes at `buf`, valid until release,
        // which happens only when `self` (borrowed here) is dropped.
        Some(unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, self.len() as usize) })
    }

    /// The bytes, in place and writable (C-contiguous, writable exports only; else `None`).
    /// `&mut self`: one writer per export.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        if !self.c_contiguous() || self.readonly() {
            return None;
        }
        if self.len() == 0 {
            return Some(&mut []);
        }
        // SAFETY: a C-contiguous writable export is `len` writable bytes at `buf`, valid until
        // release (when `self`, borrowed mutably here, is dropped).
        Some(unsafe { std::slice::from_raw_parts_mut(self.view.buf as *mut u8, self.len() as usize) })
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: released once (type invariant), with the GIL held.
            unsafe { PyBuffer_Release(&mut *self.view) }
        })
    }
}

/// The buffer export of a C-contiguous bytes-like `obj` (`as_slice` is `Some`); `arg` names it
/// in the error. Its bytes are read in place, without the GIL.
pub fn export_of(obj: &Bound<'_, PyAny>, arg: &'static str) -> PyResult<Export> {
    Export::get(obj)
        .filter(Export::c_contiguous)
        .ok_or_else(|| crate::errors::invalid(obj.py(), arg, "must be a contiguous bytes-like object"))
}

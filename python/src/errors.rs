//! `ugds::Error` as Python exceptions: one class of `ugds.errors` per variant, carrying the
//! variant's named fields as attributes, `errno` (positive) and `kind` (the variant's name).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

/// The exception for `e` (the message is the library's own).
pub fn to_py(py: Python<'_>, e: ugds::Error) -> PyErr {
    build(py, &e).unwrap_or_else(|inner| {
        // `ugds.errors` could not be imported (a broken install): keep the message at least.
        PyRuntimeError::new_err(format!("{e} (and building its exception failed: {inner})"))
    })
}

/// `Error::InvalidArgument { arg, reason }` as an exception (checks made by the binding).
pub fn invalid(py: Python<'_>, arg: &'static str, reason: impl Into<String>) -> PyErr {
    to_py(py, ugds::Error::invalid(arg, reason))
}

/// `ugds.errors.RegisteredMemoryChanged`: a registered object's memory moved (`what` says how);
/// raised by the binding before any I/O touches it.
pub fn memory_changed(py: Python<'_>, what: &str, msg: String) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let inst = py.import("ugds.errors")?.getattr("RegisteredMemoryChanged")?.call1((msg.clone(),))?;
        inst.setattr("errno", libc_einval())?;
        inst.setattr("kind", "RegisteredMemoryChanged")?;
        inst.setattr("what", what)?;
        Ok(PyErr::from_value(inst))
    })();
    made.unwrap_or_else(|inner| PyRuntimeError::new_err(format!("{msg} (and building its exception failed: {inner})")))
}

/// `ugds.errors.Closed`: the storage at `path` was closed (`Storage.close()` or the end of its
/// `with` block); raised by every later use of it, its batches and its buffers' I/O.
pub fn closed(py: Python<'_>, path: &str) -> PyErr {
    let msg = format!("the storage {path} is closed");
    let made = (|| -> PyResult<PyErr> {
        let inst = py.import("ugds.errors")?.getattr("Closed")?.call1((msg.clone(),))?;
        inst.setattr("errno", libc::EBADF)?;
        inst.setattr("kind", "Closed")?;
        inst.setattr("object", "storage")?;
        inst.setattr("path", path)?;
        Ok(PyErr::from_value(inst))
    })();
    made.unwrap_or_else(|inner| PyRuntimeError::new_err(format!("{msg} (and building its exception failed: {inner})")))
}

/// EINVAL, as the other argument errors report it.
fn libc_einval() -> i32 {
    -ugds::Error::invalid("buf", "").errno()
}

/// Class name and fields of one error.
type Fields<'py> = (&'static str, Vec<(&'static str, Bound<'py, PyAny>)>);

fn fields<'py>(py: Python<'py>, e: &ugds::Error) -> PyResult<Fields<'py>> {
    use ugds::Error as E;
    let v = |x: &dyn ToPy| x.to_py(py);
    Ok(match e {
        E::Open { path, .. } => ("OpenError", vec![("path", v(path)?)]),
        E::NotUgdsNode { path, what, fix } => {
            ("NotUgdsNode", vec![("path", v(path)?), ("what", v(what)?), ("fix", v(&fix.to_string())?)])
        }
        E::AbiMismatch { kernel, library } => {
            ("AbiMismatch", vec![("kernel", v(&u64::from(*kernel))?), ("library", v(&u64::from(*library))?)])
        }
        E::Control { op, .. } => ("ControlError", vec![("op", v(&op.to_string())?)]),
        E::InvalidArgument { arg, reason } => {
            ("InvalidArgument", vec![("arg", v(&arg.to_string())?), ("reason", v(reason)?)])
        }
        E::NoNamespace(n) => ("NoNamespace", vec![("nsid", v(&u64::from(*n))?)]),
        E::Nvme { op, slba, status } => (
            "NvmeError",
            vec![
                ("op", v(&op.to_string())?),
                ("slba", v(slba)?),
                ("status", status.name().into_bound_py_any(py)?),
                ("status_type", v(&u64::from(status.sct.bits()))?),
                ("status_code", v(&u64::from(status.sc))?),
                ("dnr", status.dnr.into_bound_py_any(py)?),
            ],
        ),
        E::Timeout { op, slba, timeout_ms } => {
            ("Timeout", vec![("op", v(&op.to_string())?), ("slba", v(slba)?), ("timeout_ms", v(timeout_ms)?)])
        }
        E::DeviceFaulted => ("DeviceFaulted", vec![]),
        E::EpochChanged { old, new } => ("EpochChanged", vec![("old", v(old)?), ("new", v(new)?)]),
        E::RegistrationBusy { id, inflight } => {
            ("RegistrationBusy", vec![("id", v(&u64::from(*id))?), ("inflight", v(&u64::from(*inflight))?)])
        }
        E::DeviceProtocol(d) => ("DeviceProtocol", vec![("detail", v(d)?)]),
        E::PeerToPeerRefused => ("PeerToPeerRefused", vec![]),
        E::Revoked => ("Revoked", vec![]),
        E::Gpu { op, reason } => ("GpuError", vec![("op", v(&op.to_string())?), ("reason", v(reason)?)]),
        E::Unsupported { what, why, fix } => {
            ("Unsupported", vec![("what", v(&what.to_string())?), ("why", v(why)?), ("fix", v(&fix.to_string())?)])
        }
        E::Io { op, .. } => ("IoError", vec![("op", v(op)?)]),
        E::ForkedChild { object } => ("ForkedChild", vec![("object", v(&object.to_string())?)]),
        // A variant added to the library later: the base class, with its message.
        _ => ("Error", vec![]),
    })
}

/// The library's name of the variant (`kind`), from its class.
fn kind(class: &str) -> &str {
    match class {
        "OpenError" => "Open",
        "ControlError" => "Control",
        "NvmeError" => "Nvme",
        "GpuError" => "Gpu",
        "IoError" => "Io",
        other => other,
    }
}

fn build(py: Python<'_>, e: &ugds::Error) -> PyResult<PyErr> {
    let (class, fields) = fields(py, e)?;
    let cls = py.import("ugds.errors")?.getattr(class)?;
    let inst = cls.call1((e.to_string(),))?;
    inst.setattr("errno", -e.errno())?;
    inst.setattr("kind", kind(class))?;
    for (k, val) in fields {
        inst.setattr(k, val)?;
    }
    Ok(PyErr::from_value(inst))
}

/// Field values as Python objects (strings and integers).
trait ToPy {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>>;
}

impl ToPy for String {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.as_str().into_bound_py_any(py)
    }
}

impl ToPy for u64 {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        (*self).into_bound_py_any(py)
    }
}

#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
//! `ugds._ugds`: the Python extension of the `ugds` package (PyO3, abi3 for CPython >= 3.9).
//!
//! A thin layer over the library's portable API (`Storage`, `Buffer`, `StorageBatch`,
//! `StreamIo`, `doctor`): every I/O and every wait runs with the GIL released, and every
//! library error becomes the matching exception of `ugds.errors` with its named fields. The
//! package's Python half (`python/py/ugds`) adds the exception classes, `python -m ugds` and
//! the type stubs.

mod batch;
mod errors;
mod memory;
mod notices;
mod placement;
mod pool;
mod pybuf;
mod storage;
mod stream;

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// `ugds.doctor()`: what decides, on this machine, which path I/O takes: one dict per finding
/// with `topic`, `verdict` (`"ok"`, `"warn"`, `"no"`, `"info"`), `detail` and `fix`.
#[pyfunction]
fn doctor(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let findings = py.detach(ugds::doctor::diagnose);
    findings
        .into_iter()
        .map(|f| {
            let d = PyDict::new(py);
            d.set_item("topic", f.topic)?;
            d.set_item(
                "verdict",
                match f.verdict {
                    ugds::doctor::Verdict::Ok => "ok",
                    ugds::doctor::Verdict::Warn => "warn",
                    ugds::doctor::Verdict::No => "no",
                    ugds::doctor::Verdict::Info => "info",
                    // A verdict added to the library later.
                    #[allow(unreachable_patterns)]
                    _ => "info",
                },
            )?;
            d.set_item("detail", f.detail)?;
            d.set_item("fix", f.fix)?;
            Ok(d)
        })
        .collect()
}

/// `ugds.cuda_available()`: whether the CUDA driver library can be loaded here (GPU memory
/// and CUDA streams need it; everything else works without).
#[pyfunction]
fn cuda_available() -> bool {
    ugds::gpu::cuda::driver_present()
}

/// `ugds.crc32(data, value=0)`: the CRC-32 of a contiguous bytes-like object (zlib's
/// `crc32`, continued from `value`), computed without the GIL and with the CPU's carry-less
/// multiply where it has one (several GB/s; the KV store checksums every value with it).
#[pyfunction]
#[pyo3(signature = (data, value = 0))]
fn crc32(py: Python<'_>, data: &Bound<'_, PyAny>, value: u32) -> PyResult<u32> {
    let e = pybuf::export_of(data, "data")?;
    Ok(py.detach(move || {
        let mut h = crc32fast::Hasher::new_with_initial(value);
        h.update(e.as_slice().unwrap_or_default());
        h.finalize()
    }))
}

/// `ugds.parse_size(s)`: a size as the CLI takes it (`4096`, `64K`, `16M`, `1G`: binary
/// multiples), parsed by the library's own parser; `InvalidArgument('size')` otherwise.
#[pyfunction]
fn parse_size(py: Python<'_>, s: &str) -> PyResult<u64> {
    ugds::units::parse(s).map_err(|reason| errors::invalid(py, "size", reason))
}

#[pymodule]
fn _ugds(m: &Bound<'_, PyModule>) -> PyResult<()> {
    notices::install();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(notices::_notice_for_tests, m)?)?;
    m.add_function(wrap_pyfunction!(storage::open, m)?)?;
    m.add_function(wrap_pyfunction!(doctor, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(crc32, m)?)?;
    m.add_function(wrap_pyfunction!(placement::nearest, m)?)?;
    m.add_class::<storage::PyStorage>()?;
    m.add_class::<storage::PyBuffer>()?;
    m.add_class::<batch::PyBatch>()?;
    m.add_class::<stream::PyCpuStream>()?;
    m.add_class::<stream::PyAsyncIo>()?;
    Ok(())
}

//! `ugds.nearest()`: which SSDs serve a GPU best, read from the PCI tree in sysfs, for the GPU
//! the calling thread works on (its current CUDA context's device) or one named.

use crate::errors::{invalid, to_py};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use ugds::placement::{cuda_gpu, resolve_gpu, thread_gpu, Placement, Proximity, Topology};

/// The GPU a call names.
enum Which {
    /// The calling thread's (`cudaSetDevice` / `torch.cuda.set_device` on this thread).
    Thread,
    /// A CUDA device ordinal.
    Ordinal(i32),
    /// A PCI address (or an index in PCI order, as the CLI's `--gpu` takes it).
    Named(String),
}

/// The name a proximity has in Python.
fn proximity_name(p: Proximity) -> &'static str {
    match p {
        Proximity::SameSwitch => "same_switch",
        Proximity::SameRootComplex => "same_root_complex",
        Proximity::SameNumaNode => "same_numa_node",
        Proximity::CrossSocket => "cross_socket",
    }
}

/// `ugds._ugds.nearest(target=None, gpu=None, sys=None)`: the ugds nodes `target` names (a
/// node, a volume's spec or descriptor file; none: every controller bound to ugds) against one
/// GPU, nearest first (ties keep the volume's order), one dict per node: `node`, `gpu`, `ssd`
/// (PCI addresses), `proximity`, `gpu_numa`, `ssd_numa`, `warning`. `gpu` is a CUDA device
/// ordinal, a PCI address, or `None`: the calling thread's GPU. `sys` is another sysfs root
/// (tests). `ugds.nearest` wraps the dicts into `Placement` tuples and takes torch and CuPy
/// devices and tensors too.
#[pyfunction]
#[pyo3(signature = (target = None, gpu = None, sys = None))]
pub fn nearest<'py>(
    py: Python<'py>,
    target: Option<String>,
    gpu: Option<&Bound<'py, PyAny>>,
    sys: Option<String>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let which = match gpu {
        None => Which::Thread,
        Some(g) if g.is_none() => Which::Thread,
        Some(g) => match (g.extract::<i32>(), g.extract::<String>()) {
            (Ok(i), _) => Which::Ordinal(i),
            (_, Ok(s)) => Which::Named(s),
            _ => return Err(invalid(py, "gpu", "a CUDA device ordinal (int), a PCI address (str) or None")),
        },
    };
    let rows = py
        .detach(move || -> ugds::Result<Vec<(String, Placement)>> {
            let topo = sys.map(Topology::at).unwrap_or_default();
            let g = match which {
                Which::Thread => thread_gpu()?,
                Which::Ordinal(i) => cuda_gpu(i)?,
                Which::Named(s) => resolve_gpu(&topo, &s)?,
            };
            topo.nearest(&g, &topo.target_nodes(target.as_deref())?)
        })
        .map_err(|e| to_py(py, e))?;
    rows.into_iter()
        .map(|(node, p)| {
            let d = PyDict::new(py);
            d.set_item("node", node)?;
            d.set_item("gpu", &p.gpu)?;
            d.set_item("ssd", &p.ssd)?;
            d.set_item("proximity", proximity_name(p.proximity))?;
            d.set_item("gpu_numa", p.gpu_numa)?;
            d.set_item("ssd_numa", p.ssd_numa)?;
            d.set_item("warning", p.warning())?;
            Ok(d)
        })
        .collect()
}

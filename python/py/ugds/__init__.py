"""ugds: user-space GPU Direct Storage.

Reads and writes a namespace of an NVMe controller bound to ugds (the direct path: the SSD
moves the data by DMA into host memory or, peer-to-peer, GPU memory, with no system call), or a
regular file or block device (the fallback path: io_uring with O_DIRECT, GPU memory staged
through pinned host memory). The same calls work on both::

    import ugds
    st = ugds.open("/dev/ugds_drv0")        # or "/data/kv.bin", "/dev/nvme1n1"
    buf = st.register(tensor)               # torch / numpy / cupy / DLPack / buffer
    st.read(buf, file_offset=0, nbytes=1 << 20)
    st.path_counts()                        # {'direct_p2p': 0, 'direct_host': 0, 'direct_staged': 0, 'fallback': 1, 'remote': 0, 'remote_staged': 0, 'bytes': ...}

``with ugds.open(path) as st:`` (or ``st.close()``) releases its queues and registrations at the
end; ``st.pread(buf)`` / ``st.pwrite(buf)`` (kvikio's calls) and ``read_async`` return an
:class:`AsyncIo`, awaitable and convertible to a ``concurrent.futures.Future``. The library's
notices (why a slower path was chosen) are records of ``logging.getLogger("ugds")``.

Every I/O and every wait releases the GIL. Errors are the classes of :mod:`ugds.errors`, with
the library's named fields (``InvalidArgument.arg``, ``NvmeError.status``, ...).

:mod:`ugds.kv` is a persistent key-value object store on the same targets,
:mod:`ugds.lmcache` an LMCache L2 connector over it, and :mod:`ugds.vllm` a vLLM KV offloading
spec (none of them is imported by ``import ugds``).
"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional

from . import errors
from ._ugds import (
    AsyncIo,
    Batch,
    Buffer,
    CpuStream,
    Storage,
    __version__,
    crc32,
    cuda_available,
    open,
    parse_size,
)
from ._ugds import doctor as _doctor
from ._ugds import nearest as _nearest
from .errors import *  # noqa: F401,F403 (the exception classes are part of the package's API)


class Finding(NamedTuple):
    """One finding of :func:`doctor`: what was checked, the verdict (``"ok"``, ``"warn"``,
    ``"no"``, ``"info"``), what was found, and what to do about it (empty when nothing)."""

    topic: str
    verdict: str
    detail: str
    fix: str


def doctor() -> List[Finding]:
    """What decides, on this machine, which path I/O takes (kernel, module, NVMe controllers,
    IOMMU, GPUs, PCIe topology, the NVIDIA driver's dma-buf support), as data."""
    return [Finding(**f) for f in _doctor()]


class Placement(NamedTuple):
    """One ugds node against one GPU (:func:`nearest`): the node, the GPU's and the SSD's PCI
    addresses, how close they are (``"same_switch"``, ``"same_root_complex"``,
    ``"same_numa_node"``, ``"cross_socket"``, best first), both NUMA nodes (``None`` where the
    platform reports none), and a warning when peer-to-peer between them crosses the
    inter-socket link (else ``None``)."""

    node: str
    gpu: str
    ssd: str
    proximity: str
    gpu_numa: Optional[int]
    ssd_numa: Optional[int]
    warning: Optional[str]


def _gpu_arg(gpu: Any) -> Any:
    """A CUDA ordinal, a PCI address or None, from what :func:`nearest` takes."""
    if gpu is None or isinstance(gpu, int):
        return gpu
    if isinstance(gpu, str):
        if gpu == "cuda":
            return None
        if gpu.startswith("cuda:"):
            return int(gpu[5:])
        if gpu == "cpu":
            raise ValueError("gpu: the CPU is not a GPU")
        return gpu
    dev = getattr(gpu, "device", None)  # a tensor or an array: its device
    if dev is not None:
        return _gpu_arg(dev)
    if getattr(gpu, "type", "cuda") != "cuda":
        raise ValueError(f"gpu: {gpu!r} is not a CUDA device")
    for attr in ("index", "id"):  # torch.device, cupy.cuda.Device
        if hasattr(gpu, attr):
            i = getattr(gpu, attr)
            return None if i is None else int(i)
    raise TypeError(f"gpu: expected a CUDA ordinal, a PCI address, a device or a tensor, got {gpu!r}")


def nearest(target: Optional[str] = None, gpu: Any = None, *, sys: Optional[str] = None) -> List[Placement]:
    """The ugds nodes that ``target`` names, nearest to one GPU first: ``target`` is a node
    (``/dev/ugds_drvN``), a striped volume (``stripe:[CHUNK:]NODE,...`` or a descriptor file
    ``NAME.ugds-volume``), or ``None`` for every controller bound to ugds here. ``gpu`` is the
    calling thread's GPU when ``None`` (its current CUDA device, as ``torch.cuda.set_device``
    or ``cudaSetDevice`` chose it), else a CUDA ordinal (``1``, ``"cuda:1"``), a
    ``torch.device``, a ``cupy.cuda.Device``, a tensor or array on the GPU, or a PCI address
    (``"0000:1b:00.0"``). ``sys`` reads another sysfs root (tests). Open the first entry's
    node for the I/O of that GPU; entries equally near keep the volume's order."""
    return [Placement(**p) for p in _nearest(target, _gpu_arg(gpu), sys)]


# Not `open`: `from ugds import *` must leave the builtin alone (`ugds.open` is the call).
__all__ = [
    "AsyncIo",
    "Batch",
    "Buffer",
    "CpuStream",
    "Finding",
    "Placement",
    "Storage",
    "__version__",
    "crc32",
    "cuda_available",
    "doctor",
    "errors",
    "nearest",
    "parse_size",
] + errors.__all__

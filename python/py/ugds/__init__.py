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

Every I/O and every wait releases the GIL. Errors are the classes of :mod:`ugds.errors`, with
the library's named fields (``InvalidArgument.arg``, ``NvmeError.status``, ...).

:mod:`ugds.kv` is a persistent key-value object store on the same targets, and
:mod:`ugds.lmcache` an LMCache L2 connector over it.
"""

from __future__ import annotations

from typing import List, NamedTuple

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
)
from ._ugds import doctor as _doctor
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


__all__ = [
    "AsyncIo",
    "Batch",
    "Buffer",
    "CpuStream",
    "Finding",
    "Storage",
    "__version__",
    "crc32",
    "cuda_available",
    "doctor",
    "errors",
    "open",
] + errors.__all__

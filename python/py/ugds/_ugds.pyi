"""Type stubs of the Rust extension ``ugds._ugds`` (re-exported by ``ugds``)."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Awaitable, Callable, Dict, Generator, Iterable, List, Optional, Tuple, Union

__version__: str

# What ``register`` (and every ``buf`` argument) takes: a torch tensor (CPU or CUDA, contiguous),
# a numpy / cupy array, an object with ``__dlpack__``, ``__cuda_array_interface__`` or the buffer
# protocol. Raw ``(ptr, nbytes)`` integers only through ``Storage.register_raw_unsafe``.
Registrable = Any
# A CUDA stream handle (``torch.cuda.current_stream().cuda_stream``), a torch or cupy stream
# object, or a ``CpuStream``.
StreamLike = Union[int, "CpuStream", Any]

def open(path: str, ns: int = 1) -> Storage:
    """A ugds node (``/dev/ugds_drvN``, namespace ``ns``) takes the direct path; a regular file or
    block device the fallback path. Raises ``NotUgdsNode`` (naming what the path is) for anything
    else, ``OpenError`` (naming the path) when it cannot be opened."""

def doctor() -> List[Dict[str, str]]:
    """The findings (``topic``, ``verdict``, ``detail``, ``fix``) as dicts; ``ugds.doctor()``
    wraps them into ``Finding`` tuples."""

def nearest(
    target: Optional[str] = None, gpu: Union[int, str, None] = None, sys: Optional[str] = None
) -> List[Dict[str, Any]]:
    """The nodes of ``target`` (none: every bound controller) against one GPU (a CUDA ordinal,
    a PCI address, or the calling thread's), nearest first, as dicts; ``ugds.nearest()`` wraps
    them into ``Placement`` tuples."""

def parse_size(s: str) -> int:
    """A size as the CLI takes it (``4096``, ``64K``, ``16M``, ``1G``: binary multiples), by the
    library's own parser; ``InvalidArgument('size')`` otherwise."""

def cuda_available() -> bool:
    """Whether the CUDA driver library can be loaded here."""

def crc32(data: Any, value: int = 0) -> int:
    """zlib's CRC-32 of a contiguous bytes-like object (continued from ``value``), without the
    GIL, SIMD where the CPU has it."""

class Storage:
    """Where I/O goes (cuFile's file handle). Offsets and sizes must be multiples of
    ``block_size``."""

    @property
    def path(self) -> str: ...
    @property
    def is_direct(self) -> bool: ...
    @property
    def bypasses_page_cache(self) -> bool: ...
    @property
    def capacity(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    def describe(self) -> str:
        """Which path I/O takes, and on what, in words."""
    def register(self, obj: Registrable, allow_fallback: bool = True) -> Buffer:
        """Registers memory for I/O on this storage (see ``Registrable``). The Buffer holds the
        object (or its buffer export) while registered; a torch tensor resized or ``set_()``
        since is refused at its next use (``RegisteredMemoryChanged``)."""
    def register_raw_unsafe(self, ptr: int, nbytes: int, allow_fallback: bool = True) -> Buffer:
        """Registers raw memory ``[ptr, ptr + nbytes)`` (device memory of whichever CUDA device
        holds it, when CUDA says so; else host). Unsafe: nothing holds it or notices when it moves; the caller keeps it
        allocated at that address until the buffer is deregistered and its I/O is over."""
    def alloc(self, nbytes: int) -> Buffer:
        """Allocates and registers page-aligned host memory."""
    def register_dmabuf(self, fd: int) -> Buffer:
        """Registers the whole dma-buf ``fd`` another driver exported (a device's BAR through
        vfio-pci, an accelerator's memory): only the SSD reaches it, peer-to-peer; the CPU never.
        ``PeerToPeerRefused`` where the kernel refuses the route; I/O raises ``Revoked`` once the
        exporter revoked it."""
    def read(self, buf: Union[Buffer, Registrable], file_offset: int, nbytes: int, buf_offset: int = 0) -> int:
        """Reads into ``buf``; returns the bytes read (fewer only at the end of a file)."""
    def write(self, buf: Union[Buffer, Registrable], file_offset: int, nbytes: int, buf_offset: int = 0) -> int:
        """Writes from ``buf``; returns the bytes written."""
    def read_bytes(self, file_offset: int, nbytes: int) -> bytes:
        """Reads into a host buffer of its own and returns the bytes."""
    def write_bytes(self, data: Any, file_offset: int) -> int:
        """Writes a bytes-like object (its length a multiple of ``block_size``)."""
    def read_async(
        self,
        buf: Union[Buffer, Registrable],
        file_offset: int,
        nbytes: int,
        buf_offset: int = 0,
        *,
        stream: StreamLike,
    ) -> AsyncIo:
        """Queues a read in ``stream``'s order; returns at once."""
    def write_async(
        self,
        buf: Union[Buffer, Registrable],
        file_offset: int,
        nbytes: int,
        buf_offset: int = 0,
        *,
        stream: StreamLike,
    ) -> AsyncIo:
        """Queues a write in ``stream``'s order; returns at once."""
    def pread(
        self,
        buf: Union[Buffer, Registrable],
        size: Optional[int] = None,
        file_offset: int = 0,
        task_size: Optional[int] = None,
        *,
        buf_offset: int = 0,
    ) -> AsyncIo:
        """kvikio's ``pread``: reads ``size`` bytes (None: the whole buffer) on the binding's I/O
        threads; returns at once (``get()`` waits). Bad arguments raise here. ``task_size`` is
        accepted and unused (one call is one I/O)."""
    def pwrite(
        self,
        buf: Union[Buffer, Registrable],
        size: Optional[int] = None,
        file_offset: int = 0,
        task_size: Optional[int] = None,
        *,
        buf_offset: int = 0,
    ) -> AsyncIo:
        """kvikio's ``pwrite`` (see ``pread``)."""
    def batch(self, capacity: int = 64) -> Batch: ...
    def flush(self) -> None: ...
    def path_counts(self) -> Dict[str, int]:
        """``{'direct_p2p': n, 'direct_host': n, 'direct_staged': n, 'fallback': n, 'remote': n, 'remote_staged': n, 'bytes': n}``
        since opening (``direct_staged``: GPU memory staged through host memory on the direct
        path)."""
    @property
    def closed(self) -> bool: ...
    def close(self) -> None:
        """Closes its batches (waiting for their entries), deregisters its buffers and lets go of
        its queues; later use raises ``Closed``. Closing twice does nothing."""
    def __enter__(self) -> Storage: ...
    def __exit__(self, *exc: Any) -> None:
        """``close()``."""

class Buffer:
    """Memory registered for one Storage."""

    @property
    def nbytes(self) -> int: ...
    @property
    def ptr(self) -> int: ...
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    @property
    def readonly(self) -> bool: ...
    @property
    def path(self) -> str:
        """The path I/O on it takes, in words."""
    def copy_in(self, data: Any, offset: int = 0) -> None: ...
    def copy_out(self, nbytes: Optional[int] = None, offset: int = 0) -> bytes: ...
    def copy_out_into(self, dst: Any, offset: int = 0) -> None:
        """Copies ``len(dst)`` bytes at ``offset`` into a writable contiguous bytes-like ``dst``."""
    def deregister(self) -> None:
        """Refused (RegistrationBusy) while I/O on it runs."""
    def __len__(self) -> int: ...
    def __enter__(self) -> Buffer: ...
    def __exit__(self, *exc: Any) -> None: ...

class Batch:
    """Up to ``capacity`` entries in flight; ``submit()`` hands every queued entry over at once
    (one doorbell on the direct path)."""

    def __init__(self, storage: Storage, capacity: int = 64) -> None: ...
    def read(
        self, buf: Union[Buffer, Registrable], file_offset: int, nbytes: int, buf_offset: int = 0
    ) -> concurrent.futures.Future[int]: ...
    def write(
        self, buf: Union[Buffer, Registrable], file_offset: int, nbytes: int, buf_offset: int = 0
    ) -> concurrent.futures.Future[int]: ...
    def submit(self) -> List[concurrent.futures.Future[int]]: ...
    def run(self, entries: Iterable[Tuple[Any, ...]]) -> List[int]:
        """Submits ``(op, buf, file_offset, nbytes[, buf_offset])`` entries (op ``"read"`` or
        ``"write"``) at once and waits for all; returns the bytes per entry or raises the first
        failed entry's error once all are over. No future per entry."""
    def submit_async(self) -> Awaitable[List[int]]: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def is_native(self) -> bool: ...
    def close(self) -> None:
        """Waits until every submitted entry's future is done."""
    def __enter__(self) -> Batch: ...
    def __exit__(self, *exc: Any) -> None: ...

class CpuStream:
    """A stream run by a thread of this process (stream-ordered I/O without a GPU)."""

    def __init__(self) -> None: ...
    def launch(self, fn: Any) -> None:
        """Queues ``fn()`` in stream order."""
    def synchronize(self) -> None: ...

class AsyncIo:
    """A queued operation (stream-ordered, or ``pread``/``pwrite``): awaitable, with a
    ``concurrent.futures.Future``'s methods, and a real ``concurrent.futures.Future`` through
    ``future()`` (what ``concurrent.futures.wait``/``as_completed`` need)."""

    def done(self) -> bool: ...
    def result(self, timeout: Optional[float] = None) -> int:
        """Waits for the bytes moved, or raises the operation's error (TimeoutError when
        ``timeout`` seconds pass first)."""
    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """Waits as ``result()`` does; None on success, else the exception ``result()`` raises."""
    def add_done_callback(self, fn: Callable[[AsyncIo], Any]) -> None:
        """Calls ``fn(self)`` once the operation has finished (at once when it has already)."""
    def cancel(self) -> bool:
        """False: queued I/O cannot be recalled."""
    def cancelled(self) -> bool: ...
    def running(self) -> bool:
        """``not done()``."""
    def get(self) -> int:
        """kvikio's name for ``result()``."""
    def future(self) -> concurrent.futures.Future[int]:
        """The same Future on every call, done when the operation is."""
    def __await__(self) -> Generator[Any, None, int]: ...


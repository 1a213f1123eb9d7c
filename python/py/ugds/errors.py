"""The exceptions of ugds: one class per kind of library error, each carrying the library's
named fields as attributes (``InvalidArgument.arg``, ``NvmeError.status``, ...).

Every class derives from :class:`Error`, and also from the builtin exception a Python caller
would expect (``ValueError`` for bad arguments, ``OSError`` for I/O failures, ``TimeoutError``
for deadlines), so ``except ValueError`` keeps working. ``errno`` is the positive errno the C
ABI reports for the same failure (``EINVAL``, ``EIO``, ...). ``str(e)`` is the library's message.
"""

from __future__ import annotations


class Error(Exception):
    """Base of every ugds error. ``errno``: the errno that stands for it; ``kind``: the library's
    name for the error (``"InvalidArgument"``, ``"Nvme"``, ...)."""

    errno: int = 0
    kind: str = ""


class InvalidArgument(Error, ValueError):
    """An argument was invalid; nothing was submitted. ``arg`` names the argument
    (``file_offset``, ``nbytes``, ``buf_offset``, ``buf``, ``capacity``, ...), ``reason`` says why."""

    arg: str
    reason: str


class NotUgdsNode(Error, ValueError):
    """A path given as a target is neither a ugds node nor a file or block device. ``path``,
    ``what`` it is, and the ``fix``."""

    path: str
    what: str
    fix: str


class OpenError(Error, OSError):
    """Opening ``path`` failed (``errno`` says why)."""

    path: str


class NvmeError(Error, OSError):
    """The controller completed a command with an error status. ``op`` ("read", "write", ...),
    ``slba`` (its starting LBA), ``status`` (the NVMe specification's name of the status, or
    ``None`` for a reserved code), ``status_type`` and ``status_code`` (SCT and SC), ``dnr``
    (do not retry)."""

    op: str
    slba: int
    status: str | None
    status_type: int
    status_code: int
    dnr: bool


class Timeout(Error, TimeoutError):
    """A command did not complete within ``timeout_ms`` (the controller was reset)."""

    op: str
    slba: int
    timeout_ms: int


class DeviceFaulted(Error, OSError):
    """The controller is faulted; it must be reset before further I/O."""


class EpochChanged(Error, OSError):
    """The controller was reset (epoch ``old`` -> ``new``); commands in flight were lost."""

    old: int
    new: int


class PeerToPeerRefused(Error, OSError):
    """The kernel allows no peer-to-peer DMA between the controller and the device whose memory
    the dma-buf holds (topology, ACS, host bridge); ``ugds doctor`` shows the route."""


class Revoked(Error, OSError):
    """The dma-buf's exporter revoked the memory (its device was reset, or the memory went
    away); deregister the buffer."""


class RegistrationBusy(Error, OSError):
    """The memory still has I/O in flight (``inflight`` operations)."""

    id: int
    inflight: int


class AbiMismatch(Error):
    """The kernel module speaks ABI ``kernel``, the library ``library``."""

    kernel: int
    library: int


class ControlError(Error, OSError):
    """A control call to the kernel module (``op``) failed."""

    op: str


class NoNamespace(Error, LookupError):
    """Namespace ``nsid`` does not exist on the controller."""

    nsid: int


class DeviceProtocol(Error):
    """The device returned something impossible (``detail`` says what)."""

    detail: str


class GpuError(Error):
    """A GPU runtime call ``op`` failed with ``reason``."""

    op: str
    reason: str


class Unsupported(Error):
    """``what`` is not possible on this machine: ``why``, and the ``fix``."""

    what: str
    why: str
    fix: str


class ForkedChild(Error, OSError):
    """The ``object`` ("storage", "buffer", "batch", "stream", ...) was made by the parent
    process before ``os.fork()``: its queues, rings and registrations are the parent's, and
    nothing was touched. Open the storage (and register memory) again in the child."""

    object: str


class RegisteredMemoryChanged(Error, ValueError):
    """A registered tensor or buffer no longer has the memory it was registered with (resized,
    ``set_()``, reallocated): ``what`` changed. Nothing was read or written; register it again."""

    what: str


class Closed(Error, ValueError):
    """The ``object`` (``"storage"``) at ``path`` was closed (``Storage.close()`` or the end of
    its ``with`` block), as Python's files raise ``ValueError`` once closed. Open it again."""

    object: str
    path: str


class StoreFull(Error, OSError):
    """``ugds.kv``: the store's ``what`` ("data region", "journal", "index") has no room for
    ``need`` bytes (``free`` left) and eviction is off (or cannot help)."""

    what: str
    need: int
    free: int


class IoError(Error, OSError):
    """A system call of the fallback path (or a stream-ordered operation) failed: ``op``."""

    op: str


__all__ = [
    "Error",
    "InvalidArgument",
    "NotUgdsNode",
    "OpenError",
    "NvmeError",
    "Timeout",
    "DeviceFaulted",
    "EpochChanged",
    "RegistrationBusy",
    "PeerToPeerRefused",
    "Revoked",
    "AbiMismatch",
    "ControlError",
    "NoNamespace",
    "DeviceProtocol",
    "GpuError",
    "Unsupported",
    "IoError",
    "ForkedChild",
    "RegisteredMemoryChanged",
    "Closed",
    "StoreFull",
]

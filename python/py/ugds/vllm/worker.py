"""The worker side: moves chunks between vLLM's KV cache tensors and the target.

The memory of the KV tensors is registered once with the storage (``Storage.register``:
peer-to-peer for GPU memory where the library says it works, else staged through host memory;
host tensors as host memory), one registration per allocation. A job becomes one list of extents (one per GPU block page and tensor, adjacent ones
merged) and that list one batch submit (one doorbell on the direct path) on its direction's own
``Batch``: stores, loads and expedited loads each have a thread, a batch (on the direct path its
own queue pair) and a queue of jobs, run in submission order. A GPU job first waits for the
work queued on the tensor's current CUDA stream when it was submitted (stores read what the model
wrote; loads must not race the zeroing of their blocks). A failed or short transfer is a failed
job (``TransferResult.success`` False, the error logged); nothing raises out of ``submit_*``,
``get_finished`` or ``wait``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from . import _api
from .config import ConfigError, LayoutError, Placement, Settings

log = logging.getLogger("ugds.vllm")

#: An extent: (file offset, tensor index, byte offset in the tensor, bytes).
Extent = Tuple[int, int, int, int]


@dataclass
class _Tensor:
    """One KV tensor as the worker sees it: ``num_blocks`` pages of ``page`` bytes,
    ``stride`` bytes apart, registered as ``buf``."""

    obj: Any
    num_blocks: int
    stride: int
    page: int
    cuda: bool
    buf: Any = None
    base: int = 0  # byte offset of block 0 in buf


def _describe(t: Any, page: int) -> _Tensor:
    """Block count, stride and memory of a torch tensor or a numpy array (block-major)."""
    if hasattr(t, "element_size") and hasattr(t, "stride"):  # torch
        elem = t.element_size()
        return _Tensor(t, int(t.shape[0]), int(t.stride(0)) * elem, page, bool(getattr(t, "is_cuda", False)))
    if hasattr(t, "__array_interface__") or hasattr(t, "strides"):  # numpy
        return _Tensor(t, int(t.shape[0]), int(t.strides[0]), page, False)
    raise LayoutError("tensor", f"a KV cache tensor of type {type(t).__name__} (expected a torch tensor)")


def _memory(t: _Tensor) -> Tuple[Any, Any, int]:
    """What to register for ``t``: (a key naming its allocation, the object to register, the
    byte offset of ``t``'s block 0 in it). A torch tensor registers its whole storage as one byte
    view, so tensors that share an allocation (vLLM's layers in one backing allocation, a packed
    layout whose blocks interleave layers) share one registration; without ``untyped_storage``
    (torch < 2) and for other arrays, the contiguous object itself."""
    o = t.obj
    if hasattr(o, "untyped_storage"):
        import torch  # noqa: PLC0415 (a torch tensor is here: torch is)

        st = o.untyped_storage()
        view = torch.empty(0, dtype=torch.uint8, device=o.device).set_(st, 0, (st.nbytes(),), (1,))
        return ("storage", str(o.device), st.data_ptr()), view, o.storage_offset() * o.element_size()
    contiguous = o.is_contiguous() if hasattr(o, "is_contiguous") else bool(o.flags["C_CONTIGUOUS"])
    if not contiguous:
        raise LayoutError("tensor", "a non-contiguous KV tensor needs torch >= 2 (Tensor.untyped_storage)")
    return ("object", id(o)), o, 0


@dataclass
class _Job:
    job_id: int
    extents: List[Extent]
    nbytes: int
    ready: Any  # a CUDA event to wait for, or None
    error: Optional[str] = None


class _Lane:
    """One direction: a thread running its jobs in order through its own batch."""

    def __init__(self, worker: "UgdsOffloadingWorker", name: str, write: bool):
        self.w = worker
        self.name = name
        self.op = "write" if write else "read"
        self.batch = worker.storage.batch(worker.settings.queue_depth) if worker.settings.queue_mode == "batch" else None
        self.jobs: "queue.Queue[Optional[_Job]]" = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name=f"ugds-vllm-{name}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            t0 = time.monotonic()
            ok = False
            try:
                if job.error is not None:
                    raise LayoutError("spec", job.error)
                if job.ready is not None:
                    job.ready.synchronize()
                moved = self._io(job.extents)
                ok = moved == job.nbytes
                if not ok:
                    log.error("ugds.vllm %s job %d: %d of %d bytes moved", self.name, job.job_id, moved, job.nbytes)
            except Exception as e:  # reported as a failed job, as vLLM's worker interface expects
                log.error("ugds.vllm %s job %d failed: %s: %s", self.name, job.job_id, type(e).__name__, e)
            self.w._finish(job.job_id, ok, job.nbytes if ok else 0, time.monotonic() - t0)

    def _io(self, extents: Sequence[Extent]) -> int:
        bufs = self.w._bufs
        if self.batch is None:
            rw = self.w.storage.write if self.op == "write" else self.w.storage.read
            return sum(rw(bufs[t], off, n, boff) for off, t, boff, n in extents)
        moved = 0
        depth = self.w.settings.queue_depth
        for i in range(0, len(extents), depth):
            part = extents[i : i + depth]
            got = self.batch.run([(self.op, bufs[t], off, n, boff) for off, t, boff, n in part])
            # A read is short only at the end of a file: count what each extent moved.
            moved += sum(min(g, e[3]) for g, e in zip(got, part))
        return moved

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join()
        if self.batch is not None:
            self.batch.close()


class UgdsOffloadingWorker(_api.OffloadingWorker):
    """Transfers for one vLLM worker (one rank); see the module comment. ``path`` is the path
    the library chose for the KV tensors (``"direct (peer-to-peer)"``, ``"fallback (io_uring +
    staging)"``, ...; several joined by ``"; "`` when tensors differ), ``paths`` one per tensor."""

    def __init__(
        self,
        kv_caches: Any,
        settings: Settings,
        placement: Placement,
        blocks_per_chunk: int,
        rank: int = 0,
        storage: Any = None,
    ):
        if any(ref.mapping is not None for refs in kv_caches.group_data_refs for ref in refs):
            raise LayoutError("canonical_layout", "the canonical host layout is not supported: leave it off")
        self.settings = settings
        self.placement = placement
        self.blocks_per_chunk = blocks_per_chunk
        self.rank = rank
        self.storage = storage if storage is not None else settings.open()
        self._own_storage = storage is None
        self._tensors = [_describe(k.tensor, int(k.page_size_bytes)) for k in kv_caches.tensors]
        self._refs = [[int(r.tensor_idx) for r in refs] for refs in kv_caches.group_data_refs]
        self._check_layout()
        # Where tensor t's pages start inside one rank's part of a slot.
        self._tensor_off: List[int] = []
        off = 0
        for t in self._tensors:
            self._tensor_off.append(off)
            off += t.page * blocks_per_chunk
        allow = settings.gpu_direct != "require"
        regs: Dict[Any, Any] = {}
        for t in self._tensors:
            k, obj, t.base = _memory(t)
            if k not in regs:
                regs[k] = self.storage.register(obj, allow_fallback=allow)
            t.buf = regs[k]
        self._regs = list(regs.values())
        self._bufs = [t.buf for t in self._tensors]
        if settings.gpu_direct == "require":
            # allow_fallback only governs a ugds node's choice; a file or a socket always
            # stages GPU memory through host memory.
            direct = ("direct (peer-to-peer)", "remote (NVMe over Fabrics, memory the transport reaches)")
            staged = [b.path for b in self._bufs if b.path not in direct]
            if staged:
                raise ConfigError("ugds_gpu_direct", f"'require', but the KV cache's path is {staged[0]}")
        #: Registrations made (one per allocation the KV tensors live in).
        self.registrations = len(self._regs)
        self.paths = [b.path for b in self._bufs]
        self.path = "; ".join(dict.fromkeys(self.paths))
        self._lock = threading.Condition()
        self._pending: Set[int] = set()
        self._finished: List[Any] = []
        self._closed = False
        self._lanes = {
            "store": _Lane(self, "store", write=True),
            "load": _Lane(self, "load", write=False),
            "expedited": _Lane(self, "expedited", write=False),
        }
        log.info(
            "ugds.vllm: rank %d on %s (%s): %d tensors, %d slots of %d bytes from offset %d, queue mode %s; path: %s",
            rank,
            settings.target,
            self.storage.describe(),
            len(self._tensors),
            placement.num_slots,
            placement.slot_bytes,
            placement.offset,
            settings.queue_mode,
            self.path,
        )

    def _check_layout(self) -> None:
        bs = self.storage.block_size
        if not self._tensors:
            raise LayoutError("tensors", "vLLM handed over no KV cache tensors")
        for i, t in enumerate(self._tensors):
            if t.page <= 0 or t.page % bs or t.stride % bs:
                raise LayoutError(
                    "page_size_bytes",
                    f"tensor {i}: pages of {t.page} bytes, {t.stride} apart, are not multiples of the target's "
                    f"{bs}-byte block size",
                )
            if t.stride < t.page:
                raise LayoutError("page_size_bytes", f"tensor {i}: pages of {t.page} bytes overlap ({t.stride} apart)")
        for g, refs in enumerate(self._refs):
            for r in refs:
                if not 0 <= r < len(self._tensors):
                    raise LayoutError("group_data_refs", f"group {g} names tensor {r} of {len(self._tensors)}")
        need = sum(t.page for t in self._tensors) * self.blocks_per_chunk
        if need > self.placement.rank_bytes:
            raise LayoutError(
                "worker_kv_bytes_per_block",
                f"one chunk of this worker's tensors is {need} bytes, more than the {self.placement.rank_bytes} "
                f"bytes per rank that the spec laid out (blocks_per_chunk={self.blocks_per_chunk})",
            )

    # -- planning

    def _extents(self, gpu: Any, slots_spec: Any) -> Tuple[List[Extent], int]:
        """The extents of a job between GPU blocks ``gpu`` (a GPULoadStoreSpec) and the slots of
        ``slots_spec``, adjacent ones merged, and their bytes."""
        bpc = self.blocks_per_chunk
        blocks = [int(b) for b in gpu.block_ids]
        slots = [int(s) for s in slots_spec.block_ids]
        group_sizes = list(gpu.group_sizes) if gpu.group_sizes is not None else [len(blocks)]
        block_indices = list(gpu.block_indices) if gpu.block_indices is not None else [0] * len(group_sizes)
        if len(group_sizes) != len(self._refs):
            raise ValueError(f"{len(group_sizes)} KV groups in the job, {len(self._refs)} registered")
        out: List[Extent] = []
        b0 = s0 = 0
        for g, (size, first) in enumerate(zip(group_sizes, block_indices)):
            if size == 0:
                continue
            skip = int(first) % bpc
            nslots = (size + skip + bpc - 1) // bpc
            gslots = slots[s0 : s0 + nslots]
            if len(gslots) != nslots:
                raise ValueError(f"group {g}: {size} blocks need {nslots} slots, the job has {len(gslots)}")
            for s in gslots:
                if not 0 <= s < self.placement.num_slots:
                    raise ValueError(f"slot {s} is outside the target's {self.placement.num_slots} slots")
            for ti in self._refs[g]:
                t = self._tensors[ti]
                for i, blk in enumerate(blocks[b0 : b0 + size]):
                    if not 0 <= blk < t.num_blocks:
                        raise ValueError(f"GPU block {blk} is outside tensor {ti}'s {t.num_blocks} blocks")
                    p = skip + i
                    off = self.placement.base(gslots[p // bpc], self.rank) + self._tensor_off[ti] + (p % bpc) * t.page
                    e = (off, ti, t.base + blk * t.stride, t.page)
                    last = out[-1] if out else None
                    if last and last[1] == ti and last[0] + last[3] == off and last[2] + last[3] == e[2]:
                        out[-1] = (last[0], ti, last[2], last[3] + t.page)
                    else:
                        out.append(e)
            b0 += size
            s0 += nslots
        if b0 != len(blocks) or s0 != len(slots):
            raise ValueError(f"the job names {len(blocks)} blocks and {len(slots)} slots, its groups {b0} and {s0}")
        return out, sum(e[3] for e in out)

    def _ready_event(self) -> Any:
        """A CUDA event after the work now queued on the tensors' current stream, or None."""
        cuda = [t for t in self._tensors if t.cuda]
        if not cuda:
            return None
        import torch  # noqa: PLC0415 (a CUDA tensor is here: torch is)

        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(cuda[0].obj.device))
        return ev

    def _submit(self, lane: str, job_id: int, gpu: Any, slots: Any) -> bool:
        with self._lock:
            if self._closed:
                log.error("ugds.vllm: job %d submitted after shutdown", job_id)
                return False
            self._pending.add(job_id)
        try:
            extents, n = self._extents(gpu, slots)
            job = _Job(job_id, extents, n, self._ready_event())
        except Exception as e:  # a bad job fails alone, reported through get_finished
            job = _Job(job_id, [], 0, None, error=f"{type(e).__name__}: {e}")
        self._lanes[lane].jobs.put(job)
        return True

    def _finish(self, job_id: int, ok: bool, nbytes: int, seconds: float) -> None:
        with self._lock:
            self._finished.append(
                _api.TransferResult(job_id=job_id, success=ok, transfer_size=nbytes, transfer_time=seconds)
            )
            self._pending.discard(job_id)
            self._lock.notify_all()

    # -- vLLM's OffloadingWorker interface

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        """GPU blocks ``src_spec`` to the slots of ``dst_spec``, asynchronously."""
        return self._submit("store", job_id, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False) -> bool:
        """The slots of ``src_spec`` into GPU blocks ``dst_spec``, asynchronously; ``expedited``
        loads have their own lane, so they never queue behind the others."""
        return self._submit("expedited" if expedited else "load", job_id, dst_spec, src_spec)

    def get_finished(self) -> List[Any]:
        """The results of the jobs finished since the last call."""
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def wait(self, job_ids: Set[int]) -> None:
        """Returns once none of ``job_ids`` is running (unknown ids are not waited for); their
        results stay for ``get_finished``."""
        ids = set(job_ids)
        with self._lock:
            while self._pending & ids:
                self._lock.wait()

    def shutdown(self) -> None:
        """Finishes the queued jobs, stops the lanes, deregisters the tensors (and closes the
        storage when the worker opened it). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for lane in self._lanes.values():
            lane.stop()
        for b in self._regs:
            b.deregister()
        if self._own_storage:
            self.storage.close()


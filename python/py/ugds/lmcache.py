"""``ugds.lmcache.UgdsConnector``: an LMCache L2 connector over :mod:`ugds.kv`.

LMCache (0.5.x, multiprocess mode) loads native L2 connectors named in its configuration::

    --l2-adapter '{"type": "native_plugin",
                   "module_path": "ugds.lmcache",
                   "class_name": "UgdsConnector",
                   "adapter_params": {"path": "/dev/ugds_drv0", "num_workers": 4}}'

and drives them through its ``NativeConnectorL2Adapter``, which expects (duck-typed)::

    event_fd() -> int                           # readable when completions are waiting
    submit_batch_set(keys, memviews) -> int     # a future id
    submit_batch_get(keys, memviews) -> int
    submit_batch_exists(keys) -> int
    submit_batch_delete(keys) -> int
    drain_completions() -> [(future_id, ok, error, results)]
    close()

Results per operation: set: ``ok`` = every key stored; get: ``results[i]`` = the value was
found, verified and exactly ``len(memviews[i])`` bytes (then copied into it); exists:
``results[i]`` = stored; delete: ``results[i]`` = was stored and is deleted. One completion and
one eventfd signal per batch. Each batch is one ``ugds.kv`` call: one batch of I/O (one doorbell
on the direct path) and one journal record.

``adapter_params``: ``path`` (a ugds node, block device or file; required), ``capacity`` (bytes
to use; a file is created or grown to it when given), ``eviction`` (``"lru"``/``"error"``),
``durable`` (flush per batch; default true), ``num_workers`` (threads running batches; default 4: gets of
several batches run at once, sets one at a time).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Deque, List, Optional, Tuple

from . import kv

Completion = Tuple[int, bool, str, Optional[List[bool]]]


class _EventFd:
    """An eventfd (a pipe where the platform has none): notify() makes it readable, consume()
    clears it."""

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            self.r = self.w = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # Python 3.9
            self.r, self.w = os.pipe()
            os.set_blocking(self.r, False)

    def notify(self) -> None:
        os.write(self.w, (1).to_bytes(8, "little"))

    def consume(self) -> None:
        try:
            while os.read(self.r, 4096):
                if self.r == self.w:
                    break
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.r)
        if self.w != self.r:
            os.close(self.w)


class UgdsConnector:
    """The connector (see the module comment)."""

    def __init__(
        self,
        path: str,
        capacity: Optional[int] = None,
        eviction: str = "lru",
        durable: bool = True,
        num_workers: int = 4,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise TypeError(f"UgdsConnector: unknown adapter_params {sorted(unknown)}")
        if capacity is not None and not path.startswith("/dev/"):
            if not os.path.exists(path) or os.path.getsize(path) < capacity:
                with open(path, "ab") as f:
                    f.truncate(capacity)
        self.store = kv.Store(path, eviction=eviction, durable=durable, capacity=capacity)
        self._pool = ThreadPoolExecutor(max_workers=max(1, num_workers), thread_name_prefix="ugds-lmcache")
        self._efd = _EventFd()
        self._lock = threading.Lock()
        self._next = 0
        self._done: Deque[Completion] = deque()
        self._closed = False

    def event_fd(self) -> int:
        """The fd that becomes readable when ``drain_completions`` has something."""
        return self._efd.r

    def _submit(self, fn, *args: Any) -> int:
        with self._lock:
            if self._closed:
                raise RuntimeError("UgdsConnector is closed")
            fid = self._next
            self._next += 1

        def run() -> None:
            try:
                ok, err, res = fn(*args)
            except Exception as e:  # reported in the completion, as LMCache expects
                ok, err, res = False, f"{type(e).__name__}: {e}", None
            with self._lock:
                self._done.append((fid, ok, err, res))
            self._efd.notify()

        self._pool.submit(run)
        return fid

    def submit_batch_set(self, keys: List[str], memviews: List[Any]) -> int:
        def run(keys, views):
            self.store.set_many(zip(keys, views))
            return True, "", [True] * len(keys)

        return self._submit(run, list(keys), list(memviews))

    def submit_batch_get(self, keys: List[str], memviews: List[Any]) -> int:
        def run(keys, views):
            return True, "", self.store.get_many_into(keys, views)

        return self._submit(run, list(keys), list(memviews))

    def submit_batch_exists(self, keys: List[str]) -> int:
        return self._submit(lambda k: (True, "", self.store.exists_many(k)), list(keys))

    def submit_batch_delete(self, keys: List[str]) -> int:
        return self._submit(lambda k: (True, "", self.store.delete_many(k)), list(keys))

    def drain_completions(self) -> List[Completion]:
        """Every finished batch since the last call; clears the eventfd first, so a batch that
        finishes meanwhile signals again rather than being missed."""
        self._efd.consume()
        with self._lock:
            out = list(self._done)
            self._done.clear()
        return out

    def close(self) -> None:
        """Finishes running batches, checkpoints the store, closes the eventfd. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True)
        self.store.close()
        self._efd.close()


__all__ = ["UgdsConnector"]

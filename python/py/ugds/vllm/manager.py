"""The scheduler side: which chunk (an ``OffloadKey``) is in which slot of the target.

``UgdsOffloadingManager`` follows the contract of vLLM's ``OffloadingManager``: a key is
pending from ``prepare_store`` until ``complete_store`` (``lookup`` says ``HIT_PENDING``, it
cannot be loaded or evicted), then ready (``HIT``); ``prepare_load`` pins it until
``complete_load``; ``prepare_store`` evicts the least recently used ready, unpinned keys that
are not among its own keys, or returns ``None`` and changes nothing when that is not enough;
``complete_store(success=False)`` frees the pending slots. Recency: stores and ``touch`` (the
first key of a ``touch`` becomes the most recent, as in vLLM's LRU policy).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Collection, Iterable, List, Optional

from . import _api


class UgdsLoadStoreSpec(_api.BlockIDsLoadStoreSpec):
    """Chunks on a ugds target by slot number (``block_ids``, as vLLM's CPU spec names them);
    the worker maps a slot to byte offsets with its :class:`~ugds.vllm.config.Placement`."""

    medium = "UGDS"

    @property
    def slots(self) -> List[int]:
        return [int(b) for b in self.block_ids]


class _Entry:
    __slots__ = ("slot", "ref")

    def __init__(self, slot: int):
        self.slot = slot
        self.ref = -1  # -1: being stored; 0: ready and evictable; > 0: being loaded


class UgdsOffloadingManager(_api.OffloadingManager):
    """Slot bookkeeping for ``num_slots`` chunks with LRU eviction (see the module comment)."""

    def __init__(self, num_slots: int, enable_events: bool = False):
        self.medium = _api.Medium.STORAGE
        self.num_slots = num_slots
        self._entries: "OrderedDict[bytes, _Entry]" = OrderedDict()  # least recent first
        self._free: List[int] = list(range(num_slots - 1, -1, -1))
        self._events: Optional[list] = [] if enable_events else None

    # -- lookups and loads

    def lookup(self, key: Any, req_context: Any) -> Any:
        e = self._entries.get(key)
        if e is None:
            return _api.LookupResult.MISS
        return _api.LookupResult.HIT if e.ref >= 0 else _api.LookupResult.HIT_PENDING

    def get_load_source(self, key: Any, req_context: Any) -> Any:
        return _api.LOAD_SOURCE

    def prepare_load(self, keys: Collection[Any], req_context: Any) -> UgdsLoadStoreSpec:
        slots = []
        for k in keys:
            e = self._entries.get(k)
            assert e is not None, f"chunk {k!r} is not offloaded"
            assert e.ref >= 0, f"chunk {k!r} is still being stored"
            e.ref += 1
            slots.append(e.slot)
        return UgdsLoadStoreSpec(slots)

    def touch(self, keys: Collection[Any], req_context: Any) -> None:
        for k in reversed(list(keys)):
            if k in self._entries:
                self._entries.move_to_end(k)

    def complete_load(self, keys: Collection[Any], req_context: Any) -> None:
        for k in keys:
            e = self._entries.get(k)
            assert e is not None and e.ref > 0, f"chunk {k!r} was not being loaded"
            e.ref -= 1

    # -- stores

    def prepare_store(self, keys: Collection[Any], req_context: Any) -> Optional[Any]:
        keys = list(keys)
        new = [k for k in dict.fromkeys(keys) if k not in self._entries]
        need = len(new) - len(self._free)
        evicted: List[Any] = []
        if need > 0:
            protected = set(keys)
            for k, e in self._entries.items():  # least recent first
                if len(evicted) == need:
                    break
                if e.ref == 0 and k not in protected:
                    evicted.append(k)
            if len(evicted) < need:
                return None
            for k in evicted:
                self._free.append(self._entries.pop(k).slot)
            if self._events is not None:
                self._events.append(_api.OffloadingEvent(keys=evicted, medium=self.medium, removed=True))
        slots = []
        for k in new:
            e = _Entry(self._free.pop())
            self._entries[k] = e
            slots.append(e.slot)
        return _api.PrepareStoreOutput(keys_to_store=new, store_spec=UgdsLoadStoreSpec(slots), evicted_keys=evicted)

    def complete_store(self, keys: Collection[Any], req_context: Any, success: bool = True) -> None:
        done, removed = [], []
        for k in keys:
            e = self._entries.get(k)
            if e is None or e.ref >= 0:
                continue
            if success:
                e.ref = 0
                self._entries.move_to_end(k)
                done.append(k)
            else:
                del self._entries[k]
                self._free.append(e.slot)
                removed.append(k)
        if self._events is not None:
            if removed:
                self._events.append(
                    _api.OffloadingEvent(keys=removed, medium=self.medium, removed=True, metadata_only=True)
                )
            if done:
                self._events.append(_api.OffloadingEvent(keys=done, medium=self.medium, removed=False))

    # -- the rest of the interface

    def on_new_request(self, req_context: Any) -> Any:
        return _api.RequestOffloadingContext()

    def take_events(self) -> Iterable[Any]:
        if self._events is None:
            return ()
        out, self._events = self._events, []
        return out

    def reset_cache(self) -> None:
        self._entries.clear()
        self._free = list(range(self.num_slots - 1, -1, -1))

    def config_info(self) -> Any:
        return [{}]

    @property
    def num_free(self) -> int:
        """Slots not holding a chunk."""
        return len(self._free)

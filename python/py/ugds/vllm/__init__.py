"""``ugds.vllm``: a vLLM KV offloading backend (an ``OffloadingSpec``) over a ugds target.

vLLM's ``OffloadingConnector`` loads it by name (``spec_name`` is not one vLLM registers, so its
factory imports ``spec_module_path`` and takes the class from it)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "UgdsOffloadingSpec", "spec_module_path": "ugds.vllm",
                                    "ugds_target": "/dev/ugds_drv0", "block_size": 256}}'

The scheduler side (:class:`UgdsOffloadingManager`) keeps which chunk is in which slot of the
target, with LRU eviction; the worker side (:class:`UgdsOffloadingWorker`) moves each job's
blocks between vLLM's KV cache tensors and the target as one batch submit, stores and loads on
queues of their own, GPU memory peer-to-peer where the library says it works and staged through
host memory otherwise (``worker.path`` says which; it is logged on ``logging.getLogger("ugds.vllm")``).
Settings: :mod:`ugds.vllm.config`.

vLLM is not needed to import this module: where ``vllm.v1.kv_offload`` cannot be imported (or
``UGDS_VLLM_SHIM=1``), the classes derive from stand-ins with vLLM's names and fields
(:mod:`ugds.vllm._shim`, re-exported here), so the worker and manager run on a GPU machine
without vLLM. ``VLLM`` says which base classes are in use. ``import ugds`` never imports this.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from . import _api
from ._api import (
    VLLM,
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
    ReqContext,
)
from .config import ConfigError, LayoutError, Placement, Settings
from .manager import UgdsLoadStoreSpec, UgdsOffloadingManager
from .worker import UgdsOffloadingWorker

log = logging.getLogger("ugds.vllm")


class UgdsOffloadingSpec(_api.OffloadingSpec):
    """The spec vLLM's factory makes from ``OffloadingConfig`` (its ``extra_config`` is
    ``kv_connector_extra_config``). Construction checks the settings and opens the target
    once to size it: a bad setting raises :class:`ConfigError` naming the key."""

    def __init__(self, config: Any):
        super().__init__(config)
        self.settings = Settings.parse(self.extra_config)
        if getattr(config, "canonical_layout", False):
            raise LayoutError("canonical_layout", "the canonical host layout is not supported: leave it off")
        par = config.parallel
        with self.settings.open() as st:
            capacity = st.capacity
        self.placement = Placement.plan(
            self.settings,
            capacity,
            int(config.worker_kv_bytes_per_block),
            int(self.blocks_per_chunk),
            int(par.world_size),
        )
        self.rank = int(par.rank)
        self._manager: Optional[UgdsOffloadingManager] = None
        self._worker: Optional[UgdsOffloadingWorker] = None
        log.info(
            "ugds.vllm: %s, %d slots of %d bytes (%d blocks per chunk, %d ranks)",
            self.settings.target,
            self.placement.num_slots,
            self.placement.slot_bytes,
            self.blocks_per_chunk,
            self.placement.world_size,
        )

    def get_manager(self) -> UgdsOffloadingManager:
        if self._manager is None:
            self._manager = UgdsOffloadingManager(
                self.placement.num_slots, enable_events=self.kv_events_config.enable_kv_cache_events
            )
        return self._manager

    def get_worker(self, kv_caches: Any) -> UgdsOffloadingWorker:
        if self._worker is None:
            self._worker = UgdsOffloadingWorker(
                kv_caches, self.settings, self.placement, int(self.blocks_per_chunk), rank=self.rank
            )
        return self._worker


__all__ = [
    "VLLM",
    "CanonicalKVCacheRef",
    "CanonicalKVCacheTensor",
    "CanonicalKVCaches",
    "ConfigError",
    "GPULoadStoreSpec",
    "LayoutError",
    "OffloadingCacheConfig",
    "OffloadingConfig",
    "OffloadingGroupConfig",
    "OffloadingModelConfig",
    "OffloadingParallelConfig",
    "Placement",
    "ReqContext",
    "Settings",
    "UgdsLoadStoreSpec",
    "UgdsOffloadingManager",
    "UgdsOffloadingSpec",
    "UgdsOffloadingWorker",
]

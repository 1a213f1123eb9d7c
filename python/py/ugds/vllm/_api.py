"""The vLLM classes the offloading spec builds on: vLLM's own when ``vllm.v1.kv_offload`` can be
imported, else the stand-ins of :mod:`ugds.vllm._shim` (same names and fields). ``VLLM`` says
which; ``UGDS_VLLM_SHIM=1`` picks the stand-ins even where vLLM is installed."""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("ugds.vllm")


def _load() -> "tuple[Any, Any, Any, bool]":
    if os.environ.get("UGDS_VLLM_SHIM") != "1":
        try:
            from vllm.v1.kv_offload import base, config  # noqa: PLC0415 (only when used)
            from vllm.v1.metrics.cache_hit_source import CacheHitSource  # noqa: PLC0415
        except ImportError as e:
            log.debug("vLLM's offloading classes cannot be imported (%s): using ugds.vllm's stand-ins", e)
        else:
            return base, config, CacheHitSource.DISK, True
    from . import _shim  # noqa: PLC0415

    return _shim, _shim, "disk", False


_base, _config, LOAD_SOURCE, VLLM = _load()

BlockIDsLoadStoreSpec = _base.BlockIDsLoadStoreSpec
CanonicalKVCacheRef = _base.CanonicalKVCacheRef
CanonicalKVCacheTensor = _base.CanonicalKVCacheTensor
CanonicalKVCaches = _base.CanonicalKVCaches
GPULoadStoreSpec = _base.GPULoadStoreSpec
LoadStoreSpec = _base.LoadStoreSpec
LookupResult = _base.LookupResult
Medium = _base.Medium
OffloadingEvent = _base.OffloadingEvent
OffloadingManager = _base.OffloadingManager
OffloadingSpec = _base.OffloadingSpec
OffloadingWorker = _base.OffloadingWorker
PrepareStoreOutput = _base.PrepareStoreOutput
ReqContext = _base.ReqContext
RequestOffloadingContext = _base.RequestOffloadingContext
TransferResult = _base.TransferResult

OffloadingCacheConfig = _config.OffloadingCacheConfig
OffloadingConfig = _config.OffloadingConfig
OffloadingGroupConfig = _config.OffloadingGroupConfig
OffloadingModelConfig = _config.OffloadingModelConfig
OffloadingParallelConfig = _config.OffloadingParallelConfig

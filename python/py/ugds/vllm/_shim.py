"""Stand-ins for the vLLM classes that :mod:`ugds.vllm` builds on, used where vLLM cannot be
imported (a GPU machine without vLLM, or ``UGDS_VLLM_SHIM=1``).

They carry vLLM 0.33's names, fields and defaults (``vllm/v1/kv_offload/base.py`` and
``config.py``), so the spec, manager and worker run unchanged on them and a script can build the
objects vLLM would hand over (``OffloadingConfig``, ``CanonicalKVCaches``, ``GPULoadStoreSpec``).
Only what the offloading spec touches is here; nothing of vLLM's own behaviour is.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple


class Medium(Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


class LookupResult(Enum):
    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()


class LoadStoreSpec:
    """Where a worker finds blocks to load or store."""


class BlockIDsLoadStoreSpec(LoadStoreSpec):
    """Blocks by number (vLLM keeps them in a numpy int32 array; a list here)."""

    def __init__(self, block_ids: Sequence[int]):
        self.block_ids = [int(b) for b in block_ids]

    def __repr__(self) -> str:
        return repr(self.block_ids)


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """GPU block numbers, grouped per KV cache group; ``block_indices[g]``: the logical index
    of group ``g``'s first block in its request."""

    def __init__(self, block_ids: Sequence[int], group_sizes: Sequence[int], block_indices: Sequence[int]):
        super().__init__(block_ids)
        assert sum(group_sizes) == len(self.block_ids)
        assert len(block_indices) == len(group_sizes)
        self.group_sizes = group_sizes
        self.block_indices = block_indices


@dataclass
class PrepareStoreOutput:
    keys_to_store: list
    store_spec: LoadStoreSpec
    evicted_keys: list


@dataclass
class OffloadingEvent:
    keys: list
    medium: Medium
    removed: bool
    locality: Any = None
    ownership: Optional[str] = None
    removal_expected: bool = False
    metadata_only: bool = False


@dataclass
class RequestOffloadingContext:
    policy: str = "chunk_level"


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Optional[Dict[str, Any]] = None


@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: Optional[int] = None
    transfer_time: Optional[float] = None


@dataclass
class CanonicalKVCacheTensor:
    tensor: Any
    page_size_bytes: int


@dataclass
class CanonicalKVCacheRef:
    tensor_idx: int
    page_size_bytes: int
    mapping: Any = None


@dataclass
class CanonicalKVCaches:
    tensors: List[CanonicalKVCacheTensor]
    group_data_refs: List[List[CanonicalKVCacheRef]]


@dataclass(frozen=True)
class OffloadingGroupConfig:
    tokens_per_block: int
    layer_names: Tuple[str, ...]
    group_id: int
    sliding_window_size_in_chunks: Optional[int] = None


@dataclass(frozen=True)
class OffloadingModelConfig:
    name: str
    dtype: str
    max_model_len: int = 0


@dataclass(frozen=True)
class OffloadingCacheConfig:
    tokens_per_hash: int
    blocks_per_chunk: int


@dataclass(frozen=True)
class OffloadingParallelConfig:
    rank: int
    world_size: int
    tp_size: int
    pp_size: int
    pcp_size: int
    dcp_size: int
    data_parallel_index: int
    data_parallel_size: int
    data_parallel_rank_local: Optional[int]
    is_parallelism_agnostic: bool


@dataclass(frozen=True)
class OffloadingConfig:
    groups: Tuple[OffloadingGroupConfig, ...]
    worker_kv_bytes_per_block: int
    enable_kv_cache_events: bool
    extra_config: Mapping[str, Any]
    engine_id: str
    model: OffloadingModelConfig
    cache: OffloadingCacheConfig
    parallel: OffloadingParallelConfig
    replicated_layout: bool = False
    canonical_layout: bool = False
    kv_cache_layout: Optional[str] = None


@dataclass(frozen=True)
class OffloadingKVEventsConfig:
    enable_kv_cache_events: bool
    self_describing_kv_events: bool


class OffloadingManager(ABC):
    """The scheduler side: which blocks are offloaded where (vLLM's defaults for the optional
    methods)."""

    @property
    def lock(self) -> Any:
        return contextlib.nullcontext()

    @abstractmethod
    def lookup(self, key: bytes, req_context: Any) -> LookupResult: ...

    def get_load_source(self, key: bytes, req_context: Any) -> Any:
        return "disk"

    @abstractmethod
    def prepare_load(self, keys: Any, req_context: Any) -> LoadStoreSpec: ...

    def touch(self, keys: Any, req_context: Any) -> None:
        return

    def complete_load(self, keys: Any, req_context: Any) -> None:
        return

    @abstractmethod
    def prepare_store(self, keys: Any, req_context: Any) -> Optional[PrepareStoreOutput]: ...

    def complete_store(self, keys: Any, req_context: Any, success: bool = True) -> None:
        return

    @abstractmethod
    def on_new_request(self, req_context: Any) -> RequestOffloadingContext: ...

    def on_request_finished(self, req_context: Any) -> None:
        return

    def take_events(self) -> Any:
        return ()

    def on_schedule_end(self, context: Any) -> None:
        return

    def has_pending_work(self) -> bool:
        return False

    def reset_cache(self) -> None:
        return

    def on_reset_flushed(self) -> None:
        return

    def get_stats(self) -> Any:
        return None

    def config_info(self) -> Sequence[Mapping[str, Any]]:
        return [{}]

    def shutdown(self) -> None:
        return


class OffloadingWorker(ABC):
    """The worker side: asynchronous transfers for one medium."""

    @abstractmethod
    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool: ...

    @abstractmethod
    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec, expedited: bool = False
    ) -> bool: ...

    @abstractmethod
    def get_finished(self) -> List[TransferResult]: ...

    @abstractmethod
    def wait(self, job_ids: set) -> None: ...

    def shutdown(self) -> None:
        return


class OffloadingSpec(ABC):
    """vLLM's spec base: the attributes its ``__init__`` sets from the config."""

    @classmethod
    def build_metric_definitions(cls, extra_config: Dict[str, Any]) -> Dict[str, Any]:
        return {}

    @classmethod
    def config_info_keys(cls, extra_config: Dict[str, Any]) -> Tuple[str, ...]:
        return ()

    def __init__(self, config: Any):
        self.config = config
        self.extra_config = config.extra_config
        self.replicated_layout = False
        self.kv_events_config = OffloadingKVEventsConfig(
            enable_kv_cache_events=config.enable_kv_cache_events,
            self_describing_kv_events=bool(self.extra_config.get("self_describing_kv_events", False)),
        )
        self.offload_prompt_only = bool(self.extra_config.get("offload_prompt_only", True))
        self.tokens_per_block = tuple(g.tokens_per_block for g in config.groups)
        self.tokens_per_hash = config.cache.tokens_per_hash
        self.blocks_per_chunk = config.cache.blocks_per_chunk

    @abstractmethod
    def get_manager(self) -> OffloadingManager: ...

    @abstractmethod
    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker: ...



"""The spec's settings from ``kv_connector_extra_config``, and where each chunk lives on the target.

Keys read here (every other ``ugds_*`` key is refused; keys without the prefix are vLLM's):

==================  =========================================================================
``ugds_target``     required: what ``ugds.open`` opens (a ``/dev/ugds_drvN`` node, a file, a
                    block device, a striped volume, a remote URI)
``ugds_capacity``   bytes of the target to use from ``ugds_offset`` (an int or ``"64G"``);
                    default: to the end of the target. A file that is missing or smaller is
                    created or grown to ``ugds_offset + ugds_capacity``
``ugds_offset``     first byte used (a multiple of 4096; default 0)
``ugds_queue_mode`` ``"batch"`` (default: each job is one batch submit on its direction's own
                    queue, one doorbell on the direct path) or ``"sync"`` (one synchronous call
                    per extent, on the same threads)
``ugds_queue_depth`` entries one batch submit holds (default 1024); a job with more extents
                    is submitted in several
``ugds_gpu_direct`` ``"auto"`` (default: peer-to-peer where the library says it works, else
                    staged through host memory) or ``"require"`` (registration fails when
                    peer-to-peer is impossible)
==================  =========================================================================

The chunk size is vLLM's own: ``block_size`` (tokens) or ``blocks_per_chunk`` in the same
``kv_connector_extra_config``, which reach the spec as ``config.cache.blocks_per_chunk``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import ugds

#: Every offset and length of the layout is a multiple of this (covers 512- and 4096-byte blocks).
ALIGN = 4096

KEYS = ("ugds_target", "ugds_capacity", "ugds_offset", "ugds_queue_mode", "ugds_queue_depth", "ugds_gpu_direct")


class ConfigError(ValueError):
    """A bad ``kv_connector_extra_config`` (or what it names): ``key`` names the setting,
    ``reason`` says what is wrong."""

    def __init__(self, key: str, reason: str):
        self.key = key
        self.reason = reason
        super().__init__(f"ugds.vllm: kv_connector_extra_config[{key!r}]: {reason}")


class LayoutError(ConfigError):
    """vLLM's KV cache tensors do not fit the spec's chunk layout (``key`` names what differs:
    ``page_size_bytes``, ``worker_kv_bytes_per_block``, ``canonical_layout``, ...)."""


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _size(extra: Mapping[str, Any], key: str, default: Optional[int]) -> Optional[int]:
    v = extra.get(key)
    if v is None:
        return default
    try:
        n = ugds.parse_size(v) if isinstance(v, str) else int(v)
    except (ValueError, TypeError) as e:
        raise ConfigError(key, f"{v!r} is not a size ({e})") from None
    if n < 0:
        raise ConfigError(key, f"{v!r} is negative")
    return n


@dataclass(frozen=True)
class Settings:
    """The parsed ``ugds_*`` keys."""

    target: str
    capacity: Optional[int]
    offset: int
    queue_mode: str
    queue_depth: int
    gpu_direct: str

    @classmethod
    def parse(cls, extra: Mapping[str, Any]) -> "Settings":
        unknown = sorted(k for k in extra if str(k).startswith("ugds_") and k not in KEYS)
        if unknown:
            raise ConfigError(unknown[0], f"unknown key (known: {', '.join(KEYS)})")
        target = extra.get("ugds_target")
        if not target or not isinstance(target, str):
            raise ConfigError(
                "ugds_target", "missing: name a ugds node, a file, a block device, a volume or a remote URI"
            )
        offset = _size(extra, "ugds_offset", 0) or 0
        if offset % ALIGN:
            raise ConfigError("ugds_offset", f"{offset} is not a multiple of {ALIGN}")
        capacity = _size(extra, "ugds_capacity", None)
        mode = extra.get("ugds_queue_mode", "batch")
        if mode not in ("batch", "sync"):
            raise ConfigError("ugds_queue_mode", f"{mode!r}: expected 'batch' or 'sync'")
        depth = _size(extra, "ugds_queue_depth", 1024) or 0
        if not 1 <= depth <= 65536:
            raise ConfigError("ugds_queue_depth", f"{depth}: expected 1 to 65536")
        direct = extra.get("ugds_gpu_direct", "auto")
        if direct not in ("auto", "require"):
            raise ConfigError("ugds_gpu_direct", f"{direct!r}: expected 'auto' or 'require'")
        return cls(target, capacity, offset, mode, depth, direct)

    def open(self) -> "ugds.Storage":
        """Opens the target; a regular file (or a missing one, when ``ugds_capacity`` is set) is
        first grown to ``ugds_offset + ugds_capacity``."""
        if self.capacity is not None and _is_file_path(self.target):
            want = self.offset + self.capacity
            if not os.path.exists(self.target) or os.path.getsize(self.target) < want:
                with open(self.target, "ab") as f:
                    f.truncate(want)
        try:
            return ugds.open(self.target)
        except (ugds.OpenError, ugds.NotUgdsNode) as e:
            raise ConfigError("ugds_target", f"{self.target!r} cannot be opened: {e}") from e


def _is_file_path(target: str) -> bool:
    if "://" in target or target.startswith("stripe:") or target.endswith(".ugds-volume"):
        return False
    try:
        return stat.S_ISREG(os.stat(target).st_mode)
    except FileNotFoundError:
        return not target.startswith("/dev/")


@dataclass(frozen=True)
class Placement:
    """Where chunk slot ``s`` of rank ``r`` lives: ``offset + s * slot_bytes + r * rank_bytes``.
    A slot holds one chunk (``blocks_per_chunk`` GPU blocks of every KV tensor) of every rank;
    inside one rank's part, tensor ``t``'s pages follow the tensors before it, each
    ``blocks_per_chunk`` pages long."""

    offset: int
    rank_bytes: int
    world_size: int
    num_slots: int

    @property
    def slot_bytes(self) -> int:
        return self.rank_bytes * self.world_size

    def base(self, slot: int, rank: int) -> int:
        return self.offset + slot * self.slot_bytes + rank * self.rank_bytes

    @classmethod
    def plan(cls, s: Settings, target_capacity: int, kv_bytes_per_block: int, blocks_per_chunk: int, world_size: int) -> "Placement":
        if kv_bytes_per_block <= 0:
            raise LayoutError("worker_kv_bytes_per_block", "vLLM reported no KV bytes per block")
        rank_bytes = _round_up(kv_bytes_per_block * blocks_per_chunk, ALIGN)
        slot = rank_bytes * max(1, world_size)
        if s.offset >= target_capacity:
            raise ConfigError("ugds_offset", f"{s.offset} is past the target's end ({target_capacity} bytes)")
        usable = target_capacity - s.offset if s.capacity is None else s.capacity
        if s.offset + usable > target_capacity:
            raise ConfigError(
                "ugds_capacity",
                f"{usable} bytes from offset {s.offset} do not fit the target's {target_capacity} bytes",
            )
        n = usable // slot
        if n < 1:
            raise ConfigError(
                "ugds_capacity",
                f"{usable} bytes are too small for one chunk of {slot} bytes "
                f"({blocks_per_chunk} blocks x {kv_bytes_per_block} bytes x {world_size} ranks)",
            )
        return cls(s.offset, rank_bytes, max(1, world_size), n)

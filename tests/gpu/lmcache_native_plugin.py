"""LMCache itself loading ``ugds.lmcache.UgdsConnector`` through its native-plugin L2 adapter.

Run on the GPU machine by ``target/gpu-lmc/run.sh`` (LMCache 0.5.6's wheel and the pure-Python
packages it imports are brought there and installed with ``pip --no-deps``; see
docs/python.md). Usage: ``python3 lmcache_native_plugin.py DIR [MiB per round] [rounds]``.

1. Functional: the adapter is made the way LMCache's multiprocess server makes it, from the
   ``--l2-adapter`` JSON (``parse_args_to_l2_adapters_config`` then ``create_l2_adapter``): the
   code in ``native_plugin_l2_adapter.py`` imports ``ugds.lmcache``, instantiates
   ``UgdsConnector(**adapter_params)`` and wraps it in ``NativeConnectorL2Adapter``. KV chunks
   made on the GPU (CUDA tensors) are copied into L1 objects (``TensorMemoryObj`` over pinned
   host memory, as LMCache's L1 holds them), stored through ``submit_store_task``, looked up,
   loaded into other L1 objects, copied back to the GPU and compared; a missing key, delete,
   and a restart (a new adapter on the same store finds the chunks) are checked.
2. Throughput, set (store) and get (load) of 256 KiB to 16 MiB objects, all submitted at once
   in batches of 8 and waited for through the adapter's event fds: ugds vs LMCache's own
   file-system L2 adapters on the same disk (``fs_native``, its C++ connector, with and
   without O_DIRECT, and ``fs``, its Python aiofiles adapter), alternating within each round.
   Gets read cold data: after each set phase everything is synced and the files' cached pages
   are dropped (POSIX_FADV_DONTNEED), untimed.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import sys
import time
import traceback

import torch

DIR = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
ROUND_MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 256
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
SIZES = [256 << 10, 1 << 20, 4 << 20, 16 << 20]
BATCH = 8
TIMEOUT = 120.0

import lmcache  # noqa: E402

try:
    import lmcache.lmcache_native  # noqa: E402,F401

    NATIVE = "lmcache.lmcache_native loaded"
except ImportError as e:  # built against another torch: say so, and stand in for Bitmap only
    import types

    NATIVE = f"lmcache.lmcache_native did NOT load ({e}); a pure-Python Bitmap stands in for it"

    class Bitmap:
        def __init__(self, n: int) -> None:
            self.bits = [False] * n

        def set(self, i: int) -> None:
            self.bits[i] = True

        def test(self, i: int) -> bool:
            return self.bits[i]

        def popcount(self) -> int:
            return sum(self.bits)

    _m = types.ModuleType("lmcache.lmcache_native")
    _m.Bitmap = Bitmap
    sys.modules["lmcache.lmcache_native"] = _m
from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import (  # noqa: E402
    add_l2_adapters_args,
    parse_args_to_l2_adapters_config,
)
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj  # noqa: E402
from lmcache.v1.platform.event_notifier import consume_fd  # noqa: E402

import ugds  # noqa: E402

CHECKS = {"passed": 0, "failed": 0}


def check(cond: bool, what: str) -> None:
    CHECKS["passed" if cond else "failed"] += 1
    print(f"  {'ok  ' if cond else 'FAIL'} {what}", flush=True)


def make_adapter(spec: dict):
    """The adapter from its --l2-adapter JSON, as LMCache's server parses and creates it."""
    p = argparse.ArgumentParser()
    add_l2_adapters_args(p)
    cfg = parse_args_to_l2_adapters_config(p.parse_args(["--l2-adapter", json.dumps(spec)]))
    return create_l2_adapter(cfg.adapters[0])


class Arena:
    """Pinned host memory carved into 4 KiB-aligned L1 objects (as LMCache's L1 allocator)."""

    def __init__(self, nbytes: int) -> None:
        self.t = torch.empty(nbytes + 4096, dtype=torch.uint8, pin_memory=True)
        self.base = (-self.t.data_ptr()) % 4096

    def objs(self, size: int, n: int):
        return [l1_obj(self.t, self.base + i * size, size) for i in range(n)]


def l1_obj(t: torch.Tensor, off: int, size: int) -> TensorMemoryObj:
    """An L1 memory object over ``t[off:off+size]`` (no allocator: freed with the tensor)."""
    meta = MemoryObjMetadata(shape=torch.Size([size]), dtype=torch.uint8, address=off, phy_size=size, ref_count=1)
    return TensorMemoryObj(t[off : off + size], meta, None)


def keys_for(tag: str, n: int):
    return [ObjectKey(chunk_hash=(f"{tag}-{i}").encode().ljust(32, b"."), model_name="bench/model", kv_rank=0) for i in range(n)]


def wait_fd(fd: int, poll, what: str):
    """Waits on an adapter event fd until poll() returns something, then returns it."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        r = poll()
        if r is not None:
            return r
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(what)
        if select.select([fd], [], [], min(left, 0.5))[0]:
            consume_fd(fd)


def store(ad, keys, objs) -> list:
    """Submits every batch at once; waits for all; returns the per-task results."""
    tids = [ad.submit_store_task(keys[i : i + BATCH], objs[i : i + BATCH]) for i in range(0, len(keys), BATCH)]
    got: dict = {}

    def poll():
        got.update(ad.pop_completed_store_tasks())
        return got if all(t in got for t in tids) else None

    wait_fd(ad.get_store_event_fd(), poll, "store")
    return [got[t] for t in tids]


def load(ad, keys, objs) -> list:
    """Submits every batch at once; returns the found bits, in key order."""
    tids = [ad.submit_load_task(keys[i : i + BATCH], objs[i : i + BATCH]) for i in range(0, len(keys), BATCH)]
    bits = []
    for j, t in enumerate(tids):
        bm = wait_fd(ad.get_load_event_fd(), lambda t=t: ad.query_load_result(t), "load")
        bits += [bm.test(i) for i in range(len(keys[j * BATCH : (j + 1) * BATCH]))]
    return bits


def lookup(ad, keys) -> list:
    t = ad.submit_lookup_and_lock_task(keys, {})
    bm = wait_fd(ad.get_lookup_and_lock_event_fd(), lambda: ad.query_lookup_and_lock_result(t), "lookup")
    ad.submit_unlock([k for i, k in enumerate(keys) if bm.test(i)])
    return [bm.test(i) for i in range(len(keys))]


def ugds_spec(path: str, **extra) -> dict:
    params = {"path": path, "capacity": 2 << 30, "num_workers": 4}
    params.update(extra)
    return {"type": "native_plugin", "module_path": "ugds.lmcache", "class_name": "UgdsConnector", "adapter_params": params}


def functional(work: str) -> None:
    print("== functional: LMCache's native-plugin adapter loading ugds.lmcache.UgdsConnector", flush=True)
    path = os.path.join(work, "func.store")
    spec = ugds_spec(path)
    print("  --l2-adapter", json.dumps(spec))
    ad = make_adapter(spec)
    check(type(ad).__name__ == "NativeConnectorL2Adapter", f"adapter type {type(ad).__name__}")
    check(type(ad._client).__name__ == "UgdsConnector", f"native client {type(ad._client).__module__}.{type(ad._client).__name__}")
    st = ad._client.store.st
    before = st.path_counts()
    # KV chunks of a few sizes made on the GPU, through pinned L1 objects.
    sizes = [4096, 64 << 10, 256 << 10, (1 << 20) + 4096, 4 << 20, 16 << 20]
    gpu = [torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda") for n in sizes]
    arena_in, arena_out = Arena(sum(sizes) + 4096 * len(sizes)), Arena(sum(sizes) + 4096 * len(sizes))
    ins, outs, pos = [], [], 0
    for n in sizes:  # each object in its own 4 KiB-aligned slice
        ins.append(l1_obj(arena_in.t, arena_in.base + pos, n))
        outs.append(l1_obj(arena_out.t, arena_out.base + pos, n))
        pos += -(-n // 4096) * 4096
    for g, o in zip(gpu, ins):
        o.tensor.copy_(g)  # GPU -> L1
    torch.cuda.synchronize()
    keys = keys_for("func", len(sizes))
    res = store(ad, keys, ins)
    check(all(int(r) >= 0 for r in res), f"store of {len(sizes)} chunks (4 KiB .. 16 MiB): results {[int(r) for r in res]}")
    check(lookup(ad, keys + keys_for("absent", 1)) == [True] * len(sizes) + [False], "lookup: every stored key, not the absent one")
    spare = l1_obj(torch.empty(4096, dtype=torch.uint8, pin_memory=True), 0, 4096)
    bits = load(ad, keys + keys_for("absent", 1), outs + [spare])
    check(bits == [True] * len(sizes) + [False], f"load bits {bits}")
    back = [o.tensor.to("cuda") for o in outs]  # L1 -> GPU
    torch.cuda.synchronize()
    check(all(torch.equal(a, b) for a, b in zip(gpu, back)), "loaded chunks equal the CUDA tensors they came from")
    after = st.path_counts()
    print("  path counts:", {k: after[k] - before[k] for k in after})
    check(after["fallback"] > before["fallback"] and after["direct_host"] == before["direct_host"], "the store's I/O took the fallback path (a file: no ugds node here)")
    ad.delete(keys[:1])
    check(lookup(ad, keys[:2]) == [False, True], "delete through the adapter removes the key")
    ad.close()
    # A restart: a new adapter (and connector) on the same store finds the chunks.
    ad = make_adapter(spec)
    check(lookup(ad, keys) == [False] + [True] * (len(sizes) - 1), "after close and a new adapter: the stored chunks are found")
    for o in outs:
        o.tensor.zero_()
    check(load(ad, keys[1:], outs[1:]) == [True] * (len(sizes) - 1), "and load")
    check(all(torch.equal(g.cpu(), o.tensor) for g, o in zip(gpu[1:], outs[1:])), "with the same bytes")
    ad.close()
    os.unlink(path)


def drop_cache(d: str) -> None:
    os.sync()
    for root, _, files in os.walk(d):
        for f in files:
            try:
                fd = os.open(os.path.join(root, f), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def bench(work: str) -> None:
    print(f"\n== throughput: {ROUND_MIB} MiB per round, {ROUNDS} rounds, batches of {BATCH}, all in flight", flush=True)
    methods = {
        "ugds": (ugds_spec(os.path.join(work, "ugds-bench.store"), durable=False), os.path.join(work, "ugds-bench.store")),
        "ugds durable": (ugds_spec(os.path.join(work, "ugds-bench-d.store")), os.path.join(work, "ugds-bench-d.store")),
        "fs_native": ({"type": "fs_native", "base_path": os.path.join(work, "fsn")}, os.path.join(work, "fsn")),
        "fs_native odirect": ({"type": "fs_native", "base_path": os.path.join(work, "fsno"), "use_odirect": True}, os.path.join(work, "fsno")),
        "fs": ({"type": "fs", "base_path": os.path.join(work, "fsp")}, os.path.join(work, "fsp")),
    }
    ads = {}
    for name, (spec, _) in methods.items():
        try:
            ads[name] = make_adapter(spec)
            print(f"  {name}: --l2-adapter {json.dumps(spec)}")
        except Exception as e:  # one adapter that cannot start does not stop the others
            print(f"  {name}: could not be created: {type(e).__name__}: {e}")
    total = ROUND_MIB << 20
    src, dst = Arena(total), Arena(total)
    g = torch.Generator().manual_seed(1)
    src.t[:] = torch.randint(0, 256, (src.t.numel(),), dtype=torch.uint8, generator=g)
    results = {}
    for size in SIZES:
        n = total // size
        ins, outs = src.objs(size, n), dst.objs(size, n)
        for r in range(ROUNDS):
            order = list(ads) if r % 2 == 0 else list(reversed(list(ads)))
            for name in order:
                ad = ads[name]
                keys = keys_for(f"b{size}-{r}", n)
                dst.t.zero_()
                t0 = time.perf_counter()
                res = store(ad, keys, ins)
                t1 = time.perf_counter()
                drop_cache(methods[name][1])
                t2 = time.perf_counter()
                bits = load(ad, keys, outs)
                t3 = time.perf_counter()
                ok = all(int(x) >= 0 for x in res) and all(bits) and torch.equal(src.t[src.base : src.base + n * size], dst.t[dst.base : dst.base + n * size])
                if not ok:
                    print(f"  FAIL {name} {size}: stored {[int(x) for x in res][:4]}.. loaded {sum(bits)}/{n} equal={ok}")
                    CHECKS["failed"] += 1
                ad.delete(keys)
                results.setdefault((name, size), []).append((n * size / (t1 - t0), n * size / (t2 - t0), n * size / (t3 - t2), ok))
        line = "  ".join(
            f"{nm}: set {statistics.median(x[0] for x in results[(nm, size)]) / 1e9:.2f} get {statistics.median(x[2] for x in results[(nm, size)]) / 1e9:.2f}"
            for nm in ads
        )
        print(f"  {size >> 10:6d} KiB  {line}", flush=True)
    for ad in ads.values():
        ad.close()
    ok_all = all(x[3] for v in results.values() for x in v)
    check(ok_all, "every benchmark round stored, found and loaded every object with the same bytes")
    print("\nGB/s, medians of", ROUNDS, "rounds (set = until every store completion; set+sync = until os.sync() returned too; get = cold)")
    names = list(ads)
    print("| size | " + " | ".join(f"{nm} set | {nm} set+sync | {nm} get" for nm in names) + " |")
    print("| ---: |" + " ---: |" * (3 * len(names)))
    for size in SIZES:
        cells = []
        for nm in names:
            v = results.get((nm, size), [])
            med = lambda i: statistics.median(x[i] for x in v) / 1e9 if v else float("nan")
            cells += [f"{med(0):.2f}", f"{med(1):.2f}", f"{med(2):.2f}"]
        print(f"| {size >> 10} KiB | " + " | ".join(cells) + " |")
    base = "ugds"
    for other in [n for n in names if n != base]:
        print(f"\nratios ugds / {other} (per size: set, set+sync, get):")
        for size in SIZES:
            a, b = results.get((base, size)), results.get((other, size))
            if not a or not b:
                continue
            r = [statistics.median(x[i] for x in a) / statistics.median(x[i] for x in b) for i in range(3)]
            print(f"  {size >> 10:6d} KiB  set {r[0]:.2f}x  set+sync {r[1]:.2f}x  get {r[2]:.2f}x")


def main() -> int:
    print(f"torch {torch.__version__}, cuda {torch.version.cuda}, device {torch.cuda.get_device_name(0)}")
    print(f"lmcache {getattr(lmcache, '__version__', '?')} from {os.path.dirname(lmcache.__file__)}")
    print(f"ugds from {os.path.dirname(ugds.__file__)}")
    print(NATIVE)
    work = os.path.join(DIR, "lmc-plugin")
    os.makedirs(work, exist_ok=True)
    for step in (functional, bench):
        try:
            step(work)
        except Exception:
            traceback.print_exc()
            CHECKS["failed"] += 1
    print(f"\nLMCACHE-PLUGIN checks passed={CHECKS['passed']} failed={CHECKS['failed']}")
    return 0 if CHECKS["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

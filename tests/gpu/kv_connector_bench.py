"""Set/get throughput of ``ugds.lmcache.UgdsConnector`` driven as LMCache's adapter drives it
(host memoryviews, batches of 8, every batch submitted at once, completions drained from the
eventfd), for 256 KiB to 16 MiB objects. Informational; prints one line per size (medians of
ROUNDS). Usage: ``python3 kv_connector_bench.py DIR [MiB per round] [rounds] [durable 0/1]``.
Whichever ``ugds`` is importable runs (compare two builds by alternating PYTHONPATH).
"""

from __future__ import annotations

import os
import select
import statistics
import sys
import time

import ugds
from ugds.lmcache import UgdsConnector

DIR = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
TOTAL = (int(sys.argv[2]) if len(sys.argv) > 2 else 256) << 20
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
DURABLE = bool(int(sys.argv[4])) if len(sys.argv) > 4 else False
SIZES = [256 << 10, 1 << 20, 4 << 20, 16 << 20]
BATCH = 8


def drain(c: UgdsConnector, fids) -> dict:
    want, got = set(fids), {}
    while not want <= set(got):
        select.select([c.event_fd()], [], [], 5)
        for fid, ok, err, res in c.drain_completions():
            got[fid] = (ok, err, res)
    return got


def main() -> None:
    path = os.path.join(DIR, "kv-connector-bench.store")
    c = UgdsConnector(path=path, capacity=2 * TOTAL + (256 << 20), durable=DURABLE)
    src = bytearray(os.urandom(1 << 20) * (TOTAL >> 20))
    dst = bytearray(TOTAL)
    print(f"ugds {ugds.__file__}: {c.store.st.describe()} durable={DURABLE}", flush=True)
    for size in SIZES:
        n = TOTAL // size
        sv, dv = memoryview(src), memoryview(dst)
        sets, gets = [], []
        for r in range(ROUNDS):
            keys = [f"s{size}-r{r}-{i}" for i in range(n)]
            t0 = time.perf_counter()
            fs = [c.submit_batch_set(keys[i : i + BATCH], [sv[j * size : (j + 1) * size] for j in range(i, min(n, i + BATCH))]) for i in range(0, n, BATCH)]
            done = drain(c, fs)
            t1 = time.perf_counter()
            fg = [c.submit_batch_get(keys[i : i + BATCH], [dv[j * size : (j + 1) * size] for j in range(i, min(n, i + BATCH))]) for i in range(0, n, BATCH)]
            got = drain(c, fg)
            t2 = time.perf_counter()
            assert all(done[f][0] for f in fs), [done[f] for f in fs if not done[f][0]][:1]
            assert all(all(got[f][2]) for f in fg) and dst == src[: n * size]
            dst[:] = bytes(len(dst))
            fd = [c.submit_batch_delete(keys)]
            drain(c, fd)
            sets.append(n * size / (t1 - t0))
            gets.append(n * size / (t2 - t1))
        print(f"{size >> 10:6d} KiB  set {statistics.median(sets) / 1e9:.3f} GB/s  get {statistics.median(gets) / 1e9:.3f} GB/s", flush=True)
    c.close()
    os.unlink(path)


if __name__ == "__main__":
    main()

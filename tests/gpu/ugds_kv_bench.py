"""Throughput of ``ugds.kv`` set/get against one file per object on the same disk (the shape of
LMCache's file-system L2 adapter: write a file, fsync; read it back), for 256 KiB to 16 MiB
objects, batches of 8. Informational: prints a table; run by tests/gpu/run.sh's `pyugds` step
and usable anywhere (`python3 tests/gpu/ugds_kv_bench.py DIR [TOTAL_MIB]`).

Both sides make each batch durable (the store flushes after the data and after the journal
record; the files are fsynced) and read cold data (the store uses O_DIRECT; each file's pages
are dropped with POSIX_FADV_DONTNEED after its fsync). Each point is the median of 3 rounds.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time

import ugds.kv as kv

DIR = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
TOTAL = (int(sys.argv[2]) if len(sys.argv) > 2 else 1024) << 20
SIZES = [256 << 10, 1 << 20, 4 << 20, 16 << 20]
BATCH = 8


def files_round(d: str, keys, val: bytes):
    t0 = time.perf_counter()
    for i in range(0, len(keys), BATCH):
        fds = []
        for k in keys[i : i + BATCH]:
            fd = os.open(os.path.join(d, k), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, val)
            fds.append(fd)
        for fd in fds:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    t1 = time.perf_counter()
    for i in range(0, len(keys), BATCH):
        for k in keys[i : i + BATCH]:
            with open(os.path.join(d, k), "rb", buffering=0) as f:
                got = f.read()
            assert len(got) == len(val)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def store_round(s: kv.Store, keys, val: bytes):
    t0 = time.perf_counter()
    for i in range(0, len(keys), BATCH):
        s.set_many([(k, val) for k in keys[i : i + BATCH]])
    t1 = time.perf_counter()
    for i in range(0, len(keys), BATCH):
        got = s.get_many(keys[i : i + BATCH])
        assert all(g is not None and len(g) == len(val) for g in got)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main() -> None:
    path = os.path.join(DIR, "ugds-kv-bench.dat")
    fdir = os.path.join(DIR, "ugds-kv-bench-files")
    with open(path, "wb") as f:
        f.truncate(TOTAL + (256 << 20))
    s = kv.open(path, create=True)
    print(f"ugds.kv vs one file per object, {TOTAL >> 20} MiB per round, batches of {BATCH}, medians of 3 (GB/s)")
    print("| size | store set | files set | set ratio | store get | files get | get ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in SIZES:
        n = max(BATCH, TOTAL // size)
        val = os.urandom(size)
        keys_s = [b"b%d-%d" % (size, i) for i in range(n)]
        keys_f = ["b%d-%d" % (size, i) for i in range(n)]
        res = {"ss": [], "sg": [], "fs": [], "fg": []}
        for _ in range(3):
            a, b = store_round(s, keys_s, val)
            s.delete_many(keys_s)
            shutil.rmtree(fdir, ignore_errors=True)
            os.makedirs(fdir)
            c, d = files_round(fdir, keys_f, val)
            res["ss"].append(a)
            res["sg"].append(b)
            res["fs"].append(c)
            res["fg"].append(d)
        gb = n * size / 1e9
        ss, sg, fs, fg = (gb / statistics.median(res[k]) for k in ("ss", "sg", "fs", "fg"))
        print(f"| {size >> 10} KiB | {ss:.2f} | {fs:.2f} | {ss / fs:.2f}x | {sg:.2f} | {fg:.2f} | {sg / fg:.2f}x |")
    shutil.rmtree(fdir, ignore_errors=True)
    os.unlink(path)


if __name__ == "__main__":
    main()

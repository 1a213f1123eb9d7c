"""``python -m ugds doctor|info|bench``: the CLI's commands of the same names, through the
Python package (so they also show what the package itself sees and costs)."""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from typing import List, Optional

import ugds


def size(s: str) -> int:
    """Parses 4096, 64K, 16M, 1G (binary units), as the CLI does."""
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:].upper(), 1)
    digits = s[:-1] if mult > 1 else s
    try:
        v = int(digits)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a size (4096, 64K, 16M, 1G)") from None
    return v * mult


def cmd_doctor(a: argparse.Namespace) -> int:
    tags = {"ok": "[ ok ]", "warn": "[warn]", "no": "[ no ]", "info": "[info]"}
    for f in ugds.doctor():
        if a.json:
            print(json.dumps(f._asdict()))
            continue
        print(f"{tags.get(f.verdict, '[info]')} {f.topic:<14} {f.detail}")
        if f.fix:
            print(f"       {'':<14} fix: {f.fix}")
    return 0


def cmd_info(a: argparse.Namespace) -> int:
    st = ugds.open(a.target, ns=a.ns)
    if a.json:
        print(
            json.dumps(
                {
                    "target": a.target,
                    "path": "direct" if st.is_direct else "fallback",
                    "direct_io": st.bypasses_page_cache,
                    "capacity": st.capacity,
                    "block_size": st.block_size,
                    "describe": st.describe(),
                    "version": ugds.__version__,
                    "cuda": ugds.cuda_available(),
                }
            )
        )
    else:
        print(f"{a.target}: {st.describe()}")
        print(f"  ugds {ugds.__version__} (Python package); CUDA driver {'present' if ugds.cuda_available() else 'absent'}")
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    st = ugds.open(a.target, ns=a.ns)
    bs = st.block_size
    if a.size % bs:
        print(f"--size {a.size} is not a multiple of the {bs}-byte block size", file=sys.stderr)
        return 2
    span = min(a.span, st.capacity)
    slots = span // a.size
    if slots == 0:
        print(f"{a.target} holds {st.capacity} bytes, less than one {a.size}-byte I/O", file=sys.stderr)
        return 2
    stop = time.monotonic() + a.seconds
    counts: List[int] = [0] * a.threads
    lat: List[List[float]] = [[] for _ in range(a.threads)]
    errors: List[Optional[BaseException]] = [None] * a.threads

    def worker(i: int) -> None:
        rng = random.Random(i)
        buf = st.alloc(a.size * a.depth)
        batch = st.batch(a.depth) if a.depth > 1 else None
        try:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                if batch is None:
                    off = rng.randrange(slots) * a.size
                    write = a.rw == "write" or (a.rw == "mix" and rng.random() < 0.5)
                    (st.write if write else st.read)(buf, off, a.size)
                else:
                    entries = []
                    for k in range(a.depth):
                        off = rng.randrange(slots) * a.size
                        write = a.rw == "write" or (a.rw == "mix" and rng.random() < 0.5)
                        entries.append(("write" if write else "read", buf, off, a.size, k * a.size))
                    batch.run(entries)
                lat[i].append(time.perf_counter() - t0)
                counts[i] += a.depth
        except BaseException as e:  # reported below, after the other threads stop
            errors[i] = e

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    for e in errors:
        if e is not None:
            raise e
    ios = sum(counts)
    all_lat = sorted(x for l in lat for x in l)
    p = lambda q: all_lat[min(len(all_lat) - 1, int(q * len(all_lat)))] * 1e6 if all_lat else 0.0  # noqa: E731
    res = {
        "target": a.target,
        "path": "direct" if st.is_direct else "fallback",
        "rw": a.rw,
        "size": a.size,
        "threads": a.threads,
        "depth": a.depth,
        "seconds": elapsed,
        "ios": ios,
        "iops": ios / elapsed,
        "mb_per_s": ios * a.size / elapsed / 1e6,
        "p50_us": p(0.5),
        "p99_us": p(0.99),
        "path_counts": st.path_counts(),
    }
    if a.json:
        print(json.dumps(res))
    else:
        unit = "call" if a.depth == 1 else f"batch of {a.depth}"
        print(
            f"{a.target} ({res['path']} path): {a.rw} {a.size} B x {a.threads} thread(s), depth {a.depth}: "
            f"{res['iops']:.0f} IOPS, {res['mb_per_s']:.1f} MB/s, per {unit} p50 {res['p50_us']:.0f} us, "
            f"p99 {res['p99_us']:.0f} us"
        )
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ugds", description="ugds from Python: doctor, info, bench")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("doctor", parents=[common], help="what decides the I/O path on this machine, with fixes")
    p = sub.add_parser("info", parents=[common], help="the path a target takes, its capacity and block size")
    p.add_argument("target", help="a ugds node (/dev/ugds_drvN), a file or a block device")
    p.add_argument("--ns", type=int, default=1, help="namespace of a ugds node")
    p = sub.add_parser("bench", parents=[common], help="random I/O through the Python package")
    p.add_argument("target")
    p.add_argument("--ns", type=int, default=1)
    p.add_argument("--size", type=size, default=4096, help="I/O size (4K, 64K, 1M...)")
    p.add_argument("--threads", type=int, default=1, help="Python threads (the GIL is released during I/O)")
    p.add_argument("--rw", choices=["read", "write", "mix"], default="read")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--span", type=size, default=1 << 30, help="working set (random offsets within it)")
    p.add_argument("--depth", type=int, default=1, help="1: synchronous calls; N: batches of N entries (Batch.run)")
    a = ap.parse_args(argv)
    try:
        return {"doctor": cmd_doctor, "info": cmd_info, "bench": cmd_bench}[a.cmd](a)
    except ugds.Error as e:
        print(f"ugds: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

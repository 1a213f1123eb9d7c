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
    """Parses 4096, 64K, 16M, 1G (binary units) with the library's parser, the CLI's own."""
    try:
        return ugds.parse_size(s)
    except ugds.InvalidArgument as e:
        raise argparse.ArgumentTypeError(e.reason) from None


def cmd_doctor(a: argparse.Namespace) -> int:
    """Prints the findings; 1 when one rules the direct path out (a ``no``), as the CLI's."""
    tags = {"ok": "[ ok ]", "warn": "[warn]", "no": "[ no ]", "info": "[info]"}
    findings = ugds.doctor()
    for f in findings:
        if a.json:
            print(json.dumps(f._asdict()))
            continue
        print(f"{tags.get(f.verdict, '[info]')} {f.topic:<14} {f.detail}")
        if f.fix:
            print(f"       {'':<14} fix: {f.fix}")
    blocking = [f.topic for f in findings if f.verdict == "no"]
    if blocking:
        print(f"ugds doctor: the direct path is ruled out by: {', '.join(blocking)}", file=sys.stderr)
        return 1
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


#: fio's ``rw`` values: (random offsets, percent of reads; None: ``--rwmixread``).
WORKLOADS = {
    "read": (False, 100),
    "write": (False, 0),
    "randread": (True, 100),
    "randwrite": (True, 0),
    "rw": (False, None),
    "readwrite": (False, None),
    "randrw": (True, None),
}

#: The percentiles reported, as the CLI's names them.
PERCENTILES = (("p50_us", 0.5), ("p90_us", 0.9), ("p99_us", 0.99), ("p99_9_us", 0.999), ("p99_99_us", 0.9999))


def latency(lat: List[float]) -> dict:
    """min, avg, max and the percentiles of ``lat`` (seconds), in microseconds."""
    if not lat:
        return {k: 0.0 for k in ("min_us", "avg_us", "max_us", *(n for n, _ in PERCENTILES))}
    lat = sorted(lat)
    out = {"min_us": lat[0] * 1e6, "avg_us": sum(lat) / len(lat) * 1e6, "max_us": lat[-1] * 1e6}
    for name, q in PERCENTILES:
        out[name] = lat[min(len(lat) - 1, int(q * len(lat)))] * 1e6
    return out


def cmd_bench(a: argparse.Namespace) -> int:
    """fio's job options (``--rw``, ``--bs``, ``--iodepth``, ``--numjobs``, ``--runtime``,
    ``--size`` as the region from ``--offset``, ``--rwmixread``) through the package: each job a
    Python thread, synchronous calls at iodepth 1, else batches of iodepth entries."""
    st = ugds.open(a.target, ns=a.ns)
    bs = st.block_size
    if a.bs % bs or a.offset % a.bs:
        print(f"--bs {a.bs} and --offset {a.offset} must be multiples of the {bs}-byte block size (and --offset of --bs)", file=sys.stderr)
        return 2
    region = a.size if a.size is not None else st.capacity - min(a.offset, st.capacity)
    if a.offset + region > st.capacity:
        print(f"--offset {a.offset} + --size {region} runs past the end of {a.target} ({st.capacity} bytes)", file=sys.stderr)
        return 2
    blocks = region // a.bs
    if blocks == 0:
        print(f"the region ({region} bytes) holds less than one {a.bs}-byte I/O", file=sys.stderr)
        return 2
    random_offsets, reads = WORKLOADS[a.rw]
    read_percent = a.rwmixread if reads is None else reads
    stop = time.monotonic() + a.runtime
    # Per job and direction (0: read, 1: write): latencies, and I/Os.
    lat: List[List[List[float]]] = [[[], []] for _ in range(a.numjobs)]
    counts: List[List[int]] = [[0, 0] for _ in range(a.numjobs)]
    errors: List[Optional[BaseException]] = [None] * a.numjobs

    def worker(i: int) -> None:
        rng = random.Random(i)
        pos = 0
        buf = st.alloc(a.bs * a.iodepth)
        batch = st.batch(a.iodepth) if a.iodepth > 1 else None

        def next_io():
            nonlocal pos
            if random_offsets:
                block = rng.randrange(blocks)
            else:
                block, pos = pos, (pos + 1) % blocks
            # Drawn apart from the offset, so a sequential mixed job mixes too.
            write = read_percent == 0 or (read_percent < 100 and rng.randrange(100) >= read_percent)
            return a.offset + block * a.bs, write

        try:
            while time.monotonic() < stop:
                if batch is None:
                    off, write = next_io()
                    t0 = time.perf_counter()
                    (st.write if write else st.read)(buf, off, a.bs)
                    lat[i][write].append(time.perf_counter() - t0)
                    counts[i][write] += 1
                else:
                    ios = [next_io() for _ in range(a.iodepth)]
                    entries = [("write" if w else "read", buf, off, a.bs, k * a.bs) for k, (off, w) in enumerate(ios)]
                    t0 = time.perf_counter()
                    batch.run(entries)
                    # Each entry's latency is at most its batch's: the batch's is recorded for each.
                    dt = time.perf_counter() - t0
                    for _, w in ios:
                        lat[i][w].append(dt)
                        counts[i][w] += 1
        except BaseException as e:  # reported below, after the other threads stop
            errors[i] = e

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.numjobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    for e in errors:
        if e is not None:
            raise e
    gib = float(1 << 30)

    def direction(d: int) -> Optional[dict]:
        n = sum(c[d] for c in counts)
        if n == 0:
            return None
        return {"ios": n, "iops": n / elapsed, "gib_per_s": n * a.bs / elapsed / gib, "lat": latency([x for l in lat for x in l[d]])}

    ios = sum(sum(c) for c in counts)
    res = {
        "target": a.target,
        "rw": a.rw,
        "bs": a.bs,
        "iodepth": a.iodepth,
        "numjobs": a.numjobs,
        "runtime_s": elapsed,
        "offset": a.offset,
        "size": region,
        "rwmixread": read_percent,
        "ios": ios,
        "iops": ios / elapsed,
        "gib_per_s": ios * a.bs / elapsed / gib,
        **latency([x for l in lat for d in l for x in d]),
        "read": direction(0),
        "write": direction(1),
        "path": "direct" if st.is_direct else "fallback",
        "path_counts": st.path_counts(),
    }
    if a.json:
        print(json.dumps(res))
    else:
        unit = "call" if a.iodepth == 1 else f"batch of {a.iodepth}"
        print(
            f"{a.target} ({res['path']} path): {a.rw} bs={a.bs} iodepth={a.iodepth} numjobs={a.numjobs}: "
            f"{res['iops']:.0f} IOPS, {res['gib_per_s']:.3f} GiB/s"
        )
        for name in ("read", "write"):
            d = res[name]
            if d is not None:
                l = d["lat"]
                print(
                    f"  {name}: {d['iops']:.0f} IOPS, latency per {unit} (us) min {l['min_us']:.0f} avg {l['avg_us']:.0f} "
                    f"max {l['max_us']:.0f} p50 {l['p50_us']:.0f} p90 {l['p90_us']:.0f} p99 {l['p99_us']:.0f} "
                    f"p99.9 {l['p99_9_us']:.0f} p99.99 {l['p99_99_us']:.0f}"
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
    p = sub.add_parser("bench", parents=[common], help="fio-style I/O through the Python package")
    p.add_argument("target")
    p.add_argument("--ns", type=int, default=1)
    p.add_argument(
        "--rw",
        choices=list(WORKLOADS),
        default="read",
        help="fio's rw: read, write sequential; randread, randwrite random; rw (readwrite), randrw mixed",
    )
    p.add_argument("--bs", type=size, default=4096, help="bytes per I/O (4K, 64K, 1M...)")
    p.add_argument("--iodepth", "--depth", type=int, default=1, help="1: synchronous calls; N: batches of N entries (Batch.run)")
    p.add_argument("--numjobs", "--threads", type=int, default=1, help="jobs: Python threads (the GIL is released during I/O)")
    p.add_argument("--runtime", "--seconds", type=float, default=5.0, help="seconds (sequential jobs wrap at the region's end)")
    p.add_argument("--size", "--span", type=size, default=None, help="the region, from --offset (default: to the end)")
    p.add_argument("--offset", type=size, default=0, help="where the region starts (a multiple of --bs)")
    p.add_argument("--rwmixread", type=int, choices=range(0, 101), metavar="0..100", default=50, help="percent of a mixed workload's I/Os that read")
    a = ap.parse_args(argv)
    try:
        return {"doctor": cmd_doctor, "info": cmd_info, "bench": cmd_bench}[a.cmd](a)
    except ugds.Error as e:
        print(f"ugds: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

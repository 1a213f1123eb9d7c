"""The `ugds` Python package with tensors on every CUDA device (run by tests/gpu/devices.sh):
for each device, with ANOTHER device current (torch.cuda.set_device), a tensor on that device is
read synchronously, stream-ordered on a stream of its own device, and on its device's default
stream; with two or more GPUs, one thread per device does the same at once. Every read's bytes
are checked. Prints `PY-DEVICES devices=N passed=P failed=F` last.

Usage: python3 tests/gpu/py_devices.py DIR
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading

import torch

import ugds

DIR = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
MiB = 1 << 20
passed = failed = 0
lock = threading.Lock()


def check(cond: bool, what: str) -> None:
    global passed, failed
    with lock:
        if cond:
            passed += 1
        else:
            failed += 1
            print(f"not ok - {what}", flush=True)


def expected(data: bytes, off: int, n: int, dev: int) -> torch.Tensor:
    return torch.frombuffer(bytearray(data[off : off + n]), dtype=torch.uint8).to(f"cuda:{dev}")


def one_device(st, data: bytes, dev: int, other: int, base: int) -> None:
    torch.cuda.set_device(other)
    t = torch.zeros(MiB, dtype=torch.uint8, device=f"cuda:{dev}")
    torch.cuda.synchronize(dev)
    b = st.register(t)
    check(b.device == f"cuda:{dev}", f"device {dev}: registered as {b.device}")
    check(st.read(b, base, MiB) == MiB, f"device {dev}: read")
    check(torch.equal(t, expected(data, base, MiB, dev)), f"device {dev}: read bytes")
    check(torch.cuda.current_device() == other, f"device {dev}: the current device changed")
    s = torch.cuda.Stream(device=dev)
    r = st.read_async(b, base + MiB, MiB, stream=s.cuda_stream)
    s.synchronize()
    check(r.result(timeout=60) == MiB, f"device {dev}: read_async on its stream")
    check(torch.equal(t, expected(data, base + MiB, MiB, dev)), f"device {dev}: read_async bytes")
    d = torch.cuda.default_stream(dev)
    r = st.read_async(b, base + 2 * MiB, MiB, stream=d.cuda_stream)
    d.synchronize()
    check(r.result(timeout=60) == MiB, f"device {dev}: read_async on its default stream")
    check(torch.equal(t, expected(data, base + 2 * MiB, MiB, dev)), f"device {dev}: default-stream bytes")


def main() -> int:
    n = torch.cuda.device_count()
    fd, path = tempfile.mkstemp(prefix="ugds-py-devices-", suffix=".dat", dir=DIR)
    data = os.urandom(32 * MiB)
    os.write(fd, data)
    os.close(fd)
    try:
        st = ugds.open(path)
        for dev in range(n):
            one_device(st, data, dev, (dev + 1) % n, dev * 4 * MiB)
        if n > 1:
            ts = [threading.Thread(target=one_device, args=(st, data, d, d, 16 * MiB + d * 4 * MiB)) for d in range(n)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
    finally:
        os.unlink(path)
    print(f"PY-DEVICES devices={n} passed={passed} failed={failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

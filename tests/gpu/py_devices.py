"""The `ugds` Python package with tensors on every CUDA device (run by tests/gpu/devices.sh):
for each device, with ANOTHER device current (torch.cuda.set_device), a tensor on that device is
read synchronously, stream-ordered on a stream of its own device, and on its device's default
stream; with two or more GPUs, one thread per device does the same at once. Every read's bytes
are checked. Then `ugds.nearest` on a fake sysfs that puts each real GPU (its PCI address, as
torch reports it) behind a switch of its own with one SSD: the calling thread's GPU
(torch.cuda.set_device) and a GPU named by tensor or torch.device each get their own SSD first.
Prints `PY-DEVICES devices=N passed=P failed=F` last.

Usage: python3 tests/gpu/py_devices.py DIR
"""

from __future__ import annotations

import os
import shutil
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


# Character devices that stand in for ugds nodes (the fake sysfs maps their numbers to SSDs).
STAND_INS = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/kmsg", "/dev/tty", "/dev/ptmx"]


def placement(n: int) -> None:
    root = tempfile.mkdtemp(prefix="ugds-py-sys-", dir=DIR)
    devices = os.path.join(root, "bus/pci/devices")
    os.makedirs(devices)

    def add(path: str, cls: str) -> str:
        d = os.path.join(root, "devices", path)
        os.makedirs(d)
        for name, value in (("class", cls), ("numa_node", "0")):
            with open(os.path.join(d, name), "w") as f:
                f.write(value + "\n")
        addr = path.rsplit("/", 1)[1]
        os.symlink(d, os.path.join(devices, addr))
        return addr

    nodes = [p for p in STAND_INS if os.path.exists(p)][:n]
    pci, node_of = [], []
    try:
        for g, node in enumerate(nodes):
            p = torch.cuda.get_device_properties(g)
            gpu = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            bridge = f"pci{p.pci_domain_id:04x}:{0x80 + g:02x}/0000:{0x80 + g:02x}:00.0"
            pci.append(add(f"{bridge}/{gpu}", "0x030200"))
            ssd = add(f"{bridge}/00ff:{g:02x}:00.0", "0x010802")
            rdev = os.stat(node).st_rdev
            link = os.path.join(root, "dev/char", f"{os.major(rdev)}:{os.minor(rdev)}")
            os.makedirs(link)
            os.symlink(os.path.join(devices, ssd), os.path.join(link, "device"))
            node_of.append(node)
        spec = "stripe:" + ",".join(reversed(node_of))  # nearest first must reorder it
        for dev in range(len(node_of)):
            other = (dev + 1) % n
            torch.cuda.set_device(dev)
            got = ugds.nearest(spec, sys=root)
            check(got[0].gpu == pci[dev], f"placement: the thread's GPU is {got[0].gpu}, not device {dev} ({pci[dev]})")
            check(got[0].node == node_of[dev], f"placement: device {dev}'s nearest node is {got[0].node}")
            check(got[0].proximity == "same_switch", f"placement: device {dev}: {got[0].proximity}")
            torch.cuda.set_device(other)
            t = torch.zeros(16, device=f"cuda:{dev}")
            for what, g in (("tensor", t), ("torch.device", t.device), ("ordinal", dev)):
                got = ugds.nearest(spec, gpu=g, sys=root)
                check(got[0].node == node_of[dev], f"placement: device {dev} by {what}: {got[0].node}")
            check(torch.cuda.current_device() == other, f"placement: device {dev}: the current device changed")
    except Exception as e:  # a failure here must not hide the I/O checks' counts
        check(False, f"placement: {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(root)


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
    placement(n)
    print(f"PY-DEVICES devices={n} passed={passed} failed={failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

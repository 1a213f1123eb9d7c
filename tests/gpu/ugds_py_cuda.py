"""The `ugds` Python package with CUDA memory (run on the GPU machine by tests/gpu/run.sh's
`pyugds` step, after `pip install` of the wheel in target/gpu/ugds-wheel): torch CUDA and
pinned tensors, CuPy arrays (`__cuda_array_interface__` and DLPack), raw device pointers, batches
and stream-ordered I/O on PyTorch's current stream, all against a file (the fallback path: that
machine has no NVMe). Prints `UGDS-PY-CUDA passed=N failed=M skipped=K` last.

Synchronous I/O (`read`, `write`, batches) is not ordered with any stream, as cuFile's is not:
the tests synchronize before it (`sync()`), so the kernels that fill or clear a tensor are done
before the SSD side reads or writes it; `read_async`/`write_async` are the stream-ordered form.

Usage: python3 tests/gpu/ugds_py_cuda.py [DIR]   (DIR holds the test file; default /tmp)
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import sys
import tempfile
import time
import unittest

import torch

import ugds

try:
    import cupy
except ImportError:
    cupy = None

DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("UGDS_TEST_DIR", "/tmp")
MiB = 1 << 20


def sync() -> None:
    """Kernels queued so far are done (see the module comment)."""
    torch.cuda.synchronize()
    if cupy is not None:
        cupy.cuda.Device().synchronize()


def pattern(n: int, seed: int, device: str = "cuda") -> torch.Tensor:
    """uint8 bytes that differ per offset and seed."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    return ((i * 7 + seed * 13 + (i >> 9)) & 0xFF).to(torch.uint8)


class CudaTests(unittest.TestCase):
    def setUp(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="ugds-py-cuda-", suffix=".dat", dir=DIR)
        os.ftruncate(fd, 64 * MiB)
        os.close(fd)
        self.st = ugds.open(self.path)

    def tearDown(self) -> None:
        del self.st
        os.unlink(self.path)

    def test_cuda_tensor_round_trip(self) -> None:
        for n, off in ((4096, 0), (MiB + 4096, 8 * MiB), (16 * MiB, 32 * MiB)):
            src = pattern(n, n % 251)
            b = self.st.register(src)
            self.assertEqual(b.device, "cuda:0")
            sync()
            self.assertEqual(self.st.write(b, off, n), n)
            dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
            sync()
            self.assertEqual(self.st.read(self.st.register(dst), off, n), n)
            self.assertTrue(torch.equal(src, dst), f"{n} bytes at {off}")
            host = torch.zeros(n, dtype=torch.uint8)
            self.st.read(host, off, n)
            self.assertTrue(torch.equal(src.cpu(), host))
        c = self.st.path_counts()
        self.assertEqual(c["fallback"], 9)

    def test_pinned_host_tensor(self) -> None:
        src = pattern(MiB, 3, "cpu").pin_memory()
        b = self.st.register(src)
        self.assertEqual(b.device, "cpu")
        self.st.write(b, 0, MiB)
        dst = torch.zeros(MiB, dtype=torch.uint8, device="cuda")
        sync()
        self.st.read(dst, 0, MiB)
        self.assertTrue(torch.equal(src.cuda(), dst))

    def test_a_non_contiguous_cuda_tensor_is_refused(self) -> None:
        t = torch.zeros((64, 64), dtype=torch.float32, device="cuda").t()
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.register(t)
        self.assertEqual(c.exception.arg, "buf")
        self.assertIn("contiguous", c.exception.reason)

    def test_a_read_with_a_bad_offset_names_it_and_leaves_the_tensor(self) -> None:
        dst = torch.full((4096,), 7, dtype=torch.uint8, device="cuda")
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.read(dst, 100, 4096)
        self.assertEqual(c.exception.arg, "file_offset")
        self.assertTrue(bool((dst == 7).all()))

    def test_raw_device_pointer(self) -> None:
        src = pattern(MiB, 4)
        b = self.st.register_raw_unsafe(src.data_ptr(), MiB)
        self.assertEqual(b.device, "cuda:0")
        sync()
        self.st.write(b, 0, MiB)
        self.assertTrue(torch.equal(torch.frombuffer(bytearray(self.st.read_bytes(0, MiB)), dtype=torch.uint8), src.cpu()))

    @unittest.skipIf(cupy is None, "cupy is not installed")
    def test_cupy_array_and_dlpack(self) -> None:
        a = cupy.arange(MiB // 4, dtype=cupy.float32)
        b = cupy.zeros_like(a)
        sync()
        self.st.write(a, 0, a.nbytes)
        self.st.read(b, 0, b.nbytes)
        self.assertTrue(bool((a == b).all()))

        class OnlyDlpack:
            def __init__(self, arr):
                self.arr = arr

            def __dlpack__(self, stream=None):
                return self.arr.__dlpack__()

        c = cupy.zeros_like(a)
        sync()
        buf = self.st.register(OnlyDlpack(c))
        self.assertEqual(buf.device, "cuda:0")
        self.st.read(buf, 0, c.nbytes)
        self.assertTrue(bool((a == c).all()))

    def test_batch_of_cuda_tensors(self) -> None:
        srcs = [pattern(256 * 1024, k) for k in range(8)]
        sync()
        b = self.st.batch(16)
        for k, s in enumerate(srcs):
            b.write(s, k * MiB, s.numel())
        self.assertEqual([f.result(timeout=60) for f in b.submit()], [256 * 1024] * 8)
        dsts = [torch.zeros_like(s) for s in srcs]
        sync()
        for k, d in enumerate(dsts):
            b.read(d, k * MiB, d.numel())
        done, _ = cf.wait(b.submit(), timeout=60)
        self.assertEqual(len(done), 8)
        for s, d in zip(srcs, dsts):
            self.assertTrue(torch.equal(s, d))

    def test_stream_ordered_on_torchs_current_stream(self) -> None:
        n = 4 * MiB
        stream = torch.cuda.current_stream()
        src = torch.zeros(n, dtype=torch.uint8, device="cuda")
        dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
        sb, db = self.st.register(src), self.st.register(dst)
        torch.cuda.synchronize()
        # Queued in stream order: a long kernel, a fill, the write, a clobber, the read, a compare.
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):
            big = big @ big / 4096
        src.copy_(pattern(n, 9))
        w = self.st.write_async(sb, 0, n, stream=stream.cuda_stream)
        src.fill_(0)
        r = self.st.read_async(db, 0, n, stream=stream.cuda_stream)
        same = (dst == pattern(n, 9)).all()  # a kernel after the read in stream order (no sync)
        self.assertEqual(w.result(timeout=60), n)
        self.assertEqual(r.result(timeout=60), n)
        torch.cuda.synchronize()
        self.assertTrue(bool(same))
        self.assertTrue(torch.equal(dst, pattern(n, 9)))

    def test_stream_object_and_doctor(self) -> None:
        s = torch.cuda.Stream()
        t = pattern(MiB, 5)
        torch.cuda.synchronize()
        w = self.st.write_async(t, 0, MiB, stream=s)
        self.assertEqual(w.result(timeout=60), MiB)
        topics = {f.topic: f for f in ugds.doctor()}
        self.assertIn("CUDA dma-buf", topics)
        print(f"\n    doctor: [{topics['CUDA dma-buf'].verdict}] {topics['CUDA dma-buf'].detail}")


def overhead() -> None:
    """Informational (not a test): per-call cost of a 4 KiB synchronous read through the
    package, a registered host buffer and a CUDA tensor, against a file in the page cache."""
    fd, path = tempfile.mkstemp(prefix="ugds-py-ov-", dir=DIR)
    os.ftruncate(fd, 64 * MiB)
    os.close(fd)
    try:
        st = ugds.open(path)
        for name, mem in (("host", bytearray(4096)), ("cuda", torch.zeros(4096, dtype=torch.uint8, device="cuda"))):
            b = st.register(mem)
            sync()
            for _ in range(200):
                st.read(b, 0, 4096)
            best = []
            for _ in range(5):
                t0 = time.perf_counter()
                for k in range(2000):
                    st.read(b, (k % 1024) * 4096, 4096)
                best.append((time.perf_counter() - t0) / 2000 * 1e6)
            print(f"overhead: 4 KiB sync read into {name} memory: median {sorted(best)[2]:.1f} us per call (5 x 2000)")
    finally:
        os.unlink(path)


def main() -> int:
    print(f"ugds {ugds.__version__}, torch {torch.__version__}, cuda available to ugds: {ugds.cuda_available()}")
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(CudaTests)
    r = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(r.failures) + len(r.errors) + len(r.unexpectedSuccesses)
    skipped = len(r.skipped)
    try:
        overhead()
    except Exception as e:  # informational only
        print(f"overhead: not measured: {e!r}")
    print(f"UGDS-PY-CUDA passed={r.testsRun - failed - skipped} failed={failed} skipped={skipped}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

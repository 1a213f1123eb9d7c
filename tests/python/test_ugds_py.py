"""Tests of the installed `ugds` Python package (the wheel `cargo xtask wheel` builds).

Run by `cargo xtask test` (host phase) against a file, the fallback path. With UGDS_PY_TARGET
set to a ugds node (/dev/ugds_drvN) the same tests run on the direct path (its data is
overwritten). Prints `UGDS-PY passed=N failed=M skipped=K` last; skipped tests (numpy missing,
readelf missing) are not counted as passed. Nothing here depends on timing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import ctypes
import errno
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest

import ugds

try:
    import numpy as np
except ImportError:  # the tests that need it are skipped
    np = None

DIR = os.environ.get("UGDS_TEST_DIR") or tempfile.gettempdir()
TARGET = os.environ.get("UGDS_PY_TARGET")
FILE_SIZE = 16 << 20


def pattern(n: int, seed: int) -> bytes:
    """Bytes that differ per offset and per seed (so a misplaced block is caught)."""
    return bytes((i * 7 + seed * 13 + (i >> 9)) & 0xFF for i in range(n))


class Base(unittest.TestCase):
    def setUp(self) -> None:
        if TARGET:
            self.path = TARGET
        else:
            fd, self.path = tempfile.mkstemp(prefix="ugds-py-", suffix=".dat", dir=DIR)
            os.ftruncate(fd, FILE_SIZE)
            os.close(fd)
        self.st = ugds.open(self.path)
        self.bs = self.st.block_size
        self.path_key = "direct_host" if self.st.is_direct else "fallback"

    def tearDown(self) -> None:
        del self.st
        gc.collect()
        if not TARGET:
            os.unlink(self.path)


class OpenTests(Base):
    def test_open_describes_the_path(self) -> None:
        self.assertEqual(self.st.path, self.path)
        if not TARGET:
            self.assertFalse(self.st.is_direct)
            self.assertIn("fallback path", self.st.describe())
            self.assertEqual(self.st.capacity, FILE_SIZE)
        self.assertGreater(self.st.block_size, 0)
        self.assertIn(self.path, repr(self.st))

    def test_a_character_device_is_refused_naming_the_target(self) -> None:
        with self.assertRaises(ugds.NotUgdsNode) as c:
            ugds.open("/dev/null")
        e = c.exception
        self.assertEqual(e.path, "/dev/null")
        self.assertIn("character device", e.what)
        self.assertIn("ugds node", e.fix)
        self.assertEqual(e.errno, errno.ENODEV)
        self.assertIsInstance(e, ValueError)
        self.assertEqual(e.kind, "NotUgdsNode")

    def test_a_missing_path_is_an_open_error_naming_it(self) -> None:
        missing = os.path.join(DIR, "ugds-py-no-such-file")
        with self.assertRaises(ugds.OpenError) as c:
            ugds.open(missing)
        self.assertEqual(c.exception.path, missing)
        self.assertEqual(c.exception.errno, errno.ENOENT)
        self.assertIsInstance(c.exception, OSError)
        self.assertIn(missing, str(c.exception))


class IoTests(Base):
    def test_bytearray_round_trip(self) -> None:
        data = bytearray(pattern(3 * self.bs, 1))
        src = self.st.register(data)
        self.assertEqual(src.device, "cpu")
        self.assertEqual(len(src), len(data))
        self.assertEqual(self.st.write(src, 2 * self.bs, len(data)), len(data))
        out = bytearray(len(data))
        self.assertEqual(self.st.read(self.st.register(out), 2 * self.bs, len(data)), len(data))
        self.assertEqual(out, data)

    def test_buf_offset_moves_within_the_buffer(self) -> None:
        data = bytearray(pattern(4 * self.bs, 2))
        self.st.write(data, 0, self.bs, buf_offset=3 * self.bs)
        out = bytearray(2 * self.bs)
        self.st.read(out, 0, self.bs, buf_offset=self.bs)
        self.assertEqual(bytes(out[self.bs :]), bytes(data[3 * self.bs :]))
        self.assertEqual(bytes(out[: self.bs]), bytes(self.bs))

    def test_unregistered_objects_are_registered_for_the_call(self) -> None:
        data = bytearray(pattern(self.bs, 3))
        self.assertEqual(self.st.write(data, self.bs, self.bs), self.bs)
        out = bytearray(self.bs)
        self.assertEqual(self.st.read(out, self.bs, self.bs), self.bs)
        self.assertEqual(out, data)

    def test_raw_pointer_and_length(self) -> None:
        n = 2 * self.bs
        src = ctypes.create_string_buffer(pattern(n, 4), n)
        dst = ctypes.create_string_buffer(n)
        self.st.write(self.st.register_raw_unsafe(ctypes.addressof(src), n), 0, n)
        self.st.read(self.st.register_raw_unsafe(ctypes.addressof(dst), n), 0, n)
        self.assertEqual(dst.raw, src.raw)

    def test_a_raw_tuple_needs_the_unsafe_call(self) -> None:
        dst = ctypes.create_string_buffer(self.bs)
        for call in (lambda: self.st.register((ctypes.addressof(dst), self.bs)),
                     lambda: self.st.read((ctypes.addressof(dst), self.bs), 0, self.bs)):
            with self.assertRaises(ugds.InvalidArgument) as c:
                call()
            self.assertEqual(c.exception.arg, "buf")
            self.assertIn("register_raw_unsafe", c.exception.reason)

    def test_crc32_is_zlibs(self) -> None:
        import zlib

        data = pattern(100003, 12)
        self.assertEqual(ugds.crc32(data), zlib.crc32(data))
        self.assertEqual(ugds.crc32(b""), 0)
        self.assertEqual(ugds.crc32(data[5000:], ugds.crc32(data[:5000])), zlib.crc32(data))
        self.assertEqual(ugds.crc32(memoryview(bytearray(data))[7:]), zlib.crc32(data[7:]))
        with self.assertRaises(ugds.InvalidArgument) as c:
            ugds.crc32(12)
        self.assertEqual(c.exception.arg, "data")

    def test_copy_out_into_a_writable_object(self) -> None:
        buf = self.st.alloc(3 * self.bs)
        buf.copy_in(pattern(3 * self.bs, 13))
        out = bytearray(self.bs)
        buf.copy_out_into(out, self.bs)
        self.assertEqual(bytes(out), pattern(3 * self.bs, 13)[self.bs : 2 * self.bs])
        mv = memoryview(bytearray(2 * self.bs))
        buf.copy_out_into(mv[self.bs :])
        self.assertEqual(bytes(mv[self.bs :]), pattern(self.bs, 13))
        with self.assertRaises(ugds.InvalidArgument) as c:
            buf.copy_out_into(bytes(self.bs))
        self.assertEqual(c.exception.arg, "dst")
        with self.assertRaises(ugds.InvalidArgument) as c:
            buf.copy_out_into(bytearray(self.bs), 3 * self.bs)
        self.assertEqual(c.exception.arg, "buf_offset")

    def test_copies_between_a_buffer_and_its_own_bytes(self) -> None:
        bs = self.bs
        old = pattern(4 * bs, 14)
        data = bytearray(old)
        buf = self.st.register(data)
        buf.copy_in(memoryview(data)[: 2 * bs], bs)  # source and destination overlap
        self.assertEqual(bytes(data), old[:bs] + old[: 2 * bs] + old[3 * bs :])
        data[:] = old
        buf.copy_out_into(memoryview(data)[bs : 3 * bs], 0)
        self.assertEqual(bytes(data), old[:bs] + old[: 2 * bs] + old[3 * bs :])

    def test_read_bytes_and_write_bytes(self) -> None:
        data = pattern(2 * self.bs, 5)
        self.assertEqual(self.st.write_bytes(data, 4 * self.bs), len(data))
        self.assertEqual(self.st.read_bytes(4 * self.bs, len(data)), data)
        if not TARGET:
            # At the end of a file a read is short, and so is the returned bytes object.
            self.assertEqual(len(self.st.read_bytes(FILE_SIZE - self.bs, 2 * self.bs)), self.bs)

    def test_alloc_copy_in_copy_out(self) -> None:
        buf = self.st.alloc(self.bs)
        data = pattern(self.bs, 6)
        buf.copy_in(data)
        self.st.write(buf, 0, self.bs)
        buf.copy_in(bytes(self.bs))
        self.st.read(buf, 0, self.bs)
        self.assertEqual(buf.copy_out(), data)
        self.assertEqual(buf.copy_out(16, offset=8), data[8:24])

    def test_a_read_into_read_only_memory_is_refused(self) -> None:
        ro = bytes(pattern(self.bs, 7))
        self.assertEqual(self.st.write(ro, 0, self.bs), self.bs)
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.read(ro, 0, self.bs)
        self.assertEqual(c.exception.arg, "buf")
        self.assertIn("read-only", c.exception.reason)

    def test_a_registered_bytearray_cannot_be_resized(self) -> None:
        data = bytearray(self.bs)
        buf = self.st.register(data)
        with self.assertRaises(BufferError):
            data.extend(b"x")
        del buf
        gc.collect()
        data.extend(b"x")
        self.assertEqual(len(data), self.bs + 1)

    def test_a_deregistered_buffer_is_refused(self) -> None:
        buf = self.st.register(bytearray(self.bs))
        buf.deregister()
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.read(buf, 0, self.bs)
        self.assertEqual(c.exception.arg, "buf")
        self.assertIn("deregistered", c.exception.reason)

    def test_path_counts_count_each_io(self) -> None:
        before = self.st.path_counts()
        self.assertEqual(set(before), {"direct_p2p", "direct_host", "direct_staged", "fallback", "remote", "remote_staged", "bytes"})
        buf = self.st.register(bytearray(2 * self.bs))
        self.st.write(buf, 0, 2 * self.bs)
        self.st.read(buf, 0, self.bs)
        after = self.st.path_counts()
        self.assertEqual(after[self.path_key] - before[self.path_key], 2)
        self.assertEqual(after["bytes"] - before["bytes"], 3 * self.bs)
        self.assertEqual(after["direct_p2p"], before["direct_p2p"])


class FakeStorage:
    """A torch UntypedStorage's part the binding reads, over ctypes memory that a resize
    replaces (as torch reallocates a storage in place)."""

    def __init__(self, n: int) -> None:
        self.mem = (ctypes.c_ubyte * n)()

    def data_ptr(self) -> int:
        return ctypes.addressof(self.mem)

    def nbytes(self) -> int:
        return len(self.mem)


class FakeTensor:
    """A contiguous CPU uint8 torch.Tensor's part the binding reads (torch is not needed for the
    tests): ``resize_`` reallocates the storage, ``set_`` takes another tensor's storage."""

    device = type("device", (), {"type": "cpu", "index": None})()

    def __init__(self, n: int) -> None:
        self.storage, self.n = FakeStorage(n), n

    def is_contiguous(self) -> bool:
        return True

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return 1

    def data_ptr(self) -> int:
        return self.storage.data_ptr()

    def untyped_storage(self) -> FakeStorage:
        return self.storage

    def resize_(self, n: int) -> "FakeTensor":
        self.storage.mem, self.n = (ctypes.c_ubyte * n)(), n
        return self

    def set_(self, other: "FakeTensor") -> "FakeTensor":
        self.storage, self.n = other.storage, other.n
        return self


FakeTensor.__module__ = "torch.fake"  # what the binding recognises torch tensors by

try:
    import torch
except ImportError:
    torch = None


class RegisteredTensorTests(Base):
    """A registered tensor whose memory moved (resize_, set_) is refused at its next use, and
    nothing is read into or written from either the old or the new memory."""

    def tensors(self):
        yield "fake", lambda n: FakeTensor(n), lambda t: bytes(t.storage.mem)
        if torch is not None:
            yield "torch", lambda n: torch.zeros(n, dtype=torch.uint8), lambda t: t.numpy().tobytes()

    def check_refused(self, buf, old_bytes, after) -> None:
        data = pattern(self.bs, 21)
        self.st.write(data, 0, self.bs)
        for op in (lambda: self.st.read(buf, 0, self.bs), lambda: self.st.write(buf, self.bs, self.bs),
                   lambda: buf.copy_out(self.bs)):
            with self.assertRaises(ugds.RegisteredMemoryChanged) as c:
                op()
            self.assertIn("no longer has the memory", str(c.exception))
            self.assertTrue(c.exception.what)
            self.assertEqual(c.exception.errno, errno.EINVAL)
        self.assertEqual(old_bytes(), bytes(len(old_bytes())), "nothing was read into the old memory")
        self.assertEqual(after(), bytes(len(after())), "nothing was read into the new memory")
        self.assertEqual(self.st.read_bytes(self.bs, self.bs), bytes(self.bs), "nothing was written")

    def test_a_resized_tensor_is_refused(self) -> None:
        for name, make, contents in self.tensors():
            with self.subTest(name):
                t = make(2 * self.bs)
                buf = self.st.register(t)
                self.st.write(bytes(2 * self.bs), 0, 2 * self.bs)
                self.assertEqual(self.st.read(buf, 0, self.bs), self.bs)
                old = t.untyped_storage() if name == "fake" else None
                old_mem = old.mem if old is not None else None
                t.resize_(64 * self.bs)
                self.check_refused(buf, (lambda: bytes(old_mem)) if old_mem is not None else (lambda: b""),
                                   lambda: contents(t))

    def test_a_tensor_set_to_other_memory_is_refused(self) -> None:
        for name, make, contents in self.tensors():
            with self.subTest(name):
                t, other = make(2 * self.bs), make(2 * self.bs)
                buf = self.st.register(t)
                self.st.write(bytes(2 * self.bs), 0, 2 * self.bs)
                t.set_(other) if name == "fake" else t.set_(other.untyped_storage())
                self.check_refused(buf, lambda: contents(other), lambda: contents(t))

    def test_an_unchanged_tensor_keeps_working(self) -> None:
        t = FakeTensor(2 * self.bs)
        buf = self.st.register(t)
        data = pattern(2 * self.bs, 22)
        self.st.write(data, 0, len(data))
        self.assertEqual(self.st.read(buf, 0, len(data)), len(data))
        self.assertEqual(bytes(t.storage.mem), data)


@unittest.skipUnless(hasattr(os, "fork"), "no os.fork here")
class ForkTests(Base):
    """A child made by os.fork() that uses the parent's storage or buffer gets ForkedChild and
    changes nothing; it opens the target afresh and reads; the parent carries on."""

    def test_a_forked_child_is_refused_by_name_and_opens_afresh(self) -> None:
        n = 4 * self.bs
        data = pattern(n, 31)
        self.st.write(data, 0, n)
        mark = bytearray(b"\xaa" * n)
        buf = self.st.register(mark)
        self.assertEqual(self.st.read(self.st.register(bytearray(n)), 0, n), n)
        mark[:] = b"\xaa" * n
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                try:
                    self.st.read(buf, 0, n)
                    code = 11
                except ugds.ForkedChild as e:
                    if e.object != "storage" or e.errno != errno.EBADFD or "fork()" not in str(e):
                        code = 12
                if code == 0 and bytes(mark) != b"\xaa" * n:
                    code = 13
                if code == 0:
                    st2 = ugds.open(self.path)
                    mine = bytearray(n)
                    if st2.read(st2.register(mine), 0, n) != n or bytes(mine) != data:
                        code = 14
            except BaseException:
                code = 15
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0, "the child's checks (see the test)")
        self.assertEqual(bytes(mark), b"\xaa" * n, "the child's read did not reach the parent's memory")
        self.assertEqual(self.st.read(buf, 0, n), n)
        self.assertEqual(bytes(mark), data)


class DmaBufTests(Base):
    """The library's CPU stand-in "GPU" memory (memfd, exported as a real dma-buf through
    udmabuf; the hidden test hook `Storage._alloc_cpu_gpu`): on a ugds node it is registered
    peer-to-peer through the dma-buf path, on a file it is staged (the fallback path)."""

    def expected(self) -> str:
        return "direct_p2p" if self.st.is_direct else "fallback"

    def test_a_ugds_node_takes_the_direct_path(self) -> None:
        if not TARGET:
            self.skipTest("no ugds node given (UGDS_PY_TARGET)")
        self.assertTrue(self.st.is_direct, f"{TARGET}: {self.st.describe()}")
        before = self.st.path_counts()
        self.st.write_bytes(pattern(self.bs, 9), 0)
        self.assertEqual(self.st.read_bytes(0, self.bs), pattern(self.bs, 9))
        after = self.st.path_counts()
        self.assertEqual(after["direct_host"] - before["direct_host"], 2)
        self.assertEqual(after["fallback"], before["fallback"])

    def test_stand_in_gpu_memory_round_trip_and_path(self) -> None:
        n = (1 << 20) + 3 * self.bs
        src = self.st._alloc_cpu_gpu(n)
        dst = self.st._alloc_cpu_gpu(n)
        if self.st.is_direct:
            self.assertEqual(src.path, "direct (peer-to-peer)")
        else:
            self.assertTrue(src.path.startswith("fallback"), src.path)
        data = pattern(n, 10)
        src.copy_in(data)
        before = self.st.path_counts()
        self.assertEqual(self.st.write(src, 8 * self.bs, n), n)
        self.assertEqual(self.st.read(dst, 8 * self.bs, n), n)
        self.assertEqual(dst.copy_out(), data)
        after = self.st.path_counts()
        key = self.expected()
        self.assertEqual(after[key] - before[key], 2, (before, after))
        self.assertEqual(after["bytes"] - before["bytes"], 2 * n)
        for other in {"direct_p2p", "direct_host", "direct_staged", "fallback"} - {key}:
            self.assertEqual(after[other], before[other], other)

    def test_stand_in_gpu_memory_in_a_batch(self) -> None:
        n = 4 * self.bs
        buf = self.st._alloc_cpu_gpu(8 * n)
        buf.copy_in(pattern(8 * n, 11))
        before = self.st.path_counts()
        with self.st.batch(8) as b:
            b.run([("write", buf, i * n, n, i * n) for i in range(8)])
        out = self.st._alloc_cpu_gpu(8 * n)
        with self.st.batch(8) as b:
            b.run([("read", out, i * n, n, (7 - i) * n) for i in range(8)])
        got = out.copy_out()
        for i in range(8):
            self.assertEqual(got[(7 - i) * n : (8 - i) * n], pattern(8 * n, 11)[i * n : (i + 1) * n], i)
        after = self.st.path_counts()
        self.assertEqual(after[self.expected()] - before[self.expected()], 16)


class ErrorTests(Base):
    def test_an_unaligned_file_offset_names_file_offset(self) -> None:
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.read(bytearray(self.bs), 1, self.bs)
        e = c.exception
        self.assertEqual(e.arg, "file_offset")
        self.assertIn(str(self.bs), e.reason)
        self.assertEqual(e.errno, errno.EINVAL)
        self.assertEqual(e.kind, "InvalidArgument")
        self.assertIsInstance(e, ValueError)
        self.assertIsInstance(e, ugds.Error)

    def test_an_unaligned_length_names_the_library_argument(self) -> None:
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.read(bytearray(self.bs), 0, 100)
        self.assertEqual(c.exception.arg, "len")

    def test_a_range_past_the_buffer_names_buf_offset(self) -> None:
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.read(bytearray(self.bs), 0, self.bs, buf_offset=self.bs)
        self.assertEqual(c.exception.arg, "buf_offset")
        self.assertIn("runs past", c.exception.reason)

    def test_negative_numbers_name_their_argument(self) -> None:
        for kw, arg in (({"file_offset": -self.bs}, "file_offset"), ({"buf_offset": -1}, "buf_offset")):
            args = {"file_offset": 0, "nbytes": self.bs, "buf_offset": 0, **kw}
            with self.assertRaises(ugds.InvalidArgument) as c:
                self.st.read(bytearray(self.bs), **args)
            self.assertEqual(c.exception.arg, arg)

    def test_an_object_without_memory_is_refused_by_type(self) -> None:
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.register(12345)
        self.assertEqual(c.exception.arg, "buf")
        self.assertIn("int", c.exception.reason)

    def test_gpu_memory_without_cuda_says_what_to_do(self) -> None:
        if ugds.cuda_available():
            self.skipTest("CUDA is present here")

        class Fake:
            __cuda_array_interface__ = {"data": (0x10000, False), "shape": (1024,), "typestr": "|u1", "version": 3}

        with self.assertRaises(ugds.Unsupported) as c:
            self.st.register(Fake())
        self.assertEqual(c.exception.what, "CUDA")
        self.assertTrue(c.exception.fix)


@unittest.skipIf(np is None, "numpy is not installed")
class NumpyTests(Base):
    def test_numpy_round_trip(self) -> None:
        a = np.arange(self.bs // 2, dtype=np.float32)
        self.st.write(a, 0, a.nbytes)
        b = np.zeros_like(a)
        buf = self.st.register(b)
        self.assertEqual(buf.nbytes, a.nbytes)
        self.st.read(buf, 0, a.nbytes)
        self.assertTrue((a == b).all())

    def test_a_non_contiguous_array_is_refused(self) -> None:
        a = np.zeros(4 * self.bs, dtype=np.uint8)[::2]
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.register(a)
        self.assertEqual(c.exception.arg, "buf")
        self.assertIn("non-contiguous", c.exception.reason)

    def test_dlpack_only_objects(self) -> None:
        a = np.arange(self.bs, dtype=np.uint8)

        class OnlyDlpack:
            def __init__(self, arr):
                self.arr = arr

            def __dlpack__(self, stream=None):
                return self.arr.__dlpack__()

            def __dlpack_device__(self):
                return self.arr.__dlpack_device__()

        self.st.write(OnlyDlpack(a), 0, self.bs)
        b = np.zeros_like(a)
        buf = self.st.register(OnlyDlpack(b))
        self.assertIn("DLPack", repr(buf))
        self.st.read(buf, 0, self.bs)
        self.assertTrue((a == b).all())


class BatchTests(Base):
    def test_futures_complete_and_an_invalid_entry_fails_alone(self) -> None:
        data = bytearray(pattern(4 * self.bs, 8))
        src = self.st.register(data)
        b = self.st.batch(8)
        for k in range(4):
            b.write(src, k * self.bs, self.bs, k * self.bs)
        futs = b.submit()
        self.assertEqual(len(futs), 4)
        done, not_done = cf.wait(futs, timeout=60)
        self.assertEqual((len(done), len(not_done)), (4, 0))
        self.assertEqual([f.result() for f in futs], [self.bs] * 4)
        out = bytearray(4 * self.bs)
        dst = self.st.register(out)
        good = [b.read(dst, k * self.bs, self.bs, k * self.bs) for k in range(4)]
        bad = b.read(dst, 1, self.bs)
        self.assertFalse(bad.cancel(), "an entry handed to the SSD cannot be cancelled")
        b.submit()
        self.assertEqual([f.result(timeout=60) for f in good], [self.bs] * 4)
        with self.assertRaises(ugds.InvalidArgument) as c:
            bad.result(timeout=60)
        self.assertEqual(c.exception.arg, "file_offset")
        self.assertEqual(out, data)
        b.close()
        self.assertEqual(b.in_flight, 0)

    def test_asyncio_form(self) -> None:
        data = pattern(2 * self.bs, 9)
        self.st.write_bytes(data, 0)
        out = bytearray(2 * self.bs)

        async def main():
            b = self.st.batch(4)
            b.read(out, 0, self.bs)
            b.read(out, self.bs, self.bs, self.bs)
            first = await b.submit_async()
            b.read(out, 0, 100)
            with self.assertRaises(ugds.InvalidArgument):
                await b.submit_async()
            return first

        self.assertEqual(asyncio.run(main()), [self.bs, self.bs])
        self.assertEqual(bytes(out), data)

    def test_run_waits_for_every_entry_without_futures(self) -> None:
        data = bytearray(pattern(3 * self.bs, 11))
        b = self.st.batch(4)
        self.assertEqual(b.run([("write", data, k * self.bs, self.bs, k * self.bs) for k in range(3)]), [self.bs] * 3)
        out = bytearray(3 * self.bs)
        with self.assertRaises(ugds.InvalidArgument) as c:
            b.run([("read", out, 0, self.bs), ("read", out, 1, self.bs, self.bs), ("read", out, 2 * self.bs, self.bs, 2 * self.bs)])
        self.assertEqual(c.exception.arg, "file_offset")
        # The valid entries ran (the invalid one failed alone) before run() raised.
        self.assertEqual(bytes(out[: self.bs]), bytes(data[: self.bs]))
        self.assertEqual(bytes(out[2 * self.bs :]), bytes(data[2 * self.bs :]))
        self.assertEqual(b.in_flight, 0)
        for bad in ([("copy", out, 0, self.bs)], [("read", out)], [42]):
            with self.assertRaises(ugds.InvalidArgument) as c:
                b.run(bad)
            self.assertEqual(c.exception.arg, "entries")
        self.assertEqual(b.run([]), [])

    def test_more_entries_than_capacity_submit_nothing(self) -> None:
        b = ugds.Batch(self.st, 2)
        buf = self.st.register(bytearray(3 * self.bs))
        for k in range(3):
            b.read(buf, 0, self.bs, k * self.bs)
        with self.assertRaises(ugds.InvalidArgument) as c:
            b.submit()
        self.assertEqual(c.exception.arg, "reqs")
        self.assertEqual(b.in_flight, 0)


class StreamTests(Base):
    def test_cpu_stream_orders_io_after_earlier_work(self) -> None:
        s = ugds.CpuStream()
        buf = self.st.alloc(self.bs)
        data = pattern(self.bs, 10)
        # Stream order: the fill runs first, then the write, then the read back.
        s.launch(lambda: buf.copy_in(data))
        w = self.st.write_async(buf, 0, self.bs, stream=s)
        s.launch(lambda: buf.copy_in(bytes(self.bs)))
        r = self.st.read_async(buf, 0, self.bs, stream=s)
        self.assertEqual(w.result(timeout=60), self.bs)
        self.assertEqual(r.result(timeout=60), self.bs)
        s.synchronize()
        self.assertTrue(r.done())
        self.assertEqual(buf.copy_out(), data)

    def test_waiting_releases_the_gil(self) -> None:
        # The stream's first job needs the GIL; result() can only see the read finish if it
        # released the GIL while waiting. (A wait holding the GIL would time out.)
        s = ugds.CpuStream()
        gate = threading.Event()
        s.launch(lambda: gate.set())
        r = self.st.read_async(bytearray(self.bs), 0, self.bs, stream=s)
        self.assertEqual(r.result(timeout=60), self.bs)
        self.assertTrue(gate.is_set())

    def test_dropping_a_stream_with_work_that_needs_the_gil_does_not_hang(self) -> None:
        # Dropping a stream waits for its queued work; that work may need the GIL (a launched
        # function, or a completion waking an asyncio loop), so the drop must wait without it.
        # In a child process, so a hang fails this test instead of stopping the suite.
        code = (
            "import time, ugds\n"
            "s = ugds.CpuStream()\n"
            "s.launch(lambda: time.sleep(0.3))\n"
            "s.launch(lambda: None)\n"
            "del s\n"
            "print('dropped')\n"
        )
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            self.fail("dropping a CpuStream with queued Python work hung")
        self.assertEqual(r.stdout.strip(), "dropped", r.stderr)

    def test_invalid_stream_io_is_refused_at_the_call(self) -> None:
        s = ugds.CpuStream()
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.read_async(bytearray(self.bs), 0, 100, stream=s)
        self.assertEqual(c.exception.arg, "nbytes")
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.read_async(bytearray(self.bs), 0, self.bs, stream="not a stream")
        self.assertEqual(c.exception.arg, "stream")


class CloseTests(Base):
    def test_close_releases_and_later_calls_raise_closed(self) -> None:
        buf = self.st.register(bytearray(pattern(self.bs, 21)))
        b = self.st.batch(4)
        self.assertEqual(self.st.write(buf, 0, self.bs), self.bs)
        self.assertFalse(self.st.closed)
        self.st.close()
        self.assertTrue(self.st.closed)
        self.st.close()  # twice is fine
        for call in (
            lambda: self.st.read(buf, 0, self.bs),
            lambda: self.st.read_bytes(0, self.bs),
            lambda: self.st.alloc(self.bs),
            lambda: self.st.register(bytearray(self.bs)),
            lambda: self.st.capacity,
            lambda: self.st.batch(2),
            lambda: b.read(bytearray(self.bs), 0, self.bs),
            lambda: b.run([("read", bytearray(self.bs), 0, self.bs)]),
        ):
            with self.assertRaises(ugds.Closed) as c:
                call()
            self.assertIsInstance(c.exception, ValueError)
            self.assertEqual(c.exception.object, "storage")
            self.assertIn(self.path, str(c.exception))
        # Its registrations are released: the buffer is deregistered.
        with self.assertRaises(ugds.InvalidArgument):
            buf.copy_out()
        self.assertIn("closed", repr(self.st))

    def test_the_with_block_closes(self) -> None:
        with ugds.open(self.path) as st:
            self.assertEqual(st.write_bytes(bytes(self.bs), 0), self.bs)
            buf = st.alloc(self.bs)
        self.assertTrue(st.closed)
        with self.assertRaises(ugds.Closed):
            st.read(buf, 0, self.bs)
        with self.assertRaises(ugds.InvalidArgument):
            buf.copy_out()

    def test_close_waits_for_submitted_batch_entries(self) -> None:
        data = bytearray(pattern(4 * self.bs, 22))
        b = self.st.batch(8)
        futs = [b.write(data, k * self.bs, self.bs, k * self.bs) for k in range(4)]
        b.submit()
        self.st.close()
        self.assertTrue(all(f.done() for f in futs))
        self.assertEqual([f.result() for f in futs], [self.bs] * 4)
        with ugds.open(self.path) as st:
            self.assertEqual(st.read_bytes(0, 4 * self.bs), bytes(data))


class AsyncIoFutureTests(Base):
    def queued(self, seed: int):
        s = ugds.CpuStream()
        data = pattern(self.bs, seed)
        self.st.write_bytes(data, 0)
        out = bytearray(self.bs)
        return s, data, out, self.st.read_async(out, 0, self.bs, stream=s)

    def test_await_gives_the_bytes_moved(self) -> None:
        async def main():
            s, data, out, io = self.queued(23)
            n = await io
            return n, bytes(out), data

        n, got, data = asyncio.run(main())
        self.assertEqual((n, got), (self.bs, data))

    def test_future_works_with_concurrent_futures(self) -> None:
        ios = [self.queued(24 + k)[3] for k in range(3)]
        futs = [io.future() for io in ios]
        self.assertTrue(all(isinstance(f, cf.Future) for f in futs))
        done, not_done = cf.wait(futs, timeout=60)
        self.assertEqual((len(done), len(not_done)), (3, 0))
        self.assertEqual(sorted(f.result() for f in cf.as_completed(futs, timeout=60)), [self.bs] * 3)
        # Asked for after the operation is over: already done, the same result.
        self.assertEqual(ios[0].future().result(timeout=0), self.bs)
        self.assertIs(ios[0].future(), futs[0])
        self.assertEqual(ios[0].get(), self.bs)

    def test_it_has_a_futures_methods(self) -> None:
        # Queued behind a job that waits on the gate: pending until the gate opens.
        s = ugds.CpuStream()
        gate = threading.Event()
        s.launch(lambda: gate.wait(60))
        io = self.st.read_async(bytearray(self.bs), 0, self.bs, stream=s)
        calls: list = []
        called = threading.Event()

        def record(f) -> None:
            calls.append(f)
            called.set()

        try:
            io.add_done_callback(record)
            self.assertEqual(calls, [])
            self.assertTrue(io.running())
            self.assertFalse(io.cancel())  # queued I/O cannot be recalled
            self.assertFalse(io.cancelled())
            with self.assertRaises(TimeoutError):
                io.exception(timeout=0)
        finally:
            gate.set()  # also when a check failed: the stream's drop waits for the gate's job
        self.assertTrue(called.wait(60))
        self.assertEqual(io.result(timeout=60), self.bs)
        self.assertIsNone(io.exception())
        self.assertFalse(io.running())
        self.assertFalse(io.cancel())
        # Added after the end: called at once, in this thread; the first one is not called again.
        late: list = []
        io.add_done_callback(late.append)
        s.synchronize()
        self.assertEqual(len(calls), 1)
        self.assertIs(calls[0], io)
        self.assertEqual(len(late), 1)
        self.assertIs(late[0], io)
        # An operation over before anything asked for its future: the same.
        done = self.st.pread(bytearray(self.bs), self.bs)
        self.assertEqual(done.result(timeout=60), self.bs)
        done.add_done_callback(late.append)
        self.assertIs(late[1], done)
        # A callback's exception is logged (as concurrent.futures logs one), not raised.
        with self.assertLogs("concurrent.futures", "ERROR"):
            done.add_done_callback(lambda f: 1 / 0)

    def test_exception_gives_a_failed_operations_error(self) -> None:
        # Far past the end (a read there only comes back short on a file): aligned, so accepted
        # at the call; refused when the stream runs it (EFBIG on a file, the range on a node).
        s = ugds.CpuStream()
        io = self.st.write_async(bytearray(self.bs), 1 << 62, self.bs, stream=s)
        e = io.exception(timeout=60)
        self.assertIsInstance(e, ugds.IoError)
        self.assertTrue(e.errno)
        self.assertIs(io.exception(), e)
        with self.assertRaises(ugds.IoError) as c:
            io.result()
        self.assertIs(c.exception, e)
        self.assertFalse(io.cancelled())


class KvikioStyleTests(Base):
    def test_pwrite_and_pread_return_futures(self) -> None:
        data = bytearray(pattern(2 * self.bs, 25))
        f = self.st.pwrite(data)
        self.assertEqual(f.get(), 2 * self.bs)
        self.assertTrue(f.done())
        out = bytearray(2 * self.bs)
        f = self.st.pread(out, self.bs, file_offset=self.bs)
        self.assertEqual(f.get(), self.bs)
        self.assertEqual(bytes(out[: self.bs]), bytes(data[self.bs :]))
        # kvikio's fourth argument is task_size, not a buffer offset: nothing moves in the buffer.
        out1 = bytearray(2 * self.bs)
        self.assertEqual(self.st.pread(out1, self.bs, 0, 1 << 20).get(), self.bs)
        self.assertEqual(bytes(out1[: self.bs]), bytes(data[: self.bs]))
        self.assertEqual(self.st.pread(out1, self.bs, 0, buf_offset=self.bs).get(), self.bs)
        self.assertEqual(bytes(out1[self.bs :]), bytes(data[: self.bs]))
        out2 = bytearray(2 * self.bs)
        f = self.st.pread(out2)  # size=None: the whole buffer, from file offset 0
        self.assertIsInstance(f.future(), cf.Future)
        self.assertEqual(f.future().result(timeout=60), 2 * self.bs)
        self.assertEqual(out2, data)

        async def main():
            return await self.st.pread(bytearray(self.bs), self.bs)

        self.assertEqual(asyncio.run(main()), self.bs)

    def test_invalid_arguments_are_refused_at_the_call(self) -> None:
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.pread(bytearray(self.bs), self.bs, file_offset=1)
        self.assertEqual(c.exception.arg, "file_offset")
        with self.assertRaises(ugds.InvalidArgument) as c:
            self.st.pwrite(bytearray(self.bs), 2 * self.bs)
        self.assertEqual(c.exception.arg, "buf_offset")


class HabitsTests(unittest.TestCase):
    def test_star_import_does_not_shadow_open(self) -> None:
        ns: dict = {}
        exec("from ugds import *", ns)
        self.assertNotIn("open", ns)
        self.assertIn("Storage", ns)
        self.assertIn("Closed", ns)
        self.assertTrue(callable(ugds.open))
        self.assertNotIn("open", ugds.__all__)

    def test_sizes_are_parsed_by_the_library(self) -> None:
        from ugds import __main__ as cli

        self.assertEqual([ugds.parse_size(s) for s in ("4096", "4K", "16m", " 1G ")], [4096, 4096, 16 << 20, 1 << 30])
        with self.assertRaises(ugds.InvalidArgument):
            ugds.parse_size("1T")
        self.assertEqual(cli.size("64K"), 64 << 10)
        # The Python half has no parser of its own (the library's says "bad size").
        import argparse

        with self.assertRaises(argparse.ArgumentTypeError) as c:
            cli.size("1X")
        self.assertIn("bad size", str(c.exception))

    def test_library_notices_go_to_the_ugds_logger(self) -> None:
        with self.assertLogs("ugds", level="WARNING") as logs:
            ugds._ugds._notice_for_tests("a test notice")
        self.assertEqual([r.getMessage() for r in logs.records], ["a test notice"])
        self.assertEqual(logs.records[0].name, "ugds")

    def test_a_fallback_notice_of_the_library_reaches_the_ugds_logger(self) -> None:
        # The library's own notice, not the test hook's: procfs refuses O_DIRECT, so a file of it
        # is opened buffered, which the library notes once (tmpfs takes O_DIRECT since 6.6).
        path = "/proc/version"
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
            self.skipTest(f"{path} takes O_DIRECT here: no fallback to note")
        except OSError:
            pass
        with self.assertLogs("ugds", level="WARNING") as logs:
            ugds.open(path).close()
            ugds.open(path).close()
        msgs = [r.getMessage() for r in logs.records]
        self.assertEqual(len(msgs), 1, msgs)
        self.assertTrue(msgs[0].startswith(f"{path}: using buffered I/O: "), msgs)
        self.assertEqual((logs.records[0].name, logs.records[0].levelname), ("ugds", "WARNING"))


class PlacementTests(unittest.TestCase):
    """`ugds.nearest` on a fake sysfs: socket 0 has a switch with a GPU and an SSD below it and
    an SSD on another root port, socket 1 an SSD; /dev/null (1:3), /dev/zero (1:5) and
    /dev/full (1:7) stand in for ugds nodes, their dev/char links naming the far, the near and
    the root-port SSD."""

    GPU = "0000:03:00.0"

    def setUp(self) -> None:
        self.sys = tempfile.mkdtemp(prefix="ugds-py-sys-", dir=DIR)
        fns = [
            ("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", "0x030200", 0),
            ("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", "0x010802", 0),
            ("pci0000:00/0000:00:02.0/0000:05:00.0", "0x010802", 0),
            ("pci0000:40/0000:40:01.0/0000:41:00.0", "0x010802", 1),
        ]
        devices = os.path.join(self.sys, "bus/pci/devices")
        os.makedirs(devices)
        for path, cls, numa in fns:
            d = os.path.join(self.sys, "devices", path)
            os.makedirs(d)
            for name, value in (("class", cls), ("numa_node", numa)):
                with open(os.path.join(d, name), "w") as f:
                    f.write(f"{value}\n")
            os.symlink(d, os.path.join(devices, path.rsplit("/", 1)[1]))
        for dev, ssd in (("1:3", "0000:41:00.0"), ("1:5", "0000:04:00.0"), ("1:7", "0000:05:00.0")):
            d = os.path.join(self.sys, "dev/char", dev)
            os.makedirs(d)
            os.symlink(os.path.join(devices, ssd), os.path.join(d, "device"))

    def tearDown(self) -> None:
        import shutil

        shutil.rmtree(self.sys)

    def test_a_volumes_members_come_nearest_first(self) -> None:
        got = ugds.nearest("stripe:/dev/null,/dev/full,/dev/zero", gpu=self.GPU, sys=self.sys)
        self.assertEqual([p.node for p in got], ["/dev/zero", "/dev/full", "/dev/null"])
        self.assertEqual([p.ssd for p in got], ["0000:04:00.0", "0000:05:00.0", "0000:41:00.0"])
        self.assertEqual([p.proximity for p in got], ["same_switch", "same_root_complex", "cross_socket"])
        self.assertIsInstance(got[0], ugds.Placement)
        self.assertEqual((got[0].gpu, got[0].gpu_numa, got[0].ssd_numa, got[0].warning), (self.GPU, 0, 0, None))
        self.assertEqual((got[2].ssd_numa, got[2].gpu_numa), (1, 0))
        self.assertIn("inter-socket", got[2].warning)
        # The GPU by its index in PCI order (a string, as the CLI's --gpu takes it).
        self.assertEqual(ugds.nearest("stripe:/dev/null,/dev/zero", gpu="0", sys=self.sys)[0].node, "/dev/zero")

    def test_no_target_means_every_bound_controller(self) -> None:
        self.assertEqual(ugds.nearest(gpu=self.GPU, sys=self.sys), [])
        os.makedirs(os.path.join(self.sys, "class/ugds_drv/ugds_drv7"))
        with self.assertRaises(ugds.errors.OpenError) as e:
            ugds.nearest(gpu=self.GPU, sys=self.sys)
        self.assertIn("/dev/ugds_drv7", str(e.exception))

    def test_bad_arguments_are_refused_by_name(self) -> None:
        with self.assertRaises(ugds.errors.InvalidArgument) as e:
            ugds.nearest("/dev/null", gpu=self.GPU, sys=self.sys)
        self.assertEqual(e.exception.arg, "volume")
        with self.assertRaises(ugds.errors.InvalidArgument) as e:
            ugds.nearest("stripe:/dev/null", gpu="0000:99:00.0", sys=self.sys)
        self.assertEqual(e.exception.arg, "gpu")
        with self.assertRaises(TypeError):
            ugds.nearest("stripe:/dev/null", gpu=object(), sys=self.sys)
        with self.assertRaises(ValueError):
            ugds.nearest("stripe:/dev/null", gpu="cpu", sys=self.sys)

    def test_devices_and_tensors_name_their_cuda_ordinal(self) -> None:
        class Dev:
            def __init__(self, type: str, index):  # noqa: A002 (torch.device's names)
                self.type, self.index = type, index

        class Tensor:
            def __init__(self, device) -> None:
                self.device = device

        arg = ugds._gpu_arg
        self.assertEqual([arg(None), arg(2), arg("cuda"), arg("cuda:3")], [None, 2, None, 3])
        self.assertEqual([arg(Dev("cuda", 1)), arg(Dev("cuda", None)), arg(Tensor(Dev("cuda", 4)))], [1, None, 4])
        self.assertEqual(arg(Tensor("cuda:5")), 5)
        with self.assertRaises(ValueError):
            arg(Tensor(Dev("cpu", None)))
        if not ugds.cuda_available():
            # The calling thread's GPU needs CUDA.
            with self.assertRaises(ugds.errors.Unsupported):
                ugds.nearest("stripe:/dev/null", sys=self.sys)


def python_m_ugds(*args: str) -> subprocess.CompletedProcess:
    """``python -m ugds ARGS``, its output as text."""
    return subprocess.run([sys.executable, "-m", "ugds", *args], capture_output=True, text=True, timeout=120)


class PackageTests(unittest.TestCase):
    def setUp(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="ugds-py-cli-", dir=DIR)
        os.ftruncate(fd, 1 << 20)
        os.close(fd)

    def tearDown(self) -> None:
        os.unlink(self.path)

    def test_doctor_returns_findings_as_data(self) -> None:
        f = ugds.doctor()
        self.assertTrue(f)
        self.assertTrue(all(isinstance(x, ugds.Finding) for x in f))
        self.assertTrue({x.verdict for x in f} <= {"ok", "warn", "no", "info"})
        self.assertIn("kernel", [x.topic for x in f])

    def test_python_m_ugds_mirrors_the_cli(self) -> None:
        path, run = self.path, python_m_ugds
        info = run("info", path, "--json")
        self.assertEqual(info.returncode, 0, info.stderr)
        j = json.loads(info.stdout)
        self.assertEqual((j["path"], j["capacity"]), ("fallback", 1 << 20))
        doc = run("doctor", "--json")
        verdicts = [json.loads(line)["verdict"] for line in doc.stdout.splitlines()]
        # As the CLI's: 1 when a finding rules the direct path out, else 0.
        self.assertEqual(doc.returncode, 1 if "no" in verdicts else 0, doc.stderr)
        bench = run("bench", path, "--runtime", "0.2", "--bs", "4K", "--json")
        self.assertEqual(bench.returncode, 0, bench.stderr)
        self.assertGreater(json.loads(bench.stdout)["ios"], 0)
        bad = run("info", "/dev/null")
        self.assertEqual(bad.returncode, 1)
        self.assertIn("/dev/null", bad.stderr)

    def test_python_m_ugds_bench_takes_fios_options(self) -> None:
        run = lambda *a: python_m_ugds("bench", self.path, "--runtime", "0.2", "--json", *a)  # noqa: E731
        r = run("--rw", "randrw", "--rwmixread", "70", "--bs", "8K", "--iodepth", "4", "--numjobs", "2", "--size", "256K")
        self.assertEqual(r.returncode, 0, r.stderr)
        j = json.loads(r.stdout)
        self.assertEqual(
            (j["rw"], j["bs"], j["iodepth"], j["numjobs"], j["size"], j["rwmixread"]),
            ("randrw", 8192, 4, 2, 256 << 10, 70),
        )
        self.assertGreater(j["read"]["ios"], 0)
        self.assertGreater(j["write"]["ios"], 0)
        self.assertEqual(j["read"]["ios"] + j["write"]["ios"], j["ios"])
        for k in ("min_us", "avg_us", "max_us", "p50_us", "p90_us", "p99_us", "p99_9_us", "p99_99_us"):
            self.assertIn(k, j)
        for rw, direction in (("read", "read"), ("write", "write"), ("randread", "read"), ("randwrite", "write")):
            r = run("--rw", rw, "--size", "64K")
            self.assertEqual(r.returncode, 0, r.stderr)
            j = json.loads(r.stdout)
            self.assertGreater(j[direction]["ios"], 0, rw)
            self.assertIsNone(j["write" if direction == "read" else "read"], rw)
        # A region past the target's end, an I/O size that is no block multiple and the former
        # `--rw mix` (now randrw): refused.
        self.assertEqual(run("--size", "2M").returncode, 2)
        self.assertEqual(run("--bs", "100").returncode, 2)
        self.assertEqual(run("--rw", "mix").returncode, 2)

    def test_the_wheel_links_neither_cuda_nor_libpython(self) -> None:
        so = ugds._ugds.__file__
        self.assertTrue(so.endswith(".abi3.so"), so)
        try:
            out = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            self.skipTest("readelf is not installed")
        needed = [line for line in out.splitlines() if "NEEDED" in line]
        self.assertTrue(needed)
        self.assertFalse([n for n in needed if "cuda" in n or "python" in n], needed)

    def test_the_package_ships_type_stubs(self) -> None:
        d = os.path.dirname(ugds.__file__)
        self.assertTrue(os.path.exists(os.path.join(d, "_ugds.pyi")))
        self.assertTrue(os.path.exists(os.path.join(d, "py.typed")))


if __name__ == "__main__":
    from ugds_test_runner import run

    sys.exit(run(__name__))

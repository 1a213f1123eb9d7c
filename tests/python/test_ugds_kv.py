"""Tests of ``ugds.kv`` (the persistent object store) and ``ugds.lmcache.UgdsConnector`` (driven
the way LMCache's NativeConnectorL2Adapter drives a native connector), on the installed wheel,
against files. Run by `cargo xtask test` beside test_ugds_py.py; prints
`UGDS-PY passed=N failed=M skipped=K` last. Nothing here depends on timing: the crash test kills
the writer after a number of acknowledgements, whenever they come.

With UGDS_KV_TARGET set to a ugds node (/dev/ugds_drvN; the VM suite does this) every test runs
on it instead, on the direct path (its data is overwritten): each test formats a store of the
test's size at its start, and `test_io_takes_the_expected_path` checks the path counts.
"""

from __future__ import annotations

import hashlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import unittest

import ugds
import ugds.kv as kv
from ugds.lmcache import UgdsConnector

DIR = os.environ.get("UGDS_TEST_DIR") or tempfile.gettempdir()
TARGET = os.environ.get("UGDS_KV_TARGET")
MiB = 1 << 20


def value(key: bytes, n: int) -> bytes:
    """The content every test (and the crash writer) stores under `key`: checkable from the key."""
    seed = hashlib.sha256(key).digest()
    return (seed * (n // len(seed) + 1))[:n]


class Base(unittest.TestCase):
    size = 64 * MiB

    def setUp(self) -> None:
        if TARGET:
            # A fresh store of the test's size at the start of the node (what a new file is).
            self.path = TARGET
            kv.open(self.path, create=True, capacity=self.size)
        else:
            fd, self.path = tempfile.mkstemp(prefix="ugds-kv-", suffix=".dat", dir=DIR)
            os.ftruncate(fd, self.size)
            os.close(fd)

    def tearDown(self) -> None:
        if not TARGET:
            os.unlink(self.path)

    def store(self, **kw) -> kv.Store:
        if TARGET:
            kw.setdefault("capacity", self.size)
        return kv.open(self.path, **kw)

    def poke(self, off: int, data: bytes) -> None:
        """Overwrites bytes of the target behind the store's back (through ugds: the same on a
        file and on a ugds node), as a write cut short would leave them."""
        st = ugds.open(self.path)
        bs = st.block_size
        start, end = off // bs * bs, -(-(off + len(data)) // bs) * bs
        old = bytearray(st.read_bytes(start, end - start))
        old[off - start : off - start + len(data)] = data
        st.write_bytes(bytes(old), start)
        st.flush()


class StoreTests(Base):
    def test_set_get_exists_delete(self) -> None:
        s = self.store()
        items = [(b"k%d" % i, value(b"k%d" % i, n)) for i, n in enumerate([0, 1, 4095, 4096, 4097, 300 * 1024])]
        s.set_many(items)
        s.set("text-key", b"str keys are utf-8")
        self.assertEqual(s.get_many([k for k, _ in items]), [v for _, v in items])
        self.assertEqual(s.get(b"text-key"), b"str keys are utf-8")
        self.assertEqual(s.exists_many([b"k1", b"nope"]), [True, False])
        self.assertEqual(s.delete_many([b"k1", b"nope", b"k1"]), [True, False, True])
        self.assertIsNone(s.get(b"k1"))
        self.assertEqual(len(s), len(items))

    def test_objects_survive_reopening_with_and_without_close(self) -> None:
        s = self.store()
        s.set_many([(b"a%d" % i, value(b"a%d" % i, 10000 + i)) for i in range(50)])
        s.delete(b"a7")
        del s  # no close: the journal is replayed
        s = self.store()
        self.assertGreater(s.stats().replayed, 0)
        self.assertIsNone(s.get(b"a7"))
        for i in (0, 8, 49):
            self.assertEqual(s.get(b"a%d" % i), value(b"a%d" % i, 10000 + i))
        s.close()  # a checkpoint: nothing to replay next time
        s = self.store()
        self.assertEqual((s.stats().replayed, len(s)), (0, 49))

    def test_an_overwrite_replaces_and_frees_the_old_extent(self) -> None:
        s = self.store()
        s.set(b"x", value(b"x", MiB))
        free = s.stats().free_bytes
        s.set(b"x", b"short")
        self.assertEqual(s.get(b"x"), b"short")
        self.assertEqual(s.stats().free_bytes, free + MiB - 4096)

    def test_lru_eviction_keeps_recently_used_objects(self) -> None:
        s = self.store()
        data_bytes = s.stats().free_bytes
        n = data_bytes // (4 * MiB)
        keys = [b"e%d" % i for i in range(n)]
        for k in keys:
            s.set(k, value(k, 4 * MiB))
        s.get(keys[0])  # now the most recently used
        s.set(b"new", value(b"new", 4 * MiB))
        self.assertTrue(s.exists(keys[0]))
        self.assertFalse(s.exists(keys[1]), "the least recently used object goes first")
        self.assertEqual(s.stats().evictions, 1)
        self.assertEqual(s.get(b"new"), value(b"new", 4 * MiB))
        del s
        s = self.store()
        self.assertFalse(s.exists(keys[1]), "the eviction was journaled")

    def test_a_full_store_without_eviction_raises_and_writes_nothing(self) -> None:
        s = self.store(eviction="error")
        free = s.stats().free_bytes
        s.set(b"a", value(b"a", free - 8 * MiB))
        before = s.stats()
        with self.assertRaises(ugds.StoreFull) as c:
            s.set_many([(b"b", b"1" * MiB), (b"c", b"2" * (16 * MiB))])
        self.assertEqual(c.exception.what, "data region")
        self.assertEqual(c.exception.need, 16 * MiB)
        self.assertEqual(s.stats(), before)
        self.assertFalse(s.exists(b"b"))

    def test_bad_keys_and_values_are_refused_by_name(self) -> None:
        s = self.store()
        for bad in (b"", b"k" * (kv.MAX_KEY + 1)):
            with self.assertRaises(ugds.InvalidArgument) as c:
                s.set(bad, b"v")
            self.assertEqual(c.exception.arg, "key")
        with self.assertRaises(ugds.InvalidArgument) as c:
            s.set(b"huge", b"\0" * self.size)
        self.assertEqual(c.exception.arg, "value")
        self.assertEqual(len(s), 0)

    def test_a_torn_value_reads_as_missing(self) -> None:
        s = self.store()
        s.set_many([(b"ok", value(b"ok", 8192)), (b"torn", value(b"torn", 8192))])
        e = s.index[b"torn"]
        self.poke(e.offset + 4096, b"\xff" * 4096)  # a write that did not finish: half old, half garbage
        outs = [bytearray(8192), bytearray(8192)]
        self.assertEqual(s.get_many_into([b"ok", b"torn"], outs), [True, False])
        self.assertEqual(bytes(outs[0]), value(b"ok", 8192))
        self.assertIsNone(s.get(b"torn"))
        self.assertEqual(s.stats().torn, 1)
        self.assertEqual(s.get(b"ok"), value(b"ok", 8192))
        del s
        self.assertFalse(self.store().exists(b"torn"))

    def test_a_torn_journal_record_loses_only_its_batch(self) -> None:
        s = self.store()
        s.set(b"first", b"1" * 100)
        jpos = s.jpos
        s.set_many([(b"second", b"2" * 100), (b"third", b"3" * 100)])
        self.poke(s.layout["journal_off"] + jpos + 40, b"\0" * 16)  # the record's payload half-written
        del s
        s = self.store()
        self.assertEqual(s.get(b"first"), b"1" * 100)
        self.assertEqual(s.exists_many([b"second", b"third"]), [False, False])

    def test_io_takes_the_expected_path(self) -> None:
        s = self.store()
        st = s.st
        key = "direct_host" if st.is_direct else "fallback"
        if TARGET:
            self.assertTrue(st.is_direct, f"{TARGET}: {st.describe()}")
        before = st.path_counts()
        s.set_many([(b"p%d" % i, value(b"p%d" % i, 100000)) for i in range(4)])
        self.assertEqual(s.get_many([b"p0", b"p3"]), [value(b"p0", 100000), value(b"p3", 100000)])
        after = st.path_counts()
        # 4 values + 1 journal record written, 2 values read.
        self.assertGreaterEqual(after[key] - before[key], 7, (before, after))
        for other in {"direct_p2p", "direct_host", "direct_staged", "fallback"} - {key}:
            self.assertEqual(after[other], before[other], other)

    def test_reads_beside_overwrites_and_evictions_return_only_whole_values(self) -> None:
        # Reads run outside the store's lock: while a writer overwrites, deletes and (the store
        # being small) evicts, so extents are reused under them, every value read is one that
        # was written under that key, whole, or missing.
        import threading

        s = self.store(create=True, capacity=16 * MiB)  # about 13 MiB of data: 24 keys of 1 MiB evict
        keys = [b"r%d" % i for i in range(24)]
        n = MiB

        def val(k: bytes, ver: int) -> bytes:
            return ver.to_bytes(8, "little") + value(k + b"/%d" % ver, n - 8)

        def whole(k: bytes, v: bytes) -> bool:
            return v == val(k, int.from_bytes(v[:8], "little"))

        s.set_many([(k, val(k, 0)) for k in keys[:8]])
        bad, reads, stop = [], [0], threading.Event()

        def reader(seed: int) -> None:
            outs = [bytearray(n) for _ in range(4)]
            i = seed
            while not stop.is_set():
                ks = [keys[(i + j * 5) % len(keys)] for j in range(4)]
                i += 1
                if i % 2:
                    for k, v in zip(ks, s.get_many(ks)):
                        if v is not None and not whole(k, v):
                            bad.append(k)
                else:
                    for k, o, ok in zip(ks, outs, s.get_many_into(ks, outs)):
                        if ok and not whole(k, bytes(o)):
                            bad.append(k)
                reads[0] += 4

        ts = [threading.Thread(target=reader, args=(t,)) for t in range(3)]
        for t in ts:
            t.start()
        try:
            for ver in range(1, 40):
                k = keys[(ver * 7) % len(keys)]
                s.set(k, val(k, ver))
                if ver % 5 == 0:
                    s.delete(keys[ver % len(keys)])
        finally:
            stop.set()
            for t in ts:
                t.join()
        self.assertEqual(bad, [])
        self.assertGreater(reads[0], 0)
        self.assertGreater(s.stats().evictions, 0, "the store was meant to evict")
        self.assertEqual(s.stats().torn, 0)

    def test_reformatting_forgets_the_old_store(self) -> None:
        s = self.store()
        s.set(b"old", b"o" * 10)
        del s
        s = self.store(create=True)
        self.assertEqual(len(s), 0)
        del s
        self.assertEqual(len(self.store()), 0, "the old journal is not replayed into the new store")

    def test_kill_9_keeps_every_acknowledged_object(self) -> None:
        writer = textwrap.dedent(
            f"""
            import hashlib, sys, ugds.kv as kv
            def value(key, n):
                seed = hashlib.sha256(key).digest()
                return (seed * (n // len(seed) + 1))[:n]
            s = kv.open({self.path!r}, durable=False)
            i = 0
            while True:
                batch = [(b"c%d" % (i + j), value(b"c%d" % (i + j), 20000 + 997 * ((i + j) % 50))) for j in range(4)]
                s.set_many(batch)
                print("ACK", i + 3, flush=True)
                i += 4
            """
        )
        p = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
        acked = -1
        assert p.stdout is not None
        for line in p.stdout:
            acked = int(line.split()[1])
            if acked >= 400:
                break
        p.send_signal(signal.SIGKILL)
        p.wait()
        self.assertGreaterEqual(acked, 400)
        s = self.store()
        keys = [b"c%d" % i for i in range(acked + 1)]
        got = s.get_many(keys)
        missing = [k for k, v in zip(keys, got) if v is None]
        self.assertEqual(missing, [], "acknowledged objects lost")
        for k, v in zip(keys, got):
            self.assertEqual(v, value(k, 20000 + 997 * (int(k[1:]) % 50)), k)
        # Objects past the last acknowledgement are complete or absent, never torn.
        extra = [k for k in s.keys() if int(k[1:]) > acked]
        for k, v in zip(extra, s.get_many(extra)):
            self.assertIn(v, (None, value(k, 20000 + 997 * (int(k[1:]) % 50))))


class ConnectorTests(Base):
    size = 32 * MiB

    def drain(self, c: UgdsConnector, n: int):
        """Waits on the eventfd (as the adapter's demux thread does) until n batches are done."""
        done = []
        while len(done) < n:
            r, _, _ = select.select([c.event_fd()], [], [], 60)
            self.assertTrue(r, "the eventfd never became readable")
            done += c.drain_completions()
        return {fid: (ok, err, res) for fid, ok, err, res in done}

    def test_the_protocol_as_lmcache_drives_it(self) -> None:
        c = UgdsConnector(path=self.path, num_workers=2)
        chunk = 256 * 1024
        keys = ["chunk-%d" % i for i in range(6)]
        vals = [bytearray(value(k.encode(), chunk)) for k in keys]
        fs = c.submit_batch_set(keys, [memoryview(v) for v in vals])
        self.assertEqual(self.drain(c, 1)[fs], (True, "", [True] * 6))
        self.assertEqual(c.drain_completions(), [], "one completion per batch")
        outs = [bytearray(chunk) for _ in range(6)] + [bytearray(chunk), bytearray(100)]
        fg = c.submit_batch_get(keys + ["absent", "chunk-0"], [memoryview(o) for o in outs])
        fe = c.submit_batch_exists(["chunk-1", "absent"])
        fd = c.submit_batch_delete(["chunk-2", "absent"])
        done = self.drain(c, 3)
        self.assertEqual(done[fg], (True, "", [True] * 6 + [False, False]))  # absent; wrong size
        self.assertEqual(outs[:6], vals)
        self.assertEqual(done[fe], (True, "", [True, False]))
        self.assertEqual(done[fd], (True, "", [True, False]))
        c.close()
        c.close()
        with self.assertRaises(RuntimeError):
            c.submit_batch_exists(["x"])
        c2 = UgdsConnector(path=self.path)
        self.assertEqual(c2.store.st.is_direct, bool(TARGET))
        fe = c2.submit_batch_exists(keys)
        self.assertEqual(self.drain(c2, 1)[fe][2], [True, True, False, True, True, True])
        c2.close()

    def test_a_failed_set_is_reported_in_its_completion(self) -> None:
        c = UgdsConnector(path=self.path, eviction="error")
        big = bytearray(64 * MiB)
        fs = c.submit_batch_set(["too-big"], [memoryview(big)])
        ok, err, _ = self.drain(c, 1)[fs]
        self.assertFalse(ok)
        self.assertIn("InvalidArgument", err)
        c.close()

    def test_unknown_parameters_are_refused(self) -> None:
        with self.assertRaises(TypeError):
            UgdsConnector(path=self.path, bogus=1)


if __name__ == "__main__":
    from ugds_test_runner import run

    sys.exit(run(__name__))

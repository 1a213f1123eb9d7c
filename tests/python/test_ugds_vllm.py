"""Tests of ``ugds.vllm`` (the vLLM KV offloading spec) against vLLM's own offloading interfaces,
on the installed wheel, against files (the fallback path). `cargo xtask test` runs it in its own
virtual environment (target/vllm-env: vLLM installed without its dependencies, Debian's CPU
build of torch, see xtask/src/wheel.rs) with UGDS_VLLM_REQUIRE set to the vLLM version it
installed, so a vLLM that cannot be imported fails here instead of being skipped; then a second
time with UGDS_VLLM_SHIM=1 (the stand-in classes a GPU machine without vLLM uses: the tests that
need vLLM itself are skipped there). "GPU" tensors are CPU tensors on this machine; prints
`UGDS-PY passed=N failed=M skipped=K` last.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import unittest

import ugds.vllm as uv
from ugds.vllm import ConfigError, GPULoadStoreSpec, LayoutError, UgdsOffloadingSpec

try:
    import torch
except ImportError:  # the shim run on a machine without torch: numpy arrays stand in
    torch = None
import numpy as np

DIR = os.environ.get("UGDS_TEST_DIR") or tempfile.gettempdir()
REQUIRE = os.environ.get("UGDS_VLLM_REQUIRE")
SHIM = os.environ.get("UGDS_VLLM_SHIM") == "1"
MiB = 1 << 20
PAGES = (8192, 4096)  # two KV tensors: bytes of one block's page in each


def _parallel_state_stand_in() -> None:
    """vLLM's factory logs its out-of-tree warning with ``warning_once(scope="local")``, which
    imports ``vllm.distributed.parallel_state`` to ask whether this is the first local rank; that
    module needs torch.distributed of torch >= 2 (vLLM 0.33 pins torch 2.14), newer than the CPU
    build of torch this environment has (Debian's 1.13). Where it cannot be imported, a module
    with the two answers a single process gives (it is rank 0) stands in for it; every other
    line of the factory is vLLM's."""
    if not uv.VLLM:
        return
    try:
        import vllm.distributed.parallel_state  # noqa: F401
    except ImportError as e:
        import types

        m = types.ModuleType("vllm.distributed.parallel_state")
        m.is_local_first_rank = m.is_global_first_rank = lambda: True
        sys.modules[m.__name__] = m
        print(f"vllm.distributed.parallel_state cannot be imported here ({e}): a single-rank stand-in answers the logger")


_parallel_state_stand_in()


def need_vllm(f):
    return unittest.skipUnless(uv.VLLM, "vLLM's classes are not in use (UGDS_VLLM_SHIM=1 or vLLM absent)")(f)


def config(extra, *, kv_bytes=sum(PAGES), bpc=2, rank=0, world=1, events=False):
    """An OffloadingConfig as vLLM's build_offloading_config makes it."""
    return uv.OffloadingConfig(
        groups=(uv.OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0", "l1"), group_id=0),),
        worker_kv_bytes_per_block=kv_bytes,
        enable_kv_cache_events=events,
        extra_config=dict(extra),
        engine_id="test-engine",
        model=uv.OffloadingModelConfig(name="test-model", dtype="float16"),
        cache=uv.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=bpc),
        parallel=uv.OffloadingParallelConfig(
            rank=rank,
            world_size=world,
            tp_size=world,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def kv_tensors(num_blocks=16, pages=PAGES, seed=1):
    """vLLM's CanonicalKVCaches: one (num_blocks, page) int8 tensor per page size, random
    content, one KV group whose layers use both."""
    rng = np.random.default_rng(seed)
    ts = []
    for p in pages:
        a = rng.integers(-128, 128, size=(num_blocks, p), dtype=np.int8)
        ts.append(torch.from_numpy(a) if torch is not None else a)
    return uv.CanonicalKVCaches(
        tensors=[uv.CanonicalKVCacheTensor(tensor=t, page_size_bytes=p) for t, p in zip(ts, pages)],
        group_data_refs=[[uv.CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=p) for i, p in enumerate(pages)]],
    )


def raw(t) -> bytes:
    return (t.numpy() if torch is not None else t).tobytes()


def page(t, b) -> bytes:
    return raw(t[b])


def zero(kv) -> None:
    for k in kv.tensors:
        k.tensor[:] = 0


def key(i: int) -> bytes:
    return i.to_bytes(8, "big") + (0).to_bytes(4, "big")  # vLLM's make_offload_key(hash, group 0)


def ctx(req="r"):
    return uv.ReqContext(req_id=req)


class Base(unittest.TestCase):
    size = 4 * MiB

    def setUp(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="ugds-vllm-", suffix=".dat", dir=DIR)
        os.ftruncate(fd, self.size)
        os.close(fd)
        self.extra = {"spec_name": "UgdsOffloadingSpec", "spec_module_path": "ugds.vllm", "ugds_target": self.path}
        self.workers = []

    def tearDown(self) -> None:
        for w in self.workers:
            w.shutdown()
        os.unlink(self.path)

    def spec(self, **extra):
        cfg = config({**self.extra, **extra})
        if uv.VLLM:  # made exactly as vLLM makes it
            from vllm.v1.kv_offload.factory import OffloadingSpecFactory

            return OffloadingSpecFactory.create_spec(cfg)
        return UgdsOffloadingSpec(cfg)

    def worker(self, spec, kv):
        w = spec.get_worker(kv)
        self.workers.append(w)
        return w

    def finish(self, w, job_ids):
        w.wait(set(job_ids))
        res = {r.job_id: r for r in w.get_finished()}
        self.assertEqual(set(res), set(job_ids))
        return res

    def store(self, spec, w, keys, blocks, block_index=0, job=1):
        m = spec.get_manager()
        out = m.prepare_store(keys, ctx())
        self.assertIsNotNone(out)
        w.submit_store(job, GPULoadStoreSpec(blocks, [len(blocks)], [block_index]), out.store_spec)
        r = self.finish(w, [job])[job]
        m.complete_store(out.keys_to_store, ctx(), success=r.success)
        return r, out

    def load(self, spec, w, keys, blocks, block_index=0, job=2, expedited=False):
        m = spec.get_manager()
        src = m.prepare_load(keys, ctx())
        w.submit_load(job, src, GPULoadStoreSpec(blocks, [len(blocks)], [block_index]), expedited=expedited)
        r = self.finish(w, [job])[job]
        m.complete_load(keys, ctx())
        return r


class Environment(unittest.TestCase):
    def test_vllm_is_the_one_required(self) -> None:
        if SHIM:
            self.assertFalse(uv.VLLM)
            return
        if REQUIRE:
            import vllm

            self.assertTrue(uv.VLLM, "UGDS_VLLM_REQUIRE is set but vLLM's offloading classes did not import")
            self.assertEqual(vllm.__version__, REQUIRE)

    def test_import_ugds_does_not_import_vllm(self) -> None:
        code = "import sys, ugds, ugds.kv; assert 'vllm' not in sys.modules and 'ugds.vllm' not in sys.modules, sorted(sys.modules)"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=DIR)

    def test_the_module_imports_without_vllm(self) -> None:
        code = (
            "import sys; sys.modules['vllm'] = None\n"  # `import vllm` raises ImportError
            "import ugds.vllm as uv; assert not uv.VLLM; print(uv.UgdsOffloadingSpec.__mro__[1].__module__)"
        )
        out = subprocess.run([sys.executable, "-c", code], check=True, cwd=DIR, capture_output=True, text=True)
        self.assertEqual(out.stdout.strip(), "ugds.vllm._shim")


class Factory(Base):
    @need_vllm
    def test_vllm_factory_loads_the_spec_by_module_path(self) -> None:
        from vllm.v1.kv_offload.base import OffloadingSpec
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory

        self.assertNotIn("UgdsOffloadingSpec", OffloadingSpecFactory._registry)
        cls = OffloadingSpecFactory.get_spec_cls(self.extra)
        self.assertIs(cls, UgdsOffloadingSpec)
        self.assertTrue(issubclass(cls, OffloadingSpec))
        spec = OffloadingSpecFactory.create_spec(config(self.extra))
        self.assertIsInstance(spec, UgdsOffloadingSpec)
        self.assertEqual(spec.blocks_per_chunk, 2)
        self.assertEqual(spec.placement.num_slots, self.size // 24576)  # 2 blocks x (8192 + 4096)
        with self.assertRaisesRegex(ValueError, "Unsupported spec type"):
            OffloadingSpecFactory.get_spec_cls({"spec_name": "UgdsOffloadingSpec"})

    @need_vllm
    def test_a_bad_config_fails_vllms_factory_by_name(self) -> None:
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory

        extra = dict(self.extra)
        del extra["ugds_target"]
        with self.assertRaises(ConfigError) as e:
            OffloadingSpecFactory.create_spec(config(extra))
        self.assertEqual(e.exception.key, "ugds_target")

    @need_vllm
    def test_the_classes_are_vllms(self) -> None:
        from vllm.v1.kv_offload import base

        self.assertTrue(issubclass(uv.UgdsOffloadingManager, base.OffloadingManager))
        self.assertTrue(issubclass(uv.UgdsOffloadingWorker, base.OffloadingWorker))
        self.assertTrue(issubclass(uv.UgdsLoadStoreSpec, base.BlockIDsLoadStoreSpec))
        self.assertIs(uv.GPULoadStoreSpec, base.GPULoadStoreSpec)


class Transfers(Base):
    def test_store_then_load_round_trips_the_bytes(self) -> None:
        spec = self.spec()
        kv = kv_tensors()
        w = self.worker(spec, kv)
        orig = [raw(k.tensor) for k in kv.tensors]
        src = [5, 1, 2, 7, 3, 4]  # 6 GPU blocks = 3 chunks of 2
        keys = [key(i) for i in range(3)]
        r, out = self.store(spec, w, keys, src)
        self.assertTrue(r.success)
        self.assertEqual(r.transfer_size, 6 * sum(PAGES))
        self.assertEqual(out.keys_to_store, keys)
        m = spec.get_manager()
        self.assertEqual([m.lookup(k, ctx()) for k in keys], [uv._api.LookupResult.HIT] * 3)
        zero(kv)
        dst = [9, 10, 11, 12, 13, 14]
        r = self.load(spec, w, keys, dst)
        self.assertTrue(r.success)
        for t, o in zip(kv.tensors, orig):
            p = t.page_size_bytes
            for s, d in zip(src, dst):
                self.assertEqual(page(t.tensor, d), o[s * p : (s + 1) * p], f"block {s} -> {d}")
            self.assertEqual(page(t.tensor, 0), bytes(p), "a block no load names stays zero")

    def test_the_bytes_sit_where_the_placement_says(self) -> None:
        spec = self.spec()
        kv = kv_tensors()
        w = self.worker(spec, kv)
        r, out = self.store(spec, w, [key(1)], [3, 8])
        self.assertTrue(r.success)
        slot = out.store_spec.slots[0]
        base = spec.placement.base(slot, 0)
        with open(self.path, "rb") as f:
            f.seek(base)
            data = f.read(spec.placement.rank_bytes)
        t0, t1 = (k.tensor for k in kv.tensors)
        expect = page(t0, 3) + page(t0, 8) + page(t1, 3) + page(t1, 8)
        self.assertEqual(data[: len(expect)], expect)

    def test_a_partial_first_chunk_and_expedited_load(self) -> None:
        spec = self.spec()
        kv = kv_tensors()
        w = self.worker(spec, kv)
        orig = [raw(k.tensor) for k in kv.tensors]
        # Blocks 1..3 of a request (block index 1): the first chunk holds only its second block.
        keys = [key(10), key(11)]
        r, _ = self.store(spec, w, keys, [6, 2, 0], block_index=1)
        self.assertTrue(r.success)
        zero(kv)
        r = self.load(spec, w, keys, [15, 14, 13], block_index=1, expedited=True)
        self.assertTrue(r.success)
        for t, o in zip(kv.tensors, orig):
            p = t.page_size_bytes
            for s, d in zip([6, 2, 0], [15, 14, 13]):
                self.assertEqual(page(t.tensor, d), o[s * p : (s + 1) * p])

    def test_sync_queue_mode_round_trips_too(self) -> None:
        spec = self.spec(ugds_queue_mode="sync", ugds_queue_depth=1)
        kv = kv_tensors()
        w = self.worker(spec, kv)
        orig = [raw(k.tensor) for k in kv.tensors]
        self.assertTrue(self.store(spec, w, [key(1), key(2)], [0, 1, 2, 3])[0].success)
        zero(kv)
        self.assertTrue(self.load(spec, w, [key(1), key(2)], [0, 1, 2, 3]).success)
        self.assertEqual([raw(k.tensor)[: 4 * k.page_size_bytes] for k in kv.tensors], [o[: 4 * p] for o, p in zip(orig, PAGES)])

    def test_two_ranks_use_their_own_part_of_each_slot(self) -> None:
        specs = [UgdsOffloadingSpec(config(self.extra, rank=r, world=2)) for r in (0, 1)]
        kvs = [kv_tensors(seed=r + 5) for r in (0, 1)]
        ws = [self.worker(s, k) for s, k in zip(specs, kvs)]
        self.assertEqual(specs[0].placement.slot_bytes, 2 * specs[0].placement.rank_bytes)
        slot = uv.UgdsLoadStoreSpec([3])
        for j, (w, k) in enumerate(zip(ws, kvs)):
            w.submit_store(j, GPULoadStoreSpec([4, 5], [2], [0]), slot)
            self.assertTrue(self.finish(w, [j])[j].success)
        origs = [[raw(t.tensor) for t in k.tensors] for k in kvs]
        for j, (w, k) in enumerate(zip(ws, kvs)):
            zero(k)
            w.submit_load(10 + j, slot, GPULoadStoreSpec([4, 5], [2], [0]))
            self.assertTrue(self.finish(w, [10 + j])[10 + j].success)
            self.assertEqual([raw(t.tensor) [4 * PAGES[i] : 6 * PAGES[i]] for i, t in enumerate(k.tensors)],
                             [o[4 * PAGES[i] : 6 * PAGES[i]] for i, o in enumerate(origs[j])])

    def test_the_path_is_reported_and_logged(self) -> None:
        spec = self.spec()
        with self.assertLogs("ugds.vllm", level="INFO") as logs:
            w = self.worker(spec, kv_tensors())
        self.assertEqual(w.path, "fallback (io_uring + staging)")
        self.assertEqual(w.paths, [w.path, w.path])
        self.assertEqual(w.registrations, 2)
        self.assertTrue(any(w.path in line for line in logs.output), logs.output)
        before = w.storage.path_counts()["fallback"]
        self.store(spec, w, [key(1)], [0, 1])
        self.assertGreater(w.storage.path_counts()["fallback"], before)

    def test_wait_on_unknown_jobs_returns_and_results_stay_for_get_finished(self) -> None:
        spec = self.spec()
        w = self.worker(spec, kv_tensors())
        w.wait({12345})
        out = spec.get_manager().prepare_store([key(1)], ctx())
        w.submit_store(7, GPULoadStoreSpec([0, 1], [1 + 1], [0]), out.store_spec)
        w.wait({7})
        w.wait({7})
        self.assertEqual([(r.job_id, r.success) for r in w.get_finished()], [(7, True)])
        self.assertEqual(w.get_finished(), [])


class Failures(Base):
    def test_a_read_past_the_end_is_a_failed_job_and_the_worker_goes_on(self) -> None:
        spec = self.spec()
        kv = kv_tensors()
        w = self.worker(spec, kv)
        last = spec.placement.num_slots - 1
        far = uv.UgdsLoadStoreSpec([last])
        w.submit_store(1, GPULoadStoreSpec([0, 1], [2], [0]), far)
        self.assertTrue(self.finish(w, [1])[1].success)
        os.truncate(self.path, spec.placement.base(last, 0))  # the target shrinks under the worker
        with self.assertLogs("ugds.vllm", level="ERROR"):
            self.assertTrue(w.submit_load(2, far, GPULoadStoreSpec([2, 3], [2], [0])))
            r = self.finish(w, [2])[2]
        self.assertFalse(r.success)
        self.assertEqual(r.transfer_size, 0)
        # The worker still works: slot 0 lies within what is left.
        w.submit_store(3, GPULoadStoreSpec([4, 5], [2], [0]), uv.UgdsLoadStoreSpec([0]))
        w.submit_load(4, uv.UgdsLoadStoreSpec([0]), GPULoadStoreSpec([6, 7], [2], [0]))
        res = self.finish(w, [3, 4])
        self.assertTrue(res[3].success and res[4].success)

    def test_a_write_past_a_too_small_target_is_a_failed_job(self) -> None:
        spec = self.spec()
        kv = kv_tensors()
        w = self.worker(spec, kv)
        with self.assertLogs("ugds.vllm", level="ERROR"):
            w.submit_store(1, GPULoadStoreSpec([0, 1], [2], [0]), uv.UgdsLoadStoreSpec([spec.placement.num_slots]))
            w.submit_store(2, GPULoadStoreSpec([0, 1, 2], [3], [0]), uv.UgdsLoadStoreSpec([0]))  # 3 blocks, 1 slot
            res = self.finish(w, [1, 2])
        self.assertFalse(res[1].success)
        self.assertFalse(res[2].success)

    def test_a_failed_store_frees_its_slots_in_the_manager(self) -> None:
        spec = self.spec()
        m = spec.get_manager()
        free = m.num_free
        out = m.prepare_store([key(1), key(2)], ctx())
        self.assertEqual(m.num_free, free - 2)
        m.complete_store(out.keys_to_store, ctx(), success=False)
        self.assertEqual(m.lookup(key(1), ctx()), uv._api.LookupResult.MISS)
        self.assertEqual(m.num_free, free)


class BadConfig(Base):
    def expect(self, key, **extra):
        with self.assertRaises(ConfigError) as e:
            self.spec(**extra)
        self.assertEqual(e.exception.key, key)
        self.assertIn(key, str(e.exception))
        return e.exception

    def test_a_missing_target(self) -> None:
        del self.extra["ugds_target"]
        self.expect("ugds_target")

    def test_a_target_that_cannot_be_opened(self) -> None:
        self.expect("ugds_target", ugds_target="/proc/version/nope")

    def test_a_capacity_too_small_for_one_chunk(self) -> None:
        e = self.expect("ugds_capacity", ugds_capacity=8192)
        self.assertIn("too small", e.reason)

    def test_an_offset_past_the_end(self) -> None:
        self.expect("ugds_offset", ugds_offset=8 * MiB)

    def test_a_capacity_beyond_a_files_end_grows_the_file(self) -> None:
        spec = self.spec(ugds_capacity="8M")
        self.assertEqual(os.path.getsize(self.path), 8 * MiB)
        self.assertEqual(spec.placement.num_slots, 8 * MiB // 24576)

    def test_bad_keys(self) -> None:
        self.expect("ugds_queue_mode", ugds_queue_mode="fast")
        self.expect("ugds_gpu_direct", ugds_gpu_direct="maybe")
        self.expect("ugds_offset", ugds_offset=100)
        self.expect("ugds_capacity", ugds_capacity="lots")
        self.expect("ugds_tagret", ugds_tagret=self.path)

    def test_mismatched_block_layouts(self) -> None:
        spec = self.spec()
        with self.assertRaises(LayoutError) as e:  # the tensors need more than the spec laid out
            spec.get_worker(kv_tensors(pages=(8192, 8192)))
        self.assertEqual(e.exception.key, "worker_kv_bytes_per_block")
        spec = UgdsOffloadingSpec(config(self.extra, kv_bytes=8192 + 1000))
        with self.assertRaises(LayoutError) as e:  # a page that is no multiple of the block size
            spec.get_worker(kv_tensors(pages=(8192, 1000)))
        self.assertEqual(e.exception.key, "page_size_bytes")
        with self.assertRaises(LayoutError) as e:
            UgdsOffloadingSpec(config(self.extra, kv_bytes=0))
        self.assertEqual(e.exception.key, "worker_kv_bytes_per_block")


class Manager(Base):
    """The OffloadingManager contract (vllm/v1/kv_offload/base.py) on a manager of 4 slots."""

    size = 4 * 24576

    def setUp(self) -> None:
        super().setUp()
        self.m = self.spec().get_manager()
        self.assertEqual(self.m.num_slots, 4)
        self.L = uv._api.LookupResult

    def stored(self, *ids):
        out = self.m.prepare_store([key(i) for i in ids], ctx())
        self.m.complete_store(out.keys_to_store, ctx())
        return out

    def test_lookup_follows_store_states(self) -> None:
        m, L = self.m, self.L
        self.assertEqual(m.lookup(key(1), ctx()), L.MISS)
        out = m.prepare_store([key(1)], ctx())
        self.assertEqual(m.lookup(key(1), ctx()), L.HIT_PENDING)
        m.complete_store(out.keys_to_store, ctx())
        self.assertEqual(m.lookup(key(1), ctx()), L.HIT)

    def test_stored_keys_are_not_stored_again(self) -> None:
        self.stored(1, 2)
        out = self.m.prepare_store([key(1), key(3)], ctx())
        self.assertEqual(out.keys_to_store, [key(3)])
        self.assertEqual(len(out.store_spec.slots), 1)
        self.assertEqual(out.evicted_keys, [])

    def test_distinct_slots_and_lru_eviction(self) -> None:
        out = self.stored(1, 2, 3, 4)
        self.assertEqual(sorted(out.store_spec.slots), [0, 1, 2, 3])
        self.m.touch([key(1)], ctx())  # 1 is now the most recent: 2 is the least
        out = self.m.prepare_store([key(5)], ctx())
        self.assertEqual(out.evicted_keys, [key(2)])
        self.assertEqual(self.m.lookup(key(2), ctx()), self.L.MISS)
        self.assertEqual(self.m.lookup(key(1), ctx()), self.L.HIT)

    def test_pinned_pending_and_own_keys_are_never_evicted(self) -> None:
        self.stored(1, 2, 3)
        self.m.prepare_load([key(1)], ctx())  # pinned
        self.m.prepare_store([key(4)], ctx())  # pending; fills the last slot
        out = self.m.prepare_store([key(2), key(5)], ctx())  # 2 is its own: only 3 may go
        self.assertEqual(out.evicted_keys, [key(3)])
        self.assertEqual(self.m.prepare_store([key(6)], ctx()).evicted_keys, [key(2)], "the one ready, unpinned key")
        self.assertIsNone(self.m.prepare_store([key(7)], ctx()), "every slot is pinned or pending")
        self.assertEqual(self.m.lookup(key(1), ctx()), self.L.HIT, "a refused store changes nothing")
        self.assertEqual(self.m.lookup(key(7), ctx()), self.L.MISS)
        self.m.complete_load([key(1)], ctx())
        self.assertEqual(self.m.prepare_store([key(7)], ctx()).evicted_keys, [key(1)])

    def test_prepare_load_pins_until_complete_load(self) -> None:
        self.stored(1, 2, 3, 4)
        spec = self.m.prepare_load([key(1), key(2), key(3), key(4)], ctx())
        self.assertEqual(sorted(spec.slots), [0, 1, 2, 3])
        self.assertIsNone(self.m.prepare_store([key(9)], ctx()))
        self.m.complete_load([key(3)], ctx())
        self.assertEqual(self.m.prepare_store([key(9)], ctx()).evicted_keys, [key(3)])

    def test_events_when_enabled(self) -> None:
        spec = UgdsOffloadingSpec(config(self.extra, events=True))
        m = spec.get_manager()
        out = m.prepare_store([key(i) for i in range(4)], ctx())
        m.complete_store(out.keys_to_store, ctx())
        m.prepare_store([key(9)], ctx())
        ev = list(m.take_events())
        self.assertEqual([(e.removed, len(e.keys)) for e in ev], [(False, 4), (True, 1)])
        self.assertEqual(ev[0].medium, uv._api.Medium.STORAGE)
        self.assertEqual(list(m.take_events()), [])

    def test_the_store_spec_crosses_a_process_boundary(self) -> None:
        # vLLM sends the scheduler's specs to its workers in the connector's metadata.
        import pickle

        out = self.m.prepare_store([key(1), key(2)], ctx())
        back = pickle.loads(pickle.dumps(out.store_spec))
        self.assertIsInstance(back, uv.UgdsLoadStoreSpec)
        self.assertEqual(back.slots, out.store_spec.slots)

    def test_reset_cache_forgets_everything(self) -> None:
        self.stored(1, 2)
        self.m.reset_cache()
        self.assertEqual(self.m.lookup(key(1), ctx()), self.L.MISS)
        self.assertEqual(self.m.num_free, 4)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    from ugds_test_runner import run

    sys.exit(run(__name__))

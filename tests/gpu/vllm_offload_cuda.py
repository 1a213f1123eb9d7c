"""``ugds.vllm`` (the vLLM KV offloading spec) with CUDA KV cache tensors, on the GPU machine
(tests/gpu/run.sh's `vllm` step, after `pip install` of the wheel in target/gpu/ugds-wheel).

vLLM cannot be installed there, so ``ugds.vllm`` runs on its stand-ins for vLLM's classes
(``ugds.vllm.VLLM`` is False; the spec, manager and worker are the same code vLLM loads): this
script builds what vLLM would hand over (an ``OffloadingConfig``, ``CanonicalKVCaches`` of CUDA
int8 tensors shaped (num_blocks, page_bytes), ``GPULoadStoreSpec`` jobs) and drives the
worker's interface as vLLM's OffloadingConnectorWorker does (submit_store / submit_load /
wait / get_finished), against a file (the fallback path: that machine has no NVMe). Checks:
round trips of whole and partial chunks, a packed (non-contiguous) layout, a store submitted
right after the kernel that writes its blocks (no synchronize: the worker waits for the stream),
an expedited load, a failed job, ``ugds_gpu_direct: require`` on a file, the path reported.
First throughput of stores and loads of 1 GiB in jobs of 16 chunks (informational).
Prints `UGDS-PY passed=N failed=M skipped=K` last.

Usage: python3 tests/gpu/vllm_offload_cuda.py [DIR]   (DIR holds the target file; default /tmp)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import unittest

import torch

import ugds
import ugds.vllm as uv
from ugds.vllm import GPULoadStoreSpec, UgdsLoadStoreSpec

DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("UGDS_TEST_DIR", "/tmp")
MiB = 1 << 20
PAGES = (64 * 1024, 32 * 1024)  # bytes per block of two KV tensors (e.g. two layer groups)
BPC = 4  # blocks per chunk (vLLM's blocks_per_chunk, or block_size / the GPU block size)


def config(extra, kv_bytes, bpc=BPC):
    return uv.OffloadingConfig(
        groups=(uv.OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=kv_bytes,
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id="gpu-test",
        model=uv.OffloadingModelConfig(name="none", dtype="float16"),
        cache=uv.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=bpc),
        parallel=uv.OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def caches(tensors, pages):
    return uv.CanonicalKVCaches(
        tensors=[uv.CanonicalKVCacheTensor(tensor=t, page_size_bytes=p) for t, p in zip(tensors, pages)],
        group_data_refs=[[uv.CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=p) for i, p in enumerate(pages)]],
    )


def random_kv(num_blocks, pages=PAGES, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randint(-128, 128, (num_blocks, p), dtype=torch.int8, device="cuda", generator=g) for p in pages]


def run_jobs(w, jobs):
    """Submits (kind, job_id, src, dst[, expedited]) jobs, waits, returns {job_id: result}."""
    for j in jobs:
        kind, jid, src, dst = j[:4]
        if kind == "store":
            assert w.submit_store(jid, src, dst)
        else:
            assert w.submit_load(jid, src, dst, expedited=len(j) > 4 and j[4])
    w.wait({j[1] for j in jobs})
    return {r.job_id: r for r in w.get_finished()}


class VllmCuda(unittest.TestCase):
    def setUp(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="ugds-vllm-", suffix=".dat", dir=DIR)
        os.close(fd)
        self.extra = {"spec_name": "UgdsOffloadingSpec", "spec_module_path": "ugds.vllm",
                      "ugds_target": self.path, "ugds_capacity": 256 * MiB}
        self.workers = []

    def tearDown(self) -> None:
        for w in self.workers:
            w.shutdown()
        os.unlink(self.path)

    def worker(self, tensors, pages=PAGES, **extra):
        spec = uv.UgdsOffloadingSpec(config({**self.extra, **extra}, sum(pages)))
        w = spec.get_worker(caches(tensors, pages))
        self.workers.append(w)
        return spec, w

    def test_round_trip_of_whole_and_partial_chunks(self) -> None:
        kv = random_kv(64)
        spec, w = self.worker(kv)
        print(f"  path: {w.path}; vLLM's classes: {uv.VLLM}")
        self.assertEqual(w.registrations, 2)
        self.assertIn(w.path.split(" ")[0], ("direct", "fallback", "remote"))
        orig = [t.clone() for t in kv]
        src = list(range(40, 8, -3))  # 11 blocks from block index 2: chunks of 2, 4, 4, 1
        m = spec.get_manager()
        keys = [bytes([i]) * 8 for i in range(4)]
        out = m.prepare_store(keys, uv.ReqContext("r"))
        res = run_jobs(w, [("store", 1, GPULoadStoreSpec(src, [len(src)], [2]), out.store_spec)])
        self.assertTrue(res[1].success)
        m.complete_store(keys, uv.ReqContext("r"))
        for t in kv:
            t.zero_()
        dst = list(range(50, 61))
        res = run_jobs(w, [("load", 2, m.prepare_load(keys, uv.ReqContext("r")), GPULoadStoreSpec(dst, [len(dst)], [2]))])
        self.assertTrue(res[2].success)
        for t, o in zip(kv, orig):
            self.assertTrue(torch.equal(t[dst], o[src]))
            self.assertEqual(int(t[:50].abs().sum()), 0)

    def test_a_packed_layout(self) -> None:
        # Two layers interleaved per block in one allocation: each layer's tensor has stride
        # 2 pages, as vLLM's packed layouts give it (stride(0) > page_size_bytes).
        page = 32 * 1024
        whole = torch.randint(-128, 128, (32, 2, page), dtype=torch.int8, device="cuda")
        layers = [whole[:, 0, :], whole[:, 1, :]]
        self.assertFalse(layers[0].is_contiguous())
        _, w = self.worker(layers, pages=(page, page))
        self.assertEqual(w.registrations, 1, "both layers live in one allocation")
        orig = whole.clone()
        res = run_jobs(w, [("store", 1, GPULoadStoreSpec([1, 2, 3, 4], [4], [0]), UgdsLoadStoreSpec([5]))])
        self.assertTrue(res[1].success)
        whole.zero_()
        res = run_jobs(w, [("load", 2, UgdsLoadStoreSpec([5]), GPULoadStoreSpec([9, 10, 11, 12], [4], [0]))])
        self.assertTrue(res[2].success)
        self.assertTrue(torch.equal(whole[9:13], orig[1:5]))
        self.assertEqual(int(whole[:9].abs().sum()), 0)

    def test_a_store_waits_for_the_kernel_that_writes_its_blocks(self) -> None:
        kv = random_kv(16)
        _, w = self.worker(kv)
        a = torch.randn(4096, 4096, device="cuda")
        torch.cuda.synchronize()
        for _ in range(20):  # a long kernel queue on the current stream ahead of the fill
            a = a @ a
            a = a / a.norm()
        for t in kv:
            t[0:4].fill_(7)  # queued after the matrix work; no synchronize before the submit
        res = run_jobs(w, [("store", 1, GPULoadStoreSpec([0, 1, 2, 3], [4], [0]), UgdsLoadStoreSpec([0]))])
        self.assertTrue(res[1].success)
        res = run_jobs(w, [("load", 2, UgdsLoadStoreSpec([0]), GPULoadStoreSpec([8, 9, 10, 11], [4], [0]), True)])
        self.assertTrue(res[2].success)
        for t in kv:
            self.assertTrue(bool((t[8:12] == 7).all()), "the store read the blocks before the kernel wrote them")

    def test_a_failed_job_is_reported_and_the_worker_goes_on(self) -> None:
        kv = random_kv(16)
        spec, w = self.worker(kv)
        bad = UgdsLoadStoreSpec([spec.placement.num_slots])  # past the target's end
        res = run_jobs(w, [("store", 1, GPULoadStoreSpec([0, 1, 2, 3], [4], [0]), bad),
                           ("store", 2, GPULoadStoreSpec([0, 1, 2, 3], [4], [0]), UgdsLoadStoreSpec([1]))])
        self.assertFalse(res[1].success)
        self.assertTrue(res[2].success)

    def test_gpu_direct_required_on_a_file(self) -> None:
        kv = random_kv(8)
        # A file stages GPU memory through host memory: 'require' refuses it by name.
        with self.assertRaises(ugds.vllm.ConfigError) as cm:
            self.worker(kv, ugds_gpu_direct="require")
        print(f"  require on a file: refused ({cm.exception})")
        self.assertEqual(cm.exception.key, "ugds_gpu_direct")


def throughput() -> None:
    """Stores and loads of 1 GiB of KV (blocks of 64 + 32 KiB, chunks of 4 blocks) in jobs of
    16 chunks, all submitted at once; GB/s of the bytes moved over the wall time."""
    fd, path = tempfile.mkstemp(prefix="ugds-vllm-bench-", suffix=".dat", dir=DIR)
    os.close(fd)
    try:
        nblocks = (1 << 30) // sum(PAGES)
        kv = random_kv(nblocks)
        extra = {"ugds_target": path, "ugds_capacity": 1200 * MiB}
        spec = uv.UgdsOffloadingSpec(config(extra, sum(PAGES)))
        w = spec.get_worker(caches(kv, PAGES))
        per_job = 16 * BPC
        jobs = [(j, list(range(j * per_job, (j + 1) * per_job))) for j in range(nblocks // per_job)]
        slots = lambda j: UgdsLoadStoreSpec(range(j * 16, (j + 1) * 16))  # noqa: E731
        for name, submit in (
            ("store", lambda j, b: w.submit_store(j, GPULoadStoreSpec(b, [len(b)], [0]), slots(j))),
            ("load", lambda j, b: w.submit_load(1000 + j, slots(j), GPULoadStoreSpec(b, [len(b)], [0]))),
        ):
            for rnd in range(3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for j, b in jobs:
                    submit(j, b)
                w.wait({j + (1000 if name == "load" else 0) for j, _ in jobs})
                dt = time.perf_counter() - t0
                res = w.get_finished()
                ok = all(r.success for r in res)
                n = sum(r.transfer_size for r in res)
                print(f"throughput: {name} round {rnd}: {n / dt / 1e9:.2f} GB/s ({n >> 20} MiB, {len(res)} jobs, ok={ok}, path {w.path})")
        w.shutdown()
    finally:
        os.unlink(path)


def main() -> int:
    print(f"ugds {ugds.__version__}, torch {torch.__version__}, vLLM's classes: {uv.VLLM}")
    try:
        throughput()
    except Exception as e:  # informational only
        print(f"throughput: not measured: {e!r}")
    # The host suites' runner (tests/python): unittest, then the `UGDS-PY passed=N failed=M` line.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from ugds_test_runner import run

    return run(__name__)


if __name__ == "__main__":
    sys.exit(main())

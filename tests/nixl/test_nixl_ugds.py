"""The UGDS NIXL backend (libplugin_UGDS.so) through NIXL's own Python API (nixl-cu12 1.5.1).

Host (default): on a temporary file (the fallback path), next to NIXL's POSIX plugin on the
same file: data written through one backend is read back through the other, byte for byte;
NIXL's errors for bad input. Needs NIXL_PLUGIN_DIR naming a folder with libplugin_UGDS.so and
libplugin_POSIX.so (cargo xtask test makes one).

GPU (`--vram`): CUDA memory (torch) against a file, read back through UGDS and through POSIX;
with `--gds-mt`, NIXL's GDS_MT plugin (NVIDIA's libcufile) beside UGDS on the same file, each
reading what the other wrote.

VM (`--target SPEC ...`): each SPEC is any ugds target (a node /dev/ugds_drvN, a
`stripe:...` spec, a volume descriptor file): UGDS writes and reads it back, the path NIXL's
query reports is `direct`, reads past the end are refused. A node is also named by an open
fd in devId (the FILE descriptor's usual form).

Prints `UGDS-NIXL passed=N failed=M` last; exits non-zero when a test failed.
"""

import argparse
import mmap
import os
import sys
import tempfile
import traceback

import numpy as np

try:
    import nixl_cu12 as nixl_pkg
except ImportError:  # the meta package, where it works (it picks a CUDA flavour)
    import nixl as nixl_pkg

nixl_agent = nixl_pkg.nixl_agent
nixl_agent_config = nixl_pkg.nixl_agent_config
bind = nixl_pkg._bindings

RESULTS = {"passed": 0, "failed": 0}
MiB = 1 << 20


def test(fn):
    def run(*a):
        name = fn.__name__ + (f"[{a[-1]}]" if a else "")
        try:
            fn(*a)
            RESULTS["passed"] += 1
            print(f"ok   {name}", flush=True)
        except Exception:
            RESULTS["failed"] += 1
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()

    return run


def host_buffer(n):
    """Page-aligned host memory (an anonymous mapping) as a numpy array, and its address."""
    m = mmap.mmap(-1, n)
    a = np.frombuffer(m, dtype=np.uint8)
    return m, a, a.ctypes.data


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


class Agent:
    """One NIXL agent with the given backends (name -> params)."""

    def __init__(self, name, backends):
        self.a = nixl_agent(name, nixl_agent_config(backends=[]))
        self.name = name
        for b, params in backends.items():
            self.a.create_backend(b, params)

    def reg(self, descs, mem, backends):
        return self.a.register_memory(descs, mem, backends=backends)

    def xfer(self, op, local, remote, backend, mem="DRAM"):
        """Runs one transfer of `mem` (DRAM or VRAM) through `backend`."""
        a = self.a
        ld = a.get_xfer_descs(local, mem)
        rd = a.get_xfer_descs(remote, "FILE")
        h = a.initialize_xfer(op, ld, rd, self.name, backends=[backend])
        try:
            state = a.transfer(h)
            assert state != "ERR", f"{backend}: {op} posting failed"
            while state == "PROC":
                state = a.check_xfer_state(h)
            assert state == "DONE", f"{backend}: {op} ended {state}"
            assert a.query_xfer_backend(h) == backend
        finally:
            a.release_xfer_handle(h)


def expect_error(kinds, fn, what):
    try:
        fn()
    except kinds:
        return
    raise AssertionError(f"{what}: no NIXL error {kinds}")


# ---------------------------------------------------------------- host: a temporary file


def zero_file(tmp, name, size):
    """A file of `size` zero bytes in `tmp`, open for reading and writing: (path, fd)."""
    path = os.path.join(tmp, name)
    with open(path, "wb") as f:
        f.truncate(size)
    return path, os.open(path, os.O_RDWR)


def host_suite(tmp):
    size = 4 * MiB
    path, fd = zero_file(tmp, "nixl-ugds.bin", size)
    ag = Agent("ugds-host", {"UGDS": {}, "POSIX": {}})
    n = 256 * 1024
    m_src, src, src_addr = host_buffer(n)
    m_dst, dst, dst_addr = host_buffer(n)
    both = ["UGDS", "POSIX"]
    ag.reg([(src_addr, n, 0, ""), (dst_addr, n, 0, "")], "DRAM", both)
    ag.reg([(0, size, fd, "")], "FILE", both)

    def roundtrip(writer, reader, off, seed):
        src[:] = pattern(n, seed)
        dst[:] = 0
        ag.xfer("WRITE", [(src_addr, n, 0)], [(off, n, fd)], writer)
        ag.xfer("READ", [(dst_addr, n, 0)], [(off, n, fd)], reader)
        assert np.array_equal(src, dst), f"{writer} -> {reader}: data differs"
        with open(path, "rb") as f:
            f.seek(off)
            assert f.read(n) == src.tobytes(), f"{writer}: the file does not hold what was written"

    @test
    def ugds_write_then_read_back(_):
        roundtrip("UGDS", "UGDS", 64 * 1024, 1)

    @test
    def ugds_writes_posix_reads(_):
        roundtrip("UGDS", "POSIX", 1 * MiB, 2)

    @test
    def posix_writes_ugds_reads(_):
        roundtrip("POSIX", "UGDS", 2 * MiB, 3)

    @test
    def many_descriptors_in_one_transfer(_):
        # 64 descriptors of 4 KiB, scattered over the file, through a batch of depth 8 (the
        # rest follow as slots free) and again synchronously; read back through POSIX.
        for params, seed in (({"depth": "8"}, 4), ({"queue": "sync"}, 5)):
            a2 = Agent(f"ugds-many-{seed}", {"UGDS": params, "POSIX": {}})
            a2.reg([(src_addr, n, 0, ""), (dst_addr, n, 0, "")], "DRAM", both)
            a2.reg([(0, size, fd, "")], "FILE", both)
            k, bs = 64, 4096
            src[:] = pattern(n, seed)
            dst[:] = 0
            offs = [(3 * MiB + ((i * 7) % k) * bs) for i in range(k)]
            local = [(src_addr + i * bs, bs, 0) for i in range(k)]
            remote = [(o, bs, fd) for o in offs]
            a2.xfer("WRITE", local, remote, "UGDS")
            a2.xfer("READ", [(dst_addr + i * bs, bs, 0) for i in range(k)], remote, "POSIX")
            assert np.array_equal(src[: k * bs], dst[: k * bs]), f"{params}: data differs"

    @test
    def unaligned_host_memory(_):
        # Memory as numpy allocates it (not page-aligned): registered on the pages around it.
        s = np.arange(8192, dtype=np.uint32).view(np.uint8)[4:4 + 16384 - 8192]
        d = np.zeros(8192, dtype=np.uint8)
        ag.reg([(s.ctypes.data, 8192, 0, ""), (d.ctypes.data, 8192, 0, "")], "DRAM", ["UGDS"])
        ag.xfer("WRITE", [(s.ctypes.data, 8192, 0)], [(512 * 1024, 8192, fd)], "UGDS")
        ag.xfer("READ", [(d.ctypes.data, 8192, 0)], [(512 * 1024, 8192, fd)], "UGDS")
        assert np.array_equal(s, d)

    @test
    def query_reports_the_path(_):
        r = ag.a.query_memory([(0, 0, fd, "")], "UGDS", "FILE")
        assert r[0] is not None and r[0]["path"] == "fallback", r
        assert r[0]["target"] == path and int(r[0]["capacity"]) == size, r
        assert ag.a.get_backend_params("UGDS")["ugds_built_for_nixl"] == "1.5.1"

    @test
    def path_mode_metainfo_names_the_target(_):
        a3 = Agent("ugds-path-mode", {"UGDS": {}})
        a3.reg([(src_addr, n, 0, "")], "DRAM", ["UGDS"])
        # devId is only a key here: the target is the metaInfo's path.
        a3.reg([(0, size, 4242, f"rw:{path}")], "FILE", ["UGDS"])
        src[:] = pattern(n, 6)
        a3.xfer("WRITE", [(src_addr, 4096, 0)], [(8192, 4096, 4242)], "UGDS")
        with open(path, "rb") as f:
            f.seek(8192)
            assert f.read(4096) == src[:4096].tobytes()

    @test
    def wrong_fd_is_refused(_):
        bad = os.open(path, os.O_RDONLY)
        os.close(bad)  # a number that is no open descriptor now
        expect_error(
            (bind.nixlNotFoundError, bind.nixlBackendError),
            lambda: ag.reg([(0, size, bad, "")], "FILE", ["UGDS"]),
            "registering a closed fd",
        )

    @test
    def read_past_the_end_is_refused(_):
        # The registration covers 1 GiB of a 4 MiB file: NIXL passes the descriptor on, and
        # UGDS refuses the read past the end of the file.
        big = os.open(path, os.O_RDWR)
        ag.reg([(0, 1 << 30, big, "")], "FILE", ["UGDS"])
        expect_error(
            bind.nixlInvalidParamError,
            lambda: ag.xfer("READ", [(dst_addr, 4096, 0)], [(size + 4096, 4096, big)], "UGDS"),
            "a read past the end",
        )

    @test
    def length_mismatch_is_refused(_):
        expect_error(
            (bind.nixlMismatchError, bind.nixlInvalidParamError),
            lambda: ag.xfer("WRITE", [(src_addr, 8192, 0)], [(0, 4096, fd)], "UGDS"),
            "8 KiB of DRAM against 4 KiB of the file",
        )

    @test
    def unaligned_length_is_refused(_):
        expect_error(
            bind.nixlInvalidParamError,
            lambda: ag.xfer("WRITE", [(src_addr, 100, 0)], [(0, 100, fd)], "UGDS"),
            "100 bytes (not a multiple of the block size)",
        )

    @test
    def unknown_parameter_is_refused(_):
        expect_error(
            (bind.nixlBackendError, bind.nixlInvalidParamError),
            lambda: Agent("ugds-bad-param", {"UGDS": {"use_uring": "1"}}),
            "an unknown backend parameter",
        )

    @test
    def host_memory_as_vram_is_refused(_):
        a4 = Agent("ugds-vram", {"UGDS": {}})
        expect_error(
            (bind.nixlInvalidParamError, bind.nixlBackendError, bind.nixlNotSupportedError),
            lambda: a4.reg([(src_addr, n, 0, "")], "VRAM", ["UGDS"]),
            "host memory registered as VRAM",
        )

    @test
    def another_release_is_refused(_):
        # The same NIXL under another release's name (a site folder of links, its dist-info
        # saying 1.6.0): the plugin refuses to load, and NIXL cannot create the backend.
        import subprocess

        pkg = os.path.dirname(nixl_pkg.__file__)
        site = os.path.dirname(pkg)
        name = os.path.basename(pkg)
        fake = os.path.join(tmp, "other-release")
        os.makedirs(os.path.join(fake, name))
        for f in os.listdir(pkg):
            os.symlink(os.path.join(pkg, f), os.path.join(fake, name, f))
        for d in (f".{name}.mesonpy.libs", f"{name}.libs"):
            os.symlink(os.path.join(site, d), os.path.join(fake, d))
        os.mkdir(os.path.join(fake, f"{name}-1.6.0.dist-info"))
        code = (
            f"import {name} as n\n"
            "a = n.nixl_agent('x', n.nixl_agent_config(backends=[]))\n"
            "try:\n    a.create_backend('UGDS', {})\nexcept n._bindings.nixlNotFoundError:\n    print('REFUSED')\n"
        )
        env = dict(os.environ, PYTHONPATH=fake)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert "REFUSED" in r.stdout, (r.stdout, r.stderr)
        assert "built for NIXL 1.5.1" in r.stderr and "runs NIXL 1.6.0" in r.stderr, r.stderr

    for t in [
        ugds_write_then_read_back,
        ugds_writes_posix_reads,
        posix_writes_ugds_reads,
        many_descriptors_in_one_transfer,
        unaligned_host_memory,
        query_reports_the_path,
        path_mode_metainfo_names_the_target,
        wrong_fd_is_refused,
        read_past_the_end_is_refused,
        length_mismatch_is_refused,
        unaligned_length_is_refused,
        unknown_parameter_is_refused,
        host_memory_as_vram_is_refused,
        another_release_is_refused,
    ]:
        t("file")
    os.close(fd)


# ---------------------------------------------------------------- GPU: VRAM on a file


def vram_suite(tmp):
    """CUDA memory (torch) against a file: the fallback path, VRAM staged through host memory."""
    import torch

    size = 8 * MiB
    _, fd = zero_file(tmp, "nixl-ugds-vram.bin", size)
    ag = Agent("ugds-vram", {"UGDS": {}, "POSIX": {}})
    n = 1 * MiB
    g_src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    g_dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    m_h, h, h_addr = host_buffer(n)
    ag.reg([(g_src.data_ptr(), n, 0, ""), (g_dst.data_ptr(), n, 0, "")], "VRAM", ["UGDS"])
    ag.reg([(h_addr, n, 0, "")], "DRAM", ["POSIX"])
    ag.reg([(0, size, fd, "")], "FILE", ["UGDS", "POSIX"])
    src = g_src.cpu().numpy()

    @test
    def vram_write_then_read_back(_):
        g_dst.zero_()
        ag.xfer("WRITE", [(g_src.data_ptr(), n, 0)], [(2 * MiB, n, fd)], "UGDS", "VRAM")
        ag.xfer("READ", [(g_dst.data_ptr(), n, 0)], [(2 * MiB, n, fd)], "UGDS", "VRAM")
        torch.cuda.synchronize()
        assert torch.equal(g_src, g_dst), "VRAM read back differs"

    @test
    def vram_written_posix_reads(_):
        # 16 descriptors of 64 KiB from VRAM, read back through NIXL's POSIX plugin into DRAM.
        k, bs = 16, 64 * 1024
        local = [(g_src.data_ptr() + i * bs, bs, 0) for i in range(k)]
        remote = [(4 * MiB + i * bs, bs, fd) for i in range(k)]
        ag.xfer("WRITE", local, remote, "UGDS", "VRAM")
        h[:] = 0
        ag.xfer("READ", [(h_addr, n, 0)], [(4 * MiB, n, fd)], "POSIX")
        assert np.array_equal(h, src), "POSIX read differs from the VRAM written"

    for t in (vram_write_then_read_back, vram_written_posix_reads):
        t("cuda")
    os.close(fd)


def gds_mt_suite(tmp):
    """NIXL's GDS_MT plugin (over NVIDIA's libcufile, in compatibility mode where the machine has
    no GDS driver) beside UGDS on one file, CUDA memory on both sides: each reads what the other
    wrote, byte for byte."""
    import torch

    size = 8 * MiB
    n = 1 * MiB
    path, fd0 = zero_file(tmp, "nixl-ugds-gds-mt.bin", size)
    os.close(fd0)
    # cuFile registers descriptors opened with O_DIRECT.
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    a = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    b = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    got = torch.zeros(n, dtype=torch.uint8, device="cuda")
    try:
        ag = Agent("ugds-gds-mt", {"UGDS": {}, "GDS_MT": {}})
        vram = [(t.data_ptr(), n, 0, "") for t in (a, b, got)]
        ag.reg(vram, "VRAM", ["UGDS", "GDS_MT"])
        ag.reg([(0, size, fd, "")], "FILE", ["UGDS", "GDS_MT"])
    except Exception:
        RESULTS["failed"] += 1
        print("FAIL setting up GDS_MT beside UGDS", flush=True)
        traceback.print_exc()
        return

    @test
    def ugds_writes_gds_mt_reads(_):
        ag.xfer("WRITE", [(a.data_ptr(), n, 0)], [(0, n, fd)], "UGDS", "VRAM")
        got.zero_()
        ag.xfer("READ", [(got.data_ptr(), n, 0)], [(0, n, fd)], "GDS_MT", "VRAM")
        torch.cuda.synchronize()
        assert torch.equal(a, got), "GDS_MT read other bytes than UGDS wrote"

    @test
    def gds_mt_writes_ugds_reads(_):
        ag.xfer("WRITE", [(b.data_ptr(), n, 0)], [(2 * MiB, n, fd)], "GDS_MT", "VRAM")
        got.zero_()
        ag.xfer("READ", [(got.data_ptr(), n, 0)], [(2 * MiB, n, fd)], "UGDS", "VRAM")
        torch.cuda.synchronize()
        assert torch.equal(b, got), "UGDS read other bytes than GDS_MT wrote"

    for t in (ugds_writes_gds_mt_reads, gds_mt_writes_ugds_reads):
        t("cuda")
    os.close(fd)


# ---------------------------------------------------------------- VM: ugds targets


def vm_suite(targets, nsid):
    n = 1 * MiB
    m_src, src, src_addr = host_buffer(n)
    m_dst, dst, dst_addr = host_buffer(n)
    for i, spec in enumerate(targets):
        key = 1000 + i
        try:
            ag = Agent(f"ugds-vm-{i}", {"UGDS": {"nsid": str(nsid)}})
            ag.reg([(src_addr, n, 0, ""), (dst_addr, n, 0, "")], "DRAM", ["UGDS"])
            ag.reg([(0, 1 << 40, key, f"rw:{spec}")], "FILE", ["UGDS"])
            info = ag.a.query_memory([(0, 0, key, f"rw:{spec}")], "UGDS", "FILE")[0]
        except Exception:
            # The target did not register: one failure, and on to the next.
            RESULTS["failed"] += 1
            print(f"FAIL registering[{spec}]", flush=True)
            traceback.print_exc()
            continue

        @test
        def direct_path_reported(spec):
            assert info is not None and info["path"] == "direct", info

        @test
        def write_then_read_back(spec):
            for k, seed in ((1, 10), (16, 11)):
                bs = n // k
                src[:] = pattern(n, seed + i)
                dst[:] = 0
                remote = [(j * bs + 8 * MiB, bs, key) for j in range(k)]
                ag.xfer("WRITE", [(src_addr + j * bs, bs, 0) for j in range(k)], remote, "UGDS")
                ag.xfer("READ", [(dst_addr + j * bs, bs, 0) for j in range(k)], remote, "UGDS")
                assert np.array_equal(src, dst), f"{k} descriptors: data differs"

        @test
        def read_past_the_end_refused(spec):
            cap = int(info["capacity"])
            expect_error(
                bind.nixlInvalidParamError,
                lambda: ag.xfer("READ", [(dst_addr, 4096, 0)], [(cap, 4096, key)], "UGDS"),
                "a read at the capacity",
            )

        for t in (direct_path_reported, write_then_read_back, read_past_the_end_refused):
            t(spec)

        if spec.startswith("/dev/ugds_drv"):

            @test
            def node_by_fd(spec):
                fd = os.open(spec, os.O_RDWR)
                try:
                    a2 = Agent(f"ugds-vm-fd-{i}", {"UGDS": {"nsid": str(nsid), "queue": "sync"}})
                    a2.reg([(src_addr, n, 0, ""), (dst_addr, n, 0, "")], "DRAM", ["UGDS"])
                    a2.reg([(0, 1 << 40, fd, "")], "FILE", ["UGDS"])
                    src[:] = pattern(n, 20 + i)
                    dst[:] = 0
                    a2.xfer("WRITE", [(src_addr, n, 0)], [(16 * MiB, n, fd)], "UGDS")
                    a2.xfer("READ", [(dst_addr, n, 0)], [(16 * MiB, n, fd)], "UGDS")
                    assert np.array_equal(src, dst)
                finally:
                    os.close(fd)

            node_by_fd(spec)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", action="append", default=[], help="a ugds target (VM mode)")
    p.add_argument("--nsid", type=int, default=1)
    p.add_argument("--vram", action="store_true", help="CUDA memory on a file (a GPU machine)")
    p.add_argument("--gds-mt", action="store_true", help="with --vram: NIXL's GDS_MT plugin beside UGDS")
    args = p.parse_args()
    if args.target:
        vm_suite(args.target, args.nsid)
    elif args.vram:
        with tempfile.TemporaryDirectory(dir=os.environ.get("UGDS_TEST_DIR")) as tmp:
            vram_suite(tmp)
            if args.gds_mt:
                gds_mt_suite(tmp)
    else:
        with tempfile.TemporaryDirectory(dir=os.environ.get("UGDS_TEST_DIR")) as tmp:
            host_suite(tmp)
    print(f"UGDS-NIXL passed={RESULTS['passed']} failed={RESULTS['failed']}", flush=True)
    sys.exit(1 if RESULTS["failed"] else 0)


if __name__ == "__main__":
    main()

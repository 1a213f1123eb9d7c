"""LMCache's own code selecting ugds, against our ``libugds.so`` and the installed wheel: its GDS L1
tier's ``ugds`` backend (configured by ``--l1-manager`` JSON and by the older ``--gds-l1-*``
flags) and its native-plugin L2 adapter loading ``ugds.lmcache.UgdsConnector``. Nothing of
LMCache's is re-implemented here: its argument parsers, config classes, backend factory,
``L1Manager``, GDS context and uGDS backend (``lmcache/v1/gpu_connector/gds_backends/ugds.py``:
the character-device and sysfs-class checks, ``ctypes.util.find_library("ugds")``, its ctypes
signatures, ``uGDSGetDeviceCapacity`` against the slab size) run as LMCache ships them.

`cargo xtask test` runs it in target/lmcache-env (Debian's Python with its CPU build of torch,
LMCache installed from PyPI's wheel without its dependencies, plus the pure-Python packages its
imports need; see xtask/src/wheel.rs) with UGDS_LMCACHE_REQUIRE set to that LMCache version and
LD_LIBRARY_PATH naming the folder of our installed libugds.so; on files in the host phase, and on
a ugds node in the VM (UGDS_LMC_TARGET=/dev/ugds_drvN, UGDS_LMC_CAPACITY its size in bytes as
the VM was given it; the node's first 64 MiB are overwritten). UGDS_LMCACHE_DIR may name an
unpacked LMCache wheel to import instead of the installed one. Prints
`UGDS-PY passed=N failed=M skipped=K` last.

What stands in for what, because this machine has no GPU and Debian's torch is 1.13 (LMCache
0.5.6 is built against torch 2): none of it is on the selection path, and each is said here.

- ``lmcache.lmcache_native`` (LMCache's C++ KV kernels and its ``Bitmap``, linked against torch
  2's libraries) cannot load: a module of inert placeholder classes takes its name, and every
  test checks that none of them was constructed. ``numba`` (imported by LMCache's CacheGen
  compression kernels), where absent, is a module whose ``njit`` returns the function.
- torch 1.13 lacks the float8 dtypes that LMCache's fp8 serializer names as default arguments
  at import: placeholders of those names are set on torch.
- The package ``lmcache.v1.gpu_connector`` is entered without running its ``__init__.py``
  (which imports the vLLM GPU connectors and their KV-format tables of the native kernels);
  its modules used here run unchanged.
- LMCache's uGDS backend accepts only a CUDA or ROCm build of torch
  (``validate_environment``): the tests check that refusal on this CPU build, then claim a CUDA
  build (``torch.version.cuda`` patched, only around LMCache's calls) so that what follows runs.
- LMCache registers GPU tensors only (``register_buffer``): host memory is registered with our
  ``uGDSBufRegister`` (a ugds extension) and the I/O is ordered on our CPU stream
  (``ugdsxCpuStreamCreate``); the reads and writes themselves are LMCache's
  (``AsyncHandle.read_async``/``write_async``, at the slab offsets its L1 manager allocated).
- torch 1.13's dtypes lack ``itemsize`` (torch 2.1), with which the L1 manager's
  ``reserve_write`` sizes a layout: the chunks' slab offsets come from that L1 manager's GDS
  allocator (its ``AddressManager``) directly; the L2 store's objects are LMCache's
  ``BytesBufferMemoryObj`` (raw bytes, no dtype).
- The L2 adapter's lookups and loads build LMCache's native ``Bitmap``: only stores go through
  the adapter here; what they stored is read back through ``ugds.kv``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import importlib
import importlib.metadata
import json
import mmap
import os
import select
import sys
import tempfile
import time
import types
import unittest
from unittest import mock

DIR = os.environ.get("UGDS_TEST_DIR") or tempfile.gettempdir()
TARGET = os.environ.get("UGDS_LMC_TARGET")
REQUIRE = os.environ.get("UGDS_LMCACHE_REQUIRE")
LMCACHE_DIR = os.environ.get("UGDS_LMCACHE_DIR")
MiB = 1 << 20
SLAB = 64 * MiB  # size_gb 0.0625
TIMEOUT = 30.0

# --- What stands in for what (see the module's docstring) -----------------------------------

NATIVE_CONSTRUCTED: list[str] = []
STAND_INS: list[str] = []


def _placeholder_attribute(owner, prefix: str, name: str) -> type:
    """A placeholder for `owner`'s missing attribute `name`, kept on `owner` once made."""
    if name.startswith("__"):
        raise AttributeError(name)
    v = _placeholder(f"{prefix}.{name}")
    setattr(owner, name, v)
    return v


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str):
        return _placeholder_attribute(cls, cls.__qualname__, name)


def _placeholder(qualname: str) -> type:
    def init(self, *args, **kwargs) -> None:
        NATIVE_CONSTRUCTED.append(qualname)
        raise NotImplementedError(f"{qualname} is LMCache's native code, which is not loaded here")

    return _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {"__init__": init, "__qualname__": qualname})


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str):
        return _placeholder_attribute(self, self.__name__, name)


def _import_lmcache():
    if LMCACHE_DIR:
        sys.path.insert(0, LMCACHE_DIR)
    import torch

    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
        if not hasattr(torch, name):
            setattr(torch, name, torch.uint8)
            STAND_INS.append(f"torch.{name}")
    try:
        import numba  # noqa: F401
    except ImportError:
        nb = types.ModuleType("numba")
        nb.njit = lambda *a, **k: a[0] if a and callable(a[0]) else (lambda f: f)
        sys.modules["numba"] = nb
        STAND_INS.append("numba")
    spec = importlib.util.find_spec("lmcache")
    if spec is None:
        raise ImportError("lmcache is not installed (or UGDS_LMCACHE_DIR does not hold it)")
    root = spec.submodule_search_locations[0]
    # The native extension, imported alone (its package's __init__ is light): the real one where
    # it loads.
    sys.modules["lmcache"] = lm = types.ModuleType("lmcache")
    lm.__path__ = [root]
    try:
        importlib.import_module("lmcache.lmcache_native")
        native = True
    except ImportError as e:
        sys.modules["lmcache.lmcache_native"] = _PlaceholderModule("lmcache.lmcache_native")
        STAND_INS.append(f"lmcache.lmcache_native ({e})")
        native = False
    del sys.modules["lmcache"]
    import lmcache

    if not native:
        gc = types.ModuleType("lmcache.v1.gpu_connector")
        gc.__path__ = [os.path.join(root, "v1", "gpu_connector")]
        importlib.import_module("lmcache.v1")
        sys.modules[gc.__name__] = gc
        STAND_INS.append("lmcache.v1.gpu_connector without its __init__.py")
    return lmcache


import torch  # noqa: E402

lmcache = _import_lmcache()
from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.config import (  # noqa: E402
    GdsL1Config,
    GDSL1ManagerConfig,
    L1ManagerConfig,
    get_arg_parser,
    parse_args_to_config,
)
from lmcache.v1.distributed.l1_manager import L1Manager  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config  # noqa: E402
from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import (  # noqa: E402
    NativeConnectorL2Adapter,
    _object_key_to_string,
)
from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import NativePluginL2AdapterConfig  # noqa: E402
from lmcache.v1.gpu_connector import _gds_backends  # noqa: E402
from lmcache.v1.gpu_connector.gds_backends import ugds as lmc_ugds  # noqa: E402
from lmcache.v1.gpu_connector.gds_context import get_l1_gds_context  # noqa: E402
from lmcache.v1.memory_management import BytesBufferMemoryObj  # noqa: E402
from lmcache.v1.platform.event_notifier import consume_fd  # noqa: E402

import ugds  # noqa: E402
import ugds.kv as kv  # noqa: E402
from ugds.lmcache import UgdsConnector  # noqa: E402

print("LMCache", importlib.metadata.version("lmcache"), "from", os.path.dirname(lmcache.__file__))
for s in STAND_INS:
    print("  stand-in:", s)


def l1_manager_args(path: str, size_gb: float = 0.0625, **extra) -> list[str]:
    spec = {"type": "GDS", "tag": "nvme", "size_gb": size_gb, "backend": "ugds", "path": path}
    spec.update(extra)
    spec.setdefault("eviction", {"eviction_policy": "LRU"})
    return ["--l1-manager", json.dumps(spec)]


def legacy_args(path: str, size_gb: float = 0.0625) -> list[str]:
    return ["--gds-l1-path", path, "--gds-l1-backend", "ugds", "--l1-size-gb", str(size_gb), "--eviction-policy", "LRU"]


def parse(argv: list[str]):
    """LMCache's storage-manager configuration from its command line, as its server parses it."""
    return parse_args_to_config(get_arg_parser().parse_args(argv))


def claim_cuda():
    """The CUDA build of torch LMCache's uGDS backend requires (see the module's docstring)."""
    return mock.patch.object(torch.version, "cuda", torch.version.cuda or "12.8")


def pattern(tag: str, n: int) -> bytes:
    seed = hashlib.sha256(tag.encode()).digest()
    return (seed * (n // len(seed) + 1))[:n]


def lib_dirs() -> list[str]:
    return [os.path.realpath(d) for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]


def mapped_files() -> list[str]:
    with open("/proc/self/maps") as f:
        return [line.split()[-1] for line in f if len(line.split()) >= 6]


class HostBuffers:
    """Page-aligned host memory registered with our uGDSBufRegister, and one of our CPU streams,
    through the library object LMCache loaded (its ctypes signatures for uGDS's functions; ours
    declared here for the two ugds extensions)."""

    def __init__(self, backend, sizes: list[int]) -> None:
        self.lib = lib = backend.library()
        err = lmc_ugds._uGDSError_t
        lib.ugdsxCpuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.ugdsxCpuStreamCreate.restype = err
        for f in (lib.ugdsxCpuStreamSynchronize, lib.ugdsxCpuStreamDestroy):
            f.argtypes = [ctypes.c_void_p]
            f.restype = err
        s = ctypes.c_void_p()
        lmc_ugds._check(lib.ugdsxCpuStreamCreate(ctypes.byref(s)), "ugdsxCpuStreamCreate")
        self.stream = s.value
        self.backend = backend
        backend.register_stream(self.stream)  # LMCache's: uGDSStreamRegister
        self.maps = [mmap.mmap(-1, n) for n in sizes]
        self.addrs = [ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in self.maps]
        for a, n in zip(self.addrs, sizes):
            lmc_ugds._check(lib.uGDSBufRegister(ctypes.c_void_p(a), n, 0), "uGDSBufRegister")

    def sync(self) -> None:
        lmc_ugds._check(self.lib.ugdsxCpuStreamSynchronize(self.stream), "ugdsxCpuStreamSynchronize")

    def close(self) -> None:
        for a in self.addrs:
            lmc_ugds._check(self.lib.uGDSBufDeregister(ctypes.c_void_p(a)), "uGDSBufDeregister")
        self.backend.deregister_stream(self.stream)
        lmc_ugds._check(self.lib.ugdsxCpuStreamDestroy(self.stream), "ugdsxCpuStreamDestroy")
        self.addrs = []


def put_get(test: unittest.TestCase, handle, items: list[tuple[int, bytes]]) -> None:
    """Writes each (slab offset, bytes) through LMCache's handle and reads it back through it
    into another buffer at a buffer offset of 4 KiB; compares."""
    n = max(len(d) for _, d in items)
    bufs = HostBuffers(handle._backend, [n, n + 4096])
    try:
        src, dst = bufs.maps
        for off, data in items:
            src[: len(data)] = data
            w = handle.write_async(bufs.addrs[0], len(data), off, 0, bufs.stream)
            bufs.sync()
            test.assertEqual(w.bytes_done, len(data), f"write at slab offset {off}")
            dst[:] = b"\0" * len(dst)
            r = handle.read_async(bufs.addrs[1], len(data), off, 4096, bufs.stream)
            bufs.sync()
            test.assertEqual(r.bytes_done, len(data), f"read at slab offset {off}")
            test.assertEqual(dst[4096 : 4096 + len(data)], data, f"bytes read back at slab offset {off}")
            test.assertEqual(dst[:4096], b"\0" * 4096, "the read wrote before its buffer offset")
    finally:
        bufs.close()


class Base(unittest.TestCase):
    def tearDown(self) -> None:
        self.assertEqual(NATIVE_CONSTRUCTED, [], "a stand-in for LMCache's native code was used")
        owners = lmc_ugds.Backend._driver._owners
        self.assertEqual(len(owners), 0, "LMCache still holds the uGDS driver open after the test")


class VersionTests(Base):
    def test_the_required_lmcache_is_the_one_imported(self) -> None:
        if not REQUIRE:
            self.skipTest("UGDS_LMCACHE_REQUIRE not set")
        self.assertEqual(importlib.metadata.version("lmcache"), REQUIRE)
        from lmcache._version import __version__

        self.assertEqual(__version__, REQUIRE)


class ConfigTests(Base):
    """LMCache's parsing of the two ways of naming the ugds GDS L1 backend."""

    path = TARGET or "/dev/ugds_drv0"

    def test_l1_manager_json_selects_the_ugds_backend(self) -> None:
        cfg = parse(l1_manager_args(self.path))
        self.assertEqual(len(cfg.l1_manager_configs), 1)
        l1 = cfg.l1_manager_configs[0]
        self.assertIs(type(l1), GDSL1ManagerConfig)
        self.assertEqual(l1.tag, "nvme")
        self.assertEqual(l1.eviction.eviction_policy, "LRU")
        self.assertEqual(
            l1.gds_l1_config,
            GdsL1Config(file_location=self.path, size_in_bytes=SLAB, use_direct_io=True, backend="ugds", align_bytes=4096),
        )

    def test_legacy_flags_select_the_ugds_backend(self) -> None:
        cfg = parse(legacy_args(self.path))
        l1 = cfg.l1_manager_config
        self.assertIs(type(l1), L1ManagerConfig)
        g = l1.gds_l1_config
        self.assertEqual((g.file_location, g.size_in_bytes, g.backend), (self.path, SLAB, "ugds"))

    def test_ugds_must_be_named(self) -> None:
        """`auto` never picks ugds: without "backend" the JSON gives `auto`; ugds is no default."""
        spec = {"type": "GDS", "tag": "nvme", "size_gb": 1, "path": self.path, "eviction": {"eviction_policy": "LRU"}}
        self.assertEqual(parse(["--l1-manager", json.dumps(spec)]).l1_manager_config.gds_l1_config.backend, "auto")
        self.assertEqual(parse(["--gds-l1-path", self.path, "--l1-size-gb", "1", "--eviction-policy", "LRU"]).l1_manager_config.gds_l1_config.backend, "auto")
        self.assertFalse(lmc_ugds.Backend.is_default())
        self.assertIn("ugds", _gds_backends.available_backends())
        with claim_cuda():
            self.assertNotEqual(_gds_backends.create_backend("auto").name, "ugds")

    def test_malformed_configurations_are_refused_by_lmcache(self) -> None:
        no_tag = {"type": "GDS", "size_gb": 8, "backend": "ugds", "path": self.path, "eviction": {"eviction_policy": "LRU"}}
        cases = [
            (["--l1-manager", json.dumps(no_tag)], "tag must be a non-empty string"),
            (l1_manager_args(self.path, eviction={}), "An eviction policy is required for each L1"),
            (l1_manager_args(self.path, direct_io="no"), "direct_io must be a boolean"),
            (l1_manager_args(self.path, bogus=1), "Unknown L1 fields: ['bogus']"),
            (l1_manager_args(self.path) + ["--gds-l1-path", self.path], "Use either --l1-manager or legacy L1 flags"),
            (legacy_args(self.path)[:-2], "Legacy L1 configuration requires --l1-size-gb and --eviction-policy"),
        ]
        for argv, msg in cases:
            with self.subTest(argv=argv):
                with self.assertRaises(ValueError) as e:
                    parse(argv)
                self.assertIn(msg, str(e.exception))
        # argparse's choices: an unknown backend name ends the parse (exit status 2).
        with mock.patch("sys.stderr"), self.assertRaises(SystemExit) as e:
            get_arg_parser().parse_args(["--gds-l1-backend", "ugdz"])
        self.assertEqual(e.exception.code, 2)

    def test_an_unknown_backend_name_is_refused_by_the_factory(self) -> None:
        with self.assertRaises(ValueError) as e:
            _gds_backends.create_backend("ugdz")
        self.assertIn("unsupported GDS L1 backend: 'ugdz'", str(e.exception))
        self.assertIn("ugds", str(e.exception))

    def test_a_cpu_build_of_torch_is_refused(self) -> None:
        if torch.version.cuda is not None or torch.version.hip is not None:
            self.skipTest("torch here is a CUDA or ROCm build")
        with self.assertRaises(ValueError) as e:
            _gds_backends.create_backend("ugds")
        self.assertIn("ugds requires a ROCm or CUDA PyTorch build", str(e.exception))

    def test_the_factory_makes_lmcaches_ugds_backend(self) -> None:
        with claim_cuda():
            b = _gds_backends.create_backend("ugds")
        self.assertIs(type(b), lmc_ugds.Backend)
        self.assertEqual(b.name, "ugds")
        self.assertIsNone(b._lib, "the factory loaded the library (it must not before the slab opens)")


class LibraryTests(Base):
    """LMCache's uGDS backend loading our library, and its handle methods on a file (below
    ``open_slab``, whose device checks refuse a file)."""

    def test_find_library_loads_our_libugds_from_ld_library_path(self) -> None:
        name = ctypes.util.find_library("ugds")
        self.assertIsNotNone(name, f"find_library('ugds') found nothing (LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH')})")
        b = lmc_ugds.Backend()
        lib = b.library()  # LMCache's: find_library, CDLL, its signatures (uGDSGetDeviceCapacity required)
        self.assertEqual(lib._name, name, "LMCache fell back to loading 'libugds.so' by name")
        files = [f for f in mapped_files() if os.path.basename(f).startswith("libugds.so")]
        self.assertTrue(files, "no libugds.so mapped")
        self.assertTrue(
            any(os.path.dirname(os.path.realpath(f)) in lib_dirs() for f in files),
            f"libugds mapped from {files}, not from LD_LIBRARY_PATH {lib_dirs()}",
        )
        self.assertTrue(hasattr(lib, "ugdsxCpuStreamCreate"), "the library loaded is not ugds's (no ugds extensions)")

    def test_handle_capacity_and_io_on_a_file(self) -> None:
        fd, path = tempfile.mkstemp(prefix="ugds-lmc-", suffix=".slab", dir=DIR)
        try:
            os.ftruncate(fd, 8 * MiB + 4096)
            os.close(fd)
            b = lmc_ugds.Backend()
            h = b.open_handle(os.open(path, os.O_RDWR), path)  # LMCache's: uGDSHandleRegister
            try:
                self.assertEqual(h.capacity(), 8 * MiB + 4096)  # LMCache's: uGDSGetDeviceCapacity
                put_get(self, h, [(0, pattern("a", 4096)), (4096, pattern("b", 1 * MiB)), (8 * MiB, pattern("c", 4096))])
            finally:
                h.close()
                b.close_driver()
            with open(path, "rb") as f:
                f.seek(4096)
                self.assertEqual(f.read(1 * MiB), pattern("b", 1 * MiB), "the file does not hold what was written")
        finally:
            os.unlink(path)

    def test_lmcache_registers_gpu_tensors_only(self) -> None:
        with self.assertRaises(ValueError) as e:
            lmc_ugds.Backend().register_buffer(torch.empty(4096, dtype=torch.uint8))
        self.assertIn("tensor must be on a CUDA or ROCm GPU", str(e.exception))


class RefusalTests(Base):
    """What LMCache's L1 manager refuses before it opens a slab: each refused with LMCache's own
    message, the process going on (a refused path does not leave the driver open)."""

    def refused(self, path: str, exc: type, msg: str) -> None:
        l1 = parse(l1_manager_args(path)).l1_manager_config
        with claim_cuda(), self.assertRaises(exc) as e:
            L1Manager(l1)
        self.assertIn(msg, str(e.exception))

    def test_a_missing_node_is_refused(self) -> None:
        self.refused("/dev/ugds_drv97", FileNotFoundError, "/dev/ugds_drv97")

    def test_a_character_device_that_is_not_a_ugds_node_is_refused(self) -> None:
        self.refused("/dev/null", ValueError, "uGDS path is not managed by ugds_drv: /dev/null")

    def test_a_regular_file_is_refused(self) -> None:
        fd, path = tempfile.mkstemp(prefix="ugds-lmc-", dir=DIR)
        os.close(fd)
        try:
            self.refused(path, ValueError, f"uGDS path must be a character device: {path}")
        finally:
            os.unlink(path)


@unittest.skipUnless(TARGET, "needs a ugds node (UGDS_LMC_TARGET)")
class NodeTests(Base):
    """LMCache's L1 manager on a ugds node: its GDS context opens the slab through the ugds
    backend (both configuration ways), with the sysfs-class check, our library found by
    find_library and the capacity from uGDSGetDeviceCapacity; chunks are allocated by LMCache's
    L1 manager and written and read at their slab offsets through LMCache's handle."""

    def capacity(self) -> int:
        c = os.environ.get("UGDS_LMC_CAPACITY")
        return int(c) if c else ugds.open(TARGET).capacity

    def assert_ugds_node(self) -> None:
        """The node is of the sysfs class LMCache's check names."""
        rdev = os.stat(TARGET).st_rdev
        subsystem = os.path.realpath(f"/sys/dev/char/{os.major(rdev)}:{os.minor(rdev)}/subsystem")
        self.assertEqual(os.path.basename(subsystem), "ugds_drv")

    def assert_direct(self, st=None) -> None:
        """Our library in this process mapped the node (its doorbells and status page: the direct
        path); the ugds package's storage on it is direct."""
        node = os.path.realpath(TARGET)
        self.assertIn(node, [os.path.realpath(f) for f in mapped_files() if f.startswith("/dev/")], "not the direct path")
        if st is not None:
            self.assertTrue(st.is_direct)

    def test_the_l1_manager_opens_the_node_both_ways(self) -> None:
        self.assert_ugds_node()
        for how, argv in (("--l1-manager", l1_manager_args(TARGET)), ("legacy flags", legacy_args(TARGET))):
            with self.subTest(how=how):
                l1cfg = parse(argv).l1_manager_config
                with claim_cuda():
                    mgr = L1Manager(l1cfg)
                try:
                    ctx = get_l1_gds_context(mgr.l1_manager_id)
                    self.assertTrue(ctx.initialized)
                    self.assertIs(type(ctx.backend), lmc_ugds.Backend)
                    handle = ctx._slab_handle
                    self.assertIsInstance(handle, lmc_ugds.AsyncHandle)
                    self.assertEqual(handle.path, TARGET)
                    self.assertEqual(handle.capacity(), self.capacity())
                    lib = ctx.backend.library()
                    self.assertEqual(lib._name, ctypes.util.find_library("ugds"))
                    self.assertTrue(hasattr(lib, "ugdsxCpuStreamCreate"), "not ugds's library")
                    # Two chunks' slab offsets from the L1 manager's GDS allocator.
                    am = mgr._memory_manager._address_manager
                    chunks = [am.allocate(256 * 1024) for _ in range(2)]
                    offsets = [off for off, _ in chunks]
                    self.assertEqual(len(set(offsets)), 2)
                    self.assertTrue(all(0 <= off and off + 256 * 1024 <= SLAB for off in offsets), offsets)
                    data = [pattern(f"{how}-{i}", 256 * 1024) for i in range(2)]
                    put_get(self, handle, list(zip(offsets, data)))
                    self.assert_direct()
                    for off, n in chunks:
                        am.free(off, n)
                finally:
                    mgr.close()
                self.assertFalse(ctx.initialized, "closing the L1 manager left its GDS context open")
                # On the disk, where LMCache's allocator put them (read by the ugds package).
                st = ugds.open(TARGET)
                self.assert_direct(st)
                for off, d in zip(offsets, data):
                    self.assertEqual(st.read_bytes(off, len(d)), d)
                del st

    def test_a_slab_larger_than_the_node_is_refused(self) -> None:
        cap = self.capacity()
        l1 = parse(l1_manager_args(TARGET, size_gb=(cap + 4096 * 16) / (1 << 30))).l1_manager_config
        with claim_cuda(), self.assertRaises(ValueError) as e:
            L1Manager(l1)
        self.assertIn("exceeds backing device capacity", str(e.exception))
        self.assertIn(f"({cap} bytes): {TARGET}", str(e.exception))
        # Refused after the driver was opened: LMCache closed it again, and the next L1 opens.
        self.assertEqual(len(lmc_ugds.Backend._driver._owners), 0)
        with claim_cuda():
            mgr = L1Manager(parse(l1_manager_args(TARGET)).l1_manager_config)
        self.assertTrue(get_l1_gds_context(mgr.l1_manager_id).initialized)
        mgr.close()


class L2PluginTests(Base):
    """LMCache's native-plugin L2 adapter made from its --l2-adapter JSON: LMCache imports
    ugds.lmcache and wraps UgdsConnector; stores go through the adapter."""

    def setUp(self) -> None:
        if TARGET:
            self.path = TARGET
            kv.open(TARGET, create=True, capacity=SLAB).close()  # a fresh store at the start of the node
            self.params = {"path": TARGET}
        else:
            fd, self.path = tempfile.mkstemp(prefix="ugds-lmc-l2-", dir=DIR)
            os.close(fd)
            os.unlink(self.path)
            self.params = {"path": self.path, "capacity": SLAB}

    def tearDown(self) -> None:
        if not TARGET and os.path.exists(self.path):
            os.unlink(self.path)
        super().tearDown()

    def adapter(self, **spec):
        base = {"type": "native_plugin", "module_path": "ugds.lmcache", "class_name": "UgdsConnector", "adapter_params": self.params}
        base.update(spec)
        p = __import__("argparse").ArgumentParser()
        from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args

        add_l2_adapters_args(p)
        cfg = parse_args_to_l2_adapters_config(p.parse_args(["--l2-adapter", json.dumps(base)]))
        self.assertEqual(len(cfg.adapters), 1)
        return cfg.adapters[0], create_l2_adapter(cfg.adapters[0])

    def test_the_native_plugin_json_loads_our_connector(self) -> None:
        cfg, a = self.adapter()
        self.assertIsInstance(cfg, NativePluginL2AdapterConfig)
        self.assertEqual((cfg.module_path, cfg.class_name, cfg.adapter_params), ("ugds.lmcache", "UgdsConnector", self.params))
        try:
            self.assertIsInstance(a, NativeConnectorL2Adapter)
            self.assertIs(type(a._client), UgdsConnector)
            self.assertEqual(a._client.store.st.is_direct, bool(TARGET))
            keys = [ObjectKey(chunk_hash=f"l2-{i}".encode().ljust(32, b"."), model_name="m", kv_rank=i) for i in range(3)]
            data = [pattern(f"l2-{i}", n) for i, n in enumerate([4096, 100_000, 1 * MiB])]
            task = a.submit_store_task(keys, [BytesBufferMemoryObj(bytearray(d)) for d in data])
            deadline = time.monotonic() + TIMEOUT
            done = {}
            while task not in done and time.monotonic() < deadline:
                if select.select([a.get_store_event_fd()], [], [], 0.5)[0]:
                    consume_fd(a.get_store_event_fd())
                done.update(a.pop_completed_store_tasks())
            self.assertIn(task, done, "the store did not complete")
            self.assertTrue(done[task].is_successful(), "LMCache's adapter reports the store failed")
            self.assertEqual(done[task].bytes_transferred(), sum(map(len, data)))
        finally:
            a.close()
        s = kv.open(self.path)
        for k, d in zip(keys, data):
            self.assertEqual(s.get(_object_key_to_string(k)), d, "the store does not hold what LMCache stored")
        s.close()

    def test_bad_plugin_specs_are_refused(self) -> None:
        cases = [
            ({"module_path": "ugds.nope"}, ImportError, "Could not import module 'ugds.nope'"),
            ({"class_name": "Nope"}, AttributeError, "Module 'ugds.lmcache' has no class 'Nope'"),
            ({"adapter_params": {**self.params, "bogus": 1}}, TypeError, "bogus"),
            ({"adapter_params": {}}, TypeError, "path"),
        ]
        for spec, exc, msg in cases:
            with self.subTest(spec=spec):
                with self.assertRaises(exc) as e:
                    self.adapter(**spec)
                self.assertIn(msg, str(e.exception))


if __name__ == "__main__":
    from ugds_test_runner import run

    sys.exit(run(__name__))

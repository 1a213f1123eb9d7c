"""kvikio (RAPIDS) over ugds's cuFile drop-in: write and read back unregistered CuPy and torch GPU
memory, byte for byte, and prove which libcufile did the I/O.

Run on the GPU machine with the kvikio wheels on PYTHONPATH, e.g.
    KVIKIO_COMPAT_MODE=OFF KVIKIO_GDS_THRESHOLD=1 \
    LD_PRELOAD=PREFIX/lib/ugds-cufile/libcufile.so.0 python3 kvikio_client.py DIR
Prints which file provides the cuFile symbols kvikio calls (dladdr on cuFileRead of the
libcufile.so.0 loaded in the process, and every libcufile mapped), kvikio's settings, and for each
case the cuFile statistics (cuFileGetStatsL1: read/write operations and bytes) that the loaded
libcufile counted during the case: zero means the case did not go through cuFile.
Exit 0 = every case correct and every case's bytes went through a libcufile.
"""

import ctypes
import os
import sys
import time

OK = True


def say(*a):
    print(*a, flush=True)


def fail(msg):
    global OK
    OK = False
    say("FAIL", msg)


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def mapped_cufile():
    seen = []
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1] if len(line.split()) >= 6 else ""
            if "libcufile" in p and p not in seen:
                seen.append(p)
    return seen


def loaded_cufile():
    """The libcufile.so.0 the process already has (what kvikio's dlopen("libcufile.so.0") got)."""
    try:
        lib = ctypes.CDLL("libcufile.so.0", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError as e:
        return None, f"none loaded ({e})"
    libdl = ctypes.CDLL(None)
    info = DlInfo()
    addr = ctypes.cast(lib.cuFileRead, ctypes.c_void_p)
    if not libdl.dladdr(addr, ctypes.byref(info)):
        return lib, "dladdr failed"
    return lib, os.path.realpath(info.dli_fname.decode())


class Stats:
    """cuFileGetStatsL1 of the loaded libcufile: read_ops.ok @0, write_ops.ok @16, read_bytes @96,
    write_bytes @104 (CUfileStatsLevel1_t, 512 bytes)."""

    def __init__(self, lib):
        self.lib = lib
        self.ok = False
        if lib is None:
            return
        for f in ("cuFileSetStatsLevel", "cuFileStatsStart", "cuFileGetStatsL1"):
            getattr(lib, f).restype = ctypes.c_uint64  # CUfileError_t {int,int} in rax
        r1 = lib.cuFileSetStatsLevel(ctypes.c_int(1)) & 0xFFFFFFFF
        r2 = lib.cuFileStatsStart() & 0xFFFFFFFF
        self.ok = r1 == 0 and r2 == 0
        say(f"stats: cuFileSetStatsLevel(1) err={r1} cuFileStatsStart err={r2}")

    def get(self):
        if not self.ok:
            return None
        buf = (ctypes.c_uint64 * 64)()
        r = self.lib.cuFileGetStatsL1(buf) & 0xFFFFFFFF
        if r != 0:
            return None
        return {"read_ops": buf[0], "read_err": buf[1], "write_ops": buf[2], "write_err": buf[3],
                "read_bytes": buf[12], "write_bytes": buf[13]}


def delta(a, b):
    if a is None or b is None:
        return None
    return {k: b[k] - a[k] for k in a}


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
    say("env:", {k: v for k, v in os.environ.items()
                 if k.startswith("KVIKIO") or k in ("LD_PRELOAD", "LD_LIBRARY_PATH", "CUFILE_ENV_PATH_JSON")})
    import kvikio
    import kvikio.cufile_driver
    import kvikio.defaults
    say("kvikio", kvikio.__version__, "from", os.path.dirname(kvikio.__file__))
    say("after import, libcufile mapped:", mapped_cufile())
    try:
        say("libcufile_version:", kvikio.cufile_driver.libcufile_version())
    except Exception as e:
        say("libcufile_version raised:", repr(e))
    try:
        kvikio.cufile_driver.driver_open()
        say("cufile_driver.driver_open: ok")
    except Exception as e:
        say("cufile_driver.driver_open raised:", repr(e))
    lib, path = loaded_cufile()
    say("libcufile.so.0 in this process (dladdr of cuFileRead):", path)
    say("libcufile mapped:", mapped_cufile())
    ours = "ugds-cufile" in path
    say("ugds drop-in in use:", ours)
    for k in ("compat_mode", "gds_threshold", "task_size", "num_threads", "bounce_buffer_size"):
        try:
            say(f"kvikio.defaults.get({k!r}) =", kvikio.defaults.get(k))
        except Exception as e:
            say(f"kvikio.defaults.get({k!r}) raised", repr(e))
    compat = kvikio.defaults.is_compat_mode_preferred()
    say("kvikio.defaults.is_compat_mode_preferred() =", compat)
    for k in ("poll_mode", "max_device_cache_size", "max_pinned_memory_size"):
        try:
            say(f"kvikio.cufile_driver.get({k!r}) =", kvikio.cufile_driver.get(k))
        except Exception as e:
            say(f"kvikio.cufile_driver.get({k!r}) raised", repr(e))
    stats = Stats(lib)

    import cupy
    import numpy
    import torch

    path = os.path.join(d, "kvikio-ugds.dat")
    cases = [("4 KiB", 4096, 0, 0), ("1 MiB + 3 at odd offset", (1 << 20) + 3, 12345, 1),
             ("64 MiB", 64 << 20, 1 << 20, 0)]
    results = []
    rng = numpy.random.default_rng(7)
    for lib_name in ("cupy", "torch"):
        for api in ("read/write", "raw_read/raw_write"):
            for name, size, foff, boff in cases:
                label = f"{lib_name:5} {api:18} {name}"
                try:
                    host = rng.integers(0, 256, size, dtype=numpy.uint8)
                    # Source and destination: slices at byte offset `boff` of fresh, unregistered
                    # allocations (boff=1 gives an odd device address).
                    if lib_name == "cupy":
                        src_all = cupy.zeros(size + boff + 7, dtype=cupy.uint8)
                        src = src_all[boff:boff + size]
                        src.set(host)
                        dst_all = cupy.zeros(size + boff + 7, dtype=cupy.uint8)
                        dst = dst_all[boff:boff + size]
                        cupy.cuda.Device().synchronize()
                    else:
                        src_all = torch.zeros(size + boff + 7, dtype=torch.uint8, device="cuda")
                        src = src_all[boff:boff + size]
                        src.copy_(torch.from_numpy(host))
                        dst_all = torch.zeros(size + boff + 7, dtype=torch.uint8, device="cuda")
                        dst = dst_all[boff:boff + size]
                        torch.cuda.synchronize()
                    s0 = stats.get()
                    t0 = time.perf_counter()
                    if os.path.exists(path):
                        os.unlink(path)
                    with kvikio.CuFile(path, "w+") as f:
                        if api == "read/write":
                            w = f.write(src, size, foff)
                            r = f.read(dst, size, foff)
                        else:
                            w = f.raw_write(src, size, foff)
                            r = f.raw_read(dst, size, foff)
                    dt = time.perf_counter() - t0
                    s1 = stats.get()
                    got = dst.get() if lib_name == "cupy" else dst.cpu().numpy()
                    with open(path, "rb") as fh:
                        fh.seek(foff)
                        on_disk = numpy.frombuffer(fh.read(size), dtype=numpy.uint8)
                    good = (w == size and r == size and numpy.array_equal(got, host)
                            and on_disk.size == size and numpy.array_equal(on_disk, host))
                    dd = delta(s0, s1)
                    via = "?"
                    if dd is not None:
                        via = (f"cuFile counted {dd['write_ops']} writes/{dd['write_bytes']} B, "
                               f"{dd['read_ops']} reads/{dd['read_bytes']} B")
                        if dd["write_bytes"] < size or dd["read_bytes"] < size:
                            good = False
                            via += " (NOT through cuFile)"
                    status = "PASS" if good else "FAIL"
                    if (not good and compat and w == size and r == size and numpy.array_equal(got, host)
                            and numpy.array_equal(on_disk, host)):
                        # kvikio chose its own POSIX path (compat mode): correct, but not cuFile.
                        status, good = "POSIX", True
                        results.append((label, status, f"{dt * 1e3:.1f} ms", via))
                        say(f"{status}  {label}: {dt * 1e3:.1f} ms; {via}")
                        continue
                    if not good:
                        bad = numpy.nonzero(got != host)[0] if got.size == host.size else []
                        via += f"; wrote {w} read {r}; first bad byte {bad[0] if len(bad) else '-'}"
                        fail(label)
                    results.append((label, status, f"{dt * 1e3:.1f} ms", via))
                    say(f"{status}  {label}: {dt * 1e3:.1f} ms; {via}")
                except Exception as e:
                    results.append((label, "FAIL", "-", repr(e)))
                    fail(f"{label}: {e!r}")
    if os.path.exists(path):
        os.unlink(path)
    say("| case | result | time | through |")
    say("| --- | --- | ---: | --- |")
    for r in results:
        say("| " + " | ".join(r) + " |")
    if not ours:
        say("NOTE: the libcufile in use is not ugds's drop-in")
    posix = any(r[1] == "POSIX" for r in results)
    verdict = "PASS" if OK and ours and not posix else ("COMPAT (kvikio's POSIX path, data correct)" if OK and ours else "FAIL")
    say("KVIKIO-CLIENT", verdict, "ugds" if ours else path)
    return 0 if OK and ours and not posix else 1


if __name__ == "__main__":
    sys.exit(main())

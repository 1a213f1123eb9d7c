"""cufile-python (PyPI `cufile-python`, module `cufile`) over ugds's cuFile drop-in: write and read
back unregistered CuPy and torch GPU memory, byte for byte.

cufile-python loads `libcufile.so` with ctypes at import, so one LD_LIBRARY_PATH entry points it
at ugds:
    LD_LIBRARY_PATH=PREFIX/lib/ugds-cufile python3 cufile_python_client.py DIR
Prints the file that provides cuFileRead (dladdr) and, per case, what the loaded libcufile's
statistics (cuFileGetStatsL1) counted. Exit 0 = every case correct, through ugds.
"""

import ctypes
import os
import sys
import time

OK = True


def say(*a):
    print(*a, flush=True)


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def provider(fn):
    info = DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)):
        return "dladdr failed"
    return os.path.realpath(info.dli_fname.decode())


def main():
    global OK
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
    say("env:", {k: os.environ.get(k) for k in ("LD_PRELOAD", "LD_LIBRARY_PATH") if k in os.environ})
    import cufile
    from cufile import bindings
    lib = bindings.libcufile
    where = provider(lib.cuFileRead)
    ours = "ugds-cufile" in where or "libcufile_ugds" in where
    say("cufile-python", getattr(cufile, "__version__", "?"), "from", os.path.dirname(cufile.__file__))
    say("libcufile.so used (dladdr of cuFileRead):", where, "-> ugds" if ours else "-> NOT ugds")

    for f in ("cuFileSetStatsLevel", "cuFileStatsStart", "cuFileGetStatsL1"):
        getattr(lib, f).restype = ctypes.c_uint64
    bindings.cuFileDriverOpen()
    e1 = lib.cuFileSetStatsLevel(ctypes.c_int(1)) & 0xFFFFFFFF
    e2 = lib.cuFileStatsStart() & 0xFFFFFFFF
    say(f"stats: SetStatsLevel(1) err={e1} StatsStart err={e2}")

    def stats():
        buf = (ctypes.c_uint64 * 64)()
        if lib.cuFileGetStatsL1(buf) & 0xFFFFFFFF:
            return None
        return buf[0], buf[2], buf[12], buf[13]  # read ok, write ok, read bytes, write bytes

    import cupy
    import numpy
    import torch

    path = os.path.join(d, "cufile-python-ugds.dat")
    cases = [("4 KiB", 4096, 0, 0), ("1 MiB + 3 at odd offset", (1 << 20) + 3, 12345, 1),
             ("64 MiB", 64 << 20, 1 << 20, 0)]
    rng = numpy.random.default_rng(11)
    rows = []
    for lib_name in ("cupy", "torch"):
        for name, size, foff, boff in cases:
            label = f"{lib_name:5} {name}"
            try:
                host = rng.integers(0, 256, size, dtype=numpy.uint8)
                if lib_name == "cupy":
                    src = cupy.zeros(size + boff + 7, dtype=cupy.uint8)
                    src[boff:boff + size].set(host)
                    dst = cupy.zeros(size + boff + 7, dtype=cupy.uint8)
                    cupy.cuda.Device().synchronize()
                    sp, dp = src.data.ptr, dst.data.ptr
                else:
                    src = torch.zeros(size + boff + 7, dtype=torch.uint8, device="cuda")
                    src[boff:boff + size].copy_(torch.from_numpy(host))
                    dst = torch.zeros(size + boff + 7, dtype=torch.uint8, device="cuda")
                    torch.cuda.synchronize()
                    sp, dp = src.data_ptr(), dst.data_ptr()
                if os.path.exists(path):
                    os.unlink(path)
                s0 = stats()
                t0 = time.perf_counter()
                with cufile.CuFile(path, "w+") as f:
                    # (buffer base, size, file offset, offset in the buffer): the buffers were
                    # never registered with cuFileBufRegister.
                    w = f.write(ctypes.c_void_p(sp), size, foff, boff)
                    r = f.read(ctypes.c_void_p(dp), size, foff, boff)
                dt = time.perf_counter() - t0
                s1 = stats()
                got = (dst[boff:boff + size].get() if lib_name == "cupy"
                       else dst[boff:boff + size].cpu().numpy())
                with open(path, "rb") as fh:
                    fh.seek(foff)
                    on_disk = numpy.frombuffer(fh.read(size), dtype=numpy.uint8)
                # cuFileRead/Write return ssize_t; cufile-python declares size_t.
                w = ctypes.c_ssize_t(w).value
                r = ctypes.c_ssize_t(r).value
                good = w == size and r == size and numpy.array_equal(got, host) and numpy.array_equal(on_disk, host)
                via = "-"
                if s0 and s1:
                    via = (f"cuFile counted {s1[1] - s0[1]} writes/{s1[3] - s0[3]} B, "
                           f"{s1[0] - s0[0]} reads/{s1[2] - s0[2]} B")
                    if s1[3] - s0[3] < size or s1[2] - s0[2] < size:
                        good = False
                if not good:
                    OK = False
                    via += f"; write returned {w}, read returned {r}"
                status = "PASS" if good else "FAIL"
                rows.append((label, status, f"{dt * 1e3:.1f} ms", via))
                say(f"{status}  {label}: {dt * 1e3:.1f} ms; {via}")
            except Exception as e:
                OK = False
                rows.append((label, "FAIL", "-", repr(e)))
                say(f"FAIL  {label}: {e!r}")
    if os.path.exists(path):
        os.unlink(path)
    say("| case | result | time | through |")
    say("| --- | --- | ---: | --- |")
    for r in rows:
        say("| " + " | ".join(r) + " |")
    say("CUFILE-PYTHON-CLIENT", "PASS" if OK and ours else "FAIL", where)
    return 0 if OK and ours else 1


if __name__ == "__main__":
    sys.exit(main())

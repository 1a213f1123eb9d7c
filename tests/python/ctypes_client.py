"""libugds through ctypes, declared the way existing clients declare it (LMCache's uGDS backend:
one-argument uGDSStreamRegister, c_void_p handles, the {err, cu_err} status struct), against a
file. Finds the library with ctypes.util.find_library("ugds") (LD_LIBRARY_PATH names its
folder). Exit status 0 and a last line "PY-CTYPES ok" when every check passed.

    LD_LIBRARY_PATH=PREFIX/lib python3 ctypes_client.py FILE
"""
import ctypes
import ctypes.util
import mmap
import os
import sys


class Status(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]


class DescrHandle(ctypes.Union):
    _fields_ = [("fd", ctypes.c_int), ("handle", ctypes.c_void_p)]


class Descr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handle", DescrHandle)]


def load():
    name = ctypes.util.find_library("ugds")
    if name is None:
        raise SystemExit("find_library('ugds') found nothing")
    lib = ctypes.CDLL(name)
    vp, u64p, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int64)
    for fn, args in [
        ("uGDSDriverOpen", []),
        ("uGDSDriverClose", []),
        ("uGDSHandleRegister", [ctypes.POINTER(vp), ctypes.POINTER(Descr)]),
        ("uGDSGetDeviceCapacity", [vp, u64p]),
        ("uGDSBufRegister", [vp, ctypes.c_size_t, ctypes.c_int]),
        ("uGDSBufDeregister", [vp]),
        ("uGDSReadAsync", [vp, vp, ctypes.POINTER(ctypes.c_size_t), i64p, i64p, i64p, vp]),
        ("uGDSWriteAsync", [vp, vp, ctypes.POINTER(ctypes.c_size_t), i64p, i64p, i64p, vp]),
        ("uGDSStreamRegister", [vp]),
        ("uGDSStreamDeregister", [vp]),
        ("ugdsxCpuStreamCreate", [ctypes.POINTER(vp)]),
        ("ugdsxCpuStreamSynchronize", [vp]),
        ("ugdsxCpuStreamDestroy", [vp]),
    ]:
        f = getattr(lib, fn)
        f.argtypes, f.restype = args, Status
    lib.uGDSHandleDeregister.argtypes, lib.uGDSHandleDeregister.restype = [vp], None
    return name, lib


def main(path):
    checks = []

    def check(ok, what):
        checks.append(ok)
        if not ok:
            print(f"not ok - {what}")

    name, lib = load()
    check(name.startswith("libugds.so"), f"find_library gave {name}")
    check(lib.uGDSDriverOpen().err == 0, "DriverOpen")
    check(lib.uGDSDriverOpen().err == 0, "DriverOpen again (LMCache treats any error as fatal)")
    size = 4 << 20
    with open(path, "wb") as f:
        f.truncate(size)
    fd = os.open(path, os.O_RDWR)
    d = Descr(type=1)
    d.handle.fd = fd
    h = ctypes.c_void_p()
    check(lib.uGDSHandleRegister(ctypes.byref(h), ctypes.byref(d)).err == 0, "HandleRegister")
    check(ctypes.cast(h, ctypes.POINTER(ctypes.c_int))[0] == fd, "the handle's first int is the fd")
    cap = ctypes.c_uint64()
    check(lib.uGDSGetDeviceCapacity(h, ctypes.byref(cap)).err == 0 and cap.value == size, f"capacity {cap.value}")
    mem = mmap.mmap(-1, 1 << 20)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mem))
    check(lib.uGDSBufRegister(base, 1 << 20, 0).err == 0, "BufRegister")
    s = ctypes.c_void_p()
    check(lib.ugdsxCpuStreamCreate(ctypes.byref(s)).err == 0, "CPU stream")
    check(lib.uGDSStreamRegister(s).err == 0, "one-argument StreamRegister")
    pattern = bytes((i * 7 + 3) % 251 for i in range(65536))
    mem[0:65536] = pattern
    n, foff, boff, done = ctypes.c_size_t(65536), ctypes.c_int64(8192), ctypes.c_int64(0), ctypes.c_int64(-1)
    check(lib.uGDSWriteAsync(h, base, ctypes.byref(n), ctypes.byref(foff), ctypes.byref(boff), ctypes.byref(done), s).err == 0, "WriteAsync")
    check(lib.ugdsxCpuStreamSynchronize(s).err == 0 and done.value == 65536, f"write done {done.value}")
    mem[0:65536] = bytes(65536)
    boff.value, done.value = 65536, -1
    check(lib.uGDSReadAsync(h, base, ctypes.byref(n), ctypes.byref(foff), ctypes.byref(boff), ctypes.byref(done), s).err == 0, "ReadAsync")
    check(lib.ugdsxCpuStreamSynchronize(s).err == 0 and done.value == 65536, f"read done {done.value}")
    check(mem[65536:131072] == pattern, "the data read back")
    with open(path, "rb") as f:
        f.seek(8192)
        check(f.read(65536) == pattern, "the file holds what was written")
    check(lib.uGDSStreamDeregister(s).err == 0, "StreamDeregister")
    check(lib.ugdsxCpuStreamDestroy(s).err == 0, "stream destroyed")
    check(lib.uGDSBufDeregister(base).err == 0, "BufDeregister")
    lib.uGDSHandleDeregister(h)
    os.close(fd)
    check(lib.uGDSDriverClose().err == 0, "DriverClose")
    check(lib.uGDSDriverClose().err == 5001, "second DriverClose: DRIVER_NOT_INITIALIZED")
    os.unlink(path)
    print(f"PY-CTYPES checks={len(checks)} failed={checks.count(False)}")
    if all(checks):
        print("PY-CTYPES ok")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

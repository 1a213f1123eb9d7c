"""Recovery time of a ``ugds.kv`` store holding N objects of 4 KiB (default 100 000), written in
batches of 256: reopening after the writer went away without ``close()`` (the journal is
replayed) and after ``close()`` (a checkpoint only). Every object is then checked present and
a sample read back. Usage: ``python3 kv_recovery.py DIR [N]``; informational, one run.
"""

from __future__ import annotations

import os
import sys
import time

import ugds.kv as kv

DIR = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
BATCH = 256
path = os.path.join(DIR, "kv-recovery.store")
cap = N * 4096 * 5 // 4 + (96 << 20)
with open(path, "wb") as f:
    f.truncate(cap)


def val(i: int) -> bytes:
    return i.to_bytes(8, "little") * 512


t0 = time.perf_counter()
s = kv.open(path, durable=False)
for i in range(0, N, BATCH):
    s.set_many([(b"obj-%d" % j, val(j)) for j in range(i, min(N, i + BATCH))])
t1 = time.perf_counter()
print(f"wrote {N} objects of 4 KiB in {t1 - t0:.2f} s ({cap >> 20} MiB store on {s.st.describe()})")
del s  # no close(): the next open replays the journal

t0 = time.perf_counter()
s = kv.open(path)
t1 = time.perf_counter()
st = s.stats()
print(f"open after the writer went away (journal replay): {t1 - t0:.2f} s, {st.replayed} records replayed, {len(s)} objects")
ok = len(s) == N and all(s.exists_many([b"obj-%d" % i for i in range(N)]))
ok = ok and all(s.get(b"obj-%d" % i) == val(i) for i in range(0, N, N // 97 or 1))
s.close()

t0 = time.perf_counter()
s = kv.open(path)
t1 = time.perf_counter()
print(f"open after close() (checkpoint only): {t1 - t0:.2f} s, {s.stats().replayed} records replayed, {len(s)} objects")
ok = ok and len(s) == N
s.close()
os.unlink(path)
print("RECOVERY", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)

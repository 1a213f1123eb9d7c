"""``ugds.kv``: a persistent key-value object store on a ugds device, a block device or a file.

Objects are keyed by bytes (LMCache's chunk keys), values of any size. The layout (all offsets in
units of ``max(block size, 4096)`` bytes; docs/python.md, "The KV store", says why each piece is
there)::

    superblock | checkpoint A | checkpoint B | journal | data extents ...

- data: one extent per object, from a first-fit extent allocator over the data region;
- journal: one checksummed record per batch of changes (put: key, extent, length, CRC-32 of
  the value; delete), appended in sequence-number order;
- checkpoints: the whole index, written to the older slot when the journal is full and on
  ``close()``; opening loads the newer valid one and replays the journal records that follow it
  (a record counts only when its checksum and sequence number are right).

A ``set`` is acknowledged only after its data and then its journal record were written (with a
flush after each when ``durable``), so after a crash, kill -9 or power cut every acknowledged
object is found again. A value is checked against its CRC-32 on every read: a torn or
overwritten extent reads as missing, never as data. When the data region is full the least
recently used objects are evicted (``eviction="lru"``, their deletion journaled before their
space is reused) or ``StoreFull`` is raised (``eviction="error"``).
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import ugds
from .errors import InvalidArgument, StoreFull

MAX_KEY = 4096
# The staging buffer a batch's values pass through is kept for the next batch up to this size
# (allocating and first touching a fresh one per batch cost more than the I/O on small values).
_STAGE_KEEP = 256 << 20
# Values at least this large whose length is a multiple of the unit are written from (and read
# into) the caller's memory itself, registered for the batch: no copy (LMCache's chunks are).
_IN_PLACE_MIN = 256 << 10
# Metadata writes up to this size go through a registered buffer kept for them.
_META_KEEP = 1 << 20
_SB_MAGIC = b"UGDSKV01"
_CP_MAGIC = b"UGDSKVCP"
_JR_MAGIC = b"UGDSKVJR"
# Each header is followed by the CRC-32 (u32) of the header and what follows it. `sid` is the
# store's random id: records of an earlier store formatted on the same target never count.
_SB = struct.Struct("<8sIIQQQQQQQQQ")  # magic, version, unit, capacity, journal, checkpoints, data, sid
_CP = struct.Struct("<8sQQQQQQ")  # magic, sid, generation, seq, journal position, entries, payload bytes
_JR = struct.Struct("<8sQQII")  # magic, sid, seq, ops, payload bytes
_ENTRY = struct.Struct("<QQI")  # offset, length, crc32 of the value
_PUT, _DEL = 1, 2

Key = Union[bytes, str]


def _key(k: Key) -> bytes:
    b = k.encode() if isinstance(k, str) else bytes(k)
    if not b or len(b) > MAX_KEY:
        raise _invalid("key", f"a key of {len(b)} bytes (1 to {MAX_KEY} allowed)")
    return b


def _invalid(arg: str, reason: str) -> InvalidArgument:
    e = InvalidArgument(f"invalid argument `{arg}`: {reason}")
    e.arg, e.reason, e.errno, e.kind = arg, reason, 22, "InvalidArgument"
    return e


def _full(what: str, need: int, have: int) -> StoreFull:
    e = StoreFull(f"the store's {what} is full: {need} bytes needed, {have} free (eviction is off)")
    e.what, e.need, e.free, e.errno, e.kind = what, need, have, 28, "StoreFull"
    return e


def _crc(b) -> int:
    # zlib's CRC-32 (the on-disk format), computed by the extension without the GIL.
    return ugds.crc32(b)


class Entry(NamedTuple):
    """Where an object lives: byte offset and length of its value, CRC-32 of the value."""

    offset: int
    length: int
    crc: int


class _Extents:
    """First-fit allocator over [start, end) in units; free extents kept sorted and coalesced.
    An empty value still takes one unit (every object has an extent of its own)."""

    def __init__(self, start: int, end: int, unit: int) -> None:
        self.unit = unit
        self.free: List[List[int]] = [[start, end - start]] if end > start else []

    def free_bytes(self) -> int:
        return sum(n for _, n in self.free)

    def alloc(self, nbytes: int) -> Optional[int]:
        n = _pad(max(nbytes, 1), self.unit)
        for i, (off, size) in enumerate(self.free):
            if size >= n:
                if size == n:
                    del self.free[i]
                else:
                    self.free[i] = [off + n, size - n]
                return off
        return None

    def release(self, off: int, nbytes: int) -> None:
        n = _pad(max(nbytes, 1), self.unit)
        lo, hi = 0, len(self.free)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.free[mid][0] < off:
                lo = mid + 1
            else:
                hi = mid
        self.free.insert(lo, [off, n])
        if lo + 1 < len(self.free) and self.free[lo][0] + self.free[lo][1] == self.free[lo + 1][0]:
            self.free[lo][1] += self.free.pop(lo + 1)[1]
        if lo > 0 and self.free[lo - 1][0] + self.free[lo - 1][1] == self.free[lo][0]:
            self.free[lo - 1][1] += self.free.pop(lo)[1]

    @classmethod
    def around(cls, start: int, end: int, unit: int, used: Iterable["Entry"]) -> "_Extents":
        """The free list of [start, end) less the extents of `used` (at open: one sort)."""
        x = cls(start, end, unit)
        x.free, pos = [], start
        for off, n in sorted((e.offset, _pad(max(e.length, 1), unit)) for e in used):
            if off < pos or off + n > end:
                raise RuntimeError(f"extent {off}+{n} overlaps another object or the end (corrupt index)")
            if off > pos:
                x.free.append([pos, off - pos])
            pos = off + n
        if end > pos:
            x.free.append([pos, end - pos])
        return x

    def take(self, off: int, nbytes: int) -> None:
        """Marks [off, off+nbytes) used again (an eviction undone)."""
        n = _pad(max(nbytes, 1), self.unit)
        for i, (fo, fs) in enumerate(self.free):
            if fo <= off and off + n <= fo + fs:
                parts = [[fo, off - fo], [off + n, fo + fs - off - n]]
                self.free[i : i + 1] = [p for p in parts if p[1] > 0]
                return
        raise RuntimeError(f"extent {off}+{n} is not free")


class Stats(NamedTuple):
    """What the store holds: objects, bytes of values, free data bytes, evictions since open,
    objects found torn (CRC mismatch) and dropped since open, journal records replayed at open."""

    objects: int
    value_bytes: int
    free_bytes: int
    evictions: int
    torn: int
    replayed: int


def _pad(n: int, unit: int) -> int:
    return -(-n // unit) * unit


class Store:
    """A persistent object store (see the module comment). Thread-safe: changes (sets, deletes,
    evictions, checkpoints) run one at a time; reads of several threads run at once, each thread
    with its own batch and staging buffer (a read that meets an extent reused meanwhile fails its
    checksum and reads as missing, never as data).

    ``target``: a path (opened with ``ugds.open``) or an open ``ugds.Storage``. ``create``: format
    when no valid store is found (``"auto"``), always (``True``), or never (``False``: raise).
    ``durable``: flush after the data and after the journal record of each batch (power-cut
    safety; a kill -9 needs no flush). ``capacity``: bytes of the target to use (default all).
    """

    def __init__(
        self,
        target: Union[str, "ugds.Storage"],
        *,
        create: Union[bool, str] = "auto",
        eviction: str = "lru",
        durable: bool = True,
        capacity: Optional[int] = None,
        journal_bytes: Optional[int] = None,
        checkpoint_bytes: Optional[int] = None,
    ) -> None:
        if eviction not in ("lru", "error"):
            raise _invalid("eviction", f"{eviction!r}: use 'lru' or 'error'")
        self.st = ugds.open(target) if isinstance(target, str) else target
        self.eviction = eviction
        self.durable = durable
        self.unit = max(self.st.block_size, 4096)
        self._lock = threading.RLock()
        self.index: "OrderedDict[bytes, Entry]" = OrderedDict()
        self._evictions = 0
        self._meta_buf: Optional["ugds.Buffer"] = None
        # Per thread: its batch (and capacity) and staging buffer; every batch made, for close().
        self._tls = threading.local()
        self._batches: List["ugds.Batch"] = []
        self._torn = 0
        self._replayed = 0
        sb = self._read_superblock()
        if create is True or (sb is None and create == "auto"):
            self._format(capacity, journal_bytes, checkpoint_bytes)
        elif sb is None:
            raise _invalid("target", f"{self.st.path} holds no ugds.kv store (open with create='auto' to make one)")
        else:
            self._load(sb)

    # ---------------------------------------------------------------------------- layout

    def _read(self, off: int, n: int) -> bytes:
        return self.st.read_bytes(off, _pad(n, self.unit))[:n]

    def _write(self, data: bytes, off: int) -> None:
        n = _pad(len(data), self.unit)
        if n > _META_KEEP:
            self.st.write_bytes(data + bytes(n - len(data)), off)
            return
        # Journal records and superblocks: through a registered buffer kept for them (a fresh
        # one per record cost an allocation, and a pinning on the direct path, each time).
        if self._meta_buf is None or self._meta_buf.nbytes < n:
            self._meta_buf = self.st.alloc(max(n, 64 << 10))
        self._meta_buf.copy_in(data + bytes(n - len(data)))
        self.st.write(self._meta_buf, off, n)

    def _run(self, entries: List[Tuple[Any, ...]]) -> None:
        """Runs one batch of (op, buf, file_offset, nbytes[, buf_offset]) entries on the batch
        kept for the store (its capacity grown when needed), waiting for all of them; raises
        the first failed entry's error."""
        t = self._tls
        if getattr(t, "batch", None) is None or t.cap < len(entries):
            t.cap = max(len(entries), 64)
            t.batch = self.st.batch(t.cap)
            with self._lock:
                self._batches.append(t.batch)
        t.batch.run(entries)

    def _read_superblock(self) -> Optional[Tuple[int, ...]]:
        raw = self._read(0, _SB.size + 4)
        if len(raw) < _SB.size + 4:
            return None
        f = _SB.unpack_from(raw)
        (crc,) = struct.unpack_from("<I", raw, _SB.size)
        if f[0] != _SB_MAGIC or crc != _crc(raw[: _SB.size]) or f[1] != 1:
            return None
        return f

    def _format(self, capacity: Optional[int], journal: Optional[int], ckpt: Optional[int]) -> None:
        u = self.unit
        cap = (capacity or self.st.capacity) // u * u
        if ckpt is None:
            ckpt = min(max(cap // 32, 1 << 20), 64 << 20)
        if journal is None:
            journal = min(max(cap // 32, 1 << 20), 256 << 20)
        ckpt, journal = _pad(ckpt, u), _pad(journal, u)
        data_off = u + 2 * ckpt + journal
        if data_off + u > cap:
            raise _invalid("capacity", f"{cap} bytes cannot hold the store's metadata ({data_off} bytes) and data")
        self.layout = dict(
            capacity=cap,
            journal_off=u + 2 * ckpt,
            journal_len=journal,
            ckpt=(u, u + ckpt),
            ckpt_len=ckpt,
            data_off=data_off,
            data_len=cap - data_off,
        )
        self.extents = _Extents(data_off, cap, u)
        self.index.clear()
        self.sid = int.from_bytes(os.urandom(8), "little")
        self.gen, self.seq, self.jpos = 0, 0, 0
        # An empty checkpoint (generation 1), then the superblock, which makes the store valid:
        # a crash before it leaves no store.
        self._checkpoint()
        l = self.layout
        sb = _SB.pack(
            _SB_MAGIC,
            1,
            u,
            cap,
            l["journal_off"],
            l["journal_len"],
            l["ckpt"][0],
            l["ckpt"][1],
            ckpt,
            data_off,
            l["data_len"],
            self.sid,
        )
        self._write(sb + struct.pack("<I", _crc(sb)), 0)
        self._flush()

    def _load(self, sb: Tuple[int, ...]) -> None:
        _, _, unit, cap, joff, jlen, ca, cb, clen, doff, dlen, self.sid = sb
        if unit != self.unit:
            raise _invalid("target", f"the store was made with {unit}-byte units, this target has {self.unit}")
        self.layout = dict(
            capacity=cap, journal_off=joff, journal_len=jlen, ckpt=(ca, cb), ckpt_len=clen, data_off=doff, data_len=dlen
        )
        best = None
        for slot in (ca, cb):
            cp = self._read_checkpoint(slot, clen)
            if cp is not None and (best is None or cp[0] > best[0]):
                best = cp
        if best is None:
            raise _invalid("target", "both checkpoints of the store are invalid")
        self.gen, self.seq, self.jpos, n, payload = best
        self.index = OrderedDict(_entries(payload, n))
        self._replay()
        self.extents = _Extents.around(doff, doff + dlen, self.unit, self.index.values())

    def _read_checkpoint(self, off: int, clen: int):
        head = self._read(off, _CP.size + 4)
        magic, sid, gen, seq, jpos, n, plen = _CP.unpack_from(head)
        if magic != _CP_MAGIC or sid != self.sid or plen > clen - _CP.size - 4:
            return None
        raw = self._read(off, _CP.size + 4 + plen)
        (crc,) = struct.unpack_from("<I", raw, _CP.size)
        payload = raw[_CP.size + 4 :]
        if crc != _crc(raw[: _CP.size] + payload):
            return None
        # Parsed only for the newer valid slot (see `_load`).
        return gen, seq, jpos, n, payload

    def _checkpoint(self) -> None:
        """Writes the index to the older slot (generation + 1) and restarts the journal there."""
        parts = []
        for k, e in self.index.items():  # least recently used first: the order survives
            parts.append(struct.pack("<H", len(k)) + k + _ENTRY.pack(*e))
        payload = b"".join(parts)
        room = self.layout["ckpt_len"] - _CP.size - 4
        if len(payload) > room:
            raise _full("index", len(payload), room)
        gen = self.gen + 1
        head = _CP.pack(_CP_MAGIC, self.sid, gen, self.seq, 0, len(self.index), len(payload))
        slot = self.layout["ckpt"][gen % 2]
        self._write(head + struct.pack("<I", _crc(head + payload)) + payload, slot)
        self._flush()
        self.gen, self.jpos = gen, 0

    def _replay(self) -> None:
        joff, jlen = self.layout["journal_off"], self.layout["journal_len"]
        while self.jpos + self.unit <= jlen:
            head = self._read(joff + self.jpos, _JR.size + 4)
            magic, sid, seq, nops, plen = _JR.unpack_from(head)
            if magic != _JR_MAGIC or sid != self.sid or seq != self.seq + 1 or self.jpos + _JR.size + 4 + plen > jlen:
                break
            raw = self._read(joff + self.jpos, _JR.size + 4 + plen)
            (crc,) = struct.unpack_from("<I", raw, _JR.size)
            payload = raw[_JR.size + 4 :]
            if crc != _crc(raw[: _JR.size] + payload):
                break  # torn: the batch was never acknowledged
            for op, k, e in _ops(payload, nops):
                if op == _PUT:
                    self.index.pop(k, None)
                    self.index[k] = e
                else:
                    self.index.pop(k, None)
            self.seq = seq
            self.jpos += _pad(_JR.size + 4 + plen, self.unit)
            self._replayed += 1

    def _journal(self, ops: List[Tuple[int, bytes, Entry]]) -> None:
        """Appends one record (checkpointing first when the journal has no room)."""
        payload = b"".join(struct.pack("<BH", op, len(k)) + k + _ENTRY.pack(*e) for op, k, e in ops)
        size = _pad(_JR.size + 4 + len(payload), self.unit)
        if size > self.layout["journal_len"]:
            raise _full("journal", size, self.layout["journal_len"])
        if self.jpos + size > self.layout["journal_len"]:
            self._checkpoint()
        head = _JR.pack(_JR_MAGIC, self.sid, self.seq + 1, len(ops), len(payload))
        self._write(head + struct.pack("<I", _crc(head + payload)) + payload, self.layout["journal_off"] + self.jpos)
        self._flush()
        self.seq += 1
        self.jpos += size

    def _flush(self) -> None:
        if self.durable:
            self.st.flush()

    def _stage(self, nbytes: int) -> "ugds.Buffer":
        """A registered host buffer of at least ``nbytes`` (the kept one when large enough; the
        store's lock makes one batch use it at a time)."""
        b = getattr(self._tls, "stage", None)
        if b is None or b.nbytes < nbytes:
            b = self.st.alloc(nbytes)
            if nbytes <= _STAGE_KEEP:
                self._tls.stage = b
        return b

    # ---------------------------------------------------------------------------- space

    def _make_room(self, need: List[int]) -> List[Optional[int]]:
        """Extents for values of these lengths, evicting (and journaling the deletions first)
        under the LRU policy; raises StoreFull under the error policy."""
        offs: List[Optional[int]] = []
        for n in need:
            if _pad(n, self.unit) > self.layout["data_len"]:
                raise _invalid("value", f"{n} bytes: larger than the store's data region ({self.layout['data_len']})")
        evicted: List[Tuple[bytes, Entry]] = []
        for n in need:
            off = self.extents.alloc(n)
            while off is None:
                if self.eviction == "error" or not self.index:
                    for o, m in zip(offs, need):
                        if o is not None:
                            self.extents.release(o, m)
                    for k, e in evicted:  # nothing was journaled: put them back
                        self.extents.take(e.offset, e.length)
                        self.index[k] = e
                    raise _full("data region", _pad(n, self.unit), self.extents.free_bytes())
                k, e = self.index.popitem(last=False)
                evicted.append((k, e))
                self.extents.release(e.offset, e.length)
                off = self.extents.alloc(n)
            offs.append(off)
        if evicted:
            # The deletions are durable before any of their space is overwritten.
            self._journal([(_DEL, k, e) for k, e in evicted])
            self._evictions += len(evicted)
        return offs

    # ---------------------------------------------------------------------------- API

    def set_many(self, items: Iterable[Tuple[Key, Any]]) -> None:
        """Stores each (key, value); a value is any bytes-like object or anything
        ``Storage.register`` takes (GPU memory is staged through host memory for its checksum).
        One batch of writes (one doorbell on the direct path), then one journal record;
        returns when both are written (and flushed, when durable)."""
        # The last value of a key given twice wins.
        pairs = list({_key(k): v for k, v in items}.items())
        if not pairs:
            return
        with self._lock:
            vals = [_as_view(self.st, v) for _, v in pairs]
            offs = self._make_room([len(v) for v in vals])
            entries, regs, ops = [], [], []
            try:
                staged = sum(_pad(max(len(v), 1), self.unit) for v in vals if not self._in_place(v))
                stage = self._stage(staged) if staged else None
                pos = 0
                for (k, _), v, off in zip(pairs, vals, offs):
                    n = _pad(max(len(v), 1), self.unit)
                    if self._in_place(v):
                        regs.append(self.st.register(v))
                        ops.append(("write", regs[-1], off, n))
                    else:
                        if v:
                            stage.copy_in(v, pos)
                        ops.append(("write", stage, off, n, pos))
                        pos += n
                    entries.append((k, Entry(off, len(v), _crc(v))))
                self._run(ops)
                self._flush()
                old = [(k, self.index.get(k)) for k, _ in entries]
                self._journal([(_PUT, k, e) for k, e in entries])
            except BaseException:
                for off, v in zip(offs, vals):
                    self.extents.release(off, len(v))
                raise
            for k, e in entries:
                self.index.pop(k, None)
                self.index[k] = e
            for _, prev in old:
                if prev is not None:
                    self.extents.release(prev.offset, prev.length)

    def set(self, key: Key, value: Any) -> None:
        """Stores one object (see ``set_many``)."""
        self.set_many([(key, value)])

    def get_many(self, keys: Sequence[Key]) -> List[Optional[bytes]]:
        """The values (``None`` for a missing key or a value whose checksum fails: torn data is
        never returned). One batch of reads."""
        ks = [_key(k) for k in keys]
        with self._lock:
            found = [(i, self.index.get(k)) for i, k in enumerate(ks)]
        found = [(i, e) for i, e in found if e is not None]
        out: List[Optional[bytes]] = [None] * len(ks)
        if not found:
            return out
        stage, where = self._read_batch(found)
        good = []
        for i, e, p in where:
            v = stage.copy_out(e.length, p) if e.length else b""
            if _crc(v) == e.crc:
                out[i] = v
            good.append(out[i] is not None)
        self._settle(ks, where, good)
        return out

    def _settle(self, ks: List[bytes], where, good: List[bool]) -> None:
        """After reads made outside the lock: marks the intact values used (LRU) and drops the
        torn ones, each only if its key still names the extent that was read (else a change
        came in between: nothing to do)."""
        with self._lock:
            for (i, e, _), ok in zip(where, good):
                if self.index.get(ks[i]) is not e:
                    continue
                if ok:
                    self.index.move_to_end(ks[i])
                else:
                    self._drop_torn(ks[i], e)

    def _in_place(self, v) -> bool:
        """Whether a value (or destination) moves between the target and its own memory."""
        return isinstance(v, memoryview) and len(v) >= _IN_PLACE_MIN and len(v) % self.unit == 0

    def _read_batch(self, found: List[Tuple[int, Entry]], into: Optional[Dict[int, Any]] = None):
        """Reads the entries' extents in one batch: into ``into[i]`` (registered for the batch)
        where given, else into the staging buffer. Returns the staging buffer and (index, entry,
        position in it, or None when read in place) per entry."""
        into = into or {}
        total = sum(_pad(max(e.length, 1), self.unit) for i, e in found if i not in into)
        stage = self._stage(total) if total else None
        pos, where, ops = 0, [], []
        for i, e in found:
            n = _pad(max(e.length, 1), self.unit)
            if i in into:
                ops.append(("read", self.st.register(into[i]), e.offset, n))
                where.append((i, e, None))
            else:
                ops.append(("read", stage, e.offset, n, pos))
                where.append((i, e, pos))
                pos += n
        self._run(ops)
        return stage, where

    def get_many_into(self, keys: Sequence[Key], dsts: Sequence[Any]) -> List[bool]:
        """Reads each value into its ``dsts[i]`` (a writable contiguous bytes-like object, such
        as LMCache's memoryviews); ``[i]`` is True when the value was found, intact and exactly
        ``len(dsts[i])`` bytes. One batch of reads and one copy per value (no ``bytes`` made).
        A destination whose value fails its checksum holds garbage (and reads False)."""
        ks = [_key(k) for k in keys]
        views = [memoryview(d).cast("B") for d in dsts]
        with self._lock:
            found = [(i, self.index.get(k)) for i, k in enumerate(ks)]
        found = [(i, e) for i, e in found if e is not None and e.length == views[i].nbytes]
        out = [False] * len(ks)
        if not found:
            return out
        stage, where = self._read_batch(found, {i: views[i] for i, _ in found if self._in_place(views[i])})
        for i, e, p in where:
            if e.length and p is not None:
                stage.copy_out_into(views[i], p)
            out[i] = _crc(views[i]) == e.crc
        self._settle(ks, where, [out[i] for i, _, _ in where])
        return out

    def get(self, key: Key) -> Optional[bytes]:
        """One value, or ``None`` (see ``get_many``)."""
        return self.get_many([key])[0]

    def get_into(self, key: Key, dst: Any) -> bool:
        """Reads a value into ``dst`` (a writable bytes-like object of exactly its length, or
        anything ``Storage.register`` takes); False when missing, torn or of another length."""
        try:
            view = memoryview(dst)
        except TypeError:
            view = None
        if view is not None and view.c_contiguous and not view.readonly:
            return self.get_many_into([key], [view])[0]
        v = self.get(key)
        if v is None:
            return False
        buf = dst if isinstance(dst, ugds.Buffer) else self.st.register(dst)
        if buf.nbytes != len(v):
            return False
        buf.copy_in(v)
        return True

    def exists_many(self, keys: Sequence[Key]) -> List[bool]:
        """Whether each key is stored (the index is in memory: no I/O)."""
        ks = [_key(k) for k in keys]
        with self._lock:
            return [k in self.index for k in ks]

    def exists(self, key: Key) -> bool:
        return self.exists_many([key])[0]

    def delete_many(self, keys: Sequence[Key]) -> List[bool]:
        """Deletes each key (one journal record); True where the key was stored."""
        ks = [_key(k) for k in keys]
        with self._lock:
            gone = [(k, self.index[k]) for k in dict.fromkeys(ks) if k in self.index]
            if gone:
                self._journal([(_DEL, k, e) for k, e in gone])
                for k, e in gone:
                    del self.index[k]
                    self.extents.release(e.offset, e.length)
            names = {k for k, _ in gone}
            return [k in names for k in ks]

    def delete(self, key: Key) -> bool:
        return self.delete_many([key])[0]

    def keys(self) -> List[bytes]:
        """Every key, least recently used first."""
        with self._lock:
            return list(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: Key) -> bool:
        return self.exists(key)

    def stats(self) -> Stats:
        with self._lock:
            return Stats(
                len(self.index),
                sum(e.length for e in self.index.values()),
                self.extents.free_bytes(),
                self._evictions,
                self._torn,
                self._replayed,
            )

    def close(self) -> None:
        """Checkpoints the index (so the next open replays nothing)."""
        with self._lock:
            if self.seq or self.index:
                self._checkpoint()
            for b in self._batches:
                b.close()
            self._batches.clear()
            self._tls = threading.local()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _drop_torn(self, k: bytes, e: Entry) -> None:
        self._torn += 1
        self.index.pop(k, None)
        self._journal([(_DEL, k, e)])
        self.extents.release(e.offset, e.length)


def _entries(payload: bytes, n: int):
    """A checkpoint's (key, Entry) pairs."""
    p, unpack, esize = 0, _ENTRY.unpack_from, _ENTRY.size
    for _ in range(n):
        kl = payload[p] | payload[p + 1] << 8
        k = payload[p + 2 : p + 2 + kl]
        yield k, Entry(*unpack(payload, p + 2 + kl))
        p += 2 + kl + esize


def _ops(payload: bytes, n: int):
    p = 0
    for _ in range(n):
        op, kl = struct.unpack_from("<BH", payload, p)
        k = payload[p + 3 : p + 3 + kl]
        e = Entry(*_ENTRY.unpack_from(payload, p + 3 + kl))
        p += 3 + kl + _ENTRY.size
        yield op, k, e


def _as_view(st: "ugds.Storage", v: Any):
    """The value's bytes: a byte view of a contiguous bytes-like object (no copy: it is copied
    once, into the staging buffer), a copy of a non-contiguous one, or GPU memory's host copy."""
    try:
        m = memoryview(v)
    except TypeError:
        return st.register(v).copy_out()
    return m.cast("B") if m.c_contiguous else m.tobytes()


def open(target: Union[str, "ugds.Storage"], **kw: Any) -> Store:  # noqa: A001 (mirrors ugds.open)
    """``Store(target, **kw)``."""
    return Store(target, **kw)


__all__ = ["Entry", "Stats", "Store", "open", "MAX_KEY"]

//! Synchronous I/O of the C faces: read/write on registered memory (the fast path), memory
//! registered for the call only (uGDS's on-the-fly mapping), staged I/O through the library's
//! own aligned buffers (cuFile: unregistered memory, any size and offset), and uGDS's vectored
//! read/write.

use super::library::{gpu_of, BufEntry, CResult, Face, Fail, Handle, Library, Memory, BOUNCE};
use super::types::uGDSIoSegment;
use super::types::uGDSOpError::*;
use crate::gpu::Gpu;
use crate::storage::{Buffer, Storage};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most segments in one vectored call.
const IOV_MAX: usize = super::types::UGDS_IOV_MAX as usize;

/// Counts one I/O on a registered buffer while it runs (deregistration sees it).
struct Busy<'a>(&'a BufEntry);

impl<'a> Busy<'a> {
    fn new(e: &'a BufEntry) -> Self {
        e.inflight.fetch_add(1, Ordering::AcqRel);
        Busy(e)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where `addr` lives, for memory the library did not register.
enum Raw {
    Host,
    Gpu(Arc<Gpu>),
}

fn classify(addr: usize) -> Raw {
    match gpu_of(addr) {
        Some(g) => Raw::Gpu(g),
        None => Raw::Host,
    }
}

/// Whether the storage takes this request as it is (block-aligned offset and size, memory at a
/// dword boundary as PRP entries need; O_DIRECT files bounce unaligned memory themselves).
fn plain(s: &Storage, addr: usize, file_offset: u64, size: u64) -> bool {
    let bs = s.block_size();
    file_offset.is_multiple_of(bs) && size.is_multiple_of(bs) && addr.is_multiple_of(4)
}

/// The offset of `base` in its registration (host registrations start at the page boundary).
fn reg_offset(e: &BufEntry) -> u64 {
    match e.mem {
        Memory::Host => (e.base & 4095) as u64,
        Memory::Gpu(_) => 0,
    }
}

impl Library {
    /// Resolves a handle for synchronous I/O: NULL is `-EINVAL` (uGDS), unknown `-EBADF`.
    fn io_handle(&self, fh: usize) -> CResult<Arc<Handle>> {
        if fh == 0 && self.face == Face::Ugds {
            return Err(Fail::Errno(libc::EINVAL));
        }
        self.handle(fh).ok_or(Fail::Errno(libc::EBADF))
    }

    /// `Read`/`Write`: `size` bytes between the file at `file_offset` and memory at
    /// `base + buf_offset`. Returns the bytes moved (fewer only at the end of a file).
    ///
    /// # Safety
    ///
    /// `[base + buf_offset, +size)` must be memory the caller may have the device read or write
    /// (registered memory stays valid by the registration contract).
    pub unsafe fn rw(
        &self,
        write: bool,
        fh: usize,
        base: usize,
        size: usize,
        file_offset: i64,
        buf_offset: i64,
    ) -> CResult<usize> {
        if self.face == Face::CuFile {
            self.require_open()?;
        }
        let h = self.io_handle(fh)?;
        if base == 0 || (size == 0 && self.face == Face::Ugds) {
            return Err(Fail::Errno(libc::EINVAL));
        }
        if file_offset < 0 || buf_offset < 0 {
            return Err(Fail::Errno(libc::EINVAL));
        }
        if size == 0 {
            return Ok(0);
        }
        let (foff, boff) = (file_offset as u64, buf_offset as usize);
        let addr = base.checked_add(boff).ok_or(Fail::Errno(libc::EINVAL))?;
        if addr.checked_add(size).is_none() || foff.checked_add(size as u64).is_none_or(|e| e > i64::MAX as u64) {
            return Err(Fail::Errno(libc::EINVAL));
        }
        let aligned = plain(&h.storage, addr, foff, size as u64);
        if !aligned && self.face == Face::Ugds {
            return Err(Fail::Errno(libc::EINVAL));
        }
        if let Some(e) = self.buffer(base) {
            if boff.checked_add(size).is_none_or(|end| end > e.len) {
                return Err(Fail::Errno(libc::EINVAL));
            }
            let _busy = Busy::new(&e);
            if aligned {
                let reg = self.registration(&h, &e)?;
                return Ok(h.storage.rw(write, &reg, reg_offset(&e) + boff as u64, foff, size as u64)? as usize);
            }
            let mem = match &e.mem {
                Memory::Host => Raw::Host,
                Memory::Gpu(m) => Raw::Gpu(m.gpu().clone()),
            };
            // SAFETY: registered memory, range checked against the registration.
            return unsafe { self.staged(&h, write, &mem, addr, size, foff) };
        }
        let mem = classify(addr);
        match self.face {
            // uGDS registers unregistered memory for the call.
            Face::Ugds => {
                // SAFETY: forwarded from the caller.
                unsafe { self.rw_temporary(&h, write, &mem, addr, size, foff) }
            }
            // cuFile stages it through buffers of its own; large aligned GPU transfers on the
            // fallback path use its pipelined staging directly.
            Face::CuFile => match mem {
                Raw::Gpu(ref g) if aligned && !h.storage.is_direct() => {
                    // SAFETY: forwarded from the caller (the range is GPU memory).
                    let m = unsafe { g.borrow(addr as u64, size) }?;
                    let b = h.storage.register_gpu(Arc::new(m), true)?;
                    Ok(h.storage.rw(write, &b, 0, foff, size as u64)? as usize)
                }
                // SAFETY: forwarded from the caller.
                _ => unsafe { self.staged(&h, write, &mem, addr, size, foff) },
            },
        }
    }

    /// I/O on memory registered for this call only (uGDS's on-the-fly mapping).
    unsafe fn rw_temporary(
        &self,
        h: &Handle,
        write: bool,
        mem: &Raw,
        addr: usize,
        size: usize,
        foff: u64,
    ) -> CResult<usize> {
        let s = &h.storage;
        let (buf, off): (Buffer, u64) = match mem {
            Raw::Gpu(g) => {
                // SAFETY: the caller's contract covers the range.
                let m = unsafe { g.borrow(addr as u64, size) }?;
                (s.register_gpu(Arc::new(m), true).map_err(|_| Fail::Errno(libc::EIO))?, 0)
            }
            Raw::Host => {
                let start = addr & !4095;
                let len = (addr + size).next_multiple_of(4096) - start;
                // SAFETY: the caller's contract covers the range; the rest of its pages are
                // mapped (mappings are page-granular) and only the range is transferred.
                (
                    unsafe { s.register_host(start as *mut u8, len) }.map_err(|_| Fail::Errno(libc::EIO))?,
                    (addr - start) as u64,
                )
            }
        };
        Ok(s.rw(write, &buf, off, foff, size as u64)? as usize)
    }

    /// Staged I/O through the handle's aligned bounce buffers: any memory, any size and offset.
    /// Reads read the covering blocks and copy out the requested bytes; writes read the partly
    /// covered edge blocks first (read-modify-write: concurrent writers of the same block must
    /// not overlap in time, as with any block device), and a regular file that grew by the
    /// padding of its last block is cut back to the written end (unless another writer has
    /// extended it further meanwhile).
    ///
    /// # Safety
    ///
    /// `[addr, addr+size)` must be valid memory of the kind `mem` says.
    unsafe fn staged(&self, h: &Handle, write: bool, mem: &Raw, addr: usize, size: usize, off: u64) -> CResult<usize> {
        let s = &h.storage;
        let bs = s.block_size();
        let old_len = if write { s.file_len() } else { None };
        let bounce = self.take_bounce(h)?;
        // SAFETY: forwarded from the caller.
        let r = unsafe { staged_steps(s, &bounce, bs, write, mem, addr, size, off) };
        self.put_bounce(h, bounce);
        let done = r?;
        if let Some(old) = old_len {
            // Cut back only our own padding: a concurrent writer that extended the file further
            // keeps its data (its own write trims its padding).
            let want = old.max(off + done as u64);
            let padded = (off + done as u64).next_multiple_of(bs);
            if padded > want && s.file_len() == Some(padded) {
                s.set_file_len(want)?;
            }
        }
        Ok(done)
    }

    /// `Readv`/`Writev` (uGDS): segments in order, contiguous in the file from `file_offset`.
    ///
    /// # Safety
    ///
    /// `segs` must point to `nr` segments.
    pub unsafe fn rwv(
        &self,
        write: bool,
        fh: usize,
        segs: *const uGDSIoSegment,
        nr: u32,
        file_offset: i64,
    ) -> CResult<usize> {
        if segs.is_null() || nr == 0 || nr as usize > IOV_MAX {
            return Err(Fail::Errno(libc::EINVAL));
        }
        let h = self.handle(fh).ok_or(Fail::Errno(libc::EBADF))?;
        // SAFETY: the caller passes `nr` segments.
        let segs = unsafe { std::slice::from_raw_parts(segs, nr as usize) };
        let bs = h.storage.block_size();
        let mut total: u64 = 0;
        for g in segs {
            if g.base.is_null()
                || g.size == 0
                || g.offset < 0
                || g.offset % 4096 != 0
                || !(g.size as u64).is_multiple_of(bs)
            {
                return Err(Fail::Errno(libc::EINVAL));
            }
            total = total
                .checked_add(g.size as u64)
                .filter(|t| *t <= isize::MAX as u64)
                .ok_or(Fail::Errno(libc::EINVAL))?;
        }
        if file_offset < 0 || !(file_offset as u64).is_multiple_of(bs) {
            return Err(Fail::Errno(libc::EINVAL));
        }
        // Every segment must be registered, and in range, before anything moves.
        let mut plan = Vec::with_capacity(segs.len());
        for g in segs {
            let e = self.buffer(g.base as usize).ok_or(Fail::Errno(libc::EINVAL))?;
            if (g.offset as usize).checked_add(g.size).is_none_or(|end| end > e.len) {
                return Err(Fail::Errno(libc::EINVAL));
            }
            let reg = self.registration(&h, &e)?;
            plan.push((e, reg, g.offset as u64, g.size as u64));
        }
        let mut at = file_offset as u64;
        let mut done = 0usize;
        for (e, reg, boff, n) in plan {
            let _busy = Busy::new(&e);
            let got = h.storage.rw(write, &reg, reg_offset(&e) + boff, at, n)?;
            done += got as usize;
            if got < n {
                break;
            }
            at += n;
        }
        Ok(done)
    }
}

/// The steps of [`Library::staged`].
#[allow(clippy::too_many_arguments)]
unsafe fn staged_steps(
    s: &Storage,
    bounce: &Buffer,
    bs: u64,
    write: bool,
    mem: &Raw,
    addr: usize,
    size: usize,
    off: u64,
) -> CResult<usize> {
    let stage = bounce.host_ptr().ok_or(Fail::Code(UGDS_INTERNAL_ERROR))?;
    let end = off + size as u64;
    let mut pos = off;
    let mut done = 0usize;
    while pos < end {
        let a0 = pos - pos % bs;
        let a1 = (a0 + BOUNCE as u64).min(end.next_multiple_of(bs));
        let n = (a1 - a0) as usize;
        let lo = (pos - a0) as usize;
        let hi = (end.min(a1) - a0) as usize;
        if write {
            // Edge blocks only partly written: keep their other bytes (zero past the end).
            for (edge, at) in [(lo > 0, 0usize), (hi < n, n - bs as usize)] {
                if edge {
                    // SAFETY: `at + bs <= n <= BOUNCE`, inside the bounce buffer we own.
                    unsafe { std::ptr::write_bytes(stage.add(at), 0, bs as usize) };
                    s.read(bounce, at as u64, a0 + at as u64, bs)?;
                }
            }
            // SAFETY: the caller's range; `hi - lo` bytes fit both sides.
            unsafe { copy(mem, false, addr + done, stage.add(lo), hi - lo) }?;
            s.write(bounce, 0, a0, n as u64)?;
            done += hi - lo;
        } else {
            let got = s.read(bounce, 0, a0, n as u64)? as usize;
            let avail = got.saturating_sub(lo).min(hi - lo);
            // SAFETY: as above, `avail <= hi - lo`.
            unsafe { copy(mem, true, addr + done, stage.add(lo), avail) }?;
            done += avail;
            if got < hi {
                break;
            }
        }
        pos = a0 + hi as u64;
    }
    Ok(done)
}

/// Copies `len` bytes between the caller's memory at `addr` and the bounce buffer at `stage`:
/// into the caller's memory when `to_caller`.
unsafe fn copy(mem: &Raw, to_caller: bool, addr: usize, stage: *mut u8, len: usize) -> CResult<()> {
    if len == 0 {
        return Ok(());
    }
    match mem {
        // SAFETY: both ranges are valid for `len` bytes (the callers' contracts) and distinct.
        Raw::Host => unsafe {
            if to_caller {
                std::ptr::copy_nonoverlapping(stage, addr as *mut u8, len)
            } else {
                std::ptr::copy_nonoverlapping(addr as *const u8, stage, len)
            }
        },
        Raw::Gpu(g) => {
            let mut q = g.take_queue()?;
            // SAFETY: both ranges are valid for `len` bytes; `wait` returns before they may go.
            let r = unsafe {
                if to_caller {
                    q.to_device(addr as u64, stage, len)
                } else {
                    q.to_host(stage, addr as u64, len)
                }
            }
            .and_then(|_| q.wait());
            g.put_queue(q);
            r?;
        }
    }
    Ok(())
}

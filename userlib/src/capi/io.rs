//! Synchronous I/O of the C faces: read/write on registered memory (the fast path), memory
//! registered for the call only (uGDS's on-the-fly mapping), staged I/O through the library's
//! own aligned buffers (cuFile: unregistered memory, any size and offset), and uGDS's vectored
//! read/write.

use super::library::{gpu_of, BufEntry, Face, IoKind, Library, Memory, BOUNCE};
use super::types::uGDSIoSegment;
use super::types::uGDSOpError::*;
use super::{CResult, Fail, Handle};
use crate::buffer::Buffer;
use crate::gpu::Gpu;
use crate::inflight::IoResult;
use crate::storage::Storage;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The GPU page: where uGDS lets memory registered for one call start.
const GPU_PAGE: usize = 64 << 10;

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
        let h = self.handle(fh).ok_or(Fail::Errno(libc::EBADF))?;
        // The parent's handle in a forked child: refused by name before anything is touched.
        h.storage.alive()?;
        Ok(h)
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
        // SAFETY: forwarded.
        unsafe { self.rw_as(IoKind::Sync, write, fh, base, size, file_offset, buf_offset) }
    }

    /// [`Library::rw`] for a caller of `kind`, reported to the observer as such.
    ///
    /// # Safety
    ///
    /// As [`Library::rw`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn rw_as(
        &self,
        kind: IoKind,
        write: bool,
        fh: usize,
        base: usize,
        size: usize,
        file_offset: i64,
        buf_offset: i64,
    ) -> CResult<usize> {
        let t = std::time::Instant::now();
        // A request larger than the face's largest piece (`FaceOptions::max_io_bytes`) runs as
        // pieces of it, one after the other; a short piece (the end of a file) ends it.
        let max = self.max_io_bytes.load(std::sync::atomic::Ordering::Relaxed).max(1);
        // uGDS maps unregistered GPU memory for one call only from a 64 KiB GPU page (its
        // driver's mapping would round the address down) and refuses the rest; checked on the
        // request's start, not on each piece's.
        let start = base.wrapping_add(buf_offset.max(0) as usize);
        if self.face == Face::Ugds
            && !start.is_multiple_of(GPU_PAGE)
            && self.buffer(base).is_none()
            && matches!(classify(start), Raw::Gpu(_))
        {
            return Err(Fail::Errno(libc::EINVAL));
        }
        let r = (|| -> CResult<usize> {
            let mut done = 0usize;
            loop {
                let n = max.min(size - done);
                // The first piece's checks refuse negative offsets; the sums cannot pass
                // i64::MAX for a range those checks accept.
                let step = i64::try_from(done).map_err(|_| Fail::Errno(libc::EINVAL))?;
                let (foff, boff) = (file_offset.saturating_add(step), buf_offset.saturating_add(step));
                // SAFETY: the caller's range, or a sub-range of it.
                let got = unsafe { self.rw_unobserved(write, fh, base, n, foff, boff) }?;
                done += got;
                if got < n || done >= size {
                    return Ok(done);
                }
            }
        })();
        let ns = t.elapsed().as_nanos() as u64;
        self.observe(kind, write, *r.as_ref().unwrap_or(&0) as u64, ns, r.is_ok());
        r
    }

    unsafe fn rw_unobserved(
        &self,
        write: bool,
        fh: usize,
        base: usize,
        size: usize,
        file_offset: i64,
        buf_offset: i64,
    ) -> CResult<usize> {
        // The caller's CUDA context is the same after the call (we may bind ours).
        let _caller = crate::gpu::cuda::CallerContext::keep();
        if self.face == Face::CuFile {
            self.require_open()?;
        }
        let h = self.io_handle(fh)?;
        h.access.check(write)?;
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
            // uGDS registers unregistered memory for the call (GPU memory only from a GPU page:
            // `rw_as` checked that).
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

    /// Staged I/O: any memory, any size and offset (cuFile's semantics). Reads read the
    /// covering blocks into the handle's aligned bounce buffer and copy out the requested
    /// bytes. Writes to a file go through the page cache with exactly their bytes (the kernel
    /// serialises neighbouring writers; no block padding, so a file grows exactly to the
    /// written end). Writes to a namespace read-modify-write their partly covered edge blocks,
    /// holding those blocks locked against the handle's other staged writers meanwhile.
    ///
    /// # Safety
    ///
    /// `[addr, addr+size)` must be valid memory of the kind `mem` says.
    unsafe fn staged(&self, h: &Handle, write: bool, mem: &Raw, addr: usize, size: usize, off: u64) -> CResult<usize> {
        let s = &h.storage;
        let bs = s.block_size();
        if bs == 0 {
            return Err(Fail::Errno(libc::EINVAL));
        }
        let bounce = self.take_bounce(h)?;
        // Files take byte-exact writes through the page cache; namespaces read-modify-write.
        let r = if write && !s.is_direct() {
            // SAFETY: forwarded from the caller.
            unsafe { write_exact(s, &bounce, mem, addr, size, off) }
        } else if write {
            let edges = h.lock_edges(off, size as u64, bs);
            // SAFETY: forwarded from the caller.
            let r = unsafe { staged_steps(s, &bounce, bs, true, mem, addr, size, off) };
            drop(edges);
            r
        } else {
            // SAFETY: forwarded from the caller.
            unsafe { staged_steps(s, &bounce, bs, false, mem, addr, size, off) }
        };
        match r {
            Ok(n) => {
                self.put_bounce(h, bounce);
                Ok(n)
            }
            // A GPU copy or the storage may still use the bounce buffer: its token keeps it out
            // of the pool for good (counted by `in_flight_kept`).
            Err(mut f) => {
                if let Some(bounce) = f.hold_if_running(bounce) {
                    self.put_bounce(h, bounce);
                }
                Err(f.into_error())
            }
        }
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
        // The caller's CUDA context is the same after the call (we may bind ours).
        let _caller = crate::gpu::cuda::CallerContext::keep();
        if segs.is_null() || nr == 0 || nr as usize > IOV_MAX {
            return Err(Fail::Errno(libc::EINVAL));
        }
        let h = self.handle(fh).ok_or(Fail::Errno(libc::EBADF))?;
        h.access.check(write)?;
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

/// A staged write to a file: the caller's bytes, exactly, through the page cache (host memory
/// directly; GPU memory copied through the bounce buffer first).
unsafe fn write_exact(
    s: &Storage,
    bounce: &Buffer,
    mem: &Raw,
    addr: usize,
    size: usize,
    off: u64,
) -> IoResult<usize, Fail> {
    let stage = bounce.host_ptr().ok_or(Fail::Code(UGDS_INTERNAL_ERROR))?;
    let mut done = 0usize;
    while done < size {
        let n = BOUNCE.min(size - done);
        let bytes = match mem {
            // SAFETY: the caller's range is valid host memory for `size` bytes.
            Raw::Host => unsafe { std::slice::from_raw_parts((addr + done) as *const u8, n) },
            Raw::Gpu(_) => {
                // SAFETY: the caller's range; the bounce buffer holds BOUNCE >= n bytes.
                unsafe { copy(mem, false, addr + done, stage, n) }?;
                // SAFETY: `n` bytes were just written there; we own the bounce buffer.
                unsafe { std::slice::from_raw_parts(stage, n) }
            }
        };
        s.write_bytes(bytes, off + done as u64).ok_or(Fail::Code(UGDS_INTERNAL_ERROR))??;
        done += n;
    }
    Ok(done)
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
) -> IoResult<usize, Fail> {
    let stage = bounce.host_ptr().ok_or(Fail::Code(UGDS_INTERNAL_ERROR))?;
    // The storage's I/O on the bounce buffer, its token (if any) passed up.
    let io = |write: bool, at: u64, file_offset: u64, n: u64| {
        s.rw_in_flight(write, bounce, at, file_offset, n).map_err(|f| f.map(Fail::Lib))
    };
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
                    io(false, at as u64, a0 + at as u64, bs)?;
                }
            }
            // SAFETY: the caller's range; `hi - lo` bytes fit both sides.
            unsafe { copy(mem, false, addr + done, stage.add(lo), hi - lo) }?;
            if io(true, 0, a0, n as u64)? != n as u64 {
                return Err(Fail::Errno(libc::EIO).into());
            }
            done += hi - lo;
        } else {
            let got = io(false, 0, a0, n as u64)? as usize;
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
/// into the caller's memory when `to_caller`. A GPU copy that fails may still run: the failure's
/// token keeps its queue, and the caller keeps the bounce buffer with it.
unsafe fn copy(mem: &Raw, to_caller: bool, addr: usize, stage: *mut u8, len: usize) -> IoResult<(), Fail> {
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
            // SAFETY: both ranges are valid for `len` bytes until `wait` returns, or for good
            // when the copy fails (the token keeps the queue, the caller the bounce buffer).
            let r = unsafe {
                if to_caller {
                    q.to_device(addr as u64, stage, len)
                } else {
                    q.to_host(stage, addr as u64, len)
                }
            }
            .and_then(|_| q.wait());
            g.settle_queue(r, q).map_err(|f| f.map(Fail::Lib))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Write;

    const LEN: usize = 192 << 10;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        /// The namespaces' read-modify-write path (`staged_steps`), run on a file of fixed
        /// size: random unaligned writes and reads inside it agree with a model.
        #[test]
        fn read_modify_write_matches_a_model(ops in proptest::collection::vec((any::<bool>(), 0usize..LEN, 1usize..40_000, 0usize..8), 1..10)) {
            let path = std::env::temp_dir().join(format!("ugds-rmw-{}-{}", std::process::id(), rand_suffix()));
            let mut model: Vec<u8> = (0..LEN).map(|i| (i * 7 % 253) as u8).collect();
            std::fs::File::create(&path).unwrap().write_all(&model).unwrap();
            let s = Storage::open(path.to_str().unwrap()).unwrap();
            let bounce = s.alloc_host(BOUNCE).unwrap();
            for (i, (write, off, len, mem_off)) in ops.into_iter().enumerate() {
                let len = len.min(LEN - off);
                let mut mem = vec![0u8; len + 8];
                let p = mem.as_mut_ptr() as usize + mem_off;
                if write {
                    for (k, b) in mem[mem_off..mem_off + len].iter_mut().enumerate() {
                        *b = (k as u8) ^ (i as u8).wrapping_mul(29);
                    }
                    // SAFETY: `mem` holds `len` bytes from `p`.
                    let n = unsafe { staged_steps(&s, &bounce, s.block_size(), true, &Raw::Host, p, len, off as u64) }.unwrap();
                    prop_assert_eq!(n, len);
                    model[off..off + len].copy_from_slice(&mem[mem_off..mem_off + len]);
                } else {
                    // SAFETY: as above.
                    let n = unsafe { staged_steps(&s, &bounce, s.block_size(), false, &Raw::Host, p, len, off as u64) }.unwrap();
                    prop_assert_eq!(n, len);
                    prop_assert!(mem[mem_off..mem_off + len] == model[off..off + len]);
                }
            }
            let disk = std::fs::read(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            prop_assert!(disk == model);
        }
    }

    /// A GPU copy between the caller's memory and a bounce buffer that fails (its queue cannot
    /// say the copy is done) keeps that bounce buffer and that copy queue out of their pools, as
    /// the staging pipeline does: the next staged I/O uses others. (Both used to go back, so the
    /// next I/O's CPU copies into the bounce buffer raced a copy that may still run.)
    #[test]
    fn a_failed_gpu_copy_keeps_its_bounce_buffer_and_queue_out_of_the_pools() {
        use crate::capi::Face;
        use crate::gpu::cpu::Faulty;
        use std::os::fd::AsRawFd;
        let path = std::env::temp_dir().join(format!("ugds-copyfail-{}-{}", std::process::id(), rand_suffix()));
        let data: Vec<u8> = (0..1 << 20).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::File::create(&path).unwrap().write_all(&data).unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let lib: &'static Library = Box::leak(Box::new(Library::new(Face::CuFile)));
        let h = lib.handle_register(f.as_raw_fd()).unwrap();
        let rt = Arc::new(Faulty::new(true, false));
        let state = rt.state.clone();
        let gpu = Gpu::with_runtime(rt);
        let mem = gpu.alloc(1 << 20).unwrap();
        let base = mem.device_ptr() as usize;
        // SAFETY: `mem` stays allocated until after the deregistration below.
        unsafe { lib.buf_register(base, 1 << 20, Some(gpu.clone()), false) }.unwrap();
        let copies = || state.copies.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Unaligned: read into a bounce buffer, then copied to the GPU memory, which fails.
        let kept = crate::in_flight_kept();
        // SAFETY: `[base, +100)` is registered GPU memory.
        assert!(unsafe { lib.rw(false, h, base, 100, 7, 0) }.is_err());
        assert!(crate::in_flight_kept() > kept, "the failure's token was kept, and counted");
        let first = copies();
        assert_eq!(first.len(), 1, "{first:?}");
        state.failing.store(false, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: as above.
        assert_eq!(unsafe { lib.rw(false, h, base, 100, 7, 0) }.unwrap(), 100);
        let second = copies()[1];
        assert_ne!(second.1, first[0].1, "the failed copy's bounce buffer was reused");
        assert_ne!(second.0, first[0].0, "the failed copy's queue was reused");
        let mut out = vec![0u8; 100];
        gpu.download(&mem, 0, &mut out).unwrap();
        assert_eq!(out, data[7..107]);
        lib.buf_deregister(base).unwrap();
        lib.handle_deregister(h, -1).unwrap();
        drop(mem);
        std::fs::remove_file(path).unwrap();
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }
}

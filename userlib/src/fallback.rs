//! The fallback path: io_uring with O_DIRECT on a regular file or a block device (owned by the
//! kernel's driver), and, for GPU memory, pinned host staging chunks with asynchronous copies,
//! pipelined so that the disk transfer of chunk k+1 overlaps the copy of chunk k.
//!
//! Alignment rule (O_DIRECT's): file offsets and lengths are multiples of [`FileTarget::align`];
//! memory that is not aligned is bounced through an aligned buffer.

use crate::buffer::{Buffer, Lease, Mem, Path};
use crate::data_path::{DataPath, Registered};
use crate::error::{Error, Result};
use crate::fork::Born;
use crate::gpu::GpuMemory;
use crate::gpu::{Gpu, STAGING_CHUNK};
use crate::inflight::{settle, Failed, InFlight, IoResult, Why};
use crate::staging_pipeline::staged;
use crate::stream_tail::{self, Copying};
use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::Arc;

/// One command's size: large enough to stream, small enough that a request is split into many
/// commands in flight at once.
pub(crate) const PIECE: usize = 1 << 20;
/// Commands in flight per request.
const RING_ENTRIES: u32 = 64;
/// Staging chunks read from disk at once by [`FileTarget::read_gpu`].
pub const READ_LANES: usize = 8;

thread_local! {
    /// One ring per thread: rings are not shared, so there is no lock on the I/O path. With the
    /// fork generation it was made in: the thread that forks a child is the child's only
    /// thread, and its ring there is the parent's (the ring's memory is shared), so the child
    /// leaks it and makes its own.
    static RING: RefCell<Option<(IoUring, Born)>> = const { RefCell::new(None) };
}

/// Waits for `want` completions, retrying when a signal interrupts the wait.
fn enter(ring: &mut IoUring, want: usize) -> std::io::Result<usize> {
    loop {
        match ring.submit_and_wait(want) {
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            r => return r,
        }
    }
}

/// Runs `f` with this thread's ring, setting it up on first use. When `f` fails with requests
/// still in the ring (its failure carries a token), the ring goes into that token instead of
/// back to the thread: its requests may still move data, and their completions must never reach
/// a later call. The next I/O of the thread sets up a new ring.
fn with_ring<R>(f: impl FnOnce(&mut IoUring) -> IoResult<R>) -> IoResult<R> {
    let (mut ring, born) = match RING.with(|cell| cell.borrow_mut().take()) {
        Some((ring, born)) if !born.in_child() => (ring, born),
        inherited => {
            // The parent's ring, inherited by fork: never entered, never torn down from here.
            std::mem::forget(inherited);
            // One thread submits and reaps: tell the kernel (less task-work overhead per I/O,
            // kernel 6.1+); older kernels get a plain ring.
            let ring = IoUring::builder()
                .setup_single_issuer()
                .setup_defer_taskrun()
                .build(RING_ENTRIES)
                .or_else(|_| IoUring::new(RING_ENTRIES))
                .map_err(|e| io_err("io_uring_setup", e))?;
            (ring, Born::now())
        }
    };
    let r = f(&mut ring);
    match r {
        Err(mut failed) => {
            if let Some(ring) = failed.hold_if_running(ring) {
                RING.with(|cell| *cell.borrow_mut() = Some((ring, born)));
            }
            Err(failed)
        }
        ok => {
            RING.with(|cell| *cell.borrow_mut() = Some((ring, born)));
            ok
        }
    }
}

/// Sets up the calling thread's ring now, so that its first I/O does not pay for it (a thread
/// that will serve stream-ordered I/O). A failure is left for that I/O to meet and report.
pub(crate) fn prepare_thread() {
    if let Err(e) = with_ring(|_| Ok(())) {
        log::debug!("setting up a thread's io_uring ahead of its first I/O: {}", e.error);
    }
}

/// The failure of a ring call that left requests in the ring (see [`with_ring`]).
fn ring_left(e: Error) -> Failed {
    Failed::running(e, InFlight::new(Why::Ring))
}

/// A regular file or a block device opened for the fallback path.
#[derive(Debug)]
pub struct FileTarget {
    file: File,
    path: String,
    direct: bool,
    align: u64,
    block_device: bool,
    /// The same file without O_DIRECT, opened at first need (writes of any size and offset).
    buffered: std::sync::OnceLock<File>,
    /// Tests: this many of the next `io_uring_enter` calls fail (EFAULT) without submitting.
    #[cfg(test)]
    pub(crate) fail_enters: std::sync::atomic::AtomicU32,
}

pub(crate) fn io_err(op: impl Into<String>, e: std::io::Error) -> Error {
    Error::Io { op: op.into(), source: e }
}

/// `BLKSSZGET` and `BLKGETSIZE64` from <linux/fs.h>.
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

impl FileTarget {
    /// Opens `path` read-write with O_DIRECT (read-only when `writable` is false). File systems
    /// without O_DIRECT (tmpfs) are opened buffered; [`FileTarget::direct`] says which. A path
    /// that is not UTF-8 is [`Error::InvalidArgument`].
    pub fn open(path: impl AsRef<std::path::Path>, writable: bool) -> Result<FileTarget> {
        let path = crate::error::utf8_path(path.as_ref())?;
        let open = |flags: i32| std::fs::OpenOptions::new().read(true).write(writable).custom_flags(flags).open(path);
        let (file, direct) = match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (open(0).map_err(|e| io_err(format!("open {path}"), e))?, false)
            }
            Err(e) => return Err(io_err(format!("open {path}"), e)),
        };
        Self::from_file(file, path, direct)
    }

    /// Uses an open file (the C ABI's descriptor registration). `direct` says whether it was
    /// opened with O_DIRECT.
    pub fn from_file(file: File, path: &str, direct: bool) -> Result<FileTarget> {
        let meta = file.metadata().map_err(|e| io_err(format!("stat {path}"), e))?;
        let block_device = meta.file_type().is_block_device();
        let mut align = 512u64;
        if block_device {
            let mut ssz: libc::c_int = 0;
            // SAFETY: BLKSSZGET writes an int.
            if unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut ssz) } == 0 && ssz > 0 {
                align = ssz as u64;
            }
        } else if !meta.file_type().is_file() {
            return Err(Error::invalid("path", format!("{path} is neither a regular file nor a block device")));
        }
        Ok(FileTarget {
            file,
            path: path.to_string(),
            direct,
            align,
            block_device,
            buffered: Default::default(),
            #[cfg(test)]
            fail_enters: Default::default(),
        })
    }

    /// Whether the file was opened with O_DIRECT (false on file systems without it).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Offsets and lengths must be multiples of this.
    pub fn align(&self) -> u64 {
        self.align
    }

    /// The path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The descriptor (for a batch's own ring; the target keeps it open).
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }

    /// Size in bytes (a block device's capacity, a file's length).
    pub fn capacity(&self) -> Result<u64> {
        if self.block_device {
            let mut n: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes a u64.
            if unsafe { libc::ioctl(self.file.as_raw_fd(), BLKGETSIZE64, &mut n) } != 0 {
                return Err(io_err("BLKGETSIZE64", std::io::Error::last_os_error()));
            }
            return Ok(n);
        }
        Ok(self.file.metadata().map_err(|e| io_err(format!("stat {}", self.path), e))?.len())
    }

    /// Writes `data` at `off` through the page cache: any size and offset, exactly these bytes
    /// (no block padding), concurrent writers of neighbouring bytes serialised by the kernel.
    /// Later O_DIRECT reads of the range see the data (the kernel writes dirty pages back
    /// before a direct read of their range).
    pub fn write_buffered(&self, data: &[u8], off: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let f = match self.buffered.get() {
            Some(f) => f,
            None if !self.direct => &self.file,
            None => {
                // The twin gets the direct descriptor's access mode: opening through /proc checks
                // the file's permissions, not the descriptor's, so a read-only target would
                // otherwise gain a writable twin.
                // SAFETY: F_GETFL on a descriptor this target owns.
                let flags = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_GETFL) };
                if flags < 0 {
                    return Err(io_err(format!("F_GETFL on {}", self.path), std::io::Error::last_os_error()));
                }
                let mode = flags & libc::O_ACCMODE;
                let f = std::fs::OpenOptions::new()
                    .read(mode != libc::O_WRONLY)
                    .write(mode != libc::O_RDONLY)
                    .open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
                    .map_err(|e| io_err(format!("reopening {} without O_DIRECT", self.path), e))?;
                self.buffered.get_or_init(|| f)
            }
        };
        f.write_all_at(data, off).map_err(|e| io_err(format!("write {} at {off}", self.path), e))
    }

    /// [`enter`] on `ring`, except that tests can make it fail ([`FileTarget::fail_enters`]).
    fn enter(&self, ring: &mut IoUring, want: usize) -> std::io::Result<usize> {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering::Relaxed;
            if self.fail_enters.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok() {
                return Err(std::io::Error::from_raw_os_error(libc::EFAULT));
            }
        }
        enter(ring, want)
    }

    /// Checks that the range is one a file can have (alignment was checked by the storage).
    fn check_extent(&self, file_offset: u64, len: u64) -> Result<()> {
        if file_offset.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
            return Err(Error::invalid("file_offset", "offset + length overflows"));
        }
        Ok(())
    }

    /// Reads up to `len` bytes at `file_offset` into host memory at `ptr`; returns the bytes
    /// read (fewer at end of file).
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must be writable memory that nothing else accesses during the call.
    pub(crate) unsafe fn read_host(&self, ptr: *mut u8, len: usize, file_offset: u64) -> IoResult<usize> {
        // SAFETY: forwarded from the caller.
        unsafe { self.transfer(false, ptr, len, file_offset) }
    }

    /// Writes `len` bytes from host memory at `ptr` to `file_offset`; returns the bytes written.
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must be readable memory not written during the call.
    pub(crate) unsafe fn write_host(&self, ptr: *const u8, len: usize, file_offset: u64) -> IoResult<usize> {
        // SAFETY: forwarded from the caller.
        unsafe { self.transfer(true, ptr as *mut u8, len, file_offset) }
    }

    /// Moves `len` bytes between `ptr` and the file, bouncing when `ptr` is not aligned. A bounce
    /// buffer the kernel may still use goes into the failure's token.
    unsafe fn transfer(&self, write: bool, ptr: *mut u8, len: usize, off: u64) -> IoResult<usize> {
        if !self.direct || (ptr as u64).is_multiple_of(self.align) {
            // SAFETY: forwarded from the caller.
            return unsafe { self.ring_io(write, ptr, len, off) };
        }
        let bounce = crate::mem::HostMemory::new(PIECE)?;
        let b = bounce.as_ptr();
        let mut done = 0;
        while done < len {
            let n = PIECE.min(len - done);
            if write {
                // SAFETY: the caller guarantees ptr..ptr+len; the bounce buffer holds PIECE bytes.
                unsafe { std::ptr::copy_nonoverlapping(ptr.add(done), b, n) };
            }
            // SAFETY: the bounce buffer holds PIECE >= n bytes, touched by nothing else.
            let got = match unsafe { self.ring_io(write, b, n, off + done as u64) } {
                Ok(got) => got,
                Err(mut f) => {
                    drop(f.hold_if_running(bounce));
                    return Err(f);
                }
            };
            if !write {
                // SAFETY: the kernel wrote `got <= n` bytes there; the caller's range holds them.
                unsafe { std::ptr::copy_nonoverlapping(b, ptr.add(done), got) };
            }
            done += got;
            if got < n {
                break;
            }
        }
        Ok(done)
    }

    /// Splits the request into pieces, all in flight at once on this thread's ring.
    unsafe fn ring_io(&self, write: bool, ptr: *mut u8, len: usize, off: u64) -> IoResult<usize> {
        // SAFETY: forwarded from the caller.
        with_ring(|ring| unsafe { self.ring_rounds(ring, write, ptr, len, off) })
    }

    /// [`FileTarget::ring_io`]'s rounds on `ring`; a failure that leaves requests in the ring
    /// carries a token ([`ring_left`]).
    ///
    /// # Safety
    ///
    /// As for [`FileTarget::ring_io`]: `ptr..ptr+len` is valid for the transfer's direction and
    /// nothing else accesses it during the call.
    unsafe fn ring_rounds(
        &self,
        ring: &mut IoUring,
        write: bool,
        ptr: *mut u8,
        len: usize,
        off: u64,
    ) -> IoResult<usize> {
        let fd = types::Fd(self.file.as_raw_fd());
        let mut done = 0usize;
        while done < len {
            // One round: up to RING_ENTRIES pieces.
            let mut lens = Vec::with_capacity(RING_ENTRIES as usize);
            let mut pos = done;
            while pos < len && lens.len() < RING_ENTRIES as usize {
                let n = PIECE.min(len - pos);
                // SAFETY: the caller guarantees ptr..ptr+len.
                let p = unsafe { ptr.add(pos) };
                let at = off + pos as u64;
                let e = if write {
                    opcode::Write::new(fd, p, n as u32).offset(at).build()
                } else {
                    opcode::Read::new(fd, p, n as u32).offset(at).build()
                }
                .user_data(lens.len() as u64);
                // SAFETY: the buffer outlives the wait below, which reaps every entry.
                unsafe { ring.submission().push(&e) }
                    .map_err(|_| ring_left(Error::invalid("ring", "submission queue full")))?;
                lens.push(n);
                pos += n;
            }
            if let Err(e) = self.enter(ring, lens.len()) {
                return Err(ring_left(io_err("io_uring_enter", e)));
            }
            let mut got = vec![0i32; lens.len()];
            let mut reaped = 0;
            while reaped < lens.len() {
                for c in ring.completion() {
                    got[c.user_data() as usize] = c.result();
                    reaped += 1;
                }
                if reaped < lens.len() {
                    if let Err(e) = self.enter(ring, 1) {
                        return Err(ring_left(io_err("io_uring_enter", e)));
                    }
                }
            }
            for (i, r) in got.iter().enumerate() {
                if *r < 0 {
                    let what = if write { "write" } else { "read" };
                    let e = std::io::Error::from_raw_os_error(-r);
                    return Err(io_err(format!("{what} {} at {}", self.path, off + done as u64), e).into());
                }
                done += *r as usize;
                if (*r as usize) < lens[i] {
                    // End of file: what follows the short piece is not data.
                    return Ok(done);
                }
            }
        }
        Ok(done)
    }

    /// Reads into GPU memory at `dev_ptr` through staging chunks; returns bytes read.
    ///
    /// Up to [`READ_LANES`] chunks are read from disk at once; as each arrives, its copy to the
    /// device starts, and its staging chunk is read into again once that copy is done.
    pub(crate) fn read_gpu(&self, mem: &Arc<GpuMemory>, dev_ptr: u64, len: usize, file_offset: u64) -> IoResult<usize> {
        let gpu = mem.gpu();
        let nchunks = len.div_ceil(STAGING_CHUNK);
        let lanes = nchunks.clamp(1, READ_LANES);
        let stage = gpu.take_staging(lanes)?;
        let mut qs = match gpu.take_queues(lanes) {
            Ok(q) => q,
            Err(e) => {
                gpu.put_staging(stage);
                return Err(e.into());
            }
        };
        let piece = |k: usize| (k * STAGING_CHUNK, STAGING_CHUNK.min(len - k * STAGING_CHUNK));
        let mut got = vec![0usize; nchunks];
        // A failure with disk reads still in flight carries a token (`ring_left`): the ring and,
        // below, the chunks go into it.
        let r = with_ring(|ring| -> IoResult<()> {
            let fd = types::Fd(self.file.as_raw_fd());
            let (mut next, mut inflight, mut first_err) = (0usize, 0usize, None);
            while next < nchunks || inflight > 0 {
                while first_err.is_none() && next < nchunks && inflight < lanes {
                    let lane = next % lanes;
                    // The lane's staging chunk is free once its last copy finished.
                    if let Err(e) = qs[lane].wait() {
                        first_err = Some(e);
                        break;
                    }
                    let (at, n) = piece(next);
                    let e = opcode::Read::new(fd, stage[lane].as_ptr(), n as u32)
                        .offset(file_offset + at as u64)
                        .build()
                        .user_data(next as u64);
                    // SAFETY: the staging chunk stays untouched until this entry is reaped below.
                    if unsafe { ring.submission().push(&e) }.is_err() {
                        let e = Error::invalid("ring", "submission queue full");
                        return Err(if inflight > 0 { ring_left(e) } else { e.into() });
                    }
                    next += 1;
                    inflight += 1;
                }
                if inflight == 0 {
                    break;
                }
                if let Err(e) = self.enter(ring, 1) {
                    return Err(ring_left(io_err("io_uring_enter", e)));
                }
                let done: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
                for (k, res) in done {
                    inflight -= 1;
                    let k = k as usize;
                    if res < 0 {
                        let e = io_err(
                            format!("read {} at {}", self.path, file_offset + piece(k).0 as u64),
                            std::io::Error::from_raw_os_error(-res),
                        );
                        first_err.get_or_insert(e);
                        continue;
                    }
                    got[k] = res as usize;
                    if first_err.is_none() && res > 0 {
                        let lane = k % lanes;
                        // SAFETY: the chunk holds `res` bytes just read; it is not reused
                        // before this lane's queue is waited on.
                        if let Err(e) = unsafe {
                            qs[lane].to_device(dev_ptr + piece(k).0 as u64, stage[lane].as_ptr(), res as usize)
                        } {
                            first_err = Some(e);
                        }
                    }
                }
            }
            match first_err {
                Some(e) => Err(e.into()),
                None => Ok(()),
            }
        });
        // Bytes up to the first short chunk (the end of the file).
        let mut total = 0;
        for (k, &g) in got.iter().enumerate() {
            total += g;
            if g < piece(k).1 {
                break;
            }
        }
        // A stream's only I/O leaves its one copy running: the stream's completion is queued
        // behind it, and the copy keeps its queue, staging and memory until it is done.
        if r.is_ok() && lanes == 1 && stream_tail::armed() {
            if let Some(q) = qs.pop() {
                // Armed, so it is taken (were it not, dropping it would wait for the copy).
                drop(stream_tail::defer(Copying::new(gpu.clone(), q, stage, mem.clone())));
                return Ok(total);
            }
        }
        // Every disk read is reaped by now, unless the failure's token holds the ring; copies may
        // still run: wait before the chunks go back (or keep them, with the queues, for good if
        // a queue cannot say it is done).
        let waited = qs.iter_mut().all(|q| gpu.wait_copy(q.as_mut(), len).is_ok());
        let mut r = r.and_then(|()| match waited {
            true => Ok(()),
            false => Err(Error::Gpu { op: "staging copy", reason: "a copy queue failed".into() }.into()),
        });
        let spare = match &mut r {
            Ok(()) => Some((stage, qs)),
            Err(f) => {
                if !waited {
                    f.add(InFlight::new(Why::Copy));
                }
                f.hold_if_running((stage, qs))
            }
        };
        if let Some((stage, qs)) = spare {
            qs.into_iter().for_each(|q| gpu.put_queue(q));
            gpu.put_staging(stage);
        }
        r?;
        Ok(total)
    }

    /// Writes from GPU memory at `dev_ptr` through staging chunks; returns bytes written.
    pub(crate) fn write_gpu(&self, gpu: &Gpu, dev_ptr: u64, len: usize, file_offset: u64) -> IoResult<usize> {
        staged(gpu, true, dev_ptr, len, None, |p, n, at| {
            // SAFETY: `staged` hands us one of its staging chunks, `n` bytes long, which no copy
            // uses until this write returns.
            unsafe { self.ring_io(true, p, n, file_offset + at) }
        })
    }

    /// Flushes written data to stable storage.
    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| io_err(format!("fdatasync {}", self.path), e))
    }
}

impl DataPath for FileTarget {
    fn describe(&self) -> String {
        format!(
            "fallback path ({}): {}, {} bytes, {}-byte alignment",
            if self.direct { "io_uring, O_DIRECT" } else { "io_uring through the page cache: no O_DIRECT here" },
            self.path,
            self.capacity().unwrap_or(0),
            self.align
        )
    }

    fn capacity(&self) -> Result<u64> {
        FileTarget::capacity(self)
    }

    fn block_size(&self) -> u64 {
        self.align
    }

    fn buffer_alignment(&self) -> u64 {
        1
    }

    fn check_extent(&self, file_offset: u64, len: u64) -> Result<()> {
        FileTarget::check_extent(self, file_offset, len)
    }

    fn is_direct(&self) -> bool {
        false
    }

    fn bypasses_page_cache(&self) -> bool {
        self.direct
    }

    unsafe fn register_host(&self, _ptr: *mut u8, _len: usize) -> Result<Registered> {
        Ok(Registered { regs: Vec::new(), staging: None, path: Path::Fallback })
    }

    fn register_gpu(&self, _mem: &Arc<GpuMemory>, _allow_staging: bool) -> Result<Registered> {
        Ok(Registered { regs: Vec::new(), staging: None, path: Path::Fallback })
    }

    fn rw(&self, write: bool, lease: Lease<&Buffer>, buf_offset: u64, file_offset: u64, len: u64) -> IoResult<u64> {
        let r = match lease.buffer().mem() {
            Mem::Host { ptr, .. } => {
                // SAFETY: the storage checked the range against the buffer, whose memory is
                // valid while it lives; the lease keeps the CPU out of it during the call.
                let p = unsafe { ptr.add(buf_offset as usize) };
                // SAFETY: `p..p+len` lies in the leased buffer (see above).
                unsafe {
                    if write {
                        self.write_host(p, len as usize, file_offset)
                    } else {
                        self.read_host(p, len as usize, file_offset)
                    }
                }
            }
            Mem::Gpu(g) => {
                let dev_ptr = g.device_ptr() + buf_offset;
                if write {
                    self.write_gpu(g.gpu(), dev_ptr, len as usize, file_offset)
                } else {
                    self.read_gpu(g, dev_ptr, len as usize, file_offset)
                }
            }
        };
        // The kernel or a copy queue may still move data into or out of the memory: the
        // failure's token keeps the lease.
        settle(r.map(|n| n as u64), lease)
    }

    fn flush(&self) -> Result<()> {
        self.sync()
    }

    fn write_bytes(&self, data: &[u8], off: u64) -> Option<Result<()>> {
        Some(self.write_buffered(data, off))
    }

    fn max_command_bytes(&self) -> u64 {
        u64::MAX
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::gpu::Gpu;
    use crate::storage::ConcretePath;
    use crate::{Error, Storage};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    /// A file of `len` bytes of the test pattern (seed 1) on the temporary directory's file
    /// system, removed on drop.
    pub(crate) struct TempFile(std::path::PathBuf);

    impl TempFile {
        pub(crate) fn new(name: &str, len: usize) -> TempFile {
            let p = std::env::temp_dir().join(format!("ugds-unit-{name}-{}", std::process::id()));
            let mut data = vec![0u8; len];
            crate::pattern::fill(1, 0, &mut data);
            std::fs::write(&p, &data).unwrap();
            TempFile(p)
        }

        /// The file opened as a storage.
        pub(crate) fn storage(&self) -> Arc<Storage> {
            Storage::open(self.0.to_str().unwrap()).unwrap()
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// A staged GPU write whose ring is given up with its request in it (the kernel may still
    /// read the staging chunk) keeps that chunk out of the GPU's pool, and the buffer busy:
    /// deregistration is refused by name. The thread's next I/O runs on a new ring. (The chunk
    /// used to go back to the pool, for the next staged I/O to overwrite.)
    #[test]
    fn an_abandoned_ring_keeps_a_staged_writes_chunk_and_its_buffer() {
        let f = TempFile::new("abandon-staged", 4 << 20);
        let st = f.storage();
        let gpu = Gpu::cpu();
        let gbuf = st.register_gpu(Arc::new(gpu.alloc(1 << 20).unwrap()), false).unwrap();
        let pooled = gpu.pooled_staging();
        assert!(pooled > 0, "registration prewarms the pool");
        let ConcretePath::File(file) = st.concrete_path() else { panic!("a file target") };
        file.fail_enters.store(1, Ordering::Relaxed);
        let e = st.write(&gbuf, 0, 0, 65536).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e:?}");
        assert_eq!(gpu.pooled_staging(), pooled - 1, "the chunk the kernel may still read stays out of the pool");
        assert_eq!(gbuf.inflight(), 1);
        let (gbuf, e) = *gbuf.deregister().unwrap_err();
        assert!(matches!(e, Error::RegistrationBusy { inflight: 1, .. }), "{e:?}");
        drop(gbuf);
        let host = st.alloc_host(65536).unwrap();
        assert_eq!(st.read(&host, 0, 0, 65536).unwrap(), 65536);
        let mut out = vec![0u8; 65536];
        host.copy_out(0, &mut out).unwrap();
        assert_eq!(crate::pattern::first_mismatch(1, 0, &out), None);
    }
}

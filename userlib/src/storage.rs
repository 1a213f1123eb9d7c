//! One API over every path: a [`Storage`] is either a namespace of a controller bound to ugds
//! (the direct path: the SSD DMAs into host memory or, through dma-buf, GPU memory) or a file or
//! block device owned by the kernel (the fallback path: io_uring with O_DIRECT, GPU memory
//! staged through pinned host chunks). A [`Buffer`] is memory registered for one storage. Each
//! I/O's path is counted; choosing the fallback path logs one line, once per reason.
//!
//! This is the layer the C ABI and the stream-ordered API build on. The direct path's native
//! API ([`crate::Namespace`], [`crate::Batch`]) stays available for code that wants it.

use crate::device::{Device, Namespace, Registration};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::fallback::{staged, FileTarget};
use crate::gpu::{GpuMemory, STAGING_CHUNK};
use crate::mem::HostMemory;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The way an I/O's data moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// SSD ↔ GPU memory by peer-to-peer DMA (dma-buf).
    DirectP2p,
    /// SSD ↔ registered host memory by DMA, no system call.
    DirectHost,
    /// Through the kernel (io_uring, O_DIRECT), GPU memory staged through host memory.
    Fallback,
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Path::DirectP2p => "direct (peer-to-peer)",
            Path::DirectHost => "direct (host memory)",
            Path::Fallback => "fallback (io_uring + staging)",
        })
    }
}

/// I/Os and bytes per path since the storage was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounts {
    /// I/Os by peer-to-peer DMA.
    pub direct_p2p: u64,
    /// I/Os by DMA into host memory.
    pub direct_host: u64,
    /// I/Os through the fallback path.
    pub fallback: u64,
    /// Bytes moved, all paths.
    pub bytes: u64,
}

#[derive(Debug, Default)]
struct PathStats {
    p2p: AtomicU64,
    host: AtomicU64,
    fallback: AtomicU64,
    bytes: AtomicU64,
}

#[derive(Debug)]
enum Target {
    Direct { ns: Namespace, dev: Device },
    File(FileTarget),
}

/// Where I/O goes (cuFile's file handle).
#[derive(Debug)]
pub struct Storage {
    target: Target,
    stats: PathStats,
    engine: OnceLock<Arc<Engine>>,
    /// Buffers remember which storage they were registered for.
    id: u64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Logs why the fallback path was chosen: once per distinct reason per process.
fn note_fallback(what: &str, how: &str, why: &str) {
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let line = format!("ugds: {what}: using the fallback path ({how}): {why}");
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&line) {
        eprintln!("{line}");
        seen.push(line);
    }
}

enum Mem {
    Host { ptr: *mut u8, len: usize, _own: Option<HostMemory> },
    Gpu(Arc<GpuMemory>),
}

/// Memory registered for a [`Storage`] (cuFile's registered buffer). Host memory or GPU memory;
/// on the direct path it holds the module's registration.
pub struct Buffer {
    mem: Mem,
    reg: Option<Arc<Registration>>,
    /// Registered host staging chunks, for GPU memory on the direct path without dma-buf.
    stage: Option<Mutex<Registration>>,
    path: Path,
    storage: u64,
    inflight: AtomicU32,
}

// SAFETY: the host pointer is memory this buffer owns or that the caller promised (at
// registration) to keep valid; concurrent access is I/O whose ranges the caller chooses, as with
// any DMA buffer. Registrations are Send + Sync.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes, {})", self.len(), self.path)
    }
}

/// The bit of [`Buffer`]'s lease word that says the CPU is copying (the rest counts I/Os).
const CPU_COPY: u32 = 1 << 31;

/// Leases a buffer to one I/O for as long as it runs; refused while the CPU is copying.
struct InFlight<'a>(&'a Buffer);

impl<'a> InFlight<'a> {
    fn new(b: &'a Buffer) -> Result<Self> {
        let mut cur = b.inflight.load(Ordering::Acquire);
        loop {
            if cur & CPU_COPY != 0 {
                return Err(Error::RegistrationBusy { id: 0, inflight: 0 });
            }
            match b.inflight.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(InFlight(b)),
                Err(v) => cur = v,
            }
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Leases a buffer to the CPU (copy_in/copy_out): only when no I/O runs, and no I/O starts
/// until it ends. Taking the lease and checking for I/O is one atomic step, so two threads
/// sharing an `Arc<Buffer>` cannot copy while the device writes.
struct CpuLease<'a>(&'a Buffer);

impl<'a> CpuLease<'a> {
    fn new(b: &'a Buffer) -> Result<Self> {
        match b.inflight.compare_exchange(0, CPU_COPY, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(CpuLease(b)),
            Err(cur) => Err(Error::RegistrationBusy { id: 0, inflight: cur & !CPU_COPY }),
        }
    }
}

impl Drop for CpuLease<'_> {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(CPU_COPY, Ordering::AcqRel);
    }
}

impl Buffer {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.mem {
            Mem::Host { len, .. } => *len,
            Mem::Gpu(g) => g.len(),
        }
    }

    /// True when empty (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The path I/O on this buffer takes.
    pub fn path(&self) -> Path {
        self.path
    }

    /// I/Os running on it.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Acquire) & !CPU_COPY
    }

    /// The GPU memory, when it is GPU memory.
    pub fn gpu_memory(&self) -> Option<&Arc<GpuMemory>> {
        match &self.mem {
            Mem::Gpu(g) => Some(g),
            Mem::Host { .. } => None,
        }
    }

    /// The module's registration, on the direct path.
    pub(crate) fn registration(&self) -> Option<&Arc<Registration>> {
        self.reg.as_ref()
    }

    /// The host address, when it is host memory.
    pub fn host_ptr(&self) -> Option<*mut u8> {
        match &self.mem {
            Mem::Host { ptr, .. } => Some(*ptr),
            Mem::Gpu(_) => None,
        }
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.len() as u64) {
            return Err(Error::invalid(
                "buf_offset",
                format!("[{offset}, +{len}) runs past the {}-byte buffer", self.len()),
            ));
        }
        Ok(())
    }

    fn idle(&self) -> Result<()> {
        match self.inflight() {
            0 => Ok(()),
            n => Err(Error::RegistrationBusy { id: 0, inflight: n }),
        }
    }

    /// Copies `src` into the buffer at `offset` (refused while I/O on it is running).
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> Result<()> {
        let _cpu = CpuLease::new(self)?;
        self.check(offset as u64, src.len() as u64)?;
        match &self.mem {
            // SAFETY: range checked; no I/O is running on the buffer.
            Mem::Host { ptr, .. } => unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.add(offset), src.len()) },
            Mem::Gpu(g) => g.gpu().upload(g, offset, src)?,
        }
        Ok(())
    }

    /// Copies the buffer at `offset` into `dst` (refused while I/O on it is running).
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let _cpu = CpuLease::new(self)?;
        self.check(offset as u64, dst.len() as u64)?;
        match &self.mem {
            // SAFETY: range checked; no I/O is running on the buffer.
            Mem::Host { ptr, .. } => unsafe {
                std::ptr::copy_nonoverlapping(ptr.add(offset), dst.as_mut_ptr(), dst.len())
            },
            Mem::Gpu(g) => g.gpu().download(g, offset, dst)?,
        }
        Ok(())
    }

    /// Deregisters now; refused (the buffer comes back) while I/O on it is running.
    #[allow(clippy::result_large_err)]
    pub fn deregister(self) -> std::result::Result<(), Box<(Self, Error)>> {
        if let Err(e) = self.idle() {
            return Err(Box::new((self, e)));
        }
        drop(self);
        Ok(())
    }
}

impl Storage {
    /// Opens `path`: a ugds node (`/dev/ugds_drvN`, recognised by its sysfs class: see
    /// [`crate::device::is_ugds_node`]) takes the direct path on namespace 1; a regular file or a
    /// block device takes the fallback path.
    pub fn open(path: &str) -> Result<Arc<Storage>> {
        Self::open_ns(path, 1)
    }

    /// Opens `path` as [`Storage::open`] does, namespace `nsid` of a ugds node.
    pub fn open_ns(path: &str, nsid: u32) -> Result<Arc<Storage>> {
        if crate::device::is_ugds_node(path) {
            let dev = Device::open(path)?;
            return Self::direct(&dev, nsid);
        }
        if !std::path::Path::new(path).exists() {
            return Err(Error::Open {
                path: path.to_string(),
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            });
        }
        FileTarget::open(path, true)
            .map_err(|e| match e {
                Error::InvalidArgument { .. } => Error::NotUgdsNode {
                    path: path.to_string(),
                    what: crate::device::describe_path(path),
                    fix: "give a ugds node (/dev/ugds_drvN, direct path), a regular file or a block \
                      device (fallback path)",
                },
                other => other,
            })
            .and_then(Self::file)
    }

    /// Which path I/O on this storage takes, and on what, in words.
    pub fn describe(&self) -> String {
        match &self.target {
            Target::Direct { ns, dev } => format!(
                "direct path (user-space NVMe queues): namespace {} of {} (serial {}), {} bytes in {}-byte blocks",
                ns.id(),
                dev.model(),
                dev.serial(),
                ns.capacity(),
                ns.block_size()
            ),
            Target::File(f) => format!(
                "fallback path ({}): {}, {} bytes, {}-byte alignment",
                if f.direct() { "io_uring, O_DIRECT" } else { "io_uring through the page cache: no O_DIRECT here" },
                f.path(),
                f.capacity().unwrap_or(0),
                f.align()
            ),
        }
    }

    /// Namespace `nsid` of an open device.
    pub fn direct(dev: &Device, nsid: u32) -> Result<Arc<Storage>> {
        let ns = dev.namespace(nsid)?;
        Ok(Self::new(Target::Direct { ns, dev: dev.clone() }))
    }

    /// A file or block device (the fallback path).
    pub fn file(f: FileTarget) -> Result<Arc<Storage>> {
        if !f.direct() {
            note_fallback(
                f.path(),
                "buffered I/O",
                "the file system does not support O_DIRECT; I/O goes through the page cache",
            );
        }
        Ok(Self::new(Target::File(f)))
    }

    fn new(target: Target) -> Arc<Storage> {
        Arc::new(Storage {
            target,
            stats: PathStats::default(),
            engine: OnceLock::new(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The namespace and device, on the direct path.
    pub(crate) fn direct_parts(&self) -> Option<(&Namespace, &Device)> {
        match &self.target {
            Target::Direct { ns, dev } => Some((ns, dev)),
            Target::File(_) => None,
        }
    }

    /// Counts one finished I/O of `bytes` on `path`.
    pub(crate) fn count(&self, path: Path, bytes: u64) {
        let counter = match path {
            Path::DirectP2p => &self.stats.p2p,
            Path::DirectHost => &self.stats.host,
            Path::Fallback => &self.stats.fallback,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// False only for a file opened without O_DIRECT (its file system has none): then I/O goes
    /// through the page cache.
    pub fn bypasses_page_cache(&self) -> bool {
        match &self.target {
            Target::Direct { .. } => true,
            Target::File(f) => f.direct(),
        }
    }

    /// True for the direct path.
    pub fn is_direct(&self) -> bool {
        matches!(self.target, Target::Direct { .. })
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> Result<u64> {
        match &self.target {
            Target::Direct { ns, .. } => Ok(ns.capacity()),
            Target::File(f) => f.capacity(),
        }
    }

    /// Writes `data` at `off` exactly (any size and offset) through the page cache, on the
    /// fallback path; `None` on the direct path (a namespace has no byte-granular write).
    pub fn write_bytes(&self, data: &[u8], off: u64) -> Option<Result<()>> {
        match &self.target {
            Target::File(f) => Some(f.write_buffered(data, off)),
            Target::Direct { .. } => None,
        }
    }

    /// Offsets and lengths must be multiples of this.
    pub fn block_size(&self) -> u64 {
        match &self.target {
            Target::Direct { ns, .. } => ns.block_size(),
            Target::File(f) => f.align(),
        }
    }

    /// I/O counts per path.
    pub fn path_counts(&self) -> PathCounts {
        PathCounts {
            direct_p2p: self.stats.p2p.load(Ordering::Relaxed),
            direct_host: self.stats.host.load(Ordering::Relaxed),
            fallback: self.stats.fallback.load(Ordering::Relaxed),
            bytes: self.stats.bytes.load(Ordering::Relaxed),
        }
    }

    /// The worker pool for batches and stream-ordered I/O (started on first use).
    pub(crate) fn engine(&self) -> Result<Arc<Engine>> {
        if let Some(e) = self.engine.get() {
            return Ok(e.clone());
        }
        let e = Engine::new(8)?;
        Ok(self.engine.get_or_init(|| e).clone())
    }

    fn buffer(&self, mem: Mem, reg: Option<Registration>, stage: Option<Registration>, path: Path) -> Buffer {
        Buffer {
            mem,
            reg: reg.map(Arc::new),
            stage: stage.map(Mutex::new),
            path,
            storage: self.id,
            inflight: AtomicU32::new(0),
        }
    }

    /// Allocates and registers `len` bytes of page-aligned host memory.
    pub fn alloc_host(&self, len: usize) -> Result<Buffer> {
        if len == 0 {
            return Err(Error::invalid("len", "must be non-zero"));
        }
        let m = HostMemory::new(len.next_multiple_of(4096))?;
        let ptr = m.as_ptr();
        // SAFETY: the mapping is owned by the buffer, which outlives its registration.
        unsafe { self.register_host_owned(ptr, len, Some(m)) }
    }

    /// Registers caller-owned host memory (page-aligned address; any length).
    ///
    /// # Safety
    ///
    /// The memory must stay mapped while the buffer lives, and must not be accessed through
    /// Rust references while I/O into it runs.
    pub unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> Result<Buffer> {
        // SAFETY: forwarded.
        unsafe { self.register_host_owned(ptr, len, None) }
    }

    unsafe fn register_host_owned(&self, ptr: *mut u8, len: usize, own: Option<HostMemory>) -> Result<Buffer> {
        if ptr.is_null() || !(ptr as usize).is_multiple_of(4096) {
            return Err(Error::invalid("ptr", "host memory must start on a 4096-byte page boundary"));
        }
        if len == 0 {
            return Err(Error::invalid("len", "must be non-zero"));
        }
        let mem = Mem::Host { ptr, len, _own: own };
        match &self.target {
            Target::Direct { dev, .. } => {
                // The module pins whole pages.
                // SAFETY: forwarded from the caller; pages past `len` up to the page end are
                // part of the same mapping (mappings are page-granular).
                let reg = unsafe { dev.register_host(ptr, len.next_multiple_of(4096)) }?;
                Ok(self.buffer(mem, Some(reg), None, Path::DirectHost))
            }
            Target::File(_) => Ok(self.buffer(mem, None, None, Path::Fallback)),
        }
    }

    /// Registers GPU memory. On the direct path it is exported as a dma-buf and registered
    /// with the module (peer-to-peer); when that is impossible the error says why and what to
    /// do, unless `allow_fallback` is set, in which case I/O is staged through registered host
    /// memory (and that choice is logged once).
    pub fn register_gpu(&self, mem: Arc<GpuMemory>, allow_fallback: bool) -> Result<Buffer> {
        let Target::Direct { dev, .. } = &self.target else {
            return Ok(self.buffer(Mem::Gpu(mem), None, None, Path::Fallback));
        };
        let direct = mem.export_dmabuf().and_then(|fd| {
            use std::os::fd::AsRawFd;
            dev.register_dmabuf(fd.as_raw_fd(), 0, mem.len().next_multiple_of(4096) as u64)
        });
        match direct {
            Ok(reg) => Ok(self.buffer(Mem::Gpu(mem), Some(reg), None, Path::DirectP2p)),
            Err(e) if allow_fallback => {
                note_fallback(
                    &format!("GPU memory on {}", mem.gpu().runtime().device_name()),
                    "staged through registered host memory",
                    &e.to_string(),
                );
                let stage = dev.alloc(2 * STAGING_CHUNK)?;
                Ok(self.buffer(Mem::Gpu(mem), None, Some(stage), Path::Fallback))
            }
            Err(e) => Err(e),
        }
    }

    /// Validates an I/O before anything runs.
    pub(crate) fn check(&self, buf: &Buffer, buf_offset: u64, file_offset: u64, len: u64) -> Result<()> {
        if buf.storage != self.id {
            return Err(Error::invalid("buf", "registered for another storage"));
        }
        buf.check(buf_offset, len)?;
        let bs = self.block_size();
        if len == 0 {
            return Err(Error::invalid("len", "must be non-zero"));
        }
        if !len.is_multiple_of(bs) {
            return Err(Error::invalid("len", format!("{len} is not a multiple of the {bs}-byte block size")));
        }
        if !file_offset.is_multiple_of(bs) {
            return Err(Error::invalid(
                "file_offset",
                format!("{file_offset} is not a multiple of the {bs}-byte block size"),
            ));
        }
        Ok(())
    }

    /// Reads `len` bytes at `file_offset` into `buf` at `buf_offset`; returns the bytes read
    /// (fewer only at the end of a file).
    pub fn read(&self, buf: &Buffer, buf_offset: u64, file_offset: u64, len: u64) -> Result<u64> {
        self.rw(false, buf, buf_offset, file_offset, len)
    }

    /// Writes `len` bytes from `buf` at `buf_offset` to `file_offset`; returns the bytes written.
    pub fn write(&self, buf: &Buffer, buf_offset: u64, file_offset: u64, len: u64) -> Result<u64> {
        self.rw(true, buf, buf_offset, file_offset, len)
    }

    pub(crate) fn rw(&self, write: bool, buf: &Buffer, buf_offset: u64, file_offset: u64, len: u64) -> Result<u64> {
        self.check(buf, buf_offset, file_offset, len)?;
        let _busy = InFlight::new(buf)?;
        let n = match (&self.target, &buf.mem) {
            (Target::Direct { ns, .. }, _) if buf.reg.is_some() => {
                let reg = buf.reg.as_ref().ok_or_else(|| Error::invalid("buf", "not registered"))?;
                ns.rw(write, reg, buf_offset, file_offset, len)?;
                len
            }
            (Target::Direct { ns, .. }, Mem::Gpu(g)) => {
                let stage = buf.stage.as_ref().ok_or_else(|| Error::invalid("buf", "not registered"))?;
                let mut stage = stage.lock().unwrap_or_else(|e| e.into_inner());
                // The lock makes us the staging memory's only user: its address (taken through
                // the exclusive borrow, which ends here) is written by the copies and by the
                // device in turn, never at once (`staged` orders them).
                let base = stage
                    .as_mut_slice()
                    .map(|v| v.as_mut_ptr() as usize)
                    .ok_or_else(|| Error::invalid("buf", "the staging registration has no host memory"))?;
                let staging = [base as *mut u8, (base + STAGING_CHUNK) as *mut u8];
                let dev_ptr = g.device_ptr() + buf_offset;
                staged(g.gpu(), write, dev_ptr, len as usize, Some(staging), |p, n, at| {
                    ns.rw(write, &stage, p as u64 - base as u64, file_offset + at, n as u64)?;
                    Ok(n)
                })? as u64
            }
            (Target::Direct { .. }, Mem::Host { .. }) => return Err(Error::invalid("buf", "not registered")),
            (Target::File(f), Mem::Host { ptr, .. }) => {
                // SAFETY: the range was checked against the buffer, whose memory is valid while
                // it lives (registration contract).
                let p = unsafe { ptr.add(buf_offset as usize) };
                // SAFETY: as above.
                (unsafe {
                    if write {
                        f.write_host(p, len as usize, file_offset)
                    } else {
                        f.read_host(p, len as usize, file_offset)
                    }
                })? as u64
            }
            (Target::File(f), Mem::Gpu(g)) => {
                let dev_ptr = g.device_ptr() + buf_offset;
                (if write {
                    f.write_gpu(g.gpu(), dev_ptr, len as usize, file_offset)
                } else {
                    f.read_gpu(g.gpu(), dev_ptr, len as usize, file_offset)
                })? as u64
            }
        };
        self.count(buf.path, n);
        Ok(n)
    }

    /// Flushes written data (NVMe Flush, or fdatasync).
    pub fn flush(&self) -> Result<()> {
        match &self.target {
            Target::Direct { ns, .. } => ns.flush(),
            Target::File(f) => f.sync(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU copying into a buffer and the device writing into it exclude each other in one
    /// atomic step (two threads sharing an `Arc<Buffer>` used to race: `copy_in` checked for I/O
    /// and then copied).
    #[test]
    fn cpu_copies_and_io_exclude_each_other() {
        let path = std::env::temp_dir().join(format!("ugds-lease-{}", std::process::id()));
        std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
        let st = Storage::open(path.to_str().unwrap()).unwrap();
        let buf = st.alloc_host(8192).unwrap();
        let io = InFlight::new(&buf).unwrap();
        assert!(matches!(buf.copy_in(0, &[1; 16]), Err(Error::RegistrationBusy { inflight: 1, .. })));
        let mut out = [0u8; 16];
        assert!(buf.copy_out(0, &mut out).is_err());
        drop(io);
        let cpu = CpuLease::new(&buf).unwrap();
        assert!(matches!(st.read(&buf, 0, 0, 4096), Err(Error::RegistrationBusy { .. })));
        assert!(CpuLease::new(&buf).is_err(), "one CPU lease at a time");
        assert_eq!(buf.inflight(), 0, "the CPU lease is not an I/O");
        drop(cpu);
        assert_eq!(st.read(&buf, 0, 0, 4096).unwrap(), 4096);
        buf.copy_in(0, &[1; 16]).unwrap();
        std::fs::remove_file(path).unwrap();
    }
}

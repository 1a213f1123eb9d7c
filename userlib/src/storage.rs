//! One API over every path: a [`Storage`] is a place data goes (a namespace of a controller
//! bound to ugds, the direct path; or a file or block device owned by the kernel, the fallback
//! path; behind the crate-private `DataPath` trait of `data_path.rs`, held by its concrete kind,
//! `storage/concrete_path.rs`). A [`Buffer`] is memory registered for one storage. The storage
//! checks every request once, leases the buffer for the I/O, and counts each I/O's path;
//! choosing a slower path logs one warning ([`crate::logging`]), once per reason.
//!
//! Batches ([`crate::StorageBatch`]), stream-ordered I/O ([`crate::StreamIo`]) and the C,
//! cuFile and Python faces are layers over this one.

use crate::buffer::{Buffer, Lease, Mem, Path};
use crate::data_path::{DataPath, Registered};
use crate::device::{Device, DeviceOptions};
use crate::direct::DirectPath;
use crate::engine::Engine;
use crate::error::{Error, Result};
#[cfg(feature = "fallback")]
use crate::fallback::FileTarget;
use crate::fork::Born;
use crate::gpu::GpuMemory;
use crate::inflight::{Failed, IoResult};
use crate::mem::HostMemory;
use crate::volume::{VolumePath, VolumeSpec};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

mod concrete_path;
mod owned;
pub(crate) mod target;
use concrete_path::with_path;
pub(crate) use concrete_path::ConcretePath;
pub use owned::OwnedQueue;
pub(crate) use target::Target;
pub use target::TargetKind;

/// I/Os and bytes per path since the storage was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounts {
    /// I/Os by peer-to-peer DMA.
    pub direct_p2p: u64,
    /// I/Os by DMA into host memory.
    pub direct_host: u64,
    /// I/Os of GPU memory staged through host memory on the direct path.
    pub direct_staged: u64,
    /// I/Os through the fallback path.
    pub fallback: u64,
    /// I/Os of host memory on the remote path (NVMe over Fabrics).
    pub remote: u64,
    /// I/Os of GPU memory staged through host memory on the remote path.
    pub remote_staged: u64,
    /// Bytes moved, all paths.
    pub bytes: u64,
}

#[derive(Debug, Default)]
struct PathStats {
    p2p: AtomicU64,
    host: AtomicU64,
    staged: AtomicU64,
    fallback: AtomicU64,
    remote: AtomicU64,
    remote_staged: AtomicU64,
    bytes: AtomicU64,
}

/// Where I/O goes (cuFile's file handle).
///
/// Bound to the process that opened it: in a child forked after that, every call that would
/// touch the target fails with [`Error::ForkedChild`], and dropping it touches nothing of the
/// parent's (open the target again in the child).
#[derive(Debug)]
pub struct Storage {
    /// `ManuallyDrop`: a remote target's connections are the parent's in a forked child, and
    /// are leaked there (see `Drop`).
    path: ManuallyDrop<ConcretePath>,
    stats: PathStats,
    engine: OnceLock<Arc<Engine>>,
    /// Buffers remember which storage they were registered for.
    id: u64,
    /// The fork generation it was opened in.
    born: Born,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Storage {
    /// Opens `path`: a ugds node (`/dev/ugds_drvN`, recognised by its sysfs class: see
    /// [`crate::device::is_ugds_node`]) takes the direct path on namespace 1; a striped volume
    /// (`stripe:[CHUNK:]NODE,NODE,...`, or a volume descriptor file holding that line, named
    /// `*.ugds-volume`: see [`VolumeSpec::descriptor_target`]; [`Storage::open_volume`] opens a
    /// descriptor of any name) the direct path on every member; a regular file of any other
    /// name (whatever it holds) or a block device takes the fallback path; an NVMe over Fabrics target
    /// (`nvmeof://tcp/HOST:PORT/SUBSYSNQN?nsid=N`, or `nvmeof://rdma/...`, see
    /// [`crate::remote::RemoteSpec`]) the remote path (`nsid` comes from the URI), and so does a
    /// namespace of the kernel's NVMe/TCP or NVMe/RDMA initiator (`/dev/nvmeXnY`: its target is
    /// read from sysfs).
    ///
    /// `path` is anything that names a path (`&str`, `String`, `&Path`, `PathBuf`, ...): a URI
    /// or a `stripe:` spec is a path too, as far as the type goes. A path that is not UTF-8 is
    /// [`Error::InvalidArgument`].
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Arc<Storage>> {
        Self::open_ns(path, 1)
    }

    /// Opens `path` as [`Storage::open`] does, namespace `nsid` of a ugds node.
    pub fn open_ns(path: impl AsRef<std::path::Path>, nsid: u32) -> Result<Arc<Storage>> {
        Self::open_with(path, nsid, &DeviceOptions::default())
    }

    /// Opens `path` as [`Storage::open`] does, namespace `nsid`, with `opts` for the controller of
    /// a ugds node or of each member of a striped volume (queues, interrupt mode, PRPs or SGLs,
    /// timeout). A remote target takes its options from its URI, and a file or block device has
    /// none: `opts` does not apply to them.
    pub fn open_with(path: impl AsRef<std::path::Path>, nsid: u32, opts: &DeviceOptions) -> Result<Arc<Storage>> {
        let path = crate::error::utf8_path(path.as_ref())?;
        match Target::resolve(path, path, nsid)?.open(path, nsid, opts)? {
            Some(st) => Ok(st),
            None => Self::open_fallback(path),
        }
    }

    /// Opens `path`, resolved as [`Target::File`] (or a kernel fabrics namespace we cannot reach
    /// ourselves), on the fallback path.
    pub(crate) fn open_fallback(path: &str) -> Result<Arc<Storage>> {
        if !std::path::Path::new(path).exists() {
            return Err(Error::Open {
                path: path.to_string(),
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            });
        }
        Self::open_file(path)
    }

    #[cfg(not(feature = "fallback"))]
    fn open_file(path: &str) -> Result<Arc<Storage>> {
        Err(Error::Unsupported {
            what: "files and block devices",
            why: format!(
                "{path} is {}, and this build of ugds has no fallback path",
                crate::device::describe_path(path)
            ),
            fix: "give a ugds node (/dev/ugds_drvN), or build the ugds crate with its `fallback` feature",
        })
    }

    #[cfg(feature = "fallback")]
    fn open_file(path: &str) -> Result<Arc<Storage>> {
        FileTarget::open(path, true)
            .map_err(|e| match e {
                Error::InvalidArgument { .. } => Error::NotUgdsNode {
                    path: path.to_string(),
                    what: crate::device::describe_path(path),
                    fix: "give a ugds node (/dev/ugds_drvN, direct path: `ugds bind /dev/nvmeX` \
                      gives a controller to ugds and prints its node), a striped volume \
                      (stripe:[CHUNK:]NODE,NODE,...), a regular file or a block device (fallback path)",
                },
                other => other,
            })
            .and_then(Self::file)
    }

    /// Which path I/O on this storage takes, and on what, in words.
    pub fn describe(&self) -> String {
        self.data_path().describe()
    }

    /// The striped volume that the descriptor file at `path` describes (any name; see
    /// [`VolumeSpec::read_descriptor`]), each member opened with `opts`. A file that is no
    /// descriptor is an error, never opened as a file.
    pub fn open_volume(path: impl AsRef<std::path::Path>, opts: &DeviceOptions) -> Result<Arc<Storage>> {
        Self::volume(&VolumeSpec::read_descriptor(path)?, opts)
    }

    /// A striped volume over the members of `spec`, each opened with `opts`.
    pub fn volume(spec: &VolumeSpec, opts: &DeviceOptions) -> Result<Arc<Storage>> {
        crate::fork::watch()?;
        Self::new(ConcretePath::Volume(VolumePath::open(spec, opts)?))
    }

    /// A namespace of an NVMe over Fabrics target, through our own NVMe/TCP or NVMe/RDMA
    /// initiator (the remote path).
    pub fn remote(spec: &crate::remote::RemoteSpec) -> Result<Arc<Storage>> {
        crate::fork::watch()?;
        Self::new(ConcretePath::Remote(crate::remote::RemotePath::open(spec)?))
    }

    /// Namespace `nsid` of an open device (the direct path).
    pub fn direct(dev: &Device, nsid: u32) -> Result<Arc<Storage>> {
        let ns = dev.namespace(nsid)?;
        Self::new(ConcretePath::Direct(DirectPath { ns, dev: dev.clone() }))
    }

    /// A striped volume over members already open (the cost benchmark's model).
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn over_volume(vol: VolumePath) -> Result<Arc<Storage>> {
        Self::new(ConcretePath::Volume(vol))
    }

    /// A file or block device (the fallback path).
    #[cfg(feature = "fallback")]
    pub fn file(f: FileTarget) -> Result<Arc<Storage>> {
        if !f.direct() {
            crate::data_path::note_fallback(
                f.path(),
                "buffered I/O",
                "the file system does not support O_DIRECT; I/O goes through the page cache",
            );
        }
        Self::new(ConcretePath::File(f))
    }

    fn new(path: ConcretePath) -> Result<Arc<Storage>> {
        let born = crate::fork::watch()?;
        Ok(Arc::new(Storage {
            path: ManuallyDrop::new(path),
            stats: PathStats::default(),
            engine: OnceLock::new(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            born,
        }))
    }

    /// [`Error::ForkedChild`] in a child forked after the storage was opened: the entry check
    /// of every call that would touch the target (one relaxed load).
    #[inline]
    pub(crate) fn alive(&self) -> Result<()> {
        self.born.check("storage")
    }

    /// True in a child forked after the storage was opened (what it holds is the parent's).
    #[cfg(feature = "fallback")]
    pub(crate) fn in_forked_child(&self) -> bool {
        self.born.in_child()
    }

    /// The path, for what every kind shares.
    #[inline]
    pub(crate) fn data_path(&self) -> &dyn DataPath {
        self.path.data_path()
    }

    /// The path by its concrete kind, for the layers above that use a kind's own API (batches,
    /// stream-ordered I/O on a file, owned queue pairs).
    pub(crate) fn concrete_path(&self) -> &ConcretePath {
        &self.path
    }

    /// Counts one finished I/O of `bytes` on `path`.
    pub(crate) fn count(&self, path: Path, bytes: u64) {
        self.count_many(path, 1, bytes)
    }

    /// Counts `ios` finished I/Os on `path` and `bytes` moved.
    pub(crate) fn count_many(&self, path: Path, ios: u64, bytes: u64) {
        let counter = match path {
            Path::DirectP2p => &self.stats.p2p,
            Path::DirectHost => &self.stats.host,
            Path::DirectStaged => &self.stats.staged,
            Path::Fallback => &self.stats.fallback,
            Path::Remote => &self.stats.remote,
            Path::RemoteStaged => &self.stats.remote_staged,
        };
        if ios > 0 {
            counter.fetch_add(ios, Ordering::Relaxed);
        }
        if bytes > 0 {
            self.stats.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// False only for a file opened without O_DIRECT (its file system has none): then I/O goes
    /// through the page cache.
    pub fn bypasses_page_cache(&self) -> bool {
        self.data_path().bypasses_page_cache()
    }

    /// True for the direct path.
    pub fn is_direct(&self) -> bool {
        self.data_path().is_direct()
    }

    /// True for the remote path (an NVMe over Fabrics namespace through our own initiator).
    pub fn is_remote(&self) -> bool {
        self.data_path().is_remote()
    }

    /// How its waits for completions wait: a ugds node's or a volume's first member's mode in
    /// effect; `None` where the kernel or a socket waits (files, remote targets).
    pub fn waiting(&self) -> Option<crate::Waiting> {
        let dev = match &*self.path {
            ConcretePath::Direct(d) => Some(&d.dev),
            ConcretePath::Volume(v) => v.members().first().map(|m| &m.dev),
            _ => None,
        };
        dev.map(Device::waiting)
    }

    /// The path's name in one word: `direct`, `remote` or `fallback`.
    pub fn path_name(&self) -> &'static str {
        if self.is_direct() {
            "direct"
        } else if self.is_remote() {
            "remote"
        } else {
            "fallback"
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> Result<u64> {
        self.alive()?;
        self.data_path().capacity()
    }

    /// Writes `data` at `off` exactly (any size and offset) through the page cache, on the
    /// fallback path; `None` on the direct path (a namespace has no byte-granular write).
    pub fn write_bytes(&self, data: &[u8], off: u64) -> Option<Result<()>> {
        if let Err(e) = self.alive() {
            return Some(Err(e));
        }
        self.data_path().write_bytes(data, off)
    }

    /// Offsets and lengths must be multiples of this.
    pub fn block_size(&self) -> u64 {
        self.data_path().block_size()
    }

    /// The largest entry a batch runs as one command on its own queue pair (larger entries
    /// still work, through the storage's worker threads).
    pub fn max_command_bytes(&self) -> u64 {
        self.data_path().max_command_bytes()
    }

    /// I/O counts per path.
    pub fn path_counts(&self) -> PathCounts {
        PathCounts {
            direct_p2p: self.stats.p2p.load(Ordering::Relaxed),
            direct_host: self.stats.host.load(Ordering::Relaxed),
            direct_staged: self.stats.staged.load(Ordering::Relaxed),
            fallback: self.stats.fallback.load(Ordering::Relaxed),
            remote: self.stats.remote.load(Ordering::Relaxed),
            remote_staged: self.stats.remote_staged.load(Ordering::Relaxed),
            bytes: self.stats.bytes.load(Ordering::Relaxed),
        }
    }

    /// The worker pool for batches and stream-ordered I/O (started on first use).
    pub(crate) fn engine(&self) -> Result<Arc<Engine>> {
        self.alive()?;
        if let Some(e) = self.engine.get() {
            return Ok(e.clone());
        }
        // Enough workers to keep a deep batch's I/O in flight on the fallback path (each worker
        // runs one request at a time): twice the cores, between 8 and 32.
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        let e = Engine::new((2 * cores).clamp(8, 32))?;
        Ok(self.engine.get_or_init(|| e).clone())
    }

    pub(crate) fn buffer(&self, mem: Mem, r: Registered) -> Buffer {
        Buffer::new(mem, r.regs, r.staging, r.path, self.id)
    }

    /// Allocates and registers `len` bytes of page-aligned host memory. A multiple of 2 MiB
    /// comes from the system's reserved huge pages while enough are free (physically
    /// contiguous: see [`Buffer::dma_segments`]), else from ordinary pages.
    pub fn alloc_host(&self, len: usize) -> Result<Buffer> {
        self.alive()?;
        if len == 0 {
            return Err(Error::invalid("len", "must be non-zero"));
        }
        let m = HostMemory::new(len.next_multiple_of(4096))?;
        let ptr = m.as_ptr();
        // SAFETY: the mapping is owned by the buffer, which drops the registration first.
        let r = unsafe { self.data_path().register_host(ptr, len) }?;
        Ok(self.buffer(Mem::Host { ptr, len, own: Some(m) }, r))
    }

    /// Registers caller-owned host memory (page-aligned address; any length).
    ///
    /// # Safety
    ///
    /// The memory must stay mapped while the buffer lives, and must not be accessed through
    /// Rust references while I/O into it runs. When an I/O fails in a way that may leave the
    /// device using the memory (a timeout or fault the controller reset could not confirm), the
    /// buffer keeps its lease for good (`inflight()` stays non-zero): the memory must then stay
    /// mapped, and unused, for the life of the process.
    pub unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> Result<Buffer> {
        if ptr.is_null() || !(ptr as usize).is_multiple_of(4096) {
            return Err(Error::invalid("ptr", "host memory must start on a 4096-byte page boundary"));
        }
        if len == 0 {
            return Err(Error::invalid("len", "must be non-zero"));
        }
        self.alive()?;
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.data_path().register_host(ptr, len) }?;
        Ok(self.buffer(Mem::Host { ptr, len, own: None }, r))
    }

    /// Registers GPU memory. On the direct path it is exported as a dma-buf and registered
    /// with the module (peer-to-peer); when that is impossible the error says why and what to
    /// do, unless `allow_staging` is set, in which case I/O is staged through registered host
    /// memory, still through the NVMe queues (and that choice is logged once).
    pub fn register_gpu(&self, mem: Arc<GpuMemory>, allow_staging: bool) -> Result<Buffer> {
        self.alive()?;
        let r = self.data_path().register_gpu(&mem, allow_staging)?;
        if r.path != Path::DirectP2p && !mem.stageable() {
            // No copy engine reaches another driver's dma-buf: peer-to-peer or nothing.
            return Err(Error::Unsupported {
                what: "another driver's dma-buf",
                why: format!("only the SSD reaches such memory, and this target's path is {}", r.path),
                fix: "open a ugds node (/dev/ugds_drvN) or a volume of them",
            });
        }
        if r.path != Path::DirectP2p {
            // Staged I/O: its staging chunks and copy queues exist before the first I/O (best
            // effort: the first I/O allocates them otherwise).
            let _ = mem.gpu().prewarm(2, 2);
        }
        Ok(self.buffer(Mem::Gpu(mem), r))
    }

    /// Registers the whole dma-buf behind `fd` that another driver exported (a device's memory
    /// BAR through vfio-pci, a GPU or accelerator stack's export): the SSD reads and writes it
    /// peer-to-peer, as it does registered GPU memory; the CPU has no access through the
    /// buffer. The descriptor is duplicated (the caller keeps and closes its own). Refused by
    /// name: [`Error::PeerToPeerRefused`] where the kernel allows no peer-to-peer DMA between
    /// the controller and the exporter's device (`ugds doctor` predicts it), and
    /// [`Error::Unsupported`] on a path without the SSD's queues (a file, a remote target).
    /// Should the exporter revoke it later, I/O on the buffer fails with [`Error::Revoked`].
    pub fn register_dmabuf(&self, fd: std::os::fd::BorrowedFd<'_>) -> Result<Buffer> {
        let mem = crate::gpu::dmabuf::memory(fd)?;
        self.register_gpu(mem, false)
    }

    /// The one check of an I/O request, before anything runs: the buffer belongs to this
    /// storage and holds the range, offsets and length are block multiples, the buffer offset
    /// suits the path, and the range fits the target.
    pub(crate) fn check(&self, buf: &Buffer, buf_offset: u64, file_offset: u64, len: u64) -> Result<()> {
        with_path!(&*self.path, p => self.check_on(p, buf, buf_offset, file_offset, len))
    }

    /// [`Storage::check`] against `path`, this storage's own path by its kind (static calls).
    #[inline(always)]
    fn check_on<P: DataPath>(&self, path: &P, buf: &Buffer, buf_offset: u64, file_offset: u64, len: u64) -> Result<()> {
        // Before anything else: in a forked child nothing of the parent's is touched.
        self.alive()?;
        buf.alive()?;
        if buf.storage_id() != self.id {
            return Err(Error::invalid("buf", "registered for another storage"));
        }
        buf.check(buf_offset, len)?;
        check_blocks(path.block_size(), file_offset, len)?;
        let a = path.buffer_alignment();
        if !buf_offset.is_multiple_of(a) {
            return Err(Error::invalid("buf_offset", format!("must be a multiple of {a} on this path")));
        }
        path.check_extent(file_offset, len)
    }

    /// The part of the request check that is about the target alone: the length is non-zero,
    /// offset and length are block multiples, and the range fits the target. A caller that
    /// moves one range in several I/Os (the CLI's 8 MiB chunks) checks the whole range with it
    /// first, so a bad range is refused before anything is written.
    pub fn check_range(&self, file_offset: u64, len: u64) -> Result<()> {
        check_blocks(self.block_size(), file_offset, len)?;
        self.data_path().check_extent(file_offset, len)
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

    /// Checks, leases and runs one I/O, and counts it. A failure whose data movement may still
    /// run keeps the buffer's lease (and so its memory and registrations) for good.
    pub(crate) fn rw(&self, write: bool, buf: &Buffer, buf_offset: u64, file_offset: u64, len: u64) -> Result<u64> {
        self.rw_in_flight(write, buf, buf_offset, file_offset, len).map_err(Failed::into_error)
    }

    /// [`Storage::rw`], handing a failure's [`crate::inflight::InFlight`] token to the caller
    /// (who adds what of its own the movement may still touch).
    pub(crate) fn rw_in_flight(
        &self,
        write: bool,
        buf: &Buffer,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> IoResult<u64> {
        // One match on the path's kind for the whole request: its checks and its I/O are
        // static calls.
        with_path!(&*self.path, p => {
            self.check_on(p, buf, buf_offset, file_offset, len)?;
            let n = p.rw(write, Lease::new(buf)?, buf_offset, file_offset, len)?;
            self.count(buf.path(), n);
            Ok(n)
        })
    }

    /// Flushes written data (NVMe Flush when the controller has a volatile write cache, or
    /// fdatasync).
    pub fn flush(&self) -> Result<()> {
        self.alive()?;
        self.data_path().flush()
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if self.born.in_child() && matches!(*self.path, ConcretePath::Remote(_)) {
            // A remote target's connections (keep-alive thread, sockets, RDMA queue pairs) are
            // the parent's: neither joined, shut down nor destroyed from a forked child. The
            // other paths drop safely there (their device state skips the parent's mappings and
            // registrations; descriptors are the child's own references).
            return;
        }
        // SAFETY: dropped once, here; `self` is going away.
        unsafe { ManuallyDrop::drop(&mut self.path) };
    }
}

/// A non-zero length; offset and length multiples of the block size `bs`.
#[inline(always)]
fn check_blocks(bs: u64, file_offset: u64, len: u64) -> Result<()> {
    if len != 0 && len.is_multiple_of(bs) && file_offset.is_multiple_of(bs) {
        return Ok(());
    }
    Err(blocks_error(bs, file_offset, len))
}

/// [`check_blocks`]'s error (never inlined: the check itself is, into every request's).
#[cold]
#[inline(never)]
fn blocks_error(bs: u64, file_offset: u64, len: u64) -> Error {
    if len == 0 {
        Error::invalid("len", "must be non-zero")
    } else if !len.is_multiple_of(bs) {
        Error::invalid("len", format!("{len} is not a multiple of the {bs}-byte block size"))
    } else {
        Error::invalid("file_offset", format!("{file_offset} is not a multiple of the {bs}-byte block size"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data_path::within_capacity;

    /// The request checks pass what is whole blocks inside the target and name what is not:
    /// their errors are built apart from the checks (cold), so each says which rule failed.
    #[test]
    fn a_request_check_names_the_rule_it_fails() {
        let why = |r: Result<()>| match r {
            Err(Error::InvalidArgument { arg, reason }) => format!("{arg}: {reason}"),
            other => format!("{other:?}"),
        };
        assert!(check_blocks(4096, 8192, 4096).is_ok());
        assert_eq!(why(check_blocks(4096, 0, 0)), "len: must be non-zero");
        assert_eq!(why(check_blocks(4096, 0, 512)), "len: 512 is not a multiple of the 4096-byte block size");
        assert_eq!(
            why(check_blocks(4096, 512, 4096)),
            "file_offset: 512 is not a multiple of the 4096-byte block size"
        );
        assert!(within_capacity(4096, 4096, 8192, "namespace").is_ok());
        assert_eq!(
            why(within_capacity(4096, 8192, 8192, "namespace")),
            "file_offset: [4096, +8192) runs past the namespace's 8192 bytes"
        );
        assert!(within_capacity(u64::MAX, 1, u64::MAX, "volume").is_err(), "an end past 2^64 is past any capacity");
    }
}

//! [`Buffer`]: the one kind of memory I/O moves through, on every path and from every face
//! (Rust, C, cuFile, Python). Host or GPU memory, registered for one [`crate::Storage`]; on the
//! direct path it holds the module's registration (or registered staging chunks).
//!
//! One lease word says who may touch the memory: I/O leases ([`Lease`]: the device, or the
//! kernel on the fallback path, may read or write it now; any number at once) and the CPU lease
//! (copies and [`HostView`]; exclusive). Taking either is one atomic step, so the CPU and the
//! device never use the memory at once, and the count of I/O leases is the only in-flight count
//! there is. A lease kept for good by an `InFlight` token (data movement that may still run after
//! its I/O gave up: see [`crate::in_flight_kept`]) keeps the memory and its registrations alive
//! for good.

use crate::device::Registration;
use crate::error::{Error, Result};
use crate::fork::Born;
use crate::gpu::GpuMemory;
use crate::mem::HostMemory;
use std::ops::Deref;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// The way an I/O's data moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// SSD ↔ GPU memory by peer-to-peer DMA (dma-buf).
    DirectP2p,
    /// SSD ↔ registered host memory by DMA, no system call.
    DirectHost,
    /// GPU memory staged through registered host memory, which the SSD reads or writes by DMA
    /// through the user-space queues (no system call; one extra copy).
    DirectStaged,
    /// Through the kernel (io_uring, O_DIRECT); GPU memory staged through host memory.
    Fallback,
    /// Host memory to and from an NVMe over Fabrics target through our own initiator (the
    /// remote path, NVMe/TCP or NVMe/RDMA), or GPU memory that the RDMA NIC reaches itself
    /// (registered by dma-buf).
    Remote,
    /// GPU memory staged through host memory on the remote path.
    RemoteStaged,
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Path::DirectP2p => "direct (peer-to-peer)",
            Path::DirectHost => "direct (host memory)",
            Path::DirectStaged => "direct (GPU memory staged through host memory)",
            Path::Fallback => "fallback (io_uring + staging)",
            Path::Remote => "remote (NVMe over Fabrics, memory the transport reaches)",
            Path::RemoteStaged => "remote (NVMe over Fabrics, GPU memory staged through host memory)",
        })
    }
}

/// The memory behind a buffer.
pub(crate) enum Mem {
    /// Host memory: owned (`own`) or the caller's (promised valid by `register_host`'s contract).
    Host { ptr: *mut u8, len: usize, own: Option<HostMemory> },
    /// GPU memory.
    Gpu(Arc<GpuMemory>),
}

/// Two registered host chunks GPU memory is staged through on the direct path.
#[derive(Debug)]
pub(crate) struct Staging {
    /// The module's registration of `mem`; declared first so it is deregistered before unmapping.
    pub(crate) reg: Registration,
    /// The chunks' memory.
    pub(crate) mem: HostMemory,
}

/// The bit of the lease word held by the CPU (the rest counts I/O leases).
const CPU: u32 = 1 << 31;

/// Memory registered for a [`crate::Storage`] (cuFile's registered buffer).
///
/// # Invariants
///
/// The memory in `mem` is valid for `len()` bytes while the buffer lives. It is read or written
/// only under a lease: the CPU's (exclusive, `CPU` bit) or I/O leases (counted), never both. A
/// buffer dropped while I/O leases are held (kept for good) leaks its memory and registration.
pub struct Buffer {
    // Declared before `mem`: fields drop in order, and the module must deregister the memory
    // before it is unmapped or freed.
    /// The module's registrations of the memory: one for a namespace, one per member for a
    /// volume (in member order); none on the fallback path.
    regs: Vec<Registration>,
    staging: Option<Mutex<Staging>>,
    mem: Mem,
    path: Path,
    storage: u64,
    lease: AtomicU32,
    /// The fork generation it was registered in.
    born: Born,
}

// SAFETY: the buffer's memory is touched only under its lease word (see the type's invariants):
// CPU access takes the exclusive CPU lease in one atomic step that fails while any I/O lease is
// held, so no Rust reference to the memory coexists with a device or kernel access, whichever
// thread holds the buffer. The raw pointer is never dereferenced otherwise. Registrations and
// GPU memory handles are plain ids and are `Send`.
unsafe impl Send for Buffer {}
// SAFETY: every `&self` method that touches memory takes a lease first (see `Send` above); the
// rest read immutable fields or atomics.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes, {})", self.len(), self.path)
    }
}

/// An I/O lease: while it lives, the device (or the kernel) may read or write the buffer's
/// memory and the CPU may not. Held by every I/O on every path (sync, batch, stream-ordered, C
/// ABI), borrowed (`Lease<&Buffer>`) or owning the buffer (`Lease<Arc<Buffer>>`).
pub(crate) struct Lease<B: Deref<Target = Buffer>>(B);

impl<B: Deref<Target = Buffer>> std::fmt::Debug for Lease<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lease({:?})", &*self.0)
    }
}

impl<B: Deref<Target = Buffer>> Lease<B> {
    /// Takes an I/O lease; refused while the CPU holds the buffer.
    pub(crate) fn new(buf: B) -> Result<Self> {
        let word = &buf.lease;
        let mut cur = word.load(Ordering::Acquire);
        loop {
            if cur & CPU != 0 {
                return Err(Error::RegistrationBusy { id: 0, inflight: 0 });
            }
            if cur + 1 == CPU {
                return Err(Error::invalid("buf", "too many I/Os in flight on one buffer"));
            }
            match word.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(Lease(buf)),
                Err(v) => cur = v,
            }
        }
    }

    /// The leased buffer.
    pub(crate) fn buffer(&self) -> &Buffer {
        &self.0
    }

    /// What holds the buffer (to take another lease on it).
    pub(crate) fn holder(&self) -> &B {
        &self.0
    }

    /// The device, the kernel or a copy engine may still access the memory after its I/O gave
    /// up: the lease is never released, so the buffer refuses CPU access and deregistration, and
    /// (owning or not) never frees the memory or unpins it. Called only by an `InFlight` token,
    /// the one way the crate says "still in flight".
    pub(crate) fn keep_forever(self) {
        // Leaking is the point: the count stays held, and a `Lease<Arc<Buffer>>` keeps the
        // buffer itself alive.
        std::mem::forget(self);
    }
}

impl<B: Deref<Target = Buffer>> Drop for Lease<B> {
    fn drop(&mut self) {
        self.0.lease.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The CPU's lease: exclusive, only while no I/O runs, and no I/O starts until it ends.
struct CpuLease<'a>(&'a Buffer);

impl<'a> CpuLease<'a> {
    fn new(b: &'a Buffer) -> Result<Self> {
        match b.lease.compare_exchange(0, CPU, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(CpuLease(b)),
            Err(cur) => Err(Error::RegistrationBusy { id: 0, inflight: cur & !CPU }),
        }
    }
}

impl Drop for CpuLease<'_> {
    fn drop(&mut self) {
        self.0.lease.fetch_sub(CPU, Ordering::AcqRel);
    }
}

/// The CPU's view of a host buffer's bytes (read and write); no I/O on the buffer starts while
/// it lives.
pub struct HostView<'a> {
    _lease: CpuLease<'a>,
    bytes: &'a mut [u8],
}

impl std::ops::Deref for HostView<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl std::ops::DerefMut for HostView<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.bytes
    }
}

impl Buffer {
    /// A buffer over `mem` with what registering it produced, for the storage `storage`.
    pub(crate) fn new(mem: Mem, regs: Vec<Registration>, staging: Option<Staging>, path: Path, storage: u64) -> Buffer {
        Buffer {
            mem,
            regs,
            staging: staging.map(Mutex::new),
            path,
            storage,
            lease: AtomicU32::new(0),
            born: Born::now(),
        }
    }

    /// [`Error::ForkedChild`] in a child forked after the buffer was registered: its
    /// registration pins the parent's pages, and memory the library allocated for it is not
    /// inherited (`MADV_DONTFORK`).
    #[inline]
    pub(crate) fn alive(&self) -> Result<()> {
        self.born.check("buffer")
    }

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
        self.lease.load(Ordering::Acquire) & !CPU
    }

    /// The GPU memory, when it is GPU memory.
    pub fn gpu_memory(&self) -> Option<&Arc<GpuMemory>> {
        match &self.mem {
            Mem::Gpu(g) => Some(g),
            Mem::Host { .. } => None,
        }
    }

    /// The host address, when it is host memory (to hand to C; dereferencing it is the
    /// caller's business).
    pub fn host_ptr(&self) -> Option<*mut u8> {
        match &self.mem {
            Mem::Host { ptr, .. } => Some(*ptr),
            Mem::Gpu(_) => None,
        }
    }

    /// How many contiguous bus ranges the device sees the buffer in, on the direct path (a
    /// volume's first member); `None` on other paths. Fewer is cheaper per command: a command
    /// inside one range takes a single SGL data block. Memory from huge pages (a multiple of
    /// 2 MiB from [`crate::Storage::alloc_host`] where the system has them free) is one range
    /// per huge page at most; ordinary pages may be one range each.
    pub fn dma_segments(&self) -> Option<usize> {
        self.registration().map(|r| r.segment_count())
    }

    /// The memory.
    pub(crate) fn mem(&self) -> &Mem {
        &self.mem
    }

    /// The module's registration, on the direct path (a volume's first member's).
    pub(crate) fn registration(&self) -> Option<&Registration> {
        self.regs.first()
    }

    /// The registration on member `i` of a volume (member 0 of a namespace).
    pub(crate) fn registration_on(&self, i: usize) -> Option<&Registration> {
        self.regs.get(i)
    }

    /// The registered staging chunks, for GPU memory staged on the direct path.
    pub(crate) fn staging(&self) -> Option<&Mutex<Staging>> {
        self.staging.as_ref()
    }

    /// The storage it was registered for.
    pub(crate) fn storage_id(&self) -> u64 {
        self.storage
    }

    /// Checks `[offset, offset + len)` against the buffer.
    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.len() as u64) {
            return Err(Error::invalid(
                "buf_offset",
                format!("[{offset}, +{len}) runs past the {}-byte buffer", self.len()),
            ));
        }
        Ok(())
    }

    /// The CPU's view of a host buffer; refused while I/O on it runs, and for GPU memory.
    pub fn host_view(&self) -> Result<HostView<'_>> {
        self.alive()?;
        let Mem::Host { ptr, len, .. } = &self.mem else {
            return Err(Error::invalid("buf", "GPU memory has no host view; use copy_out"));
        };
        let lease = CpuLease::new(self)?;
        // SAFETY: the memory is valid for `len` bytes (type invariant), and the exclusive CPU
        // lease, held by the view for the slice's lifetime, keeps every other access out.
        let bytes = unsafe { std::slice::from_raw_parts_mut(*ptr, *len) };
        Ok(HostView { _lease: lease, bytes })
    }

    /// Copies `src` into the buffer at `offset` (refused while I/O on it is running).
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.alive()?;
        let _cpu = CpuLease::new(self)?;
        self.check(offset as u64, src.len() as u64)?;
        match &self.mem {
            // SAFETY: the range is inside the memory (checked); the CPU lease excludes I/O.
            Mem::Host { ptr, .. } => unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.add(offset), src.len()) },
            Mem::Gpu(g) => g.gpu().upload(g, offset, src)?,
        }
        Ok(())
    }

    /// Copies the buffer at `offset` into `dst` (refused while I/O on it is running).
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.alive()?;
        let _cpu = CpuLease::new(self)?;
        self.check(offset as u64, dst.len() as u64)?;
        match &self.mem {
            // SAFETY: the range is inside the memory (checked); the CPU lease excludes I/O.
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
        match self.inflight() {
            0 => Ok(()),
            n => Err(Box::new((self, Error::RegistrationBusy { id: 0, inflight: n }))),
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.inflight() > 0 || self.born.in_child() {
            // A lease was kept for good: the SSD may still access this memory. Keep it pinned
            // (registration) and mapped (memory) for the life of the process.
            // In a forked child: the registrations are the parent's (deregistering would unpin
            // its pages), memory the library allocated is not mapped here (MADV_DONTFORK), and
            // GPU memory belongs to the parent's runtime. Leak the bookkeeping there too.
            std::mem::forget(std::mem::take(&mut self.regs));
            std::mem::forget(self.staging.take());
            match &mut self.mem {
                Mem::Host { own, .. } => std::mem::forget(own.take()),
                // An extra reference that is never dropped: the GPU memory is never freed.
                Mem::Gpu(g) => std::mem::forget(g.clone()),
            }
        }
        // Otherwise the fields drop in order: the registration before the memory it names.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(len: usize) -> Buffer {
        let m = HostMemory::new(len).unwrap();
        let ptr = m.as_ptr();
        Buffer::new(Mem::Host { ptr, len, own: Some(m) }, Vec::new(), None, Path::Fallback, 0)
    }

    /// The CPU and the device exclude each other in one atomic step (two threads sharing an
    /// `Arc<Buffer>` used to race: `copy_in` checked for I/O and then copied).
    #[test]
    fn cpu_copies_and_io_exclude_each_other() {
        let buf = host(8192);
        let io = Lease::new(&buf).unwrap();
        assert!(matches!(buf.copy_in(0, &[1; 16]), Err(Error::RegistrationBusy { inflight: 1, .. })));
        assert!(buf.copy_out(0, &mut [0u8; 16]).is_err());
        assert!(buf.host_view().is_err());
        drop(io);
        let mut view = buf.host_view().unwrap();
        view[0] = 7;
        assert!(matches!(Lease::new(&buf), Err(Error::RegistrationBusy { .. })));
        assert!(buf.copy_in(0, &[1]).is_err(), "one CPU lease at a time");
        assert_eq!(buf.inflight(), 0, "the CPU lease is not an I/O");
        drop(view);
        let mut one = [0u8; 1];
        buf.copy_out(0, &mut one).unwrap();
        assert_eq!(one[0], 7);
        let (a, b) = (Lease::new(&buf).unwrap(), Lease::new(&buf).unwrap());
        assert_eq!(buf.inflight(), 2, "I/O leases share");
        drop((a, b));
        assert_eq!(buf.inflight(), 0);
    }

    /// A lease kept for good by a token keeps the buffer busy: no CPU access, no
    /// deregistration.
    #[test]
    fn a_kept_lease_is_never_released() {
        use crate::inflight::{InFlight, Why};
        let buf = Arc::new(host(4096));
        InFlight::new(Why::Command).holding(Lease::new(buf.clone()).unwrap()).keep();
        assert_eq!(buf.inflight(), 1);
        assert!(buf.copy_in(0, &[1]).is_err());
        assert_eq!(Arc::strong_count(&buf), 2, "the kept lease holds the buffer");
        let b2 = host(4096);
        let mut t = InFlight::new(Why::Command);
        t.keep_lease(Lease::new(&b2).unwrap());
        t.keep();
        let (b2, e) = *b2.deregister().unwrap_err();
        assert!(matches!(e, Error::RegistrationBusy { inflight: 1, .. }));
        drop(b2); // leaks its mapping instead of unmapping memory the SSD may write
    }
}

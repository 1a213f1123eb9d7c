//! The portable layer in the VM: [`ugds::Storage`] on the direct path (host memory, and "GPU"
//! memory of the CPU runtime exported as a real dma-buf and registered peer-to-peer), the
//! staged fallback when export is impossible, the fallback path on the kernel's block device,
//! dma-heap buffers (a test runtime whose memory is the system heap's), portable batches and stream-ordered I/O on a CPU stream. Data is checked
//! through the kernel nvme driver.

use crate::kmod::bound_node;
use crate::raw::Mapping;
use crate::{direct_read, direct_write, driver_of, ensure_that, nvme_controllers, xtask, Test};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ugds::batch::{IoStatus, Op};
use ugds::gpu::{CopyQueue, Gpu, Runtime, Vendor};
use ugds::{
    pattern, AsyncArgs, AsyncParams, CpuStream, Device, Error, IoRequest, Path, Storage, StorageBatch, Stream, StreamIo,
};

const V: &str = "portable";

/// The portable-layer tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "portable_direct_host_and_p2p_buffers", variant: V, run: direct_paths },
        Test { name: "portable_gpu_export_refused_error_or_staged_fallback", variant: V, run: export_refused },
        Test { name: "portable_fallback_on_kernel_block_device", variant: V, run: block_device_fallback },
        Test { name: "portable_dma_heap_buffer_io", variant: V, run: dma_heap },
        Test { name: "portable_batch_on_direct_path", variant: V, run: batch_direct },
        Test { name: "portable_stream_100_late_bound_ops_in_order", variant: V, run: stream_ops },
        Test { name: "capi_c_suite_on_the_direct_path", variant: V, run: c_suite },
        Test { name: "capi_cufile_unaligned_io_on_the_direct_path", variant: V, run: cufile_direct },
    ]
}

/// 128 MiB with 4 KiB blocks; 64 MiB with 512-byte blocks.
pub const NVME: &[&str] = &["size=128M,lbs=4096", "size=64M,lbs=512"];

fn unbind(idx: usize) -> Result<String> {
    let addr = nvme_controllers()?[idx].clone();
    if driver_of(&addr).as_deref() != Some("nvme") {
        let (ok, out) = xtask(&["unbind", &addr])?;
        ensure_that!(ok, "unbind {addr}: {out}");
    }
    // The kernel names the block device after it probes; wait for it.
    crate::namespace_block_device(&addr)
}

fn pat(seed: u64, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    pattern::fill(seed, off, &mut v);
    v
}

fn direct_paths() -> Result<()> {
    let blk = unbind(0)?;
    direct_write(&blk, 0, &pat(1, 0, 8 << 20))?;
    let dev = Device::open(&bound_node(0)?)?;
    let st = Storage::direct(&dev, 1)?;
    let gpu = Gpu::cpu();
    let gbuf = st.register_gpu(Arc::new(gpu.alloc(4 << 20)?), false)?;
    ensure_that!(gbuf.path() == Path::DirectP2p, "GPU memory took {}", gbuf.path());
    ensure_that!(st.read(&gbuf, 0, 1 << 20, 4 << 20)? == 4 << 20, "short read");
    let mut out = vec![0u8; 4 << 20];
    gbuf.copy_out(0, &mut out)?;
    ensure_that!(pattern::first_mismatch(1, 1 << 20, &out).is_none(), "dma-buf read differs");
    let host = st.alloc_host(4 << 20)?;
    ensure_that!(host.path() == Path::DirectHost, "host memory took {}", host.path());
    host.copy_in(0, &pat(2, 16 << 20, 4 << 20))?;
    st.write(&host, 0, 16 << 20, 4 << 20)?;
    gbuf.copy_in(0, &pat(3, 24 << 20, 4 << 20))?;
    st.write(&gbuf, 0, 24 << 20, 4 << 20)?;
    let c = st.path_counts();
    ensure_that!(c.direct_p2p == 2 && c.direct_host == 1 && c.direct_staged == 0 && c.fallback == 0, "{c:?}");
    println!("    paths: {c:?}");
    drop((gbuf, host, st, dev));
    let blk = unbind(0)?;
    ensure_that!(direct_read(&blk, 16 << 20, 4 << 20)? == pat(2, 16 << 20, 4 << 20), "host-memory write differs");
    ensure_that!(direct_read(&blk, 24 << 20, 4 << 20)? == pat(3, 24 << 20, 4 << 20), "dma-buf write differs");
    Ok(())
}

/// The CPU runtime, except that dma-buf export is refused (as with NVIDIA's proprietary
/// driver).
#[derive(Debug)]
struct NoExport(ugds::gpu::cpu::Cpu);

impl Runtime for NoExport {
    fn vendor(&self) -> Vendor {
        self.0.vendor()
    }
    fn device_name(&self) -> String {
        "CPU stand-in without dma-buf".into()
    }
    fn alloc(&self, len: usize) -> ugds::Result<u64> {
        self.0.alloc(len)
    }
    fn free(&self, ptr: u64, len: usize) {
        self.0.free(ptr, len)
    }
    fn is_device_memory(&self, ptr: u64) -> bool {
        self.0.is_device_memory(ptr)
    }
    fn alloc_pinned(&self, len: usize) -> ugds::Result<*mut u8> {
        self.0.alloc_pinned(len)
    }
    fn free_pinned(&self, ptr: *mut u8, len: usize) {
        self.0.free_pinned(ptr, len)
    }
    fn copy_queue(&self) -> ugds::Result<Box<dyn CopyQueue>> {
        self.0.copy_queue()
    }
    fn export_dmabuf(&self, _ptr: u64, _len: usize) -> ugds::Result<OwnedFd> {
        Err(Error::Unsupported {
            what: "dma-buf export",
            why: self.dmabuf_support().unwrap_err(),
            fix: "use a driver that exports dma-bufs, or allow the fallback path",
        })
    }
    fn dmabuf_support(&self) -> std::result::Result<(), String> {
        Err("this test runtime never exports".into())
    }
    fn new_stream(&self) -> ugds::Result<Arc<dyn Stream>> {
        self.0.new_stream()
    }
}

fn export_refused() -> Result<()> {
    let dev = Device::open(&bound_node(0)?)?;
    let st = Storage::direct(&dev, 1)?;
    let gpu = Gpu::with_runtime(Arc::new(NoExport(Default::default())));
    let mem = Arc::new(gpu.alloc(6 << 20)?);
    match st.register_gpu(mem.clone(), false) {
        Err(e @ Error::Unsupported { .. }) => {
            let s = e.to_string();
            ensure_that!(s.contains("never exports") && s.contains("allow the fallback"), "unhelpful error: {s}");
        }
        other => anyhow::bail!("expected Unsupported, got {other:?}"),
    }
    let buf = st.register_gpu(mem, true)?;
    ensure_that!(buf.path() == Path::DirectStaged, "took {}", buf.path());
    // 6 MiB: three staging chunks each way.
    buf.copy_in(0, &pat(4, 40 << 20, 6 << 20))?;
    st.write(&buf, 0, 40 << 20, 6 << 20)?;
    let mut zero = vec![0u8; 6 << 20];
    buf.copy_in(0, &zero)?;
    st.read(&buf, 0, 40 << 20, 6 << 20)?;
    buf.copy_out(0, &mut zero)?;
    ensure_that!(pattern::first_mismatch(4, 40 << 20, &zero).is_none(), "staged round trip differs");
    let c = st.path_counts();
    ensure_that!(c.direct_staged == 2 && c.direct_p2p == 0 && c.direct_host == 0 && c.fallback == 0, "{c:?}");
    drop((buf, st, dev));
    let blk = unbind(0)?;
    ensure_that!(direct_read(&blk, 40 << 20, 6 << 20)? == pat(4, 40 << 20, 6 << 20), "staged write differs on disk");
    Ok(())
}

fn block_device_fallback() -> Result<()> {
    let blk = unbind(1)?;
    let st = Storage::open(&blk)?;
    ensure_that!(!st.is_direct() && st.block_size() == 512, "block size {}", st.block_size());
    ensure_that!(st.capacity()? == 64 << 20, "capacity {}", st.capacity()?);
    let gpu = Gpu::cpu();
    let g = st.register_gpu(Arc::new(gpu.alloc(5 << 20)?), false)?;
    let h = st.alloc_host(1 << 20)?;
    g.copy_in(0, &pat(5, 3 << 20, 5 << 20))?;
    st.write(&g, 0, 3 << 20, 5 << 20)?;
    h.copy_in(0, &pat(6, 512, 1 << 20))?;
    // A 512-byte aligned offset on a 512-byte-block device, from an unaligned buffer offset
    // (bounced).
    st.write(&h, 0, 512, (1 << 20) - 512)?;
    ensure_that!(
        direct_read(&blk, 3 << 20, 5 << 20)? == pat(5, 3 << 20, 5 << 20),
        "staged write through the kernel differs"
    );
    let back = direct_read(&blk, 0, 1 << 20)?;
    ensure_that!(back[512..] == pat(6, 512, 1 << 20)[..(1 << 20) - 512], "host write differs");
    st.read(&h, 512, 3 << 20, (1 << 20) - 512)?;
    let mut out = vec![0u8; (1 << 20) - 512];
    h.copy_out(512, &mut out)?;
    ensure_that!(pattern::first_mismatch(5, 3 << 20, &out).is_none(), "bounced read differs");
    match st.read(&h, 0, 100, 512) {
        Err(Error::InvalidArgument { arg: "file_offset", .. }) => {}
        other => anyhow::bail!("unaligned offset: {other:?}"),
    }
    ensure_that!(st.path_counts().fallback == 3, "{:?}", st.path_counts());
    // A batch on the block device: every entry on the batch's own io_uring, host and GPU memory
    // (staged through its slots), reads and writes, some host entries bounced.
    let (g, h) = (Arc::new(g), Arc::new(h));
    let mut b = StorageBatch::new(&st, 32)?;
    let reqs: Vec<IoRequest> = (0..32u64)
        .map(|i| {
            let buf = if i % 2 == 0 { g.clone() } else { h.clone() };
            let op = if i % 4 < 2 { Op::Write } else { Op::Read };
            let skew = if i % 8 == 1 { 512 } else { 0 };
            IoRequest {
                op,
                buf,
                buf_offset: i * 16384 + skew,
                file_offset: (16 << 20) + i * 16384,
                len: 8192,
                cookie: i,
            }
        })
        .collect();
    for r in reqs.iter().filter(|r| r.op == Op::Write) {
        r.buf.copy_in(r.buf_offset as usize, &pat(7, r.file_offset, 8192))?;
    }
    b.submit(&reqs)?;
    let mut events = Vec::new();
    while events.len() < 32 {
        events.extend(b.status(32 - events.len(), Duration::from_secs(20))?);
    }
    ensure_that!(events.iter().all(|e| e.status == IoStatus::Complete && e.bytes == 8192), "{events:?}");
    ensure_that!(b.ring_entries() == 32, "{} of 32 entries on the batch's ring", b.ring_entries());
    for r in &reqs {
        let mut out = vec![0u8; 8192];
        r.buf.copy_out(r.buf_offset as usize, &mut out)?;
        if r.op == Op::Read {
            // Bytes 16 MiB on were never written by this test: what the kernel reads there.
            ensure_that!(out == direct_read(&blk, r.file_offset, 8192)?, "batch read {} differs", r.cookie);
        } else {
            ensure_that!(out == pat(7, r.file_offset, 8192), "batch write {} source changed", r.cookie);
            ensure_that!(direct_read(&blk, r.file_offset, 8192)? == out, "batch write {} differs on disk", r.cookie);
        }
    }
    ensure_that!(st.path_counts().fallback == 35, "{:?}", st.path_counts());
    Ok(())
}

/// `struct dma_heap_allocation_data` and `DMA_HEAP_IOCTL_ALLOC`.
#[repr(C)]
struct HeapAlloc {
    len: u64,
    fd: u32,
    fd_flags: u32,
    heap_flags: u64,
}
const DMA_HEAP_IOCTL_ALLOC: libc::c_ulong = 0xC018_4800;
/// `DMA_BUF_IOCTL_SYNC` and its flags: CPU access to a dma-buf is bracketed by these.
const DMA_BUF_IOCTL_SYNC: libc::c_ulong = 0x4008_6200;
const SYNC_RW_START: u64 = 3;
const SYNC_RW_END: u64 = 3 | 4;
const DMA_HEAP: &str = "/dev/dma_heap/system";

/// Live allocations of [`DmaHeap`]: address → (the heap's dma-buf, its CPU mapping, length).
type HeapAllocs = Arc<Mutex<BTreeMap<u64, (OwnedFd, Mapping, usize)>>>;

/// The allocation holding `[ptr, ptr + len)`: its base address and dma-buf fd.
fn heap_alloc_of(allocs: &HeapAllocs, ptr: u64, len: usize) -> ugds::Result<(u64, i32)> {
    let a = allocs.lock().unwrap_or_else(|e| e.into_inner());
    match a.range(..=ptr).next_back() {
        Some((&base, (fd, _, alen))) if ptr + len as u64 <= base + *alen as u64 => Ok((base, fd.as_raw_fd())),
        _ => Err(Error::invalid("ptr", "not dma-heap memory of this runtime")),
    }
}

/// A runtime whose "device memory" is system dma-heap buffers mapped for the CPU: registering
/// it exports the heap's own dma-buf, so the module attaches a dma-heap buffer through the
/// library's public API. CPU copies are bracketed by `DMA_BUF_IOCTL_SYNC`.
#[derive(Debug, Default)]
struct DmaHeap {
    allocs: HeapAllocs,
    /// Pinned memory and streams.
    cpu: ugds::gpu::cpu::Cpu,
}

fn os_error(op: &str) -> Error {
    Error::Io { op: op.to_string(), source: std::io::Error::last_os_error() }
}

impl Runtime for DmaHeap {
    fn vendor(&self) -> Vendor {
        Vendor::Cpu
    }
    fn device_name(&self) -> String {
        "system dma-heap".into()
    }
    fn alloc(&self, len: usize) -> ugds::Result<u64> {
        let len = len.next_multiple_of(4096);
        let heap = std::fs::File::open(DMA_HEAP).map_err(|e| Error::Io { op: DMA_HEAP.into(), source: e })?;
        let mut a =
            HeapAlloc { len: len as u64, fd: 0, fd_flags: (libc::O_RDWR | libc::O_CLOEXEC) as u32, heap_flags: 0 };
        // SAFETY: DMA_HEAP_IOCTL_ALLOC reads and writes a `dma_heap_allocation_data`, which `a` is.
        if unsafe { libc::ioctl(heap.as_raw_fd(), DMA_HEAP_IOCTL_ALLOC, &mut a) } != 0 {
            return Err(os_error("DMA_HEAP_IOCTL_ALLOC"));
        }
        // SAFETY: the ioctl returned a new fd that we own.
        let fd = unsafe { OwnedFd::from_raw_fd(a.fd as i32) };
        let map = Mapping::new(fd.as_raw_fd(), 0, len, libc::PROT_READ | libc::PROT_WRITE)
            .map_err(|e| Error::Io { op: "mmap of a dma-heap buffer".into(), source: e })?;
        let addr = map.addr();
        self.allocs.lock().unwrap_or_else(|e| e.into_inner()).insert(addr, (fd, map, len));
        Ok(addr)
    }
    fn free(&self, ptr: u64, _len: usize) {
        // Unmaps it (the buffer registered from it was dropped first) and closes the dma-buf.
        self.allocs.lock().unwrap_or_else(|e| e.into_inner()).remove(&ptr);
    }
    fn is_device_memory(&self, ptr: u64) -> bool {
        heap_alloc_of(&self.allocs, ptr, 0).is_ok()
    }
    fn alloc_pinned(&self, len: usize) -> ugds::Result<*mut u8> {
        self.cpu.alloc_pinned(len)
    }
    fn free_pinned(&self, ptr: *mut u8, len: usize) {
        self.cpu.free_pinned(ptr, len)
    }
    fn copy_queue(&self) -> ugds::Result<Box<dyn CopyQueue>> {
        Ok(Box::new(SyncedCopies(self.allocs.clone())))
    }
    fn export_dmabuf(&self, ptr: u64, len: usize) -> ugds::Result<OwnedFd> {
        match self.allocs.lock().unwrap_or_else(|e| e.into_inner()).get(&ptr) {
            Some((fd, _, alen)) if len <= *alen => {
                fd.try_clone().map_err(|e| Error::Io { op: "dup of a dma-heap buffer".into(), source: e })
            }
            _ => Err(Error::invalid("ptr", "only whole dma-heap buffers are exported")),
        }
    }
    fn dmabuf_support(&self) -> std::result::Result<(), String> {
        match std::path::Path::new(DMA_HEAP).exists() {
            true => Ok(()),
            false => Err(format!("{DMA_HEAP} is missing")),
        }
    }
    fn new_stream(&self) -> ugds::Result<Arc<dyn Stream>> {
        self.cpu.new_stream()
    }
}

/// Copies between host memory and dma-heap buffers: memcpy between the two CPU syncs that
/// bracket CPU access to a dma-buf.
#[derive(Debug)]
struct SyncedCopies(HeapAllocs);

impl SyncedCopies {
    fn synced(&self, dev: u64, len: usize, copy: impl FnOnce()) -> ugds::Result<()> {
        let (_, fd) = heap_alloc_of(&self.0, dev, len)?;
        let (mut start, mut end) = (SYNC_RW_START, SYNC_RW_END);
        // SAFETY: DMA_BUF_IOCTL_SYNC reads a u64, which `start` is.
        if unsafe { libc::ioctl(fd, DMA_BUF_IOCTL_SYNC, &mut start) } != 0 {
            return Err(os_error("DMA_BUF_IOCTL_SYNC start"));
        }
        copy();
        // SAFETY: as above, `end` is a u64.
        if unsafe { libc::ioctl(fd, DMA_BUF_IOCTL_SYNC, &mut end) } != 0 {
            return Err(os_error("DMA_BUF_IOCTL_SYNC end"));
        }
        Ok(())
    }
}

impl CopyQueue for SyncedCopies {
    unsafe fn to_device(&mut self, dst: u64, src: *const u8, len: usize) -> ugds::Result<()> {
        // SAFETY: the caller guarantees `src` for `len` bytes and that `dst` is device memory of
        // this runtime, which is mapped host memory (checked against the allocations first).
        self.synced(dst, len, || unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, len) })
    }
    unsafe fn to_host(&mut self, dst: *mut u8, src: u64, len: usize) -> ugds::Result<()> {
        // SAFETY: as in `to_device`, the other way round.
        self.synced(src, len, || unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, len) })
    }
    fn wait(&mut self) -> ugds::Result<()> {
        Ok(())
    }
}

/// A system dma-heap buffer (not a udmabuf: another exporter) registered peer-to-peer through
/// `Storage::register_gpu`; the SSD writes it and reads it by DMA, and the CPU sees the data
/// through the heap's own mapping (bracketed by dma-buf syncs). Checked through the kernel.
fn dma_heap() -> Result<()> {
    let len = 1usize << 20;
    ensure_that!(std::path::Path::new(DMA_HEAP).exists(), "{DMA_HEAP} is missing");
    let blk = unbind(0)?;
    direct_write(&blk, 60 << 20, &pat(8, 60 << 20, len))?;
    let dev = Device::open(&bound_node(0)?)?;
    let st = Storage::direct(&dev, 1)?;
    let gpu = Gpu::with_runtime(Arc::new(DmaHeap::default()));
    let buf = st.register_gpu(Arc::new(gpu.alloc(len)?), false)?;
    ensure_that!(buf.path() == Path::DirectP2p, "the dma-heap buffer took {}", buf.path());
    buf.copy_in(0, &pat(7, 50 << 20, len))?;
    st.write(&buf, 0, 50 << 20, len as u64)?;
    st.read(&buf, 0, 60 << 20, len as u64)?;
    let mut back = vec![0u8; len];
    buf.copy_out(0, &mut back)?;
    let ok = pattern::first_mismatch(8, 60 << 20, &back).is_none();
    let c = st.path_counts();
    ensure_that!(c.direct_p2p == 2 && c.direct_staged == 0 && c.fallback == 0, "{c:?}");
    drop((buf, st, dev, gpu));
    let blk = unbind(0)?;
    ensure_that!(direct_read(&blk, 50 << 20, len)? == pat(7, 50 << 20, len), "dma-heap -> disk differs");
    ensure_that!(ok, "disk -> dma-heap differs (seen from the CPU mapping)");
    Ok(())
}

fn batch_direct() -> Result<()> {
    let blk = unbind(0)?;
    direct_write(&blk, 0, &pat(9, 0, 4 << 20))?;
    let dev = Device::open(&bound_node(0)?)?;
    let st = Storage::direct(&dev, 1)?;
    let buf = Arc::new(st.alloc_host(128 * 4096)?);
    let mut b = StorageBatch::new(&st, 128)?;
    ensure_that!(b.is_native(), "the direct path's batch should use its own queue pair");
    let mut reqs: Vec<_> = (0..128u64)
        .map(|i| IoRequest {
            op: Op::Read,
            buf: buf.clone(),
            buf_offset: i * 4096,
            file_offset: (i * 97 % 1024) * 4096,
            len: 4096,
            cookie: i,
        })
        .collect();
    reqs[77].file_offset = 1 << 40;
    b.submit(&reqs)?;
    let mut ev = Vec::new();
    while ev.len() < 128 {
        ev.extend(b.status(128, Duration::from_secs(30))?);
    }
    let mut out = vec![0u8; 128 * 4096];
    buf.copy_out(0, &mut out)?;
    for e in &ev {
        let r = &reqs[e.cookie as usize];
        if e.cookie == 77 {
            ensure_that!(e.status == IoStatus::Failed || e.status == IoStatus::Invalid, "{e:?}");
            continue;
        }
        ensure_that!(e.status == IoStatus::Complete, "{e:?}");
        let got = &out[r.buf_offset as usize..][..4096];
        ensure_that!(pattern::first_mismatch(9, r.file_offset, got).is_none(), "entry {}", e.cookie);
    }
    ensure_that!(st.path_counts().direct_host == 127, "{:?}", st.path_counts());
    Ok(())
}

/// 100 stream-ordered ops on the direct path: writes of data made by the stream work before
/// them, then reads back, with arguments bound when the stream gets there; one invalid.
fn stream_ops() -> Result<()> {
    let dev = Device::open(&bound_node(0)?)?;
    let st = Storage::direct(&dev, 1)?;
    let gpu = Gpu::cpu();
    let mem = Arc::new(gpu.alloc(50 * 8192)?);
    let base = mem.device_ptr() as usize;
    let buf = Arc::new(st.register_gpu(mem, false)?);
    ensure_that!(buf.path() == Path::DirectP2p, "took {}", buf.path());
    let stream = CpuStream::new()?;
    let sio = StreamIo::new(stream.clone())?;
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut args = Vec::new();
    for i in 0..100usize {
        let slot = i % 50;
        let (write, seed) = (i < 50, 1000 + slot as u64);
        let a = AsyncArgs::new(0, -1, -1);
        let a2 = a.clone();
        let bad = i == 63;
        stream.launch(move || {
            let at = base + slot * 8192;
            // SAFETY: the CPU runtime's device memory is host memory; no I/O on this slot is
            // running at this point of the stream.
            let m = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, 8192) };
            if write {
                pattern::fill(seed, 0, m);
            } else {
                m.fill(0);
            }
            a2.set(if bad { 4000 } else { 8192 }, (70 << 20) + slot as i64 * 8192, slot as i64 * 8192);
        })?;
        if write {
            sio.write_async(&st, &buf, &a)?;
        } else {
            sio.read_async(&st, &buf, &a)?;
        }
        let (a3, l) = (a.clone(), log.clone());
        stream.launch(move || {
            // SAFETY: as above; the stream waited for the op.
            let m = unsafe { std::slice::from_raw_parts((base + slot * 8192) as *const u8, 8192) };
            let ok = pattern::first_mismatch(seed, 0, m).is_none();
            if let Ok(mut l) = l.lock() {
                l.push((i, a3.result(), ok));
            }
        })?;
        args.push(a);
    }
    sio.synchronize()?;
    let log = log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    ensure_that!(log.len() == 100, "{} ops reported", log.len());
    for (k, &(i, r, ok)) in log.iter().enumerate() {
        ensure_that!(i == k, "stream order broken at {k}: {i}");
        if i == 63 {
            ensure_that!(r == -(libc::EINVAL as i64), "invalid size reported as {r}");
        } else {
            ensure_that!(r == 8192 && (i < 50 || ok), "op {i}: result {r}, data ok {ok}");
        }
    }
    ensure_that!(st.path_counts().direct_p2p == 99, "{:?}", st.path_counts());
    Ok(())
}

/// Runs the C ABI suite binary `bin` on `target`; fails unless every check passed.
pub fn run_c_suite(bin: &str, target: &str) -> Result<()> {
    let out = std::process::Command::new(bin).arg(target).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or("").to_string();
    for l in text.lines().filter(|l| l.starts_with("not ok")) {
        println!("    {l}");
    }
    println!("    {last}");
    ensure_that!(
        out.status.success() && last.contains("failed=0"),
        "C suite on {target}: {last} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The C ABI suite (gcc against the installed header and library) on /dev/ugds_drvN; its reads
/// check data the kernel driver wrote, and its writes are checked through the kernel after.
fn c_suite() -> Result<()> {
    let bin = std::env::var("UGDS_C_SUITE").context("UGDS_C_SUITE is not set (run through cargo xtask test)")?;
    let blk = unbind(0)?;
    direct_write(&blk, 16 << 20, &pat(0x16, 16 << 20, 1 << 20))?;
    direct_write(&blk, 8 << 20, &vec![0u8; 2 << 20])?;
    run_c_suite(&bin, &bound_node(0)?)?;
    let blk = unbind(0)?;
    ensure_that!(
        direct_read(&blk, 8 << 20, 2 << 20)? == pat(0x8, 8 << 20, 2 << 20),
        "uGDSWrite's data differs on disk"
    );
    Ok(())
}

/// A handle on `target` (a ugds node or a volume descriptor) keeps its descriptor's access mode,
/// on both C faces, as a file's handle does: a write through an `O_RDONLY` descriptor and a read
/// through an `O_WRONLY` one are refused (`UGDS_INVALID_FILE_OPEN_FLAG`) and move no data, and
/// each descriptor's own direction works (the first block read, then written back unchanged).
pub(crate) fn handles_keep_access_mode(target: &str) -> Result<()> {
    use ugds::capi::{uGDSOpError::UGDS_INVALID_FILE_OPEN_FLAG, Face, Library};
    let ro = std::fs::File::open(target)?;
    let wo = std::fs::OpenOptions::new().write(true).open(target)?;
    let junk = vec![0xa5u8; 4096];
    let mut block = vec![0u8; 4096];
    for face in [Face::CuFile, Face::Ugds] {
        let lib: &'static Library = Box::leak(Box::new(Library::new(face)));
        lib.driver_open().map_err(|e| anyhow::anyhow!("{face:?}: open: {e:?}"))?;
        let register = |f: &std::fs::File| {
            lib.handle_register(f.as_raw_fd()).map_err(|e| anyhow::anyhow!("{face:?}: register {target}: {e:?}"))
        };
        let (r, w) = (register(&ro)?, register(&wo)?);
        // SAFETY: `junk` holds 4096 bytes; a refused write reads none of them.
        let refused = unsafe { lib.rw(true, r, junk.as_ptr() as usize, 4096, 0, 0) };
        ensure_that!(
            refused.as_ref().is_err_and(|e| e.code() == UGDS_INVALID_FILE_OPEN_FLAG),
            "{face:?}: a write through O_RDONLY on {target}: {refused:?}"
        );
        // SAFETY: `block` holds 4096 bytes.
        let refused = unsafe { lib.rw(false, w, block.as_mut_ptr() as usize, 4096, 0, 0) };
        ensure_that!(
            refused.as_ref().is_err_and(|e| e.code() == UGDS_INVALID_FILE_OPEN_FLAG),
            "{face:?}: a read through O_WRONLY on {target}: {refused:?}"
        );
        if face == Face::CuFile {
            // cuFile stages any host memory: the allowed directions move data.
            // SAFETY: `block` holds 4096 bytes.
            let n = unsafe { lib.rw(false, r, block.as_mut_ptr() as usize, 4096, 0, 0) };
            ensure_that!(n.as_ref().is_ok_and(|n| *n == 4096), "read through O_RDONLY on {target}: {n:?}");
            ensure_that!(block != junk, "{target}: the refused write reached the device");
            // SAFETY: `block` holds 4096 bytes.
            let n = unsafe { lib.rw(true, w, block.as_ptr() as usize, 4096, 0, 0) };
            ensure_that!(n.as_ref().is_ok_and(|n| *n == 4096), "write through O_WRONLY on {target}: {n:?}");
        }
        for h in [r, w] {
            lib.handle_deregister(h, -1).map_err(|e| anyhow::anyhow!("{face:?}: deregister: {e:?}"))?;
        }
    }
    Ok(())
}

/// The cuFile face on a ugds node (both block sizes): unaligned reads, and unaligned writes
/// that read-modify-write their edge blocks on the namespace, from unaligned memory and from
/// concurrent threads sharing blocks; the kernel driver then reads exactly the model's bytes.
fn cufile_direct() -> Result<()> {
    use ugds::capi::{Face, Library};
    for idx in 0..2 {
        let blk = unbind(idx)?;
        let init = pat(0x21, 0, 1 << 20);
        direct_write(&blk, 0, &init)?;
        let node = bound_node(idx)?;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&node)?;
        let lib: &'static Library = Box::leak(Box::new(Library::new(Face::CuFile)));
        let h = lib.handle_register(f.as_raw_fd()).map_err(|e| anyhow::anyhow!("register {node}: {e:?}"))?;
        ensure_that!(lib.handle(h).is_some_and(|x| x.storage.is_direct()), "{node}: not the direct path");
        let mut model = init.clone();
        // Unaligned writes from unaligned memory, then concurrent writers sharing blocks.
        for (i, (off, len)) in
            [(7usize, 100usize), (4095, 2), (4096 * 3 + 11, 70_001), (511, 513)].into_iter().enumerate()
        {
            let mem: Vec<u8> = (0..len + 3).map(|k| (k as u8).wrapping_mul(13) ^ i as u8).collect();
            // SAFETY: `mem` holds len + 3 bytes.
            let n = unsafe { lib.rw(true, h, mem.as_ptr() as usize + 3, len, off as i64, 0) };
            ensure_that!(n.as_ref().is_ok_and(|n| *n == len), "write {len} at {off}: {n:?}");
            model[off..off + len].copy_from_slice(&mem[3..]);
        }
        let part = 3001usize;
        std::thread::scope(|sc| {
            for t in 0..8usize {
                let model_part: Vec<u8> = (0..part).map(|k| (t * 7 + k) as u8 | 0x80).collect();
                sc.spawn(move || {
                    for _ in 0..10 {
                        // SAFETY: `model_part` holds `part` bytes.
                        let _ = unsafe {
                            lib.rw(true, h, model_part.as_ptr() as usize, part, (200_000 + t * part) as i64, 0)
                        };
                    }
                });
            }
        });
        for t in 0..8usize {
            let d: Vec<u8> = (0..part).map(|k| (t * 7 + k) as u8 | 0x80).collect();
            model[200_000 + t * part..200_000 + (t + 1) * part].copy_from_slice(&d);
        }
        // An unaligned read through the library sees the model.
        let mut back = vec![0u8; 300_001];
        // SAFETY: `back` holds 300_001 bytes.
        let n = unsafe { lib.rw(false, h, back.as_mut_ptr() as usize, 300_001, 5, 0) };
        ensure_that!(n.as_ref().is_ok_and(|n| *n == 300_001), "unaligned read: {n:?}");
        ensure_that!(back[..] == model[5..300_006], "{node}: an unaligned read differs from the model");
        lib.handle_deregister(h, -1).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        handles_keep_access_mode(&node)?;
        drop(f);
        let blk = unbind(idx)?;
        ensure_that!(direct_read(&blk, 0, 1 << 20)? == model, "{blk}: the kernel reads other bytes than the model");
    }
    Ok(())
}

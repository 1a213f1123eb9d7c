//! A runtime whose device memory is host memory: memfd-backed, so that its dma-buf export is a
//! real one (udmabuf) and registration takes the same path as GPU memory. Copies are memcpy.

use super::stream::{CpuStream, Stream};
use super::{CopyQueue, Runtime, Vendor};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// The CPU stand-in runtime.
#[derive(Debug, Default)]
pub struct Cpu {
    /// Live allocations: address → (memfd, mapped length).
    allocs: Mutex<BTreeMap<u64, (OwnedFd, usize)>>,
}

fn os(op: &str) -> Error {
    Error::Io { op: op.to_string(), source: std::io::Error::last_os_error() }
}

fn map_anonymous(len: usize) -> Result<*mut u8> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os("mmap"));
    }
    Ok(p as *mut u8)
}

/// `struct udmabuf_create` from <linux/udmabuf.h>.
#[repr(C)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}

/// `_IOW('u', 0x42, struct udmabuf_create)`.
const UDMABUF_CREATE: libc::c_ulong = 0x4018_7542;
const UDMABUF_FLAGS_CLOEXEC: u32 = 1;

impl Runtime for Cpu {
    fn vendor(&self) -> Vendor {
        Vendor::Cpu
    }

    fn device_name(&self) -> String {
        "host memory (CPU stand-in)".into()
    }

    fn alloc(&self, len: usize) -> Result<u64> {
        let len = len.next_multiple_of(4096);
        // SAFETY: plain syscall with a static name.
        let fd = unsafe { libc::memfd_create(c"ugds-cpu-gpu".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(os("memfd_create"));
        }
        // SAFETY: fd is a new descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: resizing our own memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as i64) } != 0 {
            return Err(os("ftruncate memfd"));
        }
        // SAFETY: a new shared mapping of our memfd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os("mmap memfd"));
        }
        self.allocs.lock().unwrap_or_else(|e| e.into_inner()).insert(p as u64, (fd, len));
        Ok(p as u64)
    }

    fn free(&self, ptr: u64, _len: usize) {
        if let Some((_fd, len)) = self.allocs.lock().unwrap_or_else(|e| e.into_inner()).remove(&ptr) {
            // SAFETY: unmapping a mapping made by `alloc`, which is no longer referenced.
            unsafe { libc::munmap(ptr as *mut libc::c_void, len) };
        }
    }

    fn is_device_memory(&self, ptr: u64) -> bool {
        let allocs = self.allocs.lock().unwrap_or_else(|e| e.into_inner());
        allocs.range(..=ptr).next_back().is_some_and(|(&base, (_, len))| ptr < base + *len as u64)
    }

    fn alloc_pinned(&self, len: usize) -> Result<*mut u8> {
        map_anonymous(len.next_multiple_of(4096))
    }

    fn free_pinned(&self, ptr: *mut u8, len: usize) {
        // SAFETY: unmapping a mapping made by `alloc_pinned` with the same rounded length.
        unsafe { libc::munmap(ptr as *mut libc::c_void, len.next_multiple_of(4096)) };
    }

    fn copy_queue(&self) -> Result<Box<dyn CopyQueue>> {
        Ok(Box::new(MemcpyQueue))
    }

    fn export_dmabuf(&self, ptr: u64, len: usize) -> Result<OwnedFd> {
        let allocs = self.allocs.lock().unwrap_or_else(|e| e.into_inner());
        let Some((&base, (fd, alen))) = allocs.range(..=ptr).next_back() else {
            return Err(Error::invalid("ptr", "not device memory of this runtime"));
        };
        let off = ptr - base;
        if !off.is_multiple_of(4096) || !len.is_multiple_of(4096) || off + len as u64 > *alen as u64 {
            return Err(Error::invalid("ptr", "the range must be page aligned and inside one allocation"));
        }
        // udmabuf requires the memfd to be sealed against shrinking.
        // SAFETY: fcntl on our own memfd.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } != 0 {
            return Err(os("sealing the memfd"));
        }
        let dev = std::fs::File::open("/dev/udmabuf").map_err(|e| Error::Unsupported {
            what: "dma-buf export of CPU stand-in memory",
            why: format!("/dev/udmabuf: {e}"),
            fix: "load the udmabuf module (CONFIG_UDMABUF)",
        })?;
        let mut c =
            UdmabufCreate { memfd: fd.as_raw_fd() as u32, flags: UDMABUF_FLAGS_CLOEXEC, offset: off, size: len as u64 };
        // SAFETY: UDMABUF_CREATE reads a `struct udmabuf_create`, which `c` is.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), UDMABUF_CREATE, &mut c) };
        if r < 0 {
            return Err(os("UDMABUF_CREATE"));
        }
        // SAFETY: the ioctl returned a new dma-buf fd that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(r) })
    }

    fn dmabuf_support(&self) -> std::result::Result<(), String> {
        if std::path::Path::new("/dev/udmabuf").exists() {
            Ok(())
        } else {
            Err("/dev/udmabuf is missing".into())
        }
    }

    fn new_stream(&self) -> Result<Arc<dyn Stream>> {
        Ok(CpuStream::new()?)
    }
}

impl Drop for Cpu {
    fn drop(&mut self) {
        for (p, (_fd, len)) in std::mem::take(&mut *self.allocs.lock().unwrap_or_else(|e| e.into_inner())) {
            // SAFETY: unmapping allocations nobody can use any more (the runtime is gone).
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
        }
    }
}

/// Copies complete at once.
#[derive(Debug)]
struct MemcpyQueue;

impl CopyQueue for MemcpyQueue {
    unsafe fn to_device(&mut self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: the caller guarantees both ranges (device memory is host memory here).
        unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, len) };
        Ok(())
    }

    unsafe fn to_host(&mut self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, len) };
        Ok(())
    }

    fn wait(&mut self) -> Result<()> {
        Ok(())
    }

    fn signal(&mut self, word: &super::stream::CompletionWord, value: u32) -> Result<bool> {
        // Every copy is done when it is started.
        word.store(value);
        Ok(true)
    }
}

/// The CPU stand-in with copy queues that can be made to fail, for tests: while
/// [`FaultState::failing`] is set, a queue's `wait` and `poll` fail (its copies count as perhaps
/// still running); while [`FaultState::no_pinned`] is set, there is no pinned memory to give.
/// Every copy is recorded as (queue number, host address).
#[cfg(all(test, feature = "fallback"))]
#[derive(Debug, Default)]
pub(crate) struct Faulty {
    cpu: Cpu,
    /// What the test sets and reads.
    pub(crate) state: Arc<FaultState>,
}

/// The switches and the record of a [`Faulty`] runtime.
#[cfg(all(test, feature = "fallback"))]
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    /// Copy queues fail their `wait` and `poll`.
    pub(crate) failing: std::sync::atomic::AtomicBool,
    /// `alloc_pinned` fails.
    pub(crate) no_pinned: std::sync::atomic::AtomicBool,
    /// Every copy started: (queue number, host address).
    pub(crate) copies: Mutex<Vec<(usize, usize)>>,
    queues: std::sync::atomic::AtomicUsize,
}

#[cfg(all(test, feature = "fallback"))]
impl Faulty {
    /// A runtime whose queues fail (`failing`) or that has no pinned memory (`no_pinned`).
    pub(crate) fn new(failing: bool, no_pinned: bool) -> Faulty {
        let f = Faulty::default();
        f.state.failing.store(failing, std::sync::atomic::Ordering::Relaxed);
        f.state.no_pinned.store(no_pinned, std::sync::atomic::Ordering::Relaxed);
        f
    }
}

#[cfg(all(test, feature = "fallback"))]
#[derive(Debug)]
struct FaultyQueue {
    n: usize,
    state: Arc<FaultState>,
}

#[cfg(all(test, feature = "fallback"))]
impl FaultyQueue {
    fn record(&self, host: *const u8) {
        self.state.copies.lock().unwrap_or_else(|e| e.into_inner()).push((self.n, host as usize));
    }

    fn check(&self, op: &'static str) -> Result<()> {
        if self.state.failing.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Gpu { op, reason: "broken on purpose".into() });
        }
        Ok(())
    }
}

#[cfg(all(test, feature = "fallback"))]
impl CopyQueue for FaultyQueue {
    unsafe fn to_device(&mut self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        self.record(src);
        // SAFETY: forwarded from the caller.
        unsafe { MemcpyQueue.to_device(dst, src, len) }
    }

    unsafe fn to_host(&mut self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        self.record(dst);
        // SAFETY: forwarded from the caller.
        unsafe { MemcpyQueue.to_host(dst, src, len) }
    }

    fn wait(&mut self) -> Result<()> {
        self.check("wait")
    }

    fn poll(&mut self) -> Result<bool> {
        self.check("poll").map(|()| true)
    }
}

#[cfg(all(test, feature = "fallback"))]
impl Runtime for Faulty {
    fn vendor(&self) -> Vendor {
        Vendor::Cpu
    }
    fn device_name(&self) -> String {
        "CPU stand-in with failing copies".into()
    }
    fn alloc(&self, len: usize) -> Result<u64> {
        self.cpu.alloc(len)
    }
    fn free(&self, ptr: u64, len: usize) {
        self.cpu.free(ptr, len)
    }
    fn is_device_memory(&self, ptr: u64) -> bool {
        self.cpu.is_device_memory(ptr)
    }
    fn alloc_pinned(&self, len: usize) -> Result<*mut u8> {
        if self.state.no_pinned.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Gpu { op: "alloc_pinned", reason: "none on purpose".into() });
        }
        self.cpu.alloc_pinned(len)
    }
    fn free_pinned(&self, ptr: *mut u8, len: usize) {
        self.cpu.free_pinned(ptr, len)
    }
    fn copy_queue(&self) -> Result<Box<dyn CopyQueue>> {
        let n = self.state.queues.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Box::new(FaultyQueue { n, state: self.state.clone() }))
    }
    fn export_dmabuf(&self, ptr: u64, len: usize) -> Result<OwnedFd> {
        self.cpu.export_dmabuf(ptr, len)
    }
    fn dmabuf_support(&self) -> std::result::Result<(), String> {
        self.cpu.dmabuf_support()
    }
    fn new_stream(&self) -> Result<Arc<dyn Stream>> {
        self.cpu.new_stream()
    }
}

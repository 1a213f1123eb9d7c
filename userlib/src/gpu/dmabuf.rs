//! Device memory another driver exported as a dma-buf (a device's memory BAR through vfio-pci,
//! a GPU stack's export, an accelerator's): registered whole, reached only by the SSD, peer to
//! peer. The CPU and copy engines have no way in (no mapping is asked of the exporter), so
//! there is no staging: where the kernel refuses peer-to-peer, registration fails by name.

use super::stream::{CpuStream, Stream};
use super::{CopyQueue, Gpu, GpuMemory, Runtime, Vendor};
use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// A dma-buf, held open for as long as memory of it is registered, and the address range it is
/// known by: reserved address space of its size (`PROT_NONE`: nothing can dereference it), so
/// the key is unique in the process, as a GPU allocation's device address is (the C ABI finds
/// buffers by address).
///
/// # Invariants
///
/// `[base, base + len)` is an inaccessible mapping of this process, unmapped on drop.
#[derive(Debug)]
struct ExportedMemory {
    fd: OwnedFd,
    base: u64,
    len: usize,
}

impl Drop for ExportedMemory {
    fn drop(&mut self) {
        // SAFETY: our own reservation (invariant), unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

fn no_cpu_access(what: &'static str) -> Error {
    Error::Unsupported {
        what,
        why: "the memory is a dma-buf another driver exported; only the SSD reaches it, peer to peer".into(),
        fix: "move its data with reads and writes of the registered buffer",
    }
}

impl Runtime for ExportedMemory {
    fn vendor(&self) -> Vendor {
        Vendor::Dmabuf
    }

    fn device_name(&self) -> String {
        format!("a {}-byte dma-buf of another driver", self.len)
    }

    fn alloc(&self, _len: usize) -> Result<u64> {
        Err(no_cpu_access("allocating more of an exported dma-buf"))
    }

    fn free(&self, _ptr: u64, _len: usize) {}

    fn is_device_memory(&self, ptr: u64) -> bool {
        (self.base..self.base + self.len as u64).contains(&ptr)
    }

    fn alloc_pinned(&self, _len: usize) -> Result<*mut u8> {
        Err(no_cpu_access("staging an exported dma-buf"))
    }

    fn free_pinned(&self, _ptr: *mut u8, _len: usize) {}

    fn copy_queue(&self) -> Result<Box<dyn CopyQueue>> {
        Err(no_cpu_access("copying to or from an exported dma-buf"))
    }

    fn export_dmabuf(&self, ptr: u64, len: usize) -> Result<OwnedFd> {
        if ptr != self.base || len != self.len {
            return Err(Error::invalid("ptr", "an exported dma-buf is registered whole"));
        }
        self.fd.try_clone().map_err(|source| Error::Io { op: "dup of the dma-buf".into(), source })
    }

    fn dmabuf_support(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn new_stream(&self) -> Result<Arc<dyn Stream>> {
        // Ordered by the host: the work on such a buffer is I/O alone.
        Ok(CpuStream::new()?)
    }
}

/// The whole dma-buf behind `fd` as device memory (the fd is duplicated: the caller keeps its own).
pub fn memory(fd: BorrowedFd<'_>) -> Result<Arc<GpuMemory>> {
    // A dma-buf's size is where seeking to its end lands.
    // SAFETY: a plain system call on a descriptor the caller lends.
    let end = unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_END) };
    if end <= 0 {
        return Err(Error::invalid("fd", "not a dma-buf (its size cannot be read by seeking to its end)"));
    }
    // CAST: a positive file size.
    let len = end as usize;
    let fd = fd.try_clone_to_owned().map_err(|source| Error::Io { op: "dup of the dma-buf".into(), source })?;
    // SAFETY: a fresh anonymous reservation; nothing is mapped over.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::Io {
            op: "reserving an address range for the dma-buf".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    let base = p as u64;
    // INVARIANT: `[base, +len)` was just reserved, inaccessible.
    let gpu = Gpu::with_runtime(Arc::new(ExportedMemory { fd, base, len }));
    // SAFETY: `[base, +len)` stands for the whole dma-buf, which the runtime keeps open (its
    // `fd`) for as long as the `Gpu`, and so the memory and any buffer registered from it, lives.
    Ok(Arc::new(unsafe { gpu.borrow(base, len) }?))
}

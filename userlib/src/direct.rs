//! The direct path as a [`DataPath`]: a namespace of a controller bound to ugds. Host memory
//! and dma-buf-exportable GPU memory are registered with the module and the SSD DMAs into them
//! through the user-space queues; GPU memory that cannot be exported is staged through
//! registered host chunks, still through the queues.

use crate::buffer::{Buffer, Lease, Mem, Path, Staging};
use crate::data_path::{within_capacity, DataPath, Registered};
use crate::device::{Device, Namespace, Registration};
use crate::error::{Error, Result};
use crate::gpu::{GpuMemory, STAGING_CHUNK};
use crate::inflight::{settle, IoResult};
use crate::mem::HostMemory;
use crate::staging_pipeline::staged;
use std::sync::Arc;

/// A namespace of an open device.
#[derive(Debug)]
pub(crate) struct DirectPath {
    pub(crate) ns: Namespace,
    pub(crate) dev: Device,
}

impl DirectPath {
    /// Stages GPU memory through the buffer's registered chunks: the copies and the SSD use
    /// each chunk in turn (`staged` orders them), under the staging lock.
    #[allow(clippy::too_many_arguments)]
    fn rw_staged(
        &self,
        run: &mut impl FnMut(bool, &Registration, u64, u64, u64) -> IoResult<()>,
        write: bool,
        buf: &Buffer,
        g: &GpuMemory,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> IoResult<u64> {
        let Some(stage) = buf.staging() else {
            return Err(Error::invalid("buf", "not registered for this path").into());
        };
        let stage = stage.lock().unwrap_or_else(|e| e.into_inner());
        let base = stage.mem.as_ptr() as u64;
        let chunks = [base as *mut u8, (base + STAGING_CHUNK as u64) as *mut u8];
        let dev_ptr = g.device_ptr() + buf_offset;
        let r = staged(g.gpu(), write, dev_ptr, len as usize, Some(chunks), |p, n, at| {
            run(write, &stage.reg, p as u64 - base, file_offset + at, n as u64).map(|()| n)
        });
        r.map(|n| n as u64)
    }

    /// Moves `len` bytes between the leased buffer and the namespace with `run` (a namespace's
    /// shared queues, or a queue pair the caller owns), staging GPU memory that has no
    /// registration of its own. When the commands or copies may outlive the call, the failure's
    /// token keeps the lease for good (and with it the buffer's registrations and staging chunks).
    pub(crate) fn rw_with(
        &self,
        run: &mut impl FnMut(bool, &Registration, u64, u64, u64) -> IoResult<()>,
        write: bool,
        lease: Lease<&Buffer>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> IoResult<u64> {
        let buf = lease.buffer();
        let r = match (buf.registration(), buf.mem()) {
            (Some(reg), _) => run(write, reg, buf_offset, file_offset, len).map(|()| len),
            (None, Mem::Gpu(g)) => self.rw_staged(run, write, buf, g, buf_offset, file_offset, len),
            (None, Mem::Host { .. }) => Err(Error::invalid("buf", "not registered for this path").into()),
        };
        settle(r, lease)
    }
}

impl DataPath for DirectPath {
    fn describe(&self) -> String {
        format!(
            "direct path (user-space NVMe queues): namespace {} of {} (serial {}), {} bytes in {}-byte blocks",
            self.ns.id(),
            self.dev.model(),
            self.dev.serial(),
            self.ns.capacity(),
            self.ns.block_size()
        )
    }

    fn capacity(&self) -> Result<u64> {
        Ok(self.ns.capacity())
    }

    fn block_size(&self) -> u64 {
        self.ns.block_size()
    }

    fn buffer_alignment(&self) -> u64 {
        4
    }

    #[inline(always)]
    fn check_extent(&self, file_offset: u64, len: u64) -> Result<()> {
        within_capacity(file_offset, len, self.ns.capacity(), "namespace")
    }

    fn is_direct(&self) -> bool {
        true
    }

    fn bypasses_page_cache(&self) -> bool {
        true
    }

    unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> Result<Registered> {
        // The module pins whole pages.
        // SAFETY: forwarded from the caller; the pages past `len` up to the page end belong to
        // the same mapping (mappings are page-granular).
        let reg = unsafe { self.dev.register_host(ptr, len.next_multiple_of(4096)) }?;
        Ok(Registered { regs: vec![reg], staging: None, path: Path::DirectHost })
    }

    fn register_gpu(&self, mem: &Arc<GpuMemory>, allow_staging: bool) -> Result<Registered> {
        let direct = mem.export_dmabuf().and_then(|fd| {
            use std::os::fd::AsRawFd;
            self.dev.register_dmabuf(fd.as_raw_fd(), 0, mem.len().next_multiple_of(4096) as u64)
        });
        match direct {
            Ok(reg) => Ok(Registered { regs: vec![reg], staging: None, path: Path::DirectP2p }),
            // Its own error where the memory cannot be staged (another driver's dma-buf).
            Err(e) if allow_staging && mem.stageable() => {
                crate::data_path::note_fallback(
                    &format!("GPU memory on {}", mem.gpu().runtime().device_name()),
                    "staged through registered host memory, still through the NVMe queues",
                    &e.to_string(),
                );
                let chunks = HostMemory::new(2 * STAGING_CHUNK)?;
                // SAFETY: `chunks` is owned by the `Staging` that owns the registration too and
                // is dropped after it (field order); nothing references its bytes.
                let reg = unsafe { self.dev.register_host(chunks.as_ptr(), chunks.len()) }?;
                Ok(Registered {
                    regs: Vec::new(),
                    staging: Some(Staging { reg, mem: chunks }),
                    path: Path::DirectStaged,
                })
            }
            Err(e) => Err(e),
        }
    }

    fn rw(&self, write: bool, lease: Lease<&Buffer>, buf_offset: u64, file_offset: u64, len: u64) -> IoResult<u64> {
        self.rw_with(&mut |w, reg, ro, d, l| self.ns.rw(w, reg, ro, d, l), write, lease, buf_offset, file_offset, len)
    }

    fn flush(&self) -> Result<()> {
        self.ns.flush()
    }

    fn write_bytes(&self, _data: &[u8], _off: u64) -> Option<Result<()>> {
        None
    }

    fn max_command_bytes(&self) -> u64 {
        self.ns.max_command_bytes()
    }
}

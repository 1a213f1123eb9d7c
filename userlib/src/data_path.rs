//! The one seam between the storage API and where data goes: a [`DataPath`] moves data to a
//! namespace of a controller bound to ugds (user-space NVMe queues), a volume of them, a remote
//! namespace, or a file or block device owned by the kernel (the fallback path).
//! [`crate::Storage`] holds one, by its concrete kind (the only place that names the kinds), and
//! does everything they share (the request check, leases, counting) once, above it.

use crate::buffer::{Buffer, Lease, Path, Staging};
use crate::device::Registration;
use crate::error::Result;
use crate::gpu::GpuMemory;
use crate::inflight::IoResult;
use std::sync::{Arc, Mutex};

/// Checks that `[file_offset, file_offset + len)` lies inside `cap` bytes of `what` (a
/// namespace, a volume): the extent check of the paths whose capacity is fixed. Inlined into
/// every request's check; its error, built once in a while, is not.
#[inline(always)]
pub(crate) fn within_capacity(file_offset: u64, len: u64, cap: u64, what: &str) -> Result<()> {
    if file_offset.checked_add(len).is_some_and(|e| e <= cap) {
        return Ok(());
    }
    Err(past_capacity(file_offset, len, cap, what))
}

/// [`within_capacity`]'s error.
#[cold]
#[inline(never)]
fn past_capacity(file_offset: u64, len: u64, cap: u64, what: &str) -> crate::error::Error {
    crate::error::Error::invalid("file_offset", format!("[{file_offset}, +{len}) runs past the {what}'s {cap} bytes"))
}

/// What registering memory on a path produced.
#[derive(Debug)]
pub(crate) struct Registered {
    /// The module's registrations of the memory itself (direct path: one per member
    /// controller's namespace, in member order).
    pub(crate) regs: Vec<Registration>,
    /// Registered host chunks GPU memory is staged through (direct path without dma-buf).
    pub(crate) staging: Option<Staging>,
    /// The path I/O on the memory takes.
    pub(crate) path: Path,
}

/// A place data goes. Implementations trust that [`crate::Storage`] checked the request
/// (buffer range, block alignment, capacity: one check, in one place) and hold a [`Lease`] on
/// the buffer for as long as the device may use its memory.
pub(crate) trait DataPath: std::fmt::Debug + Send + Sync {
    /// Which path, on what, in words.
    fn describe(&self) -> String;
    /// Capacity in bytes.
    fn capacity(&self) -> Result<u64>;
    /// Offsets and lengths must be multiples of this.
    fn block_size(&self) -> u64;
    /// Alignment a buffer offset needs (PRP entries are dword aligned; 1 when any works).
    fn buffer_alignment(&self) -> u64;
    /// Checks `[file_offset, file_offset + len)` against what the target holds or can hold
    /// (alignment to [`DataPath::block_size`] was checked by the storage).
    fn check_extent(&self, file_offset: u64, len: u64) -> Result<()>;
    /// True for the direct path.
    fn is_direct(&self) -> bool;
    /// True for the remote path (NVMe over Fabrics through our own initiator).
    fn is_remote(&self) -> bool {
        false
    }
    /// False only for a file without O_DIRECT (its I/O goes through the page cache).
    fn bypasses_page_cache(&self) -> bool;
    /// Registers host memory `[ptr, ptr + len)` for I/O on this path.
    ///
    /// # Safety
    ///
    /// The memory must stay mapped while what is returned lives, and nothing may hold Rust
    /// references to it while I/O into it runs.
    unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> Result<Registered>;
    /// Registers GPU memory for I/O on this path; `allow_staging`: when peer-to-peer DMA is
    /// impossible, stage through host memory instead of failing.
    fn register_gpu(&self, mem: &Arc<GpuMemory>, allow_staging: bool) -> Result<Registered>;
    /// Moves `len` bytes between the leased buffer at `buf_offset` and `file_offset`; returns
    /// the bytes moved (fewer only at the end of a file). Consumes the lease: when data movement
    /// may outlive the call (a timeout the controller reset could not confirm, a ring given up
    /// with requests in it, a copy queue that cannot say it is done), the failure carries an
    /// [`crate::inflight::InFlight`] token that keeps the lease, so the memory stays pinned.
    fn rw(&self, write: bool, lease: Lease<&Buffer>, buf_offset: u64, file_offset: u64, len: u64) -> IoResult<u64>;
    /// Flushes written data.
    fn flush(&self) -> Result<()>;
    /// Writes `data` at `off` exactly, any size and offset, where the path has byte-granular
    /// writes (a file through the page cache); `None` elsewhere.
    fn write_bytes(&self, data: &[u8], off: u64) -> Option<Result<()>>;
    /// The largest entry a queue batch of this path carries as one command.
    fn max_command_bytes(&self) -> u64;
}

/// Logs why a slower path was chosen: once per distinct reason per process, as a warning of
/// target `ugds` through `log`, the library's one way to tell (see [`crate::logging`]: the
/// program's logger decides where it goes; the CLI, libugds.so and the cuFile drop-in write it
/// on stderr, the Python package hands it to `logging`).
pub(crate) fn note_fallback(what: &str, how: &str, why: &str) {
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let line = format!("{what}: using {how}: {why}");
    {
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&line) {
            return;
        }
        seen.push(line.clone());
    }
    // Outside the lock: a logger may take other locks (the Python interpreter's).
    log::warn!(target: "ugds", "{line}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_fallback_note_is_one_warning_through_log_per_reason() {
        // The sink may be in place already (the C face installs it on first use).
        crate::logging::log_to_stderr(log::LevelFilter::Warn);
        for _ in 0..3 {
            super::note_fallback("/tmp/note-test", "buffered I/O", "no O_DIRECT here");
        }
        super::note_fallback("/tmp/note-test", "buffered I/O", "another reason");
        let lines = crate::logging::tests::written("/tmp/note-test");
        assert_eq!(
            lines,
            [
                "ugds: /tmp/note-test: using buffered I/O: no O_DIRECT here",
                "ugds: /tmp/note-test: using buffered I/O: another reason"
            ]
        );
    }
}

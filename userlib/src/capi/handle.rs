//! [`Handle`]: a registered file or device of a C face, and how a caller's descriptor becomes
//! one (the target behind it, the access mode it allows).

use super::types::uGDSOpError::*;
use super::{CResult, Fail};
use crate::buffer::Buffer;
use crate::error::Error;
use crate::fallback::FileTarget;
use crate::storage::{Storage, Target};
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, RwLock};

/// What a handle value points at: uGDS's programs read the registered fd from the first `int`
/// of a handle (`*(int *)fh`), so a handle is the address of one of these. Records are never
/// freed or reused, so a stale handle can never name a newer registration; lookups go through
/// a table keyed by the address, so a forged value is a miss and is never dereferenced.
#[repr(C)]
struct HandleRecord {
    fd: c_int,
}

/// A new handle value for descriptor `fd`: the address of a record of its own, never freed
/// (see `HandleRecord`).
pub(super) fn new_handle_value(fd: c_int) -> usize {
    let rec: &'static mut HandleRecord = Box::leak(Box::new(HandleRecord { fd }));
    rec as *mut HandleRecord as usize
}

/// A registered file or device.
pub struct Handle {
    /// Where its I/O goes.
    pub storage: Arc<Storage>,
    /// The caller's descriptor.
    pub fd: c_int,
    /// What the caller's descriptor allows: reads and writes against its mode are refused.
    pub access: Access,
    /// Stream-ordered I/O and batches not yet finished (deregistering waits for them).
    pub(crate) inflight: Arc<AtomicU32>,
    /// This handle's registration of each registered buffer, by base address, with the
    /// identity of the registration (`BufEntry`) it was made for.
    pub(super) regs: RwLock<HashMap<usize, (u64, Arc<Buffer>)>>,
    /// Aligned host buffers of this storage for staged I/O (cuFile semantics).
    pub(super) bounce: Mutex<Vec<Buffer>>,
    /// Blocks a staged write is reading, modifying and writing (namespaces only).
    edges: Mutex<std::collections::HashSet<u64>>,
    edges_freed: std::sync::Condvar,
}

/// The directions of I/O a handle allows: its descriptor's access mode (`O_RDONLY`, `O_WRONLY`,
/// `O_RDWR`), as cuFile keeps it, whatever the descriptor names (a file, a block device, a ugds
/// node, a volume descriptor, a fabrics namespace): one rule, so a read-only descriptor never
/// gives a handle that writes. Both for a target the library opened by name (no descriptor of
/// the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Reads are allowed.
    pub read: bool,
    /// Writes are allowed.
    pub write: bool,
}

impl Access {
    /// Reads and writes.
    pub const BOTH: Access = Access { read: true, write: true };

    /// The access an `O_ACCMODE` value gives.
    pub fn of_mode(flags: c_int) -> Access {
        match flags & libc::O_ACCMODE {
            libc::O_RDONLY => Access { read: true, write: false },
            libc::O_WRONLY => Access { read: false, write: true },
            _ => Access::BOTH,
        }
    }

    /// Refuses I/O in a direction the descriptor was not opened for with cuFile's code
    /// (`CU_FILE_INVALID_FILE_OPEN_FLAG`, "unsupported file open flags").
    pub fn check(self, write: bool) -> CResult<()> {
        if (write && !self.write) || (!write && !self.read) {
            return Err(Fail::Code(UGDS_INVALID_FILE_OPEN_FLAG));
        }
        Ok(())
    }
}

/// Edge blocks locked by a staged write; released on drop.
pub(crate) struct EdgeLock<'a> {
    handle: &'a Handle,
    blocks: Vec<u64>,
}

impl Drop for EdgeLock<'_> {
    fn drop(&mut self) {
        let mut held = self.handle.edges.lock().unwrap_or_else(|e| e.into_inner());
        for b in &self.blocks {
            held.remove(b);
        }
        self.handle.edges_freed.notify_all();
    }
}

impl Handle {
    /// A handle of `storage`, for the caller's descriptor `fd` allowing `access`, with nothing
    /// registered on it yet.
    pub(super) fn new(storage: Arc<Storage>, fd: c_int, access: Access) -> Handle {
        Handle {
            storage,
            fd,
            access,
            inflight: Arc::default(),
            regs: RwLock::default(),
            bounce: Mutex::default(),
            edges: Mutex::default(),
            edges_freed: Default::default(),
        }
    }

    /// Locks the partly covered first and last blocks of `[off, off+len)` (both at once, so two
    /// writers never wait for each other crosswise).
    pub(crate) fn lock_edges(&self, off: u64, len: u64, bs: u64) -> EdgeLock<'_> {
        let end = off + len;
        let mut blocks = Vec::with_capacity(2);
        if !off.is_multiple_of(bs) {
            blocks.push(off / bs);
        }
        if !end.is_multiple_of(bs) && !blocks.contains(&(end / bs)) {
            blocks.push(end / bs);
        }
        let mut held = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        while blocks.iter().any(|b| held.contains(b)) {
            held = self.edges_freed.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        held.extend(blocks.iter().copied());
        EdgeLock { handle: self, blocks }
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Handle(fd {})", self.fd)
    }
}

/// Opens the target behind a caller's descriptor, resolved as every face resolves a name
/// ([`Target::resolve`], looking through the descriptor): a ugds node or a volume descriptor
/// (`*.ugds-volume`, by the name the caller opened) takes the direct path, a namespace of the
/// kernel's NVMe over Fabrics initiator our own initiator where it can; a regular file or block
/// device the fallback path, through a descriptor of our own opened with O_DIRECT (so a file
/// the caller opened without it still bypasses the page cache) and the caller's access mode.
/// Every handle keeps the caller's access mode ([`Access`]).
pub(super) fn open_fd(fd: c_int, opts: &super::FaceOptions) -> CResult<(Arc<Storage>, Access)> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|_| Fail::Code(UGDS_INVALID_VALUE))?;
    let path = link.to_string_lossy().into_owned();
    let flags = status_flags(fd)?;
    let access = Access::of_mode(flags);
    // A volume descriptor goes by the name the caller opened (less " (deleted)" once unlinked),
    // and is read through the caller's descriptor: the handle's I/O goes to the volume, never
    // to the file's bytes.
    let name = descriptor_name(fd, &path);
    let target = Target::resolve(name, &format!("/proc/self/fd/{fd}"), 1)?;
    if let Some(st) = target.open(&path, 1, &opts.device)? {
        return Ok((st, access));
    }
    if !opts.fallback {
        // A file or block device takes the fallback path, which the face's configuration
        // turned off (cuFile: allow_compat_mode false).
        return Err(Fail::Code(UGDS_IO_NOT_SUPPORTED));
    }
    let file = reopen_direct(fd, access)
        .map(|f| (f, true))
        .or_else(|_| dup_own(fd).map(|f| (f, flags & libc::O_DIRECT != 0)))?;
    match FileTarget::from_file(file.0, &path, file.1) {
        Ok(f) => Ok((Storage::file(f)?, access)),
        Err(Error::InvalidArgument { .. }) => Err(Fail::Code(UGDS_INVALID_FILE_TYPE)),
        Err(e) => Err(Fail::Lib(e)),
    }
}

/// The caller's descriptor's status flags (`F_GETFL`: access mode, `O_DIRECT`); an invalid
/// descriptor is `UGDS_INVALID_VALUE`.
pub(super) fn status_flags(fd: c_int) -> CResult<c_int> {
    // SAFETY: F_GETFL on a descriptor the caller owns (an invalid one returns -1).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(Fail::Code(UGDS_INVALID_VALUE));
    }
    Ok(flags)
}

/// The name of the file behind `fd`, whose /proc link reads `link`: the link, less the
/// " (deleted)" the kernel appends once the file has no name left (so an unlinked descriptor
/// file still counts as one).
fn descriptor_name(fd: c_int, link: &str) -> &str {
    // SAFETY: fstat fills the struct we pass; an invalid descriptor returns -1.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let unlinked = unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_nlink == 0;
    match link.strip_suffix(" (deleted)") {
        Some(name) if unlinked => name,
        _ => link,
    }
}

/// Opens the caller's file again, with O_DIRECT and the caller's access mode, through /proc
/// (the same file even if renamed or unlinked since). Opening through /proc checks the file's
/// permissions, not the descriptor's mode: asking for more than the caller's mode would give a
/// write-only descriptor's handle the file's bytes.
fn reopen_direct(fd: c_int, access: Access) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(access.read)
        .write(access.write)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{fd}"))
}

/// A duplicate of the caller's descriptor that we own.
fn dup_own(fd: c_int) -> CResult<std::fs::File> {
    // SAFETY: dup of a descriptor the caller passed; failure returns -1.
    let own = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if own < 0 {
        return Err(Fail::Code(UGDS_GETNEWFD_FAILED));
    }
    // SAFETY: `own` is a new descriptor nobody else owns.
    Ok(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(own) })
}

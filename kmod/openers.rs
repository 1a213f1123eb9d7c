//! Who has a controller open (`LIST_OPENERS`): each open file's opening process and what the file
//! owns (queue pairs, registrations, pinned and dma-buf bytes), for `ugds status`. Any opener of
//! the node may ask: every opener shares the controller's trust domain already (docs/design.md).

use crate::device::Controller;
use crate::registry::Backing;
use crate::shim::chrdev::FileHandle;
use crate::shim::uaccess::{read_arg, write_arg, write_slice};
use crate::uapi::ioctl::{ListOpeners, Opener, OPENER_EXCLUSIVE};
use kernel::prelude::*;

/// An open file of a controller, as the controller's table of files keeps it.
pub(crate) struct OpenRecord {
    /// The file (for revoking its mappings, and the owner tag of what it made).
    pub(crate) handle: FileHandle,
    /// The opening process (thread group id in its own pid namespace, read at open).
    pub(crate) tgid: u32,
    /// Opened with `O_EXCL`.
    pub(crate) exclusive: bool,
}

/// What `rec` owns on `inner`'s tables.
fn describe(inner: &crate::device::Inner, rec: &OpenRecord) -> Opener {
    let mut o = Opener {
        tgid: rec.tgid,
        flags: if rec.exclusive { OPENER_EXCLUSIVE } else { 0 },
        ..Opener::default()
    };
    o.qpairs = inner.qpairs.iter().filter(|q| q.owner == rec.handle).count() as u32;
    for r in inner.regs.iter().filter(|r| r.owner == rec.handle) {
        o.registrations += 1;
        let bytes = r.npages() as u64 * 4096;
        match r.backing {
            Backing::Host { .. } => o.pinned_bytes += bytes,
            Backing::Dmabuf(_) => o.dmabuf_bytes += bytes,
        }
    }
    o
}

/// `LIST_OPENERS`: copies up to `capacity` openers out and returns how many; `count` comes back
/// as the number of open files.
pub(crate) fn list_openers(c: &Controller, arg: usize) -> Result<isize> {
    let mut a: ListOpeners = read_arg(arg)?;
    let room = a.check().map_err(|e| Error::from_errno(-e.errno()))?;
    // Gathered under the lock, copied out after it: copy_to_user may fault and take mmap_lock,
    // which mmap holds while it takes the controller lock (see `get_segments`).
    let mut out = KVVec::new();
    {
        let inner = c.inner.lock();
        a.count = inner.files.len() as u32;
        for rec in inner.files.iter().take(room) {
            out.push(describe(&inner, rec), GFP_KERNEL)?;
        }
    }
    if !out.is_empty() {
        write_slice(a.openers as usize, &out)?;
    }
    write_arg(arg, &a)?;
    Ok(out.len() as isize)
}

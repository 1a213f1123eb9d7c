//! Memory an NVMe/RDMA queue registers once for its small commands' data: one chunk per capsule
//! slot. A command of at most [`CHUNK`] bytes goes through its slot's chunk (a write copied in
//! before its capsule goes out, a read copied out once its response came) instead of
//! registering the caller's memory for it: an `ibv_reg_mr` and `ibv_dereg_mr` pair costs about
//! 50 us under the VM's soft-RoCE (the VM test `remote_rdma_per_io_registration_cost_against_the_io`),
//! a 16 KiB copy a few. The chunk is the slot's, so it is free exactly when the slot is: once
//! the command's SEND and its response both completed.
//!
//! Unlike a command's own registration, the chunks stay registered for the target to read and
//! write for the connection's life: a target could write a chunk between commands, or answer
//! a read with success without writing it (the read then gets an earlier command's bytes).
//! Either way it reaches only the queue's own memory, never the caller's, and a target can
//! send wrong data through the chunk of a read it serves anyway.

use super::verbs::{Endpoint, Keys, Mr, TargetAccess};
use std::alloc::Layout;
use std::ptr::NonNull;

/// Bytes of one chunk: the largest command that goes through one.
pub(crate) const CHUNK: usize = 16 << 10;

/// Whether a command of `len` bytes goes through a chunk.
pub(crate) fn takes(len: usize) -> bool {
    (1..=CHUNK).contains(&len)
}

/// A queue's chunks.
///
/// # Invariants
///
/// `mem` is `layout` bytes from `alloc_zeroed`, `chunks * CHUNK` of them, registered as `mr`
/// (`Some` until `Drop`, which deregisters it before freeing the memory).
#[derive(Debug)]
pub(crate) struct Bounce {
    mem: NonNull<u8>,
    layout: Layout,
    chunks: usize,
    mr: Option<Mr<'static>>,
}

// SAFETY: the memory is owned by the Bounce alone (the NIC reaches it only through `mr`, which is
// Send); nothing in it is tied to a thread.
unsafe impl Send for Bounce {}

impl Bounce {
    /// `chunks` chunks registered with `ep`'s protection domain for the target to read and
    /// write.
    ///
    /// # Safety
    /// The Bounce is dropped before `ep`.
    pub(crate) unsafe fn new(ep: &Endpoint, chunks: usize) -> std::io::Result<Bounce> {
        let bytes = chunks.max(1).checked_mul(CHUNK).ok_or_else(|| std::io::Error::other("too many chunks"))?;
        let layout = Layout::from_size_align(bytes, 4096).map_err(std::io::Error::other)?;
        // SAFETY: `layout` has a non-zero size.
        let mem = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        // SAFETY: the memory is the Bounce's own and stays allocated until `Drop`, which drops the
        // registration first; no Rust reference to it is ever made (copies go through raw
        // pointers); the Bounce is dropped before the endpoint (this function's contract).
        match unsafe { ep.register_raw(mem, bytes, TargetAccess::Either) } {
            Ok(mr) => Ok(Bounce { mem, layout, chunks: chunks.max(1), mr: Some(mr) }),
            Err(e) => {
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
                Err(e)
            }
        }
    }

    /// Where chunk `i` is (`None` past the last chunk).
    pub(crate) fn keys(&self, i: u16) -> Option<Keys> {
        let mr = self.mr.as_ref()?;
        let k = mr.keys();
        (usize::from(i) < self.chunks).then(|| Keys { addr: k.addr + (usize::from(i) * CHUNK) as u64, ..k })
    }

    /// Copies `len` bytes from `from` into chunk `i`.
    ///
    /// # Safety
    /// `from` is valid for reads of `len` bytes; `len` is at most [`CHUNK`], `i` below
    /// the chunks' number; no command in flight uses chunk `i`.
    pub(crate) unsafe fn fill(&self, i: u16, from: NonNull<u8>, len: usize) {
        debug_assert!(usize::from(i) < self.chunks && len <= CHUNK);
        // SAFETY: the chunk lies in the allocation (the caller's bounds); `from` per the
        // caller; the two never overlap (the chunk is the Bounce's own memory).
        unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), self.mem.as_ptr().add(usize::from(i) * CHUNK), len) };
    }

    /// Copies chunk `i`'s first `len` bytes to `to`.
    ///
    /// # Safety
    /// `to` is valid for writes of `len` bytes and referenced by no one else; `len` is at most
    /// [`CHUNK`], `i` below the chunks' number; the command that used chunk `i` got its response
    /// (the target wrote it before that).
    pub(crate) unsafe fn drain_to(&self, i: u16, to: NonNull<u8>, len: usize) {
        debug_assert!(usize::from(i) < self.chunks && len <= CHUNK);
        // SAFETY: as for `fill`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.as_ptr().add(usize::from(i) * CHUNK), to.as_ptr(), len) };
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // The registration first: after it no key reaches the memory.
        drop(self.mr.take());
        // SAFETY: allocated in `new` with `layout`; deregistered above.
        unsafe { std::alloc::dealloc(self.mem.as_ptr(), self.layout) };
    }
}

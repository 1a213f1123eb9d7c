//! [`OwnedQueue`]: a queue pair of the caller's own on a storage's namespace, for synchronous
//! I/O with no lock and no shared counter on the hot path (SPDK's one-queue-per-thread model).
//! The storage's `read` and `write` stay the shared, locked mode for callers that need it.

use super::{ConcretePath, Storage};
use crate::buffer::{Buffer, Lease, Path};
use crate::device::OwnedQueuePair;
use crate::error::{Error, Result};
use crate::inflight::Failed;
use std::sync::Arc;
use std::time::Duration;

/// A queue pair of its own on a [`Storage`]'s namespace (direct path, one ugds node): the thread
/// holding it runs synchronous reads and writes on it with no mutex and no atomic
/// read-modify-write per command. From [`Storage::owned_queue`]; deleted on the controller when
/// dropped.
///
/// It is `Send` (create it, then move it to the thread that uses it) but not `Sync`: every I/O
/// takes `&mut self`. Requests are checked, leased and split exactly as [`Storage::read`] and
/// [`Storage::write`] do them (the same deadline, reset and failure semantics: a timeout resets
/// the controller and this queue carries on; other queues of the process report the epoch change
/// once). Its I/Os are added to [`Storage::path_counts`] when it is dropped (no shared counter is
/// touched per I/O).
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<ugds::OwnedQueue>();
/// ```
#[derive(Debug)]
pub struct OwnedQueue {
    storage: Arc<Storage>,
    qp: OwnedQueuePair,
    /// I/Os per direct path (peer-to-peer, host, staged) and bytes, not yet counted by the storage.
    ios: [u64; 3],
    bytes: u64,
}

impl Storage {
    /// A queue pair of the caller's own on this storage's namespace, for synchronous I/O with no
    /// lock (see [`OwnedQueue`]). It has the depth, polling or interrupt mode and deadline of
    /// the device's synchronous queues, and takes one of the controller's I/O queue pairs until
    /// dropped.
    ///
    /// Only a single namespace on the direct path has queue pairs of this process: a striped
    /// volume, a file or block device (fallback path) and a remote target are refused with
    /// [`Error::Unsupported`] (their `read` and `write` work as ever).
    pub fn owned_queue(self: &Arc<Self>) -> Result<OwnedQueue> {
        self.alive()?;
        let ConcretePath::Direct(direct) = &*self.path else {
            return Err(Error::Unsupported {
                what: "an owned queue pair",
                why: format!("{} has no single NVMe namespace whose queue pairs this process drives", self.describe()),
                fix: "use the storage's read and write (every path has them), or open one ugds node \
                      (/dev/ugds_drvN) for an owned queue pair on its namespace",
            });
        };
        let qp = direct.ns.owned_queue()?;
        Ok(OwnedQueue { storage: self.clone(), qp, ios: [0; 3], bytes: 0 })
    }
}

impl OwnedQueue {
    /// The storage it belongs to (buffers must be registered for it).
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// Its queue id on the controller.
    pub fn qid(&self) -> u16 {
        self.qp.qid()
    }

    /// Entries per ring.
    pub fn depth(&self) -> u32 {
        self.qp.depth()
    }

    /// The per-command deadline of its I/Os.
    pub fn timeout(&self) -> Duration {
        self.qp.timeout()
    }

    /// Sets the per-command deadline of its I/Os (the device's by default).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.qp.set_timeout(timeout)
    }

    /// The namespace id its commands go to.
    pub fn nsid(&self) -> u32 {
        self.qp.namespace().id()
    }

    /// Transfers its queue pair wrote, by data pointer (a test aid, as
    /// [`crate::Device::dptr_counts`] is for the shared queues).
    #[doc(hidden)]
    pub fn dptr_counts(&self) -> crate::device::DptrCounts {
        self.qp.dptr_counts()
    }

    /// Reads `len` bytes at `file_offset` into `buf` at `buf_offset` (as [`Storage::read`]);
    /// returns the bytes read.
    pub fn read(&mut self, buf: &Buffer, buf_offset: u64, file_offset: u64, len: u64) -> Result<u64> {
        self.rw(false, buf, buf_offset, file_offset, len)
    }

    /// Writes `len` bytes from `buf` at `buf_offset` to `file_offset` (as [`Storage::write`]);
    /// returns the bytes written.
    pub fn write(&mut self, buf: &Buffer, buf_offset: u64, file_offset: u64, len: u64) -> Result<u64> {
        self.rw(true, buf, buf_offset, file_offset, len)
    }

    /// The storage's one request check, a lease on the buffer, then the commands on this queue.
    fn rw(&mut self, write: bool, buf: &Buffer, buf_offset: u64, file_offset: u64, len: u64) -> Result<u64> {
        self.storage.check(buf, buf_offset, file_offset, len)?;
        let ConcretePath::Direct(direct) = self.storage.concrete_path() else {
            // `owned_queue` made this queue on a direct path; a storage never changes path.
            return Err(Error::invalid("queue", "not on the direct path"));
        };
        let qp = &mut self.qp;
        let n = direct
            .rw_with(
                &mut |w, reg, reg_offset, dev_offset, l| qp.rw(w, reg, reg_offset, dev_offset, l),
                write,
                Lease::new(buf)?,
                buf_offset,
                file_offset,
                len,
            )
            .map_err(Failed::into_error)?;
        let slot = match buf.path() {
            Path::DirectP2p => 0,
            Path::DirectHost => 1,
            _ => 2,
        };
        self.ios[slot] += 1;
        self.bytes += n;
        Ok(n)
    }
}

impl Drop for OwnedQueue {
    fn drop(&mut self) {
        let paths = [Path::DirectP2p, Path::DirectHost, Path::DirectStaged];
        for (p, n) in paths.into_iter().zip(self.ios) {
            self.storage.count_many(p, n, 0);
        }
        // The byte count is one for every path.
        self.storage.count_many(Path::DirectHost, 0, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::OwnedQueue;
    use std::marker::PhantomData;

    /// Whether `T` is `Send` / `Sync`, read at compile time: the inherent constants exist only
    /// when the bound holds, else the trait's `false` is found.
    struct Probe<T>(PhantomData<T>);
    trait Fallback {
        const SEND: bool = false;
        const SYNC: bool = false;
    }
    impl<T> Fallback for Probe<T> {}
    #[allow(dead_code)]
    impl<T: Send> Probe<T> {
        const SEND: bool = true;
    }
    struct SyncProbe<T>(PhantomData<T>);
    impl<T> Fallback for SyncProbe<T> {}
    #[allow(dead_code)]
    impl<T: Sync> SyncProbe<T> {
        const SYNC: bool = true;
    }

    /// An owned queue moves to the thread that uses it, but is never shared between threads
    /// (its I/O takes `&mut self`; SPDK's contract as a type). Checked while compiling.
    #[test]
    fn an_owned_queue_is_send_and_not_sync() {
        const { assert!(Probe::<OwnedQueue>::SEND) };
        const { assert!(!SyncProbe::<OwnedQueue>::SYNC) };
        // The probe itself tells the two apart.
        const { assert!(SyncProbe::<u8>::SYNC) };
        const { assert!(!SyncProbe::<std::cell::Cell<u8>>::SYNC) };
        const { assert!(!Probe::<std::rc::Rc<u8>>::SEND) };
    }

    /// A file (the fallback path) has no queue pairs of this process: refused by name, with
    /// what to use instead; its own read still works.
    #[cfg(feature = "fallback")]
    #[test]
    fn a_file_refuses_an_owned_queue_by_name() {
        let path = std::env::temp_dir().join(format!("ugds-owned-queue-{}", std::process::id()));
        std::fs::File::create(&path).and_then(|f| f.set_len(1 << 20)).unwrap();
        let st = crate::Storage::open(path.to_str().unwrap()).unwrap();
        let e = st.owned_queue().unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, crate::Error::Unsupported { what: "an owned queue pair", .. }), "{e:?}");
        assert!(text.contains("read and write") && text.contains("/dev/ugds_drvN"), "{text}");
        let buf = st.alloc_host(4096).unwrap();
        assert_eq!(st.read(&buf, 0, 0, 4096).unwrap(), 4096);
        drop((buf, st));
        std::fs::remove_file(&path).unwrap();
    }
}

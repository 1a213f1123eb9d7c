//! The remote path: a namespace of an NVMe over Fabrics subsystem, reached by our own
//! initiator over NVMe/TCP (no kernel on the data path beyond the socket) or NVMe/RDMA (no
//! kernel on the data path at all). `Storage::open` takes
//! `nvmeof://tcp|rdma/HOST:PORT/SUBSYSNQN?nsid=N` (see [`uri`]).
//!
//! TCP: host memory goes to and from the socket directly: writes in the command capsule when
//! the controller's in-capsule size allows, else in H2CData PDUs answering its R2Ts; reads
//! come back in C2HData PDUs. RDMA: each I/O's memory is registered with the NIC and named by
//! keyed SGLs; the target RDMA-reads and -writes it. GPU memory goes straight to the NIC when
//! it registers the memory's dma-buf, else (and always on TCP) through pinned host chunks, as
//! on the fallback path. Every I/O runs on one queue (one connection) with its commands all in
//! flight.

pub(crate) mod batch;
mod fabrics;
mod queue;
#[cfg(feature = "rdma")]
mod rdma;
#[cfg(feature = "rdma")]
mod rdma_bounce;
#[cfg(feature = "rdma")]
mod rdma_slots;
mod splice;
mod spread;
pub(crate) mod sysfs;
mod tcp;
mod transport;
pub mod uri;
#[cfg(feature = "rdma")]
mod verbs;

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod fake;
#[cfg(any(test, feature = "test-utils"))]
#[doc(hidden)]
pub mod harness;
#[cfg(test)]
mod tests;

use crate::buffer::{Buffer, Lease, Mem, Path};
use crate::data_path::{within_capacity, DataPath, Registered};
use crate::error::{Error, Result};
use crate::gpu::GpuMemory;
use crate::inflight::{settle, IoResult};
use crate::staging_pipeline::staged;
use fabrics::{Controller, NsInfo};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use transport::{Cmd, Data};
use ugds_uapi::queue::nvm;
use ugds_uapi::Sqe;
pub use uri::{RemoteSpec, Transport};

/// The most data one command carries (MDTS lowers it): large enough to stream, small enough
/// that a request is many commands in flight at once.
pub(crate) const MAX_COMMAND_BYTES: u64 = 1 << 20;

/// First wait between reconnect attempts; it doubles up to [`BACKOFF_MAX_MS`].
const BACKOFF_START_MS: u64 = 50;
const BACKOFF_MAX_MS: u64 = 1000;

/// A namespace on an NVMe over Fabrics target.
#[derive(Debug)]
pub(crate) struct RemotePath {
    link: Arc<Link>,
    /// GPU registrations whose dma-buf the RDMA NIC refused (staged instead), and the last
    /// reason: made visible in `describe()`, never silent.
    dmabuf_refused: AtomicU64,
    dmabuf_refusal: Mutex<Option<String>>,
}

/// Mean nanoseconds of one `ibv_reg_mr` + `ibv_dereg_mr` of `len` bytes of host memory on the
/// RDMA device that reaches the target of `uri` (an `nvmeof://rdma/...` URI), over `rounds`:
/// the price of registering each I/O's memory (VM tests and docs/remote.md).
#[doc(hidden)]
#[cfg(feature = "rdma")]
pub fn rdma_registration_ns(uri: &str, len: usize, rounds: u32) -> Result<f64> {
    let spec = RemoteSpec::parse(uri)?;
    if spec.transport != Transport::Rdma {
        return Err(Error::invalid("uri", "not an nvmeof://rdma URI"));
    }
    // A CM connection of an admin queue is enough for a PD on the right device.
    rdma::RdmaQueue::connect(&spec, 0, 2, 0xFFFF)?.registration_ns(len, rounds)
}

/// Whether an error says the connection (not the command) failed.
fn transport_failed(e: &Error) -> bool {
    matches!(e, Error::RemoteTransport { .. } | Error::RemoteProtocol { .. })
}

/// The namespace and the controller that reaches it, replaced when it is found gone: what the
/// path and its batches share.
#[derive(Debug)]
pub(crate) struct Link {
    spec: RemoteSpec,
    /// The controller in use; replaced by a new one when it is found gone.
    ctrl: RwLock<Arc<Controller>>,
    ns: NsInfo,
    reconnects: AtomicU64,
}

impl RemotePath {
    /// Connects to the target of `spec` and opens its namespace.
    pub(crate) fn open(spec: &RemoteSpec) -> Result<RemotePath> {
        let ctrl = Controller::connect(spec)?;
        let ns = ctrl.namespace(spec.nsid)?;
        Ok(RemotePath {
            link: Arc::new(Link {
                spec: spec.clone(),
                ctrl: RwLock::new(Arc::new(ctrl)),
                ns,
                reconnects: AtomicU64::new(0),
            }),
            dmabuf_refused: AtomicU64::new(0),
            dmabuf_refusal: Mutex::new(None),
        })
    }

    /// What the path's batches share with it.
    pub(crate) fn link(&self) -> &Arc<Link> {
        &self.link
    }
}

impl Link {
    /// The controller to use: the current one, or, when it is gone, a new one on the same
    /// subsystem, connected with backoff for up to the URI's timeout. Only I/Os that start
    /// after the loss wait here: the ones that were in flight already failed by name.
    pub(crate) fn controller(&self) -> Result<Arc<Controller>> {
        let c = self.ctrl.read().unwrap_or_else(|e| e.into_inner()).clone();
        if !c.is_dead() {
            return Ok(c);
        }
        let mut slot = self.ctrl.write().unwrap_or_else(|e| e.into_inner());
        if !slot.is_dead() {
            return Ok(slot.clone());
        }
        let deadline = Instant::now() + Duration::from_millis(self.spec.timeout_ms);
        let mut wait = BACKOFF_START_MS;
        let new = loop {
            let e = match Controller::connect(&self.spec).and_then(|c| c.namespace(self.ns.nsid).map(|ns| (c, ns))) {
                Ok((c, ns)) if (ns.block_size, ns.blocks) == (self.ns.block_size, self.ns.blocks) => break c,
                Ok(_) => {
                    return Err(Error::RemoteProtocol {
                        target: self.spec.address(),
                        reason: format!("namespace {} changed size or block size across a reconnect", self.ns.nsid),
                    })
                }
                Err(e) => e,
            };
            // A target that answers but refuses (wrong NQN now, namespace gone) will not
            // change its mind in a few milliseconds.
            let retry = transport_failed(&e) || matches!(e, Error::RemoteUnreachable { .. });
            if !retry || Instant::now() + Duration::from_millis(wait) > deadline {
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(wait));
            wait = (wait * 2).min(BACKOFF_MAX_MS);
        };
        *slot = Arc::new(new);
        self.reconnects.fetch_add(1, Ordering::Relaxed);
        Ok(slot.clone())
    }

    /// Runs `cmds` on a queue of the current controller; a failed connection fails them all
    /// (by name) and checks whether the controller itself is gone.
    fn run(&self, cmds: &mut [Cmd<'_>], op: &str) -> Result<Vec<transport::Done>> {
        let ctrl = self.controller()?;
        let mut q = ctrl.take_queue()?;
        let r = q.execute(cmds, op);
        ctrl.put_queue(q);
        if let Err(e) = &r {
            if transport_failed(e) {
                ctrl.probe();
            }
        }
        r
    }

    /// The largest command's data: whole blocks; a reconnect keeps the first controller's limit
    /// (the same target).
    pub(crate) fn max_command_bytes(&self) -> u64 {
        let max = self.ctrl.read().unwrap_or_else(|e| e.into_inner()).max_transfer;
        (max / self.ns.block_size).max(1) * self.ns.block_size
    }

    /// The namespace.
    pub(crate) fn ns(&self) -> &NsInfo {
        &self.ns
    }

    /// The URI's timeout.
    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.spec.timeout_ms)
    }
}

impl RemotePath {
    /// Moves the data of `pieces` (each at most [`RemotePath::max_command_bytes`], whole blocks,
    /// back to back) between memory and the namespace at `file_offset` (`write`: to the
    /// namespace), one command per piece, all on one queue.
    fn rw_pieces(&self, write: bool, pieces: Vec<Data<'_>>, file_offset: u64) -> Result<()> {
        let bs = self.link.ns.block_size;
        let (opcode, op) = if write { (nvm::WRITE, "write") } else { (nvm::READ, "read") };
        let mut at = file_offset;
        let mut cmds: Vec<Cmd<'_>> = Vec::with_capacity(pieces.len());
        for data in pieces {
            let n = data.len() as u64;
            let mut s = Sqe::new(opcode, 0);
            s.set_nsid(self.link.ns.nsid);
            s.set_slba(at / bs);
            // CAST: a piece is at most 1 MiB, at least 512-byte blocks: under 65536 blocks.
            s.set_nlb((n / bs) as u32);
            at += n;
            cmds.push(Cmd { sqe: s, data });
        }
        let r = self.link.run(&mut cmds, op)?;
        for (c, d) in cmds.iter().zip(r) {
            if !d.status.is_success() {
                return Err(Error::Nvme { op, slba: c.sqe.slba(), status: d.status });
            }
        }
        Ok(())
    }

    /// Moves `buf.len()` bytes between host memory `buf` and the namespace at `file_offset`.
    fn rw_host(&self, buf: HostSlice<'_>, file_offset: u64) -> Result<()> {
        let piece = self.max_command_bytes() as usize;
        match buf {
            HostSlice::Out(b) => self.rw_pieces(true, b.chunks(piece).map(Data::Out).collect(), file_offset),
            HostSlice::In(b) => self.rw_pieces(false, b.chunks_mut(piece).map(Data::In).collect(), file_offset),
        }
    }

    /// Moves `len` bytes between offset `at` of dma-buf `fd` (GPU memory the NIC reaches) and
    /// the namespace at `file_offset`.
    fn rw_dmabuf(&self, write: bool, fd: BorrowedFd<'_>, at: u64, len: u64, file_offset: u64) -> Result<()> {
        let piece = self.max_command_bytes();
        let pieces = (0..len)
            .step_by(piece as usize)
            // CAST: a piece is at most 1 MiB.
            .map(|o| Data::DmaBuf { fd, offset: at + o, len: piece.min(len - o) as usize, write })
            .collect();
        self.rw_pieces(write, pieces, file_offset)
    }

    /// Whether the NIC registers `mem`'s dma-buf (RDMA only); `Err` says why not.
    fn probe_dmabuf(&self, mem: &GpuMemory) -> std::result::Result<(), String> {
        if self.link.spec.transport == Transport::Tcp {
            return Err("a TCP socket cannot reach GPU memory".into());
        }
        let fd = mem.export_dmabuf().map_err(|e| format!("the GPU memory exports no dma-buf: {e}"))?;
        let ctrl = self.link.controller().map_err(|e| e.to_string())?;
        let q = ctrl.take_queue().map_err(|e| e.to_string())?;
        let r = q.probe_dmabuf(fd.as_fd(), mem.len());
        ctrl.put_queue(q);
        r.map_err(|e| format!("the RDMA device refused to register the dma-buf (ibv_reg_dmabuf_mr: {e})"))
    }
}

/// Host memory of one I/O, in its direction.
enum HostSlice<'a> {
    Out(&'a [u8]),
    In(&'a mut [u8]),
}

impl DataPath for RemotePath {
    fn describe(&self) -> String {
        let c = self.link.ctrl.read().unwrap_or_else(|e| e.into_inner()).clone();
        let refused = match self.dmabuf_refused.load(Ordering::Relaxed) {
            0 => String::new(),
            n => format!(
                "; GPU memory staged through host memory: dma-buf registration refused {n} times ({})",
                self.dmabuf_refusal.lock().unwrap_or_else(|e| e.into_inner()).as_deref().unwrap_or("")
            ),
        };
        format!(
            "remote path ({}, user-space initiator): namespace {} of {} at {} (controller {}, {} {}), {} bytes in {}-byte blocks, reconnected {} times{refused}",
            match self.link.spec.transport {
                Transport::Tcp => "NVMe/TCP",
                Transport::Rdma => "NVMe/RDMA",
            },
            self.link.ns.nsid,
            self.link.spec.subsysnqn,
            c.target,
            c.cntlid,
            c.model,
            c.serial,
            self.link.ns.bytes,
            self.link.ns.block_size,
            self.link.reconnects.load(Ordering::Relaxed)
        )
    }

    fn capacity(&self) -> Result<u64> {
        Ok(self.link.ns.bytes)
    }

    fn block_size(&self) -> u64 {
        self.link.ns.block_size
    }

    fn buffer_alignment(&self) -> u64 {
        1
    }

    fn check_extent(&self, file_offset: u64, len: u64) -> Result<()> {
        within_capacity(file_offset, len, self.link.ns.bytes, "namespace")
    }

    fn is_direct(&self) -> bool {
        false
    }

    fn is_remote(&self) -> bool {
        true
    }

    fn bypasses_page_cache(&self) -> bool {
        true
    }

    unsafe fn register_host(&self, _ptr: *mut u8, _len: usize) -> Result<Registered> {
        Ok(Registered { regs: Vec::new(), staging: None, path: Path::Remote })
    }

    fn register_gpu(&self, mem: &Arc<GpuMemory>, allow_staging: bool) -> Result<Registered> {
        let staged = Registered { regs: Vec::new(), staging: None, path: Path::RemoteStaged };
        if self.link.spec.transport == Transport::Tcp {
            // A socket cannot reach GPU memory: it is always staged.
            return Ok(staged);
        }
        let why = match self.probe_dmabuf(mem) {
            Ok(()) => return Ok(Registered { regs: Vec::new(), staging: None, path: Path::Remote }),
            Err(why) => why,
        };
        if !allow_staging {
            return Err(Error::Unsupported {
                what: "GPU memory straight to the RDMA NIC",
                why,
                fix: "allow staging through host memory, or use a NIC whose driver registers dma-bufs (mlx5, ...)",
            });
        }
        self.dmabuf_refused.fetch_add(1, Ordering::Relaxed);
        crate::data_path::note_fallback(
            &format!("GPU memory on {}", self.link.spec.address()),
            "staged through pinned host memory (NVMe/RDMA)",
            &why,
        );
        *self.dmabuf_refusal.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        Ok(staged)
    }

    fn rw(&self, write: bool, lease: Lease<&Buffer>, buf_offset: u64, file_offset: u64, len: u64) -> IoResult<u64> {
        let n = len as usize;
        let r: IoResult<()> = match lease.buffer().mem() {
            Mem::Host { ptr, .. } => {
                // SAFETY: the storage checked `[buf_offset, +len)` against the buffer, whose
                // memory stays mapped while it lives; the lease keeps every CPU reference out
                // of it during the call, so this slice is the only one.
                let p = unsafe { ptr.add(buf_offset as usize) };
                let s = if write {
                    // SAFETY: `p..p+n` lies in the leased buffer (see above).
                    HostSlice::Out(unsafe { std::slice::from_raw_parts(p, n) })
                } else {
                    // SAFETY: as above; nothing else reads or writes it during the call.
                    HostSlice::In(unsafe { std::slice::from_raw_parts_mut(p, n) })
                };
                self.rw_host(s, file_offset).map_err(Into::into)
            }
            Mem::Gpu(g) if lease.buffer().path() == Path::Remote => {
                // The NIC registered this memory's dma-buf: it moves the data itself.
                let fd = g.export_dmabuf()?;
                self.rw_dmabuf(write, fd.as_fd(), buf_offset, len, file_offset).map_err(Into::into)
            }
            Mem::Gpu(g) => staged(g.gpu(), write, g.device_ptr() + buf_offset, n, None, |p, k, at| {
                // SAFETY: `staged` hands us one of its staging chunks, `k` bytes long, which no
                // copy uses until this call returns.
                let s = unsafe {
                    if write {
                        HostSlice::Out(std::slice::from_raw_parts(p, k))
                    } else {
                        HostSlice::In(std::slice::from_raw_parts_mut(p, k))
                    }
                };
                Ok(self.rw_host(s, file_offset + at).map(|()| k)?)
            })
            .map(|_| ()),
        };
        // A copy queue may still move data into or out of the GPU memory: its token keeps the lease.
        settle(r.map(|()| len), lease)
    }

    fn flush(&self) -> Result<()> {
        if !self.link.controller()?.vwc {
            return Ok(());
        }
        let mut s = Sqe::new(nvm::FLUSH, 0);
        s.set_nsid(self.link.ns.nsid);
        let mut cmds = [Cmd { sqe: s, data: Data::None }];
        let d = self.link.run(&mut cmds, "flush")?[0];
        if !d.status.is_success() {
            return Err(Error::Nvme { op: "flush", slba: 0, status: d.status });
        }
        Ok(())
    }

    fn write_bytes(&self, _data: &[u8], _off: u64) -> Option<Result<()>> {
        None
    }

    fn max_command_bytes(&self) -> u64 {
        self.link.max_command_bytes()
    }
}

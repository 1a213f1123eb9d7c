//! Stream-ordered I/O of the C faces. A stream the application passes is never synchronised or
//! destroyed by the library: each I/O is a job that runs once the stream reaches it, and
//! forgetting a stream (deregistration, closing) waits only for the library's own jobs on it.
//! CPU streams (`ugdsxCpuStream*`) give stream-ordered I/O without a GPU.

use super::library::{cuda, hip, BufEntry, Face, IoKind, Library, Memory};
use super::slots::Slots;
use super::types::uGDSIoSegment;
use super::types::uGDSOpError::*;
use super::{CResult, Fail, Handle};
use crate::gpu::stream::{CpuStream, Stream};
use crate::gpu::Vendor;
use crate::stream_io::{StreamIo, StreamJob};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The streams a library has queued I/O on, and its CPU streams.
#[derive(Default)]
pub struct Streams {
    /// By the application's stream value and, for a default stream (whose context is the
    /// calling thread's current one), that context's id (0 otherwise).
    io: Mutex<HashMap<(usize, u64), Arc<StreamIo>>>,
    /// CPU streams made by `ugdsxCpuStreamCreate`; their handles are these slots.
    pub(crate) cpu: Slots<CpuStream>,
}

/// Keeps a handle and buffers counted busy while a stream-ordered operation is queued or running;
/// released when the job has run, or when it is dropped unrun (the runtime refused it).
struct Hold {
    handle: Option<Arc<Handle>>,
    inflight: Arc<std::sync::atomic::AtomicU32>,
    bufs: Vec<Arc<BufEntry>>,
}

impl Hold {
    fn new(handle: Arc<Handle>, bufs: Vec<Arc<BufEntry>>) -> Hold {
        handle.inflight.fetch_add(1, Ordering::AcqRel);
        for b in &bufs {
            b.inflight.fetch_add(1, Ordering::AcqRel);
        }
        Hold { inflight: handle.inflight.clone(), handle: Some(handle), bufs }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        for b in &self.bufs {
            b.inflight.fetch_sub(1, Ordering::AcqRel);
        }
        // Our reference to the handle goes before the count that lets a deregistration finish,
        // so the last reference (and the storage's worker pool) is never dropped on a worker.
        drop(self.handle.take());
        self.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Late-bound arguments in the caller's memory (`size_p`, `file_offset_p`, `buf_offset_p`,
/// `bytes_p`), read when the stream reaches the operation.
#[derive(Debug, Clone, Copy)]
pub struct LateArgs {
    /// `size_t *`.
    pub size: *const usize,
    /// `off_t *`.
    pub file_offset: *const libc::off_t,
    /// `off_t *`.
    pub buf_offset: *const libc::off_t,
    /// `ssize_t *`: the result.
    pub bytes: *mut libc::ssize_t,
}

// SAFETY: the C caller keeps these words valid until the stream has passed the operation; they
// are read and written only by the operation's job, with volatile accesses.
unsafe impl Send for LateArgs {}

/// Late-bound vectored arguments: the segment array and the file offset are read when the stream
/// reaches the operation (each segment's base was checked at enqueue).
#[derive(Debug, Clone, Copy)]
pub struct LateSegs {
    /// The caller's segment array.
    pub segs: *const uGDSIoSegment,
    /// How many.
    pub nr: u32,
    /// `off_t *`.
    pub file_offset: *const libc::off_t,
    /// `ssize_t *`: the result.
    pub bytes: *mut libc::ssize_t,
}

// SAFETY: as for `LateArgs`.
unsafe impl Send for LateSegs {}

impl Library {
    /// The stream-ordered I/O state of `stream`: a CPU stream of ours, or a stream of the GPU
    /// runtime whose memory `bufs` are (the first GPU buffer decides; for host memory, CUDA
    /// where it loads, else HIP), in the context the stream belongs to (CUDA: `cuStreamGetCtx`;
    /// a default stream: the calling thread's current context, as `cudaSetDevice` set it; HIP:
    /// `hipStreamGetDevice`, else the buffer's device). A buffer of another device than the
    /// stream's is handled as CUDA handles a copy between them: the stream orders the I/O, the
    /// buffer's own context moves its data.
    fn stream_io(&self, stream: usize, bufs: &[Arc<BufEntry>]) -> CResult<Arc<StreamIo>> {
        let cpu = self.streams.cpu.get(stream);
        let vendor = bufs.iter().find_map(|b| match &b.mem {
            Memory::Gpu(m) => Some((m.gpu().runtime().vendor(), m.device_ptr())),
            Memory::Host => None,
        });
        let vendor = match (&cpu, vendor) {
            (Some(_), _) => Vendor::Cpu,
            (None, Some((v, _))) => v,
            (None, None) if cuda().is_some() => Vendor::Cuda,
            (None, None) if hip().is_some() => Vendor::Hip,
            (None, None) => return Err(Fail::Code(UGDS_PLATFORM_NOT_SUPPORTED)),
        };
        // A default stream is the calling thread's: of its current context (CUDA) or device (HIP).
        let key = match vendor {
            Vendor::Cuda if stream <= 2 => (stream, default_stream_context()),
            Vendor::Hip if stream == 0 => (stream, crate::gpu::hip::current_device().map_or(0, |d| d as u64 + 1)),
            _ => (stream, 0),
        };
        let mut io = self.streams.io.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = io.get(&key) {
            return Ok(s.clone());
        }
        let s: Arc<dyn Stream> = match (cpu, vendor) {
            (Some(c), _) => c,
            (None, Vendor::Hip) => {
                if hip().is_none() {
                    return Err(Fail::Code(UGDS_PLATFORM_NOT_SUPPORTED));
                }
                let h = match crate::gpu::hip::stream_runtime(stream)? {
                    Some((h, _)) => h,
                    None => {
                        let (h0, _) = crate::gpu::hip::device_runtime(0)?;
                        let dev = vendor_ptr(bufs).and_then(|p| h0.device_of(p)).unwrap_or(0);
                        crate::gpu::hip::device_runtime(dev)?.0
                    }
                };
                // SAFETY: the stream is of device `h` (asked of the runtime, or the device of the
                // memory it orders); it is used only while the caller's enqueue call runs
                // (queuing work), never after.
                unsafe { h.wrap_stream(stream) }
            }
            (None, _) => {
                if cuda().is_none() {
                    return Err(Fail::Code(UGDS_PLATFORM_NOT_SUPPORTED));
                }
                #[cfg(feature = "cuda")]
                {
                    // SAFETY: the caller's stream (or a default-stream value), wrapped in the
                    // context the driver says it belongs to; it is used only while the caller's
                    // enqueue call runs (queuing work), never after.
                    unsafe { crate::gpu::cuda::wrap_stream(stream) }?.1
                }
                #[cfg(not(feature = "cuda"))]
                return Err(Fail::Code(UGDS_PLATFORM_NOT_SUPPORTED));
            }
        };
        let sio = Arc::new(StreamIo::new(s)?);
        io.insert(key, sio.clone());
        Ok(sio)
    }

    /// A stream registration call (`uGDSStreamRegister`, `cuFileStreamRegister`): sets up the
    /// stream's state now (its words, and its dispatcher thread with the stream's context bound
    /// and its io_uring made) instead of inside the first stream-ordered I/O, which an
    /// application times. Registration never fails for it: when the library is not open or no
    /// runtime loads, the first I/O sets it up (or reports why not) as before.
    pub fn stream_prepare(&self, stream: usize) {
        if !self.is_open() {
            return;
        }
        match self.stream_io(stream, &[]) {
            Ok(_) => {}
            Err(f) => log::debug!("stream {stream:#x} is set up at its first I/O instead: {f:?}"),
        }
    }

    /// Whether `stream` (a non-default stream) has its stream-ordered state set up.
    pub fn stream_is_set_up(&self, stream: usize) -> bool {
        let io = self.streams.io.lock().unwrap_or_else(|e| e.into_inner());
        io.keys().any(|k| k.0 == stream)
    }

    /// Settles the copies that release streams (see [`StreamIo::settle_copies`]): done before
    /// telling whether a buffer or handle is in use.
    pub(crate) fn settle_streams(&self) {
        let io: Vec<Arc<StreamIo>> =
            self.streams.io.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        for sio in io {
            sio.settle_copies();
        }
    }

    /// Forgets `stream` after the library's own work on it is done (never calls the stream).
    pub fn stream_forget(&self, stream: usize) {
        let gone: Vec<Arc<StreamIo>> = {
            let mut io = self.streams.io.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<(usize, u64)> = io.keys().filter(|k| k.0 == stream).copied().collect();
            keys.iter().filter_map(|k| io.remove(k)).collect()
        };
        drop(gone);
    }

    /// `ReadAsync`/`WriteAsync`: checks now, moves data when the stream gets there. The
    /// operation holds the handle and buffer busy until it has run.
    ///
    /// # Safety
    ///
    /// `args`' pointers must stay valid until the stream has passed the operation, and the
    /// memory must be valid for the range they will name.
    pub unsafe fn rw_async(
        &'static self,
        write: bool,
        fh: usize,
        base: usize,
        args: LateArgs,
        stream: usize,
    ) -> CResult<()> {
        // The caller's CUDA context is the same after the call (we may bind ours).
        let _caller = crate::gpu::cuda::CallerContext::keep();
        match self.face {
            Face::Ugds => {
                if !self.is_open() {
                    return Err(Fail::Code(UGDS_DRIVER_NOT_INITIALIZED));
                }
            }
            Face::CuFile => self.require_open()?,
        }
        if fh == 0 || base == 0 {
            return Err(Fail::Code(UGDS_INVALID_VALUE));
        }
        if args.size.is_null() || args.file_offset.is_null() || args.buf_offset.is_null() || args.bytes.is_null() {
            return Err(Fail::Code(UGDS_INVALID_VALUE));
        }
        let entry = self.buffer(base);
        if entry.is_none() && self.face == Face::Ugds {
            return Err(Fail::Code(UGDS_INVALID_VALUE));
        }
        let h = self.handle(fh).ok_or(Fail::Code(match self.face {
            Face::Ugds => UGDS_INVALID_VALUE,
            Face::CuFile => UGDS_HANDLE_NOT_REGISTERED,
        }))?;
        h.access.check(write)?;
        let bufs: Vec<Arc<BufEntry>> = entry.into_iter().collect();
        let sio = self.stream_io(stream, &bufs)?;
        let engine = h.storage.engine()?;
        let hold = Hold::new(h, bufs);
        let job: StreamJob = Box::new(move || {
            let args = args;
            // SAFETY: the caller keeps the words valid until the stream has passed this.
            let (size, foff, boff) = unsafe {
                (
                    std::ptr::read_volatile(args.size),
                    std::ptr::read_volatile(args.file_offset),
                    std::ptr::read_volatile(args.buf_offset),
                )
            };
            // One I/O: a read into GPU memory may end on the device (crate::stream_tail).
            // SAFETY: the memory contract is the caller's (registered memory stays valid).
            let v = match crate::stream_tail::one_io(|| unsafe {
                self.rw_as(IoKind::Async, write, fh, base, size, foff, boff)
            }) {
                Ok(n) => n as libc::ssize_t,
                Err(f) => f.ret_for(self.face),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile(args.bytes, v) };
            // Busy until a copy left running (if any) is over.
            crate::stream_tail::keep_while_copying(Box::new(hold));
        });
        sio.submit_jobs(&engine, vec![job]).map_err(Fail::Lib)
    }

    /// `ReadvAsync`/`WritevAsync` (uGDS): the segment bases are checked now; offsets, sizes and
    /// the file offset are read when the stream gets there. `*bytes` is 0 until then.
    ///
    /// # Safety
    ///
    /// As [`Library::rw_async`], for the segment array and words.
    pub unsafe fn rwv_async(&'static self, write: bool, fh: usize, args: LateSegs, stream: usize) -> CResult<()> {
        // The caller's CUDA context is the same after the call (we may bind ours).
        let _caller = crate::gpu::cuda::CallerContext::keep();
        if !self.is_open() {
            return Err(Fail::Code(UGDS_DRIVER_NOT_INITIALIZED));
        }
        if fh == 0 || args.segs.is_null() {
            return Err(Fail::Code(UGDS_INVALID_VALUE));
        }
        if args.nr == 0 || args.nr > super::types::UGDS_IOV_MAX || args.file_offset.is_null() || args.bytes.is_null() {
            return Err(Fail::Code(UGDS_INVALID_VALUE));
        }
        // SAFETY: the caller passes `nr` segments and a valid result word.
        let segs = unsafe {
            std::ptr::write_volatile(args.bytes, 0);
            std::slice::from_raw_parts(args.segs, args.nr as usize)
        };
        if segs.iter().any(|s| s.base.is_null()) {
            return Err(Fail::Code(UGDS_INVALID_VALUE));
        }
        let h = self.handle(fh).ok_or(Fail::Code(UGDS_INVALID_VALUE))?;
        let mut entries = Vec::with_capacity(segs.len());
        for s in segs {
            entries.push(self.buffer(s.base as usize).ok_or(Fail::Code(UGDS_INVALID_VALUE))?);
        }
        let sio = self.stream_io(stream, &entries)?;
        let engine = h.storage.engine()?;
        let hold = Hold::new(h, entries);
        let job: StreamJob = Box::new(move || {
            let args = args;
            // SAFETY: the caller keeps the array and words valid until the stream passed this.
            let r = unsafe {
                let foff = std::ptr::read_volatile(args.file_offset);
                let snap: Vec<uGDSIoSegment> =
                    (0..args.nr as usize).map(|i| std::ptr::read_volatile(args.segs.add(i))).collect();
                self.rwv(write, fh, snap.as_ptr(), args.nr, foff)
            };
            let v = match r {
                Ok(n) => n as libc::ssize_t,
                Err(f) => f.ret_for(self.face),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile(args.bytes, v) };
            drop(hold);
        });
        sio.submit_jobs(&engine, vec![job]).map_err(Fail::Lib)
    }

    /// `ugdsxCpuStreamCreate`.
    pub fn cpu_stream_create(&self) -> CResult<usize> {
        Ok(self.streams.cpu.insert(CpuStream::new()?))
    }

    /// A CPU stream by handle.
    pub fn cpu_stream(&self, s: usize) -> CResult<Arc<CpuStream>> {
        self.streams.cpu.get(s).ok_or(Fail::Code(UGDS_INVALID_VALUE))
    }

    /// `ugdsxCpuStreamDestroy`: after its queued work.
    pub fn cpu_stream_destroy(&self, s: usize) -> CResult<()> {
        self.stream_forget(s);
        let c = self.streams.cpu.remove(s).ok_or(Fail::Code(UGDS_INVALID_VALUE))?;
        drop(c);
        Ok(())
    }
}

/// The device address of the first GPU buffer of `bufs`.
fn vendor_ptr(bufs: &[Arc<BufEntry>]) -> Option<u64> {
    bufs.iter().find_map(|b| match &b.mem {
        Memory::Gpu(m) => Some(m.device_ptr()),
        Memory::Host => None,
    })
}

/// The id of the context a CUDA default stream means on this thread (0: none current).
fn default_stream_context() -> u64 {
    #[cfg(feature = "cuda")]
    return crate::gpu::cuda::current_context_id();
    #[cfg(not(feature = "cuda"))]
    0
}

/// A stream value as the key the library uses.
pub fn key(stream: *mut c_void) -> usize {
    stream as usize
}

//! Contexts other than device 0's primary one: a context made with `cuCtxCreate` beside the
//! primary context on device 0 (what one GPU can show), and every device's primary context
//! where there are several GPUs. Each buffer must be served by its own context, each stream by
//! its own, and the caller's current context must be the same after every call.

use super::{ck, TempFile, SEED};
use cudarc::driver::sys as cu;
use std::sync::Arc;
use ugds::gpu::cuda::{self, PointerPlace};
use ugds::{pattern, AsyncArgs, AsyncParams, Gpu, Storage, StreamIo};

fn current() -> usize {
    let mut c = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { cu::cuCtxGetCurrent(&mut c) };
    c as usize
}

fn set_current(c: usize) {
    // SAFETY: a live context of this test (or null).
    ck("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(c as cu::CUcontext) });
}

/// A context of device 0 that is not its primary context; left current.
fn created_context() -> usize {
    let mut c = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; device 0 exists on the GPU machine.
    ck("cuCtxCreate", unsafe { cu::cuCtxCreate_v2(&mut c, 0, 0) });
    c as usize
}

/// `len` bytes of device memory allocated in context `c` (which is left current).
fn alloc_in(c: usize, len: usize) -> u64 {
    set_current(c);
    let mut p = 0;
    // SAFETY: out-pointer to a local; `c` is current.
    ck("cuMemAlloc", unsafe { cu::cuMemAlloc_v2(&mut p, len) });
    p
}

/// A non-blocking stream of context `c` (which is left current).
fn stream_in(c: usize) -> usize {
    set_current(c);
    let mut s = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; `c` is current.
    ck("cuStreamCreate", unsafe { cu::cuStreamCreate(&mut s, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) });
    s as usize
}

#[test]
#[ignore = "needs an NVIDIA GPU: run on the GPU machine with --ignored"]
fn cuda_a_created_context_serves_its_own_memory_and_streams() {
    let f = TempFile::new("contexts", 16 << 20);
    let st = Storage::open(f.path()).unwrap();
    let primary = Gpu::cuda_device(0).unwrap();
    let p0 = cuda::device_runtime(0).unwrap().0.context().raw();
    let x = created_context();
    let len = 2usize << 20;
    let px = alloc_in(x, len);
    let p_primary = alloc_in(p0, len);

    // Whose memory: the context that allocated it, whichever context is current.
    set_current(p0);
    assert_eq!(cuda::place_of_pointer(px).unwrap(), PointerPlace::Device { context: x, device: 0 });
    let gx = Gpu::of_pointer(px).unwrap().expect("device memory");
    assert_eq!(current(), p0, "asking whose memory changed the current context");
    assert!(!Arc::ptr_eq(&gx, &primary), "the created context's memory was given device 0's primary context");
    assert!(Arc::ptr_eq(&Gpu::of_pointer(p_primary).unwrap().unwrap(), &primary));
    assert!(Arc::ptr_eq(&Gpu::of_pointer(px + 4096).unwrap().unwrap(), &gx), "one Gpu per context");
    assert!(gx.runtime().is_device_memory(px) && !gx.runtime().is_device_memory(p_primary));
    assert!(Gpu::of_pointer(f.path().as_ptr() as u64).unwrap().is_none(), "host memory");

    // The calling thread's GPU: what is current on it.
    set_current(x);
    assert!(Arc::ptr_eq(&Gpu::cuda().unwrap(), &gx));
    set_current(p0);
    assert!(Arc::ptr_eq(&Gpu::cuda().unwrap(), &primary));

    // Staged I/O into the created context's memory, with the primary context current.
    // SAFETY: `px` is `len` bytes of gx's memory, never freed in this test.
    let mem = Arc::new(unsafe { gx.borrow(px, len) }.unwrap());
    let buf = Arc::new(st.register_gpu(mem.clone(), true).unwrap());
    assert_eq!(st.read(&buf, 0, 4 << 20, len as u64).unwrap(), len as u64);
    assert_eq!(current(), p0, "a read changed the current context");
    let mut got = vec![0u8; len];
    gx.download(&mem, 0, &mut got).unwrap();
    assert_eq!(pattern::first_mismatch(SEED, 4 << 20, &got), None);

    // A stream of the created context orders I/O there; the default stream means the thread's
    // current context.
    let sx = stream_in(x);
    set_current(p0);
    // SAFETY: `sx` lives until the end of the test.
    let (gs, s) = unsafe { cuda::wrap_stream(sx) }.unwrap();
    assert!(Arc::ptr_eq(&gs, &gx), "the stream was given another context");
    set_current(x);
    // SAFETY: the default stream, with x current.
    assert!(Arc::ptr_eq(&unsafe { cuda::wrap_stream(0) }.unwrap().0, &gx));
    set_current(p0);
    // SAFETY: as above, with p0 current.
    assert!(Arc::ptr_eq(&unsafe { cuda::wrap_stream(0) }.unwrap().0, &primary));
    let sio = StreamIo::new(s).unwrap();
    let args = AsyncArgs::new(len as u64, 8 << 20, 0);
    sio.read_async(&st, &buf, &args).unwrap();
    sio.synchronize().unwrap();
    assert_eq!(args.result(), len as i64);
    assert_eq!(current(), p0);
    gx.download(&mem, 0, &mut got).unwrap();
    assert_eq!(pattern::first_mismatch(SEED, 8 << 20, &got), None);

    // A buffer of the created context on a stream of the primary one: the stream orders it,
    // the buffer's own context moves the data.
    let s0 = stream_in(p0);
    // SAFETY: `s0` lives until the end of the test.
    let (_, s0w) = unsafe { cuda::wrap_stream(s0) }.unwrap();
    let sio0 = StreamIo::new(s0w).unwrap();
    let args = AsyncArgs::new(len as u64, 12 << 20, 0);
    sio0.read_async(&st, &buf, &args).unwrap();
    sio0.synchronize().unwrap();
    assert_eq!(args.result(), len as i64);
    gx.download(&mem, 0, &mut got).unwrap();
    assert_eq!(pattern::first_mismatch(SEED, 12 << 20, &got), None);
}

#[test]
#[ignore = "needs two NVIDIA GPUs: run on the two-GPU machine with --ignored"]
fn cuda_every_device_serves_its_own_memory_and_streams_from_its_own_thread() {
    let mut n = 0;
    // SAFETY: plain driver call.
    ck("cuInit", unsafe { cu::cuInit(0) });
    // SAFETY: out-pointer to a local.
    ck("cuDeviceGetCount", unsafe { cu::cuDeviceGetCount(&mut n) });
    if n < 2 {
        println!("SKIP: {n} GPU(s): the two-GPU machine runs this");
        return;
    }
    let f = Arc::new(TempFile::new("devices", 16 << 20));
    let st = Arc::new(Storage::open(f.path()).unwrap());
    let threads: Vec<_> = (0..n)
        .map(|d| {
            let st = st.clone();
            std::thread::spawn(move || {
                // cudaSetDevice(d) on this thread.
                let (cu_d, g) = cuda::device_runtime(d).unwrap();
                set_current(cu_d.context().raw());
                assert!(Arc::ptr_eq(&Gpu::cuda().unwrap(), &g), "device {d}: the thread's GPU");
                let len = 1usize << 20;
                let mem = Arc::new(g.alloc(len).unwrap());
                assert_eq!(
                    cuda::place_of_pointer(mem.device_ptr()).unwrap(),
                    PointerPlace::Device { context: cu_d.context().raw(), device: d }
                );
                let buf = Arc::new(st.register_gpu(mem.clone(), true).unwrap());
                let off = (d as u64) << 20;
                assert_eq!(st.read(&buf, 0, off, len as u64).unwrap(), len as u64);
                let mut got = vec![0u8; len];
                g.download(&mem, 0, &mut got).unwrap();
                assert_eq!(pattern::first_mismatch(SEED, off, &got), None, "device {d}: sync read");
                // SAFETY: the default stream of this thread's context.
                let (gs, s) = unsafe { cuda::wrap_stream(0) }.unwrap();
                assert!(Arc::ptr_eq(&gs, &g), "device {d}: the default stream's context");
                let sio = StreamIo::new(s).unwrap();
                let args = AsyncArgs::new(len as u64, (off + (8 << 20)) as i64, 0);
                sio.read_async(&st, &buf, &args).unwrap();
                sio.synchronize().unwrap();
                assert_eq!(args.result(), len as i64);
                g.download(&mem, 0, &mut got).unwrap();
                assert_eq!(pattern::first_mismatch(SEED, off + (8 << 20), &got), None, "device {d}: async");
                assert_eq!(current(), cu_d.context().raw(), "device {d}: the thread's context changed");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

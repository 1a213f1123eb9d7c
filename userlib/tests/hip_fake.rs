//! The HIP runtime (`gpu::hip`) against a fake `libamdhip64.so` (`tests/fake_hip/fake_hip.c`,
//! built here with gcc and loaded through `UGDS_HIP_LIBRARY`): loading and the error when the
//! library is absent, device memory round trips, the memory-type numbering of ROCm 5 and 6, a
//! file read and written from "device" memory on the fallback path, stream-ordered I/O on a HIP
//! stream with late-bound arguments (the uGDS C functions with the HIP backend: the `ugds-c` crate's
//! tests).
//!
//! No AMD GPU exists here: the fake implements the HIP calls over host memory, so these tests
//! check what ugds asks of the runtime (calls, arguments, order), not what a GPU does.

mod common;
#[path = "common/fake_hip.rs"]
mod fake_hip;
use common::TempFile;
use fake_hip::{fake_hip, fake_library};
use std::sync::{Arc, Mutex};
use ugds::gpu::hip::{Hip, LIBRARY_ENV};
use ugds::gpu::{Runtime, Vendor};
use ugds::{pattern, AsyncArgs, AsyncParams, Error, Gpu, Storage, Stream, StreamIo};

const SEED: u64 = 0x41d_f11e;

/// The fake runtime's `hipSetDevice` and `hipGetDevice`, called as an application would.
struct AppDevice {
    set: unsafe extern "C" fn(i32) -> i32,
    get: unsafe extern "C" fn(*mut i32) -> i32,
}

impl AppDevice {
    fn open() -> AppDevice {
        let path = std::ffi::CString::new(fake_library().to_str().unwrap()).unwrap();
        // SAFETY: the fake runtime, the library ugds loaded (dlopen hands back the same one);
        // never closed.
        let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!lib.is_null());
        // SAFETY: the fake's `hipError_t hipSetDevice(int)` and `hipError_t hipGetDevice(int *)`.
        unsafe {
            let set = libc::dlsym(lib, c"hipSetDevice".as_ptr());
            let get = libc::dlsym(lib, c"hipGetDevice".as_ptr());
            assert!(!set.is_null() && !get.is_null());
            AppDevice {
                set: std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn(i32) -> i32>(set),
                get: std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn(*mut i32) -> i32>(get),
            }
        }
    }

    fn set(&self, d: i32) {
        // SAFETY: plain runtime call.
        assert_eq!(unsafe { (self.set)(d) }, 0);
    }

    fn get(&self) -> i32 {
        let mut d = -1;
        // SAFETY: out-pointer to a local.
        assert_eq!(unsafe { (self.get)(&mut d) }, 0);
        d
    }
}

#[test]
fn the_fake_runtime_loads_and_names_its_device() {
    let _g = fake_hip();
    let gpu = Gpu::hip().unwrap();
    assert_eq!(gpu.runtime().vendor(), Vendor::Hip);
    assert_eq!(gpu.runtime().device_name(), "Fake HIP device (ugds tests)");
    let h = Hip::new(0).unwrap();
    assert_eq!(h.runtime_version(), 60032830);
    assert_eq!(h.library_path(), fake_library().to_str().unwrap());
    let e = Hip::new(1).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("no device 1 (1 found)"), "{e}");
}

#[test]
fn an_absent_library_is_an_unsupported_error_naming_it() {
    let _g = fake_hip();
    let missing = std::env::temp_dir().join("ugds-no-such-dir/libamdhip64.so");
    std::env::set_var(LIBRARY_ENV, &missing);
    let e = Gpu::hip().unwrap_err();
    std::env::set_var(LIBRARY_ENV, fake_library());
    let Error::Unsupported { what, why, fix } = &e else { panic!("expected Unsupported, got {e}") };
    assert_eq!(*what, "HIP");
    assert!(why.contains("libamdhip64.so") && why.contains("ugds-no-such-dir"), "{why}");
    assert!(fix.contains("UGDS_HIP_LIBRARY"), "{fix}");
    // A file that is not a HIP runtime is refused by its missing symbols.
    std::env::set_var(LIBRARY_ENV, "libc.so.6");
    let e = Gpu::hip().unwrap_err();
    std::env::set_var(LIBRARY_ENV, fake_library());
    assert!(e.to_string().contains("libc.so.6 has no hipInit"), "{e}");
}

#[test]
fn device_memory_round_trips_and_is_told_from_host_memory() {
    let _g = fake_hip();
    let gpu = Gpu::hip().unwrap();
    let mem = gpu.alloc(3 << 20).unwrap();
    let mut data = vec![0u8; 3 << 20];
    pattern::fill(5, 0, &mut data);
    gpu.upload(&mem, 0, &data).unwrap();
    let mut back = vec![0u8; 1 << 20];
    gpu.download(&mem, 1 << 20, &mut back).unwrap();
    assert_eq!(back, data[1 << 20..2 << 20]);
    let rt = gpu.runtime();
    assert!(rt.is_device_memory(mem.device_ptr()));
    assert!(rt.is_device_memory(mem.device_ptr() + 12345), "an interior address");
    assert!(!rt.is_device_memory(data.as_ptr() as u64), "ordinary host memory");
    let pinned = gpu.alloc_pinned(4096).unwrap();
    assert!(!rt.is_device_memory(pinned.as_ptr() as u64), "pinned host memory");
    assert!(!rt.is_device_memory(0));
    let p = mem.device_ptr();
    drop(mem);
    assert!(!rt.is_device_memory(p), "freed memory");
    // The fake has no dma-buf exporter: export fails with the runtime's error, named.
    assert!(rt.dmabuf_support().is_ok(), "the symbol is there");
    let m = gpu.alloc(1 << 20).unwrap();
    let e = m.export_dmabuf().unwrap_err();
    assert!(e.to_string().contains("hipMemGetHandleForAddressRange failed: hipErrorNotSupported"), "{e}");
}

/// Two devices: memory and streams of device N are served on device N whatever device the
/// calling thread selected, and the thread's own device is the same after every call. The fake
/// refuses a copy on a stream whose device is not current, so a call that forgets to select
/// its device fails too.
#[test]
fn each_call_runs_on_its_memorys_device_and_the_callers_device_is_kept() {
    use ugds::gpu::hip;
    let _g = fake_hip();
    std::env::set_var("FAKE_HIP_DEVICES", "2");
    let app = AppDevice::open();
    let f = TempFile::new("hip-devices", 16 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    app.set(1);
    let (h0, g0) = hip::device_runtime(0).unwrap();
    assert_eq!(app.get(), 1, "opening device 0 changed the thread's device");
    assert!(Arc::ptr_eq(&Gpu::hip().unwrap(), &hip::device_gpu(1).unwrap()), "the thread's device");
    let g1 = Gpu::hip_device(1).unwrap();
    assert!(!Arc::ptr_eq(&g0, &g1));
    let m0 = Arc::new(g0.alloc(4 << 20).unwrap());
    assert_eq!(app.get(), 1, "an allocation on device 0 changed the thread's device");
    app.set(0);
    assert!(Arc::ptr_eq(&Gpu::hip().unwrap(), &g0));
    let m1 = Arc::new(g1.alloc(4 << 20).unwrap());
    assert_eq!(app.get(), 0);
    assert!(Arc::ptr_eq(&hip::gpu_of_pointer(m0.device_ptr()).unwrap().unwrap(), &g0));
    assert!(Arc::ptr_eq(&hip::gpu_of_pointer(m1.device_ptr() + 4096).unwrap().unwrap(), &g1));

    // Staged reads and writes of each device's memory with the other device current.
    let mut bufs = Vec::new();
    for (m, caller, at) in [(&m0, 1, 1u64 << 20), (&m1, 0, 2 << 20)] {
        app.set(caller);
        let buf = Arc::new(st.register_gpu(m.clone(), true).unwrap());
        assert_eq!(st.read(&buf, 0, at, 3 << 20).unwrap(), 3 << 20);
        assert_eq!(app.get(), caller, "a staged read changed the thread's device");
        let mut out = vec![0u8; 3 << 20];
        m.gpu().download(m, 0, &mut out).unwrap();
        assert_eq!(app.get(), caller, "a download changed the thread's device");
        assert_eq!(pattern::first_mismatch(SEED, at, &out), None);
        assert_eq!(st.write(&buf, 0, at + (8 << 20), 3 << 20).unwrap(), 3 << 20);
        assert_eq!(app.get(), caller, "a staged write changed the thread's device");
        bufs.push(buf);
    }
    st.flush().unwrap();
    let back = std::fs::read(f.path()).unwrap();
    assert_eq!(pattern::first_mismatch(SEED, 1 << 20, &back[9 << 20..12 << 20]), None);
    assert_eq!(pattern::first_mismatch(SEED, 2 << 20, &back[10 << 20..13 << 20]), None);

    // A stream of device 0, made and used with device 1 current: it belongs to device 0, orders
    // I/O there, and a buffer of device 1 on it is moved by device 1 (as CUDA does it: the
    // stream orders, the memory's own device copies).
    app.set(1);
    let s0 = h0.stream().unwrap();
    assert_eq!(app.get(), 1, "making a stream changed the thread's device");
    let (h, g) = hip::stream_runtime(s0.raw()).unwrap().expect("the fake has hipStreamGetDevice");
    assert!(Arc::ptr_eq(&g, &g0) && h.ordinal() == 0, "the stream was given another device");
    // SAFETY: `s0` is a stream of device 0 and outlives `wrapped`.
    let wrapped = unsafe { h.wrap_stream(s0.raw()) };
    let sio = StreamIo::new(wrapped).unwrap();
    for (buf, m, at) in [(&bufs[0], &m0, 4u64 << 20), (&bufs[1], &m1, 5 << 20)] {
        let args = AsyncArgs::new(1 << 20, at as i64, 0);
        sio.read_async(&st, buf, &args).unwrap();
        sio.synchronize().unwrap();
        assert_eq!(args.result(), 1 << 20);
        assert_eq!(app.get(), 1, "stream-ordered I/O changed the thread's device");
        let mut out = vec![0u8; 1 << 20];
        m.gpu().download(m, 0, &mut out).unwrap();
        assert_eq!(pattern::first_mismatch(SEED, at, &out), None);
    }
    drop(sio);
    drop(s0);
    assert_eq!(app.get(), 1, "destroying a stream changed the thread's device");
    drop(bufs);
    drop((m0, m1));
    assert_eq!(app.get(), 1, "freeing memory changed the thread's device");
    app.set(0);
    std::env::remove_var("FAKE_HIP_DEVICES");
}

/// ROCm 5 numbers `hipMemoryType` differently (Device = 1, which is ROCm 6's Host): the
/// runtime's version picks the numbering, so each version recognises its own answers only.
#[test]
fn memory_types_follow_the_runtime_versions_numbering() {
    let _g = fake_hip();
    let v6 = Hip::new(0).unwrap();
    std::env::set_var("FAKE_HIP_RUNTIME_VERSION", "50731921");
    let v5 = Hip::new(0).unwrap();
    assert_eq!(v5.runtime_version(), 50731921);
    let dev = v5.alloc(8192).unwrap();
    let pinned = v5.alloc_pinned(4096).unwrap();
    let host = [0u8; 64];
    // The fake now answers in ROCm 5's numbering.
    assert!(v5.is_device_memory(dev));
    assert!(!v5.is_device_memory(pinned as u64), "ROCm 5 Host (0)");
    assert!(!v5.is_device_memory(host.as_ptr() as u64), "unknown pointers are an error in ROCm 5");
    assert!(!v6.is_device_memory(dev), "ROCm 5's Device (1) is ROCm 6's Host");
    std::env::remove_var("FAKE_HIP_RUNTIME_VERSION");
    assert!(v6.is_device_memory(dev));
    assert!(!v5.is_device_memory(dev), "ROCm 6's Device (2) is ROCm 5's Array");
    assert!(!v6.is_device_memory(pinned as u64), "ROCm 6 Host (1)");
    v6.free_pinned(pinned, 4096);
    v6.free(dev, 8192);
}

#[test]
fn a_file_is_read_into_and_written_from_hip_memory_on_the_fallback_path() {
    let _g = fake_hip();
    let f = TempFile::new("hip-file", 16 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let gpu = Gpu::hip().unwrap();
    let mem = Arc::new(gpu.alloc(8 << 20).unwrap());
    let buf = st.register_gpu(mem.clone(), true).unwrap();
    assert_eq!(buf.path(), ugds::Path::Fallback);
    for (len, off, boff) in [(4096u64, 0u64, 0u64), (3 << 20, 1 << 20, 4096), (5 << 20, 7 << 20, 0)] {
        assert_eq!(st.read(&buf, boff, off, len).unwrap(), len);
        let mut out = vec![0u8; len as usize];
        gpu.download(&mem, boff as usize, &mut out).unwrap();
        assert_eq!(pattern::first_mismatch(SEED, off, &out), None, "{len} bytes at {off} into +{boff}");
    }
    // A write of several staging chunks from device memory, read back through the kernel.
    let mut data = vec![0u8; 5 << 20];
    pattern::fill(7, 0, &mut data);
    gpu.upload(&mem, 0, &data).unwrap();
    assert_eq!(st.write(&buf, 0, 4 << 20, 5 << 20).unwrap(), 5 << 20);
    st.flush().unwrap();
    let back = std::fs::read(f.path()).unwrap();
    assert_eq!(&back[4 << 20..9 << 20], &data[..]);
    assert_eq!(pattern::first_mismatch(SEED, 0, &back[..4 << 20]), None, "bytes before the write are untouched");
}

/// uGDS maps unregistered GPU memory for one call only from a 64 KiB GPU page boundary and
/// refuses the rest with -EINVAL (uGDS's own test_alignment_errors asks this); the refused read
/// changes nothing.
#[test]
fn ugds_refuses_unregistered_gpu_memory_off_a_gpu_page() {
    let _g = fake_hip();
    let f = TempFile::new("hip-onthefly", 1 << 20, SEED);
    let file = std::fs::File::open(f.path()).unwrap();
    let lib: &'static ugds::capi::Library = Box::leak(Box::new(ugds::capi::Library::new(ugds::capi::Face::Ugds)));
    lib.driver_open().unwrap();
    let h = lib.handle_register(std::os::fd::AsRawFd::as_raw_fd(&file)).unwrap();
    let gpu = Gpu::hip().unwrap();
    let mem = gpu.alloc(256 << 10).unwrap();
    let page = (mem.device_ptr() as usize).next_multiple_of(64 << 10);
    let base = mem.device_ptr() as usize;
    gpu.upload(&mem, 0, &vec![0u8; 256 << 10]).unwrap();
    // SAFETY: `page + 4096` lies in the 256 KiB allocation (at most 64 KiB past its start).
    let bad = unsafe { lib.rw(false, h, page, 4096, 0, 4096) };
    assert_eq!(bad.map_err(|e| e.ret()), Err(-(libc::EINVAL as isize)), "4 KiB past a GPU page");
    let mut out = vec![0u8; 256 << 10];
    gpu.download(&mem, 0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0), "the refused read wrote nothing");
    // SAFETY: as above.
    let n = unsafe { lib.rw(false, h, page, 4096, 8192, 0) }.unwrap();
    assert_eq!(n, 4096);
    gpu.download(&mem, page - base, &mut out[..4096]).unwrap();
    assert_eq!(pattern::first_mismatch(SEED, 8192, &out[..4096]), None);
    lib.handle_deregister(h, -1).unwrap();
}

/// Stream-ordered reads on a HIP stream the "application" made (wrapped, not owned): each op's
/// arguments are set by stream work queued just before it, and stream work after it sees its
/// result, in order.
#[test]
fn stream_ordered_io_on_a_hip_stream_binds_arguments_late() {
    let _g = fake_hip();
    let f = TempFile::new("hip-stream", 4 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let hip = Arc::new(Hip::new(0).unwrap());
    let gpu = Gpu::with_runtime(hip.clone());
    let mem = Arc::new(gpu.alloc(32 * 4096).unwrap());
    let buf = Arc::new(st.register_gpu(mem.clone(), true).unwrap());
    let app = hip.stream().unwrap();
    // SAFETY: `app` is a stream of this device and outlives `stream`.
    let stream = unsafe { hip.wrap_stream(app.raw()) };
    let sio = StreamIo::new(stream.clone()).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut all = Vec::new();
    for i in 0..32u64 {
        let args = AsyncArgs::new(0, -1, -1);
        let a = args.clone();
        let bad = i == 9;
        stream
            .host_fn(Box::new(move || {
                a.set(if bad { 1000 } else { 4096 }, (i as i64 * 5 % 1000) * 4096, i as i64 * 4096)
            }))
            .unwrap();
        sio.read_async(&st, &buf, &args).unwrap();
        let (a, l) = (args.clone(), log.clone());
        stream.host_fn(Box::new(move || l.lock().unwrap().push((i, a.result())))).unwrap();
        all.push(args);
    }
    sio.synchronize().unwrap();
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 32);
    for (k, &(i, r)) in log.iter().enumerate() {
        assert_eq!(i, k as u64, "stream order");
        if i == 9 {
            assert_eq!(r, -(libc::EINVAL as i64), "the invalid size is reported in the result slot");
        } else {
            assert_eq!(r, 4096, "op {i}");
        }
    }
    for i in (0..32u64).filter(|&i| i != 9) {
        let mut out = vec![0u8; 4096];
        gpu.download(&mem, i as usize * 4096, &mut out).unwrap();
        assert_eq!(pattern::first_mismatch(SEED, (i * 5 % 1000) * 4096, &out), None, "op {i}'s data");
    }
    drop(sio);
    drop(stream);
    app.synchronize().unwrap();
}

/// The stream's wait must hold later work until the word reaches the value, also across the
/// 32-bit wrap, where HIP's non-cyclic `>=` alone would let it through early.
#[test]
fn waits_hold_the_stream_across_the_wrap_of_the_word() {
    let _g = fake_hip();
    let hip = Hip::new(0).unwrap();
    let s = hip.stream().unwrap();
    let w = s.completion_word().unwrap();
    for (start, target) in [(5u32, 9u32), (u32::MAX - 2, 1), (0x7fff_fff0, 0x8000_0003)] {
        w.store(start);
        let ran = Arc::new(Mutex::new(false));
        s.wait_word(&w, target).unwrap();
        let r = ran.clone();
        s.host_fn(Box::new(move || *r.lock().unwrap() = true)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!*ran.lock().unwrap(), "{start} -> {target}: still waiting");
        w.store(target.wrapping_sub(1));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!*ran.lock().unwrap(), "{start} -> {target}: one short");
        w.store(target);
        s.synchronize().unwrap();
        assert!(*ran.lock().unwrap(), "{start} -> {target}: released");
    }
}

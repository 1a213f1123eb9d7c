//! The uGDS C functions against a fake HIP runtime (`ugds`'s `tests/fake_hip/fake_hip.c`): HIP
//! memory registered, read into, and stream-ordered I/O on a HIP stream. No AMD GPU exists here:
//! the fake implements the HIP calls over host memory.

#[path = "../../userlib/tests/common/mod.rs"]
mod common;
#[path = "../../userlib/tests/common/fake_hip.rs"]
mod fake_hip;
use common::TempFile;
use fake_hip::fake_hip;
use ugds::gpu::hip::Hip;
use ugds::{pattern, Gpu, Stream};

const SEED: u64 = 0x41d_f11e;

/// The uGDS C functions with HIP memory and a HIP stream (called directly: they are the same
/// functions libugds.so exports).
#[test]
fn the_ugds_c_api_registers_hip_memory_and_streams() {
    use std::os::fd::AsRawFd;
    use ugds::capi::uGDSOpError::*;
    use ugds::capi::*;
    use ugds_c::*;
    let _g = fake_hip();
    let f = TempFile::new("hip-capi", 4 << 20, SEED);
    let file = std::fs::OpenOptions::new().read(true).write(true).open(f.path()).unwrap();
    let gpu = Gpu::hip().unwrap();
    let mem = gpu.alloc(1 << 20).unwrap();
    let mem2 = gpu.alloc(1 << 20).unwrap();
    let host = Box::new([0u8; 8192]);
    let (p, p2) = (mem.device_ptr() as *mut std::ffi::c_void, mem2.device_ptr() as *mut std::ffi::c_void);
    assert_eq!(uGDSDriverOpen().err, UGDS_SUCCESS);
    let mut descr = uGDSDescr_t {
        type_: HandleTypeField(uGDSHandleType::UGDS_HANDLE_TYPE_OPAQUE_FD as i32),
        handle: uGDSDescrHandle { fd: file.as_raw_fd() },
    };
    let mut fh: uGDSHandle_t = std::ptr::null_mut();
    // SAFETY: valid pointers to locals.
    assert_eq!(unsafe { uGDSHandleRegister(&mut fh, &mut descr) }.err, UGDS_SUCCESS);
    let hip_cfg =
        uGDSBufConfig_t { backend: BackendArg(uGDSBackend::UGDS_BACKEND_HIP as i32), enable_export: BoolField(0) };
    // SAFETY: device memory that outlives its registration; a valid config.
    unsafe {
        assert_eq!(uGDSBufRegisterEx(p, 1 << 20, &hip_cfg).err, UGDS_SUCCESS);
        assert_eq!(uGDSBufRegister(p2, 1 << 20, NVM_MAP_DMABUF).err, UGDS_SUCCESS);
        assert_eq!(
            uGDSBufRegisterEx(host.as_ptr() as *const _, 4096, &hip_cfg).err,
            UGDS_CUDA_MEMORY_TYPE_INVALID,
            "host memory is not HIP memory"
        );
        assert_eq!(uGDSBufRegister(host.as_ptr() as *const _, 4096, NVM_MAP_DMABUF).err, UGDS_CUDA_MEMORY_TYPE_INVALID);
    }
    // Synchronous I/O into the registered HIP memory (staged: the fallback path).
    // SAFETY: registered memory, in range.
    assert_eq!(unsafe { uGDSRead(fh, p, 65536, 8192, 4096) }, 65536);
    let mut out = vec![0u8; 65536];
    gpu.download(&mem, 4096, &mut out).unwrap();
    assert_eq!(pattern::first_mismatch(SEED, 8192, &out), None);
    // Stream-ordered I/O on a HIP stream, arguments set by stream work before it.
    let hip = Hip::new(0).unwrap();
    let s = hip.stream().unwrap();
    let raw = s.raw() as *mut std::ffi::c_void;
    assert_eq!(uGDSStreamRegisterEx(raw, BackendArg(uGDSBackend::UGDS_BACKEND_HIP as i32)).err, UGDS_SUCCESS);
    struct Late {
        size: usize,
        foff: libc::off_t,
        boff: libc::off_t,
        bytes: libc::ssize_t,
    }
    let late = Box::into_raw(Box::new(Late { size: 0, foff: -1, boff: -1, bytes: 0 }));
    let addr = late as usize;
    s.host_fn(Box::new(move || {
        // SAFETY: the box lives until after the stream is synchronized below; only the stream
        // touches it meanwhile.
        let l = unsafe { &mut *(addr as *mut Late) };
        (l.size, l.foff, l.boff) = (131072, 1 << 20, 0);
    }))
    .unwrap();
    // SAFETY: the words stay valid until the stream is synchronized.
    let r = unsafe {
        uGDSReadAsync(fh, p2, &mut (*late).size, &mut (*late).foff, &mut (*late).boff, &mut (*late).bytes, raw)
    };
    assert_eq!(r.err, UGDS_SUCCESS);
    s.synchronize().unwrap();
    // SAFETY: the stream has passed the operation; nothing else uses the box.
    let late = unsafe { Box::from_raw(late) };
    assert_eq!(late.bytes, 131072);
    let mut out = vec![0u8; 131072];
    gpu.download(&mem2, 0, &mut out).unwrap();
    assert_eq!(pattern::first_mismatch(SEED, 1 << 20, &out), None);
    assert_eq!(uGDSStreamDeregister(raw).err, UGDS_SUCCESS);
    assert_eq!(uGDSBufDeregister(p).err, UGDS_SUCCESS);
    assert_eq!(uGDSBufDeregister(p2).err, UGDS_SUCCESS);
    uGDSHandleDeregister(fh);
    assert_eq!(uGDSDriverClose().err, UGDS_SUCCESS);
}

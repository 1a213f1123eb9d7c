//! CUDA tests: they need an NVIDIA GPU and driver, so they are `#[ignore]`d here and run on the
//! GPU machine with `--ignored` (see README, "GPU machine"). There is no NVMe there: I/O takes
//! the fallback path on a file, and the direct path's dma-buf step is checked by exporting.

use cudarc::driver::sys as cu;
use std::ffi::c_void;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::batch::{IoStatus, Op};
use ugds::gpu::cuda::Cuda;
use ugds::{pattern, AsyncArgs, AsyncOp, AsyncParams, Gpu, IoRequest, Path, Storage, StorageBatch, StreamIo};

#[path = "cuda/contexts.rs"]
mod contexts;

const SEED: u64 = 0xc0da;

/// Test kernels, in PTX so that no compiler is needed: `delay` spins for a number of clock
/// cycles, `fill` writes a pattern of u32s, `compare` counts differing u32s.
const PTX: &str = r#"
.version 7.0
.target sm_75
.address_size 64

.visible .entry delay(.param .u64 cycles)
{
    .reg .pred %p;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [cycles];
    mov.u64 %rd2, %clock64;
LOOP:
    mov.u64 %rd3, %clock64;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.s64 %p, %rd4, %rd1;
    @%p bra LOOP;
    ret;
}

.visible .entry fill(.param .u64 p, .param .u32 n, .param .u32 seed)
{
    .reg .pred %p;
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [n];
    ld.param.u32 %r2, [seed];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r6, %r3, %r4, %r5;
    setp.ge.u32 %p, %r6, %r1;
    @%p bra DONE;
    mul.lo.u32 %r7, %r6, 0x9E3779B1;
    xor.b32 %r7, %r7, %r2;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r6, 4;
    add.s64 %rd2, %rd2, %rd3;
    st.global.u32 [%rd2], %r7;
DONE:
    ret;
}

.visible .entry compare(.param .u64 a, .param .u64 b, .param .u32 n, .param .u64 out)
{
    .reg .pred %p;
    .reg .b32 %r<10>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [a];
    ld.param.u64 %rd2, [b];
    ld.param.u32 %r1, [n];
    ld.param.u64 %rd3, [out];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r6, %r3, %r4, %r5;
    setp.ge.u32 %p, %r6, %r1;
    @%p bra DONE;
    mul.wide.u32 %rd4, %r6, 4;
    cvta.to.global.u64 %rd5, %rd1;
    add.s64 %rd5, %rd5, %rd4;
    ld.global.u32 %r7, [%rd5];
    cvta.to.global.u64 %rd6, %rd2;
    add.s64 %rd6, %rd6, %rd4;
    ld.global.u32 %r8, [%rd6];
    setp.eq.u32 %p, %r7, %r8;
    @%p bra DONE;
    cvta.to.global.u64 %rd7, %rd3;
    atom.global.add.u32 %r9, [%rd7], 1;
DONE:
    ret;
}
"#;

fn ck(op: &str, r: cu::CUresult) {
    assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "{op}");
}

struct Kernels {
    delay: cu::CUfunction,
    fill: cu::CUfunction,
    compare: cu::CUfunction,
}

impl Kernels {
    fn load(c: &Cuda) -> Kernels {
        c.bind().unwrap();
        let src = std::ffi::CString::new(PTX).unwrap();
        let mut m = std::ptr::null_mut();
        // SAFETY: a NUL-terminated PTX image; the context is current.
        unsafe {
            ck("cuModuleLoadData", cu::cuModuleLoadData(&mut m, src.as_ptr() as *const c_void));
            let get = |name: &std::ffi::CStr| {
                let mut f = std::ptr::null_mut();
                ck("cuModuleGetFunction", cu::cuModuleGetFunction(&mut f, m, name.as_ptr()));
                f
            };
            Kernels { delay: get(c"delay"), fill: get(c"fill"), compare: get(c"compare") }
        }
    }

    fn launch(&self, f: cu::CUfunction, stream: usize, blocks: u32, params: &mut [*mut c_void]) {
        // SAFETY: parameters match the kernel's signature (pointers to locals of the caller).
        ck("cuLaunchKernel", unsafe {
            cu::cuLaunchKernel(
                f,
                blocks,
                1,
                1,
                256,
                1,
                1,
                0,
                stream as cu::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
    }

    fn delay(&self, stream: usize, cycles: u64) {
        let mut c = cycles;
        self.launch(self.delay, stream, 1, &mut [&mut c as *mut u64 as *mut c_void]);
    }

    fn fill(&self, stream: usize, p: u64, words: u32, seed: u32) {
        let (mut p, mut n, mut s) = (p, words, seed);
        self.launch(
            self.fill,
            stream,
            words.div_ceil(256),
            &mut [
                &mut p as *mut u64 as *mut c_void,
                &mut n as *mut u32 as *mut c_void,
                &mut s as *mut u32 as *mut c_void,
            ],
        );
    }

    fn compare(&self, stream: usize, a: u64, b: u64, words: u32, out: u64) {
        let (mut a, mut b, mut n, mut o) = (a, b, words, out);
        self.launch(
            self.compare,
            stream,
            words.div_ceil(256),
            &mut [
                &mut a as *mut u64 as *mut c_void,
                &mut b as *mut u64 as *mut c_void,
                &mut n as *mut u32 as *mut c_void,
                &mut o as *mut u64 as *mut c_void,
            ],
        );
    }
}

/// The words `fill` writes.
fn filled(words: usize, seed: u32) -> Vec<u8> {
    (0..words as u32).flat_map(|i| (i.wrapping_mul(0x9E37_79B1) ^ seed).to_le_bytes()).collect()
}

struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, len: usize) -> TempFile {
        let dir =
            std::env::var("UGDS_TEST_DIR").unwrap_or_else(|_| std::env::temp_dir().to_string_lossy().into_owned());
        let p = std::path::Path::new(&dir).join(format!("ugds-cuda-{name}-{}", std::process::id()));
        let mut f = std::fs::File::create(&p).unwrap();
        let mut chunk = vec![0u8; 8 << 20];
        let mut off = 0;
        while off < len {
            let n = chunk.len().min(len - off);
            pattern::fill(SEED, off as u64, &mut chunk[..n]);
            f.write_all(&chunk[..n]).unwrap();
            off += n;
        }
        f.sync_all().unwrap();
        TempFile(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run on the GPU machine with --ignored"]
fn cuda_dmabuf_export_of_device_memory() {
    let gpu = Gpu::cuda().unwrap();
    println!("device: {}", gpu.runtime().device_name());
    println!("dma-buf support: {:?}", gpu.runtime().dmabuf_support());
    for len in [2 << 20, 64 << 20] {
        let m = gpu.alloc(len).unwrap();
        let fd = m.export_dmabuf().unwrap();
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        // SAFETY: lseek on a descriptor we own; a dma-buf reports its size at SEEK_END.
        let size = unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_END) };
        println!("exported {len} bytes: fd {} -> {} (size {size})", fd.as_raw_fd(), link.display());
        assert!(link.to_string_lossy().contains("dmabuf"), "{}", link.display());
        assert_eq!(size as usize, len);
    }
    let m = gpu.alloc(8192).unwrap();
    assert!(matches!(
        gpu.runtime().export_dmabuf(m.device_ptr() + 512, 4096),
        Err(ugds::Error::InvalidArgument { arg: "ptr", .. })
    ));
}

#[test]
#[ignore = "needs an NVIDIA GPU: run on the GPU machine with --ignored"]
fn cuda_fallback_moves_correct_data_sync_and_batch() {
    let f = TempFile::new("sync", 160 << 20);
    let st = Storage::open(f.path()).unwrap();
    let gpu = Gpu::cuda().unwrap();
    let mem = Arc::new(gpu.alloc(64 << 20).unwrap());
    let buf = Arc::new(st.register_gpu(mem, false).unwrap());
    assert_eq!(buf.path(), Path::Fallback);
    for len in [4usize << 10, 64 << 10, 1 << 20, 3 << 20, 16 << 20, 64 << 20] {
        let off = 4096 * 7;
        let t = Instant::now();
        assert_eq!(st.read(&buf, 0, off, len as u64).unwrap(), len as u64);
        let el = t.elapsed();
        let mut out = vec![0u8; len];
        buf.copy_out(0, &mut out).unwrap();
        assert_eq!(pattern::first_mismatch(SEED, off, &out), None, "read {len}");
        // Write it elsewhere from GPU memory, read it back through the kernel.
        let woff = 80u64 << 20;
        let mut data = vec![0u8; len];
        pattern::fill(len as u64, 0, &mut data);
        buf.copy_in(0, &data).unwrap();
        assert_eq!(st.write(&buf, 0, woff, len as u64).unwrap(), len as u64);
        st.flush().unwrap();
        let back = std::fs::read(f.path()).unwrap();
        assert_eq!(&back[woff as usize..woff as usize + len], &data[..], "write {len}");
        println!("sync {len:>9} bytes: read {:?}, data checked both ways", el);
    }
    // Batch: 64 entries of mixed sizes into GPU memory, one invalid.
    let mut b = StorageBatch::new(&st, 64).unwrap();
    let mut reqs = Vec::new();
    let mut at = 0u64;
    for i in 0..64u64 {
        let len = [4096u64, 65536, 1 << 20][(i % 3) as usize];
        reqs.push(IoRequest {
            op: Op::Read,
            buf: buf.clone(),
            buf_offset: at,
            file_offset: (i * 1_048_576) % (64 << 20),
            len,
            cookie: i,
        });
        at += len;
    }
    reqs[9].file_offset = 1;
    b.submit(&reqs).unwrap();
    let mut ev = Vec::new();
    while ev.len() < 64 {
        ev.extend(b.status(64, Duration::from_secs(30)).unwrap());
    }
    let mut out = vec![0u8; at as usize];
    buf.copy_out(0, &mut out).unwrap();
    for e in &ev {
        let r = &reqs[e.cookie as usize];
        if e.cookie == 9 {
            assert_eq!(e.status, IoStatus::Invalid);
            continue;
        }
        assert_eq!(e.status, IoStatus::Complete, "{e:?}");
        let got = &out[r.buf_offset as usize..(r.buf_offset + r.len) as usize];
        assert_eq!(pattern::first_mismatch(SEED, r.file_offset, got), None, "entry {}", e.cookie);
    }
    println!("batch: 63 entries complete and correct, 1 invalid; paths {:?}", st.path_counts());
}

#[test]
#[ignore = "needs an NVIDIA GPU: run on the GPU machine with --ignored"]
fn cuda_stream_orders_io_between_kernels() {
    let f = TempFile::new("stream", 64 << 20);
    let st = Storage::open(f.path()).unwrap();
    let cuda = Arc::new(Cuda::new(0).unwrap());
    let gpu = Gpu::with_runtime(cuda.clone());
    let k = Kernels::load(&cuda);
    let stream = cuda.stream().unwrap();
    let raw = ugds::Stream::raw(&*stream);
    let sio = StreamIo::new(stream.clone()).unwrap();
    let len = 4usize << 20;
    let words = (len / 4) as u32;
    let a = Arc::new(gpu.alloc(len).unwrap());
    let b = Arc::new(gpu.alloc(len).unwrap());
    let out = Arc::new(gpu.alloc(4096).unwrap());
    gpu.upload(&out, 0, &[0u8; 4]).unwrap();
    gpu.upload(&b, 0, &vec![0xEEu8; len]).unwrap();
    let (abuf, bbuf) =
        (Arc::new(st.register_gpu(a.clone(), false).unwrap()), Arc::new(st.register_gpu(b.clone(), false).unwrap()));

    // Arguments are wrong when queued and set afterwards, while the stream is still busy.
    let w = AsyncArgs::new(0, -1, -1);
    let r = AsyncArgs::new(0, -1, -1);
    let bad = AsyncArgs::new(100, 0, 0);
    for x in [&w, &r, &bad] {
        x.bytes.store(-999, std::sync::atomic::Ordering::Release);
    }
    let t0 = Instant::now();
    k.delay(raw, 400_000_000); // ~0.2 s: the I/O below must wait for it
    k.fill(raw, a.device_ptr(), words, 0x1234_5678);
    sio.write_async(&st, &abuf, &w).unwrap();
    sio.read_async(&st, &bbuf, &bad).unwrap();
    sio.read_async(&st, &bbuf, &r).unwrap();
    k.compare(raw, a.device_ptr(), b.device_ptr(), words, out.device_ptr());
    let queued = t0.elapsed();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(w.result(), -999, "the write ran before the kernels queued ahead of it");
    w.set(len as u64, 32 << 20, 0);
    r.set(len as u64, 32 << 20, 0);
    sio.synchronize().unwrap();
    let total = t0.elapsed();
    // The stream itself writes the word that says it passed every group (no host function).
    assert!(sio.idle(), "the stream passed its groups but did not say so");
    assert_eq!(w.result(), len as i64);
    assert_eq!(bad.result(), -(libc::EINVAL as i64), "an invalid size is reported in the result slot");
    assert_eq!(r.result(), len as i64, "the op after the failed one still ran");
    let mut mism = [0u8; 4];
    gpu.download(&out, 0, &mut mism).unwrap();
    assert_eq!(u32::from_le_bytes(mism), 0, "the kernel after the read saw the data the kernel before the write made");
    let disk = std::fs::read(f.path()).unwrap();
    assert_eq!(
        &disk[32 << 20..(32 << 20) + len],
        &filled(len / 4, 0x1234_5678)[..],
        "the file holds the kernel's output"
    );
    println!("queued in {queued:?}; kernel→write→read(invalid)→read→kernel done in {total:?}");

    // A group of 8 reads overlaps; 8 single reads run one after another. Same bytes.
    let group: Vec<AsyncOp> = (0..8)
        .map(|i| AsyncOp {
            op: Op::Read,
            buf: bbuf.clone(),
            args: AsyncArgs::new(512 << 10, i * (512 << 10), i * (512 << 10)),
        })
        .collect();
    let t = Instant::now();
    for _ in 0..20 {
        sio.submit(&st, &group).unwrap();
    }
    sio.synchronize().unwrap();
    let grouped = t.elapsed();
    let t = Instant::now();
    for _ in 0..20 {
        for g in &group {
            sio.submit(&st, std::slice::from_ref(g)).unwrap();
        }
    }
    sio.synchronize().unwrap();
    let single = t.elapsed();
    assert!(group.iter().all(|g| g.args.result() == 512 << 10));
    let mut got = vec![0u8; 4 << 20];
    bbuf.copy_out(0, &mut got).unwrap();
    assert_eq!(pattern::first_mismatch(SEED, 0, &got), None);
    println!(
        "20 x 8 x 512 KiB: grouped {grouped:?}, one by one {single:?} ({:.2}x)",
        single.as_secs_f64() / grouped.as_secs_f64()
    );
}

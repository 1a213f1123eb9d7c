//! The portable layer on the fallback path, on the host (no VM, no GPU): a real file with
//! O_DIRECT through io_uring, the CPU stand-in GPU runtime (staging pipeline), portable batches
//! and stream-ordered I/O on a CPU stream.

mod common;
use common::TempFile;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ugds::batch::{IoStatus, Op};
use ugds::{
    pattern, AsyncArgs, AsyncOp, AsyncParams, CpuStream, Error, Gpu, IoRequest, Path, Storage, StorageBatch, StreamIo,
};

const SEED: u64 = 0x5eed_f11e;

fn invalid_arg(e: Error) -> &'static str {
    match e {
        Error::InvalidArgument { arg, .. } => arg,
        other => panic!("expected an invalid-argument error, got {other}"),
    }
}

#[test]
fn host_and_staged_gpu_memory_read_and_write_a_file() {
    let f = TempFile::new("sync", 16 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    assert!(!st.is_direct());
    assert_eq!(st.capacity().unwrap(), 16 << 20);
    let host = st.alloc_host(8 << 20).unwrap();
    assert_eq!(host.path(), Path::Fallback);
    let gpu = Gpu::cpu();
    let gmem = Arc::new(gpu.alloc(8 << 20).unwrap());
    let gbuf = st.register_gpu(gmem, false).unwrap();
    for (len, off, boff) in [(4096u64, 0u64, 0u64), (65536, 8192, 4096), (3 << 20, 1 << 20, 512), (5 << 20, 7 << 20, 0)]
    {
        for buf in [&host, &gbuf] {
            assert_eq!(st.read(buf, boff, off, len).unwrap(), len);
            let mut out = vec![0u8; len as usize];
            buf.copy_out(boff as usize, &mut out).unwrap();
            assert_eq!(pattern::first_mismatch(SEED, off, &out), None, "{len} bytes at {off} into {buf:?}+{boff}");
        }
    }
    // Write from staged GPU memory (several chunks), read back through the kernel.
    let mut data = vec![0u8; 5 << 20];
    pattern::fill(7, 0, &mut data);
    gbuf.copy_in(0, &data).unwrap();
    assert_eq!(st.write(&gbuf, 0, 4 << 20, 5 << 20).unwrap(), 5 << 20);
    st.flush().unwrap();
    let back = std::fs::read(f.path()).unwrap();
    assert_eq!(&back[4 << 20..9 << 20], &data[..]);
    assert_eq!(pattern::first_mismatch(SEED, 0, &back[..4 << 20]), None, "bytes before the write are untouched");
    let c = st.path_counts();
    assert_eq!(c.fallback, 9);
    assert_eq!(c.direct_host + c.direct_p2p, 0);
}

#[test]
fn reads_past_the_end_of_a_file_return_the_bytes_there_were() {
    let f = TempFile::new("eof", 64 << 10, SEED);
    let st = Storage::open(f.path()).unwrap();
    let buf = st.alloc_host(1 << 20).unwrap();
    assert_eq!(st.read(&buf, 0, 32 << 10, 1 << 20).unwrap(), 32 << 10);
}

#[test]
fn bad_arguments_are_named_and_change_nothing() {
    let f = TempFile::new("bad", 1 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let other = Storage::open(f.path()).unwrap();
    let buf = st.alloc_host(64 << 10).unwrap();
    buf.copy_in(0, &[0xAB; 4096]).unwrap();
    assert_eq!(invalid_arg(st.read(&buf, 0, 0, 100).unwrap_err()), "len");
    assert_eq!(invalid_arg(st.read(&buf, 0, 0, 0).unwrap_err()), "len");
    assert_eq!(invalid_arg(st.read(&buf, 0, 100, 4096).unwrap_err()), "file_offset");
    assert_eq!(invalid_arg(st.read(&buf, 63 << 10, 0, 4096).unwrap_err()), "buf_offset");
    assert_eq!(invalid_arg(st.read(&buf, u64::MAX - 10, 0, 4096).unwrap_err()), "buf_offset");
    assert_eq!(invalid_arg(other.read(&buf, 0, 0, 4096).unwrap_err()), "buf");
    let mut out = [0u8; 4096];
    buf.copy_out(0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0xAB), "a refused read wrote nothing");
    // SAFETY: a null / unaligned pointer is refused before use.
    unsafe {
        assert_eq!(invalid_arg(st.register_host(std::ptr::null_mut(), 4096).unwrap_err()), "ptr");
        assert_eq!(invalid_arg(st.register_host(8 as *mut u8, 4096).unwrap_err()), "ptr");
    }
    assert!(matches!(Storage::open("/nonexistent/ugds"), Err(Error::Open { .. })));
    let e = Storage::open("/dev/null").unwrap_err();
    assert!(
        matches!(&e, Error::NotUgdsNode { path, what, .. } if path == "/dev/null" && what.contains("character device")),
        "{e}"
    );
}

#[test]
fn open_takes_any_kind_of_path_and_still_reads_specs_and_uris() {
    use std::os::unix::ffi::OsStrExt;
    let f = TempFile::new("open-paths", 64 << 10, SEED);
    let owned = std::path::PathBuf::from(f.path());
    let text: String = f.path().into();
    for st in [
        Storage::open(f.path()).unwrap(),
        Storage::open(text).unwrap(),
        Storage::open(&owned).unwrap(),
        Storage::open(owned.as_path()).unwrap(),
        Storage::open_ns(std::ffi::OsStr::new(f.path()), 1).unwrap(),
    ] {
        let buf = st.alloc_host(4096).unwrap();
        assert_eq!(st.read(&buf, 0, 4096, 4096).unwrap(), 4096);
        let mut want = vec![0u8; 4096];
        pattern::fill(SEED, 4096, &mut want);
        assert_eq!(&*buf.host_view().unwrap(), &want[..]);
    }
    assert_eq!(ugds::FileTarget::open(&owned, false).unwrap().path(), f.path());
    // A path that is not UTF-8 is refused by name, never opened under another name.
    let bad = std::path::Path::new(std::ffi::OsStr::from_bytes(b"/tmp/ugds-\xff"));
    assert_eq!(invalid_arg(Storage::open(bad).unwrap_err()), "path");
    assert_eq!(invalid_arg(ugds::Device::open(bad).unwrap_err()), "path");
    // Volume specs and URIs are paths to the type, and still parsed as what they are.
    assert_eq!(invalid_arg(Storage::open(std::path::Path::new("stripe:")).unwrap_err()), "volume");
    assert_eq!(invalid_arg(Storage::open(String::from("nvmeof://tcp/")).unwrap_err()), "uri");
}

#[test]
fn a_batch_runs_valid_entries_and_reports_invalid_ones() {
    let f = TempFile::new("batch", 4 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let buf = Arc::new(st.alloc_host(128 * 4096).unwrap());
    let mut b = StorageBatch::new(&st, 128).unwrap();
    let mut reqs: Vec<IoRequest> = (0..128u64)
        .map(|i| IoRequest {
            op: Op::Read,
            buf: buf.clone(),
            buf_offset: i * 4096,
            file_offset: ((i * 37) % 1024) * 4096,
            len: 4096,
            cookie: i,
        })
        .collect();
    reqs[5].len = 100;
    for round in 0..3 {
        b.submit(&reqs).unwrap();
        let mut events = Vec::new();
        while events.len() < 128 {
            events.extend(b.status(128 - events.len(), Duration::from_secs(10)).unwrap());
        }
        assert_eq!(b.in_flight(), 0);
        for e in &events {
            if e.cookie == 5 {
                assert_eq!(e.status, IoStatus::Invalid, "round {round}");
                assert!(matches!(e.error, Some(Error::InvalidArgument { arg: "len", .. })));
            } else {
                assert_eq!(e.status, IoStatus::Complete, "{e:?}");
                assert_eq!(e.bytes, 4096);
            }
        }
    }
    let mut out = vec![0u8; 128 * 4096];
    buf.copy_out(0, &mut out).unwrap();
    for i in (0..128u64).filter(|&i| i != 5) {
        let chunk = &out[(i * 4096) as usize..][..4096];
        assert_eq!(pattern::first_mismatch(SEED, ((i * 37) % 1024) * 4096, chunk), None, "entry {i}");
    }
    let err = b.submit(&vec![reqs[0].clone(); 129]).unwrap_err();
    assert_eq!(invalid_arg(err), "reqs");
}

/// 100 stream-ordered reads whose arguments are set by stream work queued just before each
/// (so they are bound late); stream work after each checks its data, in order.
#[test]
fn stream_ordered_reads_bind_arguments_late_and_complete_in_order() {
    let f = TempFile::new("stream", 4 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let gpu = Gpu::cpu();
    let mem = Arc::new(gpu.alloc(100 * 4096).unwrap());
    let base = mem.device_ptr() as usize;
    let buf = Arc::new(st.register_gpu(mem, false).unwrap());
    let stream = CpuStream::new().unwrap();
    let sio = StreamIo::new(stream.clone()).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut all = Vec::new();
    for i in 0..100u64 {
        // Wrong arguments at queue time; the "kernel" before the op fixes them.
        let args = AsyncArgs::new(0, -1, -1);
        let a = args.clone();
        let bad = i == 40;
        stream
            .launch(move || a.set(if bad { 1000 } else { 4096 }, (i as i64 * 7 % 1000) * 4096, i as i64 * 4096))
            .unwrap();
        sio.read_async(&st, &buf, &args).unwrap();
        let (a, l) = (args.clone(), log.clone());
        stream
            .launch(move || {
                // The op is done when later stream work runs: check its result and data.
                let r = a.result();
                // SAFETY: the CPU runtime's device memory is host memory; this op's bytes are
                // written (the stream waited for them) and no I/O touches them any more.
                let got = unsafe { std::slice::from_raw_parts((base + i as usize * 4096) as *const u8, 4096) };
                let ok = r == 4096 && pattern::first_mismatch(SEED, (i * 7 % 1000) * 4096, got).is_none();
                l.lock().unwrap().push((i, r, ok));
            })
            .unwrap();
        all.push(args);
    }
    sio.synchronize().unwrap();
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 100);
    for (k, &(i, r, ok)) in log.iter().enumerate() {
        assert_eq!(i, k as u64, "stream order");
        if i == 40 {
            assert_eq!(r, -(libc::EINVAL as i64), "the invalid size is reported in the result slot");
        } else {
            assert!(ok, "op {i}: result {r}, data wrong");
        }
    }
    assert_eq!(all[99].result(), 4096);
}

/// A group queued on a stream with nothing left to do starts at once (the host hands it to the
/// dispatcher); behind work still running, it starts when the stream reaches it.
#[test]
fn a_group_on_an_idle_stream_starts_without_the_stream_storing_its_start() {
    let f = TempFile::new("idle", 1 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let buf = Arc::new(st.alloc_host(4096).unwrap());
    let stream = CpuStream::new().unwrap();
    let sio = StreamIo::new(stream.clone()).unwrap();
    let read = |off: i64| {
        let before = stream.jobs_queued();
        let args = AsyncArgs::new(4096, off, 0);
        sio.read_async(&st, &buf, &args).unwrap();
        (args, stream.jobs_queued() - before)
    };
    let (args, queued) = read(0);
    assert_eq!(
        queued, 3,
        "on an idle stream: the group's waits (the word, the host's finished mark) and its passed mark, no store to start it"
    );
    sio.synchronize().unwrap();
    assert_eq!(args.result(), 4096);
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let g = gate.clone();
    stream
        .launch(move || {
            while !g.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
        })
        .unwrap();
    let (late, queued) = read(8192);
    assert_eq!(queued, 4, "behind running work the stream stores the group's start");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(late.result(), 0, "started before the stream reached it");
    gate.store(true, std::sync::atomic::Ordering::Release);
    sio.synchronize().unwrap();
    assert_eq!(late.result(), 4096);
    let mut out = vec![0u8; 4096];
    buf.copy_out(0, &mut out).unwrap();
    assert_eq!(pattern::first_mismatch(SEED, 8192, &out), None);
}

/// A group's operations overlap; the work after the group sees all of them; writes queued after
/// stream work carry what that work produced.
#[test]
fn stream_groups_and_writes_follow_stream_order() {
    let f = TempFile::new("group", 4 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let buf = Arc::new(st.alloc_host(16 * 65536).unwrap());
    let base = buf.host_ptr().unwrap() as usize;
    let stream = CpuStream::new().unwrap();
    let sio = StreamIo::new(stream.clone()).unwrap();
    // Work before the write fills the buffer; the write stores it at 1 MiB.
    stream
        .launch(move || {
            // SAFETY: the buffer's host memory; no I/O on it is running at this point of the stream.
            let s = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, 65536) };
            pattern::fill(99, 0, s);
        })
        .unwrap();
    let w = AsyncArgs::new(65536, 1 << 20, 0);
    sio.write_async(&st, &buf, &w).unwrap();
    let ops: Vec<AsyncOp> = (0..16)
        .map(|i| AsyncOp {
            op: Op::Read,
            buf: buf.clone(),
            args: AsyncArgs::new(65536, (i as i64) * 65536, i as i64 * 65536),
        })
        .collect();
    sio.submit(&st, &ops).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s2, ops2) = (seen.clone(), ops.clone());
    stream.launch(move || s2.lock().unwrap().extend(ops2.iter().map(|o| o.args.result()))).unwrap();
    sio.synchronize().unwrap();
    assert_eq!(w.result(), 65536);
    assert_eq!(*seen.lock().unwrap(), vec![65536i64; 16], "every op of the group is done before later work");
    let back = std::fs::read(f.path()).unwrap();
    assert_eq!(
        pattern::first_mismatch(99, 0, &back[1 << 20..(1 << 20) + 65536]),
        None,
        "the write carried the data made before it"
    );
    let mut out = vec![0u8; 16 * 65536];
    buf.copy_out(0, &mut out).unwrap();
    // The group read file [0, 1 MiB), which the write did not touch.
    assert_eq!(pattern::first_mismatch(SEED, 0, &out), None);
    assert_eq!(ops[3].args.result(), 65536);
}

/// A directory of its own in the temporary directory, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("ugds-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A descriptor's text naming `member` (padded with blank lines to one 4 KiB block, which a
/// descriptor may hold), as a root service might write a client's bytes into a file.
fn descriptor_bytes(member: &std::path::Path) -> Vec<u8> {
    let mut b = format!("# ugds volume\nstripe:{}\n", member.display()).into_bytes();
    b.resize(4096, b'\n');
    b
}

#[test]
fn a_plain_file_whose_first_line_is_a_volume_descriptors_opens_as_a_file() {
    let dir = TempDir::new("desc-plain");
    let member = dir.0.join("member");
    std::fs::write(&member, vec![0u8; 4096]).unwrap();
    let plain = dir.0.join("kv-block-17.bin");
    let data = descriptor_bytes(&member);
    std::fs::write(&plain, &data).unwrap();
    let st = Storage::open(plain.to_str().unwrap()).unwrap();
    assert!(st.describe().contains("fallback path"), "{}", st.describe());
    let buf = st.alloc_host(4096).unwrap();
    assert_eq!(st.read(&buf, 0, 0, 4096).unwrap(), 4096);
    assert!(*buf.host_view().unwrap() == data[..], "the file's own bytes, not a volume's");
    assert!(std::fs::read(&plain).unwrap() == data);
}

#[test]
fn a_volume_descriptor_opens_by_its_name_or_by_the_explicit_call() {
    let dir = TempDir::new("desc-named");
    // Regular files as members: opening the volume fails on the first member, by name, which
    // shows the target was taken for a volume (the host has no ugds node).
    let member = dir.0.join("member");
    std::fs::write(&member, vec![0u8; 4096]).unwrap();
    let data = descriptor_bytes(&member);
    let is_member_error = |r: ugds::Result<Arc<Storage>>| matches!(&r, Err(Error::NotUgdsNode { path, .. }) if std::path::Path::new(path) == member);
    let named = dir.0.join(format!("vol0{}", ugds::volume::DESCRIPTOR_SUFFIX));
    std::fs::write(&named, &data).unwrap();
    assert!(is_member_error(Storage::open(named.to_str().unwrap())), "the suffix names a volume");
    let plain = dir.0.join("vol0");
    std::fs::write(&plain, &data).unwrap();
    assert!(is_member_error(Storage::open_volume(&plain, &Default::default())), "so does open_volume");
    // The explicit ways refuse what is no descriptor, by name, and leave it alone.
    let not = dir.0.join(format!("data{}", ugds::volume::DESCRIPTOR_SUFFIX));
    std::fs::write(&not, vec![7u8; 4096]).unwrap();
    assert_eq!(invalid_arg(Storage::open(not.to_str().unwrap()).unwrap_err()), "volume");
    let big = TempFile::new("desc-big", 1 << 20, SEED);
    assert_eq!(invalid_arg(Storage::open_volume(big.path(), &Default::default()).unwrap_err()), "volume");
    assert!(std::fs::read(&not).unwrap() == vec![7u8; 4096]);
    assert!(std::fs::read(&named).unwrap() == data && std::fs::read(&plain).unwrap() == data);
}

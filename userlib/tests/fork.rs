//! fork() safety on the fallback path, on the host: a child made by `fork` that uses the
//! parent's storage, buffers, batch or stream gets `Error::ForkedChild` and changes nothing; it
//! opens the file afresh and reads correctly; dropping what it inherited neither hangs nor
//! disturbs the parent, which keeps working after the child exits and after a child is killed.
//!
//! No test harness (`harness = false`): `fork` from a process whose other threads may hold
//! locks is what this tests for the library's own threads, not for the harness's.

mod common;
use common::TempFile;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::batch::{IoStatus, Op};
use ugds::{pattern, AsyncArgs, AsyncOp, Buffer, CpuStream, Error, IoRequest, Storage, StorageBatch, StreamIo};

const SEED: u64 = 0xf0_4c;
const LEN: usize = 64 << 10;
/// What the caller's memory holds before the child tries to read into it.
const MARK: u8 = 0xAA;

/// Anonymous memory of the caller's own (not the library's: inherited by a child).
struct CallerMem(*mut u8);

impl CallerMem {
    fn new() -> CallerMem {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        CallerMem(p.cast())
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: LEN bytes mapped for the life of the test; only read between I/Os.
        unsafe { std::slice::from_raw_parts(self.0, LEN) }
    }

    fn fill(&self, v: u8) {
        // SAFETY: as in `bytes`, written between I/Os only.
        unsafe { std::ptr::write_bytes(self.0, v, LEN) }
    }
}

fn forked(r: &ugds::Result<impl std::fmt::Debug>, object: &str) -> bool {
    matches!(r, Err(Error::ForkedChild { object: o }) if *o == object)
}

/// The child's part; returns the exit code (0: everything as expected).
fn child(
    path: &str,
    st: Arc<Storage>,
    buf: Buffer,
    caller: &CallerMem,
    cbuf: Arc<Buffer>,
    batch: StorageBatch,
    sio: StreamIo,
) -> i32 {
    let mut batch = batch;
    // The parent's storage and buffers: refused by name, nothing written.
    let r = st.read(&cbuf, 0, 0, 4096);
    if r.is_ok() {
        return 11;
    }
    if !forked(&r, "storage") {
        return 12;
    }
    if caller.bytes().iter().any(|b| *b != MARK) {
        return 13;
    }
    if !forked(&buf.copy_out(0, &mut [0u8; 16]), "buffer") || !forked(&buf.host_view().map(|_| ()), "buffer") {
        return 14;
    }
    let req = IoRequest { op: Op::Read, buf: cbuf.clone(), buf_offset: 0, file_offset: 0, len: 4096, cookie: 1 };
    if !forked(&batch.submit(std::slice::from_ref(&req)), "batch") {
        return 15;
    }
    let op = AsyncOp { op: Op::Read, buf: req.buf.clone(), args: AsyncArgs::new(4096, 0, 0) };
    if !forked(&sio.submit(&st, &[op]), "stream") {
        return 16;
    }
    if !forked(&st.capacity(), "storage") || !forked(&StorageBatch::new(&st, 4).map(|_| ()), "storage") {
        return 17;
    }
    // Afresh: the child's own storage, buffers and ring work.
    let Ok(mine) = Storage::open(path) else { return 20 };
    let Ok(b2) = mine.alloc_host(LEN) else { return 21 };
    if mine.read(&b2, 0, 0, LEN as u64).ok() != Some(LEN as u64) {
        return 22;
    }
    let Ok(view) = b2.host_view() else { return 23 };
    if pattern::first_mismatch(SEED, 0, &view).is_some() {
        return 24;
    }
    drop(view);
    // The caller's memory (the child's copy) registers on the child's storage.
    // SAFETY: LEN bytes of the child's own mapping, untouched during the read.
    let Ok(c2) = (unsafe { mine.register_host(caller.0, LEN) }) else { return 25 };
    if mine.read(&c2, 0, 4096, 8192).ok() != Some(8192)
        || pattern::first_mismatch(SEED, 4096, &caller.bytes()[..8192]).is_some()
    {
        return 26;
    }
    let Ok(mut b) = StorageBatch::new(&mine, 4) else { return 27 };
    let req = IoRequest { op: Op::Read, buf: Arc::new(b2), buf_offset: 0, file_offset: 8192, len: 4096, cookie: 7 };
    if b.submit(&[req]).is_err() {
        return 28;
    }
    match b.status(1, Duration::from_secs(10)) {
        Ok(ev) if ev.len() == 1 && ev[0].status == IoStatus::Complete => {}
        _ => return 29,
    }
    // Dropping what the parent made touches nothing of the parent's and returns.
    drop((b, c2, mine));
    drop((batch, sio, cbuf, buf, st));
    0
}

/// Waits up to 30 s for `pid`; its exit code, or why not.
fn wait(pid: libc::pid_t) -> Result<i32, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            if libc::WIFEXITED(status) {
                return Ok(libc::WEXITSTATUS(status));
            }
            return Err(format!("child ended by signal {}", libc::WTERMSIG(status)));
        }
        if Instant::now() > deadline {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return Err("child did not finish within 30 s (hung in a drop?)".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The parent reads into both buffers, through a batch and a stream, and checks the data.
fn parent_works(
    st: &Arc<Storage>,
    buf: &Buffer,
    caller: &CallerMem,
    cbuf: &Buffer,
    batch: &mut StorageBatch,
    sio: &StreamIo,
) {
    assert_eq!(st.read(buf, 0, 0, LEN as u64).unwrap(), LEN as u64);
    assert_eq!(pattern::first_mismatch(SEED, 0, &buf.host_view().unwrap()), None);
    caller.fill(0);
    assert_eq!(st.read(cbuf, 0, 0, LEN as u64).unwrap(), LEN as u64);
    assert_eq!(pattern::first_mismatch(SEED, 0, caller.bytes()), None);
    let b = Arc::new(st.alloc_host(4096).unwrap());
    batch
        .submit(&[IoRequest { op: Op::Read, buf: b.clone(), buf_offset: 0, file_offset: 4096, len: 4096, cookie: 3 }])
        .unwrap();
    let ev = batch.status(1, Duration::from_secs(10)).unwrap();
    assert!(ev.len() == 1 && ev[0].status == IoStatus::Complete, "{ev:?}");
    let args = AsyncArgs::new(4096, 8192, 0);
    sio.submit(st, &[AsyncOp { op: Op::Read, buf: b.clone(), args: args.clone() }]).unwrap();
    sio.synchronize().unwrap();
    assert_eq!(args.bytes.load(std::sync::atomic::Ordering::Acquire), 4096);
    assert_eq!(pattern::first_mismatch(SEED, 8192, &b.host_view().unwrap()), None);
}

fn main() {
    let f = TempFile::new("fork", 1 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let buf = st.alloc_host(LEN).unwrap();
    let caller = CallerMem::new();
    // SAFETY: LEN bytes mapped for the life of the test, touched only between I/Os.
    let cbuf = Arc::new(unsafe { st.register_host(caller.0, LEN) }.unwrap());
    let mut batch = StorageBatch::new(&st, 8).unwrap();
    let sio = StreamIo::new(CpuStream::new().unwrap()).unwrap();
    // The parent's ring, worker threads and stream thread all exist before the fork.
    parent_works(&st, &buf, &caller, &cbuf, &mut batch, &sio);
    caller.fill(MARK);

    // SAFETY: the child runs `child` and leaves with _exit (no atexit handlers, no unwinding
    // into the parent's state).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = child(f.path(), st, buf, &caller, cbuf, batch, sio);
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) };
    }
    match wait(pid) {
        Ok(0) => {}
        Ok(code) => panic!("the child failed with code {code} (see `child`)"),
        Err(e) => panic!("{e}"),
    }
    assert!(caller.bytes().iter().all(|b| *b == MARK), "the child's attempt reached the parent's memory");
    parent_works(&st, &buf, &caller, &cbuf, &mut batch, &sio);

    // A child killed while it works: the parent carries on.
    // SAFETY: as above; this child loops until it is killed.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mine = Storage::open(f.path());
        loop {
            if let Ok(s) = &mine {
                if let Ok(b) = s.alloc_host(4096) {
                    let _ = s.read(&b, 0, 0, 4096);
                }
            }
            let _ = st.read(&cbuf, 0, 0, 4096);
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: our own child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait(pid).is_err(), "the looping child was killed");
    parent_works(&st, &buf, &caller, &cbuf, &mut batch, &sio);
    drop((batch, sio, cbuf, buf, st));
    println!("fork: the child got ForkedChild for every inherited object, opened afresh, and the parent kept working");
}

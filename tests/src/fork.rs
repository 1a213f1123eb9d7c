//! fork() on the direct path: a child that uses the parent's device, storage, buffers or batch
//! gets `Error::ForkedChild`; nothing reaches the parent's queues or its pinned pages, and
//! dropping what it inherited neither deregisters the parent's memory nor deletes its queue
//! pairs. The child opens the node afresh and reads correctly; the parent keeps working after
//! the child exits and after a child is killed. The library's check alone makes this pass (the
//! kernel's refusal of another process's ioctls and mmaps is a second line).

use crate::kmod::bound_node;
use crate::{ensure_that, AlignedBuf, Test};
use anyhow::Result;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::batch::{IoStatus, Op};
use ugds::{pattern, Buffer, Device, Error, IoRequest, Storage, StorageBatch};

/// The fork tests (in the `batch` variant: one 256 MiB controller).
pub fn tests() -> Vec<Test> {
    vec![Test { name: "ugds_fork_child_refused_by_name_parent_undisturbed", variant: "batch", run: fork_child }]
}

const SEED: u64 = 0xF04C;
const LEN: usize = 1 << 20;
/// What the parent's memory holds while its child tries to read into it.
const MARK: u8 = 0xAA;

fn forked<T>(r: &ugds::Result<T>, object: &str) -> bool {
    matches!(r, Err(Error::ForkedChild { object: o }) if *o == object)
}

/// The child's part; its exit code (0: all as expected).
fn child(
    node: &str,
    dev: Device,
    st: Arc<Storage>,
    cbuf: Arc<Buffer>,
    caller: &AlignedBuf,
    batch: StorageBatch,
) -> i32 {
    let mut batch = batch;
    let r = st.read(&cbuf, 0, 0, LEN as u64);
    if r.is_ok() {
        return 11;
    }
    if !forked(&r, "storage") {
        return 12;
    }
    if caller.as_slice().iter().any(|b| *b != MARK) {
        return 13;
    }
    if !forked(&dev.status(), "device") || !forked(&dev.namespace(1), "device") {
        return 14;
    }
    let req = IoRequest { op: Op::Read, buf: cbuf.clone(), buf_offset: 0, file_offset: 0, len: 4096, cookie: 1 };
    if !forked(&batch.submit(std::slice::from_ref(&req)), "batch") {
        return 15;
    }
    if !forked(&st.owned_queue().map(|_| ()), "storage") {
        return 16;
    }
    // Afresh: the child's own open of the node.
    let Ok(d2) = Device::open(node) else { return 20 };
    let Ok(s2) = Storage::direct(&d2, 1) else { return 21 };
    let Ok(b2) = s2.alloc_host(LEN) else { return 22 };
    if s2.read(&b2, 0, 0, LEN as u64).ok() != Some(LEN as u64) {
        return 23;
    }
    match b2.host_view() {
        Ok(v) if pattern::first_mismatch(SEED, 0, &v).is_none() => {}
        _ => return 24,
    }
    // Dropping the parent's objects: no deregistration, no queue-pair deletion, no unmapping.
    drop((req, batch, cbuf, st, dev));
    drop((b2, s2, d2));
    0
}

/// Waits up to 60 s for `pid`: its exit code, or why not.
fn wait(pid: libc::pid_t) -> Result<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            ensure_that!(libc::WIFEXITED(status), "the child ended by signal {}", libc::WTERMSIG(status));
            return Ok(libc::WEXITSTATUS(status));
        }
        if Instant::now() > deadline {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            anyhow::bail!("the child did not finish within 60 s (hung dropping what it inherited?)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The parent reads through its registrations, its batch's queue pair and its shared queues.
fn parent_works(st: &Arc<Storage>, cbuf: &Buffer, caller: &mut AlignedBuf, batch: &mut StorageBatch) -> Result<()> {
    caller.as_mut_slice().fill(0);
    ensure_that!(st.read(cbuf, 0, 0, LEN as u64)? == LEN as u64, "short read");
    ensure_that!(pattern::first_mismatch(SEED, 0, caller.as_slice()).is_none(), "the parent read wrong data");
    let b = Arc::new(st.alloc_host(4096)?);
    let req = IoRequest { op: Op::Read, buf: b.clone(), buf_offset: 0, file_offset: 8192, len: 4096, cookie: 2 };
    batch.submit(&[req])?;
    let ev = batch.status(1, Duration::from_secs(10))?;
    ensure_that!(ev.len() == 1 && ev[0].status == IoStatus::Complete, "the parent's batch: {ev:?}");
    ensure_that!(pattern::first_mismatch(SEED, 8192, &b.host_view()?).is_none(), "the batch read wrong data");
    Ok(())
}

fn fork_child() -> Result<()> {
    let node = bound_node(0)?;
    let dev = Device::open(&node)?;
    let st = Storage::direct(&dev, 1)?;
    {
        let b = st.alloc_host(LEN)?;
        pattern::fill(SEED, 0, &mut b.host_view()?);
        st.write(&b, 0, 0, LEN as u64)?;
    }
    // The caller's own memory (inherited by a child, copy-on-write; pinned for the parent).
    let mut caller = AlignedBuf::new(LEN);
    // SAFETY: LEN bytes that live until the end of the test, touched only between I/Os.
    let cbuf = Arc::new(unsafe { st.register_host(caller.as_mut_slice().as_mut_ptr(), LEN) }?);
    let mut batch = StorageBatch::new(&st, 8)?;
    ensure_that!(batch.is_native(), "the batch has no queue pair of its own");
    parent_works(&st, &cbuf, &mut caller, &mut batch)?;
    let qpairs0 = dev.counters()?.qpairs;
    caller.as_mut_slice().fill(MARK);

    // SAFETY: the child runs `child` and leaves with _exit (no atexit handlers, no unwinding).
    let pid = unsafe { libc::fork() };
    ensure_that!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = child(&node, dev.clone(), st.clone(), cbuf.clone(), &caller, batch);
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) };
    }
    let code = wait(pid)?;
    ensure_that!(code == 0, "the child failed with code {code} (see `child` in tests/src/fork.rs)");
    ensure_that!(caller.as_slice().iter().all(|b| *b == MARK), "the child's read reached the parent's pinned pages");
    let deadline = Instant::now() + Duration::from_secs(5);
    while dev.counters()?.qpairs != qpairs0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    ensure_that!(
        dev.counters()?.qpairs == qpairs0,
        "queue pairs {} after the child, {qpairs0} before (the child's own are given back, the parent's kept)",
        dev.counters()?.qpairs
    );
    // The parent's registrations, its batch's queue pair and its shared queues still work.
    let mut batch2 = StorageBatch::new(&st, 8)?;
    parent_works(&st, &cbuf, &mut caller, &mut batch2)?;

    // A child killed while it reads through its own open of the node: the parent carries on.
    // SAFETY: as above; this child loops until it is killed.
    let pid = unsafe { libc::fork() };
    ensure_that!(pid >= 0, "fork failed");
    if pid == 0 {
        let mine = Device::open(&node).and_then(|d| Storage::direct(&d, 1));
        loop {
            if let Ok(s) = &mine {
                if let Ok(b) = s.alloc_host(4096) {
                    let _ = s.read(&b, 0, 0, 4096);
                }
            }
            let _ = st.read(&cbuf, 0, 0, 4096);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: our own child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    ensure_that!(wait(pid).is_err(), "the looping child was killed");
    parent_works(&st, &cbuf, &mut caller, &mut batch2)?;
    drop((batch2, cbuf, st, dev));
    let _ = std::fs::metadata(&node);
    Ok(())
}

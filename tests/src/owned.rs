//! Owned queue pairs (`Storage::owned_queue`): threads each with a queue pair of its own move the
//! same data as the shared queues, both ways, and the kernel driver reads what they wrote; a
//! timeout on an owned queue is handled as on the shared path; dropping one deletes its queue
//! pair on the controller.

use crate::kmod::bound_node;
use crate::userlib::{kernel_check, kernel_namespaces, unbind};
use crate::{ensure_that, nvme_controllers, nvme_name, sh, Test};
use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::Duration;
use ugds::{pattern, Buffer, Device, DeviceOptions, Error, OwnedQueue, Storage};

const V: &str = "userlib";

/// The owned-queue tests (in the `userlib` variant: its controllers 0 and 4).
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "ugds_owned_queues_threads_both_ways_kernel_checks", variant: V, run: threads_both_ways },
        Test { name: "ugds_owned_queue_timeout_like_shared", variant: V, run: timeout_like_shared },
        Test { name: "ugds_owned_queue_cli_bench", variant: V, run: cli_bench },
    ]
}

/// Threads of the first test, and each one's region of the namespace.
const THREADS: u64 = 4;
const REGION: u64 = 8 << 20;
/// Request sizes per thread: one block, one command, several commands in one burst.
const SIZES: [u64; 3] = [4096, 1 << 20, 3 << 20];

/// Fills `buf` with the pattern of `seed` at `off`.
fn fill(buf: &Buffer, seed: u64, off: u64, len: u64) -> Result<()> {
    pattern::fill(seed, off, &mut buf.host_view()?[..len as usize]);
    Ok(())
}

/// Checks that `buf` holds the pattern of `seed` at `off`.
fn check(buf: &Buffer, seed: u64, off: u64, len: u64, what: &str) -> Result<()> {
    if let Some(b) = pattern::first_mismatch(seed, off, &buf.host_view()?[..len as usize]) {
        anyhow::bail!("{what}: byte {b} differs from the pattern (range {off}+{len})");
    }
    Ok(())
}

/// One thread's work on its own queue: owned writes read back through the shared queues, shared
/// writes read back through the owned queue, and a last owned write the kernel checks later.
/// Returns the I/Os it ran on each (owned, shared).
fn thread_work(st: &Arc<Storage>, q: &mut OwnedQueue, t: u64) -> Result<(u64, u64)> {
    let buf = st.alloc_host(*SIZES.iter().max().unwrap_or(&4096) as usize)?;
    let base = t * REGION;
    let (mut owned, mut shared) = (0, 0);
    for (i, &len) in SIZES.iter().enumerate() {
        let off = base + i as u64 * (REGION / 4);
        let seed = 100 + t * 10 + i as u64;
        fill(&buf, seed, off, len)?;
        ensure_that!(q.write(&buf, 0, off, len)? == len, "thread {t}: short owned write");
        buf.host_view()?.fill(0);
        ensure_that!(st.read(&buf, 0, off, len)? == len, "thread {t}: short shared read");
        check(&buf, seed, off, len, &format!("thread {t}: owned write, shared read"))?;
        let seed = seed + 1000;
        fill(&buf, seed, off, len)?;
        st.write(&buf, 0, off, len)?;
        buf.host_view()?.fill(0);
        q.read(&buf, 0, off, len)?;
        check(&buf, seed, off, len, &format!("thread {t}: shared write, owned read"))?;
        // The last word is the owned queue's: the kernel driver checks it after unbinding.
        let seed = seed + 1000;
        fill(&buf, seed, off, len)?;
        q.write(&buf, 0, off, len)?;
        (owned, shared) = (owned + 3, shared + 2);
    }
    Ok((owned, shared))
}

/// Four threads, each with an owned queue created on the main thread and moved to it, run
/// reads and writes of 4 KiB to 3 MiB cross-checked against the device's shared queue; the
/// owned queues' transfers never touch the shared queue; the controller has four more queue
/// pairs while they live and as many as before once they are dropped; the storage counts their
/// I/Os when they drop; the kernel driver reads the data they wrote last.
fn threads_both_ways() -> Result<()> {
    let addr = nvme_controllers()?[0].clone();
    let node = bound_node(0)?;
    // Shared means the device's shared queue here, and the queue pair count moves with owned
    // queues only: no queues of the threads' own (they would stay with the device after their
    // threads exit).
    let opts = DeviceOptions { queues: 1, thread_queues: Some(0), ..Default::default() };
    let dev = Device::open_with(&node, opts)?;
    let st = Storage::direct(&dev, 1)?;
    let qpairs0 = dev.counters()?.qpairs;
    // Owned transfers go to the owned queue only.
    let mut q = st.owned_queue()?;
    ensure_that!(dev.counters()?.qpairs == qpairs0 + 1, "an owned queue created no queue pair");
    ensure_that!(q.depth() >= 2 && q.nsid() == 1 && q.timeout() == Duration::from_secs(30), "queue settings");
    let shared0 = dev.dptr_counts();
    let probe = st.alloc_host(1 << 20)?;
    fill(&probe, 7, 0, 1 << 20)?;
    q.write(&probe, 0, REGION * THREADS, 1 << 20)?;
    q.read(&probe, 0, REGION * THREADS, 1 << 20)?;
    check(&probe, 7, 0, 1 << 20, "probe")?;
    let oc = q.dptr_counts();
    ensure_that!(dev.dptr_counts() == shared0, "owned transfers went through the shared queue");
    ensure_that!(oc.prp + oc.sgl >= 2, "the owned queue counted no transfers: {oc:?}");
    drop(q);
    ensure_that!(dev.counters()?.qpairs == qpairs0, "dropping an owned queue left its queue pair");
    ensure_that!(st.path_counts().direct_host == 2, "the probe's I/Os were not counted: {:?}", st.path_counts());
    let queues: Vec<OwnedQueue> = (0..THREADS).map(|_| st.owned_queue()).collect::<ugds::Result<_>>()?;
    let qids: std::collections::BTreeSet<u16> = queues.iter().map(OwnedQueue::qid).collect();
    ensure_that!(qids.len() == THREADS as usize, "owned queues share queue ids: {qids:?}");
    ensure_that!(dev.counters()?.qpairs == qpairs0 + THREADS, "{THREADS} owned queues, {:?}", dev.counters().ok());
    let counts = std::thread::scope(|s| -> Result<Vec<(u64, u64)>> {
        let hs: Vec<_> = queues
            .into_iter()
            .enumerate()
            .map(|(t, mut q)| {
                let st = &st;
                s.spawn(move || thread_work(st, &mut q, t as u64))
            })
            .collect();
        hs.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("thread panicked"))?).collect()
    })?;
    ensure_that!(dev.counters()?.qpairs == qpairs0, "owned queues dropped, but {:?}", dev.counters().ok());
    let (owned, shared): (u64, u64) = counts.iter().fold((0, 0), |a, c| (a.0 + c.0, a.1 + c.1));
    let pc = st.path_counts();
    ensure_that!(pc.direct_host == 2 + owned + shared, "path counts {pc:?}, expected {} I/Os", 2 + owned + shared);
    println!("    {THREADS} threads: {owned} I/Os on owned queues, {shared} on the shared one, all cross-checked");
    drop((probe, st, dev));
    unbind(&addr)?;
    let kns = kernel_namespaces(&nvme_name(&addr)?)?;
    let blk = &kns.iter().find(|(id, _)| *id == 1).context("namespace 1 missing in the kernel")?.1;
    for t in 0..THREADS {
        for (i, &len) in SIZES.iter().enumerate() {
            let off = t * REGION + i as u64 * (REGION / 4);
            kernel_check(&format!("/dev/{blk}"), 2100 + t * 10 + i as u64, off, len)?;
        }
    }
    Ok(())
}

/// What one forced timeout looked like.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// The queue first reported `EpochChanged` (a reset made through another queue since its
    /// last use), once.
    stale_first: bool,
    /// The read failed with `Timeout`.
    timeout: bool,
    /// Its buffer was free again (no lease left, the CPU may look at it).
    released: bool,
    /// The controller was reset.
    reset: bool,
    /// Another open file saw `EpochChanged` once, then read correct data.
    other_saw_epoch_once: bool,
}

/// Forces a timeout with `read` (an 8 MiB read on the throttled drive, 20 commands per second,
/// under a 5 ms deadline; retried once after an `EpochChanged`, which names no command) and
/// records how it was handled.
fn force_timeout(
    dev: &Device,
    big: &Buffer,
    read: &mut dyn FnMut() -> ugds::Result<u64>,
    other: &Storage,
    obuf: &Buffer,
) -> Result<Outcome> {
    let resets0 = dev.counters()?.resets;
    let mut r = read();
    let stale_first = matches!(r, Err(Error::EpochChanged { .. }));
    if stale_first {
        r = read();
    }
    let timeout = matches!(r, Err(Error::Timeout { .. }));
    let released = big.inflight() == 0 && big.host_view().is_ok();
    let reset = dev.counters()?.resets > resets0;
    obuf.host_view()?.fill(0);
    let first = other.read(obuf, 0, 8192, 4096);
    let again = other.read(obuf, 0, 8192, 4096);
    let data_ok = pattern::first_mismatch(44, 8192, &obuf.host_view()?).is_none();
    let other_saw_epoch_once = matches!(first, Err(Error::EpochChanged { .. })) && again.is_ok() && data_ok;
    Ok(Outcome { stale_first, timeout, released, reset, other_saw_epoch_once })
}

/// A timeout on an owned queue is handled as on the shared path: `Timeout`, the controller reset,
/// the buffer's lease released, another open file sees the epoch change once. Each queue's own
/// reset resynchronises it (the owned queue carries on without an epoch error), and each sees
/// the other's reset once as `EpochChanged`. Dropping the owned queue gives its queue pair back.
fn timeout_like_shared() -> Result<()> {
    let addr = nvme_controllers()?[4].clone();
    let node = bound_node(4)?;
    // The shared path is the device's shared queue here (no queues of the threads' own).
    let opts = |timeout| DeviceOptions { queues: 1, thread_queues: Some(0), timeout, ..Default::default() };
    let hasty_dev = Device::open_with(&node, opts(Duration::from_millis(5)))?;
    let patient_dev = Device::open_with(&node, opts(Duration::from_secs(10)))?;
    let hasty = Storage::direct(&hasty_dev, 1)?;
    let patient = Storage::direct(&patient_dev, 1)?;
    let obuf = patient.alloc_host(4096)?;
    pattern::fill(44, 8192, &mut obuf.host_view()?);
    patient.write(&obuf, 0, 8192, 4096)?;
    let big = hasty.alloc_host(8 << 20)?;
    let qpairs0 = hasty_dev.counters()?.qpairs;
    let mut q = hasty.owned_queue()?;
    ensure_that!(q.timeout() == Duration::from_millis(5), "the owned queue has the device's deadline");
    let small = hasty.alloc_host(4096)?;
    for i in 0..3 {
        let shared = force_timeout(&hasty_dev, &big, &mut || hasty.read(&big, 0, 0, 8 << 20), &patient, &obuf)?;
        let owned = force_timeout(&hasty_dev, &big, &mut || q.read(&big, 0, 0, 8 << 20), &patient, &obuf)?;
        let want = |stale_first| Outcome {
            stale_first,
            timeout: true,
            released: true,
            reset: true,
            other_saw_epoch_once: true,
        };
        // The shared queue saw the owned queue's reset of the previous iteration; the owned
        // queue, the shared one's of this iteration.
        ensure_that!(shared == want(i > 0), "iteration {i}: shared path {shared:?}");
        ensure_that!(owned == want(true), "iteration {i}: owned queue {owned:?}, shared path {shared:?}");
        // The owned queue carries on with a patient deadline: no epoch error, correct data.
        q.set_timeout(Duration::from_secs(10));
        small.host_view()?.fill(0);
        q.read(&small, 0, 8192, 4096).with_context(|| format!("iteration {i}: owned queue after its reset"))?;
        check(&small, 44, 8192, 4096, "owned queue after its reset")?;
        q.set_timeout(Duration::from_millis(5));
    }
    drop(q);
    ensure_that!(hasty_dev.counters()?.qpairs == qpairs0, "dropping the owned queue left its queue pair");
    println!("    3 forced timeouts on each of the shared and an owned queue, handled alike");
    drop((big, small, obuf, hasty, patient, hasty_dev, patient_dev));
    unbind(&addr)
}

/// The whole number after `"key":` in a line of JSON.
fn json_u64(json: &str, key: &str) -> Option<u64> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let digits: String = json[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `ugds bench --queue owned`: two threads on owned queues run and report it; every I/O is
/// counted on the direct path (the queues add theirs when dropped); owned queues with a batch
/// depth, and on a file, are refused by name.
fn cli_bench() -> Result<()> {
    let addr = nvme_controllers()?[0].clone();
    let node = bound_node(0)?;
    let bin = std::env::var("UGDS_CLI").context("UGDS_CLI not set")?;
    let out = sh(&format!("{bin} --json bench {node} --runtime 1 --numjobs 2 --queue owned"))?;
    let ios = json_u64(&out, "ios").unwrap_or(0);
    ensure_that!(out.contains("\"queue\":\"owned\"") && ios > 0, "bench: {out}");
    ensure_that!(json_u64(&out, "direct_host") == Some(ios), "owned queues' I/Os not counted: {out}");
    let shared = sh(&format!("{bin} --json bench {node} --runtime 1"))?;
    ensure_that!(shared.contains("\"queue\":\"shared\""), "default queue mode: {shared}");
    let deep =
        std::process::Command::new(&bin).args(["bench", &node, "--iodepth", "4", "--queue", "owned"]).output()?;
    let why = String::from_utf8_lossy(&deep.stderr);
    ensure_that!(!deep.status.success() && why.contains("--iodepth 1"), "owned with a batch depth: {why}");
    let file = format!("/tmp/ugds-owned-cli-{}", std::process::id());
    std::fs::File::create(&file)?.set_len(16 << 20)?;
    let f = std::process::Command::new(&bin)
        .args(["bench", &file, "--runtime", "1", "--size", "8M", "--queue", "owned"])
        .output()?;
    let why = String::from_utf8_lossy(&f.stderr).into_owned();
    std::fs::remove_file(&file)?;
    ensure_that!(!f.status.success() && why.contains("an owned queue pair"), "owned on a file: {why}");
    println!("    {ios} I/Os on 2 owned queues in 1 s");
    unbind(&addr)
}

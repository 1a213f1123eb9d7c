//! The data path's own cost per command: write a 4 KiB read into its SQ slot (with its PRPs),
//! ring the doorbell, reap the completion by phase bit — against the in-memory device, stepped
//! on the same thread so the figure is deterministic (and countable by callgrind). The device
//! is a null device (no data kept), but its model's work is included: fetching and decoding the
//! entry, resolving its PRPs, posting the completion.
//!
//! `cargo run --release -p ugds --features test-utils --example datapath_cost -- [COMMANDS] [BURST] [shared|owned]`
//!
//! `shared` (the default) goes through the queue pair's lock, as threads sharing a queue do;
//! `owned` through the single-owner calls a queue batch uses (no lock). At burst 1 both use the
//! one-command calls a synchronous request of one command makes.
//!
//! `storage` measures the whole synchronous read instead: `Storage::read` of 4 KiB on a
//! namespace of the device model (its checks, lease, path and the queue), the model stepped
//! on this thread each time the read's wait finds nothing (burst is 1), through the device's
//! shared queue (what a thread gets when the controller has no queue to spare);
//! `storage-owned` the same through the thread's own queue (claimed by its first read).
//! `volume` (with `storage-owned`) reads through a striped volume (128 KiB chunks) of
//! `members=N` members (default 1), each on a model of its own, instead; `bytes=N` sets the
//! read's size. With `members=2 bytes=262144` every read covers one chunk of each member: the
//! volume's lanes, one command each.
//!
//! `batch` measures a `StorageBatch` of BURST entries kept full as `ugds bench --iodepth` keeps
//! it (wait for at least one event, submit a new read for each), on the model's queue pair, the
//! model stepped each time the batch's wait finds nothing and posting at most 4 completions a
//! step: commands finish a few at a time, as on a device with many in flight. `batch-1` the same
//! with one completion a step: every wait finds one entry and every submit carries one, so a
//! round's fixed costs fall on one read (what `ugds bench` meets at QD 8 in the VM).
//! `volume` (with `batch` or `batch-1`) runs the same batch through a one-member striped
//! volume's batch on the same model: the difference is the volume layer's own cost.

use std::time::{Duration, Instant};
use ugds::test_utils::{Command, DmaRange, MockBatch, MockConfig, MockQueue, MockStorage, Read, MAX_BURST};
use ugds::{IoRequest, Op};

fn run(m: &mut MockQueue, burst: usize, commands: usize, owned: bool) -> ugds::Result<()> {
    // The segments are copied out so the queue pair can be borrowed mutably (single owner).
    let segments = m.segments().to_vec();
    let cmds: Vec<Command<'_>> = (0..burst as u64)
        .map(|k| {
            // SAFETY: the mock's segments name its own memory, which only its model touches;
            // 4096 bytes is exactly one 4 KiB block.
            let data = unsafe { DmaRange::new(&segments, k * 4096, 4096) };
            Read::new(k, 1, data).build()
        })
        .collect();
    let mut cids = [0u16; MAX_BURST];
    let mut out = [None; MAX_BURST];
    if burst == 1 {
        // One command per call: the calls a synchronous request of one command makes.
        for _ in 0..commands {
            let t = if owned {
                m.qp.submit_one_owned(1, &cmds[0], &m.status, Duration::from_secs(5))?
            } else {
                m.qp.submit_one(1, &cmds[0], &m.status, Duration::from_secs(5))?
            };
            m.step();
            let st = if owned { m.qp.collect_one_owned(t, &m.status)? } else { m.qp.collect_one(t, &m.status)? };
            if st.is_none() {
                return Err(ugds::Error::DeviceProtocol("the command did not complete".into()));
            }
        }
        return Ok(());
    }
    for _ in 0..commands / burst {
        if owned {
            m.qp.submit_owned(1, &cmds, &m.status, Duration::from_secs(5), &mut cids)?;
        } else {
            m.qp.submit(1, &cmds, &m.status, Duration::from_secs(5), &mut cids)?;
        }
        m.step();
        out[..burst].iter_mut().for_each(|o| *o = None);
        let n = if owned {
            m.qp.collect_owned(&cids[..burst], &m.status, &mut out[..burst])?
        } else {
            m.qp.collect(&cids[..burst], &m.status, &mut out[..burst])?
        };
        if n != burst {
            return Err(ugds::Error::DeviceProtocol(format!("{n} of {burst} completed")));
        }
    }
    Ok(())
}

/// `commands` synchronous reads of `bytes` each, at offsets that cycle through at most 64 of
/// them (as many as fit the buffer, which spans the namespace), through `Storage::read`.
fn run_storage(m: &MockStorage, commands: usize, bytes: u64) -> ugds::Result<()> {
    let end = (m.buffer.len() as u64 / bytes).clamp(1, 64) * bytes;
    // The next offset by an addition and a compare: a division by a length known only at run
    // time would be counted as the engine's.
    let mut off = 0;
    for _ in 0..commands {
        m.storage.read(&m.buffer, off, off, bytes)?;
        off += bytes;
        if off == end {
            off = 0;
        }
    }
    Ok(())
}

/// Completions a step of the model posts at most in `batch` mode.
const POSTS_PER_STEP: usize = 4;

/// `commands` 4 KiB reads through the batch, kept full: entry `k` of the batch reads into page
/// `k` of the buffer (its cookie), so no two reads in flight share memory.
fn run_batch(m: &mut MockBatch, capacity: usize, commands: usize) -> ugds::Result<()> {
    let read = |slot: u64| IoRequest {
        op: Op::Read,
        buf: m.buffer.clone(),
        buf_offset: slot * 4096,
        file_offset: slot * 4096,
        len: 4096,
        cookie: slot,
    };
    let mut again: Vec<IoRequest> = (0..capacity as u64).map(read).collect();
    m.batch.submit(&again)?;
    // Both vectors are kept from one round to the next, as `ugds bench` keeps them.
    let mut ev = Vec::with_capacity(capacity);
    let mut done = 0;
    while done < commands {
        ev.clear();
        done += m.batch.status_into(1, Duration::from_secs(5), &mut ev)?;
        if ev.iter().any(|e| e.status != ugds::IoStatus::Complete) {
            return Err(ugds::Error::DeviceProtocol("a batch read failed".into()));
        }
        again.clear();
        again.extend(ev.iter().map(|e| read(e.cookie)));
        m.batch.submit(&again)?;
    }
    let mut left = capacity;
    while left > 0 {
        ev.clear();
        left = left.saturating_sub(m.batch.status_into(1, Duration::from_secs(5), &mut ev)?);
    }
    Ok(())
}

fn main() -> ugds::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let commands = args.first().copied().unwrap_or(4_000_000);
    let bursts: Vec<usize> = args.get(1).map(|b| vec![*b]).unwrap_or_else(|| vec![1, 8, 32]);
    let owned = std::env::args().any(|a| a == "owned");
    let one_per_step = std::env::args().any(|a| a == "batch-1");
    if one_per_step || std::env::args().any(|a| a == "batch") {
        let capacity = bursts[0];
        let cfg = MockConfig { null: true, ..MockConfig::default() };
        let volume = std::env::args().any(|a| a == "volume");
        let mut m = if volume { MockBatch::stepped_volume(cfg, capacity)? } else { MockBatch::stepped(cfg, capacity)? };
        let posts = if one_per_step { 1 } else { POSTS_PER_STEP };
        m.post_at_most(posts);
        run_batch(&mut m, capacity, 10_000)?;
        let t = Instant::now();
        run_batch(&mut m, capacity, commands)?;
        let ns = t.elapsed().as_nanos() as f64 / commands as f64;
        println!(
            "batch {capacity:>3}{}: {ns:>6.1} ns per 4 KiB read (StorageBatch kept full, {posts} completion(s) per step, device model included)",
            if volume { " (1-member volume)" } else { "" }
        );
        return Ok(());
    }
    let storage_owned = std::env::args().any(|a| a == "storage-owned");
    if storage_owned || std::env::args().any(|a| a == "storage") {
        let cfg = MockConfig { depth: 256, null: true, ..MockConfig::default() };
        let volume = std::env::args().any(|a| a == "volume");
        let bytes = std::env::args().find_map(|a| a.strip_prefix("bytes=").and_then(|b| b.parse().ok()));
        let bytes: u64 = bytes.unwrap_or(4096);
        let members = std::env::args().find_map(|a| a.strip_prefix("members=").and_then(|b| b.parse().ok()));
        let members: usize = members.unwrap_or(1);
        let m = match (storage_owned, volume) {
            (_, true) => MockStorage::stepped_thread_queue_volume(cfg, members)?,
            (true, false) => MockStorage::stepped_thread_queue(cfg)?,
            (false, false) => MockStorage::stepped(cfg)?,
        };
        run_storage(&m, 10_000, bytes)?;
        let t = Instant::now();
        run_storage(&m, commands, bytes)?;
        let ns = t.elapsed().as_nanos() as f64 / commands as f64;
        let mode = match (storage_owned, volume) {
            (_, true) => format!("storage-owned, {members}-member volume"),
            (true, false) => "storage-owned".into(),
            (false, false) => "storage".into(),
        };
        println!("burst  1 ({mode}): {ns:>6.1} ns per {} KiB read (Storage::read, device model included)", bytes >> 10);
        return Ok(());
    }
    let mut m = MockQueue::with(MockConfig { depth: 256, stepped: true, null: true, ..MockConfig::default() })?;
    for burst in bursts {
        run(&mut m, burst, 10_000, owned)?;
        let t = Instant::now();
        run(&mut m, burst, commands, owned)?;
        let ns = t.elapsed().as_nanos() as f64 / commands as f64;
        let mode = if owned { "owned" } else { "shared" };
        println!(
            "burst {burst:>2} ({mode}): {ns:>6.1} ns per 4 KiB command (build + PRP + doorbell + device model + reap)"
        );
    }
    Ok(())
}

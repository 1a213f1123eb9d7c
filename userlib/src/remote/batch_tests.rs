//! Batches on the remote path against the in-process fake target: entries pipelined on the
//! batch's own queues (the fake answers only once several commands wait on one connection),
//! data through every way it moves, and named failures for a target that goes silent or away.

use super::fake::{Fake, FakeConfig};
use crate::batch::{IoStatus, Op};
use crate::error::Error;
use crate::storage_batch::{IoRequest, StorageBatch};
use crate::Storage;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    crate::pattern::fill(seed, 0, &mut v);
    v
}

fn request(op: Op, buf: &Arc<crate::Buffer>, buf_offset: u64, file_offset: u64, len: u64, cookie: u64) -> IoRequest {
    IoRequest { op, buf: buf.clone(), buf_offset, file_offset, len, cookie }
}

/// Collects `n` events (or fails after 10 s).
fn events(b: &mut StorageBatch, n: usize) -> Vec<crate::batch::IoEvent> {
    let t = Instant::now();
    let mut out = Vec::new();
    while out.len() < n && t.elapsed() < Duration::from_secs(10) {
        out.extend(b.status(n - out.len(), Duration::from_secs(1)).unwrap());
    }
    out
}

#[test]
fn a_batch_keeps_many_commands_in_flight_on_one_connection() {
    // The fake answers an I/O queue only once 8 commands wait on it: one command per
    // connection at a time (the worker threads' way) never gets an answer.
    let cfg = FakeConfig { gather: 8, ..Default::default() };
    let fake = Fake::start(cfg.clone());
    let disk: Vec<u8> = pattern(11, 64 * 4096);
    fake.disk.lock().unwrap()[..disk.len()].copy_from_slice(&disk);
    let st = Arc::new(Storage::open(fake.uri(&cfg.nqn, 1)).unwrap());
    let mut b = StorageBatch::new(&st, 32).unwrap();
    assert!(b.is_native(), "a TCP batch has queues of its own");
    let buf = Arc::new(st.alloc_host(32 * 4096).unwrap());
    let reqs: Vec<IoRequest> =
        (0..32u64).map(|i| request(Op::Read, &buf, i * 4096, (63 - i) * 4096, 4096, i)).collect();
    b.submit(&reqs).unwrap();
    assert_eq!(b.in_flight(), 32);
    let evs = events(&mut b, 32);
    assert_eq!(evs.len(), 32, "{evs:?}");
    for e in &evs {
        assert_eq!((e.status, e.bytes), (IoStatus::Complete, 4096), "{e:?}");
    }
    let mut back = vec![0u8; 32 * 4096];
    buf.copy_out(0, &mut back).unwrap();
    for i in 0..32usize {
        let want = &disk[(63 - i) * 4096..(64 - i) * 4096];
        assert!(&back[i * 4096..(i + 1) * 4096] == want, "entry {i} read the wrong bytes");
    }
    assert_eq!(buf.inflight(), 0);
    assert_eq!(st.path_counts().remote, 32);
}

#[test]
fn batch_writes_and_reads_move_data_in_capsule_by_r2t_and_in_several_commands() {
    // 2 KiB in the capsule, 64 KiB by R2T in 16 KiB H2CData PDUs, 3 MiB in three commands;
    // reads come back in 32 KiB C2HData PDUs and response capsules.
    let cfg = FakeConfig {
        in_capsule: 4096,
        maxh2c: 16384,
        r2t_max: 32768,
        c2h_max: 32768,
        success_flag: false,
        ..Default::default()
    };
    let fake = Fake::start(cfg.clone());
    let st = Arc::new(Storage::open(fake.uri(&cfg.nqn, 1)).unwrap());
    let sizes = [2048u64, 65536, 3 << 20];
    let total: u64 = sizes.iter().sum();
    let buf = Arc::new(st.alloc_host(total as usize).unwrap());
    let data = pattern(3, total as usize);
    buf.copy_in(0, &data).unwrap();
    let mut b = StorageBatch::new(&st, 8).unwrap();
    assert!(b.is_native());
    let mut at = 0;
    let mut writes = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        writes.push(request(Op::Write, &buf, at, (1 << 20) + at, n, i as u64));
        at += n;
    }
    b.submit(&writes).unwrap();
    for e in events(&mut b, 3) {
        assert_eq!(e.status, IoStatus::Complete, "{e:?}");
        assert_eq!(e.bytes, sizes[e.cookie as usize]);
    }
    assert!(fake.disk.lock().unwrap()[1 << 20..(1 << 20) + total as usize] == data[..], "disk after the writes");
    buf.copy_in(0, &vec![0u8; total as usize]).unwrap();
    let reads: Vec<IoRequest> = writes.iter().map(|w| IoRequest { op: Op::Read, ..w.clone() }).collect();
    b.submit(&reads).unwrap();
    for e in events(&mut b, 3) {
        assert_eq!(e.status, IoStatus::Complete, "{e:?}");
    }
    let mut back = vec![0u8; total as usize];
    buf.copy_out(0, &mut back).unwrap();
    assert!(back == data, "read back differs");
    assert_eq!(buf.inflight(), 0);
}

#[test]
fn large_entries_in_several_c2h_pdus_read_back_what_was_written() {
    // Eight 1 MiB entries in flight at once, each in four C2HData PDUs, three rounds.
    let cfg = FakeConfig { c2h_max: 256 << 10, ..Default::default() };
    let fake = Fake::start(cfg.clone());
    let disk = pattern(21, 8 << 20);
    fake.disk.lock().unwrap()[..8 << 20].copy_from_slice(&disk);
    let st = Arc::new(Storage::open(fake.uri(&cfg.nqn, 1)).unwrap());
    let buf = Arc::new(st.alloc_host(8 << 20).unwrap());
    let mut b = StorageBatch::new(&st, 8).unwrap();
    for round in 0..3u64 {
        let reqs: Vec<IoRequest> =
            (0..8u64).map(|i| request(Op::Read, &buf, i << 20, (7 - i) << 20, 1 << 20, round * 8 + i)).collect();
        b.submit(&reqs).unwrap();
        let evs = events(&mut b, 8);
        assert_eq!(evs.len(), 8);
        assert!(evs.iter().all(|e| e.status == IoStatus::Complete && e.bytes == 1 << 20), "{evs:?}");
        let mut back = vec![0u8; 8 << 20];
        buf.copy_out(0, &mut back).unwrap();
        for i in 0..8usize {
            assert!(back[i << 20..(i + 1) << 20] == disk[(7 - i) << 20..(8 - i) << 20], "round {round} entry {i}");
        }
        buf.copy_in(0, &vec![0u8; 8 << 20]).unwrap();
    }
    assert_eq!(buf.inflight(), 0);
}

#[test]
fn a_silent_target_times_the_batch_out_by_name_and_releases_its_buffers() {
    // The fake never answers an I/O queue (it waits for more commands than come).
    let cfg = FakeConfig { gather: 1000, ..Default::default() };
    let fake = Fake::start(cfg.clone());
    let st = Arc::new(Storage::open(fake.uri(&cfg.nqn, 1)).unwrap());
    let buf = Arc::new(st.alloc_host(4 * 4096).unwrap());
    let mut b = StorageBatch::new(&st, 4).unwrap();
    let reqs: Vec<IoRequest> = (0..4u64).map(|i| request(Op::Read, &buf, i * 4096, i * 4096, 4096, i)).collect();
    b.submit(&reqs).unwrap();
    let t = Instant::now();
    let evs = events(&mut b, 4);
    // The URI's timeout is 300 ms.
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(evs.len(), 4);
    for e in &evs {
        assert_eq!(e.status, IoStatus::Timeout, "{e:?}");
        assert!(matches!(e.error, Some(Error::RemoteTransport { .. })), "{e:?}");
    }
    assert_eq!(buf.inflight(), 0, "every lease is back");
}

#[test]
fn a_restarted_target_fails_the_batch_by_name_and_the_next_batch_reconnects() {
    let cfg = FakeConfig { gather: 1000, ..Default::default() };
    let fake = Fake::start(cfg.clone());
    let st = Arc::new(Storage::open(fake.uri(&cfg.nqn, 1)).unwrap());
    let buf = Arc::new(st.alloc_host(8 * 4096).unwrap());
    {
        let mut b = StorageBatch::new(&st, 8).unwrap();
        let reqs: Vec<IoRequest> = (0..8u64).map(|i| request(Op::Write, &buf, i * 4096, i * 4096, 4096, i)).collect();
        b.submit(&reqs).unwrap();
        fake.kill();
        let evs = events(&mut b, 8);
        assert_eq!(evs.len(), 8);
        for e in &evs {
            assert!(matches!(e.status, IoStatus::Failed | IoStatus::Timeout), "{e:?}");
            let err = e.error.as_ref().expect("a failed entry says why");
            assert!(matches!(err, Error::RemoteTransport { .. } | Error::RemoteProtocol { .. }), "{err}");
        }
    }
    assert_eq!(buf.inflight(), 0);
    // A new batch reconnects; dropped with entries in flight, it waits for them (bounded by
    // the timeout), closes its queues and hands every buffer back.
    let mut b = StorageBatch::new(&st, 2).unwrap();
    let reqs: Vec<IoRequest> = (0..2u64).map(|i| request(Op::Read, &buf, i * 4096, 0, 4096, i)).collect();
    b.submit(&reqs).unwrap();
    drop(b);
    assert_eq!(buf.inflight(), 0);
}

/// The threads a batch starts for its large entries (the caller's is one more).
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(4) - 1
}

#[test]
fn large_entries_run_on_threads_each_with_a_connection_of_its_own() {
    let cfg = FakeConfig::default();
    let fake = Fake::start(cfg.clone());
    let disk: Vec<u8> = pattern(23, 16 << 17);
    fake.disk.lock().unwrap()[..disk.len()].copy_from_slice(&disk);
    let st = Arc::new(Storage::open(fake.uri(&cfg.nqn, 1)).unwrap());
    let mut b = StorageBatch::new(&st, 8).unwrap();
    let buf = Arc::new(st.alloc_host(8 << 17).unwrap());
    // Small entries stay on the batch's own queue: no connection is added for them.
    let small: Vec<IoRequest> = (0..4u64).map(|i| request(Op::Read, &buf, i * 4096, i * 4096, 4096, i)).collect();
    b.submit(&small).unwrap();
    assert_eq!(events(&mut b, 4).len(), 4);
    let before = fake.connections();
    // 128 KiB entries (twice, so the threads outlive one round), from the disk's back half.
    for round in 0..2u64 {
        let large: Vec<IoRequest> =
            (0..8u64).map(|i| request(Op::Read, &buf, i << 17, (15 - i - round) << 17, 1 << 17, 10 + i)).collect();
        let signals = crate::sys::SIGNALS.with(|s| s.get());
        b.submit(&large).unwrap();
        // Orders handed over in one submit wake each thread once, not once per entry.
        let signals = crate::sys::SIGNALS.with(|s| s.get()) - signals;
        assert!(signals <= threads() as u64, "round {round}: {signals} signals to {} threads", threads());
        assert_eq!(b.in_flight(), 8);
        let evs = events(&mut b, 8);
        assert_eq!(evs.len(), 8, "{evs:?}");
        for e in &evs {
            assert_eq!((e.status, e.bytes), (IoStatus::Complete, 1 << 17), "{e:?}");
        }
        let mut back = vec![0u8; 8 << 17];
        buf.copy_out(0, &mut back).unwrap();
        for i in 0..8usize {
            let at = (15 - i - round as usize) << 17;
            assert!(back[i << 17..(i + 1) << 17] == disk[at..at + (1 << 17)], "round {round} entry {i}: wrong bytes");
        }
        assert_eq!(buf.inflight(), 0, "every lease is back");
    }
    let added = fake.connections() - before;
    if threads() >= 1 {
        assert_eq!(added, threads(), "a connection per thread, made once");
    } else {
        assert_eq!(added, 0, "one CPU: no threads");
    }
}

#[test]
fn a_batch_dropped_with_large_entries_in_flight_closes_their_queues_and_releases_its_buffers() {
    // The fake never answers an I/O queue: the entries stay in flight until the batch goes.
    let cfg = FakeConfig { gather: 1000, ..Default::default() };
    let fake = Fake::start(cfg.clone());
    let st = Arc::new(Storage::open(fake.uri(&cfg.nqn, 1)).unwrap());
    let buf = Arc::new(st.alloc_host(4 << 17).unwrap());
    let mut b = StorageBatch::new(&st, 4).unwrap();
    let reqs: Vec<IoRequest> = (0..4u64).map(|i| request(Op::Read, &buf, i << 17, i << 17, 1 << 17, i)).collect();
    b.submit(&reqs).unwrap();
    assert_eq!(b.status(1, Duration::from_millis(20)).unwrap().len(), 0);
    assert_eq!(buf.inflight(), 4);
    let t = Instant::now();
    drop(b);
    // Dropping cancels: started entries get the URI's timeout (300 ms), then the threads stop.
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(buf.inflight(), 0, "every lease is back once the batch is gone");
}

#[test]
fn large_entries_fail_by_name_when_their_threads_find_no_connection() {
    let cfg = FakeConfig::default();
    let fake = Fake::start(cfg.clone());
    let st = Arc::new(Storage::open(fake.uri(&cfg.nqn, 1)).unwrap());
    let mut b = StorageBatch::new(&st, 8).unwrap();
    let buf = Arc::new(st.alloc_host(4 << 17).unwrap());
    let reqs: Vec<IoRequest> = (0..4u64).map(|i| request(Op::Read, &buf, i << 17, i << 17, 1 << 17, i)).collect();
    // The first round starts the threads.
    b.submit(&reqs).unwrap();
    assert!(events(&mut b, 4).iter().all(|e| e.status == IoStatus::Complete));
    // The target goes away for good: its connections close and no new one is accepted.
    fake.refuse();
    fake.kill();
    // The first round after finds the connections broken, the next finds none to make: each
    // entry still gets its event, on the caller's queues and on the threads'.
    for round in 0..3 {
        b.submit(&reqs).unwrap();
        let evs = events(&mut b, 4);
        assert_eq!(evs.len(), 4, "round {round}: {evs:?}");
        for e in &evs {
            assert_ne!(e.status, IoStatus::Complete, "round {round}: {e:?}");
            assert!(matches!(e.error, Some(Error::RemoteTransport { .. })), "round {round}: {e:?}");
        }
        assert_eq!(b.in_flight(), 0, "round {round}");
    }
    assert_eq!(buf.inflight(), 0, "every lease is back");
}

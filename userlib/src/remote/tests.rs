//! The remote path against the in-process fake target: round trips through every way data
//! moves (in-capsule, R2T/H2CData split by MAXH2CDATA, C2HData with and without the SUCCESS
//! flag, PDU data alignment, MDTS splits), and named errors, never a panic or a hang, for bad
//! targets and garbage PDUs.

use super::fake::{silent_target, Fake, FakeConfig, Garbage};
use crate::error::Error;
use crate::{Path, Storage};
use proptest::prelude::*;
use std::time::{Duration, Instant};

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    crate::pattern::fill(seed, 0, &mut v);
    v
}

/// Writes and reads back several sizes at odd block offsets; checks the fake's disk too.
fn round_trips(cfg: FakeConfig) {
    let bs = cfg.block_size;
    let fake = Fake::start(cfg.clone());
    let st = Storage::open(fake.uri(&cfg.nqn, 1)).unwrap();
    assert_eq!(st.block_size(), bs as u64);
    assert_eq!(st.capacity().unwrap(), (bs * cfg.blocks) as u64);
    assert!(st.describe().contains("remote path"), "{}", st.describe());
    let buf = st.alloc_host(3 << 20).unwrap();
    assert_eq!(buf.path(), Path::Remote);
    let mut ios = 0;
    for (i, len) in [bs, 4096, 12 * 1024, 1 << 20, (3 << 20) - bs].into_iter().enumerate() {
        let off = ((2 * i + 1) * 7 * bs) as u64;
        let data = pattern(i as u64 + 1, len);
        buf.copy_in(0, &data).unwrap();
        assert_eq!(st.write(&buf, 0, off, len as u64).unwrap(), len as u64);
        assert_eq!(&fake.disk.lock().unwrap()[off as usize..off as usize + len], &data[..], "disk after write {len}");
        buf.copy_in(0, &vec![0u8; len]).unwrap();
        assert_eq!(st.read(&buf, 0, off, len as u64).unwrap(), len as u64);
        let mut back = vec![0u8; len];
        buf.copy_out(0, &mut back).unwrap();
        assert!(back == data, "read back {len} bytes at {off} differ");
        ios += 2;
    }
    // An unaligned buffer offset works (no DMA alignment over a socket).
    buf.copy_in(3, &pattern(99, bs)).unwrap();
    st.write(&buf, 3, 0, bs as u64).unwrap();
    assert_eq!(&fake.disk.lock().unwrap()[..bs], &pattern(99, bs)[..]);
    st.flush().unwrap();
    let c = st.path_counts();
    assert_eq!((c.remote, c.direct_host, c.fallback), (ios + 1, 0, 0), "{c:?}");
}

#[test]
fn round_trip_in_capsule_and_success_flag() {
    round_trips(FakeConfig { in_capsule: 16384, ..Default::default() });
}

#[test]
fn round_trip_r2t_split_by_maxh2cdata_and_response_capsules() {
    round_trips(FakeConfig {
        in_capsule: 0,
        maxh2c: 4096,
        r2t_max: 64 * 1024,
        c2h_max: 8192,
        success_flag: false,
        ..Default::default()
    });
}

#[test]
fn round_trip_padded_pdus_4k_blocks_and_small_mdts() {
    round_trips(FakeConfig {
        cpda: 7,
        block_size: 4096,
        blocks: 4096,
        mdts: 2,
        in_capsule: 4096,
        ..Default::default()
    });
}

#[test]
fn gpu_memory_is_staged_through_host_memory() {
    let cfg = FakeConfig { in_capsule: 0, ..Default::default() };
    let fake = Fake::start(cfg.clone());
    let st = Storage::open(fake.uri(&cfg.nqn, 1)).unwrap();
    let gpu = crate::Gpu::cpu();
    let buf = st.register_gpu(std::sync::Arc::new(gpu.alloc(5 << 20).unwrap()), false).unwrap();
    assert_eq!(buf.path(), Path::RemoteStaged);
    // Several staging chunks, at a block-aligned but odd offset.
    let (off, len) = (3 * 512u64, (5 << 20) - 4096);
    let data = pattern(11, len);
    buf.copy_in(4096, &data).unwrap();
    st.write(&buf, 4096, off, len as u64).unwrap();
    assert!(fake.disk.lock().unwrap()[off as usize..off as usize + len] == data[..]);
    buf.copy_in(0, &vec![0u8; 5 << 20]).unwrap();
    st.read(&buf, 0, off, len as u64).unwrap();
    let mut back = vec![0u8; len];
    buf.copy_out(0, &mut back).unwrap();
    assert!(back == data);
    let c = st.path_counts();
    assert_eq!((c.remote_staged, c.remote), (2, 0), "{c:?}");
    assert_eq!(buf.inflight(), 0);
}

#[test]
fn wrong_nqn_is_rejected_by_name() {
    let fake = Fake::start(FakeConfig::default());
    let e = Storage::open(fake.uri("nqn.2024-01.io.ugds:nope", 1)).unwrap_err();
    assert!(
        matches!(&e, Error::RemoteRejected { status: crate::Rejection::Connect(status), .. } if status.sc == 0x82),
        "{e}"
    );
    assert!(e.to_string().contains("subsystem NQN"), "{e}");
}

#[test]
fn missing_namespace_is_named() {
    let fake = Fake::start(FakeConfig::default());
    let e = Storage::open(fake.uri(&FakeConfig::default().nqn, 2)).unwrap_err();
    assert!(matches!(e, Error::NoNamespace(2)), "{e}");
}

#[test]
fn a_namespace_size_that_overflows_is_a_protocol_error() {
    // 2^55 blocks of 4 KiB: 2^67 bytes, past u64.
    let cfg = FakeConfig { block_size: 4096, blocks: 16, nsze: Some(1 << 55), ..Default::default() };
    let fake = Fake::start(cfg.clone());
    let e = Storage::open(fake.uri(&cfg.nqn, 1)).unwrap_err();
    assert!(
        matches!(&e, Error::RemoteProtocol { reason, .. } if reason.contains("namespace 1") && reason.contains("overflows")),
        "{e}"
    );
    // The largest size that fits still opens, and its capacity is exact.
    let fake = Fake::start(FakeConfig { nsze: Some(u64::MAX / 4096), ..cfg.clone() });
    let st = Storage::open(fake.uri(&cfg.nqn, 1)).unwrap();
    assert_eq!(st.capacity().unwrap(), u64::MAX / 4096 * 4096);
}

#[test]
fn closed_port_is_unreachable_quickly() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let t = Instant::now();
    let e = Storage::open(format!("nvmeof://tcp/{addr}/nqn.x?nsid=1")).unwrap_err();
    assert!(matches!(&e, Error::RemoteUnreachable { .. }), "{e}");
    assert_eq!(e.errno(), -libc::ECONNREFUSED);
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn silent_target_times_out_by_name() {
    let addr = silent_target();
    let t = Instant::now();
    let e = Storage::open(format!("nvmeof://tcp/{addr}/nqn.x?nsid=1&timeout_ms=200")).unwrap_err();
    assert!(
        matches!(&e, Error::RemoteTransport { source, .. } if source.raw_os_error() == Some(libc::ETIMEDOUT)),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn garbage_during_io_fails_that_io_by_name_and_the_next_reconnects() {
    let mut bytes = vec![0u8; 24];
    (bytes[0], bytes[2], bytes[4]) = (0x42, 24, 24);
    let cfg = FakeConfig { garbage: Some(Garbage { conn: 1, after: 4, bytes, hold: false }), ..Default::default() };
    let fake = Fake::start(cfg.clone());
    let st = Storage::open(fake.uri(&cfg.nqn, 1)).unwrap();
    let buf = st.alloc_host(4096).unwrap();
    // PDUs 2 and 3 of the I/O connection (after ICResp and the Connect's response): the two
    // reads' data; the third read gets garbage.
    st.read(&buf, 0, 0, 4096).unwrap();
    st.read(&buf, 0, 0, 4096).unwrap();
    let e = st.read(&buf, 0, 0, 4096).unwrap_err();
    assert!(matches!(&e, Error::RemoteProtocol { reason, .. } if reason.contains("PDU type 0x42")), "{e}");
    assert_eq!(buf.inflight(), 0);
    // The next I/O gets a new connection (which the fake serves).
    st.read(&buf, 0, 0, 4096).unwrap();
}

#[test]
fn a_restarted_target_fails_the_io_in_flight_by_name_then_reconnects_with_the_data() {
    let cfg = FakeConfig::default();
    let fake = Fake::start(cfg.clone());
    let st = Storage::open(fake.uri(&cfg.nqn, 1)).unwrap();
    let buf = st.alloc_host(65536).unwrap();
    buf.copy_in(0, &pattern(5, 65536)).unwrap();
    st.write(&buf, 0, 8192, 65536).unwrap();
    fake.kill();
    // The I/O that meets the closed connection fails by name; it is not retried.
    let e = st.read(&buf, 0, 8192, 65536).unwrap_err();
    assert!(matches!(e, Error::RemoteTransport { .. } | Error::RemoteProtocol { .. }), "{e}");
    // The next one connects a new controller (the admin queue died too) and sees the data.
    buf.copy_in(0, &[0u8; 65536]).unwrap();
    st.read(&buf, 0, 8192, 65536).unwrap();
    let mut back = vec![0u8; 65536];
    buf.copy_out(0, &mut back).unwrap();
    assert!(back == pattern(5, 65536));
    assert!(st.describe().contains("reconnected 1 times"), "{}", st.describe());
    assert_eq!(buf.inflight(), 0);
}

#[test]
fn a_target_that_stays_down_fails_within_the_timeout() {
    let cfg = FakeConfig::default();
    let fake = Fake::start(cfg.clone());
    let st = Storage::open(fake.uri(&cfg.nqn, 1)).unwrap();
    let buf = st.alloc_host(4096).unwrap();
    st.read(&buf, 0, 0, 4096).unwrap();
    // Kill the connections for good: every new one is closed at once too.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (f, s2) = (std::sync::Arc::new(fake), stop.clone());
    let f2 = f.clone();
    let killer = std::thread::spawn(move || {
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            f2.kill();
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    std::thread::sleep(Duration::from_millis(20));
    let t = Instant::now();
    assert!(st.read(&buf, 0, 0, 4096).is_err());
    let e = st.read(&buf, 0, 0, 4096).unwrap_err();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    killer.join().unwrap();
    assert!(named(&e), "{e}");
    // Two I/Os, each bounded by the 300 ms timeout (the second one's reconnect attempts too).
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

/// What the initiator may answer to garbage: a named error, nothing else.
fn named(e: &Error) -> bool {
    matches!(e, Error::RemoteProtocol { .. } | Error::RemoteTransport { .. } | Error::RemoteRejected { .. })
        || matches!(e, Error::RemoteUnreachable { .. })
        || matches!(e, Error::Nvme { .. } | Error::NoNamespace(_) | Error::Unsupported { .. } | Error::DeviceFaulted)
        || matches!(e, Error::Timeout { .. })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random bytes in place of any PDU the target sends (during bring-up on the admin queue,
    /// or during I/O on an I/O queue), then silence or a close: a named error within the
    /// timeout, never a panic, a hang or data claimed read.
    #[test]
    fn garbage_pdus_give_named_errors(
        conn in 0usize..2,
        after in 0usize..12,
        bytes in proptest::collection::vec(any::<u8>(), 1..200),
        hold in any::<bool>(),
        header_like in any::<bool>(),
    ) {
        let mut bytes = bytes;
        if header_like && bytes.len() >= 8 {
            // Plausible types and lengths get further into the parser.
            bytes[0] = [0x01, 0x03, 0x05, 0x07, 0x09][bytes[1] as usize % 5];
            bytes[2] = 24;
        }
        let cfg = FakeConfig {
            garbage: Some(Garbage { conn, after, bytes, hold }),
            in_capsule: 0,
            success_flag: after % 2 == 0,
            c2h_max: 2048,
            ..Default::default()
        };
        let fake = Fake::start(cfg.clone());
        let t = Instant::now();
        let r = Storage::open(fake.uri(&cfg.nqn, 1)).and_then(|st| {
            let buf = st.alloc_host(16384)?;
            for _ in 0..4 {
                st.write(&buf, 0, 4096, 16384)?;
                st.read(&buf, 0, 4096, 16384)?;
            }
            Ok(())
        });
        prop_assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
        match r {
            Err(e) => prop_assert!(named(&e), "unnamed error {e:?}"),
            // Garbage placed after the last PDU of the run is never sent.
            Ok(()) => prop_assert!(conn == 0 && after > 9, "garbage on connection {conn} after {after} went unnoticed"),
        }
    }
}

/// A queue handed back after a synchronous I/O wakes nobody when nobody waits (a wake-up is a
/// system call: one per I/O before), and callers that outnumber the controller's queues
/// still each get one as the others hand theirs back.
#[test]
fn queues_come_back_without_a_wake_up_unless_a_caller_waits_for_one() {
    use super::fabrics::Controller;
    use super::uri::RemoteSpec;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    let cfg = FakeConfig::default();
    let fake = Fake::start(cfg.clone());
    let spec = RemoteSpec::parse(&fake.uri(&cfg.nqn, 1)).unwrap();
    let ctrl = Arc::new(Controller::connect(&spec).unwrap());
    for _ in 0..50 {
        let q = ctrl.take_queue().unwrap();
        ctrl.put_queue(q);
    }
    assert_eq!(ctrl.wakes.load(Ordering::Relaxed), 0, "queues handed back with nobody waiting woke someone");
    // The fake grants 4 I/O queues: 12 callers holding one each for a while must wait.
    let t = Instant::now();
    let callers: Vec<_> = (0..12)
        .map(|_| {
            let ctrl = ctrl.clone();
            std::thread::spawn(move || {
                for _ in 0..5 {
                    let q = ctrl.take_queue().unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                    ctrl.put_queue(q);
                }
            })
        })
        .collect();
    for c in callers {
        c.join().unwrap();
    }
    assert!(t.elapsed() < Duration::from_secs(10), "callers waited {:?}", t.elapsed());
    assert!(ctrl.wakes.load(Ordering::Relaxed) > 0, "no caller ever waited for a queue");
}

//! The direct path over the in-memory device model: a [`Device`] whose queue pair is the mock's
//! and whose control-plane node is `/dev/null`, so every ioctl fails: a controller reset cannot
//! confirm that anything stopped, and deregistering does nothing.

use super::mock_device::{mock_buffer, mock_device};
use super::*;
use crate::mock::{Behaviour, Fault, MockConfig};
use crate::Storage;

/// A read that times out, with a reset that cannot confirm the controller stopped, leaves its
/// memory in flight: the buffer's lease is kept, deregistration is refused by name, and dropping
/// the buffer keeps its registration (the module's pin, here the device reference it holds)
/// instead of releasing it. A read that completes releases both as usual.
#[test]
fn a_stranded_command_keeps_its_registration() {
    let cfg = MockConfig { behaviour: Behaviour::Script(vec![Fault::Never]), ..MockConfig::default() };
    let (dev, mock) = mock_device(cfg, Duration::from_millis(50)).unwrap();
    let st = Storage::direct(&dev, 1).unwrap();
    let refs = Arc::strong_count(&dev.inner);
    let buf = mock_buffer(&st, &dev, &mock).unwrap();
    assert_eq!(Arc::strong_count(&dev.inner), refs + 1, "the registration holds the device");
    let e = st.read(&buf, 0, 0, 4096).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert_eq!(buf.inflight(), 1, "the stranded read's lease is kept");
    let (buf, e) = *buf.deregister().unwrap_err();
    assert!(matches!(e, Error::RegistrationBusy { inflight: 1, .. }), "{e:?}");
    drop(buf);
    assert_eq!(Arc::strong_count(&dev.inner), refs + 1, "the registration was released");
    let ok = mock_buffer(&st, &dev, &mock).unwrap();
    assert_eq!(st.read(&ok, 0, 8192, 4096).unwrap(), 4096);
    assert_eq!(ok.inflight(), 0);
    drop(ok);
    assert_eq!(Arc::strong_count(&dev.inner), refs + 1, "only the stranded registration is kept");
}

/// A synchronous request that one command carries goes through the queue's one-command calls:
/// its data arrives where the registration says, a failed status names the command and its
/// LBA, and its lease is given back either way.
#[test]
fn one_command_requests_move_data_and_report_their_status() {
    let cfg =
        MockConfig { behaviour: Behaviour::Script(vec![Fault::None, Fault::Status(0x281)]), ..MockConfig::default() };
    let (dev, mock) = mock_device(cfg, Duration::from_secs(5)).unwrap();
    let st = Storage::direct(&dev, 1).unwrap();
    let buf = mock_buffer(&st, &dev, &mock).unwrap();
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    mock.set_backing(5, &block);
    assert_eq!(st.read(&buf, 8192, 5 * 4096, 4096).unwrap(), 4096);
    assert_eq!(mock.host_read(8192, 4096), block, "the block landed at the buffer offset");
    let e = st.read(&buf, 0, 9 * 4096, 4096).unwrap_err();
    match e {
        Error::Nvme { op, slba, status } => {
            assert_eq!((op, slba), ("read", 9));
            assert!(!status.is_success());
        }
        e => panic!("expected the command's status, got {e:?}"),
    }
    assert_eq!(buf.inflight(), 0, "both leases given back");
    // Two pages in one command (PRP2 names the second).
    let two: Vec<u8> = (0..2 * 4096u32).map(|i| (i % 251) as u8).collect();
    mock.set_backing(0, &two);
    assert_eq!(st.read(&buf, 0, 0, 8192).unwrap(), 8192);
    assert_eq!(mock.host_read(0, 8192), two);
}

/// A stepped mock behind a `Storage` answers the reader's own idle polls (what the cost
/// benchmark's whole-read modes rely on), on the shared queue and on the thread's own: reads
/// complete on one thread, with no device thread, and stop being answered once the mock
/// storage is gone.
#[test]
fn a_stepped_mock_storage_answers_on_the_readers_thread() {
    use super::mock_device::MockStorage;
    // On a thread of its own: the per-thread queue's claim is this thread's.
    std::thread::scope(|s| {
        s.spawn(|| {
            for own in [false, true] {
                let m = if own {
                    MockStorage::stepped_thread_queue(MockConfig::default())
                } else {
                    MockStorage::stepped(MockConfig::default())
                }
                .unwrap();
                for k in 0..8u64 {
                    assert_eq!(m.storage.read(&m.buffer, k * 4096, k * 4096, 4096).unwrap(), 4096);
                }
                assert_eq!(m.buffer.inflight(), 0);
                drop(m);
                assert!(!crate::mock::stepping_on_idle_polls(), "no model is stepped on this thread's polls any more");
            }
        })
        .join()
        .unwrap()
    });
}

/// A synchronous request over chunks of two members (the volume's lanes) allocates nothing once
/// the thread holds its queues, as a node's request does: the per-member and per-command lists
/// are inline. With vectors, such a request over two chunks of a one-member volume made 14
/// allocations, about 2600 of its instructions (the cost benchmark's `storage-owned volume
/// bytes=262144`).
#[test]
fn a_volume_request_over_chunks_allocates_nothing() {
    use super::mock_device::MockStorage;
    use crate::alloc_count::allocations_in;
    std::thread::scope(|s| {
        s.spawn(|| {
            let m = MockStorage::stepped_thread_queue_volume(MockConfig::default(), 2).unwrap();
            let chunk = crate::volume::DEFAULT_CHUNK;
            // The first claims the thread's queue.
            assert_eq!(m.storage.read(&m.buffer, 0, chunk / 2, 2 * chunk).unwrap(), 2 * chunk);
            let read = || m.storage.read(&m.buffer, 0, chunk / 2, 2 * chunk).map_or(0, |n| n);
            let (bytes, allocations) = allocations_in(|| (0..100).map(|_| read()).sum::<u64>());
            assert_eq!(bytes, 100 * 2 * chunk);
            assert_eq!(allocations, 0, "allocations in 100 requests over two chunks");
        })
        .join()
        .unwrap()
    });
}

/// A storage batch on the model's queue pair, the model posting at most 4 completions a step
/// (the cost benchmark's batch mode): every wait returns what one step posted, and every entry
/// completes once.
#[test]
fn a_storage_batch_on_the_model_reaps_completions_a_few_at_a_time() {
    use super::mock_device::MockBatch;
    use crate::{IoRequest, IoStatus, Op};
    let mut m = MockBatch::stepped(MockConfig::default(), 32).unwrap();
    m.post_at_most(4);
    let reqs: Vec<IoRequest> = (0..32u64)
        .map(|i| IoRequest {
            op: Op::Read,
            buf: m.buffer.clone(),
            buf_offset: i * 4096,
            file_offset: i * 4096,
            len: 4096,
            cookie: i,
        })
        .collect();
    m.batch.submit(&reqs).unwrap();
    let mut seen = Vec::new();
    while seen.len() < 32 {
        let ev = m.batch.status(1, Duration::from_secs(5)).unwrap();
        assert!((1..=4).contains(&ev.len()), "{} events from one step of 4", ev.len());
        seen.extend(ev.iter().map(|e| (e.cookie, e.status)));
    }
    seen.sort_by_key(|s| s.0);
    assert_eq!(seen, (0..32).map(|i| (i, IoStatus::Complete)).collect::<Vec<_>>());
}

/// A storage batch kept full the way `ugds bench` keeps it (wait for at least one event into a
/// kept vector, submit a new read for each from another) allocates nothing once running: its
/// submit and its wait reuse their own vectors. `status_into` appends after what the caller's
/// vector holds and returns how many it appended. The same through a one-member volume's batch
/// (its entries' slots and piece lists are kept too).
#[test]
fn a_storage_batch_kept_full_allocates_nothing_per_round() {
    use super::mock_device::MockBatch;
    let cfg = MockConfig { null: true, ..MockConfig::default() };
    kept_full_allocates_nothing(MockBatch::stepped(cfg.clone(), 32).unwrap());
    kept_full_allocates_nothing(MockBatch::stepped_volume(cfg, 32).unwrap());
}

fn kept_full_allocates_nothing(mut m: super::mock_device::MockBatch) {
    use crate::alloc_count::allocations_in;
    use crate::{IoEvent, IoRequest, IoStatus, Op};
    m.post_at_most(4);
    let buf = m.buffer.clone();
    let read = |slot: u64| IoRequest {
        op: Op::Read,
        buf: buf.clone(),
        buf_offset: slot * 4096,
        file_offset: slot * 4096,
        len: 4096,
        cookie: slot,
    };
    let mut again: Vec<IoRequest> = (0..32).map(read).collect();
    m.batch.submit(&again).unwrap();
    let marker = IoEvent { cookie: u64::MAX, status: IoStatus::Pending, bytes: 0, error: None };
    let mut ev = vec![marker];
    let got = m.batch.status_into(1, Duration::from_secs(5), &mut ev).unwrap();
    assert!((1..=4).contains(&got) && ev.len() == got + 1, "{got} appended, {} held", ev.len());
    assert_eq!(ev[0].cookie, u64::MAX, "what the vector held stays first");
    ev.remove(0);
    let mut round = |ev: &mut Vec<IoEvent>, again: &mut Vec<IoRequest>| {
        again.clear();
        again.extend(ev.drain(..).map(|e| {
            assert_eq!(e.status, IoStatus::Complete);
            read(e.cookie)
        }));
        m.batch.submit(again).unwrap();
        m.batch.status_into(1, Duration::from_secs(5), ev).unwrap()
    };
    // The first rounds size the id table and the model's own queues.
    for _ in 0..100 {
        round(&mut ev, &mut again);
    }
    let (done, allocations) = allocations_in(|| (0..1000).map(|_| round(&mut ev, &mut again)).sum::<usize>());
    assert!(done >= 1000, "{done} reads completed in 1000 rounds");
    assert_eq!(allocations, 0, "allocations in 1000 rounds of a full batch");
}

/// A read of `len` bytes into page `cookie` of `buf`, from block `cookie` (4 KiB blocks).
fn page_read(buf: &std::sync::Arc<crate::Buffer>, cookie: u64, len: u64) -> crate::IoRequest {
    let at = cookie * 4096;
    crate::IoRequest { op: crate::Op::Read, buf: buf.clone(), buf_offset: at, file_offset: at, len, cookie }
}

/// An entry refused at submit is reported by a later wait even when the wait it would have
/// come with failed (the controller faulted meanwhile): its event goes out only with a wait
/// that succeeds.
#[test]
fn a_refused_entry_outlives_a_failed_wait() {
    use super::mock_device::MockBatch;
    use crate::IoStatus;
    let mut m = MockBatch::stepped(MockConfig { null: true, ..MockConfig::default() }, 4).unwrap();
    let buf = m.buffer.clone();
    let read = |cookie: u64, len: u64| page_read(&buf, cookie, len);
    // Entry 1 is refused (zero bytes); entry 0 runs.
    m.batch.submit(&[read(0, 4096), read(1, 0)]).unwrap();
    m.set_faulted(true);
    assert!(m.batch.status(2, Duration::from_millis(100)).is_err(), "a wait on a faulted controller fails");
    m.set_faulted(false);
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen.extend(m.batch.status(0, Duration::from_millis(100)).unwrap().into_iter().map(|e| (e.cookie, e.status)));
        if seen.iter().any(|s| s.0 == 1) {
            break;
        }
    }
    assert!(seen.contains(&(1, IoStatus::Invalid)), "the refused entry's event: {seen:?}");
}

/// A storage batch's submit that fails as a whole (the controller faulted) leaves no event of
/// its own behind: the entry it refused before the failure is not reported later.
#[test]
fn a_failed_storage_batch_submit_leaves_no_event_of_its_own() {
    use super::mock_device::MockBatch;
    let mut m = MockBatch::stepped(MockConfig { null: true, ..MockConfig::default() }, 4).unwrap();
    let buf = m.buffer.clone();
    let read = |cookie: u64, len: u64| page_read(&buf, cookie, len);
    m.set_faulted(true);
    // Entry 1 is refused by the request check (zero bytes); entry 0's submission fails.
    assert!(m.batch.submit(&[read(0, 4096), read(1, 0)]).is_err(), "a submit on a faulted controller fails");
    m.set_faulted(false);
    assert_eq!(m.batch.in_flight(), 0);
    let ev = m.batch.status(0, Duration::ZERO).unwrap();
    assert!(ev.is_empty(), "events of a submit that failed: {ev:?}");
}

/// Events a storage batch's wait gathered before a look at its queue batch failed in the same
/// call (a worker thread's entry finished, then the controller faulted) are reported by a later
/// wait, not dropped with the failed one.
#[test]
fn events_gathered_before_a_failed_look_outlive_it() {
    use super::mock_device::MockBatch;
    use crate::{IoRequest, Op};
    let cfg = MockConfig { null: true, segments: 2, blocks: 512, ..MockConfig::default() };
    let mut m = MockBatch::stepped(cfg, 4).unwrap();
    let read = |cookie: u64, len: u64| IoRequest {
        op: Op::Read,
        buf: m.buffer.clone(),
        buf_offset: 0,
        file_offset: cookie * 4096,
        len,
        cookie,
    };
    // Entry 0 runs on the queue batch and stays in flight (the model is not stepped); entry 1,
    // larger than one command, goes to a worker thread.
    m.step_on_idle_polls(false);
    m.batch.submit(&[read(0, 4096), read(1, (1 << 20) + 4096)]).unwrap();
    assert_eq!(m.batch.pooled_entries(), 1, "the large entry went to the worker threads");
    let fault = m.fault_after(Duration::from_millis(300));
    let e = m.batch.status(2, Duration::from_secs(4)).unwrap_err();
    assert!(matches!(e, Error::DeviceFaulted), "{e:?}");
    fault.join().unwrap();
    m.set_faulted(false);
    m.step_on_idle_polls(true);
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen.extend(m.batch.status(1, Duration::from_millis(100)).unwrap().into_iter().map(|e| e.cookie));
        if seen.len() >= 2 {
            break;
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 1], "both entries' events");
}

/// A batch entry larger than one command on the model's batch device, on a worker thread.
fn pooled_read(m: &mut super::mock_device::MockBatch, cookie: u64) -> crate::IoEvent {
    use crate::{IoRequest, Op};
    let big =
        IoRequest { op: Op::Read, buf: m.buffer.clone(), buf_offset: 0, file_offset: 0, len: (1 << 20) + 4096, cookie };
    m.batch.submit(&[big]).unwrap();
    assert_eq!(m.batch.pooled_entries(), 1, "the large entry went to the worker threads");
    let mut ev = m.batch.status(1, Duration::from_secs(5)).unwrap();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(m.batch.in_flight(), 0, "nothing runs");
    ev.remove(0)
}

/// An entry whose job panics on a worker thread (the worker survives it) finishes as a failed
/// entry: its event says so, and the batch does not wait for it for ever.
#[test]
fn a_worker_entry_that_panics_finishes_failed() {
    use super::mock_device::MockBatch;
    use crate::storage_batch::tests::PANICKING_COOKIE;
    let cfg = MockConfig { null: true, segments: 2, blocks: 512, ..MockConfig::default() };
    let mut m = MockBatch::stepped(cfg, 4).unwrap();
    let ev = pooled_read(&mut m, PANICKING_COOKIE);
    assert_eq!((ev.cookie, ev.status), (PANICKING_COOKIE, crate::IoStatus::Failed));
    let e = ev.error.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(e.contains("panicked"), "{e}");
}

/// A synchronous request on a device without a shared queue pair (the model's batch device,
/// whose one queue pair its batch owns; a device opened on a controller always has one) fails
/// with an error that says so, rather than panicking.
#[test]
fn a_request_on_a_device_without_a_shared_queue_fails_by_name() {
    use super::mock_device::MockBatch;
    let cfg = MockConfig { null: true, segments: 2, blocks: 512, ..MockConfig::default() };
    let mut m = MockBatch::stepped(cfg, 4).unwrap();
    let ev = pooled_read(&mut m, 7);
    assert_eq!((ev.cookie, ev.status), (7, crate::IoStatus::Failed));
    let e = ev.error.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(e.contains("no shared queue pair"), "{e}");
}

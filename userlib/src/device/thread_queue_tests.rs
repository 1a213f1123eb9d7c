//! Per-thread queues over the in-memory device model: a device whose shared queue and each
//! per-thread queue are mocks of their own (`mock_device_with_thread_queues`), so which mock
//! counted a read tells which queue carried it.

use super::mock_device::{mock_buffer, mock_device_with_thread_queues};
use super::thread_queues::{claims_held, own_slot};
use super::*;
use crate::mock::{MockConfig, MockDevice};
use crate::{Buffer, Storage};
use std::sync::Barrier;

const T: Duration = Duration::from_secs(5);

/// Reads served by each mock so far.
fn reads(mocks: &[&MockDevice]) -> Vec<u64> {
    mocks.iter().map(|m| m.stats().reads).collect()
}

/// One 4 KiB read on the calling thread; returns the slot of the thread's own queue, if any.
fn read_once(st: &Storage, buf: &Buffer, dev: &Device) -> Option<usize> {
    assert_eq!(st.read(buf, 0, 0, 4096).unwrap(), 4096);
    own_slot(&dev.inner.threads)
}

/// Two threads reading at once each get a queue of their own while spares exist: different
/// queues, each read served by its own queue's device, none by the shared queue.
#[test]
fn threads_get_queues_of_their_own_while_spares_exist() {
    let (dev, shared, mocks) = mock_device_with_thread_queues(MockConfig::default(), 2, T).unwrap();
    let st = Storage::direct(&dev, 1).unwrap();
    let buf = mock_buffer(&st, &dev, &shared).unwrap();
    let both = Barrier::new(2);
    let slots: Vec<Option<usize>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let slot = read_once(&st, &buf, &dev);
                    // Both claims held at once before either thread exits.
                    both.wait();
                    slot
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(slots.iter().all(Option::is_some), "{slots:?}");
    assert_ne!(slots[0], slots[1], "two threads, two queues");
    assert_eq!(reads(&[&shared, &mocks[0], &mocks[1]]), [0, 1, 1]);
}

/// With no spare queue a thread shares: the second thread, while the first holds the only
/// per-thread queue, reads through the shared queue; once the first thread has exited its queue
/// is free again, and the second thread's next read claims it.
#[test]
fn without_spares_threads_share_and_an_exit_returns_the_queue() {
    let (dev, shared, mocks) = mock_device_with_thread_queues(MockConfig::default(), 1, T).unwrap();
    let st = Storage::direct(&dev, 1).unwrap();
    let buf = mock_buffer(&st, &dev, &shared).unwrap();
    let (claimed, shared_read) = (Barrier::new(2), Barrier::new(2));
    let (st, buf, dev, claimed, shared_read) = (&st, &buf, &dev, &claimed, &shared_read);
    std::thread::scope(|s| {
        // Dropped if an assertion below fails, so the second thread's wait ends too.
        let (exited, first_exited) = std::sync::mpsc::channel::<()>();
        let first = s.spawn(move || {
            let slot = read_once(st, buf, dev);
            claimed.wait();
            shared_read.wait();
            slot
        });
        let second = s.spawn(move || {
            claimed.wait();
            let before = read_once(st, buf, dev);
            shared_read.wait();
            first_exited.recv().unwrap();
            (before, read_once(st, buf, dev))
        });
        let first = first.join().unwrap();
        // Joined: the first thread's thread-locals, its claim among them, are gone.
        exited.send(()).unwrap();
        let second = second.join().unwrap();
        assert_eq!(first, Some(0));
        assert_eq!(second, (None, Some(0)), "shared while none was spare, then the freed queue");
    });
    assert_eq!(reads(&[&shared, &mocks[0]]), [1, 2]);
}

/// Runs `f` on a thread of its own (its claims start empty, whatever ran on the test's thread).
fn on_new_thread(f: impl FnOnce() + Send) {
    std::thread::scope(|s| s.spawn(f).join().unwrap());
}

/// A thread's claim does not keep a closed device open, and leads nowhere once it closed: the
/// device and its per-thread queues are gone while the thread lives on, and the thread's next
/// device gives it a queue of that device (the dead claim dropped).
#[test]
fn a_closed_device_is_not_kept_by_a_threads_claim() {
    on_new_thread(|| {
        let (dev, shared, _mocks) = mock_device_with_thread_queues(MockConfig::default(), 1, T).unwrap();
        let st = Storage::direct(&dev, 1).unwrap();
        let buf = mock_buffer(&st, &dev, &shared).unwrap();
        assert_eq!(read_once(&st, &buf, &dev), Some(0));
        assert_eq!(claims_held(), 1);
        let (gone, set) = (Arc::downgrade(&dev.inner), Arc::downgrade(&*dev.inner.threads));
        drop((buf, st, dev));
        assert!(gone.upgrade().is_none(), "the device closed although this thread holds a claim on it");
        assert!(set.upgrade().is_none(), "its per-thread queues went with it");
        let (dev, shared, mocks) = mock_device_with_thread_queues(MockConfig::default(), 1, T).unwrap();
        let st = Storage::direct(&dev, 1).unwrap();
        let buf = mock_buffer(&st, &dev, &shared).unwrap();
        assert_eq!(read_once(&st, &buf, &dev), Some(0));
        assert_eq!(claims_held(), 1, "the closed device's claim was dropped");
        assert_eq!(reads(&[&shared, &mocks[0]]), [0, 1]);
    });
}

/// A controller reset re-creates the claimed queue like every other: its holder hears of the
/// new epoch once, then carries on on the same queue.
#[test]
fn a_reset_leaves_a_thread_its_queue() {
    on_new_thread(|| {
        let (dev, shared, mocks) = mock_device_with_thread_queues(MockConfig::default(), 1, T).unwrap();
        let st = Storage::direct(&dev, 1).unwrap();
        let buf = mock_buffer(&st, &dev, &shared).unwrap();
        assert_eq!(read_once(&st, &buf, &dev), Some(0));
        // The controller's reset: every queue re-created, the epoch (on the device's page) moved.
        mocks[0].reset_controller();
        shared.reset_controller();
        let e = st.read(&buf, 0, 0, 4096).unwrap_err();
        assert!(matches!(e, Error::EpochChanged { old: 1, new: 2 }), "{e:?}");
        assert_eq!(read_once(&st, &buf, &dev), Some(0), "the same queue, usable again");
        assert_eq!(reads(&[&shared, &mocks[0]]), [0, 2]);
    });
}

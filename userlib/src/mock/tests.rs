//! Host tests of the queue engine against the device model: data written through a queue pair
//! reads back (across pages, PRP lists and scattered segments), rings wrap, the device waits
//! for CQ room, and hostile completions become errors.

use super::*;
use crate::cmd::{Command, DatasetManagement, DmaRange, DsmRange, Flush, Read, Write, WriteZeroes};
use crate::error::Error;
use crate::pattern;
use crate::queue::Completion;
use proptest::prelude::*;
use std::time::Duration;
use ugds_uapi::status::StatusType;
use ugds_uapi::Status;

const T: Duration = Duration::from_secs(10);

/// `len` bytes of host memory at `off`, as the mock's device sees them.
fn dma(m: &MockQueue, off: u64, len: u64) -> DmaRange<'_> {
    // SAFETY: the mock's segments name its own memory, which only its device model touches, and
    // every caller pairs `len` with the command's block count.
    unsafe { DmaRange::new(m.segments(), off, len) }
}

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    pattern::fill(seed, 0, &mut v);
    v
}

fn blocks(m: &MockQueue, len: u64) -> u32 {
    (len / m.block_size() as u64) as u32
}

/// Submits `cmds`, steps the device and collects every completion (stepped mocks).
fn run_stepped(m: &MockQueue, cmds: &[Command<'_>]) -> Vec<Status> {
    let mut cids = vec![0u16; cmds.len()];
    m.qp.submit(1, cmds, &m.status, T, &mut cids).unwrap();
    m.step();
    let mut out = vec![None; cmds.len()];
    assert_eq!(m.qp.collect(&cids, &m.status, &mut out).unwrap(), cmds.len());
    out.into_iter().map(Option::unwrap).collect()
}

/// 512-byte blocks, 1 MiB of host memory in 256 single-page segments placed in reverse bus
/// order: every page boundary of a transfer is a segment boundary.
fn scattered(stepped: bool) -> MockQueue {
    MockQueue::with(MockConfig {
        depth: 16,
        block_size: 512,
        blocks: 8192,
        segment_bytes: 4096,
        segments: 256,
        scatter: true,
        stepped,
        ..MockConfig::default()
    })
    .unwrap()
}

#[test]
fn data_written_reads_back_across_pages_and_prp_lists() {
    let m = scattered(false);
    // (host offset, LBA, bytes): inside a page, crossing one page boundary from inside a
    // page, two whole pages, a list of 3, a list of 17 with an unaligned start, 64 pages.
    let cases = [
        (0u64, 0u64, 512u64),
        (3584, 10, 1024),
        (512, 20, 4096),
        (0, 40, 8192),
        (8192, 60, 12288),
        (1024, 100, 65536 + 512),
        (0, 300, 256 << 10),
    ];
    for (i, &(off, lba, len)) in cases.iter().enumerate() {
        let want = data(i as u64, len as usize);
        m.host_write(off as usize, &want);
        m.qp.execute(1, &[Write::new(lba, blocks(&m, len), dma(&m, off, len)).build()], &m.status, T).unwrap();
        assert_eq!(m.backing(lba, len / 512), want, "case {i}: the device got the bytes");
        let back = 512 << 10;
        m.host_write(back, &vec![0u8; len as usize]);
        m.qp.execute(1, &[Read::new(lba, blocks(&m, len), dma(&m, back as u64, len)).build()], &m.status, T).unwrap();
        assert_eq!(m.host_read(back, len as usize), want, "case {i}: read back");
    }
    let s = m.stats();
    assert_eq!((s.writes, s.reads, s.errors), (7, 7, 0));
}

#[test]
fn chained_prp_lists_are_followed() {
    // The library never chains lists (one list page covers its largest command), but the model
    // follows them as the spec says: drive it with a raw entry naming a chained list.
    let m =
        MockQueue::with(MockConfig { stepped: true, blocks: 1024, segment_bytes: 4 << 20, ..MockConfig::default() })
            .unwrap();
    let pages = 600u64;
    let want = data(7, (pages * 4096) as usize);
    m.set_backing(0, &want);
    let mut model = m.model();
    let host = m.segments()[0].dma_addr;
    // List page 0: pages 1..=511, then a pointer to list page 1: pages 512..600.
    for i in 0..511u64 {
        model.prp.store64(8 * i as usize, host + (i + 1) * 4096);
    }
    model.prp.store64(4088, PRP_BUS + 4096);
    for i in 511..pages - 1 {
        model.prp.store64(4096 + 8 * (i - 511) as usize, host + (i + 1) * 4096);
    }
    let sqe = [
        0x0000_0002u32,
        1,
        0,
        0,
        0,
        0,
        host as u32,
        (host >> 32) as u32,
        PRP_BUS as u32,
        (PRP_BUS >> 32) as u32,
        0,
        0,
        (pages - 1) as u32,
        0,
        0,
        0,
    ];
    for (i, w) in sqe.iter().enumerate() {
        model.sq.store32(4 * i, *w);
    }
    model.doorbells.store32(0, 1);
    assert_eq!(model.step(), 1);
    assert_eq!(model.cq.load32(12) >> 17, 0, "success");
    drop(model);
    assert!(m.host_read(0, want.len()) == want);
}

#[test]
fn tiny_queues_wrap_many_times_with_data() {
    for depth in [2, 3, 5] {
        let m = MockQueue::with(MockConfig { depth, ..MockConfig::default() }).unwrap();
        for i in 0..150u64 {
            let want = data(i, 4096);
            let lba = i % 200;
            m.host_write(0, &want);
            m.qp.execute(1, &[Write::new(lba, 1, dma(&m, 0, 4096)).build()], &m.status, T).unwrap();
            m.host_write(4096, &[0u8; 4096]);
            m.qp.execute(1, &[Read::new(lba, 1, dma(&m, 4096, 4096)).build()], &m.status, T).unwrap();
            assert_eq!(m.host_read(4096, 4096), want, "depth {depth}, round {i}");
        }
        let s = m.stats();
        assert_eq!((s.fetched, s.posted), (300, 300));
    }
}

#[test]
fn bursts_fill_the_queue_and_wrap() {
    let m = MockQueue::with(MockConfig { depth: 8, ..MockConfig::default() }).unwrap();
    for round in 0..100u64 {
        let n = (round % 7 + 1) as usize;
        let want = data(round, n * 4096);
        m.host_write(0, &want);
        let writes: Vec<_> = (0..n as u64).map(|k| Write::new(k * 2, 1, dma(&m, k * 4096, 4096)).build()).collect();
        m.qp.execute(1, &writes, &m.status, T).unwrap();
        let reads: Vec<_> =
            (0..n as u64).map(|k| Read::new(k * 2, 1, dma(&m, (64 + k) * 4096, 4096)).build()).collect();
        m.qp.execute(1, &reads, &m.status, T).unwrap();
        assert_eq!(m.host_read(64 * 4096, n * 4096), want, "round {round}");
    }
}

#[test]
fn the_device_waits_for_cq_room_released_by_the_head_doorbell() {
    let m = MockQueue::with(MockConfig { depth: 4, stepped: true, ..MockConfig::default() }).unwrap();
    let read = |k: u64| Read::new(k, 1, dma(&m, k * 4096, 4096)).build();
    let mut cids = [0u16; 3];
    m.qp.submit(1, &[read(0), read(1), read(2)], &m.status, T, &mut cids).unwrap();
    assert_eq!(cids, [1, 2, 3]);
    assert_eq!(m.step(), 3, "a 4-entry CQ holds 3");
    // Take one completion only: the head doorbell releases one slot.
    {
        let mut it = m.qp.completions(&m.status).unwrap();
        assert_eq!(it.next().unwrap().unwrap(), Completion { cid: 1, status: Status::SUCCESS });
    }
    assert_eq!(m.doorbells().1, 1);
    // One more command (id 1 is free again): the released slot takes its completion. A queue
    // of depth N has N - 1 command ids, as many as its CQ holds, so the device never has a
    // completion without room for it.
    let mut more = [0u16; 1];
    m.qp.submit(1, &[read(3)], &m.status, T, &mut more).unwrap();
    assert_eq!(more, [1]);
    assert_eq!(m.step(), 1);
    assert_eq!(m.stats().fetched, 4);
    assert_eq!(m.stats().cq_full, 0);
    // The unreleased entries are intact, in order, and the new one follows them.
    let got: Vec<u16> = m.qp.completions(&m.status).unwrap().map(|c| c.unwrap().cid).collect();
    assert_eq!(got, vec![2, 3, 1]);
}

#[test]
fn the_head_doorbell_gives_slots_back_a_quarter_of_the_ring_at_a_time() {
    let m = MockQueue::with(MockConfig { depth: 16, stepped: true, ..MockConfig::default() }).unwrap();
    let read = |k: u64| Read::new(k, 1, dma(&m, k * 4096, 4096)).build();
    let reap = || m.qp.completions(&m.status).unwrap().inspect(|c| assert!(c.is_ok(), "{c:?}")).count();
    let mut cids = [0u16; 3];
    m.qp.submit(1, &[read(0), read(1), read(2)], &m.status, T, &mut cids).unwrap();
    assert_eq!(m.step(), 3);
    assert_eq!(reap(), 3);
    assert_eq!(m.doorbells().1, 0, "3 consumed of a 16-slot ring: not yet given back");
    let mut one = [0u16; 1];
    m.qp.submit(1, &[read(3)], &m.status, T, &mut one).unwrap();
    assert_eq!(m.doorbells().1, 0, "the device has room for what is in flight");
    assert_eq!(m.step(), 1);
    assert_eq!(reap(), 1);
    assert_eq!(m.doorbells().1, 4, "a quarter consumed: given back with one write");
    assert_eq!(m.stats().cq_full, 0);
}

#[test]
fn a_submission_gives_slots_back_before_the_device_could_find_its_cq_full() {
    // Depth 8: 7 command ids, slots given back 2 at a time.
    let m = MockQueue::with(MockConfig { depth: 8, stepped: true, ..MockConfig::default() }).unwrap();
    let read = |k: u64| Read::new(k, 1, dma(&m, k * 4096, 4096)).build();
    let mut cids = [0u16; 7];
    let reads: Vec<_> = (0..7).map(read).collect();
    m.qp.submit(1, &reads, &m.status, T, &mut cids).unwrap();
    assert_eq!(m.step(), 7);
    {
        let mut it = m.qp.completions(&m.status).unwrap();
        assert_eq!(it.next().unwrap().unwrap().cid, 1);
    }
    assert_eq!(m.doorbells().1, 0, "one slot consumed, below the batch");
    // Id 1 again: 7 commands in flight and one unreleased slot would fill the CQ's 7.
    let mut one = [0u16; 1];
    m.qp.submit(1, &[read(7)], &m.status, T, &mut one).unwrap();
    assert_eq!(m.doorbells().1, 1, "given back before the tail doorbell");
    assert_eq!(m.step(), 1, "the device found room for the new completion");
    assert_eq!(m.stats().cq_full, 0);
    let got: Vec<u16> = m.qp.completions(&m.status).unwrap().map(|c| c.unwrap().cid).collect();
    assert_eq!(got, vec![2, 3, 4, 5, 6, 7, 1]);
}

#[test]
fn a_submission_rings_the_doorbell_once_when_dropped() {
    let m = MockQueue::with(MockConfig { stepped: true, ..MockConfig::default() }).unwrap();
    let mut sub = m.qp.submission(1, &m.status).unwrap();
    for k in 0..3 {
        sub.push(&Read::new(k, 1, dma(&m, k * 4096, 4096)).build()).unwrap();
    }
    assert_eq!((sub.len(), sub.is_empty(), m.doorbells().0), (3, false, 0), "nothing published yet");
    drop(sub);
    assert_eq!(m.doorbells().0, 3);
    drop(m.qp.submission(1, &m.status).unwrap());
    assert_eq!(m.doorbells().0, 3, "an empty submission writes no doorbell");
    // A cancelled submission publishes nothing and frees its ids.
    let mut sub = m.qp.submission(1, &m.status).unwrap();
    sub.push(&Flush::new().build()).unwrap();
    sub.push(&Flush::new().build()).unwrap();
    sub.cancel();
    assert_eq!(m.doorbells().0, 3);
    assert_eq!(m.step(), 3);
    let done: Vec<_> = m.qp.completions(&m.status).unwrap().collect();
    assert_eq!(done.len(), 3);
    let mut sub = m.qp.submission(1, &m.status).unwrap();
    assert_eq!(sub.space(), 7, "every id and slot free again");
    let e = (0..8).map(|_| sub.push(&Flush::new().build())).find_map(|r| r.err()).unwrap();
    assert!(matches!(e, Error::InvalidArgument { arg: "cmds", .. }), "{e:?}");
}

#[test]
fn write_zeroes_and_deallocate_clear_blocks() {
    let m = MockQueue::with(MockConfig { block_size: 512, blocks: 64, ..MockConfig::default() }).unwrap();
    let want = data(3, 16 * 512);
    m.host_write(0, &want);
    m.qp.execute(1, &[Write::new(0, 16, dma(&m, 0, 16 * 512)).build()], &m.status, T).unwrap();
    let ranges = [DsmRange::new(8, 2), DsmRange::new(12, 1)];
    let cmds = [
        WriteZeroes::new(2, 4).build(),
        DatasetManagement::new(&ranges).deallocate(true).build(),
        Flush::new().build(),
    ];
    m.qp.execute(1, &cmds, &m.status, T).unwrap();
    m.qp.execute(1, &[Read::new(0, 16, dma(&m, 65536, 16 * 512)).build()], &m.status, T).unwrap();
    let mut expect = want.clone();
    for (lba, n) in [(2, 4), (8, 2), (12, 1)] {
        expect[lba * 512..(lba + n) * 512].fill(0);
    }
    assert_eq!(m.host_read(65536, 16 * 512), expect);
    let s = m.stats();
    assert_eq!((s.write_zeroes, s.dsm, s.deallocated_blocks, s.flushes), (1, 1, 3, 1));
    // A range past the namespace fails the whole command and clears nothing.
    let bad = [DsmRange::new(0, 1), DsmRange::new(64, 1)];
    let e = m.qp.execute(1, &[DatasetManagement::new(&bad).deallocate(true).build()], &m.status, T).unwrap_err();
    assert!(matches!(e, Error::Nvme { op: "deallocate", status, .. } if status.sc == 0x80), "{e:?}");
    assert_eq!(m.backing(0, 1), want[..512]);
}

#[test]
fn the_model_checks_lbas_namespaces_and_bus_addresses() {
    let m = MockQueue::with(MockConfig { stepped: true, ..MockConfig::default() }).unwrap();
    let past = Read::new(255, 2, dma(&m, 0, 8192)).build();
    let nowhere = [Segment { dma_addr: 0x7000_0000, len: 1 << 20 }];
    // SAFETY: the mock device resolves bus addresses in its own memory only (this one nowhere).
    let stray = Read::new(0, 1, unsafe { DmaRange::new(&nowhere, 0, 4096) }).build();
    let st = run_stepped(&m, &[past, stray]);
    assert_eq!((st[0].sct, st[0].sc), (StatusType::Generic, 0x80), "LBA Out of Range");
    assert_eq!(st[1].sc, 0x04, "Data Transfer Error");
    let mut cids = [0u16; 1];
    m.qp.submit(2, &[Flush::new().build()], &m.status, T, &mut cids).unwrap();
    m.step();
    let mut out = [None];
    m.qp.collect(&cids, &m.status, &mut out).unwrap();
    assert_eq!(out[0].unwrap().sc, 0x0B, "Invalid Namespace or Format");
    assert_eq!(m.stats().errors, 3);
}

#[test]
fn error_statuses_reach_the_caller_by_name() {
    let m = MockQueue::new(8, Behaviour::Script(vec![Fault::Status(0x0281)])).unwrap();
    let e = m.qp.execute(1, &[Read::new(0, 1, dma(&m, 0, 4096)).build()], &m.status, T).unwrap_err();
    match e {
        Error::Nvme { op: "read", slba: 0, status } => {
            assert_eq!((status.sct, status.sc), (StatusType::Media, 0x81));
            assert_eq!(status.name(), Some("Unrecovered Read Error"));
        }
        e => panic!("{e:?}"),
    }
    m.qp.execute(1, &[Read::new(0, 1, dma(&m, 0, 4096)).build()], &m.status, T).unwrap();
}

#[test]
fn a_completion_with_a_stale_phase_is_never_taken() {
    let m = MockQueue::new(8, Behaviour::Script(vec![Fault::BadPhase])).unwrap();
    let e = m.qp.execute(1, &[Flush::new().build()], &m.status, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(e, Error::Timeout { op: "flush", .. }), "{e:?}");
}

#[test]
fn a_command_never_completed_times_out_and_keeps_its_id() {
    let m = MockQueue::new(4, Behaviour::Script(vec![Fault::Never])).unwrap();
    let e = m.qp.execute(1, &[Flush::new().build()], &m.status, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    // Its id (and PRP page) is not reused: two ids are left for the next burst, not three (a
    // 4-entry queue has ids 1..=3; id 0 is never handed out).
    for _ in 0..20 {
        m.qp.execute(1, &[Flush::new().build(), Flush::new().build()], &m.status, T).unwrap();
    }
    let sub = m.qp.submission(1, &m.status).unwrap();
    assert_eq!(sub.space(), 2);
}

#[test]
fn a_controller_reset_is_reported_and_the_queue_starts_over() {
    let m = MockQueue::new(8, Behaviour::Honest).unwrap();
    let want = data(9, 4096);
    m.host_write(0, &want);
    m.qp.execute(1, &[Write::new(5, 1, dma(&m, 0, 4096)).build()], &m.status, T).unwrap();
    m.reset_controller();
    let e = m.qp.execute(1, &[Flush::new().build()], &m.status, T).unwrap_err();
    assert!(matches!(e, Error::EpochChanged { old: 1, new: 2 }), "{e:?}");
    m.qp.execute(1, &[Read::new(5, 1, dma(&m, 8192, 4096)).build()], &m.status, T).unwrap();
    assert_eq!(m.host_read(8192, 4096), want);
    m.set_faulted(true);
    assert!(matches!(m.qp.execute(1, &[Flush::new().build()], &m.status, T), Err(Error::DeviceFaulted)));
    m.set_faulted(false);
    m.qp.execute(1, &[Flush::new().build()], &m.status, T).unwrap();
}

fn read(m: &MockQueue, off: u64, len: u64) -> Command<'_> {
    Read::new(off / 4096, (len / 4096) as u32, dma(m, off, len)).build()
}

#[test]
fn unknown_cid_is_a_protocol_error_not_ub() {
    let m = MockQueue::new(8, Behaviour::Hostile(vec![HostileCqe { cid: 7, sq_head: 1, status: 0 }])).unwrap();
    let e = m.qp.execute(1, &[read(&m, 0, 4096)], &m.status, T).unwrap_err();
    assert!(matches!(e, Error::DeviceProtocol(_)), "{e:?}");
    // The queue stays faulted until a reset.
    let e = m.qp.execute(1, &[read(&m, 0, 4096)], &m.status, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, Error::DeviceFaulted), "{e:?}");
}

#[test]
fn duplicate_completion_is_a_protocol_error() {
    // cid 1 is what the first command gets; completing it twice must be caught.
    let m = MockQueue::new(8, Behaviour::Hostile(vec![HostileCqe { cid: 1, sq_head: 1, status: 0 }])).unwrap();
    let e = m.qp.execute(1, &[read(&m, 0, 4096)], &m.status, T).unwrap_err();
    assert!(matches!(e, Error::DeviceProtocol(_)), "{e:?}");
}

#[test]
fn an_sq_head_past_the_tail_is_a_protocol_error() {
    let m = MockQueue::new(8, Behaviour::Hostile(vec![HostileCqe { cid: 1, sq_head: 5, status: 0 }])).unwrap();
    let e = m.qp.execute(1, &[read(&m, 0, 4096)], &m.status, T).unwrap_err();
    assert!(matches!(&e, Error::DeviceProtocol(s) if s.contains("SQ head 5")), "{e:?}");
}

#[test]
fn a_completion_for_command_id_0_is_a_stray_and_ignored_with_its_sq_head() {
    // What a zeroed slot run through a stray tail write completes as: command id 0 and an SQ
    // head anywhere. It names no command of ours: the read still completes by itself.
    let m = MockQueue::new(8, Behaviour::Hostile(vec![HostileCqe { cid: 0, sq_head: 5, status: 0x4002 }])).unwrap();
    let want = data(3, 4096);
    m.host_write(0, &want);
    m.qp.execute(1, &[Write::new(2, 1, dma(&m, 0, 4096)).build()], &m.status, T).unwrap();
    m.qp.execute(1, &[read(&m, 8192, 4096)], &m.status, T).unwrap();
}

#[test]
fn completed_sq_entries_are_disarmed_so_a_stray_tail_replays_nothing() {
    let m = MockQueue::new(8, Behaviour::Honest).unwrap();
    let cmds: Vec<_> = (0..5u64).map(|k| Write::new(k, 1, dma(&m, 0, 4096)).build()).collect();
    m.qp.execute(1, &cmds, &m.status, T).unwrap();
    // Every slot the controller fetched now starts with 8 zero bytes: opcode 0 (Flush), command
    // id 0, namespace 0, which a controller fails without touching memory.
    for slot in 0..5 {
        assert_eq!(m.sq_word(slot), 0, "slot {slot} still holds its command");
    }
}

/// Disarming runs from the old SQ head to the new one, in two runs where a reap's entries wrap
/// the ring, and one store where it consumed one entry: no slot is left armed or skipped.
#[test]
fn disarming_covers_reaps_that_wrap_the_ring_and_single_commands() {
    let m = MockQueue::new(8, Behaviour::Honest).unwrap();
    let write = |k: u64| Write::new(k, 1, dma(&m, 0, 4096)).build();
    // Slots 0..5, then 5, 6, 7, 0, 1 in one burst (the reap's head wraps from 5 to 2).
    m.qp.execute(1, &(0..5).map(write).collect::<Vec<_>>(), &m.status, T).unwrap();
    m.qp.execute(1, &(5..10).map(write).collect::<Vec<_>>(), &m.status, T).unwrap();
    for slot in 0..8 {
        assert_eq!(m.sq_word(slot), 0, "slot {slot} still holds its command");
    }
    // One command at a time across the wrap: slots 2..8, then 0 and 1 again.
    for k in 0..9u64 {
        m.qp.execute(1, &[write(k)], &m.status, T).unwrap();
        let slot = (2 + k as usize) % 8;
        assert_eq!(m.sq_word(slot), 0, "slot {slot} still holds command {k}");
    }
}

#[test]
fn too_large_for_one_prp_list_is_rejected_before_submit() {
    let m = MockQueue::new(8, Behaviour::Hostile(vec![])).unwrap();
    m.qp.execute(1, &[read(&m, 0, 4096)], &m.status, T).unwrap();
    let e = m.qp.execute(1, &[read(&m, 0, 4096), read(&m, 0, 1 << 21)], &m.status, T).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { arg: "reg_offset", .. }), "{e:?}");
    // Nothing of the rejected burst was published: the queue keeps working.
    for _ in 0..20 {
        m.qp.execute(1, &[read(&m, 0, 4096), read(&m, 8192, 4096)], &m.status, T).unwrap();
    }
    assert_eq!(m.stats().fetched, 41);
}

#[derive(Debug, Clone)]
enum Io {
    Write { host: u64, lba: u64, blocks: u64 },
    Read { host: u64, lba: u64, blocks: u64 },
}

fn io() -> impl Strategy<Value = Io> {
    // Host offsets are dword aligned anywhere in the first 512 KiB; up to 96 KiB per command.
    let parts = (0u64..(512 << 10) / 4, 0u64..7000, 1u64..192);
    prop_oneof![
        parts.clone().prop_map(|(h, lba, blocks)| Io::Write { host: h * 4, lba, blocks }),
        parts.prop_map(|(h, lba, blocks)| Io::Read { host: h * 4, lba, blocks }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random writes and reads of random sizes at random dword-aligned host offsets, over
    /// scattered single-page segments: the device's blocks and the host memory always match a
    /// model of both.
    #[test]
    fn random_io_matches_a_model(ios in proptest::collection::vec(io(), 1..12)) {
        let m = scattered(true);
        let mut disk = vec![0u8; 8192 * 512];
        let mut host = vec![0u8; 1 << 20];
        for (i, io) in ios.iter().enumerate() {
            let seed = i as u64 + 100;
            let st = match *io {
                Io::Write { host: h, lba, blocks } => {
                    let len = blocks * 512;
                    let bytes = data(seed, len as usize);
                    m.host_write(h as usize, &bytes);
                    host[h as usize..(h + len) as usize].copy_from_slice(&bytes);
                    let lba = lba.min(8192 - blocks);
                    disk[(lba * 512) as usize..((lba + blocks) * 512) as usize].copy_from_slice(&bytes);
                    run_stepped(&m, &[Write::new(lba, blocks as u32, dma(&m, h, len)).build()])
                }
                Io::Read { host: h, lba, blocks } => {
                    let lba = lba.min(8192 - blocks);
                    let len = blocks * 512;
                    host[h as usize..(h + len) as usize].copy_from_slice(&disk[(lba * 512) as usize..((lba + blocks) * 512) as usize]);
                    run_stepped(&m, &[Read::new(lba, blocks as u32, dma(&m, h, len)).build()])
                }
            };
            prop_assert!(st[0].is_success(), "{:?}: {}", io, st[0]);
        }
        prop_assert!(m.backing(0, 8192) == disk);
        prop_assert!(m.host_read(0, 1 << 20) == host);
    }

    /// Any sequence of hostile completions yields an error or success, never a panic or a
    /// hang past the deadline.
    #[test]
    fn hostile_completions_never_panic(script in proptest::collection::vec((any::<u16>(), any::<u16>(), any::<u16>(), 0u8..5), 0..6)) {
        let faults = script.iter().map(|&(cid, sq_head, status, kind)| match kind {
            0 => Fault::Extra(HostileCqe { cid: cid % 16, sq_head: sq_head % 12, status }),
            1 => Fault::Status(status),
            2 => Fault::BadPhase,
            3 => Fault::Never,
            _ => Fault::None,
        }).collect();
        let m = MockQueue::new(8, Behaviour::Script(faults)).unwrap();
        for _ in 0..4 {
            match m.qp.execute(1, &[read(&m, 0, 4096), read(&m, 4096, 8192)], &m.status, Duration::from_millis(100)) {
                Ok(()) | Err(Error::DeviceProtocol(_)) | Err(Error::DeviceFaulted) | Err(Error::Nvme { .. }) | Err(Error::Timeout { .. }) => {}
                Err(e) => prop_assert!(false, "unexpected {:?}", e),
            }
        }
    }
}

/// The one-command calls (a synchronous request of one command): the status comes back once,
/// for the ticket's command only, while other commands' completions reaped on the way stay
/// recorded for their owners; a ticket from before a reset is refused, not answered with another
/// command's status; owned and shared calls agree.
#[test]
fn one_command_tickets_collect_their_own_status_once() {
    let mut m = MockQueue::with(MockConfig {
        depth: 8,
        stepped: true,
        behaviour: Behaviour::Script(vec![Fault::None, Fault::Status(0x281)]),
        ..MockConfig::default()
    })
    .unwrap();
    let want = data(3, 4096);
    m.host_write(0, &want);
    let w = Write::new(2, 1, dma(&m, 0, 4096)).build();
    let t = m.qp.submit_one(1, &w, &m.status, T).unwrap();
    assert_eq!(m.qp.collect_one(t, &m.status).unwrap(), None, "not fetched yet");
    // A burst's command goes in behind it; both complete in one step.
    let mut cids = [0u16; 1];
    m.qp.submit(1, &[read(&m, 8192, 4096)], &m.status, T, &mut cids).unwrap();
    assert_ne!(cids[0], t.cid());
    m.step();
    assert_eq!(m.qp.collect_one(t, &m.status).unwrap(), Some(Status::SUCCESS));
    assert_eq!(m.qp.collect_one(t, &m.status).unwrap(), None, "collected once");
    let mut out = [None];
    assert_eq!(m.qp.collect(&cids, &m.status, &mut out).unwrap(), 1, "the burst's completion was kept for it");
    assert!(out[0].is_some_and(|s| !s.is_success()), "{out:?}");
    // Owned calls: the same answers.
    let segs = m.segments().to_vec();
    // SAFETY: as in `dma`: the mock's own memory, one 4 KiB block.
    let r = Read::new(2, 1, unsafe { DmaRange::new(&segs, 8192, 4096) }).build();
    let t = m.qp.submit_one_owned(1, &r, &m.status, T).unwrap();
    m.step();
    assert_eq!(m.qp.collect_one_owned(t, &m.status).unwrap(), Some(Status::SUCCESS));
    assert_eq!(m.host_read(8192, 4096), want);
    // A reset between submission and collection: the ticket names the old rings.
    let t = m.qp.submit_one(1, &Flush::new().build(), &m.status, T).unwrap();
    m.reset_controller();
    // Empty polls read the epoch every so often (a reset leaves the CQ empty).
    let e = (0..100).find_map(|_| m.qp.collect_one(t, &m.status).err()).expect("the reset is noticed");
    assert!(matches!(e, Error::EpochChanged { old: 1, new: 2 }), "{e:?}");
    let e = m.qp.collect_one(t, &m.status).unwrap_err();
    assert!(matches!(e, Error::EpochChanged { old: 1, new: 2 }), "a stale ticket stays refused: {e:?}");
}

#[test]
fn a_queue_pair_refuses_memory_that_cannot_hold_its_rings() {
    let depth = 16u32;
    let d = depth as usize;
    let args = CreateQpair { depth, qid: 1, prp_dma: PRP_BUS, sq_doorbell: 0, cq_doorbell: 4, ..Default::default() };
    let dbfd = memfd(4096).expect("memfd");
    let doorbells = Arc::new(Doorbells::over(dbfd.as_raw_fd(), 4096, None).expect("doorbells"));
    let make = |sq_len: usize, cq_len: usize, prp_len: usize| {
        let (sq, _) = shared(sq_len, 0).expect("sq");
        let (cq, _) = shared(cq_len, 0).expect("cq");
        let (prp, _) = shared(prp_len, PRP_BUS).expect("prp");
        let wait = QueueWait::new(Waiting::Poll, None, u64::MAX);
        QueuePair::new(&args, sq, cq, prp, &doorbells, 1, wait, DptrPolicy::new(DataPointers::PrpOnly, 0))
    };
    let page = PAGE as usize;
    assert!(make(d * 64, d * 16, d * page).is_ok(), "memory of the exact size is refused");
    // One entry (or PRP page) short in any region: the pair is never made, so the unchecked
    // ring calls never see that memory.
    for (sq, cq, prp) in
        [(d * 64 - 64, d * 16, d * page), (d * 64, d * 16 - 16, d * page), (d * 64, d * 16, (d - 1) * page)]
    {
        match make(sq, cq, prp) {
            Err(Error::DeviceProtocol(m)) => assert!(m.contains("too small"), "{m}"),
            other => panic!("SQ {sq}, CQ {cq}, PRP {prp} bytes for depth {depth}: {other:?}"),
        }
    }
}

//! The NVMe/RDMA queue's capsule slots (`drive` and the batch's `start`/`handle`) against a fake connection: capsules answered
//! in order and out of order, and a hostile target (responses for commands not in flight,
//! duplicates, short responses, failed work completions, silence, random completions), which
//! must give named errors, never a panic or a hang. The VM tests run the real thing.

use super::*;
use crate::remote::verbs::WC_SEND;
use proptest::prelude::*;
use std::cell::RefCell;
use std::collections::VecDeque;

/// A completion the fake hands out, with the response bytes a receive brings.
#[derive(Debug, Clone)]
struct Event {
    wc: IbvWc,
    bytes: [u8; RESPONSE],
}

/// How the fake answers.
#[derive(Debug, Clone)]
enum Mode {
    /// Each capsule: its send completion, then its response (CID echoed, result = SLBA * 3).
    InOrder,
    /// The response first, its send completion later.
    ResponseFirst,
    /// `change` is applied to the k-th response of the run.
    Hostile { k: usize, change: fn(&mut Event) },
    /// Every completion comes from this list; silence after it.
    Script(VecDeque<Event>),
}

#[derive(Debug)]
struct State {
    mode: Mode,
    queue: VecDeque<Event>,
    held: Vec<Event>,
    responses: usize,
    posted: VecDeque<usize>,
    slot_bytes: Vec<[u8; RESPONSE]>,
}

#[derive(Debug)]
struct FakeWire {
    slots: usize,
    st: RefCell<State>,
}

fn wc(wr_id: u64, opcode: u32, byte_len: u32) -> IbvWc {
    IbvWc::new(wr_id, 0, opcode, byte_len)
}

fn cqe_bytes(cid: u16, result: u32, status_field: u16) -> [u8; RESPONSE] {
    let mut b = [0u8; RESPONSE];
    b[..4].copy_from_slice(&result.to_le_bytes());
    b[12..14].copy_from_slice(&cid.to_le_bytes());
    b[14..16].copy_from_slice(&status_field.to_le_bytes());
    b
}

impl FakeWire {
    fn new(slots: usize, mode: Mode) -> FakeWire {
        let queue = match &mode {
            Mode::Script(s) => s.clone(),
            _ => VecDeque::new(),
        };
        FakeWire {
            slots,
            st: RefCell::new(State {
                mode,
                queue,
                held: Vec::new(),
                responses: 0,
                posted: (0..slots).collect(),
                slot_bytes: vec![[0; RESPONSE]; slots],
            }),
        }
    }
}

impl Wire for FakeWire {
    fn slots(&self) -> usize {
        self.slots
    }

    fn send(&self, _slot: usize, wr_id: u64, sqe: &[u8; CAPSULE], _data: Option<IbvSge>) -> std::io::Result<()> {
        let mut st = self.st.borrow_mut();
        if matches!(st.mode, Mode::Script(_)) {
            return Ok(());
        }
        let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
        let slba = u32::from_le_bytes([sqe[40], sqe[41], sqe[42], sqe[43]]);
        let slot = st.posted.pop_front().ok_or_else(|| std::io::Error::other("receive queue empty (RNR)"))?;
        let mut resp = Event { wc: wc(slot as u64, WC_RECV, RESPONSE as u32), bytes: cqe_bytes(cid, slba * 3, 0) };
        if let Mode::Hostile { k, change } = st.mode {
            if st.responses == k {
                change(&mut resp);
            }
        }
        st.responses += 1;
        let send = Event { wc: wc(wr_id, WC_SEND, 0), bytes: [0; RESPONSE] };
        match st.mode {
            Mode::ResponseFirst => {
                st.queue.push_back(resp);
                st.held.push(send);
                // Send completions trail by up to two capsules.
                if st.held.len() > 2 {
                    let e = st.held.remove(0);
                    st.queue.push_back(e);
                }
            }
            _ => {
                st.queue.push_back(send);
                st.queue.push_back(resp);
            }
        }
        Ok(())
    }

    fn post_recv(&self, slot: usize) -> std::io::Result<()> {
        self.st.borrow_mut().posted.push_back(slot);
        Ok(())
    }

    fn response(&self, slot: usize) -> [u8; RESPONSE] {
        self.st.borrow().slot_bytes[slot]
    }

    fn wait(&self, out: &mut [IbvWc], _timeout: Duration) -> std::io::Result<usize> {
        let mut st = self.st.borrow_mut();
        if st.queue.is_empty() {
            let held: Vec<_> = st.held.drain(..).collect();
            st.queue.extend(held);
        }
        let Some(e) = st.queue.pop_front() else {
            return Err(std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
        };
        if e.wc.opcode & WC_RECV != 0 && (e.wc.wr_id as usize) < self.slots {
            st.slot_bytes[e.wc.wr_id as usize] = e.bytes;
        }
        out[0] = e.wc;
        Ok(1)
    }
}

fn cmds(n: usize) -> Vec<(Sqe, Option<IbvSge>)> {
    (0..n)
        .map(|i| {
            let mut s = Sqe::new(0x02, 0);
            s.set_slba(i as u64);
            (s, None)
        })
        .collect()
}

fn run(w: &FakeWire, n: usize, depth: usize) -> Result<Vec<Done>> {
    let mut slots = Slots::new(w.slots(), depth);
    let upcoming = slots.upcoming(n);
    let r = drive(w, &mut slots, &cmds(n), Duration::from_millis(10), "10.0.0.2:4420", "read")?;
    if let Some(u) = upcoming {
        let cids: Vec<u16> = r.iter().map(|&(c, _)| c).collect();
        assert_eq!(cids, u, "the CIDs the commands took are the ones upcoming() named");
    }
    Ok(r.into_iter().map(|(_, d)| d).collect())
}

#[test]
fn commands_complete_in_order_and_with_late_send_completions() {
    for mode in [Mode::InOrder, Mode::ResponseFirst] {
        let w = FakeWire::new(8, mode.clone());
        let d = run(&w, 200, 8).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(d.len(), 200);
        for (i, d) in d.iter().enumerate() {
            assert!(d.status.is_success());
            assert_eq!(d.result, i as u64 * 3, "{mode:?}: command {i}'s result");
        }
    }
}

fn hostile(change: fn(&mut Event)) -> Error {
    let w = FakeWire::new(8, Mode::Hostile { k: 5, change });
    run(&w, 20, 8).expect_err("the hostile response was accepted")
}

#[test]
fn a_hostile_target_gives_named_errors() {
    // A response for a command that is not in flight.
    let e = hostile(|e| e.bytes[12..14].copy_from_slice(&500u16.to_le_bytes()));
    assert!(matches!(&e, Error::RemoteProtocol { reason, .. } if reason.contains("not in flight")), "{e}");
    // A second response for a command that already completed.
    let e = hostile(|e| e.bytes[12..14].copy_from_slice(&0u16.to_le_bytes()));
    assert!(matches!(&e, Error::RemoteProtocol { .. }), "{e}");
    // A short response capsule.
    let e = hostile(|e| e.wc.byte_len = 8);
    assert!(matches!(&e, Error::RemoteProtocol { reason, .. } if reason.contains("8 bytes")), "{e}");
    // A receive completion for a slot that does not exist.
    let e = hostile(|e| e.wc.wr_id = 99);
    assert!(matches!(&e, Error::RemoteProtocol { .. }), "{e}");
    // A failed work completion (remote access error: 10).
    let e = hostile(|e| e.wc.status = 10);
    assert!(matches!(&e, Error::RemoteTransport { .. }), "{e}");
    // Silence: the response never comes.
    let w = FakeWire::new(8, Mode::Script(VecDeque::new()));
    let e = run(&w, 3, 8).expect_err("silence was accepted");
    assert!(
        matches!(&e, Error::RemoteTransport { source, .. } if source.raw_os_error() == Some(libc::ETIMEDOUT)),
        "{e}"
    );
    // A send completion for a command never sent.
    let mut s = VecDeque::new();
    s.push_back(Event { wc: wc(7, WC_SEND, 0), bytes: [0; RESPONSE] });
    let e = run(&FakeWire::new(8, Mode::Script(s)), 3, 2).expect_err("a stray send completion was accepted");
    assert!(matches!(&e, Error::RemoteProtocol { .. }), "{e}");
}

/// A random completion: mostly plausible fields, sometimes anything.
fn any_event() -> impl Strategy<Value = Event> {
    (
        any::<bool>(),
        prop_oneof![0u64..12, any::<u64>()],
        prop_oneof![4 => Just(0u32), 1 => any::<u32>()],
        prop_oneof![4 => Just(RESPONSE as u32), 1 => any::<u32>()],
        prop_oneof![0u16..12, any::<u16>()],
        any::<u16>(),
    )
        .prop_map(|(recv, wr_id, status, len, cid, sf)| Event {
            wc: IbvWc::new(wr_id, status, if recv { WC_RECV } else { WC_SEND }, len),
            bytes: cqe_bytes(cid, 0, sf),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever completions arrive, the loop ends with every command's result or a named
    /// error, and never panics.
    #[test]
    fn random_completions_give_results_or_named_errors(events in proptest::collection::vec(any_event(), 0..40), n in 1usize..10, depth in 2usize..6) {
        let w = FakeWire::new(4, Mode::Script(events.into()));
        match run(&w, n, depth) {
            Ok(d) => prop_assert_eq!(d.len(), n),
            Err(Error::RemoteProtocol { .. } | Error::RemoteTransport { .. }) => {}
            Err(e) => prop_assert!(false, "unnamed error {e:?}"),
        }
    }
}

/// A batch's use of the slots: commands started one by one stay in flight across calls, each
/// with a CID of its own; a command's result is handed out (and its slot reused) only once both
/// its response and its SEND completed, so its registration never outlives its event.
#[test]
fn slots_keep_commands_in_flight_across_calls_until_send_and_response_completed() {
    let w = FakeWire::new(8, Mode::ResponseFirst);
    let mut slots = Slots::new(w.slots(), 5);
    assert_eq!(slots.room(), 4, "one entry of the queue stays empty");
    let cmds = cmds(4);
    let cids: Vec<u16> = cmds.iter().map(|&(sqe, _)| slots.start(&w, sqe, None, None).unwrap()).collect();
    let mut sorted = cids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 4, "CIDs {cids:?}");
    assert_eq!((slots.room(), slots.in_flight()), (0, 4));
    let e = slots.start(&w, cmds[0].0, None, None).expect_err("a fifth command started");
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    // The fake answers each capsule at once and holds back its SEND completions: they come
    // after the next two responses.
    let mut out = Vec::new();
    let mut wcs = [IbvWc::default(); 1];
    let (mut responded, mut sent) = (Vec::new(), Vec::new());
    while slots.in_flight() > 0 {
        let n = w.wait(&mut wcs, Duration::ZERO).unwrap();
        let wc = wcs[0];
        if wc.opcode & WC_RECV != 0 {
            responded.push(u16::from_le_bytes([w.response(wc.wr_id as usize)[12], w.response(wc.wr_id as usize)[13]]));
        } else {
            sent.push(wc.wr_id as u16);
        }
        slots.handle(&w, &wcs[..n], &mut out, "t", "read").unwrap();
        for &(cid, _) in &out {
            assert!(responded.contains(&cid) && sent.contains(&cid), "command {cid} handed out before both completed");
        }
        assert_eq!(slots.room(), out.len(), "a slot is free exactly when its command was handed out");
        if wc.opcode & WC_RECV != 0 && responded.len() == 4 {
            assert!(out.len() < 4, "the fake holds SEND completions back past the last response");
        }
    }
    assert_eq!(out.len(), 4);
    for (cid, d) in &out {
        let i = cids.iter().position(|c| c == cid).unwrap();
        assert_eq!(d.result, i as u64 * 3, "command {i}'s result under CID {cid}");
    }
    // Abandoned commands (the queue pair killed) free every slot.
    slots.start(&w, cmds[0].0, None, None).unwrap();
    slots.clear();
    assert_eq!((slots.room(), slots.in_flight()), (4, 0));
}

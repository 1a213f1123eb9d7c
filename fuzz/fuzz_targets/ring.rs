//! The completion-queue parser against the hostile device model: a `QueuePair` wired to
//! `ugds::mock::MockQueue`, whose device thread posts arbitrary completions (unknown and
//! duplicate command ids, SQ heads out of range, any status) before the honest ones, while the
//! harness submits, collects, executes and flips the status page's epoch and faulted flag.
//!
//! Checked: no panic; every error is one the queue engine documents for that call; `submit`
//! never hands out a command id that is out of range or still in flight; `collect` reports
//! completions only for the ids it was given, each once, and its count matches.
//!
//! Uses only: `MockQueue::new`, `Behaviour::Hostile`, `HostileCqe { cid, sq_head, status }`,
//! the public `MockQueue::{qp, status}`, `QueuePair::{depth, submit, collect, execute, resync}`,
//! `queue::{Command, MAX_BURST}`, `Mapping::{store32, store64}` on the status page.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;
use std::mem::offset_of;
use std::time::Duration;
use ugds::mock::{Behaviour, HostileCqe, MockQueue};
use ugds::queue::{Command, MAX_BURST};
use ugds::uapi::ioctl::{Segment, StatusPage};
use ugds::Error;

/// Short: a hostile device can make any wait run to its deadline.
const TIMEOUT: Duration = Duration::from_millis(20);

#[derive(Arbitrary, Debug)]
struct Input {
    depth: u8,
    hostile: Vec<Cqe>,
    segs: Vec<Seg>,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Cqe {
    /// Small ids (likely in flight or just completed) or any 16-bit value.
    near: bool,
    cid: u16,
    sq_head: u16,
    status: u16,
}

/// A DMA segment as the module hands them out: page-aligned, page-multiple lengths.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Seg {
    page: u32,
    pages: u8,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Cmd {
    Rw { write: bool, slba: u64, nlb: u32, off: u64, len: u64 },
    Flush,
    WriteZeroes { slba: u64, nlb: u32 },
    Deallocate { slba: u64, nlb: u32 },
}

#[derive(Arbitrary, Debug)]
enum Op {
    Execute(Vec<Cmd>),
    Submit(Vec<Cmd>),
    /// Collect the in-flight ids picked by the mask (and, with `foreign`, one id of the queue
    /// that this harness did not submit).
    Collect {
        mask: u64,
        foreign: Option<u16>,
    },
    /// The controller was reset: a new epoch on the status page.
    BumpEpoch,
    SetFaulted(bool),
    Resync,
}

fn command(c: Cmd, segs: &[Segment]) -> Command<'_> {
    match c {
        Cmd::Rw { write, slba, nlb, off, len } => Command::Rw { write, slba, nlb, segs, off, len },
        Cmd::Flush => Command::Flush,
        Cmd::WriteZeroes { slba, nlb } => Command::WriteZeroes { slba, nlb },
        Cmd::Deallocate { slba, nlb } => Command::Deallocate { slba, nlb },
    }
}

/// The state the harness knows: ids it submitted and has not collected.
struct Model {
    inflight: HashSet<u16>,
    /// The status page's epoch (the harness is its only writer).
    epoch: u64,
    /// The epoch the queue last adopted.
    adopted: u64,
    /// An `execute` gave up with commands in flight (ids the harness never learnt), since the
    /// queue last started over.
    abandoned: bool,
}

impl Model {
    /// Errors every call may return; an epoch change forgets what was in flight.
    fn common(&mut self, e: &Error) -> bool {
        match e {
            Error::EpochChanged { old, new } => {
                assert_ne!(old, new);
                assert_eq!((*old, *new), (self.adopted, self.epoch));
                self.start_over();
                true
            }
            Error::DeviceProtocol(_) | Error::DeviceFaulted => true,
            _ => false,
        }
    }

    /// The queue adopted the current epoch: everything in flight was lost.
    fn start_over(&mut self) {
        self.inflight.clear();
        self.adopted = self.epoch;
        self.abandoned = false;
    }
}

fuzz_target!(|input: Input| {
    let depth = u16::from(input.depth % 32) + 1;
    let hostile: Vec<HostileCqe> = input
        .hostile
        .iter()
        .take(16)
        .map(|h| HostileCqe {
            cid: if h.near { h.cid % (2 * depth) } else { h.cid },
            sq_head: if h.near { h.sq_head % (depth + 2) } else { h.sq_head },
            status: h.status,
        })
        .collect();
    let segs: Vec<Segment> = input
        .segs
        .iter()
        .take(4)
        .map(|s| Segment { dma_addr: u64::from(s.page) << 12, len: (u64::from(s.pages) + 1) << 12 })
        .collect();
    let Ok(m) = MockQueue::new(depth, Behaviour::Hostile(hostile)) else { return };
    let qp = &m.qp;
    assert_eq!(qp.depth(), depth);
    let mut model = Model { inflight: HashSet::new(), epoch: 1, adopted: 1, abandoned: false };
    let mut cids = [0u16; MAX_BURST];
    for op in input.ops.into_iter().take(12) {
        match op {
            Op::Execute(cmds) => {
                // `execute` takes at most MAX_BURST commands (a documented precondition).
                let cmds: Vec<Command<'_>> = cmds.into_iter().take(MAX_BURST).map(|c| command(c, &segs)).collect();
                match qp.execute(1, &cmds, &m.status, TIMEOUT) {
                    Ok(()) => {}
                    Err(Error::Nvme { status, .. }) => assert!(!status.is_success()),
                    Err(Error::InvalidArgument { .. }) => {}
                    Err(Error::Timeout { .. }) => model.abandoned = true,
                    Err(e) => {
                        assert!(model.common(&e), "execute: {e:?}");
                        model.abandoned |= !matches!(e, Error::EpochChanged { .. });
                    }
                }
            }
            Op::Submit(cmds) => {
                let cmds: Vec<Command<'_>> = cmds.into_iter().take(MAX_BURST).map(|c| command(c, &segs)).collect();
                let n = cmds.len();
                match qp.submit(1, &cmds, &m.status, TIMEOUT, &mut cids) {
                    Ok(()) => {
                        for &c in &cids[..n] {
                            assert!(c < depth, "submit handed out command id {c} of a {depth}-entry queue");
                            assert!(model.inflight.insert(c), "submit handed out command id {c}, still in flight");
                        }
                    }
                    Err(Error::InvalidArgument { .. } | Error::Timeout { .. }) => {}
                    Err(e) => assert!(model.common(&e), "submit: {e:?}"),
                }
            }
            Op::Collect { mask, foreign } => {
                let mut mine: Vec<u16> = model.inflight.iter().copied().collect();
                mine.sort_unstable();
                let mut ask: Vec<u16> =
                    mine.iter().enumerate().filter(|(i, _)| mask >> (i % 64) & 1 != 0).map(|(_, c)| *c).collect();
                // A foreign id: one of this queue's ids (an id past the depth is outside
                // `collect`'s contract) that the harness does not hold.
                let foreign = foreign.map(|f| f % depth).filter(|f| !model.inflight.contains(f));
                ask.extend(foreign);
                let mut out = vec![None; ask.len()];
                match qp.collect(&ask, &m.status, &mut out) {
                    Ok(n) => {
                        assert_eq!(n, out.iter().filter(|o| o.is_some()).count(), "collect's count");
                        for (c, o) in ask.iter().zip(&out) {
                            if o.is_none() {
                                continue;
                            }
                            if Some(*c) == foreign {
                                // Only a command an `execute` gave up on can complete unseen.
                                assert!(model.abandoned, "completion reported for command id {c}, never submitted");
                            } else {
                                assert!(model.inflight.remove(c), "completion reported twice for command id {c}");
                            }
                        }
                    }
                    Err(e) => assert!(model.common(&e), "collect: {e:?}"),
                }
            }
            Op::BumpEpoch => {
                model.epoch += 1;
                m.status.store64(offset_of!(StatusPage, epoch), model.epoch);
            }
            Op::SetFaulted(f) => m.status.store32(offset_of!(StatusPage, faulted), u32::from(f)),
            Op::Resync => {
                qp.resync(&m.status);
                // Unless faulted, a resync adopts a new epoch; commands of the old one are gone.
                if m.status.load32(offset_of!(StatusPage, faulted)) == 0 && model.adopted != model.epoch {
                    model.start_over();
                }
            }
        }
    }
});

//! The completion-queue parser against the hostile device model: a `QueuePair` wired to a
//! `MockQueue`, whose device thread applies arbitrary faults (extra completions with unknown
//! or duplicate command ids and SQ heads out of range, any status, stale phase tags, commands
//! never completed) before behaving honestly, while the harness submits, collects, drains,
//! executes, resets the controller and flips the faulted flag.
//!
//! Checked: no panic; every error is one the queue engine documents for that call; `submit`
//! never hands out a command id that is out of range or still in flight; `collect` and
//! `completions` report completions only for ids in flight, each once (a foreign id may
//! complete only after an `execute` gave up with commands in flight, and never one past the
//! depth), and `collect`'s count matches.
//!
//! Uses only `ugds::test_utils`: `MockQueue::{with, segments, reset_controller, set_faulted}`,
//! `MockConfig`, `Behaviour::Script`, `Fault`, `HostileCqe`, the command builders,
//! `QueuePair::{depth, submit, collect, completions, execute, resync}` and `MAX_BURST`.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;
use std::time::Duration;
use ugds::test_utils::{
    Behaviour, Command, DatasetManagement, DmaRange, DsmRange, Fault, Flush, HostileCqe, MockConfig, MockQueue, Read,
    Write, WriteZeroes, MAX_BURST,
};
use ugds::uapi::ioctl::Segment;
use ugds::Error;

/// Short: a hostile device can make any wait run to its deadline.
const TIMEOUT: Duration = Duration::from_millis(20);

#[derive(Arbitrary, Debug)]
struct Input {
    depth: u8,
    small_blocks: bool,
    scatter: bool,
    faults: Vec<FaultIn>,
    segs: Vec<Seg>,
    ranges: Vec<(u64, u32)>,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum FaultIn {
    None,
    /// An extra completion: small ids and heads (likely in flight or just completed) when
    /// `near`, else any 16-bit value.
    Extra {
        near: bool,
        cid: u16,
        sq_head: u16,
        status: u16,
    },
    Status(u16),
    BadPhase,
    Never,
}

/// A DMA segment as the module hands them out: page-aligned, page-multiple lengths.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Seg {
    page: u32,
    pages: u8,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Cmd {
    /// A read or write over the mock's own host memory (`own`) or the arbitrary segments.
    Rw {
        write: bool,
        fua: bool,
        own: bool,
        slba: u64,
        nlb: u32,
        off: u64,
        len: u64,
    },
    Flush,
    WriteZeroes {
        slba: u64,
        nlb: u32,
        deallocate: bool,
    },
    /// Dataset Management over `ranges[start..start + count]` (clamped).
    Dsm {
        start: u16,
        count: u16,
        deallocate: bool,
    },
}

#[derive(Arbitrary, Debug)]
enum Op {
    Execute(Vec<Cmd>),
    Submit(Vec<Cmd>),
    /// Collect the in-flight ids picked by the mask (and, with `foreign`, one id that this
    /// harness does not hold, possibly past the queue's depth).
    Collect {
        mask: u64,
        foreign: Option<u16>,
    },
    /// Take every posted completion through the `completions` iterator.
    Drain,
    /// The controller is reset: the queue is re-created empty and the epoch moves on.
    Reset,
    SetFaulted(bool),
    Resync,
}

/// The data the commands point at.
struct Data<'a> {
    own: &'a [Segment],
    segs: &'a [Segment],
    ranges: &'a [DsmRange],
}

fn command<'a>(c: Cmd, d: &Data<'a>) -> Command<'a> {
    match c {
        Cmd::Rw { write, fua, own, slba, nlb, off, len } => {
            let segs = if own { d.own } else { d.segs };
            // SAFETY: the mock's device model resolves bus addresses only inside its own shared
            // memory (memfd mappings it touches through volatile accessors, never Rust
            // references); an address outside it fails the command. So whatever the segments,
            // offset and length say, no memory of this process but the mock's can be reached.
            let range = unsafe { DmaRange::new(segs, off, len) };
            if write {
                Write::new(slba, nlb, range).fua(fua).build()
            } else {
                Read::new(slba, nlb, range).fua(fua).build()
            }
        }
        Cmd::Flush => Flush::new().build(),
        Cmd::WriteZeroes { slba, nlb, deallocate } => WriteZeroes::new(slba, nlb).deallocate(deallocate).build(),
        Cmd::Dsm { start, count, deallocate } => {
            let a = usize::from(start).min(d.ranges.len());
            let b = (a + usize::from(count)).min(d.ranges.len());
            DatasetManagement::new(&d.ranges[a..b]).deallocate(deallocate).build()
        }
    }
}

/// The state the harness knows: ids it submitted and has not collected.
struct Model {
    depth: u16,
    inflight: HashSet<u16>,
    /// The controller's epoch (the harness is the only one to reset it).
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

    /// A completion was reported for `cid`, which the harness did not submit or already
    /// collected: only a command an `execute` gave up on can complete unseen.
    fn unseen(&self, cid: u16) {
        assert!(cid < self.depth, "completion reported for command id {cid} of a {}-entry queue", self.depth);
        assert!(self.abandoned, "completion reported for command id {cid}, not in flight");
    }
}

fuzz_target!(|input: Input| {
    let depth = u16::from(input.depth % 31) + 2;
    let faults: Vec<Fault> = input
        .faults
        .iter()
        .take(16)
        .map(|f| match *f {
            FaultIn::None => Fault::None,
            FaultIn::Extra { near, cid, sq_head, status } => Fault::Extra(HostileCqe {
                cid: if near { cid % (2 * depth) } else { cid },
                sq_head: if near { sq_head % (depth + 2) } else { sq_head },
                status,
            }),
            FaultIn::Status(s) => Fault::Status(s),
            FaultIn::BadPhase => Fault::BadPhase,
            FaultIn::Never => Fault::Never,
        })
        .collect();
    let segs: Vec<Segment> = input
        .segs
        .iter()
        .take(4)
        .map(|s| Segment { dma_addr: u64::from(s.page) << 12, len: (u64::from(s.pages) + 1) << 12 })
        .collect();
    let ranges: Vec<DsmRange> = input.ranges.iter().take(300).map(|&(slba, nlb)| DsmRange::new(slba, nlb)).collect();
    let cfg = MockConfig {
        depth: u32::from(depth),
        block_size: if input.small_blocks { 512 } else { 4096 },
        segment_bytes: 64 << 10,
        segments: 16,
        scatter: input.scatter,
        behaviour: Behaviour::Script(faults),
        ..MockConfig::default()
    };
    let Ok(m) = MockQueue::with(cfg) else { return };
    let qp = &m.qp;
    assert_eq!(qp.depth(), u32::from(depth));
    let data = Data { own: m.segments(), segs: &segs, ranges: &ranges };
    let mut model = Model { depth, inflight: HashSet::new(), epoch: 1, adopted: 1, abandoned: false };
    let mut faulted = false;
    let mut cids = [0u16; MAX_BURST];
    for op in input.ops.into_iter().take(12) {
        match op {
            Op::Execute(cmds) => {
                let cmds: Vec<Command<'_>> = cmds.into_iter().take(MAX_BURST).map(|c| command(c, &data)).collect();
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
                let cmds: Vec<Command<'_>> = cmds.into_iter().take(MAX_BURST).map(|c| command(c, &data)).collect();
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
                let foreign = foreign.filter(|f| !model.inflight.contains(f));
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
                                model.unseen(*c);
                            } else {
                                assert!(model.inflight.remove(c), "completion reported twice for command id {c}");
                            }
                        }
                    }
                    Err(e) => assert!(model.common(&e), "collect: {e:?}"),
                }
            }
            Op::Drain => match qp.completions(&m.status) {
                Ok(it) => {
                    for c in it {
                        match c {
                            Ok(c) => {
                                if !model.inflight.remove(&c.cid) {
                                    model.unseen(c.cid);
                                }
                            }
                            Err(e) => assert!(matches!(e, Error::DeviceProtocol(_)), "completions: {e:?}"),
                        }
                    }
                }
                Err(e) => assert!(model.common(&e), "completions: {e:?}"),
            },
            Op::Reset => {
                m.reset_controller();
                model.epoch += 1;
            }
            Op::SetFaulted(f) => {
                m.set_faulted(f);
                faulted = f;
            }
            Op::Resync => {
                qp.resync(&m.status);
                // Unless faulted, a resync adopts a new epoch; commands of the old one are gone.
                if !faulted && model.adopted != model.epoch {
                    model.start_over();
                }
            }
        }
    }
});

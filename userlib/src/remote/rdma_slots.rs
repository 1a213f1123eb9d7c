//! An NVMe/RDMA queue's capsule slots: the command in each, whether its SEND and its response
//! completed, and what each work completion means. A command's CID is its slot's number. A
//! command is over, and its slot free again, only once both completed: the NIC may read the
//! capsule (and in-capsule data) until its SEND completes, and the target may reach the
//! command's memory until its response came; so its result is handed out only then, after
//! which its registration is gone. A call's list of commands ([`drive`]) and a batch's commands
//! kept in flight across calls (`Pipelined` on `RdmaQueue`) both go through [`Slots`].

use super::transport::{result_of, Done};
use super::verbs::{self, IbvSge, IbvWc, Mr, CAPSULE, RESPONSE, WC_RECV, WC_SUCCESS};
use crate::error::{Error, Result};
use std::time::Duration;
use ugds_uapi::{Cqe, Sqe};
use zerocopy::{FromBytes, IntoBytes};

/// What [`Slots`] needs of a connection: an `Endpoint`, or a fake in the host tests.
pub(crate) trait Wire {
    /// Capsule slots (and response slots).
    fn slots(&self) -> usize;
    /// Posts the SQE in capsule slot `slot` as a signaled SEND (work request `wr_id`), with
    /// in-capsule data when given.
    fn send(&self, slot: usize, wr_id: u64, sqe: &[u8; CAPSULE], data: Option<IbvSge>) -> std::io::Result<()>;
    /// Posts a receive on response slot `slot`.
    fn post_recv(&self, slot: usize) -> std::io::Result<()>;
    /// The bytes received in response slot `slot`.
    fn response(&self, slot: usize) -> [u8; RESPONSE];
    /// Waits up to `timeout` for completions.
    fn wait(&self, out: &mut [IbvWc], timeout: Duration) -> std::io::Result<usize>;
}

/// The command in a slot.
#[derive(Debug)]
struct Busy {
    sent: bool,
    /// The response's result, once it came.
    done: Option<Done>,
    /// Its data's registration, when the slot holds it (a batch's command): it goes with the
    /// slot.
    _mr: Option<Mr<'static>>,
}

/// A queue's capsule slots.
#[derive(Debug)]
pub(crate) struct Slots {
    busy: Vec<Option<Busy>>,
    /// Free slots, the next one last.
    free: Vec<u16>,
}

impl Slots {
    /// `depth - 1` slots of a queue of `depth` entries (one stays empty, as on a submission
    /// ring; a queue of one still runs one), at most `capsules` (the connection's).
    pub(crate) fn new(capsules: usize, depth: usize) -> Slots {
        let n = depth.saturating_sub(1).max(1).min(capsules).min(usize::from(u16::MAX));
        // CAST: at most u16::MAX (clamped above).
        Slots { busy: (0..n).map(|_| None).collect(), free: (0..n as u16).rev().collect() }
    }

    /// Slots in all.
    pub(crate) fn capacity(&self) -> usize {
        self.busy.len()
    }

    /// The CIDs (slots) the next `n` starts take, in order, when `n` commands fit now: starts
    /// take the free slots in a fixed order, whatever was handled before them.
    pub(crate) fn upcoming(&self, n: usize) -> Option<Vec<u16>> {
        (n <= self.free.len()).then(|| self.free.iter().rev().take(n).copied().collect())
    }

    /// Commands that can start now.
    pub(crate) fn room(&self) -> usize {
        self.free.len()
    }

    /// Slots in use: commands whose response or SEND completion is due.
    pub(crate) fn in_flight(&self) -> usize {
        self.busy.len() - self.free.len()
    }

    /// Sends `sqe` with in-capsule `inline` data in a free slot, its CID set to the slot's;
    /// `mr` (its data's registration, if the slot is to hold it) is kept until the slot is
    /// free again, which is when [`Slots::handle`] hands out the command's result. An error leaves the slot free (the connection's errors break it: the caller
    /// kills it).
    pub(crate) fn start<W: Wire>(
        &mut self,
        w: &W,
        mut sqe: Sqe,
        inline: Option<IbvSge>,
        mr: Option<Mr<'static>>,
    ) -> std::io::Result<u16> {
        let Some(&cid) = self.free.last() else {
            return Err(std::io::Error::new(std::io::ErrorKind::WouldBlock, "every capsule slot is in use"));
        };
        sqe.set_cid(cid);
        let mut bytes = [0u8; CAPSULE];
        bytes.copy_from_slice(sqe.as_bytes());
        w.send(usize::from(cid), u64::from(cid), &bytes, inline)?;
        self.free.pop();
        self.busy[usize::from(cid)] = Some(Busy { sent: false, done: None, _mr: mr });
        Ok(cid)
    }

    /// Handles `wcs`: frees each slot whose SEND and response both completed (its registration
    /// goes) and appends its CID and result to `out`. A failed work completion, or one the
    /// slots cannot account for, is a named error (the caller kills the connection); what
    /// `out` got before it is over all the same.
    pub(crate) fn handle<W: Wire>(
        &mut self,
        w: &W,
        wcs: &[IbvWc],
        out: &mut Vec<(u16, Done)>,
        target: &str,
        op: &str,
    ) -> Result<()> {
        let err = |source| Error::RemoteTransport { target: target.to_string(), op: op.to_string(), source };
        let protocol = |reason| Error::RemoteProtocol { target: target.to_string(), reason };
        for wc in wcs {
            let recv = wc.opcode & WC_RECV != 0;
            if wc.status != WC_SUCCESS {
                return Err(err(std::io::Error::other(format!(
                    "work completion {} ({})",
                    verbs::wc_status(wc.status),
                    if recv { "receive" } else { "send" }
                ))));
            }
            let cid = if recv {
                // CAST: receive work request IDs are response slot numbers.
                let slot = wc.wr_id as usize;
                if slot >= w.slots() {
                    return Err(protocol(format!("a receive completion for slot {slot}")));
                }
                if wc.byte_len as usize != RESPONSE {
                    return Err(protocol(format!("a response capsule of {} bytes (16 expected)", wc.byte_len)));
                }
                let cqe = Cqe::read_from_bytes(&w.response(slot)[..]).map_err(|_| protocol("short CQE".into()))?;
                w.post_recv(slot).map_err(err)?;
                let cid = cqe.cid();
                match self.busy.get_mut(usize::from(cid)) {
                    Some(Some(b)) if b.done.is_none() => {
                        b.done = Some(Done { status: cqe.status(), result: result_of(&cqe) })
                    }
                    _ => return Err(protocol(format!("a response for command {cid}, which is not in flight"))),
                }
                cid
            } else {
                // CAST: send work request IDs are capsule slot numbers (checked below).
                let slot = wc.wr_id as usize;
                match self.busy.get_mut(slot) {
                    Some(Some(b)) if !b.sent => b.sent = true,
                    _ => return Err(protocol(format!("a send completion for command {slot}, which is not in flight"))),
                }
                // CAST: a slot number, below u16::MAX (see `new`).
                slot as u16
            };
            let slot = usize::from(cid);
            if let Some(Busy { sent: true, done: Some(d), .. }) = self.busy[slot] {
                self.busy[slot] = None;
                self.free.push(cid);
                out.push((cid, d));
            }
        }
        Ok(())
    }

    /// Forgets every command, their registrations with them: only once the connection is
    /// killed (the target can reach none of their memory any more).
    pub(crate) fn clear(&mut self) {
        for b in &mut self.busy {
            *b = None;
        }
        // CAST: at most u16::MAX slots (see `new`).
        self.free = (0..self.busy.len() as u16).rev().collect();
    }
}

/// Runs `cmds` through `slots` (every one free) to completion, as many in flight as the slots
/// allow, waiting up to `timeout` for each completion; returns each command's CID (its slot)
/// and result, in order. Commands that fit the free slots all start before the first wait, in
/// the order of [`Slots::upcoming`]. On an error the caller kills the connection before
/// letting go of the commands' memory.
pub(crate) fn drive<W: Wire>(
    w: &W,
    slots: &mut Slots,
    cmds: &[(Sqe, Option<IbvSge>)],
    timeout: Duration,
    target: &str,
    op: &str,
) -> Result<Vec<(u16, Done)>> {
    let err = |source| Error::RemoteTransport { target: target.to_string(), op: op.to_string(), source };
    let n = cmds.len();
    let mut done: Vec<Option<(u16, Done)>> = vec![None; n];
    let mut index_of = vec![0usize; slots.busy.len()];
    let (mut next, mut finished) = (0usize, 0usize);
    let mut wcs = [IbvWc::default(); 16];
    let mut out = Vec::new();
    // Until every command is over (its SEND and its response completed).
    while finished < n {
        while next < n && slots.room() > 0 {
            let (sqe, inline) = cmds[next];
            let cid = slots.start(w, sqe, inline, None).map_err(err)?;
            index_of[usize::from(cid)] = next;
            next += 1;
        }
        let got = w.wait(&mut wcs, timeout).map_err(err)?;
        slots.handle(w, &wcs[..got], &mut out, target, op)?;
        for (cid, d) in out.drain(..) {
            done[index_of[usize::from(cid)]] = Some((cid, d));
            finished += 1;
        }
    }
    Ok(done.into_iter().map(|d| d.unwrap_or((0, Done { status: ugds_uapi::Status::SUCCESS, result: 0 }))).collect())
}

#[cfg(test)]
#[path = "rdma_drive_tests.rs"]
mod drive_tests;

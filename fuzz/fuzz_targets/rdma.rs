//! The NVMe/RDMA response path against a hostile target: the queue's command loop (`drive`,
//! which sends capsules, consumes work completions and the response capsules they bring, and
//! recycles capsule and response slots) on a scripted connection. Each wait delivers the next
//! list of completions: raw ones (any work request ID, status, opcode, length and response
//! bytes), or ones relative to what the loop has sent (the SEND completion of a capsule in
//! flight, a response naming a command in flight with any status and result).
//!
//! Checked: no panic, in particular none of the harness's (a capsule slot reused before its
//! SEND completed, a receive posted twice, a command whose result is not the first response
//! that named it); an error is `RemoteProtocol` or `RemoteTransport`; a run that succeeds
//! reports every command.
//!
//! Uses only `ugds::test_utils::{rdma_drive, RdmaEvent}`.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ugds::test_utils::{rdma_drive, RdmaEvent};
use ugds::uapi::Sqe;
use ugds::Error;

#[derive(Arbitrary, Debug)]
struct Input {
    cmds: u8,
    slots: u8,
    depth: u8,
    waits: Vec<Vec<Ev>>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Ev {
    Raw { wr_id: u64, status: u32, recv: bool, opcode: u8, byte_len: u32, response: [u8; 16] },
    SendDone { nth: u8 },
    Response { nth: u8, status: u16, result: u32 },
}

fuzz_target!(|input: Input| {
    let n = usize::from(input.cmds % 24) + 1;
    let slots = usize::from(input.slots % 16) + 1;
    let depth = usize::from(input.depth % 33);
    let sqes: Vec<Sqe> = (0..n).map(|i| Sqe::new(if i % 2 == 0 { 0x02 } else { 0x01 }, 0)).collect();
    let waits: Vec<Vec<RdmaEvent>> = input
        .waits
        .iter()
        .take(256)
        .map(|w| {
            w.iter()
                .take(20)
                .map(|e| match *e {
                    Ev::Raw { wr_id, status, recv, opcode, byte_len, response } => RdmaEvent::Raw {
                        wr_id,
                        status,
                        opcode: u32::from(opcode) | if recv { 1 << 7 } else { 0 },
                        byte_len,
                        response,
                    },
                    Ev::SendDone { nth } => RdmaEvent::SendDone { nth },
                    Ev::Response { nth, status, result } => RdmaEvent::Response { nth, status, result },
                })
                .collect()
        })
        .collect();
    match rdma_drive(&sqes, slots, depth, waits) {
        Ok(done) => assert_eq!(done.len(), n, "a result per command"),
        Err(Error::RemoteProtocol { .. } | Error::RemoteTransport { .. }) => {}
        Err(e) => panic!("an error the response path does not document: {e:?}"),
    }
});

//! The data path's own cost per command: build a 4 KiB read in the SQ slot (with its PRP),
//! ring the doorbell, reap the completion by phase bit — against the in-memory device, stepped
//! on the same thread so the figure is deterministic (and countable by callgrind). The device
//! model's own work (read the SQE's command id, write a CQE) is included.
//!
//! `cargo run --release -p ugds --features test-utils --example datapath_cost -- [COMMANDS] [BURST]`

use std::time::{Duration, Instant};
use ugds::mock::MockQueue;
use ugds::queue::{Command, MAX_BURST};
use ugds::uapi::ioctl::Segment;

fn run(m: &MockQueue, segs: &[Segment], burst: usize, commands: usize) -> ugds::Result<()> {
    let cmds: Vec<Command<'_>> = (0..burst)
        .map(|k| Command::Rw { write: false, slba: k as u64, nlb: 1, segs, off: k as u64 * 4096, len: 4096 })
        .collect();
    let mut cids = [0u16; MAX_BURST];
    let mut out = [None; MAX_BURST];
    for _ in 0..commands / burst {
        m.qp.submit(1, &cmds, &m.status, Duration::from_secs(5), &mut cids)?;
        m.step();
        out[..burst].iter_mut().for_each(|o| *o = None);
        let n = m.qp.collect(&cids[..burst], &m.status, &mut out[..burst])?;
        if n != burst {
            return Err(ugds::Error::DeviceProtocol(format!("{n} of {burst} completed")));
        }
    }
    Ok(())
}

fn main() -> ugds::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let commands = args.first().copied().unwrap_or(4_000_000);
    let bursts: Vec<usize> = args.get(1).map(|b| vec![*b]).unwrap_or_else(|| vec![1, 8, 32]);
    let segs = [Segment { dma_addr: 0x2000_0000, len: 1 << 20 }];
    let m = MockQueue::stepped(256)?;
    for burst in bursts {
        run(&m, &segs, burst, 10_000)?;
        let t = Instant::now();
        run(&m, &segs, burst, commands)?;
        let ns = t.elapsed().as_nanos() as f64 / commands as f64;
        println!("burst {burst:>2}: {ns:>6.1} ns per 4 KiB command (build + PRP + doorbell + device model + reap)");
    }
    Ok(())
}

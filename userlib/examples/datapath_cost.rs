//! The data path's own cost per command: write a 4 KiB read into its SQ slot (with its PRPs),
//! ring the doorbell, reap the completion by phase bit — against the in-memory device, stepped
//! on the same thread so the figure is deterministic (and countable by callgrind). The device
//! is a null device (no data kept), but its model's work is included: fetching and decoding the
//! entry, resolving its PRPs, posting the completion.
//!
//! `cargo run --release -p ugds --features test-utils --example datapath_cost -- [COMMANDS] [BURST]`

use std::time::{Duration, Instant};
use ugds::test_utils::{Command, DmaRange, MockConfig, MockQueue, Read, MAX_BURST};

fn run(m: &MockQueue, burst: usize, commands: usize) -> ugds::Result<()> {
    let cmds: Vec<Command<'_>> = (0..burst as u64)
        .map(|k| {
            // SAFETY: the mock's segments name its own memory, which only its model touches;
            // 4096 bytes is exactly one 4 KiB block.
            let data = unsafe { DmaRange::new(m.segments(), k * 4096, 4096) };
            Read::new(k, 1, data).build()
        })
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
    let m = MockQueue::with(MockConfig { depth: 256, stepped: true, null: true, ..MockConfig::default() })?;
    for burst in bursts {
        run(&m, burst, 10_000)?;
        let t = Instant::now();
        run(&m, burst, commands)?;
        let ns = t.elapsed().as_nanos() as f64 / commands as f64;
        println!("burst {burst:>2}: {ns:>6.1} ns per 4 KiB command (build + PRP + doorbell + device model + reap)");
    }
    Ok(())
}

//! The data path's own cost per command: submit + complete of 4 KiB reads against the
//! in-memory device (which completes at once, on another core), single submitting thread.
//!
//! `cargo run --release -p ugds --features test-utils --example datapath_cost`

use std::time::{Duration, Instant};
use ugds::mock::{Behaviour, MockQueue};
use ugds::queue::Command;
use ugds::uapi::ioctl::Segment;

fn main() -> ugds::Result<()> {
    let segs = [Segment { dma_addr: 0x2000_0000, len: 1 << 20 }];
    let m = MockQueue::new(256, Behaviour::Honest)?;
    for burst in [1usize, 8, 32] {
        let cmds: Vec<Command<'_>> = (0..burst)
            .map(|k| Command::Rw { write: false, slba: k as u64, nlb: 1, segs: &segs, off: k as u64 * 4096, len: 4096 })
            .collect();
        // Warm up, then measure.
        for _ in 0..10_000 {
            m.qp.execute(1, &cmds, &m.status, Duration::from_secs(5))?;
        }
        let n = 2_000_000 / burst;
        let t = Instant::now();
        for _ in 0..n {
            m.qp.execute(1, &cmds, &m.status, Duration::from_secs(5))?;
        }
        let ns = t.elapsed().as_nanos() as f64 / (n * burst) as f64;
        println!(
            "burst {burst:>2}: {ns:>7.1} ns per 4 KiB command (submit + doorbell + reap), {:.2} M commands/s",
            1e3 / ns
        );
    }
    Ok(())
}

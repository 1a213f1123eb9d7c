//! A batch: 64 reads of 4 KiB at scattered offsets, submitted together (one doorbell on the
//! direct path, one io_uring submission on the fallback path), their completions reaped as
//! events carrying each request's cookie.
//!
//! `cargo run -p ugds --example batch [TARGET]` (reads only).

mod common;
use common::Target;
use std::sync::Arc;
use std::time::Duration;
use ugds::{IoRequest, IoStatus, Op, Storage, StorageBatch};

fn main() -> std::process::ExitCode {
    common::report(Target::from_args(4 << 20).map_err(Into::into).and_then(|t| run(&t)))
}

fn run(target: &Target) -> Result<String, Box<dyn std::error::Error>> {
    let st = Storage::open(&target.path)?;
    const N: u64 = 64;
    let buf = Arc::new(st.alloc_host(N as usize * 4096)?);
    let offset = |i: u64| (i * 37 % 1024) * 4096;
    let reqs: Vec<IoRequest> = (0..N)
        .map(|i| IoRequest {
            op: Op::Read,
            buf: buf.clone(),
            buf_offset: i * 4096,
            file_offset: offset(i),
            len: 4096,
            cookie: i,
        })
        .collect();
    let mut batch = StorageBatch::new(&st, N as usize)?;
    batch.submit(&reqs)?;
    let mut done = 0;
    while done < N as usize {
        for e in batch.status(N as usize - done, Duration::from_secs(10))? {
            if e.status != IoStatus::Complete {
                return Err(format!("request {}: {:?} {:?}", e.cookie, e.status, e.error).into());
            }
            let mut out = vec![0u8; 4096];
            buf.copy_out(e.cookie as usize * 4096, &mut out)?;
            target.check(offset(e.cookie), &out)?;
            done += 1;
        }
    }
    Ok(format!("{}: {N} reads in one batch through the {}", target.path, st.describe()))
}

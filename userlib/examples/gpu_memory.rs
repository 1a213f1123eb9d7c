//! GPU memory: register device memory (CUDA's, else the CPU stand-in runtime), read 1 MiB into
//! it, copy it out and check it. Peer-to-peer when the path allows, else staged through host
//! memory (`allow_staging`); the buffer says which.
//!
//! `cargo run -p ugds --example gpu_memory [TARGET]` (reads only).

mod common;
use common::Target;
use std::sync::Arc;
use ugds::{Gpu, Storage};

fn main() -> std::process::ExitCode {
    common::report(Target::from_args(8 << 20).map_err(Into::into).and_then(|t| run(&t)))
}

fn run(target: &Target) -> Result<String, Box<dyn std::error::Error>> {
    let st = Storage::open(&target.path)?;
    let gpu = Gpu::cuda().unwrap_or_else(|e| {
        println!("no CUDA here ({e}); using the CPU stand-in runtime");
        Gpu::cpu()
    });
    let len = 1 << 20;
    let mem = Arc::new(gpu.alloc(len)?);
    let buf = st.register_gpu(mem, true)?;
    let n = st.read(&buf, 0, 0, len as u64)?;
    let mut out = vec![0u8; n as usize];
    buf.copy_out(0, &mut out)?;
    target.check(0, &out)?;
    Ok(format!("{}: read {n} bytes into GPU memory, path {}", target.path, buf.path()))
}

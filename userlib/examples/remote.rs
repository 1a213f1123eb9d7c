//! An NVMe over Fabrics target through ugds's own initiator (NVMe/TCP, or NVMe/RDMA with the
//! `rdma` feature): the same `Storage` as a local target.
//!
//! `cargo run -p ugds --example remote nvmeof://tcp/HOST:PORT/SUBSYSNQN?nsid=N` (reads only).

// Only `report` of the shared helpers: no scratch file here.
#[allow(dead_code)]
mod common;
use ugds::Storage;

fn main() -> std::process::ExitCode {
    common::report(run())
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let Some(uri) = std::env::args().nth(1) else {
        return Ok("usage: remote nvmeof://tcp/HOST:PORT/SUBSYSNQN?nsid=N (or nvmeof://rdma/...)".into());
    };
    let st = Storage::open(&uri)?;
    let buf = st.alloc_host(1 << 20)?;
    let n = st.read(&buf, 0, 0, 1 << 20)?;
    Ok(format!("{uri}: {} bytes, read {n} through the {}", st.capacity()?, st.describe()))
}

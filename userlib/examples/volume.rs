//! A striped volume: several controllers bound to ugds as one target (md RAID0 layout), each
//! member on its own queues; 4 MiB read spans every member.
//!
//! `cargo run -p ugds --example volume stripe:[CHUNK:]NODE,NODE,...` (reads only; the members
//! are ugds nodes, so there is no scratch-file form).

// Only `report` of the shared helpers: no scratch file here.
#[allow(dead_code)]
mod common;
use ugds::{Storage, VolumeSpec};

fn main() -> std::process::ExitCode {
    common::report(run())
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let Some(spec) = std::env::args().nth(1) else {
        return Ok("usage: volume stripe:[CHUNK:]/dev/ugds_drv0,/dev/ugds_drv1,...".into());
    };
    // Parsed first, to say what it is; `Storage::open(&spec)` takes the same string.
    let parsed = VolumeSpec::parse(&spec)?;
    let st = Storage::volume(&parsed, &Default::default())?;
    let len = 4 << 20;
    let buf = st.alloc_host(len)?;
    let n = st.read(&buf, 0, 0, len as u64)?;
    Ok(format!("{spec}: read {n} bytes through the {}", st.describe()))
}

//! Host memory: allocate a registered buffer, read 1 MiB into it, and on the scratch file write
//! it back elsewhere and read that too.
//!
//! `cargo run -p ugds --example host_memory [TARGET]` (reads only from a TARGET you name).

mod common;
use common::Target;
use ugds::Storage;

fn main() -> std::process::ExitCode {
    common::report(Target::from_args(8 << 20).map_err(Into::into).and_then(|t| run(&t)))
}

fn run(target: &Target) -> Result<String, Box<dyn std::error::Error>> {
    let st = Storage::open(&target.path)?;
    let len = 1 << 20;
    // Page-aligned host memory, registered for this storage (pinned for the direct path).
    let buf = st.alloc_host(len)?;
    // (buffer, buffer offset, target offset, length) -> bytes moved.
    let n = st.read(&buf, 0, 0, len as u64)?;
    target.check(0, &buf.host_view()?[..n as usize])?;
    if target.scratch {
        // The CPU's view of the buffer: refused while I/O into it runs.
        buf.host_view()?[..4096].fill(0x5a);
        st.write(&buf, 0, 4 << 20, 4096)?;
        st.flush()?;
        let back = st.alloc_host(4096)?;
        st.read(&back, 0, 4 << 20, 4096)?;
        if back.host_view()?.iter().any(|&b| b != 0x5a) {
            return Err("the written block did not read back".into());
        }
    }
    Ok(format!("{}: read {n} bytes (path: {}) through the {}", target.path, buf.path(), st.describe()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_on_a_scratch_file() {
        let t = super::Target::scratch(8 << 20).unwrap();
        let said = super::run(&t).unwrap();
        assert!(said.contains("read 1048576 bytes"), "{said}");
    }
}

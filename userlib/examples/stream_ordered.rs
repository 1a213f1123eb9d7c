//! Stream-ordered I/O: reads queued on a stream whose arguments are set by stream work queued
//! before them (bound late, as cuFile's `cuFileReadAsync`), and work after them that sees the
//! data. The CPU stream runs anywhere; a CUDA stream (`ugds::gpu::cuda::CudaStream`) takes its
//! place on a GPU.
//!
//! `cargo run -p ugds --example stream_ordered [TARGET]` (reads only).

mod common;
use common::Target;
use std::sync::{Arc, Mutex};
use ugds::{AsyncArgs, AsyncParams, CpuStream, Storage, StreamIo};

fn main() -> std::process::ExitCode {
    common::report(Target::from_args(4 << 20).map_err(Into::into).and_then(|t| run(&t)))
}

fn run(target: &Target) -> Result<String, Box<dyn std::error::Error>> {
    let st = Storage::open(&target.path)?;
    let buf = Arc::new(st.alloc_host(16 * 4096)?);
    let stream = CpuStream::new()?;
    let sio = StreamIo::new(stream.clone())?;
    let results = Arc::new(Mutex::new(Vec::new()));
    for i in 0..16i64 {
        // Queued with placeholder arguments; the stream work before the read sets them.
        let args = AsyncArgs::new(0, -1, -1);
        let a = args.clone();
        stream.launch(move || a.set(4096, i * 8192, i * 4096))?;
        sio.read_async(&st, &buf, &args)?;
        let r = results.clone();
        // Runs once the read is done: its result is bytes, or a negative errno.
        stream.launch(move || r.lock().unwrap_or_else(|e| e.into_inner()).push(args.result()))?;
    }
    sio.synchronize()?;
    let results = results.lock().unwrap_or_else(|e| e.into_inner());
    if results.iter().any(|&r| r != 4096) {
        return Err(format!("results: {results:?}").into());
    }
    for i in 0..16u64 {
        let mut out = vec![0u8; 4096];
        buf.copy_out(i as usize * 4096, &mut out)?;
        target.check(i * 8192, &out)?;
    }
    Ok(format!("{}: 16 stream-ordered reads, in stream order", target.path))
}

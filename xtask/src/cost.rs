//! `cargo xtask cost`: the data path's own cost per 4 KiB command, against the in-memory device
//! model stepped on the same thread (`userlib/examples/datapath_cost.rs`).
//!
//! Both ways of using a queue pair are measured: `shared` (through its lock, as threads sharing
//! a queue do) and `owned` (the single-owner calls a queue batch uses: no lock); at burst 1
//! through the one-command calls a synchronous request of one command makes. `storage` is the
//! whole synchronous 4 KiB read from `Storage::read` (checks, lease, path, queue) on the
//! device's shared queue, `storage-owned` on the thread's own queue, the model stepped on the
//! same thread each time the read's wait finds nothing. `batch` is a `StorageBatch` of 32 or 128
//! entries kept full as `ugds bench --iodepth` keeps it, on the model's queue pair, the model
//! posting at most 4 completions per step (its figures are per read); `batch-1` a batch of 8
//! whose model posts one completion per step, so every wait and every submit carries one read.
//!
//! - `ns/command`: native wall time per command, bursts 1 and 32, the model's work included
//!   (a native clock cannot separate two pieces of code on one thread without disturbing them).
//! - `instructions/command`: from callgrind, twice: everything, and only inside the model's
//!   `MockQueue::step` (`--toggle-collect`, the function is never inlined for this). The
//!   engine's own share is the difference. Each figure is the difference of two runs of
//!   different lengths divided by the extra commands, so start-up and warm-up cancel.
//!   The engine's ns is estimated as the native ns times the engine's share of instructions.

use crate::toolchain;
use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;

/// The model's entry points, as callgrind names them: stepped by the benchmark loop, or by a
/// wait that found nothing (`storage`; the hook that walks the thread's models, so its walk is
/// not counted as the engine's). Neither calls the other (nested toggles would cancel).
const MODEL_FNS: [&str; 2] = ["*MockQueue*step*", "*mock*on_idle_poll*"];

/// What the cost program drives: the queue pair shared, owned, the whole `Storage::read` on a
/// shared queue or on the thread's own, or a `StorageBatch` of 32 and of 128 entries (and of 8
/// whose waits each find one completion).
const MODES: [(usize, &str); 9] = [
    (1, "shared"),
    (1, "owned"),
    (32, "shared"),
    (32, "owned"),
    (1, "storage"),
    (1, "storage-owned"),
    (32, "batch"),
    (128, "batch"),
    (8, "batch-1"),
];

/// One burst size's figures.
#[derive(Debug, Clone, Copy)]
pub struct Cost {
    /// Native ns per command, model included.
    pub ns_total: f64,
    /// Instructions per command, model included.
    pub instr_total: f64,
    /// Instructions per command inside the model.
    pub instr_model: f64,
}

impl Cost {
    /// The engine's own instructions per command.
    pub fn instr_engine(&self) -> f64 {
        self.instr_total - self.instr_model
    }

    /// The engine's ns per command, estimated by its share of instructions.
    pub fn ns_engine(&self) -> f64 {
        if self.instr_total > 0.0 {
            self.ns_total * self.instr_engine() / self.instr_total
        } else {
            0.0
        }
    }
}

/// Builds the cost program and measures bursts 1 and 32, shared and owned, the whole
/// synchronous read, and batches of 32 and 128 entries.
pub fn run() -> Result<Vec<Cost>> {
    toolchain::setup_and_build_release(&["-p", "ugds", "--features", "test-utils", "--example", "datapath_cost"])?;
    let bin = toolchain::workspace_root().join("target/release/examples/datapath_cost");
    let mut out = Vec::new();
    for (burst, mode) in MODES {
        let c = measure(&bin, burst, mode)?;
        println!(
            "burst {burst:>3} {mode:<13}: instructions/command: {:.0} (engine; model {:.0} subtracted from {:.0})  \
             ns/command: {:.1} (native, model included; engine about {:.1})",
            c.instr_engine(),
            c.instr_model,
            c.instr_total,
            c.ns_total,
            c.ns_engine()
        );
        out.push(c);
    }
    println!(
        "goals: instructions/command <= 400 at burst 1 and <= 250 at burst 32, shared and owned \
         (storage: the whole synchronous read, for comparison; batch: per read of a batch of BURST \
         entries kept full, 4 completions per step of the model; batch-1: 1 per step)"
    );
    Ok(out)
}

/// Measures the built cost program `bin` at `burst` commands per doorbell in `mode` (`shared`:
/// through the queue pair's lock; `owned`: as its single owner; `storage`: `Storage::read`).
pub fn measure(bin: &Path, burst: usize, mode: &str) -> Result<Cost> {
    let native = toolchain::output(Command::new(bin).args(["4000000", &burst.to_string(), mode]))?;
    // "burst 32 (owned):   57.3 ns per 4 KiB command ...": the number before "ns".
    let words: Vec<&str> = native.split_whitespace().collect();
    let ns_total = words
        .iter()
        .position(|w| *w == "ns")
        .and_then(|i| i.checked_sub(1))
        .and_then(|i| words[i].parse::<f64>().ok())
        .with_context(|| format!("unexpected output of datapath_cost: {native:?}"))?;
    let (short, long) = (32_000u64, 64_000u64);
    let per_command = |model_only: bool| -> Result<f64> {
        let a = callgrind(bin, short, burst, mode, model_only)?;
        let b = callgrind(bin, long, burst, mode, model_only)?;
        Ok(b.saturating_sub(a) as f64 / (long - short) as f64)
    };
    Ok(Cost { ns_total, instr_total: per_command(false)?, instr_model: per_command(true)? })
}

/// Instructions callgrind collected for `commands` commands (only inside the model when
/// `model_only`).
fn callgrind(bin: &Path, commands: u64, burst: usize, mode: &str, model_only: bool) -> Result<u64> {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=callgrind", "--callgrind-out-file=/dev/null"]);
    if model_only {
        cmd.arg("--collect-atstart=no");
        cmd.args(MODEL_FNS.iter().map(|f| format!("--toggle-collect={f}")));
    }
    let out = cmd
        .arg(bin)
        .args([commands.to_string(), burst.to_string(), mode.to_string()])
        .output()
        .context("running valgrind (ci/packages.txt lists it; apt-get install valgrind)")?;
    let text = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        anyhow::bail!("valgrind failed: {text}");
    }
    text.lines()
        .find_map(|l| l.split("Collected :").nth(1))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no callgrind total in: {text}"))
}

//! `cargo xtask cost`: the data path's own cost per 4 KiB command, against the in-memory device
//! model stepped on the same thread (`userlib/examples/datapath_cost.rs`).
//!
//! Both ways of using a queue pair are measured: `shared` (through its lock, as threads sharing
//! a queue do) and `owned` (the single-owner calls a queue batch uses: no lock).
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

/// The model's entry point, as callgrind names it.
const MODEL_FN: &str = "*MockQueue*step*";

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

/// Builds the cost program and measures bursts 1 and 32, shared and owned.
pub fn run() -> Result<Vec<Cost>> {
    toolchain::setup_and_build_release(&["-p", "ugds", "--features", "test-utils", "--example", "datapath_cost"])?;
    let bin = toolchain::workspace_root().join("target/release/examples/datapath_cost");
    let mut out = Vec::new();
    for burst in [1usize, 32] {
        for owned in [false, true] {
            let c = measure(&bin, burst, owned)?;
            println!(
                "burst {burst:>2} {:<6}: instructions/command: {:.0} (engine; model {:.0} subtracted from {:.0})  \
                 ns/command: {:.1} (native, model included; engine about {:.1})",
                mode(owned),
                c.instr_engine(),
                c.instr_model,
                c.instr_total,
                c.ns_total,
                c.ns_engine()
            );
            out.push(c);
        }
    }
    println!("goal (issue 17): instructions/command <= 300 and ns/command <= 60 at burst 32");
    Ok(out)
}

fn mode(owned: bool) -> &'static str {
    if owned {
        "owned"
    } else {
        "shared"
    }
}

/// Measures the built cost program `bin` at `burst` commands per doorbell, through the queue
/// pair's lock or as its single owner.
pub fn measure(bin: &Path, burst: usize, owned: bool) -> Result<Cost> {
    let native = toolchain::output(Command::new(bin).args(["4000000", &burst.to_string(), mode(owned)]))?;
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
        let a = callgrind(bin, short, burst, owned, model_only)?;
        let b = callgrind(bin, long, burst, owned, model_only)?;
        Ok(b.saturating_sub(a) as f64 / (long - short) as f64)
    };
    Ok(Cost { ns_total, instr_total: per_command(false)?, instr_model: per_command(true)? })
}

/// Instructions callgrind collected for `commands` commands (only inside the model when
/// `model_only`).
fn callgrind(bin: &Path, commands: u64, burst: usize, owned: bool, model_only: bool) -> Result<u64> {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=callgrind", "--callgrind-out-file=/dev/null"]);
    if model_only {
        cmd.args(["--collect-atstart=no", &format!("--toggle-collect={MODEL_FN}")]);
    }
    let out = cmd
        .arg(bin)
        .args([commands.to_string(), burst.to_string(), mode(owned).to_string()])
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

//! `cargo xtask fuzz`: builds the coverage-guided fuzz targets in `fuzz/` (cargo-fuzz, libFuzzer,
//! AddressSanitizer) with the nightly toolchain and runs each for a while, keeping the corpus
//! under `target/fuzz-corpus/<target>` (seeded from `fuzz/seeds/<target>` when present).
//! Prints each target's executions and whether it found a crash; fails if one did.

use crate::toolchain;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The targets, in the order they run.
pub const TARGETS: [&str; 5] = ["ring", "capi", "ioctl", "tcp", "rdma"];

/// The toolchain cargo-fuzz builds with (it needs `-Zsanitizer`).
const TOOLCHAIN: &str = "+nightly";

/// Longest a single input may run before libFuzzer calls it a hang (seconds).
const INPUT_TIMEOUT_S: u64 = 10;

/// What one target's run gave.
#[derive(Debug)]
pub struct Outcome {
    /// The target.
    pub target: &'static str,
    /// Inputs executed.
    pub execs: u64,
    /// Inputs that reached new coverage (added to the corpus).
    pub new_units: u64,
    /// Coverage points (edges) reached at the end.
    pub cov: u64,
    /// Inputs in the corpus (seeds included) at the end.
    pub corpus: u64,
    /// The input that crashed, hung or leaked, when one did.
    pub crash: Option<String>,
    /// The full log.
    pub log: PathBuf,
}

/// Runs `target` (or every target) for `seconds` each.
pub fn run(seconds: u64, target: Option<&str>) -> Result<()> {
    let targets: Vec<&'static str> = match target {
        Some(t) => vec![TARGETS
            .iter()
            .copied()
            .find(|x| *x == t)
            .with_context(|| format!("no fuzz target {t:?}: the targets are {}", TARGETS.join(", ")))?],
        None => TARGETS.to_vec(),
    };
    let root = toolchain::workspace_root();
    check_tools()?;
    let start = Instant::now();
    let mut build = cargo_fuzz(&root);
    build.args(["build", "--target-dir", "target/fuzz-build"]);
    if let Some(t) = target {
        // Without a name, cargo fuzz builds every target.
        build.arg(t);
    }
    toolchain::run(&mut build).context("building the fuzz targets (cargo +nightly fuzz build)")?;
    eprintln!("fuzz: built {} target(s) in {:.0?}", targets.len(), start.elapsed());
    let mut outcomes = Vec::new();
    for t in targets {
        let o = run_one(&root, t, seconds)?;
        println!(
            "fuzz {:<6} {:>9} executions in {seconds} s, {} new inputs, {} edges, corpus {}: {}",
            o.target,
            o.execs,
            o.new_units,
            o.cov,
            o.corpus,
            o.crash.as_deref().map_or("no crash".to_string(), |c| format!("CRASH {c}"))
        );
        outcomes.push(o);
    }
    let crashed: Vec<&Outcome> = outcomes.iter().filter(|o| o.crash.is_some()).collect();
    if !crashed.is_empty() {
        for o in &crashed {
            eprintln!(
                "fuzz {}: see {}; reproduce with `target/fuzz-build/x86_64-unknown-linux-gnu/release/{} {}`",
                o.target,
                o.log.display(),
                o.target,
                o.crash.as_deref().unwrap_or_default()
            );
        }
        bail!("{} fuzz target(s) found a crash", crashed.len());
    }
    Ok(())
}

/// The nightly toolchain and cargo-fuzz, or how to get them.
fn check_tools() -> Result<()> {
    let ok = |args: &[&str]| {
        Command::new("cargo").args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    if !ok(&[TOOLCHAIN, "--version"]) {
        bail!("no nightly toolchain: `rustup toolchain install nightly --profile minimal` (ci/setup.sh does it)");
    }
    if !ok(&[TOOLCHAIN, "fuzz", "--version"]) {
        bail!("cargo-fuzz is not installed: `cargo install --locked cargo-fuzz` (ci/setup.sh does it)");
    }
    Ok(())
}

/// `cargo +nightly fuzz` in the repository root, without the variables the stable cargo that
/// runs xtask set for us (they would point the nightly build at the stable toolchain).
fn cargo_fuzz(root: &Path) -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(root).args([TOOLCHAIN, "fuzz"]);
    for v in ["RUSTUP_TOOLCHAIN", "RUSTC", "RUSTC_WRAPPER", "RUSTDOC", "RUSTFLAGS", "CARGO", "CARGO_TARGET_DIR"] {
        c.env_remove(v);
    }
    c
}

fn run_one(root: &Path, target: &'static str, seconds: u64) -> Result<Outcome> {
    let corpus = root.join("target/fuzz-corpus").join(target);
    let artifacts = root.join("target/fuzz-artifacts").join(target);
    let logs = root.join("target/fuzz-logs");
    for d in [&corpus, &artifacts, &logs] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let log = logs.join(format!("{target}.log"));
    let bin = root.join("target/fuzz-build/x86_64-unknown-linux-gnu/release").join(target);
    let mut cmd = Command::new(&bin);
    cmd.current_dir(root).arg(&corpus);
    // Seeds are read, never written (new inputs go to the first folder, the corpus).
    let seeds = root.join("fuzz/seeds").join(target);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    cmd.arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .args(["-print_final_stats=1", "-print_funcs=0", "-print_pcs=0"])
        // LeakSanitizer at exit, with the C ABI's deliberate per-handle records suppressed.
        .env("LSAN_OPTIONS", format!("suppressions={}:print_suppressions=0", root.join("fuzz/lsan.supp").display()));
    if target == "capi" {
        // Every registered handle keeps a record for the process's lifetime (by design), so
        // libFuzzer's per-input leak check would rescan the heap after every input (50x
        // slower); leaks are still checked once, at exit.
        cmd.arg("-detect_leaks=0");
    }
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdout(out.try_clone()?).stderr(out);
    let mut child = cmd.spawn().with_context(|| format!("starting {}", bin.display()))?;
    // libFuzzer stops itself; this only guards against a fuzzer that cannot.
    let deadline = Instant::now() + Duration::from_secs(seconds + 4 * INPUT_TIMEOUT_S + 60);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("fuzz {target}: still running {} s past its time; see {}", seconds, log.display());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let stat = |name: &str| -> u64 {
        text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    };
    let crash = crash_of(&text).or_else(|| (!status.success()).then(|| format!("(exit status {status})")));
    let (cov, corp) = done_line(&text).unwrap_or_default();
    Ok(Outcome {
        target,
        execs: stat("stat::number_of_executed_units:"),
        new_units: stat("stat::new_units_added:"),
        cov,
        corpus: corp,
        crash,
        log,
    })
}

/// Coverage and corpus size from libFuzzer's last status line
/// (`#27904 DONE cov: 3536 ft: 10181 corp: 540/31Kb ...`).
pub fn done_line(log: &str) -> Option<(u64, u64)> {
    let line = log.lines().rev().find(|l| l.contains("\tDONE "))?;
    let field = |name: &str| -> Option<u64> {
        let rest = &line[line.find(name)? + name.len()..];
        rest.trim_start().split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    Some((field("cov:")?, field("corp:")?))
}

/// The artifact libFuzzer wrote for a crash, hang or leak (`... Test unit written to PATH`).
pub fn crash_of(log: &str) -> Option<String> {
    log.lines().find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_artifact_of_a_crash() {
        let log = "==1==ERROR: libFuzzer: deadly signal\nMS: 1 ChangeBit-; base unit: 0\n\
                   artifact_prefix='t/'; Test unit written to t/crash-abc\nBase64: AA==\n";
        assert_eq!(crash_of(log).as_deref(), Some("t/crash-abc"));
        assert_eq!(crash_of("Done 10 runs in 1 second(s)\nstat::number_of_executed_units: 10\n"), None);
    }

    #[test]
    fn reads_coverage_and_corpus_from_the_done_line() {
        let log = "#375\tINITED cov: 3482 ft: 9034 corp: 372/18Kb exec/s: 375 rss: 73Mb\n\
                   #27904\tDONE   cov: 3536 ft: 10181 corp: 540/31Kb lim: 122 exec/s: 457 rss: 412Mb\n";
        assert_eq!(done_line(log), Some((3536, 540)));
        assert_eq!(done_line("#1\tINITED cov: 1 ft: 1 corp: 1/1b\n"), None);
    }
}

//! The `ugds` CLI on targets that are not ugds nodes: files take the fallback path and say so;
//! anything else is refused with an error that names the target, what it is and what to do.

use std::process::Command;

fn ugds(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ugds")).args(args).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn info_read_and_write_work_on_a_file() {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{}.bin", std::process::id()));
    std::fs::File::create(&path).unwrap().set_len(8 << 20).unwrap();
    let p = path.to_str().unwrap();
    let (ok, out) = ugds(&["info", p]);
    assert!(ok && out.contains("fallback path") && out.contains("8388608 bytes"), "{out}");
    let (ok, out) = ugds(&["--json", "info", p]);
    assert!(ok && out.contains("\"path\":\"fallback\""), "{out}");
    let (ok, out) = ugds(&["write", p, "--offset", "1M", "--len", "2M", "--pattern", "9"]);
    assert!(ok, "{out}");
    let (ok, out) = ugds(&["read", p, "--offset", "1M", "--len", "2M", "--check-pattern", "9"]);
    assert!(ok && out.contains("fallback path"), "{out}");
    let (ok, out) = ugds(&["read", p, "--offset", "1M", "--len", "2M", "--check-pattern", "10"]);
    assert!(!ok && out.contains("pattern mismatch"), "{out}");
    let to = format!("{p}.out");
    let (ok, out) = ugds(&["read", p, "--offset", "8M", "--len", "4K", "--to", &to]);
    assert!(!ok && out.contains("runs past the end"), "{out}");
    assert!(!std::path::Path::new(&to).exists(), "a refused read created its output file");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_wrong_target_is_named_with_what_it_is_and_what_to_do() {
    let (ok, out) = ugds(&["info", "/dev/null"]);
    assert!(!ok && out.contains("/dev/null is a character device") && out.contains("ugds_drv"), "{out}");
    let (ok, out) = ugds(&["bench", "/dev/null"]);
    assert!(!ok && out.contains("not a ugds node") && out.contains("ugds bind"), "{out}");
    let (ok, out) = ugds(&["info", "/nonexistent/x"]);
    assert!(!ok && out.contains("/nonexistent/x"), "{out}");
}

#[test]
fn a_write_with_a_bad_length_is_refused_before_any_byte_is_written() {
    let path =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-badwrite-{}.bin", std::process::id()));
    let before: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &before).unwrap();
    let p = path.to_str().unwrap();
    // Longer than one 8 MiB chunk and not a multiple of the block size: the first chunks would
    // be fine, the last one is not.
    let (ok, out) = ugds(&["write", p, "--offset", "0", "--len", "8388708", "--pattern", "5"]);
    assert!(!ok && out.contains("len") && out.contains("block size"), "{out}");
    // A misaligned offset, and a zero length, likewise.
    let (ok, out) = ugds(&["write", p, "--offset", "100", "--len", "12M", "--pattern", "5"]);
    assert!(!ok && out.contains("offset"), "{out}");
    let (ok, out) = ugds(&["write", p, "--offset", "0", "--len", "0", "--pattern", "5"]);
    assert!(!ok && out.contains("len"), "{out}");
    let from = format!("{p}.src");
    std::fs::write(&from, vec![7u8; 9 << 20]).unwrap();
    let (ok, out) = ugds(&["write", p, "--offset", "0", "--len", "8388708", "--from", &from]);
    assert!(!ok && out.contains("block size"), "{out}");
    assert!(std::fs::read(&path).unwrap() == before, "a refused write changed the target file");
    std::fs::remove_file(&from).unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn bench_refuses_a_zero_block_size_and_bad_runtimes_by_name() {
    let path =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-badbench-{}.bin", std::process::id()));
    std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
    let p = path.to_str().unwrap();
    let (ok, out) = ugds(&["bench", p, "--bs", "0", "--runtime", "0.1"]);
    assert!(!ok && out.contains("--bs") && out.contains("non-zero"), "{out}");
    for bad in ["-1", "nan", "inf", "0", "1e300"] {
        let (ok, out) = ugds(&["bench", p, &format!("--runtime={bad}")]);
        assert!(!ok && out.contains("--runtime") && !out.contains("panicked"), "{bad}: {out}");
    }
    for (args, want) in [
        (&["--rw", "mix"][..], "randrw"),
        (&["--rwmixread", "101"][..], "--rwmixread"),
        (&["--offset", "100"][..], "--offset"),
        (&["--size", "1K"][..], "smaller than --bs"),
    ] {
        let (ok, out) = ugds(&[&["bench", p, "--runtime", "0.05"][..], args].concat());
        assert!(!ok && out.contains(want), "{args:?}: {out}");
    }
    let (ok, out) = ugds(&["bench-gpu", p, "--cpu", "--sizes", "4K,0"]);
    assert!(!ok && out.contains("--sizes") && out.contains("non-zero"), "{out}");
    let (ok, out) = ugds(&["bench-gpu", p, "--cpu", "--seconds=-2"]);
    assert!(!ok && out.contains("--seconds") && !out.contains("panicked"), "{out}");
    // The file as an option still parses (deprecated), but not both ways at once.
    let (ok, out) = ugds(&["bench-gpu", "--file", p, "--cpu", "--sizes", "4K,0"]);
    assert!(!ok && out.contains("--sizes"), "{out}");
    let (ok, out) = ugds(&["bench-gpu", p, "--file", p, "--cpu"]);
    assert!(!ok && out.contains("cannot be used with"), "{out}");
    let (ok, out) = ugds(&["bench-gpu", "--cpu"]);
    assert!(!ok && out.contains("required"), "{out}");
    // A good short run still works.
    let (ok, out) = ugds(&["bench", p, "--rw", "randread", "--bs", "4K", "--runtime", "0.05", "--size", "1M"]);
    assert!(ok && out.contains("IOPS") && out.contains("99.99th"), "{out}");
    std::fs::remove_file(&path).unwrap();
}

/// `ugds --json bench`'s object (standard output only: the start-up line goes to stderr).
fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_ugds")).arg("--json").arg("bench").args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // No key twice (a parser keeps only the last): `ios` once at the top and once per direction.
    let sides = ["read", "write"].iter().filter(|d| !v[**d].is_null()).count();
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches("\"ios\":").count(), 1 + sides, "{v}");
    v
}

#[test]
fn bench_takes_fios_options_and_reports_percentiles() {
    let path =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-bench-{}.bin", std::process::id()));
    std::fs::File::create(&path).unwrap().set_len(4 << 20).unwrap();
    let p = path.to_str().unwrap();
    // Sequential reads: fio's default rw; the region is the whole file from --offset.
    let v = bench_json(&[p, "--runtime", "0.1", "--offset", "1M"]);
    assert_eq!((v["rw"].as_str(), v["bs"].as_u64(), v["size"].as_u64()), (Some("read"), Some(4096), Some(3 << 20)));
    assert!(v["ios"].as_u64().unwrap() > 0 && v["write"].is_null() && v["rwmixread"].is_null(), "{v}");
    for k in ["min_us", "avg_us", "max_us", "p50_us", "p90_us", "p99_us", "p99_9_us", "p99_99_us"] {
        let (x, side) = (v[k].as_f64().unwrap(), v["read"]["lat"][k].as_f64().unwrap());
        assert!(x > 0.0 && x == side, "{k}: {v}");
    }
    let l = |k: &str| v[k].as_f64().unwrap();
    assert!(l("min_us") <= l("p50_us") && l("p50_us") <= l("p90_us") && l("p90_us") <= l("p99_us"), "{v}");
    assert!(l("p99_us") <= l("p99_9_us") && l("p99_9_us") <= l("p99_99_us") && l("p99_99_us") <= l("max_us"), "{v}");
    // Mixed, random, several jobs and a batch: both directions, in about the asked proportion.
    let v = bench_json(&[
        p,
        "--rw",
        "randrw",
        "--rwmixread",
        "75",
        "--numjobs",
        "2",
        "--iodepth",
        "4",
        "--bs",
        "8K",
        "--size",
        "2M",
        "--runtime",
        "0.2",
    ]);
    let (r, w) = (v["read"]["lat"]["ios"].as_u64().unwrap(), v["write"]["lat"]["ios"].as_u64().unwrap());
    assert_eq!(r + w, v["ios"].as_u64().unwrap(), "{v}");
    assert!(r > w && w > 0, "{r} reads, {w} writes: {v}");
    assert_eq!((v["numjobs"].as_u64(), v["iodepth"].as_u64(), v["queue"].as_str()), (Some(2), Some(4), Some("batch")));
    assert_eq!(v["rwmixread"].as_u64(), Some(75));
    // Sequential writes, and the old spellings of the options (kept as aliases).
    let v = bench_json(&[p, "--rw", "write", "--threads", "1", "--depth", "1", "--seconds", "0.05", "--span", "1M"]);
    assert!(v["read"].is_null() && v["write"]["iops"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["size"].as_u64(), Some(1 << 20));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn version_completions_and_man_page_come_from_the_parser() {
    let (ok, out) = ugds(&["--version"]);
    assert!(ok && out.trim() == format!("ugds {}", env!("CARGO_PKG_VERSION")), "{out}");
    let (ok, out) = ugds(&["completions", "bash"]);
    assert!(ok && out.contains("complete") && out.contains("--rwmixread") && out.contains("bench-gpu"), "{out}");
    let (ok, out) = ugds(&["completions", "zsh"]);
    assert!(ok && out.contains("#compdef ugds"), "{out}");
    let (ok, out) = ugds(&["man"]);
    assert!(ok && out.contains(".TH ugds 1") && out.contains("bench"), "{out}");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-man-{}", std::process::id()));
    let (ok, out) = ugds(&["man", "--dir", dir.to_str().unwrap()]);
    assert!(ok, "{out}");
    let bench = std::fs::read_to_string(dir.join("ugds-bench.1")).unwrap();
    assert!(bench.contains("iodepth") && bench.contains("rwmixread"), "{bench}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn doctor_speaks_json_through_serde_and_fails_on_a_no() {
    let out = Command::new(env!("CARGO_BIN_EXE_ugds")).args(["--json", "doctor"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let findings: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!findings.is_empty());
    for f in &findings {
        assert!(["ok", "warn", "no", "info"].contains(&f["verdict"].as_str().unwrap()), "{f}");
        assert!(f["topic"].is_string() && f["detail"].is_string() && f["fix"].is_string(), "{f}");
    }
    // This machine's findings decide the status: non-zero exactly when one of them is `no`.
    let no = findings.iter().filter(|f| f["verdict"] == "no").count();
    assert_eq!(out.status.success(), no == 0, "{text}{}", String::from_utf8_lossy(&out.stderr));
    if no > 0 {
        assert!(String::from_utf8_lossy(&out.stderr).contains("rule the direct path out"));
    }
}

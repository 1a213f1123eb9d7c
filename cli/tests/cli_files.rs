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
fn bench_refuses_a_zero_size_and_bad_seconds_by_name() {
    let path =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-badbench-{}.bin", std::process::id()));
    std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
    let p = path.to_str().unwrap();
    let (ok, out) = ugds(&["bench", p, "--size", "0", "--seconds", "0.1"]);
    assert!(!ok && out.contains("--size") && out.contains("non-zero"), "{out}");
    for bad in ["-1", "nan", "inf", "0", "1e300"] {
        let (ok, out) = ugds(&["bench", p, &format!("--seconds={bad}")]);
        assert!(!ok && out.contains("--seconds") && !out.contains("panicked"), "{bad}: {out}");
    }
    let (ok, out) = ugds(&["bench-gpu", "--file", p, "--cpu", "--sizes", "4K,0"]);
    assert!(!ok && out.contains("--sizes") && out.contains("non-zero"), "{out}");
    let (ok, out) = ugds(&["bench-gpu", "--file", p, "--cpu", "--seconds=-2"]);
    assert!(!ok && out.contains("--seconds") && !out.contains("panicked"), "{out}");
    // A good short run still works.
    let (ok, out) = ugds(&["bench", p, "--size", "4K", "--seconds", "0.05", "--span", "1M"]);
    assert!(ok && out.contains("IOPS"), "{out}");
    std::fs::remove_file(&path).unwrap();
}

//! The engine under the distribution's fio (`/usr/bin/fio`, or `$UGDS_FIO`), on files of a
//! temporary directory (the fallback path): fio's own verification (crc32c, md5, pattern, with
//! and without verify_backlog) at iodepth 1 and deeper, through `ioengine=external:` and through
//! LD_PRELOAD; data the engine wrote checked by fio's psync engine; data the engine did not
//! write refused by fio's verification; bad targets and options refused by name.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The fio to run.
fn fio_bin() -> String {
    std::env::var("UGDS_FIO").unwrap_or_else(|_| "/usr/bin/fio".into())
}

/// `libugds_fio.so` of this build: cargo builds it into `deps/`, beside the test executable
/// (the copy one level up is refreshed only by `cargo build`, so it may be older).
fn engine() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let so = exe.parent().expect("deps dir").join("libugds_fio.so");
    assert!(so.exists(), "{} missing: build the ugds-fio crate", so.display());
    so
}

/// What one fio run gave.
struct Run {
    ok: bool,
    /// Its JSON report (`--output-format=json`), the first job's object.
    job: Value,
    /// stdout and stderr, for messages.
    text: String,
}

impl Run {
    fn error(&self) -> i64 {
        self.job["error"].as_i64().unwrap_or(-1)
    }
    fn bytes(&self, dir: &str) -> u64 {
        self.job[dir]["io_bytes"].as_u64().unwrap_or(0)
    }
}

/// Runs fio on a job file holding `job` (under a `[global]` section with `engine_line`, when
/// given); LD_PRELOAD when `preload`.
fn fio(dir: &Path, engine_line: Option<&str>, job: &str, preload: bool) -> Run {
    let jobfile = dir.join("job.fio");
    let global = engine_line.map(|e| format!("[global]\n{e}\n")).unwrap_or_default();
    std::fs::write(&jobfile, format!("{global}[job]\n{job}\n")).expect("writing the job file");
    let mut cmd = Command::new(fio_bin());
    // A failed verification leaves fio's state files (local-job-N-verify.state) in its
    // working directory: the temporary one.
    cmd.current_dir(dir).arg("--output-format=json").arg(&jobfile);
    if preload {
        cmd.env("LD_PRELOAD", engine());
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("running {} (install fio 3.33: ci/setup.sh): {e}", fio_bin()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The engine's log lines (fio's log_info) share fio's output: the report is the JSON
    // object that starts on a line of its own.
    let json = if stdout.starts_with('{') { Some(&stdout[..]) } else { stdout.find("\n{").map(|i| &stdout[i + 1..]) };
    let v: Value = json.and_then(|j| serde_json::from_str(j).ok()).unwrap_or(Value::Null);
    let text = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    Run { ok: out.status.success(), job: v["jobs"][0].clone(), text }
}

fn external() -> String {
    format!("ioengine=external:{}", engine().display())
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}

fn assert_clean(r: &Run, write: u64, read: u64) {
    assert!(r.ok, "fio failed:\n{}", r.text);
    assert_eq!(r.error(), 0, "{}", r.text);
    assert_eq!(r.bytes("write"), write, "bytes written:\n{}", r.text);
    assert_eq!(r.bytes("read"), read, "bytes read (verification):\n{}", r.text);
}

#[test]
fn fio_is_the_release_the_engine_is_built_for() {
    let out = Command::new(fio_bin()).arg("--version").output().expect("running fio --version");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "fio-3.33");
}

#[test]
fn verify_crc32c_at_iodepth_1_creates_the_file_and_logs_the_path() {
    let d = tmp();
    let f = d.path().join("data");
    let job = format!("filename={}\nsize=8M\nbs=4k\nrw=randwrite\nverify=crc32c\niodepth=1", f.display());
    let r = fio(d.path(), Some(&external()), &job, false);
    assert_clean(&r, 8 << 20, 8 << 20);
    assert_eq!(std::fs::metadata(&f).map(|m| m.len()).ok(), Some(8 << 20));
    assert!(r.text.contains("ugds: ") && r.text.contains("fallback path"), "no path line:\n{}", r.text);
    assert!(r.text.contains("iodepth 1 on the shared queues"), "{}", r.text);
}

#[test]
fn verify_md5_with_backlog_at_iodepth_32_through_the_batch_queue() {
    let d = tmp();
    let f = d.path().join("data");
    let job = format!(
        "filename={}\nsize=8M\nbs=4k\nrw=randwrite\nverify=md5\nverify_backlog=64\niodepth=32\niodepth_batch=8",
        f.display()
    );
    let r = fio(d.path(), Some(&external()), &job, false);
    assert!(r.ok, "{}", r.text);
    assert_eq!(r.error(), 0, "{}", r.text);
    assert_eq!(r.bytes("write"), 8 << 20, "{}", r.text);
    // verify_backlog checks as it goes: everything written is read back once.
    assert_eq!(r.bytes("read"), 8 << 20, "{}", r.text);
    assert!(r.text.contains("iodepth 32: a batch queue of this thread's own"), "{}", r.text);
}

#[test]
fn verify_pattern_through_ld_preload_as_ioengine_ugds() {
    let d = tmp();
    let f = d.path().join("data");
    let job = format!(
        "filename={}\nsize=8M\nbs=64k\nrw=write\nverify=pattern\nverify_pattern=0x5a17c3e1\niodepth=8",
        f.display()
    );
    let r = fio(d.path(), Some("ioengine=ugds"), &job, true);
    assert_clean(&r, 8 << 20, 8 << 20);
}

#[test]
fn verify_crc32c_with_backlog_in_two_threads_of_one_process() {
    let d = tmp();
    // Each thread its own file (fio names them job.N.0 in `directory`), one process.
    let job = format!(
        "directory={}\nsize=4M\nbs=16k\nrw=randwrite\nverify=crc32c\nverify_backlog=16\n\
         iodepth=4\nnumjobs=2\nthread=1\ngroup_reporting=1",
        d.path().display()
    );
    let r = fio(d.path(), Some(&external()), &job, false);
    assert_clean(&r, 8 << 20, 8 << 20);
    assert_eq!(r.text.matches("a batch queue of this thread's own").count(), 2, "{}", r.text);
}

#[test]
fn data_the_engine_wrote_verifies_under_fios_own_psync_engine() {
    let d = tmp();
    let f = d.path().join("data");
    let write = format!("filename={}\nsize=8M\nbs=8k\nrw=write\nverify=crc32c\ndo_verify=0\niodepth=16", f.display());
    let r = fio(d.path(), Some(&external()), &write, false);
    assert_clean(&r, 8 << 20, 0);
    let check = format!("filename={}\nsize=8M\nbs=8k\nrw=write\nverify=crc32c\nverify_only=1", f.display());
    let r = fio(d.path(), Some("ioengine=psync"), &check, false);
    // verify_only counts the writes it pretends to make.
    assert_clean(&r, 8 << 20, 8 << 20);
}

#[test]
fn verify_fails_on_data_the_engine_did_not_write() {
    let d = tmp();
    let f = d.path().join("data");
    // Written by fio's psync engine with another pattern: the engine reads it back faithfully,
    // so fio's verification must see the wrong bytes.
    let other = format!("filename={}\nsize=4M\nbs=4k\nrw=write\nverify=pattern\nverify_pattern=0x11", f.display());
    let r = fio(d.path(), Some("ioengine=psync"), &other, false);
    assert!(r.ok, "{}", r.text);
    for depth in [1, 16] {
        let check = format!(
            "filename={}\nsize=4M\nbs=4k\nrw=write\nverify=pattern\nverify_pattern=0x22\nverify_only=1\niodepth={depth}",
            f.display()
        );
        let r = fio(d.path(), Some(&external()), &check, false);
        assert!(!r.ok, "fio passed verification of data it did not write:\n{}", r.text);
        assert_eq!(r.error(), libc::EILSEQ as i64, "{}", r.text);
        assert!(r.text.contains("bad pattern block"), "{}", r.text);
    }
    // And a crc32c header on a file of zeroes.
    let z = d.path().join("zeroes");
    std::fs::File::create(&z).and_then(|f| f.set_len(4 << 20)).expect("zero file");
    let check = format!("filename={}\nsize=4M\nbs=4k\nrw=randwrite\nverify=crc32c\nverify_only=1", z.display());
    let r = fio(d.path(), Some(&external()), &check, false);
    assert!(!r.ok && r.error() == libc::EILSEQ as i64, "{}", r.text);
}

#[test]
fn a_missing_node_is_refused_by_name() {
    let d = tmp();
    let job = "filename=/dev/ugds_drv97\nsize=1M\nbs=4k\nrw=read";
    let r = fio(d.path(), Some(&external()), job, false);
    assert!(!r.ok, "{}", r.text);
    assert!(r.text.contains("ugds: /dev/ugds_drv97:"), "no named cause:\n{}", r.text);
    assert!(!d.path().join("ugds_drv97").exists());
    assert!(!Path::new("/dev/ugds_drv97").exists(), "the engine created a file in /dev");
}

#[test]
fn a_missing_file_without_a_size_is_refused_by_name() {
    let d = tmp();
    let job = format!("filename={}\nbs=4k\nrw=read", d.path().join("nothing").display());
    let r = fio(d.path(), Some(&external()), &job, false);
    assert!(!r.ok, "{}", r.text);
    assert!(r.text.contains("does not exist: give size="), "{}", r.text);
}

#[test]
fn an_owned_queue_on_a_file_is_refused_with_the_librarys_cause() {
    let d = tmp();
    let f = d.path().join("data");
    let job = format!("filename={}\nsize=1M\nbs=4k\nrw=read\nugds_queue=owned", f.display());
    let r = fio(d.path(), Some(&external()), &job, false);
    assert!(!r.ok, "{}", r.text);
    assert!(r.text.contains("ugds: ") && r.text.to_lowercase().contains("owned"), "{}", r.text);
}

#[test]
fn an_unknown_option_value_is_refused_by_fio() {
    let d = tmp();
    let f = d.path().join("data");
    let job = format!("filename={}\nsize=1M\nbs=4k\nrw=read\nugds_dptr=scatter", f.display());
    let r = fio(d.path(), Some(&external()), &job, false);
    assert!(!r.ok, "{}", r.text);
}

#[test]
fn a_range_past_the_end_fails_the_io_not_the_process() {
    let d = tmp();
    let f = d.path().join("data");
    std::fs::File::create(&f).and_then(|x| x.set_len(1 << 20)).expect("file");
    // An offset past the file's 1 MiB: fio itself clamps the job to the reported size, so ask
    // for a block size that is no multiple of the 512-byte sector: the library refuses it.
    let job = format!("filename={}\nsize=1M\nbs=1000\nrw=read", f.display());
    let r = fio(d.path(), Some(&external()), &job, false);
    assert!(!r.ok, "{}", r.text);
    assert_eq!(r.error(), libc::EINVAL as i64, "{}", r.text);
    assert!(r.text.contains("is not a multiple of the"), "{}", r.text);
}

#[test]
fn engine_options_are_listed_by_fio() {
    let out = Command::new(fio_bin())
        .arg(format!("--enghelp={}", engine().display()))
        .output()
        .expect("running fio --enghelp");
    let text = String::from_utf8_lossy(&out.stdout);
    for o in ["ugds_queue", "ugds_wait", "ugds_dptr", "ugds_nsid"] {
        assert!(text.contains(o), "{o} missing from:\n{text}");
    }
}

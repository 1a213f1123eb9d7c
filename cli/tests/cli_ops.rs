//! `ugds bind`, `unbind`, `access`, `list` and `status` refuse bad input by name, changing
//! nothing, on any machine (the VM suite, tests/src/ops.rs, runs them against controllers).

use std::process::Command;

fn ugds(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ugds")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn bind_and_unbind_need_targets_and_refuse_bad_configuration() {
    for cmd in ["bind", "unbind"] {
        let (ok, _, err) = ugds(&[cmd]);
        assert!(!ok && err.contains("name the controllers"), "{cmd}: {err}");
        let (ok, _, err) = ugds(&[cmd, "--config", "/nonexistent/bind.conf"]);
        assert!(!ok && err.contains("reading /nonexistent/bind.conf"), "{cmd}: {err}");
    }
    let conf = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bind-{}.conf", std::process::id()));
    std::fs::write(&conf, "0000:03:00.0\n/dev/nvme0\n").unwrap();
    let (ok, _, err) = ugds(&["bind", "--config", conf.to_str().unwrap()]);
    assert!(!ok && err.contains("line 2") && err.contains("neither a PCI address"), "{err}");
    let (ok, _, err) = ugds(&["bind", "--all", "nvme0"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    std::fs::remove_file(conf).unwrap();
}

#[test]
fn status_of_what_is_not_a_ugds_node_is_named() {
    let (ok, _, err) = ugds(&["status", "/dev/null"]);
    assert!(!ok && err.contains("/dev/null") && err.contains("not a ugds node"), "{err}");
    let (ok, _, err) = ugds(&["access", "/dev/null"]);
    assert!(!ok && err.contains("/dev/null"), "{err}");
}

#[test]
fn list_and_status_json_and_openmetrics_are_well_formed_anywhere() {
    let (ok, out, err) = ugds(&["list", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["controllers"].is_array(), "{out}");
    let (ok, out, err) = ugds(&["status", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["nodes"].is_array() && v["errors"].is_array(), "{out}");
    let (ok, out, _) = ugds(&["status", "--prometheus"]);
    assert!(ok && out.starts_with("# TYPE ugds_node_up gauge\n") && out.ends_with("# EOF\n"), "{out}");
}

use super::parse::parse;
use super::*;

#[test]
fn families_render_as_openmetrics_and_parse_back() {
    let mut g = Family::new("ugds_pinned_bytes", Kind::Gauge, "Pinned memory", Some("bytes"));
    g.sample(&[("node", "/dev/ugds_drv0"), ("comm", "a \"b\"\\c\nd")], 8192);
    g.sample(&[("node", "/dev/ugds_drv1"), ("comm", "")], 0);
    let mut c = Family::new("ugds_resets", Kind::Counter, "Resets", None);
    c.sample(&[("node", "/dev/ugds_drv0")], 3);
    let empty = Family::new("ugds_epoch", Kind::Gauge, "Epoch", None);
    let text = render(&[g, c, empty]);
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("# UNIT ugds_pinned_bytes bytes\n"), "{text}");
    let s = parse(&text).unwrap();
    assert_eq!(s.len(), 3);
    assert_eq!(s[0].labels["comm"], "a \"b\"\\c\nd");
    assert_eq!(s[0].value, 8192.0);
    assert_eq!((s[2].name.as_str(), s[2].family.as_str(), s[2].value), ("ugds_resets_total", "ugds_resets", 3.0));
}

#[test]
fn the_reader_refuses_what_a_scraper_would() {
    let ok = "# TYPE a gauge\na 1\n# EOF\n";
    assert!(parse(ok).is_ok());
    for bad in [
        "# TYPE a gauge\na 1\n",                                  // no EOF
        "# TYPE a counter\na 1\n# EOF\n",                         // counter without _total
        "b 1\n# EOF\n",                                           // no family
        "# TYPE a gauge\n# UNIT a bytes\na 1\n# EOF\n",           // unit not a suffix
        "# TYPE a gauge\na{x=\"1} 1\n# EOF\n",                    // unterminated label
        "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na 2\n# EOF\n", // split family
        "# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n# EOF\n",          // label twice
    ] {
        assert!(parse(bad).is_err(), "accepted {bad:?}");
    }
}

#[test]
fn writing_a_file_is_atomic_and_leaves_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ugds.prom");
    std::fs::write(&p, "old").unwrap();
    write_atomically(&p, "# EOF\n").unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "# EOF\n");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["ugds.prom"]);
    let err = write_atomically(&dir.path().join("missing/ugds.prom"), "x").unwrap_err().to_string();
    assert!(err.contains("missing/ugds.prom"), "{err}");
}

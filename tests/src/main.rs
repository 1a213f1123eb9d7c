#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
//! `ugds-vm-suite`: runs the VM tests of one variant, checks the kernel log after each, and
//! prints a result line that `cargo xtask test` reads.
//!
//! `--list-variants [FILTER]` prints `name|nvme spec;nvme spec|iommu|p2p topology or -` per variant (with FILTER,
//! only the variants that have a test whose name contains it).

use ugds_tests::{all_tests, kmsg, VARIANTS};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--list-variants") {
        // `--list-variants [FILTER]`: only variants with a test whose name contains FILTER.
        let filter = args.get(1);
        let tests = all_tests();
        for v in VARIANTS {
            if filter.is_some_and(|f| !tests.iter().any(|t| t.variant == v.name && t.name.contains(f.as_str()))) {
                continue;
            }
            println!("{}|{}|{}|{}", v.name, v.nvme.join(";"), v.iommu, v.p2p.unwrap_or("-"));
        }
        return;
    }
    if args.first().map(String::as_str) == Some("--bench-p2p") {
        let seconds = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
        if let Err(e) = ugds_tests::p2p_bench::main(seconds) {
            eprintln!("bench-p2p: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if args.first().map(String::as_str) == Some("--child") {
        if let Err(e) = ugds_tests::kmod::child_main(&args[1..]) {
            eprintln!("child: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    let mut variant = None;
    let mut filter = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--variant" => variant = it.next().cloned(),
            "--filter" => filter = it.next().cloned(),
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    let (mut passed, mut failed) = (0, 0);
    for t in all_tests() {
        if variant.as_deref().is_some_and(|v| v != t.variant) {
            continue;
        }
        if filter.as_deref().is_some_and(|f| !t.name.contains(f)) {
            continue;
        }
        let mut watch = match kmsg::KmsgWatch::new() {
            Ok(w) => w,
            Err(e) => {
                eprintln!("cannot read the kernel log: {e:#}");
                std::process::exit(2);
            }
        };
        let start = std::time::Instant::now();
        let result = (t.run)();
        let msgs = watch.new_messages();
        let bad = kmsg::bad_lines(&msgs);
        let secs = start.elapsed().as_secs_f64();
        match (&result, bad.is_empty()) {
            (Ok(()), true) => {
                passed += 1;
                println!("test {} ... ok ({secs:.1}s)", t.name);
            }
            _ => {
                failed += 1;
                println!("test {} ... FAILED ({secs:.1}s)", t.name);
                if let Err(e) = &result {
                    println!("    error: {e:#}");
                }
                if !bad.is_empty() {
                    println!("    kernel log:\n      {}", msgs.join("\n      "));
                }
            }
        }
    }
    println!("UGDS-SUITE passed={passed} failed={failed}");
}

//! `cargo xtask bench --p2p`: reads into another device's memory BAR against reads into host
//! memory through ugds, and against the kernel nvme driver's own peer-to-peer read (O_DIRECT into
//! another controller's CMB, published as p2pmem), side by side in one VM on Debian's 7.3 kernel
//! (vfio-pci's dma-buf export), all controllers and the stand-in GPU behind one PCIe switch; and
//! the cost of registering the BAR's dma-buf against host memory of the same size.

use crate::{kernel, kmod, p2p, suite, vm};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// Host side: build, boot one VM, write `p2p.json` and `p2p.md` into `out`.
pub fn run(seconds: u64, out: Option<PathBuf>) -> Result<()> {
    let out = out.unwrap_or_else(|| crate::toolchain::workspace_root().join("target/bench-p2p"));
    std::fs::create_dir_all(&out)?;
    let k = kernel::Choice::Debian73.ensure()?;
    let ko = kmod::build_for(&k)?;
    let suite = suite::build_suite()?;
    let xtask = std::env::current_exe()?;
    let nvme = ["size=256M,lbs=4096,serial=pbench0", "size=256M,lbs=4096,serial=pbench1", "size=64M,lbs=4096,cmb=64M"];
    let cfg = vm::VmConfig {
        nvme: nvme.iter().map(|s| s.parse()).collect::<Result<_>>()?,
        // vfio-pci needs the IOMMU; passthrough, so bus addresses through the switch reach the
        // BAR under QEMU (docs/p2p.md).
        iommu: true,
        bind_module: None,
        mem: "2G".into(),
        timeout: Duration::from_secs(1800),
        env: [
            ("UGDS_XTASK".to_string(), xtask.display().to_string()),
            ("UGDS_KMOD".to_string(), ko.display().to_string()),
        ]
        .into_iter()
        .chain(k.suite_env())
        .collect(),
        cmd: vec![suite.display().to_string(), "--bench-p2p".into(), seconds.to_string()],
        p2p: Some(p2p::P2p { topology: p2p::Topology::Switch, zen_cpu: false, passthrough: true }),
    };
    let host = super::host::HostRun::start();
    let o = vm::run(&cfg, &k, true)?;
    let host = host.finish();
    let line = o
        .output
        .lines()
        .find_map(|l| l.split_once("UGDS-P2P-BENCH ").map(|(_, j)| j.to_string()))
        .with_context(|| format!("the guest reported no result (exit {})", o.code))?;
    let mut v: serde_json::Value = serde_json::from_str(&line)?;
    v["host"] = host.json();
    std::fs::write(out.join("p2p.json"), serde_json::to_string_pretty(&v)?)?;
    let mut md = markdown(&v)?;
    md.push_str(&host.markdown());
    std::fs::write(out.join("p2p.md"), &md)?;
    print!("{md}");
    println!("wrote {}", out.display());
    host.warn();
    Ok(())
}

fn f(v: &serde_json::Value, path: &[&str]) -> Result<f64> {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64().with_context(|| format!("no {path:?} in the result"))
}

/// The result as a table of ratios (each against a baseline of the same run).
fn markdown(v: &serde_json::Value) -> Result<String> {
    let mut s = String::new();
    writeln!(
        s,
        "Reads at queue depth 1, {} s per point, one VM (TCG), set-up `{}`.",
        v["seconds"],
        v["topology"].as_str().unwrap_or("?")
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "| size | ugds into the BAR (IOPS) | ugds into host memory | kernel into p2pmem | kernel into host memory | BAR / kernel p2pmem | BAR / ugds host | ugds host / kernel host |"
    )?;
    writeln!(s, "| --- | --- | --- | --- | --- | --- | --- | --- |")?;
    for p in v["points"].as_array().context("no points")? {
        let size = p["size"].as_u64().unwrap_or(0);
        let [bar, host, kp2p, khost] =
            ["ugds_bar", "ugds_host", "kernel_p2pmem", "kernel_host"].map(|k| f(p, &[k, "iops"]).unwrap_or(f64::NAN));
        let label = if size >= 1 << 20 { format!("{} MiB", size >> 20) } else { format!("{} KiB", size >> 10) };
        writeln!(
            s,
            "| {label} | {bar:.0} | {host:.0} | {kp2p:.0} | {khost:.0} | {:.2}x | {:.2}x | {:.2}x |",
            bar / kp2p,
            bar / host,
            host / khost
        )?;
    }
    let r = &v["register_64m_us"];
    let (bar, host) = (f(r, &["bar_dmabuf"])?, f(r, &["host"])?);
    writeln!(s)?;
    writeln!(
        s,
        "Registering 64 MiB and deregistering it (median of 20): the BAR's dma-buf {bar:.0} us, host \
         memory (allocated and touched before) {host:.0} us; BAR / host {:.2}x.",
        bar / host
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "The kernel's peer-to-peer target is another controller's CMB (p2pmem: the kernel reads only \
         into memory with struct pages), ugds's the stand-in GPU's RAM-backed BAR. QEMU emulates the \
         two differently, so `BAR / kernel p2pmem` compares the drivers and the emulated target \
         memories together; `ugds host / kernel host` (the same memory) compares the drivers alone."
    )?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_gives_each_ratio_against_its_baseline() {
        let v = serde_json::json!({
            "seconds": 2, "topology": "switch+pt",
            "points": [{ "size": 1048576,
                "ugds_bar": { "iops": 300.0 }, "ugds_host": { "iops": 200.0 },
                "kernel_p2pmem": { "iops": 150.0 }, "kernel_host": { "iops": 100.0 } }],
            "register_64m_us": { "bar_dmabuf": 50.0, "host": 100.0 },
        });
        let md = super::markdown(&v).unwrap();
        assert!(md.contains("| 1 MiB | 300 | 200 | 150 | 100 | 2.00x | 1.50x | 2.00x |"), "{md}");
        assert!(md.contains("BAR / host 0.50x"), "{md}");
    }
}

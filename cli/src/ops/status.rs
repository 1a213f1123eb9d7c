//! `ugds status`: each ugds node's health (the status page's state word), counters and what
//! every process holding it open owns (LIST_OPENERS), as text, JSON or OpenMetrics.

use super::metrics::{self, Family, Kind};
use crate::Res;
use std::path::Path;
use ugds::device::Control;
use ugds::sysfs::Host;
use ugds::uapi::ioctl::{Opener, OPENER_EXCLUSIVE};

/// What one process holds on one node (its open files together).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Process {
    /// Process id.
    pub(crate) pid: u32,
    /// Its command name, where readable.
    pub(crate) comm: Option<String>,
    /// Open files of the node.
    pub(crate) files: u32,
    /// One of them holds the node exclusively.
    pub(crate) exclusive: bool,
    /// Queue pairs.
    pub(crate) qpairs: u64,
    /// Registrations.
    pub(crate) registrations: u64,
    /// Pinned host memory.
    pub(crate) pinned_bytes: u64,
    /// Mapped dma-buf memory.
    pub(crate) dmabuf_bytes: u64,
}

/// One node's health and counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NodeStatus {
    /// `/dev/ugds_drvN`.
    pub(crate) node: String,
    /// Its controller's PCI address.
    pub(crate) pci: Option<String>,
    /// Serial number.
    pub(crate) serial: String,
    /// Model number.
    pub(crate) model: String,
    /// Faulted (a reset is needed or in progress, or the controller is gone).
    pub(crate) faulted: bool,
    /// Reset epoch.
    pub(crate) epoch: u64,
    /// Completed resets.
    pub(crate) resets: u64,
    /// Timeouts (resets begun).
    pub(crate) timeouts: u64,
    /// Live queue pairs, every process together.
    pub(crate) qpairs: u64,
    /// Live registrations.
    pub(crate) registrations: u64,
    /// Pinned bytes, every registration together.
    pub(crate) pinned_bytes: u64,
    /// Per process, by pid.
    pub(crate) processes: Vec<Process>,
}

/// Groups open files by process, leaving out `me`'s one file that owns nothing (the handle
/// `ugds status` itself opened to ask).
pub(crate) fn by_process(openers: &[Opener], me: u32, comm: impl Fn(u32) -> Option<String>) -> Vec<Process> {
    let mut skipped = false;
    let mut out: Vec<Process> = Vec::new();
    for o in openers {
        if !skipped && o.tgid == me && o.qpairs == 0 && o.registrations == 0 {
            skipped = true;
            continue;
        }
        let i = match out.iter().position(|p| p.pid == o.tgid) {
            Some(i) => i,
            None => {
                out.push(Process { pid: o.tgid, comm: comm(o.tgid), ..Process::default() });
                out.len() - 1
            }
        };
        let p = &mut out[i];
        p.files += 1;
        p.exclusive |= o.flags & OPENER_EXCLUSIVE != 0;
        p.qpairs += u64::from(o.qpairs);
        p.registrations += u64::from(o.registrations);
        p.pinned_bytes += o.pinned_bytes;
        p.dmabuf_bytes += o.dmabuf_bytes;
    }
    out.sort_by_key(|p| p.pid);
    out
}

fn comm_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim().to_string())
}

/// Reads one node.
fn read_node(node: &str) -> Result<NodeStatus, ugds::Error> {
    let c = Control::open(node)?;
    let page = c.counters()?;
    let state = ugds::uapi::ioctl::ControllerState(page.state);
    Ok(NodeStatus {
        node: node.to_string(),
        pci: Host::system().resolve(node).ok(),
        serial: c.serial(),
        model: c.model(),
        faulted: state.faulted(),
        epoch: state.epoch(),
        resets: page.resets,
        timeouts: page.timeouts,
        qpairs: page.qpairs,
        registrations: page.registrations,
        pinned_bytes: page.pinned_pages * 4096,
        processes: by_process(&c.openers()?, std::process::id(), comm_of),
    })
}

/// The nodes to report: those named, or every ugds node of the machine.
fn nodes(named: &[String]) -> Res<Vec<String>> {
    if !named.is_empty() {
        return Ok(named.to_vec());
    }
    Ok(Host::system().controllers()?.into_iter().flat_map(|c| c.ugds_nodes).collect())
}

pub(crate) fn to_json(s: &NodeStatus) -> serde_json::Value {
    let procs: Vec<_> = s
        .processes
        .iter()
        .map(|p| {
            serde_json::json!({"pid": p.pid, "comm": p.comm, "files": p.files, "exclusive": p.exclusive,
                "qpairs": p.qpairs, "registrations": p.registrations, "pinned_bytes": p.pinned_bytes,
                "dmabuf_bytes": p.dmabuf_bytes})
        })
        .collect();
    serde_json::json!({
        "node": s.node, "pci": s.pci, "serial": s.serial, "model": s.model,
        "state": if s.faulted { "faulted" } else { "ok" }, "faulted": s.faulted, "epoch": s.epoch,
        "resets": s.resets, "timeouts": s.timeouts, "qpairs": s.qpairs, "registrations": s.registrations,
        "pinned_bytes": s.pinned_bytes, "processes": procs,
    })
}

fn to_text(s: &NodeStatus) -> String {
    let mut t = format!(
        "{} ({}, serial {}): {}, epoch {}, {} resets, {} timeouts; {} queue pairs, {} registrations, {} bytes pinned\n",
        s.node,
        s.pci.as_deref().unwrap_or("?"),
        s.serial,
        if s.faulted { "FAULTED" } else { "ok" },
        s.epoch,
        s.resets,
        s.timeouts,
        s.qpairs,
        s.registrations,
        s.pinned_bytes
    );
    for p in &s.processes {
        t.push_str(&format!(
            "    pid {} ({}): {} file(s){}, {} queue pairs, {} registrations, {} bytes pinned, {} bytes of dma-buf\n",
            p.pid,
            p.comm.as_deref().unwrap_or("?"),
            p.files,
            if p.exclusive { " exclusive" } else { "" },
            p.qpairs,
            p.registrations,
            p.pinned_bytes,
            p.dmabuf_bytes
        ));
    }
    t
}

/// A metric family: name, type, help, unit and how to read its value from a `T`.
type Metric<T> = (&'static str, Kind, &'static str, Option<&'static str>, fn(&T) -> u64);

/// The OpenMetrics exposition of `ok` nodes and `failed` ones (node, why).
pub(crate) fn exposition(ok: &[NodeStatus], failed: &[(String, String)]) -> String {
    let node_labels = |s: &NodeStatus| {
        vec![("node", s.node.clone()), ("pci", s.pci.clone().unwrap_or_default()), ("serial", s.serial.clone())]
    };
    let mut up = Family::new("ugds_node_up", Kind::Gauge, "1 when the node could be read, 0 when not", None);
    for s in ok {
        up.sample(&[("node", s.node.clone())], 1);
    }
    for (n, _) in failed {
        up.sample(&[("node", n.clone())], 0);
    }
    let per_node: [Metric<NodeStatus>; 7] = [
        (
            "ugds_faulted",
            Kind::Gauge,
            "1 while the controller is faulted (a reset is needed or in progress)",
            None,
            |s| u64::from(s.faulted),
        ),
        ("ugds_epoch", Kind::Gauge, "Reset epoch of the controller (bumped by every reset)", None, |s| s.epoch),
        ("ugds_resets", Kind::Counter, "Controller resets completed since the module bound it", None, |s| s.resets),
        ("ugds_timeouts", Kind::Counter, "Command timeouts that forced a reset since the module bound it", None, |s| {
            s.timeouts
        }),
        ("ugds_queue_pairs", Kind::Gauge, "Live I/O queue pairs, every process together", None, |s| s.qpairs),
        ("ugds_registrations", Kind::Gauge, "Live memory registrations, every process together", None, |s| {
            s.registrations
        }),
        ("ugds_pinned_bytes", Kind::Gauge, "Memory registered for DMA, every process together", Some("bytes"), |s| {
            s.pinned_bytes
        }),
    ];
    let mut fams = vec![up];
    for (name, kind, help, unit, get) in per_node {
        let mut f = Family::new(name, kind, help, unit);
        for s in ok {
            f.sample(&node_labels(s), get(s));
        }
        fams.push(f);
    }
    let per_proc: [Metric<Process>; 4] = [
        ("ugds_process_queue_pairs", Kind::Gauge, "I/O queue pairs a process created on the node", None, |p| p.qpairs),
        ("ugds_process_registrations", Kind::Gauge, "Memory registrations a process made on the node", None, |p| {
            p.registrations
        }),
        ("ugds_process_pinned_bytes", Kind::Gauge, "Host memory a process pinned for the node", Some("bytes"), |p| {
            p.pinned_bytes
        }),
        (
            "ugds_process_dmabuf_bytes",
            Kind::Gauge,
            "dma-buf memory a process mapped for the node",
            Some("bytes"),
            |p| p.dmabuf_bytes,
        ),
    ];
    for (name, kind, help, unit, get) in per_proc {
        let mut f = Family::new(name, kind, help, unit);
        for s in ok {
            for p in &s.processes {
                let labels = [
                    ("node", s.node.clone()),
                    ("pid", p.pid.to_string()),
                    ("comm", p.comm.clone().unwrap_or_default()),
                ];
                f.sample(&labels, get(p));
            }
        }
        fams.push(f);
    }
    metrics::render(&fams)
}

pub(super) fn run(named: &[String], json: bool, prometheus: bool, file: Option<&Path>) -> Res<()> {
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for n in nodes(named)? {
        match read_node(&n) {
            Ok(s) => ok.push(s),
            Err(e) => failed.push((n, e.to_string())),
        }
    }
    if let Some(path) = file {
        metrics::write_atomically(path, &exposition(&ok, &failed))?;
    }
    if prometheus {
        print!("{}", exposition(&ok, &failed));
    } else if json {
        let nodes: Vec<_> = ok.iter().map(to_json).collect();
        let errs: Vec<_> = failed.iter().map(|(n, e)| serde_json::json!({"node": n, "error": e})).collect();
        println!("{}", serde_json::json!({"nodes": nodes, "errors": errs}));
    } else if file.is_none() {
        if ok.is_empty() && failed.is_empty() {
            println!("no ugds nodes (bind a controller with `ugds bind`)");
        }
        for s in &ok {
            print!("{}", to_text(s));
        }
        for (n, e) in &failed {
            println!("{n}: not readable: {e}");
        }
    }
    // Named nodes that cannot be read are an error (after everything readable was reported).
    if !named.is_empty() && !failed.is_empty() {
        let why: Vec<String> = failed.iter().map(|(n, e)| format!("{n}: {e}")).collect();
        return Err(why.join("; ").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! Operating ugds like a storage tool: `ugds bind`/`unbind` (the library's `ugds::sysfs`, with
//! the refusals `cargo xtask bind` has), `ugds list` (every NVMe controller) and `ugds status`
//! (health, counters and per-process use of each ugds node, as text, JSON or OpenMetrics).

mod bind;
mod list;
pub(crate) mod metrics;
mod status;

use crate::Res;
use clap::Subcommand;

/// The operations subcommands.
#[derive(Subcommand)]
pub(crate) enum OpsCmd {
    /// Hand NVMe controllers to ugds (refused, changing nothing, while a namespace is mounted,
    /// used as swap, held by md or device mapper, or open).
    Bind {
        /// Controllers: PCI address, /dev/nvmeX, /dev/nvmeXnY, in stripe order (all or nothing).
        targets: Vec<String>,
        /// Every NVMe controller not in use (the others are named and left alone).
        #[arg(long, conflicts_with = "targets")]
        all: bool,
        /// Chunk size of the volume spec printed for several controllers.
        #[arg(long, value_parser = crate::size, default_value = "128K")]
        chunk: u64,
    },
    /// Give controllers back to the kernel nvme driver.
    Unbind {
        /// Controllers: PCI address, /dev/ugds_drvN, in order.
        targets: Vec<String>,
        /// Every controller bound to ugds.
        #[arg(long, conflicts_with = "targets")]
        all: bool,
        /// Chunk size of the `mdadm --build` line printed for several controllers.
        #[arg(long, value_parser = crate::size, default_value = "128K")]
        chunk: u64,
    },
    /// Every NVMe controller: driver, identity, nodes, namespaces and volume membership.
    List,
    /// Health, counters and per-process queue pairs and pinned memory of ugds nodes.
    Status {
        /// ugds nodes (default: every one).
        nodes: Vec<String>,
        /// OpenMetrics text instead (for Prometheus or node_exporter's textfile collector).
        #[arg(long)]
        prometheus: bool,
        /// Write the OpenMetrics text to this file, atomically (temporary file, then rename).
        #[arg(long)]
        prometheus_file: Option<std::path::PathBuf>,
    },
}

/// Runs one operations subcommand.
pub(crate) fn run(cmd: OpsCmd, json: bool) -> Res<()> {
    match cmd {
        OpsCmd::Bind { targets, all, chunk } => bind::bind(&targets, all, chunk, json),
        OpsCmd::Unbind { targets, all, chunk } => bind::unbind(&targets, all, chunk, json),
        OpsCmd::List => list::run(json),
        OpsCmd::Status { nodes, prometheus, prometheus_file } => {
            status::run(&nodes, json, prometheus, prometheus_file.as_deref())
        }
    }
}

//! Operating ugds like a storage tool: `ugds bind`/`unbind` (the library's `ugds::sysfs`, with
//! the refusals `cargo xtask bind` has), `ugds list` (every NVMe controller) and `ugds status`
//! (health, counters and per-process use of each ugds node, as text, JSON or OpenMetrics).

mod access;
mod bind;
mod config;
mod list;
pub(crate) mod metrics;
mod status;

use crate::Res;
use clap::{Args, Subcommand};

/// The controllers `bind` and `unbind` act on.
#[derive(Args)]
pub(crate) struct Controllers {
    /// Controllers: PCI address, /dev/nvmeX, /dev/nvmeXnY or /dev/ugds_drvN, in stripe order
    /// (bind: all or nothing, one in use refuses the list).
    targets: Vec<String>,
    /// bind: every controller not in use (the others are named and left alone); unbind: every
    /// one bound to ugds.
    #[arg(long, conflicts_with = "targets")]
    all: bool,
    /// The controllers listed in this file (default /etc/ugds/bind.conf); bind takes each free
    /// one, names the others, and gives the nodes to the file's `group`, if any.
    #[arg(long, num_args = 0..=1, default_missing_value = config::BIND_CONF, conflicts_with_all = ["targets", "all"])]
    config: Option<std::path::PathBuf>,
    /// Chunk size of the volume spec (bind) or `mdadm --build` line (unbind) printed for several.
    #[arg(long, value_parser = crate::size, default_value = "128K")]
    chunk: u64,
}

/// The operations subcommands.
#[derive(Subcommand)]
pub(crate) enum OpsCmd {
    /// Hand NVMe controllers to ugds (refused, changing nothing, while a namespace is mounted,
    /// used as swap, held by md or device mapper, or open).
    Bind(Controllers),
    /// Give controllers back to the kernel nvme driver.
    Unbind(Controllers),
    /// Give ugds nodes to the group /etc/ugds/bind.conf names (mode 0660), refused unless the
    /// IOMMU translates the controller's DMA; run by the udev rule for every new node.
    Access {
        /// ugds nodes (default: every one).
        nodes: Vec<String>,
        /// The configuration file.
        #[arg(long, default_value = config::BIND_CONF)]
        config: std::path::PathBuf,
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
        OpsCmd::Bind(Controllers { config: Some(c), .. }) => access::bind_config(&c, json),
        OpsCmd::Unbind(Controllers { config: Some(c), .. }) => access::unbind_config(&c, json),
        OpsCmd::Bind(Controllers { targets, all, chunk, config: None }) => bind::bind(&targets, all, chunk, json),
        OpsCmd::Unbind(Controllers { targets, all, chunk, config: None }) => bind::unbind(&targets, all, chunk, json),
        OpsCmd::Access { nodes, config } => access::access(&nodes, &config, json),
        OpsCmd::List => list::run(json),
        OpsCmd::Status { nodes, prometheus, prometheus_file } => {
            status::run(&nodes, json, prometheus, prometheus_file.as_deref())
        }
    }
}

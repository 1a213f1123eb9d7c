//! The backend's parameters (`agent.create_backend("UGDS", params)`): parsed once when NIXL
//! creates the engine; an unknown key or value is refused by name (the engine is not made).

use ugds::{DataPointers, DeviceOptions, Error};

/// How a transfer's descriptors run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueMode {
    /// A batch per target of the transfer: postXfer submits (one doorbell per target on the
    /// direct path, one `io_uring_enter` on the fallback path), checkXfer polls.
    Batch,
    /// Each descriptor a synchronous read or write in postXfer, which returns done.
    Sync,
}

/// The parameters and their defaults, as NIXL lists them (`get_plugin_params("UGDS")`).
pub const DEFAULTS: &[(&str, &str, &str)] = &[
    ("nsid", "1", "the namespace of a ugds node, or of each member of a striped volume"),
    (
        "queue",
        "batch",
        "batch: postXfer submits a batch per target, checkXfer polls; sync: postXfer runs each descriptor",
    ),
    ("depth", "128", "descriptors in flight per target and transfer (the rest follow as these finish)"),
    ("wait", "adaptive", "how waits for completions wait on a ugds node: adaptive, poll, interrupts"),
    ("dptr", "auto", "how commands describe memory on a ugds node: auto, prp, sgl"),
    ("gpu_staging", "1", "VRAM that peer-to-peer DMA cannot reach is staged through host memory (0: refused)"),
];

/// The engine's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Namespace of a node (or of each member of a volume).
    pub nsid: u32,
    /// Batch or synchronous.
    pub queue: QueueMode,
    /// Entries in flight per target and transfer.
    pub depth: usize,
    /// Controller options for nodes and volumes.
    pub device: DeviceOptions,
    /// `register_gpu`'s `allow_staging`.
    pub gpu_staging: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { nsid: 1, queue: QueueMode::Batch, depth: 128, device: DeviceOptions::default(), gpu_staging: true }
    }
}

fn flag(key: &'static str, v: &str) -> Result<bool, Error> {
    match v {
        "0" | "false" | "no" => Ok(false),
        "1" | "true" | "yes" => Ok(true),
        _ => Err(Error::invalid(key, format!("{v:?} is not 0 or 1"))),
    }
}

impl Settings {
    /// Parses NIXL's parameter map.
    pub fn parse<'a>(params: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Settings, Error> {
        let mut s = Settings::default();
        for (k, v) in params {
            let v = v.trim();
            match k {
                "nsid" => {
                    s.nsid = v
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| Error::invalid("nsid", format!("{v:?} is not a namespace id (1 or more)")))?
                }
                "queue" => {
                    s.queue = match v {
                        "batch" => QueueMode::Batch,
                        "sync" => QueueMode::Sync,
                        _ => return Err(Error::invalid("queue", format!("{v:?} is neither batch nor sync"))),
                    }
                }
                "depth" => {
                    s.depth = v
                        .parse()
                        .ok()
                        .filter(|&n| (1..=65536).contains(&n))
                        .ok_or_else(|| Error::invalid("depth", format!("{v:?} is not between 1 and 65536")))?
                }
                "wait" => s.device.waiting = v.parse().map_err(|e: String| Error::invalid("wait", e))?,
                "dptr" => {
                    s.device.data_pointers = match v {
                        "auto" => DataPointers::Auto,
                        "prp" => DataPointers::PrpOnly,
                        "sgl" => DataPointers::SglPreferred,
                        _ => return Err(Error::invalid("dptr", format!("{v:?} is none of auto, prp, sgl"))),
                    }
                }
                "gpu_staging" => s.gpu_staging = flag("gpu_staging", v)?,
                _ => {
                    let known: Vec<&str> = DEFAULTS.iter().map(|d| d.0).collect();
                    return Err(Error::invalid(
                        "params",
                        format!("{k:?} is no parameter of the UGDS backend (it has {})", known.join(", ")),
                    ));
                }
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_to_the_default_settings() {
        let s = Settings::parse(DEFAULTS.iter().map(|d| (d.0, d.1))).expect("defaults parse");
        let d = Settings::default();
        assert_eq!((s.nsid, s.queue, s.depth, s.gpu_staging), (d.nsid, d.queue, d.depth, d.gpu_staging));
        assert_eq!(s.device.waiting, d.device.waiting);
    }

    #[test]
    fn values_and_refusals() {
        let s = Settings::parse([("queue", "sync"), ("depth", "8"), ("wait", "interrupts"), ("dptr", "sgl")])
            .expect("valid");
        assert_eq!((s.queue, s.depth, s.device.waiting), (QueueMode::Sync, 8, ugds::Waiting::Interrupts));
        assert_eq!(s.device.data_pointers, DataPointers::SglPreferred);
        for bad in [("queue", "deep"), ("depth", "0"), ("nsid", "x"), ("dptr", "prps"), ("use_uring", "1")] {
            let e = Settings::parse([bad]).expect_err("refused");
            assert!(e.to_string().contains(bad.0) || e.to_string().contains(bad.1), "{e}");
        }
    }
}

//! `/etc/ugds/bind.conf`: the controllers `ugds bind --config` hands to ugds at boot (through
//! `ugds-bind.service`) and the optional group their nodes are given to.
//!
//! ```text
//! # One controller per line, by PCI address or by serial number (as `ugds list` shows it).
//! 0000:03:00.0
//! serial=S5GXNX0T123456
//! # Optional: the nodes' group (mode 0660); refused unless the IOMMU translates the DMA.
//! group=ugds
//! ```

use crate::Res;
use std::path::Path;
use ugds::sysfs::{is_pci_address, ControllerEntry};

/// Where the boot-time configuration lives.
pub(crate) const BIND_CONF: &str = "/etc/ugds/bind.conf";

/// A controller named in the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// By PCI address.
    Pci(String),
    /// By serial number.
    Serial(String),
}

/// What the configuration says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct BindConf {
    /// The controllers, in order.
    pub(crate) controllers: Vec<Entry>,
    /// The group for the nodes, if any.
    pub(crate) group: Option<String>,
}

/// Parses the configuration text; `name` is used in errors (`bind.conf line 3: ...`).
pub(crate) fn parse(name: &str, text: &str) -> Result<BindConf, String> {
    let mut c = BindConf::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: String| format!("{name} line {}: {why}", i + 1);
        let entry = match line.split_once('=') {
            Some((k, v)) => match (k.trim(), v.trim()) {
                ("serial", s) if !s.is_empty() && !s.contains(char::is_whitespace) => Entry::Serial(s.into()),
                ("group", g) if !g.is_empty() && !g.contains(|ch: char| ch.is_whitespace() || ch == ':') => {
                    if c.group.replace(g.into()).is_some() {
                        return Err(bad("a second group line".into()));
                    }
                    continue;
                }
                (k @ ("serial" | "group"), v) => return Err(bad(format!("{k}={v:?} is not a valid {k}"))),
                (k, _) => return Err(bad(format!("unknown key {k:?} (serial=, group=, or a PCI address)"))),
            },
            None if is_pci_address(line) => Entry::Pci(line.into()),
            None => return Err(bad(format!("{line:?} is neither a PCI address (dddd:bb:dd.f) nor serial=SERIAL"))),
        };
        if c.controllers.contains(&entry) {
            return Err(bad(format!("{line} is listed twice")));
        }
        c.controllers.push(entry);
    }
    Ok(c)
}

/// Reads and parses the configuration file.
pub(crate) fn load(path: &Path) -> Res<BindConf> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(parse(&path.display().to_string(), &text)?)
}

/// The PCI addresses of the configured controllers, found among `known` (serials as the nvme
/// driver or the module reports them). An entry that matches nothing is an error naming it.
pub(crate) fn addresses(conf: &BindConf, known: &[ControllerEntry]) -> Result<Vec<String>, String> {
    conf.controllers
        .iter()
        .map(|e| match e {
            Entry::Pci(a) if known.iter().any(|k| &k.addr == a) => Ok(a.clone()),
            Entry::Pci(a) => Err(format!("{a} is not an NVMe controller of this machine (see `ugds list`)")),
            Entry::Serial(s) => known
                .iter()
                .find(|k| k.serial.as_deref() == Some(s.as_str()))
                .map(|k| k.addr.clone())
                .ok_or_else(|| format!("no NVMe controller has serial {s} (see `ugds list`)")),
        })
        .collect()
}

/// The numeric id of group `name` (a name from `/etc/group`, or a number).
pub(crate) fn group_id(name: &str, etc_group: &str) -> Option<u32> {
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    etc_group.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 3 && f[0] == name).then(|| f[2].parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_group_and_comments() {
        let c = parse("bind.conf", "# boot\n0000:03:00.0\n  serial=S123  # the fast one\n\ngroup=ugds\n").unwrap();
        assert_eq!(c.controllers, [Entry::Pci("0000:03:00.0".into()), Entry::Serial("S123".into())]);
        assert_eq!(c.group.as_deref(), Some("ugds"));
        assert_eq!(parse("x", "").unwrap(), BindConf::default());
    }

    #[test]
    fn bad_lines_are_named_with_their_number() {
        for (text, want) in [
            ("0000:03:00.0\nnvme0\n", "x line 2: \"nvme0\" is neither"),
            ("serial=\n", "x line 1: serial=\"\" is not a valid serial"),
            ("group=a b\n", "x line 1: group=\"a b\" is not a valid group"),
            ("group=a\ngroup=b\n", "x line 2: a second group line"),
            ("mode=0666\n", "x line 1: unknown key \"mode\""),
            ("serial=A\nserial=A\n", "x line 2: serial=A is listed twice"),
        ] {
            let err = parse("x", text).unwrap_err();
            assert!(err.starts_with(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn serials_and_addresses_resolve_against_the_controllers() {
        let known = [
            ControllerEntry { addr: "0000:03:00.0".into(), serial: Some("AAA".into()), ..Default::default() },
            ControllerEntry { addr: "0000:04:00.0".into(), serial: Some("BBB".into()), ..Default::default() },
        ];
        let c = parse("x", "serial=BBB\n0000:03:00.0\n").unwrap();
        assert_eq!(addresses(&c, &known).unwrap(), ["0000:04:00.0", "0000:03:00.0"]);
        let c = parse("x", "serial=CCC\n").unwrap();
        assert!(addresses(&c, &known).unwrap_err().contains("no NVMe controller has serial CCC"));
        let c = parse("x", "0000:09:00.0\n").unwrap();
        assert!(addresses(&c, &known).unwrap_err().contains("0000:09:00.0 is not an NVMe controller"));
    }

    #[test]
    fn groups_by_name_or_number() {
        let g = "root:x:0:\nugds:x:990:alice,bob\n";
        assert_eq!(group_id("ugds", g), Some(990));
        assert_eq!(group_id("1234", g), Some(1234));
        assert_eq!(group_id("nobody", g), None);
    }
}

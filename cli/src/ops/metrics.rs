//! OpenMetrics text (the format Prometheus scrapes, and node_exporter's textfile collector
//! reads): metric families with `# TYPE`, `# UNIT` and `# HELP`, counters as `NAME_total`,
//! escaped label values, `# EOF` at the end; and writing it to a file atomically.

use std::io::Write;
use std::path::Path;

/// An OpenMetrics metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A count that only grows (sampled as `NAME_total`).
    Counter,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        }
    }
}

/// One metric family and its samples.
#[derive(Debug, Clone)]
pub(crate) struct Family {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    unit: Option<&'static str>,
    samples: Vec<String>,
}

/// A label value with `\`, `"` and newlines escaped.
pub(crate) fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Family {
    /// A family; a `unit` must be the name's last `_`-separated part (`..._bytes`).
    pub(crate) fn new(name: &'static str, kind: Kind, help: &'static str, unit: Option<&'static str>) -> Family {
        debug_assert!(unit.is_none_or(|u| name.ends_with(&format!("_{u}"))));
        Family { name, kind, help, unit, samples: Vec::new() }
    }

    /// Adds a sample with these labels.
    pub(crate) fn sample<S: AsRef<str>>(&mut self, labels: &[(&str, S)], value: u64) {
        let suffix = if self.kind == Kind::Counter { "_total" } else { "" };
        let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape_label(v.as_ref()))).collect();
        let labels = if l.is_empty() { String::new() } else { format!("{{{}}}", l.join(",")) };
        self.samples.push(format!("{}{suffix}{labels} {value}\n", self.name));
    }
}

/// The exposition of `fams`, ending with `# EOF`.
pub(crate) fn render(fams: &[Family]) -> String {
    let mut s = String::new();
    for f in fams {
        s.push_str(&format!("# TYPE {} {}\n", f.name, f.kind.name()));
        if let Some(u) = f.unit {
            s.push_str(&format!("# UNIT {} {u}\n", f.name));
        }
        s.push_str(&format!("# HELP {} {}\n", f.name, f.help.replace('\\', "\\\\").replace('\n', "\\n")));
        for x in &f.samples {
            s.push_str(x);
        }
    }
    s.push_str("# EOF\n");
    s
}

/// Writes `text` to `path` atomically: a temporary file in the same directory (named so that
/// node_exporter's textfile collector, which reads `*.prom`, never picks it up), flushed to disk,
/// then renamed over `path`. A reader sees the old file or the new one, never part of one.
pub(crate) fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", path.display())))?
        .to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let r = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r.map_err(|e| std::io::Error::new(e.kind(), format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
pub(crate) mod parse;
#[cfg(test)]
mod tests;

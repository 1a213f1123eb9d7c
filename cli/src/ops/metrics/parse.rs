//! A strict reader of OpenMetrics text, for the tests: it refuses what a scraper would.

use std::collections::{BTreeMap, HashMap};

/// One sample.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    /// Its name (`ugds_resets_total`).
    pub(crate) name: String,
    /// The family it belongs to (`ugds_resets`).
    pub(crate) family: String,
    /// Labels.
    pub(crate) labels: BTreeMap<String, String>,
    /// Value.
    pub(crate) value: f64,
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut it = s.chars().peekable();
    while it.peek().is_some() {
        let name: String = it.by_ref().take_while(|c| *c != '=').collect();
        if !valid_name(&name) || it.next() != Some('"') {
            return Err(format!("bad label {name:?} in {s:?}"));
        }
        let mut v = String::new();
        loop {
            match it.next() {
                Some('\\') => match it.next() {
                    Some('\\') => v.push('\\'),
                    Some('"') => v.push('"'),
                    Some('n') => v.push('\n'),
                    o => return Err(format!("bad escape {o:?} in {s:?}")),
                },
                Some('"') => break,
                Some('\n') | None => return Err(format!("unterminated label value in {s:?}")),
                Some(c) => v.push(c),
            }
        }
        if out.insert(name.clone(), v).is_some() {
            return Err(format!("label {name} twice in {s:?}"));
        }
        match it.next() {
            Some(',') | None => {}
            o => return Err(format!("expected , after a label, found {o:?} in {s:?}")),
        }
    }
    Ok(out)
}

/// Parses an exposition: families declared by `# TYPE` (gauge or counter) before their samples,
/// each family's descriptors and samples together, units as name suffixes, counters sampled as
/// `_total`, `# EOF` last.
pub(crate) fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let body = text.strip_suffix("# EOF\n").ok_or("no # EOF line at the end")?;
    let mut kinds: HashMap<String, String> = HashMap::new();
    let mut done: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    let mut out = Vec::new();
    let mut switch = |fam: &str, current: &mut Option<String>| -> Result<(), String> {
        if current.as_deref() != Some(fam) {
            if done.iter().any(|d| d == fam) {
                return Err(format!("family {fam} is split"));
            }
            if let Some(c) = current.take() {
                done.push(c);
            }
            *current = Some(fam.to_string());
        }
        Ok(())
    };
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut p = rest.splitn(3, ' ');
            let (what, fam, arg) = (p.next().unwrap_or(""), p.next().unwrap_or(""), p.next().unwrap_or(""));
            if !valid_name(fam) {
                return Err(format!("bad family name in {line:?}"));
            }
            switch(fam, &mut current)?;
            match what {
                "TYPE" => {
                    if !["gauge", "counter"].contains(&arg) || kinds.insert(fam.into(), arg.into()).is_some() {
                        return Err(format!("bad or repeated TYPE: {line:?}"));
                    }
                }
                "UNIT" => {
                    if !fam.ends_with(&format!("_{arg}")) {
                        return Err(format!("unit {arg} is not the suffix of {fam}"));
                    }
                }
                "HELP" => {}
                _ => return Err(format!("unknown descriptor {line:?}")),
            }
            continue;
        }
        let (head, value) = line.rsplit_once(' ').ok_or(format!("no value in {line:?}"))?;
        let value: f64 = value.parse().map_err(|_| format!("bad value in {line:?}"))?;
        let (name, labels) = match head.split_once('{') {
            Some((n, l)) => (n, labels(l.strip_suffix('}').ok_or(format!("unclosed labels in {line:?}"))?)?),
            None => (head, BTreeMap::new()),
        };
        let fam = match name.strip_suffix("_total") {
            Some(f) if kinds.get(f).is_some_and(|k| k == "counter") => f,
            _ if kinds.get(name).is_some_and(|k| k == "gauge") => name,
            _ => return Err(format!("sample {name} of no declared family (a counter needs _total)")),
        };
        if current.as_deref() != Some(fam) {
            return Err(format!("sample {name} away from its family's descriptors"));
        }
        out.push(Sample { name: name.into(), family: fam.into(), labels, value });
    }
    Ok(out)
}

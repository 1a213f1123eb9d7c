//! `cufile.json`, as cuFile reads it: the file `CUFILE_ENV_PATH_JSON` names, else
//! `/etc/cufile.json`; JSON with `//` and `/* */` comments (NVIDIA's own file has them) and
//! trailing commas tolerated. [`apply`] sets the keys that have a meaning here in a
//! [`Config`] and returns the ones it ignores; `docs/cufile-config.md` lists both and why.

use crate::config::{Config, SizeParam};
use serde_json::Value;
use std::path::PathBuf;

/// Why a configuration file was not used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It could not be read (other than not existing).
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// It is not JSON (after comments are removed), or not an object.
    #[error("{path} is not a cufile.json: {why}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong, with the line and column.
        why: String,
    },
}

/// The file cuFile reads: `$CUFILE_ENV_PATH_JSON` when set and not empty, else
/// `/etc/cufile.json`.
pub fn path_from(env: Option<std::ffi::OsString>) -> PathBuf {
    match env {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from("/etc/cufile.json"),
    }
}

/// [`path_from`] this process's environment.
pub fn path() -> PathBuf {
    path_from(std::env::var_os("CUFILE_ENV_PATH_JSON"))
}

/// The text without comments (`//` to the end of the line, `/* ... */`) and without commas
/// that close a list or object; strings are left as they are (`"a//b"` keeps its slashes).
pub fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    // Where the last comma outside a string went, while only blanks followed it.
    let mut comma: Option<usize> = None;
    while i < b.len() {
        match b[i] {
            b'"' => {
                comma = None;
                let start = i;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(b.len());
                out.extend_from_slice(&b[start..i]);
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    // Newlines stay, so a parse error's line number is the file's.
                    if b[i] == b'\n' {
                        out.push(b'\n');
                    }
                    i += 1;
                }
                i = (i + 2).min(b.len());
                continue;
            }
            b',' => comma = Some(out.len()),
            b'}' | b']' => {
                if let Some(at) = comma.take() {
                    out[at] = b' ';
                }
            }
            c if c.is_ascii_whitespace() => {}
            _ => comma = None,
        }
        out.push(b[i]);
        i += 1;
    }
    // Only whole strings, comments and ASCII punctuation were cut: still UTF-8.
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses a cufile.json's text (`path` names it in errors).
pub fn parse(text: &str, path: &str) -> Result<Value, FileError> {
    let v: Value = serde_json::from_str(&strip(text))
        .map_err(|e| FileError::Parse { path: path.to_string(), why: e.to_string() })?;
    if !v.is_object() {
        return Err(FileError::Parse { path: path.to_string(), why: "the top level is not an object".into() });
    }
    Ok(v)
}

/// Reads and parses the file at `path`; `Ok(None)` when there is none.
pub fn read(path: &std::path::Path) -> Result<Option<Value>, FileError> {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, &name).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FileError::Read { path: name, source: e }),
    }
}

/// What [`apply`] did not use.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unused {
    /// Keys this library does not know or has nothing to do with (`section.key`).
    pub ignored: Vec<String>,
    /// Keys it knows whose value was of the wrong type or out of range (the value stays as it
    /// was), with why.
    pub refused: Vec<(String, String)>,
}

/// A boolean key's field.
fn bool_key<'a>(c: &'a mut Config, key: &str) -> Option<&'a mut bool> {
    Some(match key {
        "properties.use_poll_mode" => &mut c.use_poll_mode,
        "properties.allow_compat_mode" => &mut c.allow_compat_mode,
        "properties.force_compat_mode" => &mut c.force_compat_mode,
        "properties.use_pci_p2pdma" => &mut c.use_pcip2pdma,
        "execution.parallel_io" => &mut c.parallel_io,
        "profile.nvtx" => &mut c.profile_nvtx,
        _ => return None,
    })
}

/// A size key's parameter (its range is the parameter's).
fn size_key(key: &str) -> Option<SizeParam> {
    Some(match key {
        "profile.cufile_stats" => SizeParam::ProfileStats,
        "execution.max_io_queue_depth" => SizeParam::MaxIoQueueDepth,
        "execution.max_io_threads" => SizeParam::MaxIoThreads,
        "execution.min_io_threshold_size_kb" => SizeParam::MinIoThresholdSizeKb,
        "execution.max_request_parallelism" => SizeParam::MaxRequestParallelism,
        "properties.max_direct_io_size_kb" => SizeParam::MaxDirectIoSizeKb,
        "properties.max_device_cache_size_kb" => SizeParam::MaxDeviceCacheSizeKb,
        "properties.per_buffer_cache_size_kb" => SizeParam::PerBufferCacheSizeKb,
        "properties.max_device_pinned_mem_size_kb" => SizeParam::MaxDevicePinnedMemSizeKb,
        "properties.io_batchsize" => SizeParam::IoBatchSize,
        "properties.poll_mode_max_size_kb" => SizeParam::PollThresholdSizeKb,
        "properties.batch_io_timeout_msecs" => SizeParam::BatchIoTimeoutMs,
        _ => return None,
    })
}

/// The string keys: logging level and directory.
fn string_key(key: &str) -> Option<usize> {
    match key {
        "logging.level" => Some(0),
        "logging.dir" => Some(2),
        _ => None,
    }
}

/// Where one key's value went.
pub(crate) enum Setting {
    /// A configuration field (boolean or size).
    Config,
    /// The statistics level.
    Stats(u32),
    /// A string parameter (`CUFileStringConfigParameter_t` number) and its value.
    String(usize, String),
    /// The POSIX pool's slab sizes (true) or counts (false).
    Slabs(bool, Vec<usize>),
}

/// Applies one `section.key`.
fn apply_key(c: &mut Config, key: &str, v: &Value) -> Result<Option<Setting>, String> {
    if let Some(field) = bool_key(c, key) {
        *field = v.as_bool().ok_or("not true or false")?;
        return Ok(Some(Setting::Config));
    }
    if let Some(p) = size_key(key) {
        let n = v.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or("not a whole number")?;
        let (min, max) = p.range();
        if !(min..=max).contains(&n) {
            return Err(format!("{n} is outside {min}..={max}"));
        }
        if p == SizeParam::ProfileStats {
            // CAST: range-checked to 0..=3.
            return Ok(Some(Setting::Stats(n as u32)));
        }
        p.set(c, n);
        return Ok(Some(Setting::Config));
    }
    if let Some(i) = string_key(key) {
        let s = v.as_str().ok_or("not a string")?;
        return Ok(Some(Setting::String(i, s.to_string())));
    }
    if let Some(sizes) = match key {
        "properties.posix_pool_slab_size_kb" => Some(true),
        "properties.posix_pool_slab_count" => Some(false),
        _ => None,
    } {
        let list = v.as_array().ok_or("not a list")?;
        let n: Option<Vec<usize>> =
            list.iter().map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()).filter(|&n| n > 0)).collect();
        return Ok(Some(Setting::Slabs(sizes, n.ok_or("not a list of positive numbers")?)));
    }
    Ok(None)
}

/// Applies `v` (a parsed cufile.json) to `c`; the settings kept outside [`Config`] (statistics
/// level, strings, slabs) are returned for the caller to store. Unknown keys and bad values
/// are reported in [`Unused`], never an error: cuFile's own file carries sections this library
/// has no use for.
pub(crate) fn apply(v: &Value, c: &mut Config) -> (Vec<Setting>, Unused) {
    let mut out = Vec::new();
    let mut unused = Unused::default();
    let Some(top) = v.as_object() else { return (out, unused) };
    for (section, inner) in top {
        let Some(inner) = inner.as_object() else {
            unused.ignored.push(section.clone());
            continue;
        };
        for (k, val) in inner {
            let key = format!("{section}.{k}");
            match apply_key(c, &key, val) {
                Ok(Some(s)) => out.push(s),
                Ok(None) => unused.ignored.push(key),
                Err(why) => unused.refused.push((key, why)),
            }
        }
    }
    (out, unused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_trailing_commas_go_strings_stay() {
        let text = "{\n // a comment\n \"a\": \"x//y/*z*/\", /* block\n over lines */ \"b\": [1, 2,],\n \"c\": {\"d\": \"q\\\"//\",},\n}\n";
        let v = parse(text, "t").unwrap();
        assert_eq!(v["a"], "x//y/*z*/");
        assert_eq!(v["b"], serde_json::json!([1, 2]));
        assert_eq!(v["c"]["d"], "q\"//");
        // Line numbers survive a block comment.
        let e = parse("{\n/* one\ntwo */\n\"a\": nope}", "f.json").unwrap_err().to_string();
        assert!(e.contains("f.json") && e.contains("line 4"), "{e}");
        assert!(parse("[1]", "t").is_err());
    }

    #[test]
    fn the_environment_names_the_file() {
        assert_eq!(path_from(Some("/tmp/my.json".into())), PathBuf::from("/tmp/my.json"));
        assert_eq!(path_from(Some("".into())), PathBuf::from("/etc/cufile.json"));
        assert_eq!(path_from(None), PathBuf::from("/etc/cufile.json"));
        let missing = std::env::temp_dir().join(format!("ugds-no-such-cufile-{}.json", std::process::id()));
        assert!(read(&missing).unwrap().is_none());
    }

    /// NVIDIA's shipped file's shape: sections this library has no use for are listed, the
    /// keys it knows are set, bad values are refused by name and leave the default.
    #[test]
    fn known_keys_are_set_and_the_rest_listed() {
        let text = r#"{
            // logging
            "logging": { "dir": "/var/log/gds", "level": "INFO" },
            "profile": { "nvtx": true, "cufile_stats": 2 },
            "execution": { "max_io_queue_depth": 64, "max_io_threads": 2, "parallel_io": false },
            "properties": {
                "max_direct_io_size_kb": 1024,
                "use_poll_mode": false,
                "poll_mode_max_size_kb": 8,
                "allow_compat_mode": false,
                "io_batchsize": 32,
                "batch_io_timeout_msecs": 500,
                "posix_pool_slab_size_kb": [4, 1024],
                "posix_pool_slab_count": [128, 64],
                "rdma_dev_addr_list": [],
                "max_device_cache_size_kb": 99999999999999,
                "per_buffer_cache_size_kb": "big",
            },
            "fs": { "generic": { "posix_unaligned_writes": false } },
            "denylist": { "drivers": [] },
            "CUFILE_ENV_EXPERIMENTAL": 1,
        }"#;
        let mut c = Config::default();
        let (set, unused) = apply(&parse(text, "t").unwrap(), &mut c);
        assert_eq!(c.max_direct_io_size_kb, 1024);
        assert!(!c.use_poll_mode && !c.allow_compat_mode && !c.parallel_io && c.profile_nvtx);
        assert_eq!((c.poll_thresh_size_kb, c.max_batch_io_size, c.batch_io_timeout_ms), (8, 32, 500));
        assert_eq!((c.max_io_queue_depth, c.max_io_threads), (64, 2));
        assert_eq!(c.max_device_cache_size_kb, Config::default().max_device_cache_size_kb);
        assert!(set.iter().any(|s| matches!(s, Setting::Stats(2))));
        assert!(set.iter().any(|s| matches!(s, Setting::String(0, l) if l == "INFO")));
        assert!(set.iter().any(|s| matches!(s, Setting::Slabs(true, v) if v == &[4, 1024])));
        // (In key order: serde_json's maps are sorted.)
        assert_eq!(
            unused.ignored,
            ["CUFILE_ENV_EXPERIMENTAL", "denylist.drivers", "fs.generic", "properties.rdma_dev_addr_list"]
        );
        let refused: Vec<&str> = unused.refused.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(refused, ["properties.max_device_cache_size_kb", "properties.per_buffer_cache_size_kb"]);
    }
}

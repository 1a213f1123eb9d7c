//! `nvmeof://TRANSPORT/HOST[:PORT]/SUBSYSNQN?nsid=N[&hostnqn=NQN][&hostid=UUID][&timeout_ms=MS]`:
//! an explicit NVMe over Fabrics target; TRANSPORT is `tcp` or `rdma`. HOST is a name, an IPv4 address or a bracketed IPv6
//! address; PORT defaults to 4420; values may be percent-encoded.

use crate::error::{Error, Result};
use ugds_uapi::tcp::NQN_FIELD_LEN;

/// The URI scheme.
pub const SCHEME: &str = "nvmeof://";
/// The NVMe over Fabrics I/O controller port (IANA; TCP port or RDMA CM service ID).
pub const DEFAULT_PORT: u16 = 4420;
/// Connect timeout, and the limit on any one reply, unless the URI says otherwise.
pub const DEFAULT_TIMEOUT_MS: u64 = 5000;

/// An NVMe over Fabrics transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// NVMe/TCP.
    Tcp,
    /// NVMe/RDMA (RoCE, InfiniBand, iWARP), through rdma-core.
    Rdma,
}

impl Transport {
    /// The transport's name in URIs and the kernel's sysfs (`tcp`, `rdma`).
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }

    /// `tcp` or `rdma`; anything else is `None`.
    pub fn from_name(s: &str) -> Option<Transport> {
        match s {
            "tcp" => Some(Transport::Tcp),
            "rdma" => Some(Transport::Rdma),
            _ => None,
        }
    }
}

/// A parsed target address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpec {
    /// The transport.
    pub transport: Transport,
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port, or the RDMA CM port (service ID).
    pub port: u16,
    /// Subsystem NQN.
    pub subsysnqn: String,
    /// Namespace ID.
    pub nsid: u32,
    /// Host NQN (ours), or the default (see [`RemoteSpec::host_nqn`]).
    pub hostnqn: Option<String>,
    /// Host identifier, or one derived from the host NQN.
    pub hostid: Option<[u8; 16]>,
    /// Connect timeout and the limit on each wait for the target.
    pub timeout_ms: u64,
}

fn bad(reason: impl Into<String>) -> Error {
    Error::invalid("uri", reason)
}

/// Decodes `%XX` escapes.
fn unescape(s: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(|| bad(format!("truncated escape in {s:?}")))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad(format!("bad escape %{hex} in {s:?}")))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad(format!("{s:?} is not UTF-8 once unescaped")))
}

/// Parses a UUID (`8-4-4-4-12` hex digits; dashes optional).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|&c| c != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        id[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(id)
}

/// Checks an NQN: printable ASCII, fits the Connect data's field with its NUL.
fn check_nqn(what: &str, nqn: &str) -> Result<()> {
    if nqn.is_empty() || nqn.len() >= NQN_FIELD_LEN || !nqn.bytes().all(|c| c.is_ascii_graphic()) {
        return Err(bad(format!("the {what} {nqn:?} must be 1..={} printable ASCII characters", NQN_FIELD_LEN - 1)));
    }
    Ok(())
}

impl RemoteSpec {
    /// Parses an `nvmeof://` URI.
    pub fn parse(uri: &str) -> Result<RemoteSpec> {
        let rest = uri.strip_prefix(SCHEME).ok_or_else(|| bad(format!("{uri:?} does not start with {SCHEME}")))?;
        let (transport, rest) = rest.split_once('/').ok_or_else(|| bad("expected nvmeof://tcp/HOST:PORT/NQN"))?;
        let transport = Transport::from_name(transport).ok_or_else(|| Error::Unsupported {
            what: "this NVMe over Fabrics transport",
            why: format!("{transport:?} is not implemented (tcp and rdma are)"),
            fix: "give an nvmeof://tcp/HOST:PORT/NQN or nvmeof://rdma/HOST:PORT/NQN target",
        })?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (addr, nqn) = path.split_once('/').ok_or_else(|| bad("missing the subsystem NQN after HOST:PORT/"))?;
        let (host, port) = if let Some(v6) = addr.strip_prefix('[') {
            let (h, p) = v6.split_once(']').ok_or_else(|| bad(format!("unclosed [ in {addr:?}")))?;
            (h, p.strip_prefix(':'))
        } else {
            match addr.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (addr, None),
            }
        };
        if host.is_empty() {
            return Err(bad("missing the target's host"));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| bad(format!("bad port {p:?}")))?,
        };
        let subsysnqn = unescape(nqn)?;
        check_nqn("subsystem NQN", &subsysnqn)?;
        let mut spec = RemoteSpec {
            transport,
            host: host.to_string(),
            port,
            subsysnqn,
            nsid: 0,
            hostnqn: None,
            hostid: None,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        };
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| bad(format!("{kv:?} is not key=value")))?;
            let v = unescape(v)?;
            match k {
                "nsid" => {
                    spec.nsid = v
                        .parse()
                        .ok()
                        .filter(|&n| n != 0 && n != u32::MAX)
                        .ok_or_else(|| bad(format!("bad nsid {v:?}")))?
                }
                "hostnqn" => {
                    check_nqn("host NQN", &v)?;
                    spec.hostnqn = Some(v);
                }
                "hostid" => spec.hostid = Some(parse_uuid(&v).ok_or_else(|| bad(format!("bad hostid {v:?}")))?),
                "timeout_ms" => {
                    spec.timeout_ms =
                        v.parse().ok().filter(|&t| t > 0).ok_or_else(|| bad(format!("bad timeout_ms {v:?}")))?
                }
                _ => return Err(bad(format!("unknown parameter {k:?} (nsid, hostnqn, hostid, timeout_ms)"))),
            }
        }
        if spec.nsid == 0 {
            return Err(bad("missing ?nsid=N (the namespace to open)"));
        }
        Ok(spec)
    }

    /// The host NQN: the URI's, else this machine's `/etc/nvme/hostnqn` (what the kernel's
    /// initiator and nvme-cli use), else one made from the host identifier.
    pub fn host_nqn(&self) -> String {
        if let Some(n) = &self.hostnqn {
            return n.clone();
        }
        if let Ok(s) = std::fs::read_to_string("/etc/nvme/hostnqn") {
            let s = s.trim();
            if check_nqn("host NQN", s).is_ok() {
                return s.to_string();
            }
        }
        format!("nqn.2014-08.org.nvmexpress:uuid:{}", format_uuid(&self.host_id_for(None)))
    }

    /// The host identifier: the URI's, else `/etc/nvme/hostid`, else derived from `nqn` (or a
    /// fixed one), so that one host NQN always goes with one host identifier.
    pub fn host_id_for(&self, nqn: Option<&str>) -> [u8; 16] {
        if let Some(id) = self.hostid {
            return id;
        }
        if let Some(id) = std::fs::read_to_string("/etc/nvme/hostid").ok().and_then(|s| parse_uuid(s.trim())) {
            return id;
        }
        // FNV-1a, twice with different seeds: stable across runs, no dependency.
        let fnv = |seed: u64| {
            nqn.unwrap_or("ugds").bytes().fold(seed, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
        };
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&fnv(0xcbf2_9ce4_8422_2325).to_le_bytes());
        id[8..].copy_from_slice(&fnv(0x6c62_272e_07bb_0142).to_le_bytes());
        // A version 4, variant 1 UUID.
        id[6] = (id[6] & 0x0F) | 0x40;
        id[8] = (id[8] & 0x3F) | 0x80;
        id
    }

    /// `HOST:PORT` (IPv6 bracketed), as the socket layer and messages want it.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// A UUID in its usual text form.
pub fn format_uuid(id: &[u8; 16]) -> String {
    let h: Vec<String> = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", h[..4].concat(), h[4..6].concat(), h[6..8].concat(), h[8..10].concat(), h[10..].concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_uri() {
        let s = RemoteSpec::parse(
            "nvmeof://tcp/10.0.0.2:4421/nqn.2024-01.io.ugds:test?nsid=3&hostnqn=nqn.2014-08.org.nvmexpress:uuid:x&timeout_ms=250",
        )
        .unwrap();
        assert_eq!(s.host, "10.0.0.2");
        assert_eq!(s.port, 4421);
        assert_eq!(s.subsysnqn, "nqn.2024-01.io.ugds:test");
        assert_eq!(s.nsid, 3);
        assert_eq!(s.host_nqn(), "nqn.2014-08.org.nvmexpress:uuid:x");
        assert_eq!(s.timeout_ms, 250);
        assert_eq!(s.address(), "10.0.0.2:4421");
    }

    #[test]
    fn defaults_port_and_takes_ipv6_and_escapes() {
        let s = RemoteSpec::parse("nvmeof://tcp/[::1]/nqn.a%3Ab?nsid=1").unwrap();
        assert_eq!((s.host.as_str(), s.port, s.subsysnqn.as_str()), ("::1", DEFAULT_PORT, "nqn.a:b"));
        assert_eq!(s.address(), "[::1]:4420");
        let s = RemoteSpec::parse("nvmeof://tcp/target/nqn.x?nsid=1&hostid=0123456789abcdef0123456789ABCDEF").unwrap();
        assert_eq!(s.hostid.unwrap()[15], 0xEF);
        assert_eq!(format_uuid(&s.hostid.unwrap()), "01234567-89ab-cdef-0123-456789abcdef");
    }

    #[test]
    fn refuses_bad_uris_by_name() {
        for u in [
            "nvmeof://tcp/h:4420/nqn.x",
            "nvmeof://tcp/h:0/nqn.x?nsid=1",
            "nvmeof://tcp/h:99999/nqn.x?nsid=1",
            "nvmeof://tcp/:4420/nqn.x?nsid=1",
            "nvmeof://tcp/h:4420?nsid=1",
            "nvmeof://tcp/h:4420/?nsid=1",
            "nvmeof://tcp/h/nqn.x?nsid=0",
            "nvmeof://tcp/h/nqn.x?nsid=1&bogus=2",
            "nvmeof://tcp/h/nqn%zz?nsid=1",
            "nvmeof://tcp/h/nqn%2?nsid=1",
            "nvmeof://tcp/[::1/nqn.x?nsid=1",
            "nvmeof://tcp/h/nqn.x?nsid=1&hostid=xyz",
            "nvmeof://tcp/h/nqn with space?nsid=1",
            "nvmeof:/tcp/h/nqn.x?nsid=1",
        ] {
            assert!(matches!(RemoteSpec::parse(u), Err(Error::InvalidArgument { arg: "uri", .. })), "{u}");
        }
        let long = format!("nvmeof://tcp/h/{}?nsid=1", "n".repeat(256));
        assert!(RemoteSpec::parse(&long).is_err());
        assert!(matches!(RemoteSpec::parse("nvmeof://fc/h/nqn.x?nsid=1"), Err(Error::Unsupported { .. })));
        let r = RemoteSpec::parse("nvmeof://rdma/10.0.0.2/nqn.x?nsid=1").unwrap();
        assert_eq!((r.transport, r.port, r.address().as_str()), (Transport::Rdma, DEFAULT_PORT, "10.0.0.2:4420"));
        assert_eq!(RemoteSpec::parse("nvmeof://tcp/h/nqn.x?nsid=1").unwrap().transport, Transport::Tcp);
    }

    #[test]
    fn derived_host_id_is_stable_uuid_v4() {
        let s = RemoteSpec::parse("nvmeof://tcp/h/nqn.x?nsid=1").unwrap();
        let spec = RemoteSpec { hostid: None, ..s };
        if std::path::Path::new("/etc/nvme/hostid").exists() {
            return;
        }
        let a = spec.host_id_for(Some("nqn.a"));
        assert_eq!(a, spec.host_id_for(Some("nqn.a")));
        assert_ne!(a, spec.host_id_for(Some("nqn.b")));
        assert_eq!(a[6] >> 4, 4);
    }
}

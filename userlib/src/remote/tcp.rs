//! One NVMe/TCP connection (one queue): the socket, connection setup (ICReq/ICResp), and PDUs
//! read and checked one at a time. Blocking I/O with a bounded wait on every read and write:
//! a target that stops answering gives [`Error::RemoteTransport`], one that answers nonsense
//! [`Error::RemoteProtocol`]; either way the connection is closed and never used again.
//!
//! Digests are not offered (the ICReq asks for none), so a PDU that carries one is refused.

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;
use ugds_uapi::tcp::{fes, flags, pdu_type, DataPdu, IcPdu, PduHeader, RespPdu, TermPdu, IC_LEN};
use ugds_uapi::Cqe;
use zerocopy::{FromBytes, IntoBytes};

/// Header length of response capsules, data PDUs, R2Ts and terminate requests.
pub(crate) const SHORT_HLEN: u8 = 24;
/// Longest terminate request (header and error data).
const MAX_TERM_PLEN: u32 = 152;
/// The smallest MAXH2CDATA the transport allows.
const MIN_MAXH2CDATA: u32 = 4096;

/// A PDU from the controller, header checked; a C2HData's data is still in the socket.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pdu {
    /// A response capsule.
    Resp(Cqe),
    /// Controller to host data: `hdr.length()` bytes follow (read them with
    /// [`Conn::read_data`]).
    C2h(DataPdu),
    /// Ready to transfer.
    R2t(DataPdu),
}

/// The byte stream a connection runs on: a TCP socket, or a scripted target in the harnesses
/// (`remote::harness`, the fuzz targets).
pub(crate) trait ByteStream: Read + Write + Send + std::fmt::Debug {
    /// Closes both directions (best effort): the peer sees the connection end.
    fn close(&self);
}

impl ByteStream for TcpStream {
    fn close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

/// An open, initialised connection.
#[derive(Debug)]
pub(crate) struct Conn {
    sock: Box<dyn ByteStream>,
    /// `HOST:PORT`, for messages.
    pub(crate) target: String,
    /// Data in H2C PDUs and capsules starts at a multiple of this (CPDA).
    pub(crate) data_align: usize,
    /// The most data one H2CData PDU may carry (MAXH2CDATA).
    pub(crate) max_h2c: usize,
    broken: bool,
}

impl Conn {
    /// Connects to `target` (`HOST:PORT`) within `timeout` and exchanges ICReq/ICResp.
    /// `timeout` also bounds every later read and write.
    pub(crate) fn connect(target: &str, timeout: Duration) -> Result<Conn> {
        let unreachable = |source| Error::RemoteUnreachable { target: target.to_string(), source };
        let addrs: Vec<_> = target.to_socket_addrs().map_err(unreachable)?.collect();
        let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the name resolved to no address");
        let mut sock = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let sock = sock.ok_or_else(|| unreachable(last))?;
        let setup = |s: &TcpStream| -> std::io::Result<()> {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))
        };
        setup(&sock).map_err(unreachable)?;
        Self::over(Box::new(sock), target)
    }

    /// Exchanges ICReq/ICResp over `sock`, a connected stream to `target` (`HOST:PORT`, for
    /// messages); the stream bounds its own reads and writes.
    pub(crate) fn over(sock: Box<dyn ByteStream>, target: &str) -> Result<Conn> {
        let mut c = Conn { sock, target: target.to_string(), data_align: 4, max_h2c: 0, broken: false };
        c.initialise()?;
        Ok(c)
    }

    /// ICReq (PFV 1.0, no digests, HPDA 0, one R2T at a time) and the ICResp's checks.
    fn initialise(&mut self) -> Result<()> {
        let req = IcPdu::new(pdu_type::IC_REQ, 0, 0, 0);
        self.send(&[req.as_bytes()], "ICReq")?;
        let mut b = [0u8; IC_LEN as usize];
        self.read_exact(&mut b[..8], "ICResp")?;
        let hdr = read_header(&b[..8]);
        if hdr.pdu_type() == pdu_type::C2H_TERM_REQ {
            return Err(self.term_req(hdr));
        }
        if hdr.pdu_type() != pdu_type::IC_RESP || hdr.hlen() != IC_LEN || hdr.plen() != u32::from(IC_LEN) {
            return Err(self.protocol(format!(
                "expected an ICResp (type 1, 128 bytes), got type {:#x} hlen {} plen {}",
                hdr.pdu_type(),
                hdr.hlen(),
                hdr.plen()
            )));
        }
        self.read_exact(&mut b[8..], "ICResp")?;
        let resp = IcPdu::read_from_bytes(&b[..]).map_err(|_| self.protocol("short ICResp".into()))?;
        if resp.pfv() != 0 {
            return Err(self.protocol(format!("unsupported PDU format version {}", resp.pfv())));
        }
        if resp.digest() != 0 {
            return Err(self.protocol(format!("digests enabled ({:#x}) that were not asked for", resp.digest())));
        }
        if resp.align() > 31 {
            return Err(self.protocol(format!("CPDA {} is out of range", resp.align())));
        }
        if resp.maxdata() < MIN_MAXH2CDATA || !resp.maxdata().is_multiple_of(4) {
            return Err(self.protocol(format!("MAXH2CDATA {} is invalid", resp.maxdata())));
        }
        self.data_align = (usize::from(resp.align()) + 1) * 4;
        self.max_h2c = resp.maxdata() as usize;
        Ok(())
    }

    /// True once an error closed the connection for good.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Marks the connection unusable and makes the protocol error.
    pub(crate) fn protocol(&mut self, reason: String) -> Error {
        self.fail();
        Error::RemoteProtocol { target: self.target.clone(), reason }
    }

    /// Tells the target why we stop (best effort) and closes the connection.
    pub(crate) fn terminate(&mut self, fes: u16, reason: String) -> Error {
        if !self.broken {
            let t = TermPdu::new(pdu_type::H2C_TERM_REQ, fes);
            let _ = self.sock.write_all(t.as_bytes());
        }
        self.protocol(reason)
    }

    fn fail(&mut self) {
        self.broken = true;
        self.sock.close();
    }

    fn io_error(&mut self, op: &str, e: std::io::Error) -> Error {
        self.fail();
        use std::io::ErrorKind as K;
        let source = match e.kind() {
            K::WouldBlock | K::TimedOut => std::io::Error::from_raw_os_error(libc::ETIMEDOUT),
            K::UnexpectedEof => std::io::Error::new(K::UnexpectedEof, "the target closed the connection"),
            _ => e,
        };
        Error::RemoteTransport { target: self.target.clone(), op: op.to_string(), source }
    }

    fn check_open(&self, op: &str) -> Result<()> {
        if self.broken {
            return Err(Error::RemoteTransport {
                target: self.target.clone(),
                op: op.to_string(),
                source: std::io::Error::from_raw_os_error(libc::ENOTCONN),
            });
        }
        Ok(())
    }

    /// Writes `parts` back to back.
    pub(crate) fn send(&mut self, parts: &[&[u8]], op: &str) -> Result<()> {
        self.check_open(op)?;
        for p in parts {
            if let Err(e) = self.sock.write_all(p) {
                return Err(self.io_error(op, e));
            }
        }
        Ok(())
    }

    fn read_exact(&mut self, buf: &mut [u8], op: &str) -> Result<()> {
        self.check_open(op)?;
        self.sock.read_exact(buf).map_err(|e| self.io_error(op, e))
    }

    /// Reads and discards `n` bytes.
    fn skip(&mut self, mut n: usize, op: &str) -> Result<()> {
        let mut junk = [0u8; 256];
        while n > 0 {
            let k = n.min(junk.len());
            self.read_exact(&mut junk[..k], op)?;
            n -= k;
        }
        Ok(())
    }

    /// Reads the next PDU's header and checks it against what this transport allows.
    pub(crate) fn recv(&mut self, op: &str) -> Result<Pdu> {
        let mut b = [0u8; SHORT_HLEN as usize];
        self.read_exact(&mut b[..8], op)?;
        let hdr = read_header(&b[..8]);
        if hdr.flags() & (flags::HDGST | flags::DDGST) != 0 {
            return Err(
                self.terminate(fes::INVALID_HEADER, format!("a digest flag ({:#x}) without digests", hdr.flags()))
            );
        }
        let short = hdr.hlen() == SHORT_HLEN;
        match hdr.pdu_type() {
            pdu_type::C2H_TERM_REQ if short && (24..=MAX_TERM_PLEN).contains(&hdr.plen()) => {
                self.read_exact(&mut b[8..], op)?;
                let _ = self.skip(hdr.plen() as usize - 24, op);
                Err(self.term_req_from(&b))
            }
            pdu_type::CAPSULE_RESP if short && hdr.plen() == 24 && hdr.pdo() == 0 => {
                self.read_exact(&mut b[8..], op)?;
                let r = RespPdu::read_from_bytes(&b[..]).map_err(|_| self.protocol("short response".into()))?;
                Ok(Pdu::Resp(r.cqe))
            }
            pdu_type::R2T if short && hdr.plen() == 24 && hdr.pdo() == 0 => {
                self.read_exact(&mut b[8..], op)?;
                Ok(Pdu::R2t(self.data_pdu(&b)?))
            }
            pdu_type::C2H_DATA if short && hdr.pdo() >= SHORT_HLEN => {
                self.read_exact(&mut b[8..], op)?;
                let d = self.data_pdu(&b)?;
                if u64::from(hdr.plen()) != u64::from(hdr.pdo()) + u64::from(d.length()) || d.length() == 0 {
                    return Err(self.terminate(
                        fes::INVALID_HEADER,
                        format!("C2HData of {} bytes at PDO {} in a PDU of {}", d.length(), hdr.pdo(), hdr.plen()),
                    ));
                }
                if hdr.flags() & flags::DATA_SUCCESS != 0 && hdr.flags() & flags::DATA_LAST == 0 {
                    return Err(self.terminate(fes::INVALID_HEADER, "C2HData SUCCESS without LAST".into()));
                }
                // Padding up to the data (an HPDA we did not ask for is still honoured).
                self.skip(usize::from(hdr.pdo() - SHORT_HLEN), op)?;
                Ok(Pdu::C2h(d))
            }
            t => Err(self.terminate(
                fes::INVALID_HEADER,
                format!("unexpected PDU type {t:#x} (hlen {}, pdo {}, plen {})", hdr.hlen(), hdr.pdo(), hdr.plen()),
            )),
        }
    }

    fn data_pdu(&mut self, b: &[u8]) -> Result<DataPdu> {
        DataPdu::read_from_bytes(b).map_err(|_| self.protocol("short data PDU header".into()))
    }

    /// Reads a C2HData's payload into `dst` (exactly its length).
    pub(crate) fn read_data(&mut self, dst: &mut [u8], op: &str) -> Result<()> {
        self.read_exact(dst, op)
    }

    fn term_req(&mut self, hdr: PduHeader) -> Error {
        let mut b = [0u8; SHORT_HLEN as usize];
        b[..8].copy_from_slice(hdr.as_bytes());
        if self.read_exact(&mut b[8..], "terminate request").is_err() {
            return self.protocol("a truncated C2HTermReq".into());
        }
        self.term_req_from(&b)
    }

    fn term_req_from(&mut self, b: &[u8]) -> Error {
        let (fes, fei) = TermPdu::read_from_bytes(b).map(|t| (t.fes(), t.fei())).unwrap_or((0, 0));
        self.protocol(format!("the target terminated the connection (C2HTermReq, FES {fes:#x}, FEI {fei:#x})"))
    }
}

/// Decodes a common header (the caller passes 8 bytes).
fn read_header(b: &[u8]) -> PduHeader {
    PduHeader::read_from_bytes(b).unwrap_or_default()
}

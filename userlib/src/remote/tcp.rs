//! One NVMe/TCP connection (one queue): the socket, connection setup (ICReq/ICResp), and PDUs
//! read and checked one at a time. A PDU goes out in one vectored write (with TCP_NODELAY a
//! write is a segment: header, padding and data written apart cost three system calls and
//! three segments), but a large H2CData payload is spliced in after its header, not copied
//! (see [`crate::remote::splice`]); what comes in is read into a receive buffer as far as the
//! socket has it, so one read serves several small PDUs, and a large payload is read straight
//! into its destination. Blocking I/O with a bounded wait on every read and write:
//! a target that stops answering gives [`Error::RemoteTransport`], one that answers nonsense
//! [`Error::RemoteProtocol`]; either way the connection is closed and never used again.
//!
//! Digests are not offered (the ICReq asks for none), so a PDU that carries one is refused.

use super::splice::{PagePipe, Stopped};
use crate::error::{Error, Result};
use std::io::{IoSlice, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
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
/// Receive buffer: room for a burst of small PDUs (responses, 4 KiB C2HData) per read.
const RECV_BUFFER: usize = 64 << 10;
/// The smallest payload spliced rather than copied into the socket: below it, the copy costs
/// less than the extra system calls.
const SPLICE_MIN: usize = 32 << 10;
/// A payload still this far from complete is read straight into its destination rather than
/// through the receive buffer.
pub(crate) const DIRECT_READ: usize = 16 << 10;

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
    /// The socket: waited on for incoming bytes, and large payloads are spliced into it (see
    /// [`crate::remote::splice`]). `None` for a scripted target, always readable, whose payloads
    /// are written.
    fn poll_fd(&self) -> Option<RawFd> {
        None
    }
}

impl ByteStream for TcpStream {
    fn close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }

    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.as_raw_fd())
    }
}

/// A connection's pipe for large payloads.
#[derive(Debug)]
enum Pages {
    /// Made at the first large payload.
    Unmade,
    /// Ready.
    Made(PagePipe),
    /// Making one failed, or a splice failed: payloads are copied.
    Off,
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
    /// The pipe large payloads go out through.
    pages: Pages,
    /// The most bytes one read takes into the receive buffer while a PDU header is read: the
    /// whole buffer while small PDUs may follow one another, one short header when a large
    /// payload follows (what the buffer took of it would be copied a second time).
    header_fill: usize,
    /// Bytes received and not yet consumed: `rbuf[rpos..rend]`.
    rbuf: Box<[u8]>,
    rpos: usize,
    rend: usize,
    /// Sends go out with `MSG_MORE` (see [`Conn::hold_sends`]).
    hold: bool,
    /// Bytes were sent with `MSG_MORE` since the last push.
    held: bool,
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
        let mut c = Conn {
            sock,
            target: target.to_string(),
            data_align: 4,
            max_h2c: 0,
            broken: false,
            pages: Pages::Unmade,
            header_fill: RECV_BUFFER,
            rbuf: vec![0u8; RECV_BUFFER].into_boxed_slice(),
            hold: false,
            held: false,
            rpos: 0,
            rend: 0,
        };
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

    /// Closes the connection for good: nothing is read or written on it again.
    pub(crate) fn fail(&mut self) {
        self.broken = true;
        self.sock.close();
    }

    /// Whether the next PDU most likely carries a large payload (every command in flight is a
    /// read with at least [`DIRECT_READ`] bytes to come): its header is then read alone, so the
    /// payload goes straight to its destination instead of partly through the receive buffer.
    pub(crate) fn expect_large_payload(&mut self, large: bool) {
        self.header_fill = if large { usize::from(SHORT_HLEN) } else { RECV_BUFFER };
    }

    /// Bytes received and not yet consumed.
    pub(crate) fn buffered(&self) -> usize {
        self.rend - self.rpos
    }

    /// The descriptor to wait on for incoming bytes (see [`ByteStream::poll_fd`]).
    pub(crate) fn poll_fd(&self) -> Option<RawFd> {
        self.sock.poll_fd()
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

    /// Writes `parts` back to back, in one system call where the socket takes them all.
    pub(crate) fn send(&mut self, parts: &[&[u8]], op: &str) -> Result<()> {
        self.check_open(op)?;
        let mut iov = [IoSlice::new(&[]); 4];
        let n = parts.len().min(iov.len());
        for (v, p) in iov.iter_mut().zip(parts) {
            *v = IoSlice::new(p);
        }
        let mut rest = &mut iov[..n];
        IoSlice::advance_slices(&mut rest, 0);
        let held = if self.hold { self.sock.poll_fd() } else { None };
        self.held |= held.is_some();
        while !rest.is_empty() {
            let sent = match held {
                Some(fd) => send_more(fd, rest),
                None => self.sock.write_vectored(rest),
            };
            match sent {
                Ok(0) => return Err(self.io_error(op, std::io::ErrorKind::WriteZero.into())),
                Ok(k) => IoSlice::advance_slices(&mut rest, k),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error(op, e)),
            }
        }
        // More than four parts never happens (a PDU is header, padding, data); send the rest
        // plainly rather than drop them.
        for p in parts.iter().skip(n) {
            if let Err(e) = self.sock.write_all(p) {
                return Err(self.io_error(op, e));
            }
        }
        Ok(())
    }

    /// While `hold` is true, sends go out with `MSG_MORE`: the socket holds them until a send
    /// without it, so the commands a batch starts together leave in as few segments as they
    /// fill. Ending the hold pushes what was held, by setting `TCP_NODELAY` again (which tcp(7)
    /// says flushes pending output). Against a target on the same machine, each capsule in a
    /// segment of its own woke the target's worker once per command: 4 KiB reads at QD 32 and
    /// 128 did 2.6x and 2.7x the IOPS with each round's capsules held. A push that fails closes
    /// the connection, so its commands fail by name rather than wait.
    pub(crate) fn hold_sends(&mut self, hold: bool) {
        self.hold = hold;
        if hold || !std::mem::take(&mut self.held) {
            return;
        }
        let Some(fd) = self.sock.poll_fd() else { return };
        let on: libc::c_int = 1;
        // SAFETY: `on` is a valid int option value for the call's duration.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&on as *const libc::c_int).cast(),
                // CAST: the size of an int.
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            log::warn!("NVMe/TCP {}: pushing held commands failed: {}", self.target, std::io::Error::last_os_error());
            self.fail();
        }
    }

    /// Writes `head` (at most three parts), then `payload`: a payload of [`SPLICE_MIN`] bytes or
    /// more on a socket goes through the connection's pipe, not copied into the socket; a
    /// smaller one, or memory the pipe refuses, in one vectored write with `head`.
    ///
    /// # Safety
    ///
    /// `payload` stays unwritten until the peer has received it (the socket may read its pages
    /// after this returns): a command's data while the command is in flight.
    pub(crate) unsafe fn send_payload(&mut self, head: &[&[u8]], payload: &[u8], op: &str) -> Result<()> {
        let fd = self.sock.poll_fd().filter(|_| payload.len() >= SPLICE_MIN);
        let pipe = match (fd, std::mem::replace(&mut self.pages, Pages::Off)) {
            (Some(_), Pages::Made(p)) => Some(p),
            (Some(_), Pages::Unmade) => {
                PagePipe::new().map_err(|e| log::debug!("no pipe for NVMe/TCP payloads ({e}): they are copied")).ok()
            }
            (_, kept) => {
                self.pages = kept;
                None
            }
        };
        let (Some(fd), Some(mut pipe)) = (fd, pipe) else {
            let mut parts = [&[][..]; 4];
            let n = head.len().min(3);
            parts[..n].copy_from_slice(&head[..n]);
            parts[n] = payload;
            return self.send(&parts[..=n], op);
        };
        // SAFETY: the caller's contract.
        let r = unsafe { self.splice_payload(fd, &mut pipe, head, payload, op) };
        // After a failed splice the pipe may hold bytes of this payload: it is never used again.
        if r.is_ok() {
            self.pages = Pages::Made(pipe);
        }
        r
    }

    /// [`Conn::send_payload`] through `pipe` into socket `fd`.
    ///
    /// # Safety
    ///
    /// As [`Conn::send_payload`].
    unsafe fn splice_payload(
        &mut self,
        fd: RawFd,
        pipe: &mut PagePipe,
        head: &[&[u8]],
        payload: &[u8],
        op: &str,
    ) -> Result<()> {
        self.check_open(op)?;
        // The header goes first, held back until the payload follows (MSG_MORE).
        let mut iov = [IoSlice::new(&[]); 3];
        let n = head.len().min(iov.len());
        for (v, p) in iov.iter_mut().zip(head) {
            *v = IoSlice::new(p);
        }
        let mut rest = &mut iov[..n];
        while !rest.is_empty() {
            match send_more(fd, rest) {
                Ok(k) => IoSlice::advance_slices(&mut rest, k),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error(op, e)),
            }
        }
        // SAFETY: the caller's contract.
        match unsafe { pipe.send(fd, payload) } {
            Ok(()) => Ok(()),
            Err((sent, Stopped::Refused(e))) => {
                log::debug!("a payload's memory is not spliceable ({e}): it is copied");
                self.send(&[&payload[sent..]], op)
            }
            Err((_, Stopped::Socket(e))) => Err(self.io_error(op, e)),
        }
    }

    /// Fills `buf` from the receive buffer, then from the socket: a large remainder straight
    /// into `buf`, a small one through the receive buffer (one read takes whatever the socket
    /// has, the next PDUs included).
    fn read_exact(&mut self, buf: &mut [u8], op: &str) -> Result<()> {
        self.read_exact_filling(buf, RECV_BUFFER, op)
    }

    /// [`Conn::read_exact`] taking at most `fill` bytes into the receive buffer per read.
    fn read_exact_filling(&mut self, buf: &mut [u8], fill: usize, op: &str) -> Result<()> {
        self.check_open(op)?;
        let mut got = self.take_buffered(buf);
        while got < buf.len() {
            if buf.len() - got >= DIRECT_READ {
                match self.sock.read(&mut buf[got..]) {
                    Ok(0) => return Err(self.io_error(op, std::io::ErrorKind::UnexpectedEof.into())),
                    Ok(k) => got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(self.io_error(op, e)),
                }
            } else {
                self.fill(fill, op)?;
                got += self.take_buffered(&mut buf[got..]);
            }
        }
        Ok(())
    }

    /// Moves buffered bytes into `dst`; returns how many.
    fn take_buffered(&mut self, dst: &mut [u8]) -> usize {
        let k = dst.len().min(self.buffered());
        dst[..k].copy_from_slice(&self.rbuf[self.rpos..self.rpos + k]);
        self.rpos += k;
        k
    }

    /// One read of at most `max` bytes from the socket into the (empty) receive buffer: blocks
    /// until some bytes arrive (bounded by the socket's timeout).
    fn fill(&mut self, max: usize, op: &str) -> Result<()> {
        // Called only when the buffer is drained.
        self.rpos = 0;
        self.rend = 0;
        let max = max.clamp(1, self.rbuf.len());
        loop {
            match self.sock.read(&mut self.rbuf[..max]) {
                Ok(0) => return Err(self.io_error(op, std::io::ErrorKind::UnexpectedEof.into())),
                Ok(k) => {
                    self.rend = k;
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error(op, e)),
            }
        }
    }

    /// Reads and discards `n` bytes, taking at most `fill` into the receive buffer per read.
    fn skip(&mut self, mut n: usize, fill: usize, op: &str) -> Result<()> {
        let mut junk = [0u8; 256];
        while n > 0 {
            let k = n.min(junk.len());
            self.read_exact_filling(&mut junk[..k], fill, op)?;
            n -= k;
        }
        Ok(())
    }

    /// Reads the next PDU's header and checks it against what this transport allows.
    pub(crate) fn recv(&mut self, op: &str) -> Result<Pdu> {
        let mut b = [0u8; SHORT_HLEN as usize];
        self.read_exact_filling(&mut b[..8], self.header_fill, op)?;
        let hdr = read_header(&b[..8]);
        if hdr.flags() & (flags::HDGST | flags::DDGST) != 0 {
            return Err(
                self.terminate(fes::INVALID_HEADER, format!("a digest flag ({:#x}) without digests", hdr.flags()))
            );
        }
        let short = hdr.hlen() == SHORT_HLEN;
        match hdr.pdu_type() {
            pdu_type::C2H_TERM_REQ if short && (24..=MAX_TERM_PLEN).contains(&hdr.plen()) => {
                self.read_exact_filling(&mut b[8..], self.header_fill, op)?;
                let _ = self.skip(hdr.plen() as usize - 24, RECV_BUFFER, op);
                Err(self.term_req_from(&b))
            }
            pdu_type::CAPSULE_RESP if short && hdr.plen() == 24 && hdr.pdo() == 0 => {
                self.read_exact_filling(&mut b[8..], self.header_fill, op)?;
                let r = RespPdu::read_from_bytes(&b[..]).map_err(|_| self.protocol("short response".into()))?;
                Ok(Pdu::Resp(r.cqe))
            }
            pdu_type::R2T if short && hdr.plen() == 24 && hdr.pdo() == 0 => {
                self.read_exact_filling(&mut b[8..], self.header_fill, op)?;
                Ok(Pdu::R2t(self.data_pdu(&b)?))
            }
            pdu_type::C2H_DATA if short && hdr.pdo() >= SHORT_HLEN => {
                self.read_exact_filling(&mut b[8..], self.header_fill, op)?;
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
                self.skip(usize::from(hdr.pdo() - SHORT_HLEN), self.header_fill, op)?;
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

/// One `sendmsg` of `iov` on socket `fd` with `MSG_MORE` (the socket holds partial segments
/// until a send without it); the bytes sent.
fn send_more(fd: RawFd, iov: &mut [IoSlice<'_>]) -> std::io::Result<usize> {
    // SAFETY: `msg` names `iov`'s slices (an IoSlice is an iovec), valid for the call.
    let k = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_mut_ptr().cast();
        msg.msg_iovlen = iov.len();
        libc::sendmsg(fd, &msg, libc::MSG_MORE | libc::MSG_NOSIGNAL)
    };
    // CAST: non-negative, at most the bytes asked for.
    if k < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(k as usize)
    }
}

/// Decodes a common header (the caller passes 8 bytes).
fn read_header(b: &[u8]) -> PduHeader {
    PduHeader::read_from_bytes(b).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target whose answers have all arrived, each as one burst: a read returns bytes of one
    /// burst at most.
    #[derive(Debug)]
    struct Sent {
        bursts: std::collections::VecDeque<Vec<u8>>,
    }

    impl Read for Sent {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let Some(b) = self.bursts.front_mut() else { return Ok(0) };
            let k = buf.len().min(b.len());
            buf[..k].copy_from_slice(&b[..k]);
            b.drain(..k);
            if b.is_empty() {
                self.bursts.pop_front();
            }
            Ok(k)
        }
    }

    impl Write for Sent {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl ByteStream for Sent {
        fn close(&self) {}
    }

    /// Sends made while held stay in the socket until the hold ends, then arrive together;
    /// without a hold each arrives at once (`TCP_NODELAY`).
    #[test]
    fn held_sends_leave_together_when_the_hold_ends() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // The target's side: answers the ICReq, then hands its socket over.
        let target = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut ic = [0u8; IC_LEN as usize];
            s.read_exact(&mut ic).unwrap();
            s.write_all(IcPdu::new(pdu_type::IC_RESP, 0, 0, 1 << 20).as_bytes()).unwrap();
            s
        });
        let mut c = Conn::connect(&addr.to_string(), Duration::from_secs(5)).unwrap();
        let mut t = target.join().unwrap();
        // What the target has received so far, without waiting for more.
        let arrived = |t: &mut TcpStream| {
            let mut b = [0u8; 256];
            // SAFETY: `b` is writable for its length.
            let n = unsafe { libc::recv(t.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
            b[..n.max(0) as usize].to_vec()
        };
        c.send(&[&[1u8; 72]], "test").unwrap();
        assert_eq!(arrived(&mut t), [1u8; 72], "not held: sent at once");
        c.hold_sends(true);
        c.send(&[&[2u8; 72]], "test").unwrap();
        c.send(&[&[3u8; 40], &[4u8; 32]], "test").unwrap();
        assert!(arrived(&mut t).is_empty(), "held");
        c.hold_sends(false);
        let mut both = vec![0u8; 144];
        t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        t.read_exact(&mut both).unwrap();
        assert_eq!(both, [[2u8; 72].as_slice(), &[3u8; 40], &[4u8; 32]].concat());
        c.send(&[&[5u8; 72]], "test").unwrap();
        assert_eq!(arrived(&mut t), [5u8; 72], "the hold ended");
    }

    /// With a large payload expected, a C2HData's header is read alone and its payload goes
    /// straight into the destination, none of it through the receive buffer (which would copy
    /// it twice); without, one read takes as much as the buffer holds.
    #[test]
    fn a_large_payload_after_its_header_skips_the_receive_buffer() {
        let payload: Vec<u8> = (0..128 * 1024u32).map(|i| (i % 253) as u8).collect();
        let ic = IcPdu::new(pdu_type::IC_RESP, 0, 0, 1 << 20);
        let hdr = PduHeader::new(
            pdu_type::C2H_DATA,
            flags::DATA_LAST | flags::DATA_SUCCESS,
            SHORT_HLEN,
            SHORT_HLEN,
            u32::from(SHORT_HLEN) + payload.len() as u32,
        );
        let c2h = DataPdu::new(hdr, 3, 0, 0, payload.len() as u32);
        let data = [c2h.as_bytes(), &payload[..]].concat();
        for large in [false, true] {
            let sent = Sent { bursts: [ic.as_bytes().to_vec(), data.clone()].into() };
            let mut c = Conn::over(Box::new(sent), "test:4420").unwrap();
            c.expect_large_payload(large);
            let Pdu::C2h(d) = c.recv("read").unwrap() else { panic!("expected C2HData") };
            assert_eq!((d.cccid(), d.length() as usize), (3, payload.len()));
            let buffered = c.buffered();
            let mut dst = vec![0u8; payload.len()];
            c.read_data(&mut dst, "read").unwrap();
            assert!(dst == payload, "the payload arrived intact");
            if large {
                assert_eq!(buffered, 0, "nothing of the payload was read into the buffer");
            } else {
                assert!(buffered > 0, "the buffer took part of the payload with its header");
            }
        }
    }
}

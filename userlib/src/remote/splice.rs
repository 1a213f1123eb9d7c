//! Large payloads sent without a copy into the socket: the payload's pages go into a pipe
//! (`vmsplice`) and from the pipe into the socket (`splice`), so the socket's buffers refer to
//! the caller's pages where a write would copy them. A 1 MiB write to an NVMe/TCP target
//! otherwise pays that copy on top of the one the receiver makes; the kernel's own initiator
//! sends its pages the same way.
//!
//! The pages stay referenced (never freed under the kernel) until the socket lets go of them,
//! which may be after `send` returns. What the peer receives is the payload as it was when the
//! socket sent it: the caller keeps the memory unwritten while its command is in flight, and a
//! command's completion comes only after the target received all of its data.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The pipe's capacity asked for: a 1 MiB payload in one `vmsplice` (the default pipe takes
/// 64 KiB; an unprivileged process may raise its pipes to `/proc/sys/fs/pipe-max-size`, 1 MiB
/// by default).
const PIPE_BYTES: libc::c_int = 1 << 20;

/// How a splice stopped short.
#[derive(Debug)]
pub(crate) enum Stopped {
    /// `vmsplice` refused the memory (not ordinary pages, e.g. a device mapping); nothing of the
    /// refused part is in the pipe. The caller writes the rest.
    Refused(io::Error),
    /// The socket failed; the pipe may still hold bytes (it must not be used again).
    Socket(io::Error),
}

/// A pipe that carries payload pages into sockets.
#[derive(Debug)]
pub(crate) struct PagePipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl PagePipe {
    /// A new pipe, as large as the system lets this process make it.
    pub(crate) fn new() -> io::Result<PagePipe> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both descriptors are new and owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // Best effort: a smaller pipe only means more rounds.
        // SAFETY: F_SETPIPE_SZ takes an int and touches no memory of ours.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) };
        Ok(PagePipe { read, write })
    }

    /// Moves all of `data` into `sock` (a connected, blocking stream socket) through the pipe.
    /// On a [`Stopped::Refused`], the returned count of bytes already in the socket is in it.
    ///
    /// # Safety
    ///
    /// The pages of `data` are read by the socket after this returns (until it lets go of
    /// them): the caller must not write `data` before the peer has received it, or the peer may
    /// receive the new bytes. Memory safety does not depend on it (the kernel holds its own
    /// references to the pages).
    pub(crate) unsafe fn send(&mut self, sock: RawFd, data: &[u8]) -> Result<(), (usize, Stopped)> {
        // A splice into a socket the peer closed raises SIGPIPE (it has no MSG_NOSIGNAL), which
        // kills a program that did not ignore it: held back on this thread meanwhile.
        let _held = SigpipeHeld::new();
        let mut sent = 0;
        while sent < data.len() {
            let rest = &data[sent..];
            let iov = libc::iovec { iov_base: rest.as_ptr() as *mut libc::c_void, iov_len: rest.len() };
            // SAFETY: `iov` names `rest`, valid for reads for this call; vmsplice without
            // SPLICE_F_GIFT only takes references to its pages (the caller's contract covers
            // their contents afterwards).
            let queued = unsafe { libc::vmsplice(self.write.as_raw_fd(), &iov, 1, 0) };
            if queued < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err((sent, Stopped::Refused(e)));
            }
            // CAST: vmsplice returns at most `rest.len()` (a usize) when it succeeds.
            let mut left = queued as usize;
            while left > 0 {
                // More of the payload follows: don't push a short segment.
                let more = if sent + left < data.len() { libc::SPLICE_F_MORE } else { 0 };
                let flags = libc::SPLICE_F_MOVE | more;
                // SAFETY: plain descriptors; no memory of ours is passed.
                let moved = unsafe {
                    libc::splice(self.read.as_raw_fd(), std::ptr::null_mut(), sock, std::ptr::null_mut(), left, flags)
                };
                match moved {
                    // The pipe held `left` bytes: end of input cannot happen.
                    0 => return Err((sent, Stopped::Socket(io::ErrorKind::WriteZero.into()))),
                    n if n > 0 => {
                        // CAST: at most `left`.
                        left -= n as usize;
                        sent += n as usize;
                    }
                    _ => {
                        let e = io::Error::last_os_error();
                        if e.raw_os_error() == Some(libc::EPIPE) {
                            if let Some(h) = &_held {
                                h.discard_raised();
                            }
                        }
                        if e.kind() != io::ErrorKind::Interrupted {
                            return Err((sent, Stopped::Socket(e)));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// SIGPIPE blocked on this thread until dropped (the thread's mask as it was is restored).
struct SigpipeHeld {
    /// SIGPIPE alone.
    set: libc::sigset_t,
    old: libc::sigset_t,
    /// SIGPIPE was pending here before: one found later is not ours to discard.
    was_pending: bool,
}

impl SigpipeHeld {
    /// `None` where the mask could not be changed (the splice then runs as is).
    fn new() -> Option<SigpipeHeld> {
        // SAFETY: the sets are plain values initialised by sigemptyset before use; the calls
        // read and write only them.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
                return None;
            }
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut pending);
            let was_pending = libc::sigpending(&mut pending) == 0 && libc::sigismember(&pending, libc::SIGPIPE) == 1;
            Some(SigpipeHeld { set, old, was_pending })
        }
    }

    /// Takes the SIGPIPE a failed splice raised, so it is not delivered when the mask is restored.
    fn discard_raised(&self) {
        if self.was_pending {
            return;
        }
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: reads the set made in `new`; a zero timeout only polls.
        unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &zero) };
    }
}

impl Drop for SigpipeHeld {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    /// A payload larger than the pipe, starting in the middle of a page, arrives whole and in
    /// order through a loopback TCP connection, after bytes written before it and before bytes
    /// written after it.
    #[test]
    fn a_spliced_payload_arrives_whole_and_in_order() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut rx, _) = l.accept().unwrap();
        let data: Vec<u8> = (0..(3 << 20) + 4096 + 100).map(|i: u32| (i % 251) as u8 ^ (i >> 16) as u8).collect();
        let payload = &data[100..];
        let want: Vec<u8> = [b"head".as_slice(), payload, b"tail"].concat();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            rx.read_to_end(&mut got).unwrap();
            got
        });
        use std::io::Write;
        tx.write_all(b"head").unwrap();
        let mut pipe = PagePipe::new().unwrap();
        // SAFETY: `data` is not written until the reader has it all (joined below).
        unsafe { pipe.send(tx.as_raw_fd(), payload) }.map_err(|(n, e)| format!("{n}: {e:?}")).unwrap();
        tx.write_all(b"tail").unwrap();
        drop(tx);
        let got = reader.join().unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the bytes differ");
    }

    /// A splice into a connection the peer closed fails by name and leaves no SIGPIPE behind
    /// (one would kill a C program that did not ignore it). This thread blocks SIGPIPE itself
    /// for the test, so a raised one would stay pending here, where the test looks for it.
    #[test]
    fn a_splice_into_a_closed_connection_fails_without_sigpipe() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        drop(l.accept().unwrap());
        drop(l);
        let data = vec![7u8; 1 << 20];
        let mut pipe = PagePipe::new().unwrap();
        // SAFETY: plain signal sets, initialised before use; the mask is restored below.
        let (set, old) = unsafe {
            let (mut set, mut old): (libc::sigset_t, libc::sigset_t) = (std::mem::zeroed(), std::mem::zeroed());
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old), 0);
            (set, old)
        };
        let mut failed = None;
        for _ in 0..64 {
            // SAFETY: `data` is never written.
            if let Err((_, e)) = unsafe { pipe.send(tx.as_raw_fd(), &data) } {
                failed = Some(e);
                break;
            }
        }
        // SAFETY: as above; a zero timeout only polls.
        let raised = unsafe {
            let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            let r = libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) == libc::SIGPIPE;
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            r
        };
        assert!(matches!(failed, Some(Stopped::Socket(_))), "{failed:?}");
        assert!(!raised, "a SIGPIPE was left pending");
    }
}

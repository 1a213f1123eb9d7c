//! A raw, deliberately minimal user-space driver for testing the kernel module on its own (no
//! userlib): ioctls and mmaps by hand, commands written into the SQ, completions polled from
//! the CQ, PRPs built from a registration's segments.

use anyhow::{bail, Context, Result};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use ugds_uapi::ioctl::*;
use ugds_uapi::queue::nvm;
use ugds_uapi::{Cqe, Sqe};
use zerocopy::FromBytes;

/// An open `/dev/ugds_drvN`.
pub struct RawDev {
    fd: OwnedFd,
    /// GET_INFO.
    pub info: DeviceInfo,
}

/// Issues an ioctl; the errno on failure.
pub fn ioctl_raw<T>(fd: i32, req: u32, arg: &mut T) -> io::Result<i32> {
    // SAFETY: `arg` is a live, exclusive T; the kernel reads/writes at most the size the
    // request number encodes, which callers match to T.
    let r = unsafe { libc::ioctl(fd, req as _, arg as *mut T) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A shared memory mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a plain shared mapping; accesses are volatile.
unsafe impl Send for Mapping {}

impl Mapping {
    /// mmap(fd, offset, len, prot) shared.
    pub fn new(fd: i32, offset: u64, len: usize, prot: i32) -> io::Result<Self> {
        // SAFETY: a fresh mapping chosen by the kernel; no existing memory is affected.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, offset as i64) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }
    /// The mapping's address.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    /// Volatile 32-bit read.
    pub fn read32(&self, off: usize) -> u32 {
        assert!(off + 4 <= self.len && off.is_multiple_of(4));
        // SAFETY: in bounds and aligned (asserted).
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u32>()) }
    }
    /// Volatile 32-bit write.
    pub fn write32(&self, off: usize, v: u32) {
        assert!(off + 4 <= self.len && off.is_multiple_of(4));
        // SAFETY: in bounds and aligned (asserted).
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<u32>(), v) }
    }
    /// Volatile 64-bit write.
    pub fn write64(&self, off: usize, v: u64) {
        assert!(off + 8 <= self.len && off.is_multiple_of(8));
        // SAFETY: in bounds and aligned (asserted).
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<u64>(), v) }
    }
    /// Copies bytes in.
    pub fn write_bytes(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds (asserted); the mapping is ours, and `data` is not part of it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) }
    }
    /// Copies bytes out.
    pub fn read_bytes(&self, off: usize, out: &mut [u8]) {
        assert!(off + out.len() <= self.len);
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: in bounds (asserted).
            *b = unsafe { std::ptr::read_volatile(self.ptr.add(off + i)) };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Page-aligned anonymous memory to register.
pub struct HostBuf {
    /// The mapping.
    pub map: Mapping,
}

impl HostBuf {
    /// `len` bytes (a multiple of 4096), zeroed.
    pub fn new(len: usize) -> io::Result<Self> {
        // SAFETY: an anonymous private mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(HostBuf { map: Mapping { ptr: p.cast(), len } })
    }
    /// Address.
    pub fn addr(&self) -> u64 {
        self.map.ptr as u64
    }
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: a live mapping of len bytes (the SSD writes it only during our waits).
        unsafe { std::slice::from_raw_parts(self.map.ptr, self.map.len) }
    }
    /// The bytes, mutable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr, self.map.len) }
    }
}

impl RawDev {
    /// Opens the device and reads GET_INFO.
    pub fn open(path: &str) -> Result<Self> {
        let c = CString::new(path)?;
        // SAFETY: valid path; the fd is owned below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error()).with_context(|| format!("opening {path}"));
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut info = DeviceInfo::read_from_bytes(&[0u8; core::mem::size_of::<DeviceInfo>()][..])
            .map_err(|_| anyhow::anyhow!("size"))?;
        ioctl_raw(fd.as_raw_fd(), IOCTL_GET_INFO, &mut info).context("GET_INFO")?;
        if info.abi_version != ABI_VERSION {
            bail!("ABI {} != {}", info.abi_version, ABI_VERSION);
        }
        Ok(RawDev { fd, info })
    }
    /// The fd.
    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
    /// Registers host memory.
    pub fn register(&self, addr: u64, len: u64) -> io::Result<RegistrationHandle> {
        let mut a = RegisterHost { addr, len, handle: RegistrationHandle::default() };
        ioctl_raw(self.fd(), IOCTL_REGISTER_HOST, &mut a)?;
        Ok(a.handle)
    }
    /// Registers a dma-buf.
    pub fn register_dmabuf(&self, fd: i32, offset: u64, len: u64) -> io::Result<RegistrationHandle> {
        let mut a = RegisterDmabuf { fd, reserved: 0, offset, len, handle: RegistrationHandle::default() };
        ioctl_raw(self.fd(), IOCTL_REGISTER_DMABUF, &mut a)?;
        Ok(a.handle)
    }
    /// All segments of a registration.
    pub fn segments(&self, h: RegistrationHandle) -> io::Result<Vec<Segment>> {
        let mut v = vec![Segment::default(); h.nsegs as usize];
        let mut a = GetSegments {
            id: h.id,
            generation: h.generation,
            first: 0,
            count: h.nsegs,
            segments: v.as_mut_ptr() as u64,
        };
        let n = ioctl_raw(self.fd(), IOCTL_GET_SEGMENTS, &mut a)?;
        v.truncate(n as usize);
        Ok(v)
    }
    /// Deregisters.
    pub fn deregister(&self, id: u32, generation: u32) -> io::Result<()> {
        let mut a = Deregister { id, generation };
        ioctl_raw(self.fd(), IOCTL_DEREGISTER, &mut a).map(|_| ())
    }
    /// Creates a queue pair and maps it.
    pub fn create_qpair(&self, depth: u32) -> io::Result<RawQpair> {
        self.create_qpair_flags(depth, 0)
    }
    /// Creates a queue pair with `QPAIR_FLAG_*` and maps it.
    pub fn create_qpair_flags(&self, depth: u32, flags: u32) -> io::Result<RawQpair> {
        let mut a = CreateQpair { depth, flags, ..Default::default() };
        ioctl_raw(self.fd(), IOCTL_CREATE_QPAIR, &mut a)?;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        Ok(RawQpair {
            qid: a.qid,
            depth,
            sq: Mapping::new(self.fd(), a.sq_offset, a.sq_size as usize, rw)?,
            cq: Mapping::new(self.fd(), a.cq_offset, a.cq_size as usize, rw)?,
            prp: Mapping::new(self.fd(), a.prp_offset, a.prp_size as usize, rw)?,
            db: Mapping::new(self.fd(), MMAP_DOORBELLS, 4096, rw)?,
            shadow: if self.info.flags & DEVICE_SHADOW_DOORBELLS != 0 {
                Some(Mapping::new(self.fd(), MMAP_SHADOW_DOORBELLS, 4096, rw)?)
            } else {
                None
            },
            args: a,
            tail: 0,
            head: 0,
            phase: true,
            next_cid: 0,
        })
    }
    /// Deletes a queue pair by id.
    pub fn delete_qpair(&self, qid: u32) -> io::Result<()> {
        let mut a = DeleteQpair { qid, reserved: 0 };
        ioctl_raw(self.fd(), IOCTL_DELETE_QPAIR, &mut a).map(|_| ())
    }
    /// Attaches (or with -1 detaches) an eventfd to a queue's interrupt.
    pub fn set_eventfd(&self, qid: u32, fd: i32) -> io::Result<()> {
        let mut a = SetEventfd { qid, fd };
        ioctl_raw(self.fd(), IOCTL_SET_EVENTFD, &mut a).map(|_| ())
    }
    /// Arms queue `qid`'s interrupt (one-shot from then on).
    pub fn arm_irq(&self, qid: u32) -> io::Result<()> {
        let mut a = DeleteQpair { qid, reserved: 0 };
        ioctl_raw(self.fd(), IOCTL_ARM_IRQ, &mut a).map(|_| ())
    }
    /// Resets the controller.
    pub fn reset(&self) -> io::Result<()> {
        let mut none = 0u64;
        ioctl_raw(self.fd(), IOCTL_RESET, &mut none).map(|_| ())
    }
    /// Re-arms a queue pair after a reset.
    pub fn rearm_qpair(&self, qid: u32) -> io::Result<()> {
        let mut a = DeleteQpair { qid, reserved: 0 };
        ioctl_raw(self.fd(), IOCTL_REARM_QPAIR, &mut a).map(|_| ())
    }
    /// Reads the status page.
    pub fn status(&self) -> io::Result<StatusPage> {
        let m = Mapping::new(self.fd(), MMAP_STATUS, 4096, libc::PROT_READ)?;
        let mut b = [0u8; core::mem::size_of::<StatusPage>()];
        m.read_bytes(0, &mut b);
        Ok(StatusPage::read_from_bytes(&b[..]).expect("a whole status page"))
    }
}

/// A queue pair driven by hand.
pub struct RawQpair {
    /// Queue id.
    pub qid: u32,
    /// Entries.
    pub depth: u32,
    sq: Mapping,
    cq: Mapping,
    prp: Mapping,
    db: Mapping,
    /// The shadow doorbell page, where the controller takes shadow doorbells: every doorbell
    /// value goes there too (the controller reads its queues' values there).
    shadow: Option<Mapping>,
    /// What CREATE_QPAIR returned.
    pub args: CreateQpair,
    tail: u32,
    head: u32,
    phase: bool,
    next_cid: u16,
}

/// DMA address of byte `off` of a registration made of `segs`.
pub fn dma_at(segs: &[Segment], mut off: u64) -> Option<u64> {
    for s in segs {
        if off < s.len {
            return Some(s.dma_addr + off);
        }
        off -= s.len;
    }
    None
}

impl RawQpair {
    /// Builds PRPs for `[off, off + len)` of a registration (4 KiB-aligned `off`), using the
    /// slot's PRP-list page when more than two pages are needed.
    fn prps(&self, slot: u32, segs: &[Segment], off: u64, len: u64) -> Result<(u64, u64)> {
        let pages = len.div_ceil(4096);
        let first = dma_at(segs, off).context("offset outside the registration")?;
        match pages {
            1 => Ok((first, 0)),
            2 => Ok((first, dma_at(segs, off + 4096).context("past the registration")?)),
            n => {
                if n - 1 > 512 {
                    bail!("raw driver builds one PRP-list page only");
                }
                let base = slot as usize * 4096;
                for i in 1..n {
                    let a = dma_at(segs, off + i * 4096).context("past the registration")?;
                    self.prp.write64(base + (i as usize - 1) * 8, a);
                }
                Ok((first, self.args.prp_dma + slot as u64 * 4096))
            }
        }
    }

    /// Writes a read/write command for `blocks` blocks at `slba` into the next slot (no
    /// doorbell). Returns the command id.
    pub fn push_rw(
        &mut self,
        opcode: u8,
        ns: &NamespaceInfo,
        slba: u64,
        segs: &[Segment],
        off: u64,
        len: u64,
    ) -> Result<u16> {
        let slot = self.tail;
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        let (p1, p2) = self.prps(slot, segs, off, len)?;
        let mut s = Sqe::new(opcode, cid);
        s.set_nsid(ns.nsid);
        s.set_prps(p1, p2);
        s.set_slba(slba);
        s.set_nlb((len >> ns.lba_shift) as u32);
        self.push(s);
        Ok(cid)
    }

    /// Writes any command into the next slot (no doorbell).
    pub fn push(&mut self, s: Sqe) {
        let base = self.tail as usize * 64;
        for (i, w) in s.to_dwords().iter().enumerate() {
            self.sq.write32(base + 4 * i, *w);
        }
        self.tail = (self.tail + 1) % self.depth;
    }

    /// Forgets ring state after a controller reset (the caller re-arms the queue pair).
    pub fn reset_ring(&mut self) {
        self.tail = 0;
        self.head = 0;
        self.phase = true;
    }

    /// The SQ's mapping.
    pub fn sq_mapping(&self) -> &Mapping {
        &self.sq
    }

    /// Reads the first word of the SQ mapping (faults if the mapping was revoked).
    pub fn peek_sq(&self) -> u32 {
        self.sq.read32(0)
    }

    /// Rings the SQ tail doorbell (the shadow one too, where there is one).
    pub fn ring(&self) {
        self.write_doorbell(self.args.sq_doorbell, self.tail);
    }

    /// Writes a doorbell: the shadow value first, then always the register (never wrong; only
    /// ugds's library skips the writes the controller does not wait for).
    fn write_doorbell(&self, off: u64, value: u32) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if let Some(s) = &self.shadow {
            s.write32(off as usize, value);
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        }
        self.db.write32(off as usize, value);
    }

    /// Polls for `n` completions within `timeout`.
    pub fn wait(&mut self, n: usize, timeout: Duration) -> Result<Vec<Cqe>> {
        let start = Instant::now();
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let off = self.head as usize * 16;
            let dw3 = self.cq.read32(off + 12);
            if ((dw3 >> 16) & 1 != 0) == self.phase {
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                out.push(Cqe::from_dwords([
                    self.cq.read32(off),
                    self.cq.read32(off + 4),
                    self.cq.read32(off + 8),
                    dw3,
                ]));
                self.head += 1;
                if self.head == self.depth {
                    self.head = 0;
                    self.phase = !self.phase;
                }
                self.write_doorbell(self.args.cq_doorbell, self.head);
                continue;
            }
            if start.elapsed() > timeout {
                bail!("{} of {n} completions after {timeout:?}", out.len());
            }
            std::hint::spin_loop();
        }
        Ok(out)
    }

    /// One synchronous read or write of `len` bytes (a multiple of the block size).
    pub fn rw_sync(
        &mut self,
        write: bool,
        ns: &NamespaceInfo,
        slba: u64,
        segs: &[Segment],
        off: u64,
        len: u64,
    ) -> Result<()> {
        let op = if write { nvm::WRITE } else { nvm::READ };
        self.push_rw(op, ns, slba, segs, off, len)?;
        self.ring();
        let c = self.wait(1, Duration::from_secs(20))?;
        if !c[0].status().is_success() {
            bail!("command failed: {}", c[0].status());
        }
        Ok(())
    }
}

/// Errno of an io::Error.
pub fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

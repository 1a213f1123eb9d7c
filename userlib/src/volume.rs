//! Striped volumes: N namespaces on N controllers bound to ugds, used as one target, with
//! exactly Linux md RAID0's layout for equal-sized members: chunk `i` of the volume lives on
//! member `i mod N` at member offset `(i div N) * C`. `mdadm --build /dev/mdX --level=0
//! --chunk=C/1024 --raid-devices=N` over the same disks, in the same order, reads the same
//! bytes. Members of unequal size give `N x the smallest` (md's first zone); the rest of the
//! larger members is not used.
//!
//! A request is split at chunk boundaries; the pieces of each member run on that member's
//! queues, all members at once. A buffer registered for a volume holds one registration per
//! member, so every member's controller can DMA into it. An error names the member and the
//! offset on it.

use crate::buffer::{Buffer, Lease, Mem, Path};
use crate::data_path::{within_capacity, DataPath, Registered};
use crate::device::lanes::{self, Extent, Lane};
use crate::device::{Device, DeviceOptions, PerDevice};
use crate::direct::DirectPath;
use crate::error::{Error, Result};
use crate::gpu::GpuMemory;
use crate::inflight::{settle, Failed, IoResult};
use smallvec::SmallVec;
use std::sync::Arc;

/// Default chunk: 128 KiB, as deployments striping NVMe for GPUs commonly use.
pub const DEFAULT_CHUNK: u64 = 128 << 10;

/// Where one piece of a volume request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Member index.
    pub member: usize,
    /// Byte offset on the member.
    pub member_offset: u64,
    /// Byte offset in the request (and so in the buffer, from the request's buffer offset).
    pub request_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// md RAID0's mapping (one zone, `members` devices, `chunk` bytes) of `[offset, offset + len)`,
/// in volume order.
pub fn pieces(members: usize, chunk: u64, offset: u64, len: u64) -> impl Iterator<Item = Piece> {
    let n = members as u64;
    let mut at = 0u64;
    std::iter::from_fn(move || {
        if at >= len || n == 0 || chunk == 0 {
            return None;
        }
        let pos = offset + at;
        let (i, within) = (pos / chunk, pos % chunk);
        let take = (chunk - within).min(len - at);
        let p =
            Piece { member: (i % n) as usize, member_offset: (i / n) * chunk + within, request_offset: at, len: take };
        at += take;
        Some(p)
    })
}

/// What a volume is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    /// The members' ugds nodes, in stripe order.
    pub members: Vec<String>,
    /// Namespace on each member.
    pub nsid: u32,
    /// Chunk size in bytes (a power of two, at least 4096).
    pub chunk: u64,
}

impl VolumeSpec {
    /// Parses `stripe:[CHUNK:]NODE,NODE,...` (CHUNK like `128K`, `1M` or bytes; default 128K),
    /// the form every face accepts as a target name.
    pub fn parse(s: &str) -> Result<VolumeSpec> {
        let rest = s
            .strip_prefix("stripe:")
            .ok_or_else(|| Error::invalid("volume", format!("{s:?} does not start with \"stripe:\"")))?;
        let (chunk, list) = match rest.split_once(':') {
            Some((c, l)) if !c.starts_with('/') => (parse_chunk(c)?, l),
            _ => (DEFAULT_CHUNK, rest),
        };
        let members: Vec<String> = list.split(',').filter(|m| !m.is_empty()).map(str::to_string).collect();
        let spec = VolumeSpec { members, nsid: 1, chunk };
        spec.check()?;
        Ok(spec)
    }

    fn check(&self) -> Result<()> {
        if self.members.is_empty() {
            return Err(Error::invalid("volume", "no members: give stripe:[CHUNK:]NODE,NODE,..."));
        }
        if self.chunk < 4096 || !self.chunk.is_power_of_two() {
            return Err(Error::invalid(
                "chunk",
                format!("{} is not a power of two of at least 4096 bytes", self.chunk),
            ));
        }
        for (i, m) in self.members.iter().enumerate() {
            if self.members[..i].contains(m) {
                return Err(Error::invalid("volume", format!("{m} is named twice")));
            }
        }
        Ok(())
    }
}

/// The first line of a volume descriptor file.
pub const DESCRIPTOR_MAGIC: &str = "# ugds volume";

/// How a volume descriptor file's name ends: a target name ending so is opened as a volume
/// descriptor (and nothing else); a file of any other name is ordinary data, whatever it
/// holds. [`crate::Storage::open_volume`] opens a descriptor of any name.
pub const DESCRIPTOR_SUFFIX: &str = ".ugds-volume";

/// Descriptor files are small text files; anything larger is ordinary data.
const DESCRIPTOR_MAX_BYTES: u64 = 4096;

impl VolumeSpec {
    /// Whether the target name `name` is a volume descriptor's: its last component ends with
    /// [`DESCRIPTOR_SUFFIX`] (and is more than that).
    pub fn is_descriptor_name(name: impl AsRef<std::path::Path>) -> bool {
        name.as_ref()
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.len() > DESCRIPTOR_SUFFIX.len() && n.ends_with(DESCRIPTOR_SUFFIX))
    }

    /// The one rule every face follows to tell a volume descriptor from a file: a target named
    /// `name` is a descriptor when [`VolumeSpec::is_descriptor_name`] says so, and then must be
    /// one ([`VolumeSpec::read_descriptor`] on `read_from`, the same file, e.g. through
    /// `/proc/self/fd/N`); any other name is `Ok(None)`, whatever the file holds.
    pub fn descriptor_target(
        name: impl AsRef<std::path::Path>,
        read_from: impl AsRef<std::path::Path>,
    ) -> Result<Option<VolumeSpec>> {
        if !Self::is_descriptor_name(&name) {
            return Ok(None);
        }
        Self::read_descriptor(read_from).map(Some)
    }

    /// Reads a volume descriptor file, whatever its name: a regular file of at most 4 KiB whose
    /// first line is exactly `# ugds volume`, then one `stripe:[CHUNK:]NODE,...` line (blank
    /// lines and lines starting with `#` are ignored), owned by root or by this process's user
    /// and writable by its owner only. It lets programs that only open paths (cuFile and uGDS
    /// programs registering a descriptor) reach a volume, when the file's name ends with
    /// [`DESCRIPTOR_SUFFIX`] (see [`VolumeSpec::descriptor_target`]). A file that is not such a
    /// descriptor is an error that says what is wrong with it.
    pub fn read_descriptor(path: impl AsRef<std::path::Path>) -> Result<VolumeSpec> {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let path = path.as_ref();
        let not = |why: String| {
            Error::invalid("volume", format!("{} is not a ugds volume descriptor: {why}", path.display()))
        };
        // One open, then everything from that handle: the file cannot be swapped between the
        // checks and the read; O_NONBLOCK keeps a FIFO from blocking the open.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)
            .map_err(|source| Error::Open { path: path.display().to_string(), source })?;
        let meta = file.metadata().map_err(|source| Error::Open { path: path.display().to_string(), source })?;
        if !meta.is_file() {
            return Err(not("not a regular file".into()));
        }
        if meta.len() > DESCRIPTOR_MAX_BYTES {
            return Err(not(format!("{} bytes, more than a descriptor's {DESCRIPTOR_MAX_BYTES}", meta.len())));
        }
        // Only a file its owner alone can change, owned by root or by this user, redirects I/O
        // to raw namespaces.
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if meta.mode() & 0o022 != 0 {
            return Err(not(format!(
                "its mode {:o} lets others than its owner write it (a descriptor must be writable by its owner only)",
                meta.mode() & 0o7777
            )));
        }
        if meta.uid() != 0 && meta.uid() != me {
            return Err(not(format!(
                "it is owned by user {}, neither root nor this process's user ({me})",
                meta.uid()
            )));
        }
        let mut text = Vec::with_capacity(meta.len() as usize);
        file.take(DESCRIPTOR_MAX_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|source| Error::Open { path: path.display().to_string(), source })?;
        if text.len() as u64 > DESCRIPTOR_MAX_BYTES {
            return Err(not(format!("more than a descriptor's {DESCRIPTOR_MAX_BYTES} bytes")));
        }
        let text = std::str::from_utf8(&text).map_err(|_| not("not UTF-8 text".into()))?;
        let mut lines = text.lines();
        if lines.next().map(str::trim_end) != Some(DESCRIPTOR_MAGIC) {
            return Err(not(format!("its first line is not `{DESCRIPTOR_MAGIC}`")));
        }
        let specs: Vec<&str> = lines.map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
        match specs.as_slice() {
            [one] => Self::parse(one),
            _ => Err(Error::invalid(
                "volume",
                format!(
                    "{} is a ugds volume descriptor with {} spec lines; it needs exactly one \
                     `stripe:[CHUNK:]NODE,NODE,...` line after `{DESCRIPTOR_MAGIC}`",
                    path.display(),
                    specs.len()
                ),
            )),
        }
    }

    /// The descriptor file's text for this spec (what [`VolumeSpec::read_descriptor`] reads).
    pub fn descriptor(&self) -> String {
        format!("{DESCRIPTOR_MAGIC}\n{}\n", self.to_spec_string())
    }

    /// The `stripe:CHUNK:NODE,...` form of this spec.
    pub fn to_spec_string(&self) -> String {
        format!("stripe:{}K:{}", self.chunk >> 10, self.members.join(","))
    }
}

/// A spec's chunk size (`4096`, `128K`, `1M`), parsed as every size is ([`crate::units::parse`]);
/// an unparsable one is refused as the argument `chunk`.
fn parse_chunk(s: &str) -> Result<u64> {
    crate::units::parse(s).map_err(|why| Error::invalid("chunk", format!("{why} (e.g. 128K)")))
}

/// A striped volume as a [`DataPath`].
#[derive(Debug)]
pub(crate) struct VolumePath {
    members: Vec<DirectPath>,
    names: Vec<String>,
    chunk: u64,
    /// Bytes used on each member (the smallest member's capacity, rounded down to a chunk).
    member_bytes: u64,
    block_size: u64,
}

impl VolumePath {
    /// Opens every member of `spec` (each with `opts`).
    pub(crate) fn open(spec: &VolumeSpec, opts: &DeviceOptions) -> Result<VolumePath> {
        spec.check()?;
        let mut members = Vec::with_capacity(spec.members.len());
        let mut seen: Vec<(u64, &str)> = Vec::with_capacity(spec.members.len());
        for m in &spec.members {
            // The same controller under two names (a link, another path) would put two
            // stripes' chunks on one disk: refuse it before anything is opened for I/O.
            use std::os::unix::fs::MetadataExt;
            if let Ok(rdev) = std::fs::metadata(m).map(|md| md.rdev()) {
                if let Some((_, first)) = seen.iter().find(|(r, _)| *r == rdev) {
                    return Err(Error::invalid("volume", format!("{m} and {first} are the same ugds device")));
                }
                seen.push((rdev, m));
            }
            let dev = Device::open_with(m, opts.clone())?;
            let ns = dev.namespace(spec.nsid)?;
            members.push(DirectPath { ns, dev });
        }
        Self::over(members, spec.members.clone(), spec.chunk)
    }

    /// The volume striped over `members` (named `names`, in stripe order) in chunks of `chunk`
    /// bytes; refused when the members' block sizes differ or a chunk exceeds the smallest.
    pub(crate) fn over(members: Vec<DirectPath>, names: Vec<String>, chunk: u64) -> Result<VolumePath> {
        let Some(first) = members.first() else { return Err(Error::invalid("volume", "no members")) };
        if names.len() != members.len() {
            return Err(Error::invalid("volume", format!("{} names for {} members", names.len(), members.len())));
        }
        let bs = first.ns.block_size();
        if let Some((i, p)) = members.iter().enumerate().find(|(_, p)| p.ns.block_size() != bs) {
            return Err(Error::invalid(
                "volume",
                format!(
                    "{} has {}-byte blocks, {} has {bs}-byte blocks: members must share a block size",
                    names[i],
                    p.ns.block_size(),
                    names[0]
                ),
            ));
        }
        let smallest = members.iter().map(|p| p.ns.capacity()).min().unwrap_or(0);
        let member_bytes = smallest / chunk * chunk;
        if member_bytes == 0 {
            return Err(Error::invalid("chunk", format!("{chunk} bytes exceed the smallest member")));
        }
        Ok(VolumePath { members, names, chunk, member_bytes, block_size: bs })
    }

    /// The members, in stripe order.
    pub(crate) fn members(&self) -> &[DirectPath] {
        &self.members
    }

    /// The members' node names, in stripe order.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// The chunk size in bytes.
    pub(crate) fn chunk(&self) -> u64 {
        self.chunk
    }

    /// The volume's bytes: the used part of every member.
    fn bytes(&self) -> u64 {
        self.member_bytes * self.members.len() as u64
    }
}

impl DataPath for VolumePath {
    fn describe(&self) -> String {
        format!(
            "direct path, striped volume (md RAID0 layout, {} KiB chunks): {} members {}, {} bytes in {}-byte blocks",
            self.chunk >> 10,
            self.members.len(),
            self.names.join(","),
            self.bytes(),
            self.block_size
        )
    }

    fn capacity(&self) -> Result<u64> {
        Ok(self.bytes())
    }

    fn block_size(&self) -> u64 {
        self.block_size
    }

    fn buffer_alignment(&self) -> u64 {
        4
    }

    fn check_extent(&self, file_offset: u64, len: u64) -> Result<()> {
        within_capacity(file_offset, len, self.bytes(), "volume")
    }

    fn is_direct(&self) -> bool {
        true
    }

    fn bypasses_page_cache(&self) -> bool {
        true
    }

    unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> Result<Registered> {
        let mut regs = Vec::with_capacity(self.members.len());
        for m in &self.members {
            // SAFETY: forwarded from the caller; the pages past `len` up to the page end belong
            // to the same mapping (mappings are page-granular).
            regs.push(unsafe { m.dev.register_host(ptr, len.next_multiple_of(4096)) }?);
        }
        Ok(Registered { regs, staging: None, path: Path::DirectHost })
    }

    fn register_gpu(&self, mem: &Arc<GpuMemory>, _allow_staging: bool) -> Result<Registered> {
        let mut regs = Vec::with_capacity(self.members.len());
        for m in &self.members {
            let fd = mem.export_dmabuf()?;
            use std::os::fd::AsRawFd;
            regs.push(m.dev.register_dmabuf(fd.as_raw_fd(), 0, mem.len().next_multiple_of(4096) as u64)?);
        }
        Ok(Registered { regs, staging: None, path: Path::DirectP2p })
    }

    fn rw(&self, write: bool, lease: Lease<&Buffer>, buf_offset: u64, file_offset: u64, len: u64) -> IoResult<u64> {
        let buf = lease.buffer();
        if matches!(buf.mem(), Mem::Gpu(_)) && buf.registration().is_none() {
            return Err(Error::invalid("buf", "GPU memory on a volume needs peer-to-peer registration").into());
        }
        // A request that is one range of one member is that member's request: it takes that
        // member's own way (the thread's own queue, one command when it fits one, a lane of its
        // own past that), as a node's request does. A request inside one chunk is one at once;
        // one over chunks is one where its pieces merge (a one-member volume's). The lanes' way
        // cost a 4 KiB read at QD 1 more than half of a node's IOPS, and a 256 KiB read over two
        // chunks of a one-member volume 4.7x the instructions of the node's one command.
        let member_rw = |m: usize, e: Extent| {
            let Some(reg) = buf.registration_on(m) else {
                return Err(Error::invalid("buf", "not registered on every member of the volume").into());
            };
            let r = self.members[m].ns.rw(write, reg, e.reg_offset, e.dev_offset, e.len);
            r.map(|()| len).map_err(|f| {
                let member = self.names[m].clone();
                f.map(|err| Error::Member { member, offset: e.dev_offset, source: Box::new(err) })
            })
        };
        if let Some(p) = pieces(self.members.len(), self.chunk, file_offset, len).next().filter(|p| p.len == len) {
            let e = Extent { reg_offset: buf_offset + p.request_offset, dev_offset: p.member_offset, len };
            let r = member_rw(p.member, e);
            return settle(r, lease);
        }
        // One lane per member the request touches: the calling thread keeps every member's
        // queue busy at once (no thread per member), each lane's pieces in order. Pieces that
        // continue each other on the member and in the buffer (a one-member volume's) are one
        // extent, which the lane splits only at the member's largest command.
        // Every member's extents, member by member (`spans` says where each member's are): the
        // lists are inline for requests of up to 16 extents on up to 4 members.
        let n = self.members.len();
        let mut extents: SmallVec<[Extent; 16]> = SmallVec::new();
        let mut spans: PerDevice<(usize, std::ops::Range<usize>)> = PerDevice::new();
        for m in 0..n {
            let start = extents.len();
            for p in pieces(n, self.chunk, file_offset, len).filter(|p| p.member == m) {
                let (reg_offset, dev_offset) = (buf_offset + p.request_offset, p.member_offset);
                match extents[start..].last_mut() {
                    Some(e) if e.reg_offset + e.len == reg_offset && e.dev_offset + e.len == dev_offset => {
                        e.len += p.len
                    }
                    _ => extents.push(Extent { reg_offset, dev_offset, len: p.len }),
                }
            }
            if extents.len() > start {
                spans.push((m, start..extents.len()));
            }
        }
        if let ([(m, _)], [e]) = (&spans[..], &extents[..]) {
            let r = member_rw(*m, *e);
            return settle(r, lease);
        }
        let mut lanes: PerDevice<Lane<'_>> = PerDevice::new();
        for (m, span) in &spans {
            let Some(reg) = buf.registration_on(*m) else {
                return Err(Error::invalid("buf", "not registered on every member of the volume").into());
            };
            lanes.push(Lane { ns: &self.members[*m].ns, reg, extents: &extents[span.clone()] });
        }
        // The first member's error; tokens of every member whose commands may still run.
        let mut first: Option<Failed> = None;
        for (r, &(m, _)) in lanes::run(write, &lanes).into_iter().zip(&spans) {
            let Err(f) = r else { continue };
            let (member, offset) = (self.names[m].clone(), f.dev_offset);
            let f = f.failure.map(|e| Error::Member { member, offset, source: Box::new(e) });
            match (&mut first, f.into_parts()) {
                (None, (error, Some(t))) => first = Some(Failed::running(error, t)),
                (None, (error, None)) => first = Some(error.into()),
                (Some(fst), (_, Some(t))) => fst.add(t),
                (Some(_), (_, None)) => {}
            }
        }
        // The lanes borrow the buffer that `settle` takes back.
        drop(lanes);
        settle(first.map_or(Ok(len), Err), lease)
    }

    fn flush(&self) -> Result<()> {
        // Every member is flushed even when one fails; the first error is returned.
        let mut first = None;
        for (m, name) in self.members.iter().zip(&self.names) {
            if let Err(e) = m.flush() {
                first.get_or_insert(Error::Member { member: name.clone(), offset: 0, source: Box::new(e) });
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn write_bytes(&self, _data: &[u8], _off: u64) -> Option<Result<()>> {
        None
    }

    fn max_command_bytes(&self) -> u64 {
        self.chunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A request inside one chunk is its member's request: it runs on the thread's own queue of
    /// that member, as a node's request does; one that crosses a chunk runs as lanes, each on
    /// the thread's own queue of its member where the thread holds one, else on the member's
    /// shared queue. Each queue is a mock of its own, so the mock that counted a read says
    /// which queue carried it.
    #[test]
    fn a_request_takes_its_members_own_queues() {
        use crate::device::mock_device::{mock_device_with_thread_queues, mock_volume_buffer};
        use crate::mock::{MockConfig, MockDevice};
        use std::time::Duration;
        let chunk = 64 << 10;
        let (mut members, mut shared, mut own) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..2 {
            let (dev, s, mut t) =
                mock_device_with_thread_queues(MockConfig::default(), 1, Duration::from_secs(5)).unwrap();
            members.push(DirectPath { ns: dev.namespace(1).unwrap(), dev });
            shared.push(s);
            own.push(t.remove(0));
        }
        let st = crate::Storage::direct(&members[0].dev, 1).unwrap();
        let pairs: Vec<(&Device, &MockDevice)> = members.iter().map(|m| &m.dev).zip(&shared).collect();
        let buf = mock_volume_buffer(&st, &pairs).unwrap();
        let member_bytes = members[0].ns.capacity();
        let vol = VolumePath { members, names: vec!["m0".into(), "m1".into()], chunk, member_bytes, block_size: 4096 };
        let reads = |ms: &[MockDevice]| ms.iter().map(|m| m.stats().reads).collect::<Vec<u64>>();
        // The volume's second chunk is member 1's first.
        assert_eq!(vol.rw(false, Lease::new(&buf).unwrap(), 0, chunk, 4096).unwrap(), 4096);
        assert_eq!((reads(&own), reads(&shared)), (vec![0, 1], vec![0, 0]));
        // 8 KiB across the first chunk's end, 4 KiB on each member, from another thread: it
        // claims member 0's own queue, and shares on member 1, whose only one this thread holds.
        let r =
            std::thread::scope(|s| s.spawn(|| vol.rw(false, Lease::new(&buf).unwrap(), 0, chunk - 4096, 8192)).join());
        assert_eq!(r.unwrap().unwrap(), 8192);
        assert_eq!((reads(&own), reads(&shared)), (vec![1, 1], vec![0, 1]));
        // That thread exited and let member 0's go: here both lanes run on this thread's own.
        assert_eq!(vol.rw(false, Lease::new(&buf).unwrap(), 0, chunk - 4096, 8192).unwrap(), 8192);
        assert_eq!((reads(&own), reads(&shared)), (vec![2, 2], vec![0, 1]));
    }

    /// A volume of two members in `chunk`s over device models configured as `cfgs` say, with a
    /// buffer registered on both (each member's registration over its own model's memory).
    fn two_members(
        cfgs: [crate::mock::MockConfig; 2],
        chunk: u64,
    ) -> (VolumePath, Vec<crate::mock::MockDevice>, Buffer) {
        use crate::device::mock_device::{mock_device, mock_volume_buffer};
        use crate::mock::MockDevice;
        let (mut members, mut mocks) = (Vec::new(), Vec::new());
        for cfg in cfgs {
            let (dev, mock) = mock_device(cfg, std::time::Duration::from_secs(5)).unwrap();
            members.push(DirectPath { ns: dev.namespace(1).unwrap(), dev });
            mocks.push(mock);
        }
        let st = crate::Storage::direct(&members[0].dev, 1).unwrap();
        let pairs: Vec<(&Device, &MockDevice)> = members.iter().map(|m| &m.dev).zip(&mocks).collect();
        let buf = mock_volume_buffer(&st, &pairs).unwrap();
        let member_bytes = members[0].ns.capacity();
        let names = vec!["m0".into(), "m1".into()];
        (VolumePath { members, names, chunk, member_bytes, block_size: 4096 }, mocks, buf)
    }

    /// A request over several chunks of two members: each member's chunks continue each other
    /// on the member but lie apart in the buffer, and its lane gathers them into one command
    /// (as md's block layer merges a member's pieces), each chunk's data in its place, with PRPs
    /// and with SGLs, over scattered bus pages. One command per chunk made 1 MiB at QD 1 on 2
    /// and 4 members 0.32x to 0.63x one member's IOPS.
    #[test]
    fn a_members_chunks_go_out_as_one_command() {
        use crate::mock::MockConfig;
        use crate::sgl::DataPointers;
        let chunk: u64 = 128 << 10;
        let byte = |m: usize, i: u64| (i / 4096 * 7 + i % 251 + 101 * m as u64) as u8;
        for data_pointers in [DataPointers::PrpOnly, DataPointers::SglPreferred] {
            let cfg = MockConfig {
                segment_bytes: 64 << 10,
                segments: 16,
                scatter: true,
                data_pointers,
                ..Default::default()
            };
            let (vol, mocks, buf) = two_members([cfg.clone(), cfg], chunk);
            // Chunk k of the request is member k % 2's chunk k / 2; its data lies at byte k *
            // chunk of that member's registration. Fill each member's memory with its bytes.
            for (m, mock) in mocks.iter().enumerate() {
                mock.host_write(0, &(0..1u64 << 20).map(|i| byte(m, i)).collect::<Vec<u8>>());
            }
            assert_eq!(vol.rw(true, Lease::new(&buf).unwrap(), 0, 0, 1 << 20).unwrap(), 1 << 20);
            for (m, mock) in mocks.iter().enumerate() {
                assert_eq!(mock.stats().writes, 1, "member {m}'s 4 chunks in one command");
                for k in (m as u64..8).step_by(2) {
                    let want: Vec<u8> = (k * chunk..(k + 1) * chunk).map(|i| byte(m, i)).collect();
                    assert!(mock.backing(k / 2 * 32, 32) == want, "chunk {k} on member {m}");
                }
                mock.host_write(0, &vec![0; 1 << 20]);
            }
            assert_eq!(vol.rw(false, Lease::new(&buf).unwrap(), 0, 0, 1 << 20).unwrap(), 1 << 20);
            for (m, mock) in mocks.iter().enumerate() {
                assert_eq!(mock.stats().reads, 1, "member {m}'s 4 chunks in one command");
                for k in (m as u64..8).step_by(2) {
                    let want: Vec<u8> = (k * chunk..(k + 1) * chunk).map(|i| byte(m, i)).collect();
                    assert!(mock.host_read((k * chunk) as usize, chunk as usize) == want, "chunk {k} on member {m}");
                }
            }
        }
    }

    /// A failed command that gathered a member's chunks fails the request, naming the member and
    /// the offset where that command starts on it.
    #[test]
    fn a_failed_gathered_command_names_its_member_and_where_it_starts() {
        use crate::mock::{Behaviour, Fault, MockConfig};
        let failing = MockConfig { behaviour: Behaviour::Script(vec![Fault::Status(0x281)]), ..Default::default() };
        let (vol, mocks, buf) = two_members([MockConfig::default(), failing], 128 << 10);
        // Chunks 1, 3, 5 and 7 are member 1's first 512 KiB: one command, which fails.
        match vol.rw(false, Lease::new(&buf).unwrap(), 0, 0, 1 << 20).map_err(|f| f.into_parts().0) {
            Err(Error::Member { member, offset, source }) => {
                assert_eq!((member.as_str(), offset), ("m1", 0));
                assert!(matches!(*source, Error::Nvme { .. }), "{source:?}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(mocks.iter().map(|m| m.stats().reads).collect::<Vec<_>>(), [1, 1], "one command per member");
    }

    /// On a one-member volume a request over several chunks is one run on the member: it goes
    /// out in as few commands as the member's largest command allows, as on the node itself.
    #[test]
    fn a_one_member_request_over_chunks_takes_as_few_commands_as_the_node() {
        use crate::device::mock_device::{mock_device, mock_volume_buffer};
        use crate::mock::MockConfig;
        use std::time::Duration;
        let chunk = 64 << 10;
        let (dev, mock) = mock_device(MockConfig::default(), Duration::from_secs(5)).unwrap();
        let members = vec![DirectPath { ns: dev.namespace(1).unwrap(), dev }];
        let st = crate::Storage::direct(&members[0].dev, 1).unwrap();
        let buf = mock_volume_buffer(&st, &[(&members[0].dev, &mock)]).unwrap();
        let member_bytes = members[0].ns.capacity();
        let vol = VolumePath { members, names: vec!["m0".into()], chunk, member_bytes, block_size: 4096 };
        // 4 chunks, one command of 256 KiB (the model's largest is 1 MiB).
        assert_eq!(vol.rw(false, Lease::new(&buf).unwrap(), 0, 0, 4 * chunk).unwrap(), 4 * chunk);
        assert_eq!(mock.stats().reads, 1);
    }

    #[test]
    fn md_raid0_layout() {
        // 3 members, 64 KiB chunks: chunk 4 is member 1's second chunk.
        let p: Vec<_> = pieces(3, 65536, 4 * 65536 + 512, 65536).collect();
        assert_eq!(
            p,
            vec![
                Piece { member: 1, member_offset: 65536 + 512, request_offset: 0, len: 65536 - 512 },
                Piece { member: 2, member_offset: 65536, request_offset: 65536 - 512, len: 512 },
            ]
        );
    }

    #[test]
    fn specs_parse_and_refuse_by_name() {
        let s = VolumeSpec::parse("stripe:64K:/dev/ugds_drv0,/dev/ugds_drv1").unwrap();
        assert_eq!((s.chunk, s.members.len()), (65536, 2));
        assert_eq!(VolumeSpec::parse("stripe:/dev/a,/dev/b").unwrap().chunk, DEFAULT_CHUNK);
        let e = |s: &str| match VolumeSpec::parse(s) {
            Err(Error::InvalidArgument { arg, .. }) => arg,
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(e("stripe:3000:/dev/a"), "chunk");
        assert_eq!(e("stripe:1K:/dev/a"), "chunk");
        assert_eq!(VolumeSpec::parse("stripe:1m:/dev/a").unwrap().chunk, 1 << 20);
        // An unparsable chunk is named, with the size parser's reason.
        let reason = |s: &str| match VolumeSpec::parse(s) {
            Err(Error::InvalidArgument { arg: "chunk", reason }) => reason,
            other => panic!("{s}: {other:?}"),
        };
        assert!(reason("stripe:12Q:/dev/a").contains("bad size \"12Q\""));
        assert!(reason("stripe:99999999999999G:/dev/a").contains("overflows"));
        assert_eq!(e("stripe:"), "volume");
        assert_eq!(e("stripe:/dev/a,/dev/a"), "volume");
        assert_eq!(e("/dev/a"), "volume");
    }

    #[test]
    fn descriptor_files_round_trip_and_refuse_by_name() {
        let dir = std::env::temp_dir().join(format!("ugds-vol-desc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = VolumeSpec::parse("stripe:256K:/dev/ugds_drv0,/dev/ugds_drv1").unwrap();
        let good = dir.join("good");
        std::fs::write(&good, spec.descriptor()).unwrap();
        assert_eq!(VolumeSpec::read_descriptor(&good).unwrap(), spec);
        // Comments and blank lines are ignored.
        std::fs::write(&good, format!("{DESCRIPTOR_MAGIC}\n\n# two SSDs\n  {}  \n", spec.to_spec_string())).unwrap();
        assert_eq!(VolumeSpec::read_descriptor(&good).unwrap(), spec);
        let refused = |p: &std::path::Path, why: &str| match VolumeSpec::read_descriptor(p) {
            Err(Error::InvalidArgument { arg: "volume", reason }) => {
                assert!(reason.contains(why), "{}: {reason}", p.display())
            }
            other => panic!("{}: {other:?}", p.display()),
        };
        // Writable by others: refused, whatever it says.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o666)).unwrap();
        refused(&good, "writable by its owner only");
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(VolumeSpec::read_descriptor(&good).is_ok());
        // Not descriptors: other text, a large file, a directory, a missing path.
        let other = dir.join("other");
        std::fs::write(&other, "stripe:/dev/ugds_drv0\n").unwrap();
        refused(&other, "first line");
        std::fs::write(&other, format!("{DESCRIPTOR_MAGIC}\n{}", "x".repeat(5000))).unwrap();
        refused(&other, "bytes");
        refused(&dir, "not a regular file");
        assert!(matches!(VolumeSpec::read_descriptor(dir.join("missing")), Err(Error::Open { .. })));
        // Descriptors that do not parse: named errors.
        for bad in ["", "stripe:/dev/a\nstripe:/dev/b\n", "stripe:3000:/dev/a\n"] {
            std::fs::write(&other, format!("{DESCRIPTOR_MAGIC}\n{bad}")).unwrap();
            assert!(matches!(VolumeSpec::read_descriptor(&other), Err(Error::InvalidArgument { .. })), "{bad:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_a_descriptor_name_makes_a_target_a_volume() {
        let dir = std::env::temp_dir().join(format!("ugds-vol-name-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = VolumeSpec::parse("stripe:/dev/ugds_drv0,/dev/ugds_drv1").unwrap();
        // The same bytes under a plain name: ordinary data.
        let plain = dir.join("cache-block");
        std::fs::write(&plain, spec.descriptor()).unwrap();
        assert_eq!(VolumeSpec::descriptor_target(&plain, &plain).unwrap(), None);
        let named = dir.join(format!("vol0{DESCRIPTOR_SUFFIX}"));
        std::fs::write(&named, spec.descriptor()).unwrap();
        assert_eq!(VolumeSpec::descriptor_target(&named, &named).unwrap(), Some(spec.clone()));
        // Read through another path of the same file (what the C faces do through /proc).
        assert_eq!(VolumeSpec::descriptor_target(&named, &plain).unwrap(), Some(spec));
        // A descriptor's name on something else: an error, never the file's bytes.
        let wrong = dir.join(format!("data{DESCRIPTOR_SUFFIX}"));
        std::fs::write(&wrong, "not a descriptor\n").unwrap();
        assert!(matches!(VolumeSpec::descriptor_target(&wrong, &wrong), Err(Error::InvalidArgument { .. })));
        assert!(!VolumeSpec::is_descriptor_name(DESCRIPTOR_SUFFIX));
        assert!(!VolumeSpec::is_descriptor_name(format!("/x{DESCRIPTOR_SUFFIX}/y")));
        assert!(!VolumeSpec::is_descriptor_name("stripe:/dev/ugds_drv0"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest! {
        /// The pieces tile the request exactly, never cross a chunk, and map each volume byte
        /// to member `chunk mod N` at `(chunk div N) * C + within` (md RAID0, one zone).
        #[test]
        fn pieces_tile_the_request(n in 1usize..8, shift in 12u32..20, off in 0u64..(1 << 26), len in 1u64..(1 << 24)) {
            let c = 1u64 << shift;
            let mut at = 0;
            for p in pieces(n, c, off, len) {
                prop_assert_eq!(p.request_offset, at);
                prop_assert!(p.len > 0 && p.len <= c);
                let pos = off + at;
                prop_assert_eq!(p.member as u64, (pos / c) % n as u64);
                prop_assert_eq!(p.member_offset, (pos / c) / n as u64 * c + pos % c);
                prop_assert!((p.member_offset % c) + p.len <= c, "a piece crosses a chunk");
                at += p.len;
            }
            prop_assert_eq!(at, len);
        }
    }
}

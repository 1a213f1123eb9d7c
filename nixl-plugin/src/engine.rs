//! The backend's state and transfers, in safe Rust over plain values: registrations of memory
//! (DRAM, VRAM) and of targets (FILE, BLK descriptors resolved by the library's one target
//! resolver, `Storage::open_with`), and prepared transfers (one batch per target). `ffi.rs`
//! translates NIXL's calls to the calls here and the results back to NIXL's status codes.

use crate::options::{QueueMode, Settings};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use ugds::{Buffer, Error, Gpu, GpuMemory, IoRequest, IoStatus, Op, Storage, StorageBatch};

/// NIXL's memory segment types (`nixl_mem_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seg {
    /// Host memory.
    Dram,
    /// GPU memory.
    Vram,
    /// A block device (addr: byte offset on it).
    Blk,
    /// An object store (not supported).
    Obj,
    /// A file (devId: its descriptor; addr: byte offset in it).
    File,
}

impl Seg {
    /// From NIXL's value.
    pub fn from_raw(v: i32) -> Option<Seg> {
        Some(match v {
            0 => Seg::Dram,
            1 => Seg::Vram,
            2 => Seg::Blk,
            3 => Seg::Obj,
            4 => Seg::File,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Seg::Dram => "DRAM",
            Seg::Vram => "VRAM",
            Seg::Blk => "BLK",
            Seg::Obj => "OBJ",
            Seg::File => "FILE",
        }
    }
}

/// What a failed call answers NIXL: its status code and the named cause (logged by `ffi.rs`).
#[derive(Debug)]
pub struct Fail {
    /// NIXL's status code (negative).
    pub status: i32,
    /// Why, in words.
    pub cause: String,
}

/// NIXL's status codes that the backend returns.
pub mod status {
    /// Done.
    pub const SUCCESS: i32 = 0;
    /// Still running.
    pub const IN_PROG: i32 = 1;
    /// A bad argument.
    pub const INVALID_PARAM: i32 = -2;
    /// The backend failed.
    pub const BACKEND: i32 = -3;
    /// Not found (a target that does not exist, a descriptor without registration).
    pub const NOT_FOUND: i32 = -4;
    /// Descriptor lists that do not match.
    pub const MISMATCH: i32 = -5;
    /// Not allowed now (deregistering memory that I/O uses).
    pub const NOT_ALLOWED: i32 = -6;
    /// Posting a transfer that still runs.
    pub const REPOST_ACTIVE: i32 = -7;
    /// Not supported (a memory type, a remote agent).
    pub const NOT_SUPPORTED: i32 = -9;
}

impl Fail {
    fn new(status: i32, cause: impl Into<String>) -> Fail {
        Fail { status, cause: cause.into() }
    }

    /// A library error, mapped to the nearest status.
    fn lib(what: &str, e: &Error) -> Fail {
        let status = match e {
            Error::InvalidArgument { .. } => status::INVALID_PARAM,
            Error::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound => status::NOT_FOUND,
            Error::NotUgdsNode { .. } | Error::Unsupported { .. } => status::NOT_SUPPORTED,
            _ => status::BACKEND,
        };
        Fail::new(status, format!("{what}: {e}"))
    }
}

/// Result of the backend's calls.
pub type Res<T> = Result<T, Fail>;

/// Registered memory: DRAM or VRAM. Registered with a target's storage the first time a
/// transfer names both (a ugds registration belongs to one storage).
pub struct MemReg {
    id: u64,
    seg: Seg,
    addr: u64,
    len: u64,
    /// Host memory: the page-aligned span that holds `[addr, addr + len)`.
    base: u64,
    span: usize,
    /// GPU memory: the caller's allocation, borrowed.
    gpu: Option<Arc<GpuMemory>>,
}

/// A registered target (a FILE or BLK descriptor).
pub struct TargetReg {
    id: u64,
    /// What it was resolved to (a path, a `stripe:` spec, a URI).
    name: String,
    storage: Arc<Storage>,
}

impl TargetReg {
    /// What queryMem reports: the target, the path its I/O takes (`direct`, `remote`,
    /// `fallback`, and in words), its capacity and block size.
    pub fn facts(&self) -> Vec<(String, String)> {
        let s = &self.storage;
        let mut v = vec![
            ("target".to_string(), self.name.clone()),
            ("path".to_string(), s.path_name().to_string()),
            ("describe".to_string(), s.describe()),
            ("block_size".to_string(), s.block_size().to_string()),
        ];
        if let Ok(c) = s.capacity() {
            v.push(("capacity".to_string(), c.to_string()));
        }
        v
    }
}

/// A registration, as NIXL holds it (behind its metadata pointer).
pub enum Reg {
    /// DRAM or VRAM.
    Mem(MemReg),
    /// FILE or BLK.
    Target(TargetReg),
}

/// The engine (one per `create_backend`).
pub struct Engine {
    settings: Settings,
    next_id: AtomicU64,
    /// Open targets by resolved name, so that two registrations of one target share it.
    targets: Mutex<HashMap<String, Weak<Storage>>>,
    /// Memory registered with a target's storage: by (memory id, target id).
    bufs: Mutex<HashMap<(u64, u64), Arc<Buffer>>>,
}

/// The target a FILE or BLK descriptor names: `metaInfo` in NIXL's path mode
/// (`MODES:TARGET`, MODES `ro` or `rw` with optional `,direct`, `,sync`, `,noatime`, `,create`),
/// else (BLK only) a non-empty `metaInfo` itself, else the file descriptor `devId`, whose path
/// `/proc/self/fd` tells. Returns the target and whether `create` was asked for.
pub fn resolve(seg: Seg, dev_id: u64, meta: &str) -> Res<(String, bool)> {
    if let Some((modes, rest)) = meta.split_once(':') {
        let mut it = modes.split(',');
        if matches!(it.next(), Some("ro" | "rw")) {
            let mut create = false;
            for f in it {
                match f {
                    "direct" | "sync" | "noatime" => {}
                    "create" => create = true,
                    other => {
                        return Err(Fail::new(
                            status::INVALID_PARAM,
                            format!(
                                "metaInfo {meta:?}: {other:?} is no path-mode flag (direct, sync, noatime, create)"
                            ),
                        ))
                    }
                }
            }
            if rest.is_empty() {
                return Err(Fail::new(status::INVALID_PARAM, format!("metaInfo {meta:?} names no target")));
            }
            return Ok((rest.to_string(), create));
        }
    }
    if seg == Seg::Blk && !meta.is_empty() {
        return Ok((meta.to_string(), false));
    }
    let fd = i32::try_from(dev_id)
        .map_err(|_| Fail::new(status::INVALID_PARAM, format!("devId {dev_id} is no file descriptor")))?;
    let link = format!("/proc/self/fd/{fd}");
    let path = std::fs::read_link(&link).map_err(|e| {
        Fail::new(status::NOT_FOUND, format!("devId {fd} is no open file descriptor of this process ({link}: {e})"))
    })?;
    let path = path
        .to_str()
        .ok_or_else(|| Fail::new(status::INVALID_PARAM, format!("fd {fd}: its path is not UTF-8")))?
        .to_string();
    if !path.starts_with('/') || path.ends_with(" (deleted)") {
        return Err(Fail::new(
            status::NOT_SUPPORTED,
            format!("fd {fd} is {path}: not a file, block device or ugds node that can be opened by its path"),
        ));
    }
    Ok((path, false))
}

impl Engine {
    /// An engine with `settings`.
    pub fn new(settings: Settings) -> Engine {
        Engine { settings, next_id: AtomicU64::new(1), targets: Mutex::default(), bufs: Mutex::default() }
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Opens `name` (or shares the engine's open storage of it).
    fn open(&self, name: &str, create: bool) -> Res<Arc<Storage>> {
        let mut map = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(name).and_then(Weak::upgrade) {
            return Ok(s);
        }
        let p = std::path::Path::new(name);
        if create && !name.starts_with("/dev/") && !p.exists() {
            std::fs::File::options()
                .write(true)
                .create_new(true)
                .open(p)
                .map_err(|e| Fail::new(status::BACKEND, format!("creating {name}: {e}")))?;
        }
        let s = Storage::open_with(name, self.settings.nsid, &self.settings.device)
            .map_err(|e| Fail::lib(&format!("opening {name}"), &e))?;
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(name.to_string(), Arc::downgrade(&s));
        Ok(s)
    }

    /// registerMem.
    pub fn register(&self, seg: Seg, addr: u64, len: u64, dev_id: u64, meta: &str) -> Res<Reg> {
        match seg {
            Seg::Dram => {
                if addr == 0 || len == 0 {
                    return Err(Fail::new(status::INVALID_PARAM, "DRAM: a null or empty range"));
                }
                let end = addr
                    .checked_add(len)
                    .and_then(|e| e.checked_next_multiple_of(4096))
                    .ok_or_else(|| Fail::new(status::INVALID_PARAM, "DRAM: the range overflows"))?;
                let base = addr & !4095;
                let span = usize::try_from(end - base)
                    .map_err(|_| Fail::new(status::INVALID_PARAM, "DRAM: the range is larger than memory"))?;
                Ok(Reg::Mem(MemReg { id: self.id(), seg, addr, len, base, span, gpu: None }))
            }
            Seg::Vram => {
                let gpu = Gpu::of_pointer(addr).map_err(|e| Fail::lib(&format!("VRAM at {addr:#x}"), &e))?.ok_or_else(
                    || Fail::new(status::INVALID_PARAM, format!("VRAM at {addr:#x} is no GPU memory (CUDA or HIP)")),
                )?;
                let n = usize::try_from(len).map_err(|_| Fail::new(status::INVALID_PARAM, "VRAM: too long"))?;
                // SAFETY: NIXL's contract for registered memory: it stays allocated until
                // deregisterMem, and this registration (with every buffer made of it) is
                // dropped there, or by a transfer holding it, before NIXL's caller may free it.
                let mem = unsafe { gpu.borrow(addr, n) }.map_err(|e| Fail::lib("VRAM", &e))?;
                Ok(Reg::Mem(MemReg { id: self.id(), seg, addr, len, base: addr, span: n, gpu: Some(Arc::new(mem)) }))
            }
            Seg::File | Seg::Blk => {
                let (name, create) = resolve(seg, dev_id, meta)?;
                let storage = self.open(&name, create)?;
                log::info!("{} devId {dev_id}: {name}: {}", seg.name(), storage.describe());
                Ok(Reg::Target(TargetReg { id: self.id(), name, storage }))
            }
            Seg::Obj => Err(Fail::new(status::NOT_SUPPORTED, "OBJ: object stores are not a ugds target")),
        }
    }

    /// deregisterMem: refused while I/O on the memory or target runs.
    pub fn deregister(&self, reg: &Reg) -> Res<()> {
        let (id, mem) = match reg {
            Reg::Mem(m) => (m.id, true),
            Reg::Target(t) => (t.id, false),
        };
        let mut bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        let mine = |k: &(u64, u64)| if mem { k.0 == id } else { k.1 == id };
        if bufs.iter().any(|(k, b)| mine(k) && b.inflight() > 0) {
            return Err(Fail::new(status::NOT_ALLOWED, "deregistering a registration that I/O in flight uses"));
        }
        bufs.retain(|k, _| !mine(k));
        Ok(())
    }

    /// `mem` registered with `t`'s storage (made on first use).
    fn buffer(&self, mem: &MemReg, t: &TargetReg) -> Res<Arc<Buffer>> {
        let mut bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = bufs.get(&(mem.id, t.id)) {
            return Ok(b.clone());
        }
        let b = match &mem.gpu {
            Some(g) => t.storage.register_gpu(g.clone(), self.settings.gpu_staging),
            // SAFETY: NIXL's contract for registered memory: `[addr, addr + len)` stays mapped
            // until deregisterMem (the span around it lies on the same pages, so it is mapped
            // too); the buffer is dropped there (deregistration is refused while I/O runs).
            // NIXL's caller does not touch memory a transfer on it is moving.
            None => unsafe { t.storage.register_host(mem.base as *mut u8, mem.span) },
        }
        .map_err(|e| Fail::lib(&format!("registering {} for {}", mem.seg.name(), t.name), &e))?;
        log::info!("{} at {:#x} ({} bytes) registered for {}: {}", mem.seg.name(), mem.addr, mem.len, t.name, b.path());
        let b = Arc::new(b);
        bufs.insert((mem.id, t.id), b.clone());
        Ok(b)
    }

    /// prepXfer: checks every descriptor pair and builds the transfer.
    pub fn prep(&self, op: Op, local: &[(&MemReg, u64, u64)], remote: &[(&TargetReg, u64, u64)]) -> Res<Xfer> {
        if local.len() != remote.len() {
            return Err(Fail::new(
                status::MISMATCH,
                format!("{} local descriptors against {} remote ones", local.len(), remote.len()),
            ));
        }
        if local.is_empty() {
            return Err(Fail::new(status::INVALID_PARAM, "an empty transfer"));
        }
        let mut groups: Vec<Group> = Vec::new();
        for (i, (&(m, addr, len), &(t, off, tlen))) in local.iter().zip(remote).enumerate() {
            if len != tlen {
                return Err(Fail::new(
                    status::MISMATCH,
                    format!("descriptor {i}: {len} bytes of {} against {tlen} bytes of {}", m.seg.name(), t.name),
                ));
            }
            if addr < m.addr || addr.checked_add(len).is_none_or(|e| e > m.addr + m.len) {
                return Err(Fail::new(
                    status::INVALID_PARAM,
                    format!("descriptor {i}: {len} bytes at {addr:#x} lie outside their registration"),
                ));
            }
            t.storage.check_range(off, len).map_err(|e| Fail::lib(&format!("descriptor {i}: {}", t.name), &e))?;
            if op == Op::Read {
                let cap = t.storage.capacity().map_err(|e| Fail::lib(&t.name, &e))?;
                if off.checked_add(len).is_none_or(|e| e > cap) {
                    return Err(Fail::new(
                        status::INVALID_PARAM,
                        format!("descriptor {i}: reading {len} bytes at {off} of {}, which holds {cap}", t.name),
                    ));
                }
            }
            let buf = self.buffer(m, t)?;
            let req = IoRequest { op, buf, buf_offset: addr - m.base, file_offset: off, len, cookie: i as u64 };
            match groups.iter_mut().find(|g| g.target_id == t.id) {
                Some(g) => g.reqs.push(req),
                None => groups.push(Group {
                    target_id: t.id,
                    name: t.name.clone(),
                    storage: t.storage.clone(),
                    batch: None,
                    reqs: vec![req],
                    next: 0,
                    done: 0,
                }),
            }
        }
        for g in &groups {
            log::debug!("transfer of {} descriptors on {}: {} path", g.reqs.len(), g.name, g.storage.path_name());
        }
        Ok(Xfer { queue: self.settings.queue, depth: self.settings.depth, groups, failed: None, posted: false })
    }
}

/// A transfer's descriptors on one target.
struct Group {
    target_id: u64,
    name: String,
    storage: Arc<Storage>,
    /// Made at the first post.
    batch: Option<StorageBatch>,
    reqs: Vec<IoRequest>,
    /// The next to submit.
    next: usize,
    /// Finished (either way) since the last post.
    done: usize,
}

/// A prepared transfer: posted (again) by `post`, polled by `check`.
pub struct Xfer {
    queue: QueueMode,
    depth: usize,
    groups: Vec<Group>,
    /// The first failure of the running post.
    failed: Option<String>,
    posted: bool,
}

impl Xfer {
    fn running(&self) -> bool {
        self.posted && self.groups.iter().any(|g| g.done < g.reqs.len())
    }

    /// postXfer: starts every descriptor (sync: runs them).
    pub fn post(&mut self) -> Res<i32> {
        if self.running() {
            return Err(Fail::new(status::REPOST_ACTIVE, "posting a transfer that is still running"));
        }
        self.failed = None;
        self.posted = true;
        for g in &mut self.groups {
            g.next = 0;
            g.done = 0;
        }
        if self.queue == QueueMode::Sync {
            let mut failed = None;
            'all: for g in &mut self.groups {
                for r in &g.reqs {
                    let res = match r.op {
                        Op::Write => g.storage.write(&r.buf, r.buf_offset, r.file_offset, r.len),
                        _ => g.storage.read(&r.buf, r.buf_offset, r.file_offset, r.len),
                    };
                    if let Err(msg) = outcome(&g.name, r, res.map(|n| (IoStatus::Complete, n)), None) {
                        failed = Some(msg);
                        break 'all;
                    }
                }
            }
            // Nothing runs after a synchronous post: done, one way or the other.
            for g in &mut self.groups {
                g.done = g.reqs.len();
            }
            return match failed {
                Some(msg) => {
                    self.failed = Some(msg.clone());
                    Err(Fail::new(status::BACKEND, msg))
                }
                None => Ok(status::SUCCESS),
            };
        }
        for g in &mut self.groups {
            if g.batch.is_none() {
                let b = StorageBatch::new(&g.storage, self.depth.min(g.reqs.len()))
                    .map_err(|e| Fail::lib(&format!("a batch on {}", g.name), &e))?;
                g.batch = Some(b);
            }
        }
        self.top_up()?;
        Ok(status::IN_PROG)
    }

    /// Submits what the batches have room for.
    fn top_up(&mut self) -> Res<()> {
        for g in &mut self.groups {
            let Some(b) = g.batch.as_mut() else { continue };
            let room = b.capacity().saturating_sub(b.in_flight());
            let end = (g.next + room).min(g.reqs.len());
            if end == g.next {
                continue;
            }
            if let Err(e) = b.submit(&g.reqs[g.next..end]) {
                // Nothing of this submission runs: count it finished, failed.
                let n = end - g.next;
                g.next = end;
                g.done += n;
                let msg = format!("{}: submitting {n} descriptors: {e}", g.name);
                self.failed.get_or_insert(msg);
                continue;
            }
            g.next = end;
        }
        Ok(())
    }

    /// checkXfer: reaps what finished, submits what waits; done, running, or the failure.
    pub fn check(&mut self) -> Res<i32> {
        if !self.posted {
            return Err(Fail::new(-1, "checking a transfer that was not posted"));
        }
        for g in &mut self.groups {
            let Some(b) = g.batch.as_mut() else { continue };
            if b.in_flight() == 0 && g.next == g.done {
                continue;
            }
            match b.status(0, Duration::ZERO) {
                Ok(evs) => {
                    for e in evs {
                        g.done += 1;
                        let Some(r) = usize::try_from(e.cookie).ok().and_then(|i| g.reqs.get(i)) else { continue };
                        if let Err(msg) = outcome(&g.name, r, Ok((e.status, e.bytes)), e.error.as_ref()) {
                            self.failed.get_or_insert(msg);
                        }
                    }
                }
                Err(e) => {
                    self.failed.get_or_insert(format!("{}: waiting for completions: {e}", g.name));
                }
            }
        }
        self.top_up()?;
        if self.running() {
            return Ok(status::IN_PROG);
        }
        // The failure stays until the next post: every check of a failed transfer says so.
        match &self.failed {
            Some(msg) => Err(Fail::new(status::BACKEND, msg.clone())),
            None => Ok(status::SUCCESS),
        }
    }

    /// releaseReqH: waits for what still runs (the SSD or the kernel cannot be recalled).
    pub fn release(mut self) -> Res<()> {
        let mut err = None;
        for g in &mut self.groups {
            if let Some(b) = g.batch.as_mut() {
                if b.in_flight() > 0 {
                    log::warn!(
                        "{}: releasing a transfer with {} descriptors running: waiting for them",
                        g.name,
                        b.in_flight()
                    );
                    if let Err(e) = b.cancel() {
                        err.get_or_insert(format!("{}: {e}", g.name));
                    }
                }
            }
        }
        match err {
            Some(msg) => Err(Fail::new(status::BACKEND, msg)),
            None => Ok(()),
        }
    }
}

/// Whether one descriptor's I/O moved all its bytes; the failure in words otherwise.
fn outcome(
    name: &str,
    r: &IoRequest,
    res: Result<(IoStatus, u64), Error>,
    error: Option<&Error>,
) -> Result<(), String> {
    let what = if r.op == Op::Write { "write" } else { "read" };
    let at = format!("{name}: {what} of {} bytes at {}", r.len, r.file_offset);
    match res {
        Ok((IoStatus::Complete, n)) if n == r.len => Ok(()),
        Ok((IoStatus::Complete, n)) => Err(format!("{at}: only {n} bytes moved")),
        Ok((s, _)) => Err(match error {
            Some(e) => format!("{at}: {s:?}: {e}"),
            None => format!("{at}: {s:?}"),
        }),
        Err(e) => Err(format!("{at}: {e}")),
    }
}

// NIXL may call the engine from several threads (its progress thread, the application's): what
// the C++ side holds must be shareable.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Engine>();
    shareable::<Reg>();
    shareable::<Mutex<Xfer>>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn path_mode_and_fds_resolve() {
        assert_eq!(resolve(Seg::File, 0, "rw:/dev/ugds_drv0").ok().map(|r| r.0), Some("/dev/ugds_drv0".into()));
        let (t, create) =
            resolve(Seg::File, 0, "rw,direct,create:stripe:64K:/dev/ugds_drv0,/dev/ugds_drv1").expect("path mode");
        assert_eq!((t.as_str(), create), ("stripe:64K:/dev/ugds_drv0,/dev/ugds_drv1", true));
        assert_eq!(resolve(Seg::File, 0, "rw,bogus:/x").err().map(|f| f.status), Some(status::INVALID_PARAM));
        assert_eq!(resolve(Seg::Blk, 0, "/dev/ugds_drv1").ok().map(|r| r.0), Some("/dev/ugds_drv1".into()));
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(b"x").expect("write");
        use std::os::fd::AsRawFd;
        let fd = f.as_file().as_raw_fd() as u64;
        // Any metaInfo that is not path mode leaves the fd in devId, as NIXL's own plugins do.
        let got = resolve(Seg::File, fd, "b").ok().map(|r| r.0);
        assert_eq!(got.as_deref().map(std::path::Path::new), Some(f.path()));
        assert_eq!(resolve(Seg::File, 1 << 40, "").err().map(|f| f.status), Some(status::INVALID_PARAM));
        assert_eq!(resolve(Seg::File, 987_654, "").err().map(|f| f.status), Some(status::NOT_FOUND));
    }

    #[test]
    fn write_then_read_a_file_through_a_batch() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.bin");
        std::fs::write(&path, vec![0u8; 1 << 16]).expect("file");
        let e = Engine::new(Settings { depth: 2, ..Settings::default() });
        let meta = format!("rw:{}", path.display());
        let Ok(Reg::Target(t)) = e.register(Seg::File, 0, 0, 0, &meta) else { panic!("file registers") };
        let mut src = vec![0u8; 3 * 4096 + 8192];
        let off = src.as_ptr() as u64 % 4096;
        let start = (4096 - off as usize) % 4096;
        for (i, b) in src.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let a = src.as_ptr() as u64 + start as u64;
        let Ok(Reg::Mem(m)) = e.register(Seg::Dram, a, 3 * 4096, 0, "") else { panic!("memory registers") };
        let descs: Vec<_> = (0..3u64).map(|i| (&m, a + i * 4096, 4096)).collect();
        let targets: Vec<_> = (0..3u64).map(|i| (&t, 8192 + i * 4096, 4096)).collect();
        let mut x = e.prep(Op::Write, &descs, &targets).expect("prep");
        assert_eq!(x.post().ok(), Some(status::IN_PROG));
        let mut n = 0;
        while x.check().ok() == Some(status::IN_PROG) {
            n += 1;
            assert!(n < 1_000_000, "the transfer never finished");
        }
        assert!(!x.running());
        x.release().expect("release");
        let data = std::fs::read(&path).expect("read back");
        assert_eq!(&data[8192..8192 + 3 * 4096], &src[start..start + 3 * 4096]);
        // Past the end of the file, on a read: refused before anything runs.
        let far = [(&t, 1 << 20, 4096)];
        assert_eq!(e.prep(Op::Read, &descs[..1], &far).err().map(|f| f.status), Some(status::INVALID_PARAM));
        let short = [(&m, a, 2048)];
        assert_eq!(e.prep(Op::Read, &short, &targets[..1]).err().map(|f| f.status), Some(status::MISMATCH));
        e.deregister(&Reg::Mem(m)).expect("deregister");
    }
}

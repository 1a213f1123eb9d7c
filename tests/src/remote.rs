//! The remote path (issue 18) against the kernel's own NVMe over Fabrics target: nvmet on
//! 127.0.0.1:4420 (TCP), its namespace backed by the emulated disk that the kernel's nvme
//! driver owns. Integrity both ways through the backing disk, a cross-check through the
//! kernel's own nvme-tcp initiator, and named errors for bad targets.

use crate::{direct_read, direct_write, ensure_that, sh, Test};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::{pattern, Buffer, Error, Rejection, Storage};

const V: &str = "remote";

/// One controller, owned by the kernel's nvme driver: the target's backing disk.
pub const NVME: &[&str] = &["size=64M,serial=remote0"];

/// The subsystem the target exports.
pub(crate) const NQN: &str = "nqn.2024-01.io.ugds:remote";
/// Its backing device.
pub(crate) const BACKING: &str = "/dev/nvme0n1";
pub(crate) const CONFIGFS: &str = "/sys/kernel/config/nvmet";

/// The remote tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "remote_integrity_both_ways_through_the_backing_disk", variant: V, run: integrity },
        Test {
            name: "remote_cross_check_with_the_kernel_nvme_tcp_initiator_and_open_its_namespace",
            variant: V,
            run: kernel_initiator,
        },
        Test { name: "remote_bad_targets_give_named_errors_quickly", variant: V, run: bad_targets },
        Test {
            name: "remote_port_removed_mid_stream_fails_by_name_then_reconnects_without_loss",
            variant: V,
            run: port_bounce,
        },
        Test { name: "remote_cli_info_read_write_take_the_uri", variant: V, run: cli },
        Test { name: "remote_ugds_nvmeof_handles_run_the_c_suite_on_our_initiator", variant: V, run: nvmeof_handles },
    ]
}

fn uri(nsid: u32) -> String {
    format!("nvmeof://tcp/127.0.0.1:4420/{NQN}?nsid={nsid}")
}

/// Loads a module of the guest kernel unless it is loaded: from the test kernel's build
/// (`$UGDS_KERNEL_BUILD`, by path `rel`), or for a stock kernel from its root's modules
/// (`$UGDS_MODULE_ROOT`, by `name` with its dependencies; built-in ones are a no-op).
pub(crate) fn insmod(rel: &str, name: &str) -> Result<()> {
    if Path::new(&format!("/sys/module/{name}")).exists() {
        return Ok(());
    }
    if let Ok(root) = std::env::var("UGDS_MODULE_ROOT") {
        return match sh(&format!("modprobe -d {root} {name}")) {
            Ok(_) => Ok(()),
            // A module this kernel does not have at all (7.3 folded crc32_generic into its crc
            // library): nothing to load. One it has but cannot load is an error.
            Err(_) if sh(&format!("modinfo -b {root} {name}")).is_err() => Ok(()),
            Err(e) => Err(e),
        };
    }
    let build = std::env::var("UGDS_KERNEL_BUILD").context("neither UGDS_KERNEL_BUILD nor UGDS_MODULE_ROOT is set")?;
    sh(&format!("insmod {build}/{rel}")).map(|_| ())
}

/// Brings up nvmet on 127.0.0.1:4420 exporting [`BACKING`] as namespace 1 of [`NQN`] to any
/// host (once per boot).
pub(crate) fn ensure_target() -> Result<()> {
    if Path::new(&format!("{CONFIGFS}/ports/1/subsystems/{NQN}")).exists() {
        return Ok(());
    }
    for (rel, name) in [
        ("crypto/crypto.ko", "crypto"),
        ("crypto/crypto_algapi.ko", "crypto_algapi"),
        ("crypto/crypto_hash.ko", "crypto_hash"),
        ("drivers/nvme/target/nvmet.ko", "nvmet"),
        ("drivers/nvme/target/nvmet-tcp.ko", "nvmet_tcp"),
    ] {
        insmod(rel, name)?;
    }
    sh("ip link set lo up")?;
    if !Path::new(CONFIGFS).exists() {
        sh("mount -t configfs none /sys/kernel/config")?;
    }
    let sub = format!("{CONFIGFS}/subsystems/{NQN}");
    sh(&format!(
        "mkdir -p {sub} && echo 1 > {sub}/attr_allow_any_host && mkdir -p {sub}/namespaces/1 && \
         echo {BACKING} > {sub}/namespaces/1/device_path && echo 1 > {sub}/namespaces/1/enable"
    ))?;
    let port = format!("{CONFIGFS}/ports/1");
    sh(&format!(
        "mkdir -p {port} && echo tcp > {port}/addr_trtype && echo ipv4 > {port}/addr_adrfam && \
         echo 127.0.0.1 > {port}/addr_traddr && echo 4420 > {port}/addr_trsvcid && \
         ln -s {sub} {port}/subsystems/{NQN}"
    ))?;
    Ok(())
}

/// (offset, len) pairs from 4 KiB to 8 MiB at odd 512-byte block offsets.
pub(crate) fn ranges() -> Vec<(u64, u64)> {
    vec![
        (512, 4096),
        (7 * 512, 12 << 10),
        (1001 * 512, 64 << 10),
        ((3 << 20) + 512, 1 << 20),
        ((9 << 20) + 3 * 512, 8 << 20),
    ]
}

fn integrity() -> Result<()> {
    ensure_target()?;
    let st = Storage::open(uri(1))?;
    ensure_that!(st.describe().contains("remote path"), "{}", st.describe());
    ensure_that!(
        st.capacity()? == 64 << 20 && st.block_size() == 512,
        "{} bytes in {}",
        st.capacity()?,
        st.block_size()
    );
    let buf = st.alloc_host(8 << 20)?;
    ensure_that!(buf.path() == ugds::Path::Remote, "took {}", buf.path());
    for (i, (off, len)) in ranges().into_iter().enumerate() {
        // Ours writes, the backing disk reads.
        let mut data = vec![0u8; len as usize];
        pattern::fill(100 + i as u64, off, &mut data);
        buf.copy_in(0, &data)?;
        st.write(&buf, 0, off, len)?;
        st.flush()?;
        let back = direct_read(BACKING, off, len as usize)?;
        if let Some(at) = pattern::first_mismatch(100 + i as u64, off, &back) {
            bail!("{len} bytes written at {off} through ugds: the backing disk differs at byte {at}");
        }
        // The backing disk writes, ours reads.
        pattern::fill(200 + i as u64, off, &mut data);
        direct_write(BACKING, off, &data)?;
        st.read(&buf, 0, off, len)?;
        let mut got = vec![0u8; len as usize];
        buf.copy_out(0, &mut got)?;
        if let Some(at) = pattern::first_mismatch(200 + i as u64, off, &got) {
            bail!("{len} bytes at {off} read through ugds differ from the backing disk at byte {at}");
        }
    }
    let c = st.path_counts();
    ensure_that!(c.remote == 10 && c.fallback == 0 && c.direct_host == 0, "{c:?}");
    Ok(())
}

/// Connects the kernel's `transport` initiator to `traddr`, waits for its namespace
/// `/dev/nvmeXn1` and checks the controller's transport, runs `f(dev)`, and disconnects the
/// kernel's controller whatever happened.
pub(crate) fn with_kernel_namespace(transport: &str, traddr: &str, f: impl FnOnce(&str) -> Result<()>) -> Result<()> {
    let ctrl = kernel_connect_to(transport, traddr)?;
    let dev = format!("/dev/{ctrl}n1");
    let r = (|| -> Result<()> {
        let t = Instant::now();
        while !Path::new(&dev).exists() {
            ensure_that!(t.elapsed() < Duration::from_secs(10), "{dev} did not appear");
            std::thread::sleep(Duration::from_millis(50));
        }
        let actual = std::fs::read_to_string(format!("/sys/class/nvme/{ctrl}/transport"))?;
        ensure_that!(actual.trim() == transport, "{ctrl} is {actual}");
        f(&dev)
    })();
    sh(&format!("echo 1 > /sys/class/nvme/{ctrl}/delete_controller"))?;
    r
}

/// Both hosts connected to the subsystem at once, each reads what the other wrote at `at`:
/// ugds through `uri` (pattern seeds `seed + i`), the kernel's `transport` initiator through `dev`
/// (seeds `seed + 100 + i`). Then `dev` itself opens our own controller on its subsystem (sysfs
/// says where; its description contains `path`) and reads the kernel's data at `at[0]`. Returns
/// that storage and a 4 KiB buffer of it.
pub(crate) fn cross_check(
    dev: &str,
    uri: &str,
    transport: &str,
    at: [(u64, u64); 2],
    seed: u64,
    path: &str,
) -> Result<(Arc<Storage>, Buffer)> {
    let st = Storage::open(uri)?;
    let buf = st.alloc_host(1 << 20)?;
    for (i, (off, len)) in at.into_iter().enumerate() {
        let (ours, theirs) = (seed + i as u64, seed + 100 + i as u64);
        let mut data = vec![0u8; len as usize];
        pattern::fill(ours, off, &mut data);
        buf.copy_in(0, &data)?;
        st.write(&buf, 0, off, len)?;
        let back = direct_read(dev, off, len as usize)?;
        if let Some(at) = pattern::first_mismatch(ours, off, &back) {
            bail!("written through ugds over {transport}, read through the kernel's nvme-{transport}: differs at byte {at} of {len}");
        }
        pattern::fill(theirs, off, &mut data);
        direct_write(dev, off, &data)?;
        st.read(&buf, 0, off, len)?;
        let mut got = vec![0u8; len as usize];
        buf.copy_out(0, &mut got)?;
        if let Some(at) = pattern::first_mismatch(theirs, off, &got) {
            bail!("written through the kernel's nvme-{transport}, read through ugds over {transport}: differs at byte {at} of {len}");
        }
    }
    let st2 = Storage::open(dev)?;
    ensure_that!(st2.describe().contains(path), "{dev} opened as {}", st2.describe());
    let buf2 = st2.alloc_host(4096)?;
    st2.read(&buf2, 0, at[0].0, 4096)?;
    let mut got = vec![0u8; 4096];
    buf2.copy_out(0, &mut got)?;
    ensure_that!(pattern::first_mismatch(seed + 100, at[0].0, &got).is_none(), "{dev} through sysfs read other data");
    ensure_that!(st2.path_counts().remote == 1, "{:?}", st2.path_counts());
    Ok((st2, buf2))
}

/// Connects the kernel's `transport` initiator (tcp, rdma) to [`NQN`] at `traddr`:4420
/// through /dev/nvme-fabrics; returns its controller name.
pub(crate) fn kernel_connect_to(transport: &str, traddr: &str) -> Result<String> {
    let (ko, module) = (format!("drivers/nvme/host/nvme-{transport}.ko"), format!("nvme_{transport}"));
    for (rel, name) in [
        ("crypto/crypto.ko", "crypto"),
        ("crypto/crypto_algapi.ko", "crypto_algapi"),
        ("crypto/crypto_hash.ko", "crypto_hash"),
        ("drivers/nvme/host/nvme-fabrics.ko", "nvme_fabrics"),
        (ko.as_str(), module.as_str()),
    ] {
        insmod(rel, name)?;
    }
    use std::io::{Read, Write};
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open("/dev/nvme-fabrics")?;
    f.write_all(format!("transport={transport},traddr={traddr},trsvcid=4420,nqn={NQN}").as_bytes())
        .with_context(|| format!("connecting the kernel's nvme-{transport} initiator"))?;
    let mut reply = String::new();
    f.read_to_string(&mut reply)?;
    // "instance=N,cntlid=M"
    let n = reply
        .split(',')
        .find_map(|kv| kv.trim().strip_prefix("instance="))
        .with_context(|| format!("unexpected reply {reply:?}"))?;
    Ok(format!("nvme{n}"))
}

fn kernel_initiator() -> Result<()> {
    ensure_target()?;
    with_kernel_namespace("tcp", "127.0.0.1", |dev| {
        cross_check(dev, &uri(1), "tcp", [(5 * 512, 4096), ((1 << 20) + 512, 1 << 20)], 300, "remote path").map(|_| ())
    })
}

fn bad_targets() -> Result<()> {
    ensure_target()?;
    let timed = |u: &str| {
        let t = Instant::now();
        let r = Storage::open(u).map(|_| ());
        (r, t.elapsed())
    };
    let (r, took) = timed("nvmeof://tcp/127.0.0.1:4420/nqn.2024-01.io.ugds:nope?nsid=1");
    match r {
        Err(Error::RemoteRejected { status: Rejection::Connect(status), .. }) if status.sc == 0x82 => {}
        other => bail!("a wrong NQN gave {other:?}"),
    }
    ensure_that!(took < Duration::from_secs(5), "the wrong NQN took {took:?}");
    // A subsystem on the port that allows no host (none is listed).
    let closed = "nqn.2024-01.io.ugds:closed";
    let sub = format!("{CONFIGFS}/subsystems/{closed}");
    if !Path::new(&sub).exists() {
        sh(&format!("mkdir {sub} && ln -s {sub} {CONFIGFS}/ports/1/subsystems/{closed}"))?;
    }
    let (r, took) = timed(&format!("nvmeof://tcp/127.0.0.1:4420/{closed}?nsid=1"));
    match r {
        Err(Error::RemoteRejected { status: Rejection::Connect(status), reason, .. })
            if status.sc == 0x84 && reason.contains("not allowed") => {}
        other => bail!("a host the subsystem does not allow got {other:?}"),
    }
    ensure_that!(took < Duration::from_secs(5), "the refused host took {took:?}");
    let (r, took) = timed(&format!("nvmeof://tcp/127.0.0.1:4421/{NQN}?nsid=1"));
    ensure_that!(matches!(r, Err(Error::RemoteUnreachable { .. })), "a closed port gave {r:?}");
    ensure_that!(took < Duration::from_secs(5), "the closed port took {took:?}");
    let (r, took) = timed(&uri(2));
    ensure_that!(matches!(r, Err(Error::NoNamespace(2))), "a missing namespace gave {r:?}");
    ensure_that!(took < Duration::from_secs(5), "the missing namespace took {took:?}");
    // An out-of-range request is refused before anything is sent.
    let st = Storage::open(uri(1))?;
    let buf = st.alloc_host(8192)?;
    ensure_that!(st.read(&buf, 0, (64 << 20) - 4096, 8192).is_err(), "a read past the end worked");
    Ok(())
}

fn port_bounce() -> Result<()> {
    ensure_target()?;
    bounce(&uri(1), 1)
}

/// Runs `work` on a thread of its own while nvmet port `port` loses the subsystem for 1.5 s
/// (from 0.7 s on: every connection closed, connects refused meanwhile) and gets it back; `after`
/// later the flag `work` is given turns true and `work`'s result is returned (or the first
/// error of taking the subsystem off and putting it back).
pub(crate) fn while_port_away<T: Send + 'static>(
    port: u32,
    after: Duration,
    work: impl FnOnce(&std::sync::atomic::AtomicBool) -> Result<T> + Send + 'static,
) -> Result<T> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let worker = std::thread::spawn(move || work(&flag));
    let link = format!("{CONFIGFS}/ports/{port}/subsystems/{NQN}");
    std::thread::sleep(Duration::from_millis(700));
    let removed = sh(&format!("rm {link}"));
    std::thread::sleep(Duration::from_millis(1500));
    let added = sh(&format!("ln -s {CONFIGFS}/subsystems/{NQN} {link}"));
    std::thread::sleep(after);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let out = worker.join().map_err(|_| anyhow::anyhow!("the worker panicked"))??;
    removed?;
    added?;
    Ok(out)
}

/// A writer streams 64 KiB writes to `uri` while nvmet port `port` loses and regains the
/// subsystem (every connection closed, connects refused meanwhile): the writes that meet the
/// loss fail by name, the rest succeed (after a reconnect), and every write reported done is on
/// the disk.
pub(crate) fn bounce(uri: &str, port: u32) -> Result<()> {
    let st = Storage::open(uri)?;
    let st2 = st.clone();
    const BASE: u64 = 16 << 20;
    const LEN: u64 = 64 << 10;
    let log = while_port_away(port, Duration::from_millis(1500), move |stop| {
        let buf = st2.alloc_host(LEN as usize)?;
        let mut log: Vec<(u64, Option<Error>, Duration)> = Vec::new();
        let mut k = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && k < 4000 {
            let off = BASE + (k % 256) * LEN;
            let mut data = vec![0u8; LEN as usize];
            pattern::fill(1000 + k, off, &mut data);
            buf.copy_in(0, &data)?;
            let t = Instant::now();
            let r = st2.write(&buf, 0, off, LEN);
            log.push((k, r.err(), t.elapsed()));
            k += 1;
        }
        Ok(log)
    })?;
    let failed: Vec<_> = log.iter().filter(|(_, e, _)| e.is_some()).collect();
    ensure_that!(!failed.is_empty(), "{} writes, none noticed the port going away", log.len());
    for (k, e, _) in &failed {
        let e = e.as_ref().context("filtered")?;
        ensure_that!(
            matches!(
                e,
                Error::RemoteTransport { .. }
                    | Error::RemoteProtocol { .. }
                    | Error::RemoteUnreachable { .. }
                    | Error::RemoteRejected { .. }
            ),
            "write {k} failed with an unnamed error: {e:?}"
        );
    }
    let slowest = log.iter().map(|(_, _, t)| *t).max().unwrap_or_default();
    ensure_that!(slowest < Duration::from_secs(12), "a write took {slowest:?}");
    if let Some((k, Some(e), t)) = log.last() {
        let kinds: std::collections::BTreeMap<String, usize> =
            failed.iter().fold(Default::default(), |mut m, (_, e, _)| {
                let s = format!("{e:?}");
                *m.entry(s.split([' ', '{']).next().unwrap_or("").to_string()).or_default() += 1;
                m
            });
        bail!(
            "the last write ({k} of {}) failed after {t:?}: no reconnect: {e}; failures by kind: {kinds:?}; {}",
            log.len(),
            st.describe()
        );
    }
    ensure_that!(!st.describe().contains("reconnected 0 times"), "{}", st.describe());
    // Every write reported done is on the disk (the latest write of each offset wins).
    let mut latest = std::collections::BTreeMap::new();
    for (k, e, _) in &log {
        let off = BASE + (k % 256) * LEN;
        latest.insert(off, (*k, e.is_none()));
    }
    let mut checked = 0;
    for (off, (k, ok)) in latest {
        if !ok {
            continue;
        }
        let back = direct_read(BACKING, off, LEN as usize)?;
        ensure_that!(pattern::first_mismatch(1000 + k, off, &back).is_none(), "write {k} at {off} is not on the disk");
        checked += 1;
    }
    eprintln!(
        "port bounce: {} writes, {} failed by name, {checked} offsets checked on the disk; {}",
        log.len(),
        failed.len(),
        st.describe()
    );
    Ok(())
}

fn cli() -> Result<()> {
    ensure_target()?;
    let bin = std::env::var("UGDS_CLI").context("UGDS_CLI is not set")?;
    let info = sh(&format!("{bin} info '{}'", uri(1)))?;
    ensure_that!(info.contains("remote path"), "info said: {info}");
    let u = uri(1);
    sh(&format!("{bin} write '{u}' --offset 1M --len 1M --pattern 77"))?;
    sh(&format!("{bin} read '{u}' --offset 1M --len 1M --check-pattern 77"))?;
    let back = direct_read(BACKING, 1 << 20, 1 << 20)?;
    ensure_that!(pattern::first_mismatch(77, 1 << 20, &back).is_none(), "the CLI's write is not on the backing disk");
    ensure_that!(
        sh(&format!("{bin} read '{u}' --offset 1M --len 1M --check-pattern 78")).is_err(),
        "a pattern check with the wrong seed passed"
    );
    let bench = sh(&format!("{bin} bench '{u}' --rw randread --bs 4K --runtime 1 --size 32M"))?;
    ensure_that!(bench.contains("IOPS"), "bench said: {bench}");
    let json = sh(&format!("{bin} --json info '{u}'"))?;
    ensure_that!(json.contains(r#""path":"remote""#), "info --json said: {json}");
    let json = sh(&format!("{bin} --json bench '{u}' --rw randwrite --bs 4K --runtime 1 --size 32M"))?;
    ensure_that!(json.contains(r#""path":"remote""#) && !json.contains(r#""remote":0"#), "bench --json said: {json}");
    Ok(())
}

/// uGDS's NVMe-oF registration (`uGDSHandleRegisterNvmeof[Ex]`) on the kernel nvme-tcp
/// initiator's namespace: the handle is our own controller on the subsystem (not the kernel's
/// block device), the C ABI suite passes through it, and any other descriptor is refused.
fn nvmeof_handles() -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    use ugds::capi::{Face, Library};
    let bin = std::env::var("UGDS_C_SUITE").context("UGDS_C_SUITE is not set (run through cargo xtask test)")?;
    ensure_target()?;
    with_kernel_namespace("tcp", "127.0.0.1", |dev| {
        let lib: &'static Library = Box::leak(Box::new(Library::new(Face::Ugds)));
        lib.driver_open().map_err(|e| anyhow::anyhow!("driver open: {e:?}"))?;
        let f = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(dev)?;
        let h =
            lib.handle_register_nvmeof(f.as_raw_fd()).map_err(|e| anyhow::anyhow!("NVMe-oF handle on {dev}: {e:?}"))?;
        let how = lib.handle(h).map(|x| x.storage.describe()).unwrap_or_default();
        ensure_that!(how.contains("remote path"), "the NVMe-oF handle on {dev} is {how}");
        lib.handle_deregister(h, -1).map_err(|e| anyhow::anyhow!("deregister: {e:?}"))?;
        // A plain registration resolves the descriptor as every face resolves a name: the same
        // namespace takes our own initiator too, not the kernel's block device.
        let h = lib.handle_register(f.as_raw_fd()).map_err(|e| anyhow::anyhow!("handle on {dev}: {e:?}"))?;
        let how = lib.handle(h).map(|x| x.storage.describe()).unwrap_or_default();
        ensure_that!(how.contains("remote path"), "a plain handle on {dev} is {how}");
        lib.handle_deregister(h, -1).map_err(|e| anyhow::anyhow!("deregister: {e:?}"))?;
        // The backing disk is a PCIe namespace of the kernel's driver: not NVMe-oF.
        let pcie = std::fs::File::open(BACKING)?;
        let e = lib.handle_register_nvmeof(pcie.as_raw_fd()).map(|_| ()).unwrap_err();
        ensure_that!(format!("{e:?}").contains("UGDS_INVALID_FILE_TYPE"), "{BACKING} as NVMe-oF: {e:?}");
        // uGDS's C suite through NVMe-oF handles; it prepares and checks its ranges itself.
        let out = std::process::Command::new(&bin).arg(dev).env("UGDS_TEST_NVMEOF", "1").output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        for l in text.lines().filter(|l| l.starts_with("not ok")) {
            println!("    {l}");
        }
        let last = text.lines().last().unwrap_or("");
        println!("    {last}");
        ensure_that!(out.status.success() && last.contains("failed=0"), "C suite on {dev}: {last} {stderr}");
        // The library notes (on stderr) when it falls back to the kernel's block device.
        ensure_that!(!stderr.contains("using the kernel"), "the C suite's handles fell back: {stderr}");
        Ok(())
    })
}

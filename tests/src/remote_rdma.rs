//! The remote path's NVMe/RDMA transport (issue 18) against the kernel's nvmet over soft-RoCE:
//! `rdma_rxe` on a dummy Ethernet interface (10.77.0.1), nvmet port 2 with `addr_trtype rdma`
//! exporting the same subsystem and backing disk as the TCP tests (variant `remote`).
//! Integrity both ways through the backing disk, a cross-check through the kernel's own
//! nvme-rdma initiator, udmabuf memory offered to the NIC as a dma-buf, the port removed and
//! re-added mid-stream, and named errors for bad targets.

use crate::remote::{
    bounce, cross_check, ensure_target, insmod, ranges, while_port_away, with_kernel_namespace, BACKING, CONFIGFS, NQN,
};
use crate::{direct_read, direct_write, ensure_that, sh, Test};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::{pattern, Error, Gpu, IoRequest, IoStatus, Op, Rejection, Storage, StorageBatch};

const V: &str = "remote";
/// The address of the dummy interface the soft-RoCE device sits on.
const ADDR: &str = "10.77.0.1";
/// The nvmet port (port 1 is TCP).
const PORT: u32 = 2;

/// The RDMA tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "remote_rdma_integrity_both_ways_through_the_backing_disk", variant: V, run: integrity },
        Test {
            name: "remote_rdma_cross_check_with_the_kernel_nvme_rdma_initiator_and_open_its_namespace",
            variant: V,
            run: kernel_initiator,
        },
        Test { name: "remote_rdma_udmabuf_dmabuf_registration_refused_by_name_data_staged", variant: V, run: udmabuf },
        Test { name: "remote_rdma_bad_targets_give_named_errors_quickly", variant: V, run: bad_targets },
        Test { name: "remote_rdma_per_io_registration_cost_against_the_io", variant: V, run: registration_cost },
        Test {
            name: "remote_rdma_port_removed_mid_stream_fails_by_name_then_reconnects_without_loss",
            variant: V,
            run: port_bounce,
        },
        Test {
            name: "remote_rdma_batch_keeps_its_entries_in_flight_on_queues_of_its_own_both_ways",
            variant: V,
            run: batch_in_flight,
        },
        Test {
            name: "remote_rdma_batch_sees_the_port_removed_at_once_and_fails_by_name",
            variant: V,
            run: batch_port_bounce,
        },
    ]
}

pub(crate) fn uri(nsid: u32) -> String {
    format!("nvmeof://rdma/{ADDR}:4420/{NQN}?nsid={nsid}")
}

/// Soft-RoCE on `dummy0` and nvmet port 2 (RDMA) for [`NQN`], once per boot.
pub(crate) fn ensure_rdma_target() -> Result<()> {
    ensure_target()?;
    if Path::new(&format!("{CONFIGFS}/ports/{PORT}/subsystems/{NQN}")).exists() {
        return Ok(());
    }
    for (rel, name) in [
        ("crypto/crc32_generic.ko", "crc32_generic"),
        ("net/ipv4/udp_tunnel.ko", "udp_tunnel"),
        ("net/ipv6/ip6_udp_tunnel.ko", "ip6_udp_tunnel"),
        ("drivers/infiniband/sw/rxe/rdma_rxe.ko", "rdma_rxe"),
        ("drivers/nvme/target/nvmet-rdma.ko", "nvmet_rdma"),
    ] {
        insmod(rel, name)?;
    }
    // CONFIG_DUMMY=y makes dummy0 at boot (down, no address).
    if !Path::new("/sys/class/net/dummy0").exists() {
        sh("ip link add dummy0 type dummy")?;
    }
    sh(&format!("ip addr replace {ADDR}/24 dev dummy0 && ip link set dummy0 up"))?;
    if !Path::new("/sys/class/infiniband/rxe0").exists() {
        sh("rdma link add rxe0 type rxe netdev dummy0")?;
    }
    // The RoCE GID of the address (IPv4-mapped) appears in the device's GID table from a
    // work queue: the target can bind to the address only then.
    let gid = "0000:0000:0000:0000:0000:ffff:0a4d:0001";
    let t = Instant::now();
    loop {
        let gids = sh("cat /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null || true")?;
        if gids.contains(gid) {
            break;
        }
        if t.elapsed() > Duration::from_secs(5) {
            let diag = sh("rdma link show; ip addr show dummy0; cat /sys/class/infiniband/rxe0/ports/1/state; \
                 cat /sys/class/infiniband/rxe0/ports/1/gids/* 2>&1 | sort | uniq -c; ibv_devices 2>&1")
            .unwrap_or_else(|e| e.to_string());
            bail!("rxe0 has no GID for {ADDR} after 5 s:\n{diag}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let port = format!("{CONFIGFS}/ports/{PORT}");
    sh(&format!(
        "mkdir -p {port} && echo rdma > {port}/addr_trtype && echo ipv4 > {port}/addr_adrfam && \
         echo {ADDR} > {port}/addr_traddr && echo 4420 > {port}/addr_trsvcid && \
         ln -s {CONFIGFS}/subsystems/{NQN} {port}/subsystems/{NQN}"
    ))?;
    Ok(())
}

fn integrity() -> Result<()> {
    ensure_rdma_target()?;
    let st = Storage::open(uri(1))?;
    ensure_that!(st.describe().contains("NVMe/RDMA"), "{}", st.describe());
    ensure_that!(st.capacity()? == 64 << 20 && st.block_size() == 512, "{} bytes", st.capacity()?);
    let buf = st.alloc_host(8 << 20)?;
    ensure_that!(buf.path() == ugds::Path::Remote, "took {}", buf.path());
    for (i, (off, len)) in ranges().into_iter().enumerate() {
        // An odd (unaligned) buffer offset too: registration is per I/O, any address.
        let bo = if i % 2 == 1 { 3 } else { 0 };
        let len = if bo != 0 && len == 8 << 20 { len - 4096 } else { len };
        let mut data = vec![0u8; len as usize];
        pattern::fill(500 + i as u64, off, &mut data);
        buf.copy_in(bo, &data)?;
        st.write(&buf, bo as u64, off, len)?;
        st.flush()?;
        let back = direct_read(BACKING, off, len as usize)?;
        if let Some(at) = pattern::first_mismatch(500 + i as u64, off, &back) {
            bail!("{len} bytes written at {off} over RDMA: the backing disk differs at byte {at}");
        }
        pattern::fill(600 + i as u64, off, &mut data);
        direct_write(BACKING, off, &data)?;
        st.read(&buf, bo as u64, off, len)?;
        let mut got = vec![0u8; len as usize];
        buf.copy_out(bo, &mut got)?;
        if let Some(at) = pattern::first_mismatch(600 + i as u64, off, &got) {
            bail!("{len} bytes at {off} read over RDMA differ from the backing disk at byte {at}");
        }
    }
    let c = st.path_counts();
    ensure_that!(c.remote == 10 && c.fallback == 0, "{c:?}");
    // Several threads, each on a queue (connection) of its own.
    let hs: Vec<_> = (0..4u64)
        .map(|t| {
            let st = st.clone();
            std::thread::spawn(move || -> Result<()> {
                let b = st.alloc_host(64 << 10)?;
                for k in 0..16u64 {
                    let off = (32 << 20) + (t * 16 + k) * (64 << 10);
                    let mut d = vec![0u8; 64 << 10];
                    pattern::fill(700 + t, off, &mut d);
                    b.copy_in(0, &d)?;
                    st.write(&b, 0, off, 64 << 10)?;
                    b.copy_in(0, &vec![0u8; 64 << 10])?;
                    st.read(&b, 0, off, 64 << 10)?;
                    b.copy_out(0, &mut d)?;
                    ensure_that!(pattern::first_mismatch(700 + t, off, &d).is_none(), "thread {t} write {k}");
                }
                Ok(())
            })
        })
        .collect();
    for h in hs {
        h.join().map_err(|_| anyhow::anyhow!("a thread panicked"))??;
    }
    eprintln!("rdma integrity: {}", st.describe());
    Ok(())
}

fn kernel_initiator() -> Result<()> {
    ensure_rdma_target()?;
    with_kernel_namespace("rdma", ADDR, |dev| {
        // The kernel's nvme-rdma namespace opens our own NVMe/RDMA controller.
        let at = [(9 * 512, 4096), ((2 << 20) + 512, 1 << 20)];
        let (st2, buf2) = cross_check(dev, &uri(1), "rdma", at, 800, "NVMe/RDMA")?;
        // Latency for scale: 4 KiB reads, the kernel's nvme-rdma (O_DIRECT) against ours, on
        // the same soft-RoCE device.
        let rounds = 40u64;
        let t = Instant::now();
        for k in 0..rounds {
            direct_read(dev, k * 4096, 4096)?;
        }
        let kernel = t.elapsed() / rounds as u32;
        let t = Instant::now();
        for k in 0..rounds {
            st2.read(&buf2, 0, k * 4096, 4096)?;
        }
        let ours = t.elapsed() / rounds as u32;
        eprintln!("4 KiB read over soft-RoCE: kernel nvme-rdma {kernel:?}, ugds {ours:?}");
        Ok(())
    })
}

/// udmabuf memory (the CPU stand-in GPU) is offered to the soft NIC as a dma-buf: rxe has no
/// dma-buf MRs in 6.12, so the registration is refused, the refusal is counted and named in
/// `describe()`, the memory is staged, and the data is right. Without staging allowed, the
/// refusal is an error by name.
fn udmabuf() -> Result<()> {
    ensure_rdma_target()?;
    let st = Storage::open(uri(1))?;
    let gpu = Gpu::cpu();
    let mem = Arc::new(gpu.alloc(3 << 20)?);
    match st.register_gpu(mem.clone(), false) {
        Err(Error::Unsupported { why, .. }) if why.contains("dma-buf") => {}
        Ok(b) => bail!("the soft NIC took the dma-buf ({}): this test expects rxe's refusal", b.path()),
        Err(e) => bail!("GPU memory without staging gave {e:?}"),
    }
    let buf = st.register_gpu(mem, true)?;
    ensure_that!(buf.path() == ugds::Path::RemoteStaged, "took {}", buf.path());
    let d = st.describe();
    ensure_that!(d.contains("dma-buf registration refused") && d.contains("ibv_reg_dmabuf_mr"), "{d}");
    let (off, len) = (5 * 512u64, (3 << 20) - 8192);
    let mut data = vec![0u8; len as usize];
    pattern::fill(1100, off, &mut data);
    buf.copy_in(4096, &data)?;
    st.write(&buf, 4096, off, len)?;
    let back = direct_read(BACKING, off, len as usize)?;
    ensure_that!(pattern::first_mismatch(1100, off, &back).is_none(), "staged RDMA write is not on the disk");
    pattern::fill(1101, off, &mut data);
    direct_write(BACKING, off, &data)?;
    st.read(&buf, 0, off, len)?;
    let mut got = vec![0u8; len as usize];
    buf.copy_out(0, &mut got)?;
    ensure_that!(pattern::first_mismatch(1101, off, &got).is_none(), "staged RDMA read differs from the disk");
    let c = st.path_counts();
    ensure_that!(c.remote_staged == 2 && c.remote == 0, "{c:?}");
    eprintln!("udmabuf over RDMA: {d}");
    Ok(())
}

fn bad_targets() -> Result<()> {
    ensure_rdma_target()?;
    let timed = |u: &str| {
        let t = Instant::now();
        let r = Storage::open(u).map(|_| ());
        (r, t.elapsed())
    };
    let (r, took) = timed(&format!("nvmeof://rdma/{ADDR}:4420/nqn.2024-01.io.ugds:nope?nsid=1"));
    match r {
        Err(Error::RemoteRejected { status: Rejection::Connect(status), .. }) if status.sc == 0x82 => {}
        other => bail!("a wrong NQN over RDMA gave {other:?}"),
    }
    ensure_that!(took < Duration::from_secs(5), "the wrong NQN took {took:?}");
    // Nothing listens on 4421 over RDMA: the peer's CM rejects the connect request.
    let (r, took) = timed(&format!("nvmeof://rdma/{ADDR}:4421/{NQN}?nsid=1&timeout_ms=2000"));
    ensure_that!(matches!(r, Err(Error::RemoteUnreachable { .. })), "a closed RDMA port gave {r:?}");
    ensure_that!(took < Duration::from_secs(5), "the closed port took {took:?}");
    // No RDMA device for that address (no route): a named error within the timeout.
    let (r, took) = timed(&format!("nvmeof://rdma/192.0.2.1:4420/{NQN}?nsid=1&timeout_ms=2000"));
    ensure_that!(matches!(r, Err(Error::RemoteUnreachable { .. })), "an unroutable RDMA address gave {r:?}");
    ensure_that!(took < Duration::from_secs(5), "the unroutable address took {took:?}");
    let (r, took) = timed(&uri(2));
    ensure_that!(matches!(r, Err(Error::NoNamespace(2))), "a missing namespace gave {r:?}");
    ensure_that!(took < Duration::from_secs(5), "the missing namespace took {took:?}");
    Ok(())
}

fn port_bounce() -> Result<()> {
    ensure_rdma_target()?;
    bounce(&uri(1), PORT)
}

/// What registering each I/O's memory costs (ibv_reg_mr + ibv_dereg_mr on rxe) against the
/// I/O itself (a read of the same size, registration included), at 4 KiB, 64 KiB and 1 MiB:
/// the measurement behind registering per I/O instead of caching per buffer.
fn registration_cost() -> Result<()> {
    ensure_rdma_target()?;
    let st = Storage::open(uri(1))?;
    let buf = st.alloc_host(1 << 20)?;
    // The same reads over NVMe/TCP (127.0.0.1), for scale.
    let tcp = Storage::open(format!("nvmeof://tcp/127.0.0.1:4420/{NQN}?nsid=1"))?;
    let tbuf = tcp.alloc_host(1 << 20)?;
    let mean_read = |st: &Storage, b: &ugds::Buffer, len: usize| -> Result<f64> {
        // The first I/O of a storage connects its I/O queue: not part of an I/O's cost.
        st.read(b, 0, 0, len as u64)?;
        let rounds = 50u32;
        let t = Instant::now();
        for k in 0..rounds {
            st.read(b, 0, u64::from(k) * len as u64, len as u64)?;
        }
        Ok(t.elapsed().as_nanos() as f64 / f64::from(rounds))
    };
    for len in [4096usize, 64 << 10, 1 << 20] {
        let reg = ugds::remote::rdma_registration_ns(&uri(1), len, 200)?;
        let io = mean_read(&st, &buf, len)?;
        let io_tcp = mean_read(&tcp, &tbuf, len)?;
        eprintln!(
            "registration cost: {len} bytes: ibv_reg_mr+ibv_dereg_mr {:.1} us, one RDMA read {:.1} us ({:.1} %), one TCP read {:.1} us",
            reg / 1000.0,
            io / 1000.0,
            100.0 * reg / io,
            io_tcp / 1000.0
        );
        ensure_that!(
            reg.total_cmp(&io).is_lt(),
            "registering {len} bytes ({reg} ns) costs more than the read ({io} ns)"
        );
    }
    Ok(())
}

/// A batch on an NVMe/RDMA namespace keeps its entries in flight on queues of its own (none on
/// the storage's worker threads): 96 entries of 512 B to 1 MiB (small writes go in the
/// capsule, the rest by RDMA), written, checked on the backing disk, overwritten there and
/// read back; then a batch dropped with reads in flight, after which the namespace still works.
fn batch_in_flight() -> Result<()> {
    ensure_rdma_target()?;
    let st = Storage::open(uri(1))?;
    let n = 96u64;
    let slot = 1u64 << 20;
    let buf = Arc::new(st.alloc_host((n * slot) as usize)?);
    let mut b = StorageBatch::new(&st, n as usize)?;
    ensure_that!(b.is_native(), "an NVMe/RDMA batch should have queues of its own");
    // Entry i: 512 B to 128 KiB, every 16th 1 MiB, one after another on the namespace.
    let mut at = 0u64;
    let reqs: Vec<IoRequest> = (0..n)
        .map(|i| {
            let len: u64 = if i % 16 == 5 { 1 << 20 } else { 512 << (i % 9) };
            let file_offset = at;
            at += len.next_multiple_of(4096);
            IoRequest { op: Op::Write, buf: buf.clone(), buf_offset: i * slot, file_offset, len, cookie: i }
        })
        .collect();
    let fill = |seed: u64| -> Result<()> {
        let mut v = buf.host_view()?;
        for r in &reqs {
            pattern::fill(
                seed ^ r.cookie,
                r.file_offset,
                &mut v[r.buf_offset as usize..(r.buf_offset + r.len) as usize],
            );
        }
        Ok(())
    };
    let run = |b: &mut StorageBatch, op: Op| -> Result<()> {
        let rs: Vec<IoRequest> = reqs.iter().cloned().map(|r| IoRequest { op, ..r }).collect();
        b.submit(&rs)?;
        let mut seen = vec![0u32; n as usize];
        let mut got = 0;
        while got < rs.len() {
            let ev = b.status(rs.len() - got, Duration::from_secs(30))?;
            ensure_that!(!ev.is_empty(), "{op:?}: no events within 30 s ({got} of {})", rs.len());
            for e in &ev {
                let r = &rs[e.cookie as usize];
                ensure_that!(e.status == IoStatus::Complete && e.bytes == r.len, "{op:?} entry {}: {e:?}", r.cookie);
                seen[e.cookie as usize] += 1;
            }
            got += ev.len();
        }
        ensure_that!(seen.iter().all(|&c| c == 1), "{op:?}: an entry reported other than once");
        ensure_that!(b.pooled_entries() == 0, "{op:?}: {} entries ran on worker threads", b.pooled_entries());
        Ok(())
    };
    fill(0x5D)?;
    run(&mut b, Op::Write)?;
    for r in &reqs {
        let back = direct_read(BACKING, r.file_offset, r.len as usize)?;
        if let Some(at) = pattern::first_mismatch(0x5D ^ r.cookie, r.file_offset, &back) {
            bail!(
                "batch write {} ({} bytes at {}): the backing disk differs at byte {at}",
                r.cookie,
                r.len,
                r.file_offset
            );
        }
        let mut data = vec![0u8; r.len as usize];
        pattern::fill(0x7E ^ r.cookie, r.file_offset, &mut data);
        direct_write(BACKING, r.file_offset, &data)?;
    }
    buf.host_view()?.fill(0);
    run(&mut b, Op::Read)?;
    {
        let v = buf.host_view()?;
        for r in &reqs {
            let got = &v[r.buf_offset as usize..(r.buf_offset + r.len) as usize];
            if let Some(at) = pattern::first_mismatch(0x7E ^ r.cookie, r.file_offset, got) {
                bail!("batch read {} ({} bytes at {}) differs at byte {at}", r.cookie, r.len, r.file_offset);
            }
        }
    }
    // Dropped with reads in flight: its queues are closed before the buffer's leases go.
    let rs: Vec<IoRequest> = reqs.iter().cloned().map(|r| IoRequest { op: Op::Read, ..r }).collect();
    b.submit(&rs)?;
    drop(b);
    let one = st.alloc_host(4096)?;
    st.read(&one, 0, 0, 4096)?;
    let mut got = vec![0u8; 4096];
    one.copy_out(0, &mut got)?;
    // Entry 0 (cookie 0, 512 bytes at 0) as the backing disk last wrote it.
    let first = reqs[0].len as usize;
    ensure_that!(pattern::first_mismatch(0x7E, 0, &got[..first]).is_none(), "a read after the dropped batch differs");
    Ok(())
}

/// Batches of 32 64 KiB writes, one after another, while nvmet port 2 loses and regains the
/// subsystem: the batch's queues wait on their connection's events too, so the entries that
/// meet the loss fail by name at once (not at the URI's 5 s timeout); later batches run again
/// (after a reconnect), and every entry reported done is on the disk.
fn batch_port_bounce() -> Result<()> {
    ensure_rdma_target()?;
    const BASE: u64 = 16 << 20;
    const LEN: u64 = 64 << 10;
    const N: u64 = 32;
    let st = Storage::open(uri(1))?;
    let st2 = st.clone();
    // Per entry: its cookie, its status, and its error (whether it is a named remote error,
    // and its text).
    type Round = (u64, Vec<(u64, IoStatus, Option<(bool, String)>)>, Duration);
    let named = |e: &Error| {
        let remote = matches!(
            e,
            Error::RemoteTransport { .. }
                | Error::RemoteProtocol { .. }
                | Error::RemoteUnreachable { .. }
                | Error::RemoteRejected { .. }
        );
        (remote, e.to_string())
    };
    let rounds = while_port_away(PORT, Duration::from_millis(2500), move |stop| -> Result<Vec<Round>> {
        let buf = Arc::new(st2.alloc_host((N * LEN) as usize)?);
        let mut rounds = Vec::new();
        let mut k = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && k < 2000 {
            let reqs: Vec<IoRequest> = (0..N)
                .map(|i| {
                    let off = BASE + i * LEN;
                    IoRequest {
                        op: Op::Write,
                        buf: buf.clone(),
                        buf_offset: i * LEN,
                        file_offset: off,
                        len: LEN,
                        cookie: i,
                    }
                })
                .collect();
            {
                let mut v = buf.host_view()?;
                for r in &reqs {
                    let at = r.buf_offset as usize;
                    pattern::fill(k * N + r.cookie, r.file_offset, &mut v[at..at + LEN as usize]);
                }
            }
            let t = Instant::now();
            let mut evs = Vec::new();
            match StorageBatch::new(&st2, N as usize) {
                Ok(mut b) => {
                    b.submit(&reqs)?;
                    while evs.len() < reqs.len() {
                        let got = b.status(reqs.len() - evs.len(), Duration::from_secs(20))?;
                        ensure_that!(!got.is_empty(), "round {k}: no events within 20 s");
                        evs.extend(got.into_iter().map(|e| (e.cookie, e.status, e.error.as_ref().map(named))));
                    }
                }
                Err(e) => evs.extend((0..N).map(|i| (i, IoStatus::Failed, Some(named(&e))))),
            }
            rounds.push((k, evs, t.elapsed()));
            k += 1;
        }
        Ok(rounds)
    })?;
    let failed: Vec<_> = rounds
        .iter()
        .flat_map(|(k, evs, _)| evs.iter().filter(|e| e.1 != IoStatus::Complete).map(move |e| (*k, e)))
        .collect();
    ensure_that!(!failed.is_empty(), "{} rounds, none noticed the port going away", rounds.len());
    for (k, (i, status, e)) in &failed {
        let is_named = e.as_ref().is_some_and(|e| e.0);
        ensure_that!(is_named && *status == IoStatus::Failed, "round {k} entry {i}: {status:?} {e:?}");
    }
    let slowest = rounds.iter().map(|r| r.2).max().unwrap_or_default();
    ensure_that!(slowest < Duration::from_secs(4), "a round took {slowest:?} (the URI's timeout is 5 s)");
    let last = rounds.last().context("no rounds")?;
    ensure_that!(
        last.1.iter().all(|e| e.1 == IoStatus::Complete),
        "the last round failed: no reconnect: {:?}",
        last.1[0]
    );
    // Every entry reported done is on the disk (the latest round that wrote each offset wins).
    let mut latest = std::collections::BTreeMap::new();
    for (k, evs, _) in &rounds {
        for (i, status, _) in evs {
            latest.insert(*i, (*k, *status == IoStatus::Complete));
        }
    }
    let mut checked = 0;
    for (i, (k, ok)) in latest {
        if !ok {
            continue;
        }
        let off = BASE + i * LEN;
        let back = direct_read(BACKING, off, LEN as usize)?;
        ensure_that!(
            pattern::first_mismatch(k * N + i, off, &back).is_none(),
            "round {k} entry {i} is not on the disk"
        );
        checked += 1;
    }
    eprintln!(
        "batch port bounce: {} rounds of {N}, {} entries failed by name, slowest round {slowest:?}, {checked} offsets checked; {}",
        rounds.len(),
        failed.len(),
        st.describe()
    );
    Ok(())
}

//! Host tests of SGLs end to end: commands built with SGLs (or PRPs, as the policy and the
//! memory decide) move the right bytes through the device model, which follows Data Block,
//! Segment and Last Segment descriptors; the counters say which data pointer each transfer got.

use super::*;
use crate::cmd::{DmaRange, Read, Write};
use crate::error::Error;
use crate::pattern;
use proptest::prelude::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// Host memory layouts: 256 single pages in reverse bus order; one 1 MiB segment; sixteen
/// 64 KiB segments that touch on the bus (the SGL merges them into one data block).
fn mock(layout: usize, data_pointers: DataPointers, sgls: u32, stepped: bool) -> MockQueue {
    let (segment_bytes, segments, scatter) = [(4096, 256, true), (1 << 20, 1, false), (65536, 16, false)][layout];
    MockQueue::with(MockConfig {
        depth: 16,
        block_size: 512,
        blocks: 8192,
        segment_bytes,
        segments,
        scatter,
        stepped,
        sgls,
        data_pointers,
        ..MockConfig::default()
    })
    .unwrap()
}

fn dma<'a>(segs: &'a [Segment], off: u64, len: u64) -> DmaRange<'a> {
    // SAFETY: the segments name the mock's own memory, which only its device model touches, and
    // every caller pairs `len` with the command's block count.
    unsafe { DmaRange::new(segs, off, len) }
}

/// The queue's (PRP, SGL) transfer counts.
fn ps(m: &MockQueue) -> (u64, u64) {
    let c = m.qp.dptr_counts();
    (c.prp, c.sgl)
}

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    pattern::fill(seed, 0, &mut v);
    v
}

/// Writes `len` bytes from host offset `off` to `lba`, reads them back to `off + 512 KiB`, and
/// checks the device's blocks and the host copy.
fn round_trip(m: &MockQueue, seed: u64, off: u64, lba: u64, len: u64) {
    let want = data(seed, len as usize);
    m.host_write(off as usize, &want);
    let nlb = (len / 512) as u32;
    m.qp.execute(1, &[Write::new(lba, nlb, dma(m.segments(), off, len)).build()], &m.status, T).unwrap();
    assert_eq!(m.backing(lba, len / 512), want, "the device got the bytes ({off}+{len})");
    let back = off + (512 << 10);
    m.host_write(back as usize, &vec![0u8; len as usize]);
    m.qp.execute(1, &[Read::new(lba, nlb, dma(m.segments(), back, len)).build()], &m.status, T).unwrap();
    assert_eq!(m.host_read(back as usize, len as usize), want, "the host got the bytes back ({off}+{len})");
}

/// (host offset, bytes): inside a page, two pages from inside a page, three pages, an
/// unaligned list of 17 pages, 256 KiB.
const CASES: [(u64, u64); 5] = [(0, 512), (3584, 4096), (8192, 12288), (1024, 65536 + 512), (0, 256 << 10)];

#[test]
fn forced_sgls_move_the_data_on_every_layout() {
    for layout in 0..3 {
        let m = mock(layout, DataPointers::SglPreferred, 1, false);
        for (i, &(off, len)) in CASES.iter().enumerate() {
            round_trip(&m, i as u64, off, 100 * i as u64, len);
        }
        let n = 2 * CASES.len() as u64;
        assert_eq!(ps(&m), (0, n), "layout {layout}: every transfer took an SGL");
        assert_eq!(m.stats().sgl_commands, n, "layout {layout}: the device saw SGLs");
        // Contiguous memory: one data block per command, in DPTR; scattered pages: one per page,
        // in a segment for every transfer over more than one page.
        let (blocks, lists) = (m.stats().sgl_blocks, m.qp.dptr_counts().sgl_lists);
        if layout == 0 {
            assert!(blocks > 100 && lists == n - 2, "layout 0: {blocks} data blocks, {lists} lists");
        } else {
            assert_eq!((blocks, lists), (n, 0), "layout {layout}: one data block per command");
        }
    }
}

#[test]
fn prp_only_never_uses_sgls() {
    for layout in 0..3 {
        let m = mock(layout, DataPointers::PrpOnly, 1, false);
        for (i, &(off, len)) in CASES.iter().enumerate() {
            round_trip(&m, 10 + i as u64, off, 100 * i as u64, len);
        }
        assert_eq!(ps(&m), (2 * CASES.len() as u64, 0));
        assert_eq!(m.stats().sgl_commands, 0);
    }
}

#[test]
fn auto_picks_prps_for_small_or_fragmented_and_sgls_for_large_contiguous() {
    // Contiguous: one or two pages stay PRPs; three pages and more become one data block.
    let m = mock(1, DataPointers::Auto, 1, false);
    round_trip(&m, 1, 0, 0, 4096);
    round_trip(&m, 2, 3584, 8, 4096);
    assert_eq!(ps(&m), (4, 0));
    round_trip(&m, 3, 0, 16, 12288);
    round_trip(&m, 4, 1024, 64, 256 << 10);
    assert_eq!(ps(&m), (4, 4));
    // Scattered single pages: an SGL would need a descriptor per page, twice a PRP entry.
    let m = mock(0, DataPointers::Auto, 1, false);
    round_trip(&m, 5, 0, 0, 256 << 10);
    round_trip(&m, 6, 1024, 600, 65536 + 512);
    assert_eq!(ps(&m), (4, 0));
    // A controller without SGLs gets PRPs whatever is asked.
    let m = mock(1, DataPointers::SglPreferred, 0, false);
    round_trip(&m, 7, 0, 0, 256 << 10);
    assert_eq!(ps(&m), (2, 0));
    assert_eq!(m.stats().sgl_commands, 0);
}

#[test]
fn a_segment_boundary_inside_a_page_needs_an_sgl() {
    // Two half pages of the contiguous mock's memory, 8 KiB apart on the bus, as one range:
    // PRPs cannot describe it (the boundary falls inside the transfer's first page).
    let m = mock(1, DataPointers::Auto, 1, false);
    let base = m.segments()[0].dma_addr;
    let halves = [Segment { dma_addr: base, len: 2048 }, Segment { dma_addr: base + 8192, len: 2048 }];
    let want = data(9, 4096);
    m.host_write(0, &want[..2048]);
    m.host_write(8192, &want[2048..]);
    m.qp.execute(1, &[Write::new(40, 8, dma(&halves, 0, 4096)).build()], &m.status, T).unwrap();
    assert_eq!(m.backing(40, 8), want);
    assert_eq!(ps(&m), (0, 1));
    assert_eq!(m.stats().sgl_blocks, 2, "a last segment of two data blocks");
    // PRPs only: refused before anything is submitted.
    let m = mock(1, DataPointers::PrpOnly, 1, false);
    let e = m.qp.execute(1, &[Write::new(40, 8, dma(&halves, 0, 4096)).build()], &m.status, T).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { arg: "reg_offset", .. }), "{e:?}");
    assert_eq!(m.stats().fetched, 0);
}

#[test]
fn dword_granularity_is_honoured() {
    // SGLS 10b: data blocks at dword-aligned addresses with dword lengths pass; the model
    // would refuse others (and the builder never makes them).
    let m = mock(0, DataPointers::SglPreferred, 2, false);
    round_trip(&m, 11, 1028, 0, 65536);
    assert_eq!(ps(&m), (0, 2));
    assert_eq!(m.stats().errors, 0);
}

/// Not an assertion: what writing a 2 MiB contiguous read into its SQ slot costs with a PRP
/// list (511 list entries) and with an SGL (one data block in DPTR), on the mock's shared
/// memory (the same `DeviceShared` mappings the module's queues use): lock, build, write,
/// withdraw. Run with `--release -- --nocapture` for meaningful numbers.
#[test]
fn prp_vs_sgl_build_cost_for_2mib_contiguous() {
    let mut per = Vec::new();
    for (name, dp) in [("PRP list", DataPointers::PrpOnly), ("SGL", DataPointers::SglPreferred)] {
        let m = MockQueue::with(MockConfig {
            depth: 8,
            blocks: 1024,
            segment_bytes: 4 << 20,
            stepped: true,
            data_pointers: dp,
            ..MockConfig::default()
        })
        .unwrap();
        let cmd = Read::new(0, 512, dma(m.segments(), 0, 2 << 20)).build();
        let n = 50_000u32;
        let t = std::time::Instant::now();
        for _ in 0..n {
            let mut sub = m.qp.submission(1, &m.status).unwrap();
            std::hint::black_box(sub.push(&cmd).unwrap());
            sub.cancel();
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        let c = m.qp.dptr_counts();
        assert_eq!(c.prp + c.sgl, n as u64);
        println!("2 MiB contiguous read, {name}: {ns:.1} ns per command written and withdrawn");
        per.push(ns);
    }
    println!("PRP/SGL: {:.1}x", per[0] / per[1]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Random transfers (dword-aligned host offsets, 1..=192 blocks of 512) under every policy
    /// and layout: the device's blocks and host memory match what was written, and the model
    /// saw exactly as many SGL commands as the queue counted.
    #[test]
    fn random_transfers_round_trip_under_every_policy(
        layout in 0usize..3,
        mode in 0usize..3,
        ios in proptest::collection::vec((0u64..(256 << 10) / 4, 0u64..7000, 1u64..193), 1..8),
    ) {
        let dp = [DataPointers::Auto, DataPointers::PrpOnly, DataPointers::SglPreferred][mode];
        let m = mock(layout, dp, 1, true);
        for (i, &(h, lba, blocks)) in ios.iter().enumerate() {
            let (off, len) = (h * 4, blocks * 512);
            let want = data(i as u64, len as usize);
            m.host_write(off as usize, &want);
            let segs = m.segments();
            let mut cids = [0u16; 1];
            m.qp.submit(1, &[Write::new(lba, blocks as u32, dma(segs, off, len)).build()], &m.status, T, &mut cids).unwrap();
            m.step();
            let mut out = [None];
            prop_assert_eq!(m.qp.collect(&cids, &m.status, &mut out).unwrap(), 1);
            prop_assert!(out[0].unwrap().is_success(), "{:?}", out[0]);
            prop_assert!(m.backing(lba, blocks) == want);
            let back = off + (512 << 10);
            m.qp.submit(1, &[Read::new(lba, blocks as u32, dma(segs, back, len)).build()], &m.status, T, &mut cids).unwrap();
            m.step();
            let mut out = [None];
            prop_assert_eq!(m.qp.collect(&cids, &m.status, &mut out).unwrap(), 1);
            prop_assert!(out[0].unwrap().is_success(), "{:?}", out[0]);
            prop_assert!(m.host_read(back as usize, len as usize) == want);
        }
        let c = m.qp.dptr_counts();
        prop_assert_eq!(c.prp + c.sgl, 2 * ios.len() as u64);
        prop_assert_eq!(c.sgl, m.stats().sgl_commands);
        match dp {
            DataPointers::PrpOnly => prop_assert_eq!(c.sgl, 0),
            DataPointers::SglPreferred => prop_assert_eq!(c.prp, 0),
            DataPointers::Auto => {}
        }
    }
}

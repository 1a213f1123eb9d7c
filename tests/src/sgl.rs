//! NVMe SGLs on QEMU's controller: the data-path integrity tests with SGLs forced and with PRPs
//! forced, and a large contiguous registration (hugepages) next to fragmented host memory on
//! both block sizes, each checked through the kernel driver and by the library's count of which
//! data pointer every transfer really took.

use crate::userlib::{self, check_dptr, kernel_check, kernel_namespaces, unbind};
use crate::{ensure_that, nvme_controllers, nvme_name, Test};
use anyhow::{Context, Result};
use ugds::{pattern, DataPointers, Device, DeviceOptions, Storage};

const V: &str = "userlib";

/// The variant's controllers without the throttled one (20 commands per second).
const FAST: usize = 4;

/// The SGL tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "ugds_integrity_sgl_forced_ugds_writes_kernel_reads", variant: V, run: sgl_writes },
        Test { name: "ugds_integrity_sgl_forced_kernel_writes_ugds_reads", variant: V, run: sgl_reads },
        Test { name: "ugds_integrity_prp_forced_ugds_writes_kernel_reads", variant: V, run: prp_writes },
        Test { name: "ugds_integrity_prp_forced_kernel_writes_ugds_reads", variant: V, run: prp_reads },
        Test {
            name: "ugds_sgl_hugepages_and_fragmented_memory_lbs_512_4096",
            variant: V,
            run: hugepages_and_fragments,
        },
        Test { name: "ugds_alloc_host_takes_free_huge_pages", variant: V, run: alloc_host_huge_pages },
    ]
}

/// The kernel's pool of 2 MiB huge pages.
const HUGE_POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

/// The free 2 MiB huge pages and the pool's size.
fn huge_pages() -> Result<(usize, usize)> {
    let read = |f: &str| -> Result<usize> { Ok(std::fs::read_to_string(format!("{HUGE_POOL}/{f}"))?.trim().parse()?) };
    Ok((read("free_hugepages")?, read("nr_hugepages")?))
}

fn set_huge_pages(n: usize) -> Result<()> {
    let pool = format!("{HUGE_POOL}/nr_hugepages");
    std::fs::write(&pool, n.to_string()).with_context(|| format!("sizing {pool}"))?;
    ensure_that!(huge_pages()?.1 == n, "{pool}: {:?} where {n} was asked", huge_pages()?);
    Ok(())
}

/// `alloc_host` of a multiple of 2 MiB takes huge pages while the pool has them free: one DMA
/// segment per huge page, each command inside it a single SGL data block (no segment list, no
/// PRPs), the data intact; with the pool empty, it falls back to ordinary pages; any other
/// length never takes them.
fn alloc_host_huge_pages() -> Result<()> {
    let (_, pool) = huge_pages()?;
    let node = crate::kmod::bound_node(0)?;
    let dev = Device::open_with(&node, DeviceOptions { queues: 1, ..Default::default() })?;
    let st = Storage::direct(&dev, 1)?;
    let run = || -> Result<()> {
        set_huge_pages(pool + 2)?;
        let (free, _) = huge_pages()?;
        let odd = st.alloc_host((2 << 20) + 4096)?;
        ensure_that!(huge_pages()?.0 == free, "a length of 2 MiB + 4 KiB took huge pages: {:?}", huge_pages()?);
        drop(odd);
        let buf = st.alloc_host(2 << 20)?;
        ensure_that!(huge_pages()?.0 == free - 1, "free huge pages {free} -> {:?}", huge_pages()?);
        ensure_that!(buf.dma_segments() == Some(1), "2 MiB of a huge page in {:?} DMA segments", buf.dma_segments());
        let before = dev.dptr_counts();
        pattern::fill(77, 0, &mut buf.host_view()?);
        st.write(&buf, 0, 0, 2 << 20)?;
        buf.host_view()?.fill(0);
        st.read(&buf, 0, 0, 2 << 20)?;
        ensure_that!(pattern::first_mismatch(77, 0, &buf.host_view()?).is_none(), "data read back differs");
        let after = dev.dptr_counts();
        ensure_that!(
            after.sgl > before.sgl && after.sgl_lists == before.sgl_lists && after.prp == before.prp,
            "commands on one huge page should each take one SGL data block: {before:?} -> {after:?}"
        );
        drop(buf);
        ensure_that!(huge_pages()?.0 == free, "the huge page was not given back: {:?}", huge_pages()?);
        set_huge_pages(0)?;
        let small = st.alloc_host(2 << 20)?;
        println!("    without huge pages: 2 MiB in {:?} DMA segments", small.dma_segments());
        st.read(&small, 0, 0, 2 << 20)?;
        Ok(())
    };
    let r = run();
    set_huge_pages(pool)?;
    r
}

fn sgl_writes() -> Result<()> {
    userlib::integrity_ugds_writes(DataPointers::SglPreferred, FAST)
}

fn sgl_reads() -> Result<()> {
    userlib::integrity_kernel_writes(DataPointers::SglPreferred, FAST)
}

fn prp_writes() -> Result<()> {
    userlib::integrity_ugds_writes(DataPointers::PrpOnly, FAST)
}

fn prp_reads() -> Result<()> {
    userlib::integrity_kernel_writes(DataPointers::PrpOnly, FAST)
}

/// 8 MiB of 2 MiB hugepages, mapped for the test's life.
struct Hugepages {
    ptr: *mut u8,
    len: usize,
}

impl Hugepages {
    fn new(len: usize) -> Result<Self> {
        let pool = format!("{HUGE_POOL}/nr_hugepages");
        let want = len / (2 << 20) + 2;
        std::fs::write(&pool, want.to_string()).with_context(|| format!("reserving hugepages in {pool}"))?;
        let got: usize = std::fs::read_to_string(pool)?.trim().parse()?;
        ensure_that!(got >= len / (2 << 20), "{got} hugepages reserved, {want} asked");
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        ensure_that!(p != libc::MAP_FAILED, "mmap of {len} bytes of hugepages: {}", std::io::Error::last_os_error());
        Ok(Hugepages { ptr: p.cast(), len })
    }
}

impl Drop for Hugepages {
    fn drop(&mut self) {
        // SAFETY: our own mapping; every buffer registered over it was dropped first.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// On a 4096-byte and a 512-byte namespace, under each policy: write from 8 MiB of hugepages
/// (2 MiB contiguous runs: one SGL data block per command) and read back into fragmented
/// anonymous memory (a data block per page) at a buffer offset inside a page, then have the
/// kernel driver read every range. SGLs must be used for the hugepages unless PRPs are forced,
/// and for everything when SGLs are forced.
fn hugepages_and_fragments() -> Result<()> {
    const LEN: usize = 8 << 20;
    let huge = Hugepages::new(LEN)?;
    // (controller index in the variant, expected block size).
    for (idx, bs) in [(0usize, 4096u64), (2, 512)] {
        let addr = nvme_controllers()?[idx].clone();
        let node = crate::kmod::bound_node(idx)?;
        let mut plan = Vec::new();
        for (k, dp) in [DataPointers::Auto, DataPointers::SglPreferred, DataPointers::PrpOnly].into_iter().enumerate() {
            let what = format!("controller {idx} (lbs {bs}), {dp:?}");
            let dev = Device::open_with(&node, DeviceOptions { queues: 1, data_pointers: dp, ..Default::default() })?;
            ensure_that!(dev.supports_sgls(), "{what}: QEMU's controller reports SGL support");
            let st = Storage::direct(&dev, 1)?;
            ensure_that!(st.block_size() == bs, "{what}: block size {}", st.block_size());
            // SAFETY: `huge` stays mapped until the end of the test, after every buffer over it is
            // dropped, and nothing references it while I/O runs.
            let hbuf = unsafe { st.register_host(huge.ptr, LEN) }?;
            let fbuf = st.alloc_host(LEN + 4096)?;
            let seed = 300 + 10 * idx as u64 + k as u64;
            let off = k as u64 * LEN as u64;
            pattern::fill(seed, off, &mut hbuf.host_view()?);
            let before = dev.dptr_counts();
            st.write(&hbuf, 0, off, LEN as u64).with_context(|| format!("{what}: write from hugepages"))?;
            let after = dev.dptr_counts();
            let huge_sgl = after.sgl - before.sgl;
            match dp {
                DataPointers::PrpOnly => ensure_that!(huge_sgl == 0, "{what}: {after:?}"),
                _ => ensure_that!(
                    huge_sgl > 0 && after.prp == before.prp,
                    "{what}: hugepage commands should all take SGLs: {before:?} -> {after:?}"
                ),
            }
            // Read back at buffer offset 1024 (inside a page) into fragmented memory.
            let boff = 1024u64;
            st.read(&fbuf, boff, off, LEN as u64).with_context(|| format!("{what}: read into fragments"))?;
            let bad = pattern::first_mismatch(seed, off, &fbuf.host_view()?[boff as usize..boff as usize + LEN]);
            if let Some(b) = bad {
                anyhow::bail!("{what}: byte {b} read back differs");
            }
            check_dptr(&dev, dp, &what)?;
            if dp == DataPointers::SglPreferred {
                // The read buffer is anonymous memory in several DMA segments (no IOMMU merges
                // them), and at buffer offset 1024 no segment boundary meets a command boundary:
                // some commands carried a segment of several data blocks.
                let raw = crate::raw::RawDev::open(&node)?;
                let h = raw.register(fbuf.host_ptr().context("host memory")? as u64, fbuf.len() as u64)?;
                let nsegs = raw.segments(h)?.len();
                raw.deregister(h.id, h.generation)?;
                let lists = dev.dptr_counts().sgl_lists;
                ensure_that!(nsegs == 1 || lists > 0, "{what}: {nsegs} DMA segments but no SGL segment list");
                println!("    {what}: read buffer in {nsegs} DMA segments, {lists} SGLs with a segment list");
            }
            println!("    {what}: {huge_sgl} SGL commands from hugepages; counts {:?}", dev.dptr_counts());
            plan.push((seed, off));
            drop((hbuf, fbuf, st, dev));
        }
        unbind(&addr)?;
        let kns = kernel_namespaces(&nvme_name(&addr)?)?;
        let blk = &kns.iter().find(|(id, _)| *id == 1).context("namespace 1 missing in the kernel")?.1;
        for (seed, off) in plan {
            kernel_check(&format!("/dev/{blk}"), seed, off, LEN as u64).with_context(|| format!("controller {idx}"))?;
        }
    }
    drop(huge);
    Ok(())
}

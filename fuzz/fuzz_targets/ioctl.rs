//! The kernel module's ioctl argument decoding (`ugds_uapi::args`, called by kmod `chardev`),
//! fed raw bytes as `copy_from_user` would hand them over: the first byte picks the request,
//! the next 12 are the limits, the rest is the argument struct (read with zerocopy).
//!
//! Checked: an accepted struct satisfies every invariant the module then relies on (no
//! overflow, in range), and the decision and errno agree with a second, naive statement of the
//! same rules in 128-bit arithmetic (`expect_*` below).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ugds_uapi::args::*;
use ugds_uapi::ioctl::{self, *};
use zerocopy::FromBytes;

/// The module's own user-space end on x86-64 (kmod `chardev::USER_END`).
const X86_64_USER_END: u64 = 0x7FFF_FFFF_F000;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    let Some((limits, arg)) = limits(rest) else { return };
    match which % 10 {
        0 => create_qpair(arg, &limits),
        1 => delete_qpair(arg),
        2 => register_host(arg, &limits),
        3 => register_dmabuf(arg),
        4 => get_segments(arg),
        5 => set_eventfd(arg),
        6 => mmap_offset_roundtrip(arg),
        7 => admin_cmd(arg, &limits),
        8 => list_openers(arg),
        _ => register_host(arg, &Limits { user_end: X86_64_USER_END, ..limits }),
    }
});

/// Limits from 12 bytes: the queue depth limit as a controller reports it (CAP.MQES + 1, so
/// 1..=65536) and a user-space end.
fn limits(b: &[u8]) -> Option<(Limits, &[u8])> {
    let (mqes, rest) = u16::read_from_prefix(b).ok()?;
    let (_pad, rest) = u16::read_from_prefix(rest).ok()?;
    let (user_end, rest) = u64::read_from_prefix(rest).ok()?;
    Some((Limits { max_queue_entries: u32::from(mqes) + 1, user_end }, rest))
}

fn create_qpair(b: &[u8], limits: &Limits) {
    let Ok((a, _)) = CreateQpair::read_from_prefix(b) else { return };
    let got = a.check(limits);
    let bad_flags = a.flags & !QPAIR_FLAG_IRQ != 0;
    let bad_depth = a.depth < 2 || a.depth > limits.max_queue_entries;
    let want = if bad_flags || bad_depth { Err(ioctl::errno::EINVAL) } else { Ok(()) };
    assert_eq!(got.map(|_| ()).map_err(ArgError::errno), want, "{a:?} {limits:?}");
    if let Ok(r) = got {
        assert!(r.depth >= 2 && r.depth <= limits.max_queue_entries && r.depth == a.depth);
        assert_eq!(r.irq, a.flags == QPAIR_FLAG_IRQ);
        // What the module sizes from the depth: SQ (64 B), CQ (16 B) and PRP pool (4 KiB) per
        // entry, as usize byte counts, and the depth as the 16-bit queue size field (depth - 1).
        assert!(u64::from(r.depth) <= 65536);
        let _ = usize::try_from(u64::from(r.depth) * 4096).unwrap();
        let _ = u16::try_from(r.depth - 1).unwrap();
    }
}

fn delete_qpair(b: &[u8]) {
    let Ok((a, _)) = DeleteQpair::read_from_prefix(b) else { return };
    match a.check() {
        Ok(qid) => assert!(a.reserved == 0 && qid == a.qid),
        Err(e) => assert!(a.reserved != 0 && e.errno() == ioctl::errno::EINVAL),
    }
}

fn register_host(b: &[u8], limits: &Limits) {
    let Ok((a, _)) = RegisterHost::read_from_prefix(b) else { return };
    let got = a.check(limits);
    let (addr, len) = (u128::from(a.addr), u128::from(a.len));
    let want = if len == 0 || len % 4096 != 0 || len > 16 << 30 || addr % 4096 != 0 {
        Err(ioctl::errno::EINVAL)
    } else if addr + len > u128::from(u64::MAX) {
        Err(ioctl::errno::EOVERFLOW)
    } else if addr + len > u128::from(limits.user_end) {
        Err(ioctl::errno::EFAULT)
    } else {
        Ok(())
    };
    assert_eq!(got.map(|_| ()).map_err(ArgError::errno), want, "{a:?} {limits:?}");
    if let Ok(r) = got {
        assert_eq!((r.addr, r.len), (a.addr, a.len));
        assert_eq!(u128::from(r.end), addr + len);
        assert!(r.end <= limits.user_end && r.addr < r.end);
        assert!(r.addr % REG_PAGE == 0 && r.len % REG_PAGE == 0 && r.len <= MAX_HOST_REGISTRATION);
        // The module counts pinned pages in a u32 and walks them as usize.
        let _ = u32::try_from(r.pages()).unwrap();
    }
}

fn register_dmabuf(b: &[u8]) {
    let Ok((a, _)) = RegisterDmabuf::read_from_prefix(b) else { return };
    let got = a.check();
    let (off, len) = (u128::from(a.offset), u128::from(a.len));
    let want = if a.reserved != 0 || len == 0 || len % 4096 != 0 || off % 4096 != 0 {
        Err(ioctl::errno::EINVAL)
    } else if off + len > u128::from(u64::MAX) {
        Err(ioctl::errno::EOVERFLOW)
    } else if a.fd < 0 {
        Err(ioctl::errno::EBADF)
    } else {
        Ok(())
    };
    assert_eq!(got.map(|_| ()).map_err(ArgError::errno), want, "{a:?}");
    if let Ok(r) = got {
        assert_eq!((r.fd, r.offset, r.len), (a.fd, a.offset, a.len));
        assert!(r.fd >= 0 && r.len > 0 && r.offset.checked_add(r.len).is_some());
    }
}

fn get_segments(b: &[u8]) {
    let Ok((nsegs, rest)) = u16::read_from_prefix(b) else { return };
    let Ok((a, _)) = GetSegments::read_from_prefix(rest) else { return };
    let nsegs = usize::from(nsegs);
    match a.check(nsegs) {
        Ok(w) => {
            assert!(a.first as usize <= nsegs && w.first == a.first as usize);
            // The module slices `segs[first..first + count]`: in range, no overflow.
            assert!(w.first.checked_add(w.count).is_some_and(|end| end <= nsegs));
            assert_eq!(w.count, (a.count as usize).min(nsegs - w.first));
        }
        Err(e) => assert!(a.first as usize > nsegs && e.errno() == ioctl::errno::EINVAL),
    }
}

fn set_eventfd(b: &[u8]) {
    let Ok((a, _)) = SetEventfd::read_from_prefix(b) else { return };
    match a.check() {
        Ok(EventfdAction::Detach) => assert_eq!(a.fd, -1),
        Ok(EventfdAction::Attach(fd)) => assert!(fd >= 0 && fd == a.fd),
        Err(e) => assert!(a.fd < -1 && e.errno() == ioctl::errno::EBADF),
    }
}

fn list_openers(b: &[u8]) {
    let Ok((a, _)) = ListOpeners::read_from_prefix(b) else { return };
    match a.check() {
        Ok(room) => assert!(room as u64 == u64::from(a.capacity) && a.capacity <= MAX_OPENERS),
        Err(e) => assert!(a.capacity > MAX_OPENERS && e.errno() == ioctl::errno::EINVAL),
    }
}

/// mmap offsets: whatever parses names a kind and queue id that encode back to the same offset.
fn mmap_offset_roundtrip(b: &[u8]) {
    let Ok((off, _)) = u64::read_from_prefix(b) else { return };
    if let Some((kind, qid)) = parse_mmap_offset(off) {
        assert_eq!(mmap_offset(kind, qid), off);
        assert_eq!(off % 4096, 0);
    }
}

/// `ADMIN_CMD`: the struct, then one byte for the controller's MDTS exponent (0: no limit).
fn admin_cmd(b: &[u8], limits: &Limits) {
    let Ok((a, rest)) = AdminCommand::read_from_prefix(b) else { return };
    let mdts = rest.first().map_or(0, |&m| if m == 0 { 0 } else { 4096u32 << (m % 8) });
    let got = a.check(limits, mdts);
    let bound = if mdts != 0 && mdts < MAX_ADMIN_DATA { mdts } else { MAX_ADMIN_DATA };
    let len = u128::from(a.data_len);
    let bad_len = len % 4 != 0
        || match a.opcode {
            0x06 => len != 4096,
            0x02 => len < 4 || len > u128::from(bound),
            _ => len > 4096,
        };
    let end = u128::from(a.data) + len;
    let want = if !matches!(a.opcode, 0x02 | 0x06 | 0x0A) {
        Err(ioctl::errno::EACCES)
    } else if a.flags != 0 || a.reserved0 != 0 || a.reserved1 != 0 || bad_len {
        Err(ioctl::errno::EINVAL)
    } else if len > 0 && end > u128::from(u64::MAX) {
        Err(ioctl::errno::EOVERFLOW)
    } else if len > 0 && end > u128::from(limits.user_end) {
        Err(ioctl::errno::EFAULT)
    } else {
        Ok(())
    };
    assert_eq!(got.map(|_| ()).map_err(ArgError::errno), want, "{a:?} {limits:?} {mdts}");
    let Ok(r) = got else { return };
    assert_eq!((r.opcode, r.nsid, r.len, r.data), (a.opcode, a.nsid, a.data_len, a.data));
    if a.opcode == 0x02 {
        // NUMD (zero-based dwords) from the length, RAE set, the rest of CDW10/11 kept.
        let numd = (r.cdw[0] >> 16) | (r.cdw[1] & 0xFFFF) << 16;
        assert_eq!(u128::from(numd) + 1, len / 4);
        assert_eq!(r.cdw[0] & 0x7FFF, a.cdw[0] & 0x7FFF);
        assert_ne!(r.cdw[0] & LOG_PAGE_RAE, 0);
        assert_eq!((r.cdw[1] >> 16, &r.cdw[2..]), (a.cdw[1] >> 16, &a.cdw[2..]));
    } else {
        assert_eq!(r.cdw, a.cdw);
    }
    // Every page of the transfer lands inside the module's buffer (data pages + guard page).
    let pages = admin_data_pages(r.len);
    for k in 0..(r.len as usize).div_ceil(ADMIN_PAGE) {
        assert!(admin_page_of(r.len, k) <= pages);
    }
}

//! The parsers against byte images built here, field by field at the spec's offsets.

use super::*;

/// Writes `v`'s little-endian bytes at `off`.
fn put(img: &mut [u8], off: usize, v: &[u8]) {
    img[off..off + v.len()].copy_from_slice(v);
}

#[test]
fn smart_log_fields_at_spec_offsets() {
    let mut img = vec![0u8; 512];
    img[0] = critical::TEMPERATURE | critical::READ_ONLY;
    put(&mut img, 1, &323u16.to_le_bytes());
    img[3] = 97;
    img[4] = 10;
    img[5] = 3;
    img[6] = 0x01;
    put(&mut img, 32, &(1u128 << 70 | 5).to_le_bytes());
    put(&mut img, 48, &6u128.to_le_bytes());
    put(&mut img, 64, &7u128.to_le_bytes());
    put(&mut img, 80, &8u128.to_le_bytes());
    put(&mut img, 96, &9u128.to_le_bytes());
    put(&mut img, 112, &10u128.to_le_bytes());
    put(&mut img, 128, &11u128.to_le_bytes());
    put(&mut img, 144, &12u128.to_le_bytes());
    put(&mut img, 160, &13u128.to_le_bytes());
    put(&mut img, 176, &14u128.to_le_bytes());
    put(&mut img, 192, &15u32.to_le_bytes());
    put(&mut img, 196, &16u32.to_le_bytes());
    put(&mut img, 200, &300u16.to_le_bytes());
    put(&mut img, 214, &310u16.to_le_bytes());
    put(&mut img, 216, &17u32.to_le_bytes());
    put(&mut img, 220, &18u32.to_le_bytes());
    put(&mut img, 224, &19u32.to_le_bytes());
    put(&mut img, 228, &20u32.to_le_bytes());
    let s = parse_smart_log(&img).unwrap();
    assert_eq!(s.critical_warning, 0x0A);
    assert_eq!(critical_warnings(s.critical_warning), ["temperature out of range", "media read-only"]);
    assert_eq!(s.composite_temperature(), 323);
    assert_eq!(celsius(s.composite_temperature()), Some(50));
    assert_eq!((s.available_spare, s.available_spare_threshold, s.percentage_used), (97, 10, 3));
    assert_eq!(s.endurance_group_critical_warning, 1);
    assert_eq!(s.data_units_read(), 1u128 << 70 | 5);
    assert_eq!(
        [
            s.data_units_written(),
            s.host_read_commands(),
            s.host_write_commands(),
            s.controller_busy_time(),
            s.power_cycles(),
            s.power_on_hours(),
            s.unsafe_shutdowns(),
            s.media_errors(),
            s.error_log_entries()
        ],
        [6, 7, 8, 9, 10, 11, 12, 13, 14]
    );
    assert_eq!((s.warning_temperature_time(), s.critical_temperature_time()), (15, 16));
    assert_eq!((s.temperature_sensor(0), s.temperature_sensor(7), s.temperature_sensor(8)), (300, 310, 0));
    assert_eq!((s.thermal_transitions(1), s.thermal_transitions(2), s.thermal_transitions(3)), (17, 18, 0));
    assert_eq!((s.thermal_time(1), s.thermal_time(2), s.thermal_time(0)), (19, 20, 0));
}

#[test]
fn short_images_are_refused_by_name() {
    let e = parse_smart_log(&[0u8; 511]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("SMART"), "{e}");
    assert!(parse_firmware_log(&[0u8; 100]).is_err());
    assert!(parse_identify_controller(&[0u8; 4095]).is_err());
    assert!(parse_identify_namespace(&[]).is_err());
    assert!(parse_error_log(&[]).is_err());
    assert!(parse_error_log(&[0u8; 65]).is_err());
    // Longer images are fine (a log read in a bigger buffer).
    assert!(parse_smart_log(&[0u8; 4096]).is_ok());
}

#[test]
fn error_log_entries_at_spec_offsets() {
    let mut img = vec![0u8; 128];
    put(&mut img, 0, &42u64.to_le_bytes());
    put(&mut img, 8, &3u16.to_le_bytes());
    put(&mut img, 10, &0x1234u16.to_le_bytes());
    // Status field: SCT 0, SC 0x80 (LBA out of range), DNR, phase 1.
    put(&mut img, 12, &((1u16 << 14 | 0x80) << 1 | 1).to_le_bytes());
    put(&mut img, 14, &0x0208u16.to_le_bytes());
    put(&mut img, 16, &0xDEAD_BEEF_0000_0001u64.to_le_bytes());
    put(&mut img, 24, &2u32.to_le_bytes());
    img[28] = 0xC0;
    img[29] = 3;
    put(&mut img, 32, &99u64.to_le_bytes());
    put(&mut img, 40, &7u16.to_le_bytes());
    let log = parse_error_log(&img).unwrap();
    assert_eq!(log.len(), 2);
    let e = &log[0];
    assert_eq!((e.error_count(), e.sqid(), e.cid()), (42, 3, 0x1234));
    assert_eq!(e.status_field() & 1, 1);
    assert_eq!(e.status().sc, 0x80);
    assert!(e.status().dnr);
    assert_eq!(e.parameter_error_location(), 0x0208);
    assert_eq!((e.lba(), e.nsid()), (0xDEAD_BEEF_0000_0001, 2));
    assert_eq!((e.vendor_specific, e.transport_type), (0xC0, 3));
    assert_eq!((e.command_specific(), e.transport_specific()), (99, 7));
    // The second entry is empty, and kept.
    assert_eq!(log[1].error_count(), 0);
}

#[test]
fn firmware_log_slots() {
    let mut img = vec![0u8; 512];
    img[0] = 0x2 << 4 | 0x1;
    put(&mut img, 8, b"1.0     ");
    put(&mut img, 16, b"2.1-rc1 ");
    put(&mut img, 56, b"LAST\0\0\0\0");
    let f = parse_firmware_log(&img).unwrap();
    assert_eq!((f.active_slot(), f.next_slot()), (1, 2));
    assert_eq!(ascii(&f.frs[0]), "1.0");
    assert_eq!(ascii(&f.frs[1]), "2.1-rc1");
    assert_eq!(ascii(&f.frs[2]), "");
    assert_eq!(ascii(&f.frs[6]), "LAST");
}

#[test]
fn identify_images_at_spec_offsets() {
    let mut c = vec![0u8; 4096];
    put(&mut c, 0, &0x1b36u16.to_le_bytes());
    put(&mut c, 4, b"ugds0000            ");
    put(&mut c, 24, b"QEMU NVMe Ctrl");
    c[77] = 7;
    put(&mut c, 262, &[3]);
    put(&mut c, 266, &343u16.to_le_bytes());
    put(&mut c, 268, &373u16.to_le_bytes());
    put(&mut c, 280, &(1u128 << 40).to_le_bytes());
    put(&mut c, 516, &256u32.to_le_bytes());
    put(&mut c, 768, b"nqn.2019-08.org.qemu:ugds0000");
    let id = parse_identify_controller(&c).unwrap();
    assert_eq!(id.vid, 0x1b36);
    assert_eq!(ascii(&id.sn), "ugds0000");
    assert_eq!(ascii(&id.mn), "QEMU NVMe Ctrl");
    assert_eq!((id.mdts, id.elpe), (7, 3));
    assert_eq!((u16::from_le(id.wctemp), u16::from_le(id.cctemp)), (343, 373));
    assert_eq!(u128::from_le_bytes(id.tnvmcap), 1 << 40);
    assert_eq!(u32::from_le(id.nn), 256);
    assert_eq!(ascii(&id.subnqn), "nqn.2019-08.org.qemu:ugds0000");

    let mut n = vec![0u8; 4096];
    put(&mut n, 0, &262_144u64.to_le_bytes());
    put(&mut n, 8, &262_143u64.to_le_bytes());
    n[25] = 1;
    n[26] = 1;
    // LBA format 1: 4096-byte blocks (LBADS 12), 8 bytes of metadata.
    put(&mut n, 128 + 4, &(12u32 << 16 | 8).to_le_bytes());
    let ns = parse_identify_namespace(&n).unwrap();
    assert_eq!((ns.size_lbas(), ns.capacity_lbas(), ns.nlbaf), (262_144, 262_143, 1));
    assert_eq!((ns.format_index(), ns.lba_shift(), ns.format().ms()), (1, 12, 8));
}

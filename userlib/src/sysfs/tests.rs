use super::fake::Fake;
use super::*;
use crate::VolumeSpec;

const A: &str = "0000:00:03.0";
const B: &str = "0000:00:04.0";

/// Two controllers on the nvme driver, one namespace each, ugds loaded.
fn two() -> Fake {
    let f = Fake::new();
    f.driver("ugds");
    for (i, addr) in [A, B].iter().enumerate() {
        f.pci(addr, CLASS_NVME, Some("nvme"));
        let ctrl = format!("nvme{i}");
        f.nvme_ctrl(addr, &ctrl, &format!("SERIAL{i}"), &format!("250:{i}"));
        f.namespace(addr, &ctrl, 1, 64 << 20, 4096);
    }
    f
}

fn cand(addr: &str, driver: Option<&str>, users: &[&str]) -> Candidate {
    Candidate {
        addr: addr.into(),
        driver: driver.map(Into::into),
        users: users.iter().map(|u| u.to_string()).collect(),
    }
}

#[test]
fn a_named_list_is_all_or_nothing() {
    let c = [
        cand("0000:00:03.0", Some("nvme"), &[]),
        cand("0000:00:04.0", Some("nvme"), &["/dev/nvme1n1 is mounted on /mnt"]),
        cand("0000:00:05.0", Some("ugds"), &[]),
    ];
    let err = select(&c, false).unwrap_err().to_string();
    assert!(err.contains("0000:00:04.0: /dev/nvme1n1 is mounted on /mnt"), "{err}");
    assert!(!err.contains("0000:00:03.0"), "a free controller named as refused: {err}");
    let s = select(&[c[0].clone(), c[2].clone()], false).unwrap();
    assert_eq!(s.take, ["0000:00:03.0", "0000:00:05.0"]);
    assert!(s.refused.is_empty());
}

#[test]
fn all_takes_the_free_ones_and_names_the_rest() {
    let c = [
        cand("0000:00:03.0", Some("nvme"), &["/dev/nvme0n1p1 holds the root file system"]),
        cand("0000:00:04.0", None, &[]),
        cand("0000:00:05.0", Some("nvme"), &[]),
    ];
    let s = select(&c, true).unwrap();
    assert_eq!(s.take, ["0000:00:04.0", "0000:00:05.0"]);
    assert_eq!(s.refused, [("0000:00:03.0".to_string(), vec!["/dev/nvme0n1p1 holds the root file system".into()])]);
    let err = select(&c[..1], true).unwrap_err().to_string();
    assert!(err.contains("every NVMe controller is in use") && err.contains("root file system"), "{err}");
    assert!(select(&[], true).unwrap_err().to_string().contains("no NVMe controllers"));
}

#[test]
fn volume_spec_and_md_line_name_the_members_in_order() {
    let nodes: Vec<String> = ["/dev/ugds_drv2", "/dev/ugds_drv0"].map(Into::into).to_vec();
    assert_eq!(volume_spec(128 << 10, &nodes).unwrap(), "stripe:128K:/dev/ugds_drv2,/dev/ugds_drv0");
    assert_eq!(volume_spec(1 << 20, &nodes[..1]).unwrap(), "stripe:1M:/dev/ugds_drv2");
    assert!(volume_spec(3000, &nodes).is_err());
    assert!(volume_spec(128 << 10, &[]).is_err());
    let devs: Vec<String> = ["/dev/nvme1n1", "/dev/nvme0n1"].map(Into::into).to_vec();
    assert_eq!(
        md_build_line(128 << 10, &devs),
        "mdadm --build /dev/md0 --level=0 --chunk=128 --raid-devices=2 /dev/nvme1n1 /dev/nvme0n1"
    );
}

#[test]
fn targets_resolve_to_their_controller() {
    let f = two();
    let h = f.host();
    for t in [A, "nvme0", "/dev/nvme0", "nvme0n1", "/dev/nvme0n1"] {
        assert_eq!(h.resolve(t).unwrap(), A, "{t}");
    }
    assert_eq!(h.resolve("/dev/nvme1n1").unwrap(), B);
    assert!(matches!(h.resolve("nvme7"), Err(SysfsError::NoSuchTarget { .. })));
    assert!(matches!(h.resolve("0000:00:09.0"), Err(SysfsError::NoPciDevice { .. })));
    f.ugds_node(B, "ugds_drv0");
    assert_eq!(h.resolve("ugds_drv0").unwrap(), B);
}

#[test]
fn a_mounted_namespace_refuses_bind_and_changes_nothing() {
    let f = two();
    f.mount("259:16", "/data");
    let h = f.host();
    let err = h.bind(B).unwrap_err();
    let SysfsError::InUse { refused } = &err else { panic!("{err}") };
    assert_eq!(refused[0].1, ["/dev/nvme1n1 is mounted on /data"]);
    assert_eq!(f.override_of(B), "(null)\n", "a refused bind wrote driver_override");
    // A list naming it is refused whole: the free one is not bound either.
    let err = h.bind_many(&[A.into(), B.into()], false).unwrap_err().to_string();
    assert!(err.contains("refusing to bind any of them") && err.contains(B), "{err}");
    assert_eq!(f.override_of(A), "(null)\n");
    // The root file system is named as such.
    f.mount("259:0", "/");
    assert_eq!(h.users(A).unwrap(), ["/dev/nvme0n1 holds the root file system"]);
}

#[test]
fn md_membership_and_swap_refuse_bind() {
    let f = two();
    f.md("md0", &["nvme0n1"]);
    let h = f.host();
    assert_eq!(h.users(A).unwrap(), ["/dev/nvme0n1 is held by md0"]);
    assert!(h.users(B).unwrap().is_empty());
    fs::write(f.root().join("proc/swaps"), "Filename Type Size Used Priority\n/dev/nvme1n1 partition 1 0 -2\n")
        .unwrap();
    assert_eq!(h.users(B).unwrap(), ["/dev/nvme1n1 is used as swap"]);
    assert!(matches!(h.bind(A), Err(SysfsError::InUse { .. })));
}

#[test]
fn bad_targets_are_named_and_change_nothing() {
    let f = two();
    f.pci("0000:00:02.0", "0x030000", None);
    let h = f.host();
    let err = h.bind("0000:00:02.0").unwrap_err();
    assert!(matches!(err, SysfsError::NotNvme { ref class, .. } if class == "0x030000"), "{err}");
    assert!(matches!(h.unbind("0000:00:02.0"), Err(SysfsError::NotNvme { .. })));
    assert_eq!(f.override_of("0000:00:02.0"), "(null)\n");
    let err = h.bind_many(&["/dev/nvme0".into(), "nvme0n1".into()], false).unwrap_err();
    assert_eq!(err.to_string(), format!("/dev/nvme0 and nvme0n1 are the same controller ({A})"));
    assert!(matches!(h.unbind_many(&[], true), Err(SysfsError::NoneBound)));
    fs::remove_dir_all(f.root().join("sys/bus/pci/drivers/ugds")).unwrap();
    assert!(matches!(h.bind(A), Err(SysfsError::ModuleNotLoaded)));
    assert_eq!(f.override_of(A), "(null)\n");
}

#[test]
fn list_shows_drivers_identity_namespaces_and_volumes() {
    let f = two();
    f.pci("0000:00:05.0", CLASS_NVME, Some("ugds"));
    f.ugds_node("0000:00:05.0", "ugds_drv0");
    f.pci("0000:00:06.0", CLASS_NVME, Some("vfio-pci"));
    f.pci("0000:00:07.0", CLASS_NVME, None);
    f.pci("0000:00:02.0", "0x030000", None);
    f.md("md0", &["nvme1n1"]);
    let node = f.root().join("dev/ugds_drv0");
    f.volume("fast.ugds-volume", &VolumeSpec::parse(&format!("stripe:{}", node.display())).unwrap().descriptor());
    f.volume("broken.ugds-volume", "not a descriptor\n");
    let h = f.host();
    let l = h.controllers().unwrap();
    let addrs: Vec<&str> = l.iter().map(|c| c.addr.as_str()).collect();
    assert_eq!(addrs, [A, B, "0000:00:05.0", "0000:00:06.0", "0000:00:07.0"]);
    let drivers: Vec<Option<&str>> = l.iter().map(|c| c.driver.as_deref()).collect();
    assert_eq!(drivers, [Some("nvme"), Some("nvme"), Some("ugds"), Some("vfio-pci"), None]);
    assert_eq!(l[0].serial.as_deref(), Some("SERIAL0"));
    assert_eq!(l[0].model.as_deref(), Some("QEMU NVMe Ctrl"));
    assert_eq!(l[0].firmware.as_deref(), Some("9.1.0"));
    assert_eq!(l[0].pci_id.as_deref(), Some("1b36:0010"));
    assert_eq!(
        l[0].namespaces,
        [NamespaceEntry {
            id: 1,
            size: 64 << 20,
            block_size: 4096,
            block_device: Some(f.root().join("dev/nvme0n1").display().to_string())
        }]
    );
    assert!(l[0].md_arrays.is_empty());
    assert_eq!(l[1].md_arrays, ["md0"]);
    assert_eq!(l[2].ugds_nodes, [node.display().to_string()]);
    assert_eq!(l[2].volumes, [f.root().join("etc/ugds/volumes/fast.ugds-volume").display().to_string()]);
    assert!(l[2].serial.is_none() && l[2].namespaces.is_empty());
    let files = h.volume_files();
    assert_eq!(files.len(), 2);
    assert!(files.iter().any(|v| v.path.ends_with("broken.ugds-volume") && v.spec.is_err()));
    assert_eq!(
        md_arrays(&h)[0],
        MdArray { name: "md0".into(), level: Some("raid0".into()), members: vec!["nvme1n1".into()] }
    );
}

#[test]
fn info_from_the_module_fills_identity_and_namespaces() {
    let mut e = ControllerEntry::default();
    let mut info: ugds_uapi::ioctl::DeviceInfo = blank();
    info.serial[..4].copy_from_slice(b"S123");
    info.serial[4..].fill(b' ');
    info.model[..4].copy_from_slice(b"QEMU");
    info.num_namespaces = 2;
    info.namespaces[0] =
        ugds_uapi::ioctl::NamespaceInfo { nsid: 1, lba_shift: 12, pi_type: 0, metadata_bytes: 0, size_lbas: 16 };
    info.namespaces[1] =
        ugds_uapi::ioctl::NamespaceInfo { nsid: 3, lba_shift: 9, pi_type: 0, metadata_bytes: 0, size_lbas: 8 };
    e.fill_from_info(&info);
    assert_eq!(e.serial.as_deref(), Some("S123"));
    assert_eq!(e.model.as_deref(), Some("QEMU"));
    assert_eq!(e.firmware.as_deref(), Some(""));
    assert_eq!(
        e.namespaces.iter().map(|n| (n.id, n.size, n.block_size)).collect::<Vec<_>>(),
        [(1, 65536, 4096), (3, 4096, 512)]
    );
}

fn blank() -> ugds_uapi::ioctl::DeviceInfo {
    crate::device::blank_info()
}

#[test]
fn group_access_needs_a_translating_iommu() {
    let f = two();
    let h = f.host();
    let err = h.check_group_access("/dev/ugds_drv0", A).unwrap_err();
    assert!(matches!(err, SysfsError::GroupAccessWithoutIommu { .. }), "{err}");
    assert!(err.to_string().contains("no IOMMU group"), "{err}");
    f.iommu_group(A, "7", "identity");
    let err = h.check_group_access("/dev/ugds_drv0", A).unwrap_err().to_string();
    assert!(err.contains("IOMMU group 7 is identity, which does not translate"), "{err}");
    assert_eq!(h.iommu(A), Iommu::Passthrough { group: "7".into(), domain: "identity".into() });
    f.iommu_group(B, "8", "DMA-FQ");
    assert!(h.check_group_access("/dev/ugds_drv1", B).is_ok());
    assert_eq!(h.controllers().unwrap()[1].iommu_group.as_deref(), Some("8"));
}

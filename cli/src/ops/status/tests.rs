use super::*;

fn op(tgid: u32, qpairs: u32, registrations: u32, pinned: u64, flags: u32) -> Opener {
    Opener { tgid, flags, qpairs, registrations, pinned_bytes: pinned, dmabuf_bytes: 0 }
}

#[test]
fn files_are_grouped_by_process_and_our_own_handle_is_left_out() {
    let openers = [op(7, 0, 0, 0, 0), op(42, 2, 1, 8192, 0), op(7, 1, 0, 0, 0), op(42, 1, 2, 4096, OPENER_EXCLUSIVE)];
    let p = by_process(&openers, 7, |pid| Some(format!("p{pid}")));
    assert_eq!(p.len(), 2);
    assert_eq!((p[0].pid, p[0].files, p[0].qpairs), (7, 1, 1), "{p:?}");
    assert_eq!(
        (p[1].files, p[1].qpairs, p[1].registrations, p[1].pinned_bytes, p[1].exclusive),
        (2, 3, 3, 12288, true)
    );
    assert_eq!(p[1].comm.as_deref(), Some("p42"));
}

#[test]
fn the_exposition_is_well_formed_and_carries_every_figure() {
    let s = NodeStatus {
        node: "/dev/ugds_drv0".into(),
        pci: Some("0000:00:03.0".into()),
        serial: "ser\"ial".into(),
        faulted: true,
        epoch: 5,
        resets: 2,
        timeouts: 3,
        qpairs: 4,
        registrations: 1,
        pinned_bytes: 1 << 20,
        processes: vec![Process {
            pid: 9,
            comm: Some("x".into()),
            qpairs: 4,
            pinned_bytes: 1 << 20,
            ..Default::default()
        }],
        ..Default::default()
    };
    let text = exposition(&[s], &[("/dev/ugds_drv1".into(), "busy".into())]);
    let samples = super::metrics::parse::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let get =
        |name: &str, node: &str| samples.iter().find(|x| x.name == name && x.labels["node"] == node).map(|x| x.value);
    assert_eq!(get("ugds_node_up", "/dev/ugds_drv0"), Some(1.0));
    assert_eq!(get("ugds_node_up", "/dev/ugds_drv1"), Some(0.0));
    assert_eq!(get("ugds_faulted", "/dev/ugds_drv0"), Some(1.0));
    assert_eq!(get("ugds_resets_total", "/dev/ugds_drv0"), Some(2.0));
    assert_eq!(get("ugds_timeouts_total", "/dev/ugds_drv0"), Some(3.0));
    assert_eq!(get("ugds_pinned_bytes", "/dev/ugds_drv0"), Some(1048576.0));
    assert_eq!(get("ugds_process_queue_pairs", "/dev/ugds_drv0"), Some(4.0));
    let p = samples.iter().find(|x| x.name == "ugds_process_pinned_bytes").unwrap();
    assert_eq!((p.labels["pid"].as_str(), p.value), ("9", 1048576.0));
    assert!(samples.iter().any(|x| x.labels.get("serial").is_some_and(|v| v == "ser\"ial")));
    let j = to_json(&exposition_free_status());
    assert_eq!(j["state"], "ok");
}

fn exposition_free_status() -> NodeStatus {
    NodeStatus { node: "/dev/ugds_drv0".into(), ..Default::default() }
}

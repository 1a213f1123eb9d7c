//! `ugds id-ctrl`, `id-ns`, `smart-log`, `error-log`, `fw-log`: controller health through the
//! module's restricted admin pass-through (docs/health.md). Each prints `name : value` lines,
//! or with `--json` one JSON object whose field names follow nvme-cli's where it has them.

use clap::Subcommand;
use serde::Serialize;
use std::collections::BTreeMap;
use ugds::health::{ascii, celsius, critical_warnings};
use ugds::{Device, DeviceOptions};

/// The health subcommands (flattened into the CLI's own).
#[derive(Subcommand)]
pub(crate) enum HealthCmd {
    /// Identify Controller, read from the controller now (through the module's admin queue).
    IdCtrl {
        /// The device node (/dev/ugds_drvN).
        dev: String,
    },
    /// Identify Namespace.
    IdNs {
        /// The device node.
        dev: String,
        /// Namespace id.
        #[arg(short = 'n', long = "namespace-id", default_value_t = 1)]
        nsid: u32,
    },
    /// The SMART / Health Information log (temperature, spare, wear, error counters).
    SmartLog {
        /// The device node.
        dev: String,
    },
    /// The Error Information log (every entry the controller keeps, most recent first).
    ErrorLog {
        /// The device node.
        dev: String,
    },
    /// The Firmware Slot Information log.
    FwLog {
        /// The device node.
        dev: String,
    },
}

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Opens `dev` with the least it needs: one queue pair of two entries (the pass-through does
/// not use it; opening the device creates at least one).
fn open(dev: &str) -> Res<Device> {
    Ok(Device::open_with(dev, DeviceOptions { queues: 1, depth: 2, ..Default::default() })?)
}

/// Runs one health subcommand.
pub(crate) fn run(cmd: HealthCmd, json: bool) -> Res<()> {
    match cmd {
        HealthCmd::IdCtrl { dev } => emit(&id_ctrl(&open(&dev)?)?, json),
        HealthCmd::IdNs { dev, nsid } => emit(&id_ns(&open(&dev)?, nsid)?, json),
        HealthCmd::SmartLog { dev } => emit(&smart_log(&open(&dev)?)?, json),
        HealthCmd::ErrorLog { dev } => emit(&error_log(&open(&dev)?)?, json),
        HealthCmd::FwLog { dev } => emit(&fw_log(&open(&dev)?)?, json),
    }
}

/// Prints `v` as one JSON object, or as `name : value` lines (nested lists one line each).
fn emit<T: Serialize>(v: &T, json: bool) -> Res<()> {
    let value = serde_json::to_value(v)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    let Some(obj) = value.as_object() else { return Err("not an object".into()) };
    for (k, v) in obj {
        match v {
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    println!("{k}[{i}] : {}", plain(item));
                }
            }
            v => println!("{k:<40}: {}", plain(v)),
        }
    }
    Ok(())
}

/// A JSON value as a readable word: strings without quotes, objects as `k:v` pairs.
fn plain(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Object(m) => {
            m.iter().map(|(k, v)| format!("{k}:{}", plain(v))).collect::<Vec<_>>().join(" ")
        }
        v => v.to_string(),
    }
}

/// A 128-bit counter: a number when it fits 64 bits (every tool reads those), else its
/// decimal digits as a string (JSON readers lose precision past 2^53 anyway).
fn n128(v: u128) -> serde_json::Value {
    match u64::try_from(v) {
        Ok(n) => n.into(),
        Err(_) => v.to_string().into(),
    }
}

#[derive(Serialize)]
struct IdCtrl {
    vid: u16,
    ssvid: u16,
    sn: String,
    mn: String,
    fr: String,
    rab: u8,
    ieee: u32,
    cmic: u8,
    mdts: u8,
    cntlid: u16,
    ver: u32,
    rtd3r: u32,
    rtd3e: u32,
    oaes: u32,
    ctratt: u32,
    oacs: u16,
    acl: u8,
    aerl: u8,
    frmw: u8,
    lpa: u8,
    elpe: u8,
    npss: u8,
    avscc: u8,
    apsta: u8,
    wctemp: u16,
    cctemp: u16,
    tnvmcap: serde_json::Value,
    unvmcap: serde_json::Value,
    sqes: u8,
    cqes: u8,
    maxcmd: u16,
    nn: u32,
    oncs: u16,
    fuses: u16,
    fna: u8,
    vwc: u8,
    awun: u16,
    awupf: u16,
    sgls: u32,
    subnqn: String,
}

fn id_ctrl(d: &Device) -> Res<IdCtrl> {
    let c = d.identify_controller()?;
    Ok(IdCtrl {
        vid: u16::from_le(c.vid),
        ssvid: u16::from_le(c.ssvid),
        sn: ascii(&c.sn),
        mn: ascii(&c.mn),
        fr: ascii(&c.fr),
        rab: c.rab,
        ieee: u32::from_le_bytes([c.ieee[0], c.ieee[1], c.ieee[2], 0]),
        cmic: c.cmic,
        mdts: c.mdts,
        cntlid: u16::from_le(c.cntlid),
        ver: u32::from_le(c.ver),
        rtd3r: u32::from_le(c.rtd3r),
        rtd3e: u32::from_le(c.rtd3e),
        oaes: u32::from_le(c.oaes),
        ctratt: u32::from_le(c.ctratt),
        oacs: u16::from_le(c.oacs),
        acl: c.acl,
        aerl: c.aerl,
        frmw: c.frmw,
        lpa: c.lpa,
        elpe: c.elpe,
        npss: c.npss,
        avscc: c.avscc,
        apsta: c.apsta,
        wctemp: u16::from_le(c.wctemp),
        cctemp: u16::from_le(c.cctemp),
        tnvmcap: n128(u128::from_le_bytes(c.tnvmcap)),
        unvmcap: n128(u128::from_le_bytes(c.unvmcap)),
        sqes: c.sqes,
        cqes: c.cqes,
        maxcmd: u16::from_le(c.maxcmd),
        nn: u32::from_le(c.nn),
        oncs: u16::from_le(c.oncs),
        fuses: u16::from_le(c.fuses),
        fna: c.fna,
        vwc: c.vwc,
        awun: u16::from_le(c.awun),
        awupf: u16::from_le(c.awupf),
        sgls: u32::from_le(c.sgls),
        subnqn: ascii(&c.subnqn),
    })
}

#[derive(Serialize)]
struct Lbaf {
    ms: u16,
    ds: u8,
    rp: u8,
    in_use: bool,
}

#[derive(Serialize)]
struct IdNs {
    nsid: u32,
    nsze: u64,
    ncap: u64,
    nuse: u64,
    nsfeat: u8,
    nlbaf: u8,
    flbas: u8,
    mc: u8,
    dpc: u8,
    dps: u8,
    /// Bytes per logical block of the format in use (2^ds).
    lba_size: u64,
    lbafs: Vec<Lbaf>,
}

fn id_ns(d: &Device, nsid: u32) -> Res<IdNs> {
    let n = d.identify_namespace(nsid)?;
    let formats = (usize::from(n.nlbaf) + 1).min(n.lbaf.len());
    let lbafs = n.lbaf[..formats]
        .iter()
        .enumerate()
        .map(|(i, f)| Lbaf { ms: f.ms(), ds: f.lbads(), rp: f.rp(), in_use: i == n.format_index() })
        .collect();
    Ok(IdNs {
        nsid,
        nsze: n.size_lbas(),
        ncap: n.capacity_lbas(),
        nuse: u64::from_le(n.nuse),
        nsfeat: n.nsfeat,
        nlbaf: n.nlbaf,
        flbas: n.flbas,
        mc: n.mc,
        dpc: n.dpc,
        dps: n.dps,
        lba_size: 1u64.checked_shl(u32::from(n.lba_shift())).unwrap_or(0),
        lbafs,
    })
}

#[derive(Serialize)]
struct Smart {
    critical_warning: u8,
    /// The names of the warning bits set.
    critical_warnings: Vec<&'static str>,
    /// Composite temperature, kelvins (as nvme-cli's JSON).
    temperature: u16,
    temperature_celsius: Option<i32>,
    avail_spare: u8,
    spare_thresh: u8,
    percent_used: u8,
    endurance_grp_critical_warning_summary: u8,
    data_units_read: serde_json::Value,
    data_units_written: serde_json::Value,
    host_read_commands: serde_json::Value,
    host_write_commands: serde_json::Value,
    controller_busy_time: serde_json::Value,
    power_cycles: serde_json::Value,
    power_on_hours: serde_json::Value,
    unsafe_shutdowns: serde_json::Value,
    media_errors: serde_json::Value,
    num_err_log_entries: serde_json::Value,
    warning_temp_time: u32,
    critical_comp_time: u32,
    /// `temperature_sensor_N` (kelvins) for each sensor the controller reports.
    #[serde(flatten)]
    sensors: BTreeMap<String, u16>,
    thm_temp1_trans_count: u32,
    thm_temp2_trans_count: u32,
    thm_temp1_total_time: u32,
    thm_temp2_total_time: u32,
}

fn smart_log(d: &Device) -> Res<Smart> {
    let s = d.smart_log()?;
    let sensors = (0..8)
        .filter(|&i| s.temperature_sensor(i) != 0)
        .map(|i| (format!("temperature_sensor_{}", i + 1), s.temperature_sensor(i)))
        .collect();
    Ok(Smart {
        critical_warning: s.critical_warning,
        critical_warnings: critical_warnings(s.critical_warning),
        temperature: s.composite_temperature(),
        temperature_celsius: celsius(s.composite_temperature()),
        avail_spare: s.available_spare,
        spare_thresh: s.available_spare_threshold,
        percent_used: s.percentage_used,
        endurance_grp_critical_warning_summary: s.endurance_group_critical_warning,
        data_units_read: n128(s.data_units_read()),
        data_units_written: n128(s.data_units_written()),
        host_read_commands: n128(s.host_read_commands()),
        host_write_commands: n128(s.host_write_commands()),
        controller_busy_time: n128(s.controller_busy_time()),
        power_cycles: n128(s.power_cycles()),
        power_on_hours: n128(s.power_on_hours()),
        unsafe_shutdowns: n128(s.unsafe_shutdowns()),
        media_errors: n128(s.media_errors()),
        num_err_log_entries: n128(s.error_log_entries()),
        warning_temp_time: s.warning_temperature_time(),
        critical_comp_time: s.critical_temperature_time(),
        sensors,
        thm_temp1_trans_count: s.thermal_transitions(1),
        thm_temp2_trans_count: s.thermal_transitions(2),
        thm_temp1_total_time: s.thermal_time(1),
        thm_temp2_total_time: s.thermal_time(2),
    })
}

#[derive(Serialize)]
struct ErrorEntry {
    error_count: u64,
    sqid: u16,
    cmdid: u16,
    /// The status (bits 15:1 of the entry's status field).
    status_field: u16,
    /// The status in words.
    status: String,
    phase_tag: u16,
    parm_err_loc: u16,
    lba: u64,
    nsid: u32,
    vs: u8,
    trtype: u8,
    cs: u64,
    trtype_spec_info: u16,
}

#[derive(Serialize)]
struct ErrorLog {
    /// Entries the controller keeps (Identify Controller ELPE + 1, as far as one command reads).
    entries: usize,
    errors: Vec<ErrorEntry>,
}

fn error_log(d: &Device) -> Res<ErrorLog> {
    let log = d.error_log()?;
    let errors = log
        .iter()
        .map(|e| ErrorEntry {
            error_count: e.error_count(),
            sqid: e.sqid(),
            cmdid: e.cid(),
            status_field: e.status_field() >> 1,
            status: e.status().to_string(),
            phase_tag: e.status_field() & 1,
            parm_err_loc: e.parameter_error_location(),
            lba: e.lba(),
            nsid: e.nsid(),
            vs: e.vendor_specific,
            trtype: e.transport_type,
            cs: e.command_specific(),
            trtype_spec_info: e.transport_specific(),
        })
        .collect();
    Ok(ErrorLog { entries: log.len(), errors })
}

#[derive(Serialize)]
struct FwLog {
    afi: u8,
    active_slot: u8,
    next_slot: u8,
    /// `frsN`: the firmware revision in slot N, for each slot that holds one.
    #[serde(flatten)]
    slots: BTreeMap<String, String>,
}

fn fw_log(d: &Device) -> Res<FwLog> {
    let f = d.firmware_log()?;
    let slots = f
        .frs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.iter().any(|&b| b != 0))
        .map(|(i, r)| (format!("frs{}", i + 1), ascii(r)))
        .collect();
    Ok(FwLog { afi: f.afi, active_slot: f.active_slot(), next_slot: f.next_slot(), slots })
}

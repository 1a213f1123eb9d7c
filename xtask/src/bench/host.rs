//! The machine a benchmark's VM ran on, recorded beside its figures: its CPU model and count,
//! its load average before and after, and how its CPU time went while the VM ran (busy, and
//! stolen by a hypervisor underneath it). The guest's CPUs are emulated (TCG), so every figure
//! moves with the host's speed: the same build's IOPS differ several times over between hosts,
//! and a run on one host is comparable with another only through the ratios measured in its
//! own turns. The record says which host a recorded run had, and a host whose hypervisor took
//! a share of its busy CPU time is named in the report.

use serde_json::{json, Value};

/// The share of the host's busy CPU time a hypervisor may take before a report warns about it
/// (of busy time, not of all: steal builds up only on CPUs with work, and a host of many idle
/// CPUs would hide it in its idle time).
pub const STEAL_WARN: f64 = 0.05;

/// The host's CPU time counters, summed over its CPUs (the `cpu` line of `/proc/stat`, in clock
/// ticks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every state's ticks together.
    total: u64,
    /// Ticks neither idle nor waiting for I/O (stolen ones included).
    busy: u64,
    /// Ticks a hypervisor ran something else while this host had work (`steal`).
    steal: u64,
}

impl CpuTimes {
    /// The counters of a `/proc/stat` text: `None` without its `cpu` line. Guest time is
    /// counted in user time already and left out; a kernel without the steal field reads 0.
    pub fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().find(|l| l.split_whitespace().next() == Some("cpu"))?;
        let ticks: Vec<u64> = line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>().ok()?;
        // user nice system idle iowait irq softirq steal [guest guest_nice]
        let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
        if ticks.len() < 4 {
            return None;
        }
        let total: u64 = (0..8).map(at).sum();
        Some(CpuTimes { total, busy: total - at(3) - at(4), steal: at(7) })
    }
}

/// Between two readings: the share of the host's CPU time that was busy (stolen time
/// included), and the share of that busy time a hypervisor stole; `None` when no time passed or
/// a counter went back (the stolen share 0 when nothing was busy).
pub fn shares(before: CpuTimes, after: CpuTimes) -> Option<(f64, f64)> {
    let total = after.total.checked_sub(before.total).filter(|&t| t > 0)? as f64;
    let busy = after.busy.checked_sub(before.busy)? as f64;
    let steal = after.steal.checked_sub(before.steal)? as f64;
    Some((busy / total, if busy > 0.0 { steal / busy } else { 0.0 }))
}

/// CPUs a `/proc/stat` text counts (its `cpuN` lines).
fn cpus_of(stat: &str) -> usize {
    stat.lines().filter(|l| l.strip_prefix("cpu").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))).count()
}

/// A benchmark's host, from the VM's start ([`HostRun::start`]) to its end ([`HostRun::finish`]).
pub struct HostRun {
    load_before: String,
    before: Option<CpuTimes>,
}

/// What [`HostRun::finish`] records.
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    /// The CPU model (`/proc/cpuinfo`'s first `model name`), empty where unknown.
    pub cpu_model: String,
    /// CPUs the host's counters cover (`cpuN` lines of `/proc/stat`).
    pub cpus: usize,
    /// `/proc/loadavg` before and after.
    pub load: [String; 2],
    /// While the VM ran: the share of the host's CPU time busy (stolen included), and the
    /// share of that busy time stolen by a hypervisor.
    pub busy_share: Option<f64>,
    pub steal_share: Option<f64>,
}

fn read_stat() -> Option<String> {
    std::fs::read_to_string("/proc/stat").ok()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string()
}

impl HostRun {
    /// Takes the readings before the VM boots.
    pub fn start() -> HostRun {
        HostRun { load_before: loadavg(), before: read_stat().as_deref().and_then(CpuTimes::parse) }
    }

    /// Takes the readings after the VM stopped.
    pub fn finish(self) -> Host {
        let stat = read_stat().unwrap_or_default();
        let s = self.before.zip(CpuTimes::parse(&stat)).and_then(|(b, a)| shares(b, a));
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string())
            })
            .unwrap_or_default();
        Host {
            cpu_model,
            cpus: cpus_of(&stat),
            load: [self.load_before, loadavg()],
            busy_share: s.map(|s| s.0),
            steal_share: s.map(|s| s.1),
        }
    }
}

impl Host {
    /// The report's `host` object.
    pub fn json(&self) -> Value {
        json!({ "cpu_model": self.cpu_model, "cpus": self.cpus, "loadavg_before": self.load[0],
                "loadavg_after": self.load[1], "busy_share": self.busy_share, "steal_share": self.steal_share })
    }

    /// The report's paragraph about the host: what it was and how loaded, and a warning where a
    /// hypervisor took more than [`STEAL_WARN`] of its CPU time.
    pub fn markdown(&self) -> String {
        let three = |l: &str| l.split_whitespace().take(3).collect::<Vec<_>>().join(", ");
        let model = if self.cpu_model.is_empty() { "unknown CPU" } else { &self.cpu_model };
        let mut s = format!(
            "\nHost: {} CPUs ({model}); load average (1, 5, 15 min) {} before the VM, {} after",
            self.cpus,
            three(&self.load[0]),
            three(&self.load[1])
        );
        if let (Some(b), Some(st)) = (self.busy_share, self.steal_share) {
            s.push_str(&format!(
                "; while it ran, its CPUs were busy {:.0}% of the time, {:.1}% of that stolen by a hypervisor",
                b * 100.0,
                st * 100.0
            ));
        }
        s.push('.');
        if self.steal_share.is_some_and(|st| st > STEAL_WARN) {
            s.push_str(&format!(
                " The hypervisor under this host took more than {:.0}% of its busy time: the \
                 emulated CPUs lost time unevenly, which slows the absolute figures and adds noise \
                 to the ratios.",
                STEAL_WARN * 100.0
            ));
        }
        s.push('\n');
        s
    }

    /// A line for the terminal when the host was stolen from, else `None`.
    pub fn warning(&self) -> Option<String> {
        let st = self.steal_share.filter(|&st| st > STEAL_WARN)?;
        Some(format!("bench: a hypervisor took {:.0}% of this host's busy CPU time during the run", st * 100.0))
    }

    /// Prints [`Host::warning`], if any, on stderr: the last thing a benchmark says.
    pub fn warn(&self) {
        if let Some(w) = self.warning() {
            eprintln!("{w}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_A: &str = "cpu  100 10 50 800 20 0 5 15 0 0\ncpu0 50 5 25 400 10 0 2 7 0 0\nintr 1 2 3\n";
    const STAT_B: &str = "cpu  400 10 90 1000 30 0 5 115 7 0\ncpu0 200 5 45 500 15 0 2 57 3 0\nintr 1 2 3\n";

    #[test]
    fn the_hosts_cpu_time_is_read_from_the_summed_line() {
        let a = CpuTimes::parse(STAT_A).unwrap();
        assert_eq!(a, CpuTimes { total: 1000, busy: 180, steal: 15 });
        // Guest ticks (9th field) are inside user time already: not counted twice.
        let b = CpuTimes::parse(STAT_B).unwrap();
        assert_eq!(b, CpuTimes { total: 1650, busy: 620, steal: 115 });
        assert_eq!(CpuTimes::parse("intr 1 2\n"), None);
        assert_eq!(CpuTimes::parse("cpu 1 x 3 4\n"), None);
        // An old kernel's line without steal.
        assert_eq!(CpuTimes::parse("cpu 1 2 3 4\n"), Some(CpuTimes { total: 10, busy: 6, steal: 0 }));
    }

    #[test]
    fn the_cpus_are_the_counted_ones() {
        assert_eq!(cpus_of(STAT_A), 1);
        assert_eq!(cpus_of("cpu  1 2 3 4\ncpu0 1 1 1 1\ncpu1 0 1 2 3\ncpu12 1 1 1 1\nintr 5\n"), 3);
    }

    #[test]
    fn busy_and_stolen_shares_come_from_the_difference_of_two_readings() {
        let (a, b) = (CpuTimes::parse(STAT_A).unwrap(), CpuTimes::parse(STAT_B).unwrap());
        let (busy, steal) = shares(a, b).unwrap();
        assert!((busy - 440.0 / 650.0).abs() < 1e-9, "{busy}");
        // Of the busy time: 100 of 440 ticks, where of all the time it would read 15%.
        assert!((steal - 100.0 / 440.0).abs() < 1e-9, "{steal}");
        let idle = CpuTimes { total: 2000, busy: 180, steal: 15 };
        assert_eq!(shares(a, idle), Some((0.0, 0.0)), "nothing busy, nothing stolen");
        assert_eq!(shares(a, a), None, "no time passed");
        assert_eq!(shares(b, a), None, "counters went back");
    }

    fn host(steal: f64) -> Host {
        Host {
            cpu_model: "AMD EPYC".into(),
            cpus: 2,
            load: ["0.50 0.60 0.70 1/80 100".into(), "1.50 1.00 0.80 1/80 200".into()],
            busy_share: Some(0.9),
            steal_share: Some(steal),
        }
    }

    #[test]
    fn a_host_whose_hypervisor_took_its_time_is_named_in_the_report() {
        let quiet = host(0.01);
        let md = quiet.markdown();
        assert!(md.contains("2 CPUs (AMD EPYC)"), "{md}");
        assert!(md.contains("0.50, 0.60, 0.70 before the VM, 1.50, 1.00, 0.80 after"), "{md}");
        assert!(md.contains("its CPUs were busy 90% of the time, 1.0% of that stolen"), "{md}");
        assert!(!md.contains("took more than"), "{md}");
        assert_eq!(quiet.warning(), None);
        let stolen = host(0.3);
        assert!(stolen.markdown().contains("The hypervisor under this host took more than 5% of its busy time"));
        assert!(stolen.warning().unwrap().contains("30%"));
        assert_eq!(stolen.json()["steal_share"], 0.3);
        assert_eq!(stolen.json()["cpus"], 2);
    }
}

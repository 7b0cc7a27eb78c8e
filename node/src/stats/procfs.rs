//! The node's figures that `/proc` gives: memory (`/proc/meminfo`) where the root
//! cgroup has none (cgroup v2), CPU time and boot time (`/proc/stat`), network
//! interfaces (`/proc/net/dev`, the default route's from `/proc/net/route`), the
//! process count (`/proc/loadavg`) and limit (`/proc/sys/kernel/pid_max`).

use std::collections::BTreeMap;

/// `USER_HZ`: the unit of `/proc/stat`'s CPU times on every Linux ABI.
const USER_HZ: u64 = 100;

/// `/proc/meminfo`, in bytes, by key.
pub fn parse_meminfo(text: &str) -> BTreeMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, rest) = l.split_once(':')?;
            let mut parts = rest.split_whitespace();
            let v: u64 = parts.next()?.parse().ok()?;
            let scale = if parts.next() == Some("kB") { 1024 } else { 1 };
            Some((k.trim(), v * scale))
        })
        .collect()
}

/// The node's memory from meminfo as cAdvisor's machine-level figures: usage is
/// `MemTotal - MemFree`, the working set that less `Inactive(file)`.
pub fn meminfo_memory(text: &str) -> Option<super::cgroupfs::MemorySample> {
    let m = parse_meminfo(text);
    let total = *m.get("MemTotal")?;
    let usage = total.saturating_sub(*m.get("MemFree")?);
    let inactive = m.get("Inactive(file)").copied().unwrap_or(0);
    Some(super::cgroupfs::MemorySample {
        usage_bytes: usage,
        working_set_bytes: usage.saturating_sub(inactive),
        rss_bytes: m.get("AnonPages").copied(),
        cache_bytes: m.get("Cached").copied(),
        page_faults: None,
        major_page_faults: None,
        limit_bytes: Some(total),
    })
}

/// `/proc/stat`: the busy CPU time of every CPU in ns (user, nice, system, irq,
/// softirq, steal; not idle or iowait), and the boot time in seconds since the epoch.
pub fn parse_proc_stat(text: &str) -> (Option<u64>, Option<i64>) {
    let mut cpu = None;
    let mut btime = None;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        match parts.next() {
            Some("cpu") => {
                let v: Vec<u64> = parts.filter_map(|p| p.parse().ok()).collect();
                if v.len() >= 8 {
                    let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
                    cpu = Some(busy * (1_000_000_000 / USER_HZ));
                }
            }
            Some("btime") => btime = parts.next().and_then(|p| p.parse().ok()),
            _ => {}
        }
    }
    (cpu, btime)
}

/// One interface's counters from `/proc/net/dev`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetDev {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// `/proc/net/dev`, without loopback.
pub fn parse_net_dev(text: &str) -> Vec<NetDev> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let v: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            (v.len() >= 16 && name.trim() != "lo").then(|| NetDev {
                name: name.trim().to_owned(),
                rx_bytes: v[0],
                rx_packets: v[1],
                rx_errors: v[2],
                rx_dropped: v[3],
                tx_bytes: v[8],
                tx_packets: v[9],
                tx_errors: v[10],
                tx_dropped: v[11],
            })
        })
        .collect()
}

/// The interface of the default route in `/proc/net/route`.
pub fn default_route_interface(text: &str) -> Option<String> {
    text.lines().skip(1).find_map(|l| {
        let mut parts = l.split_whitespace();
        let iface = parts.next()?;
        (parts.next()? == "00000000").then(|| iface.to_owned())
    })
}

/// `/proc/loadavg`'s `running/total`: the total.
pub fn parse_loadavg_total(text: &str) -> Option<i64> {
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_gives_the_nodes_working_set() {
        let text = "MemTotal:       16384000 kB\nMemFree:         4096000 kB\nMemAvailable:    8192000 kB\nInactive(file):  1024000 kB\nAnonPages:       2048000 kB\nHugePages_Total:       0\n";
        let m = parse_meminfo(text);
        assert_eq!(m["MemTotal"], 16384000 * 1024);
        assert_eq!(m["HugePages_Total"], 0);
        let s = meminfo_memory(text).unwrap();
        assert_eq!(s.usage_bytes, (16384000 - 4096000) * 1024);
        assert_eq!(s.working_set_bytes, (16384000 - 4096000 - 1024000) * 1024);
        assert_eq!(s.rss_bytes, Some(2048000 * 1024));
        assert!(meminfo_memory("MemFree: 1 kB\n").is_none());
    }

    #[test]
    fn proc_stat_net_dev_route_and_loadavg_are_parsed() {
        let stat =
            "cpu  100 5 50 1000 7 3 2 1 0 0\ncpu0 50 2 25 500 3 1 1 0 0 0\nbtime 1700000000\n";
        assert_eq!(
            parse_proc_stat(stat),
            (
                Some((100 + 5 + 50 + 3 + 2 + 1) * 10_000_000),
                Some(1700000000)
            )
        );
        let dev = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  eth0: 5000 40 1 4 0 0 0 0 3000 30 2 5 0 0 0 0\n";
        assert_eq!(
            parse_net_dev(dev),
            vec![NetDev {
                name: "eth0".into(),
                rx_bytes: 5000,
                rx_packets: 40,
                rx_errors: 1,
                rx_dropped: 4,
                tx_bytes: 3000,
                tx_packets: 30,
                tx_errors: 2,
                tx_dropped: 5,
            }]
        );
        let route = "Iface\tDestination\tGateway\tFlags\nens4\t0000A8C0\t00000000\t0001\neth0\t00000000\t0100A8C0\t0003\n";
        assert_eq!(default_route_interface(route).as_deref(), Some("eth0"));
        assert_eq!(
            parse_loadavg_total("0.10 0.20 0.30 2/345 6789\n"),
            Some(345)
        );
    }
}

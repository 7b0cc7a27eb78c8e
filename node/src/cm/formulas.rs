//! The kubelet's cgroup arithmetic, one pure function per formula, each with a table
//! test: CPU shares and CFS quota (`helpers_linux.go`), cgroup v2 `cpu.weight` and
//! `cpu.max` (`cgroup_manager_linux.go`), the pod cgroup's values
//! (`ResourceConfigForPod`), the node allocatable cgroup's values
//! (`node_container_manager_linux.go`), the burstable QoS cgroup's shares
//! (`qos_container_manager_linux.go`, `setCPUCgroupConfig`) and `oom_score_adj`
//! (`pkg/kubelet/qos/policy.go`).
//!
//! Shares and quota themselves live in [`crate::podspec`] (containers use them too);
//! this module calls them.

use std::io;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub use crate::podspec::{CPU_PERIOD_US, milli_cpu_to_quota, milli_cpu_to_shares};
use crate::{qos, quantity, resources};

/// The smallest `cpu.shares` (`MinShares`): what BestEffort pods and the besteffort
/// QoS cgroup get.
pub const MIN_SHARES: u64 = 2;
/// The largest `cpu.shares` (`MaxShares`).
pub const MAX_SHARES: u64 = 262_144;
/// The largest cgroup v2 `cpu.weight`.
pub const MAX_WEIGHT: u64 = 10_000;

/// `oom_score_adj` of Guaranteed containers and node-critical pods.
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// `oom_score_adj` of BestEffort containers.
pub const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// Priority from which a pod is critical (`scheduling.SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// A limit a cgroup file holds: a number, or none (`-1` in v1 files, `max` in v2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// No limit.
    Max,
    /// This many units (µs of CPU per period, bytes, processes).
    Value(u64),
}

/// What to write into one cgroup. `None` leaves that file as it is (the kubelet's
/// nil `ResourceConfig` fields).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    /// v1 `cpu.shares`; v2 `cpu.weight` through [`cpu_weight`].
    pub cpu_shares: Option<u64>,
    /// v1 `cpu.cfs_quota_us`; the first half of v2 `cpu.max`.
    pub cpu_quota: Option<Limit>,
    /// v1 `cpu.cfs_period_us`; the second half of v2 `cpu.max`.
    pub cpu_period_us: Option<u64>,
    /// v1 `memory.limit_in_bytes`; v2 `memory.max`.
    pub memory: Option<Limit>,
    /// `pids.max`.
    pub pids: Option<Limit>,
}

impl ResourceConfig {
    /// Every limit this config leaves alone set to [`Limit::Max`], so that writing it
    /// fully determines the cgroup (a pod cgroup whose limits went away must lose them).
    pub fn with_unset_limits_max(mut self) -> Self {
        for limit in [&mut self.cpu_quota, &mut self.memory, &mut self.pids] {
            limit.get_or_insert(Limit::Max);
        }
        if self.cpu_quota.is_some() {
            self.cpu_period_us.get_or_insert(CPU_PERIOD_US);
        }
        self
    }
}

/// CPU and memory of the node, in plain numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeResources {
    /// Millicores.
    pub milli_cpu: u64,
    /// Bytes.
    pub memory_bytes: u64,
}

/// The CFS quota for a CPU limit in millicores (`MilliCPUToQuota`), honouring the
/// `cpuCFSQuota` switch: with it off, or without a limit, the quota is unlimited
/// (the kubelet writes -1).
pub fn cpu_quota(limit_milli: u64, period_us: u64, cpu_cfs_quota: bool) -> Limit {
    if !cpu_cfs_quota {
        return Limit::Max;
    }
    match u64::try_from(milli_cpu_to_quota(limit_milli, period_us)) {
        Ok(0) | Err(_) => Limit::Max,
        Ok(quota) => Limit::Value(quota),
    }
}

/// cgroup v2 `cpu.weight` from v1 shares (`getCPUWeight`, the kubelet's
/// `CpuSharesToCPUWeight`): `1 + ((shares - 2) * 9999) / 262142`, shares clamped to
/// [2, 262144] so the result stays in [1, 10000].
pub fn cpu_weight(shares: u64) -> u64 {
    let shares = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + ((shares - MIN_SHARES) * (MAX_WEIGHT - 1)) / (MAX_SHARES - MIN_SHARES)
}

/// v1 shares back from a v2 `cpu.weight` (`CpuWeightToCpuShares`), as the kubelet
/// reads a v2 cgroup's configuration: `((weight - 1) * 262142) / 9999 + 2`. Lossy:
/// 1024 shares are weight 39, which reads back as 998.
pub fn cpu_shares_from_weight(weight: u64) -> u64 {
    let weight = weight.clamp(1, MAX_WEIGHT);
    ((weight - 1) * (MAX_SHARES - MIN_SHARES)) / (MAX_WEIGHT - 1) + MIN_SHARES
}

/// The v2 `cpu.max` line: `max <period>` or `<quota> <period>`.
pub fn cpu_max(quota: Limit, period_us: u64) -> String {
    match quota {
        Limit::Max => format!("max {period_us}"),
        Limit::Value(q) => format!("{q} {period_us}"),
    }
}

/// A v2 `cpu.max` line back into quota and period.
pub fn parse_cpu_max(line: &str) -> Option<(Limit, u64)> {
    let mut fields = line.split_whitespace();
    let quota = parse_v2_limit(fields.next()?)?;
    let period = fields
        .next()
        .map_or(Some(CPU_PERIOD_US), |p| p.parse().ok())?;
    fields.next().is_none().then_some((quota, period))
}

/// A limit as a v1 file takes it (`cpu.cfs_quota_us`, `memory.limit_in_bytes`): -1
/// for none.
pub fn v1_limit(limit: Limit) -> String {
    match limit {
        Limit::Max => "-1".to_owned(),
        Limit::Value(v) => v.to_string(),
    }
}

/// v1 reports "no memory limit" as the page counter's maximum (`LONG_MAX` rounded down
/// to a page, 9223372036854771712 with 4 KiB pages); anything this large is no limit.
const V1_UNLIMITED_FROM: u64 = (i64::MAX as u64) - (1 << 20);

/// A v1 limit file's content back into a [`Limit`].
pub fn parse_v1_limit(text: &str) -> Option<Limit> {
    let text = text.trim();
    if text == "-1" || text == "max" {
        return Some(Limit::Max);
    }
    let v: u64 = text.parse().ok()?;
    Some(if v >= V1_UNLIMITED_FROM {
        Limit::Max
    } else {
        Limit::Value(v)
    })
}

/// A limit as a v2 file (and v1 `pids.max`) takes it: `max` for none.
pub fn v2_limit(limit: Limit) -> String {
    match limit {
        Limit::Max => "max".to_owned(),
        Limit::Value(v) => v.to_string(),
    }
}

/// A v2 limit file's content (`memory.max`, `pids.max`) back into a [`Limit`].
pub fn parse_v2_limit(text: &str) -> Option<Limit> {
    match text.trim() {
        "max" => Some(Limit::Max),
        n => n.parse().ok().map(Limit::Value),
    }
}

/// A CPU quantity in millicores, rounded up as `MilliValue` does, without float
/// noise turning 300m into 301.
fn quantity_milli(q: &Quantity) -> Result<u64, String> {
    let cores = quantity::parse(q)?;
    if cores < 0.0 {
        return Err(format!("negative cpu quantity {:?}", q.0));
    }
    let exact = (cores * 1e6).round() / 1e3;
    Ok(exact.ceil() as u64)
}

/// One container's CPU (millicores) and memory (bytes) limits; 0 for none.
fn container_limits(c: &Container) -> Result<(u64, u64), String> {
    let Some(limits) = c.resources.as_ref().and_then(|r| r.limits.as_ref()) else {
        return Ok((0, 0));
    };
    let cpu = limits.get("cpu").map(quantity_milli).transpose();
    let memory = limits.get("memory").map(quantity::bytes).transpose();
    let tag = |what: &str, e: String| format!("container {:?}: {what} limit: {e}", c.name);
    Ok((
        cpu.map_err(|e| tag("cpu", e))?.unwrap_or(0),
        memory.map_err(|e| tag("memory", e))?.unwrap_or(0),
    ))
}

/// The pod's CPU and memory limits (`PodLimits`) and whether every container
/// declares each (the `ContainerFn` callback of `ResourceConfigForPod`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PodLimits {
    milli_cpu: u64,
    memory: u64,
    cpu_everywhere: bool,
    memory_everywhere: bool,
}

/// `PodLimits` for cpu and memory, by KEP-753's rule: regular containers and
/// sidecars (init containers with `restartPolicy: Always`) add up; each regular init
/// container runs next to the sidecars started before it; the pod's limit is the
/// larger of the two. Pod-level `spec.resources.limits` replace the aggregate, and
/// `spec.overhead` is added to a limit that is set.
fn pod_limits(spec: &PodSpec) -> Result<PodLimits, String> {
    let mut total = PodLimits {
        cpu_everywhere: true,
        memory_everywhere: true,
        ..Default::default()
    };
    fn note(total: &mut PodLimits, (cpu, memory): (u64, u64)) {
        total.cpu_everywhere &= cpu > 0;
        total.memory_everywhere &= memory > 0;
    }
    for c in &spec.containers {
        let (cpu, memory) = container_limits(c)?;
        note(&mut total, (cpu, memory));
        total.milli_cpu += cpu;
        total.memory += memory;
    }
    let (mut sidecar_cpu, mut sidecar_memory) = (0u64, 0u64);
    let (mut init_cpu, mut init_memory) = (0u64, 0u64);
    for c in spec.init_containers.iter().flatten() {
        let (cpu, memory) = container_limits(c)?;
        let during = if c.restart_policy.as_deref() == Some("Always") {
            total.milli_cpu += cpu;
            total.memory += memory;
            sidecar_cpu += cpu;
            sidecar_memory += memory;
            (sidecar_cpu, sidecar_memory)
        } else {
            (cpu + sidecar_cpu, memory + sidecar_memory)
        };
        note(&mut total, during);
        init_cpu = init_cpu.max(during.0);
        init_memory = init_memory.max(during.1);
    }
    total.milli_cpu = total.milli_cpu.max(init_cpu);
    total.memory = total.memory.max(init_memory);

    let pod_level = spec.resources.as_ref().and_then(|r| r.limits.as_ref());
    if let Some(q) = pod_level.and_then(|l| l.get("cpu")) {
        let milli = quantity_milli(q).map_err(|e| format!("pod cpu limit: {e}"))?;
        if milli > 0 {
            total.milli_cpu = milli;
            total.cpu_everywhere = true;
        }
    }
    if let Some(q) = pod_level.and_then(|l| l.get("memory")) {
        let bytes = quantity::bytes(q).map_err(|e| format!("pod memory limit: {e}"))?;
        if bytes > 0 {
            total.memory = bytes;
            total.memory_everywhere = true;
        }
    }

    let overhead = spec.overhead.as_ref();
    if total.milli_cpu > 0
        && let Some(q) = overhead.and_then(|o| o.get("cpu"))
    {
        total.milli_cpu += quantity_milli(q).map_err(|e| format!("cpu overhead: {e}"))?;
    }
    if total.memory > 0
        && let Some(q) = overhead.and_then(|o| o.get("memory"))
    {
        total.memory += quantity::bytes(q).map_err(|e| format!("memory overhead: {e}"))?;
    }
    Ok(total)
}

/// The pod's effective CPU request in millicores (`PodRequests`), overhead included.
///
/// This is [`resources::pod_requests`]: the larger of (regular containers + sidecars)
/// and each regular init container plus the sidecars started before it (KEP-753),
/// a limit standing in for a missing request, pod-level requests replacing the sum,
/// plus `spec.overhead`. It refines the simpler "max(largest init container,
/// containers + sidecars)" by counting the sidecars an init container runs beside.
pub fn pod_cpu_request_milli(pod: &Pod) -> u64 {
    let cores = resources::pod_requests(pod)
        .get("cpu")
        .copied()
        .unwrap_or(0.0);
    // pod_requests divided whole millicores by 1000: rounding undoes it exactly.
    (cores * 1000.0).round().max(0.0) as u64
}

/// Settings [`pod_resources`] takes from the node's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodCgroupSettings {
    /// `cpuCFSQuota`: enforce CPU limits with CFS quota.
    pub cpu_cfs_quota: bool,
    /// `cpuCFSQuotaPeriod`, in µs.
    pub cpu_period_us: u64,
    /// `podPidsLimit`: `None` or a value <= 0 is unlimited.
    pub pod_pids_limit: Option<i64>,
}

impl Default for PodCgroupSettings {
    fn default() -> Self {
        Self {
            cpu_cfs_quota: true,
            cpu_period_us: CPU_PERIOD_US,
            pod_pids_limit: None,
        }
    }
}

/// The pod cgroup's values (`ResourceConfigForPod` plus `podPidsLimit`, as
/// `podContainerManagerImpl.EnsureExists` adds it):
///
/// - shares from the pod's effective CPU request ([`pod_cpu_request_milli`]);
/// - Guaranteed: quota and period from the summed CPU limits, memory from the summed
///   memory limits;
/// - Burstable: quota only when every container declares a CPU limit, memory only
///   when every container declares a memory limit;
/// - BestEffort: shares 2 and nothing else;
/// - `spec.overhead` added to the request and to any limit that is set;
/// - with `cpu_cfs_quota` off, the quota (where one would be set) is unlimited;
/// - pids from `pod_pids_limit` when it is > 0, for every class.
///
/// Errors name the quantity that does not parse.
pub fn pod_resources(pod: &Pod, settings: &PodCgroupSettings) -> Result<ResourceConfig, String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let limits = pod_limits(&spec)?;
    let shares = milli_cpu_to_shares(pod_cpu_request_milli(pod));
    let quota = cpu_quota(
        limits.milli_cpu,
        settings.cpu_period_us,
        settings.cpu_cfs_quota,
    );
    let memory = match limits.memory {
        0 => Limit::Max,
        bytes => Limit::Value(bytes),
    };
    let mut config = match qos::qos_class(pod) {
        "Guaranteed" => ResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: Some(quota),
            cpu_period_us: Some(settings.cpu_period_us),
            memory: Some(memory),
            pids: None,
        },
        "Burstable" => ResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: limits.cpu_everywhere.then_some(quota),
            cpu_period_us: limits.cpu_everywhere.then_some(settings.cpu_period_us),
            memory: limits.memory_everywhere.then_some(memory),
            pids: None,
        },
        _ => ResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            ..Default::default()
        },
    };
    config.pids = settings
        .pod_pids_limit
        .and_then(|n| u64::try_from(n).ok())
        .filter(|n| *n > 0)
        .map(Limit::Value);
    Ok(config)
}

/// The node allocatable cgroup's (`kubepods`) values (`enforceNodeAllocatableCgroups`):
/// shares from the CPU and a memory limit, from capacity − kubeReserved −
/// systemReserved (floored at 0) when `enforce_pods` (`enforceNodeAllocatable`
/// contains `pods`), else from capacity. Eviction thresholds are not subtracted,
/// as in the kubelet. A memory amount of 0 is left unset.
pub fn node_allocatable_resources(
    capacity: NodeResources,
    kube_reserved: NodeResources,
    system_reserved: NodeResources,
    enforce_pods: bool,
) -> ResourceConfig {
    let available = if enforce_pods {
        NodeResources {
            milli_cpu: capacity
                .milli_cpu
                .saturating_sub(kube_reserved.milli_cpu)
                .saturating_sub(system_reserved.milli_cpu),
            memory_bytes: capacity
                .memory_bytes
                .saturating_sub(kube_reserved.memory_bytes)
                .saturating_sub(system_reserved.memory_bytes),
        }
    } else {
        capacity
    };
    ResourceConfig {
        cpu_shares: Some(milli_cpu_to_shares(available.milli_cpu)),
        memory: (available.memory_bytes > 0).then_some(Limit::Value(available.memory_bytes)),
        ..Default::default()
    }
}

/// The burstable QoS cgroup's shares (`setCPUCgroupConfig`): shares of the summed
/// CPU requests of the Burstable pods among `pods` (at least 2). The besteffort QoS
/// cgroup always has [`MIN_SHARES`].
pub fn burstable_cpu_shares<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> u64 {
    let milli: u64 = pods
        .into_iter()
        .filter(|p| qos::qos_class(p) == "Burstable")
        .map(pod_cpu_request_milli)
        .sum();
    milli_cpu_to_shares(milli)
}

/// A container's memory request in bytes, its limit standing in for a missing one
/// (API defaulting); 0 for none or an unparsable quantity.
fn memory_request(c: &Container) -> u64 {
    let resources = c.resources.as_ref();
    let pick = |m: Option<&std::collections::BTreeMap<String, Quantity>>| {
        m.and_then(|m| m.get("memory"))
            .and_then(|q| quantity::bytes(q).ok())
    };
    pick(resources.and_then(|r| r.requests.as_ref()))
        .or_else(|| pick(resources.and_then(|r| r.limits.as_ref())))
        .unwrap_or(0)
}

/// `types.IsNodeCriticalPod`: a critical pod (static, mirror, or priority >=
/// 2000000000) in priority class `system-node-critical`.
fn is_node_critical(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let critical = crate::pod::is_static(pod)
        || crate::pod::is_mirror(pod)
        || spec
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY);
    critical && spec.and_then(|s| s.priority_class_name.as_deref()) == Some("system-node-critical")
}

/// A container's `oom_score_adj` (`GetContainerOOMScoreAdjust`): −997 for
/// node-critical pods and Guaranteed pods, 1000 for BestEffort, and for Burstable
/// `1000 − 1000 × memoryRequest / memoryCapacity` (a sidecar no higher than the
/// regular container with the smallest request), raised to 3 so it stays above every
/// Guaranteed container and lowered from 1000 to 999 so it stays below BestEffort.
pub fn oom_score_adj(pod: &Pod, container: &Container, memory_capacity_bytes: u64) -> i64 {
    if is_node_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match qos::qos_class(pod) {
        "Guaranteed" => return GUARANTEED_OOM_SCORE_ADJ,
        "BestEffort" => return BESTEFFORT_OOM_SCORE_ADJ,
        _ => {}
    }
    let capacity = i128::from(memory_capacity_bytes.max(1));
    let adjust = |request: u64| 1000 - (1000 * i128::from(request)) / capacity;
    let mut score = adjust(memory_request(container));
    let spec = pod.spec.as_ref();
    let is_sidecar = container.restart_policy.as_deref() == Some("Always")
        && spec
            .and_then(|s| s.init_containers.as_ref())
            .is_some_and(|inits| inits.iter().any(|c| c.name == container.name));
    if is_sidecar {
        let smallest = spec
            .into_iter()
            .flat_map(|s| &s.containers)
            .map(memory_request)
            .min()
            .unwrap_or(0);
        score = score.min(adjust(smallest));
    }
    let score = i64::try_from(score).unwrap_or(i64::MIN);
    if score < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        1000 + GUARANTEED_OOM_SCORE_ADJ
    } else if score == BESTEFFORT_OOM_SCORE_ADJ {
        BESTEFFORT_OOM_SCORE_ADJ - 1
    } else {
        score
    }
}

/// The `oom_score_adj` a process without `CAP_SYS_RESOURCE` can actually set:
/// never below `floor`, the node's own current value (it cannot lower it). Callers
/// log when this raises the wanted value.
pub fn clamp_oom_score_adj(value: i64, floor: i64) -> i64 {
    value.max(floor)
}

/// An `oom_score_adj` file's value (e.g. `/proc/self/oom_score_adj`).
pub fn read_oom_score_adj(path: &Path) -> io::Result<i64> {
    let text = std::fs::read_to_string(path)?;
    text.trim().parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {text:?}: {e}", path.display()),
        )
    })
}

/// Whether this process may lower `oom_score_adj` below its own (`CAP_SYS_RESOURCE`,
/// bit 24 of `CapEff` in `/proc/self/status`).
pub fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_owned();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// This process's own `oom_score_adj`: the floor for [`clamp_oom_score_adj`].
pub fn own_oom_score_adj() -> io::Result<i64> {
    read_oom_score_adj(Path::new("/proc/self/oom_score_adj"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec}))
            .unwrap()
    }

    /// A container with `requests` and `limits` as `(cpu, memory)`, "" for unset.
    fn container(name: &str, requests: (&str, &str), limits: (&str, &str)) -> Value {
        let list = |(cpu, memory): (&str, &str)| {
            let mut m = serde_json::Map::new();
            if !cpu.is_empty() {
                m.insert("cpu".into(), json!(cpu));
            }
            if !memory.is_empty() {
                m.insert("memory".into(), json!(memory));
            }
            Value::Object(m)
        };
        json!({"name": name, "resources": {"requests": list(requests), "limits": list(limits)}})
    }

    fn sidecar(name: &str, requests: (&str, &str), limits: (&str, &str)) -> Value {
        let mut c = container(name, requests, limits);
        c["restartPolicy"] = json!("Always");
        c
    }

    const MI: u64 = 1 << 20;

    #[test]
    fn cpu_shares_table() {
        // helpers_linux_test.go's MilliCPUToShares cases.
        let cases = [
            (0, 2),
            (1, 2),
            (2, 2),
            (3, 3),
            (10, 10),
            (100, 102),
            (250, 256),
            (1000, 1024),
            (1500, 1536),
            (262_144_000, 262_144),
            (300_000_000, 262_144),
        ];
        for (milli, want) in cases {
            assert_eq!(milli_cpu_to_shares(milli), want, "{milli}m");
        }
    }

    #[test]
    fn cpu_quota_table() {
        // helpers_linux_test.go's TestMilliCPUToQuota, plus the cpuCFSQuota switch.
        let cases = [
            (0, CPU_PERIOD_US, true, Limit::Max),
            (5, CPU_PERIOD_US, true, Limit::Value(1000)),
            (9, CPU_PERIOD_US, true, Limit::Value(1000)),
            (10, CPU_PERIOD_US, true, Limit::Value(1000)),
            (200, CPU_PERIOD_US, true, Limit::Value(20_000)),
            (500, CPU_PERIOD_US, true, Limit::Value(50_000)),
            (1000, CPU_PERIOD_US, true, Limit::Value(100_000)),
            (1500, CPU_PERIOD_US, true, Limit::Value(150_000)),
            (1500, 50_000, true, Limit::Value(75_000)),
            (1500, CPU_PERIOD_US, false, Limit::Max),
            (0, CPU_PERIOD_US, false, Limit::Max),
        ];
        for (milli, period, enabled, want) in cases {
            assert_eq!(
                cpu_quota(milli, period, enabled),
                want,
                "{milli}m period {period} cfs {enabled}"
            );
        }
    }

    #[test]
    fn cpu_weight_table() {
        let cases = [
            (0, 1),
            (2, 1),
            (3, 1),
            (102, 4),
            (1024, 39),
            (2048, 79),
            (262_143, 9999),
            (262_144, 10_000),
            (1_000_000, 10_000),
        ];
        for (shares, want) in cases {
            assert_eq!(cpu_weight(shares), want, "shares {shares}");
        }
        let back = [(1, 2), (39, 998), (79, 2046), (10_000, 262_144), (0, 2)];
        for (weight, want) in back {
            assert_eq!(cpu_shares_from_weight(weight), want, "weight {weight}");
        }
    }

    #[test]
    fn cpu_max_table() {
        let cases = [
            (Limit::Max, 100_000, "max 100000"),
            (Limit::Value(50_000), 100_000, "50000 100000"),
            (Limit::Value(1000), 50_000, "1000 50000"),
        ];
        for (quota, period, want) in cases {
            assert_eq!(cpu_max(quota, period), want);
            assert_eq!(parse_cpu_max(want), Some((quota, period)), "{want}");
        }
        assert_eq!(parse_cpu_max("max"), Some((Limit::Max, CPU_PERIOD_US)));
        assert_eq!(parse_cpu_max("lots 100000"), None);
        assert_eq!(parse_cpu_max("1 2 3"), None);
    }

    #[test]
    fn limit_files_table() {
        // (limit, v1 text, v2 text)
        let cases = [
            (Limit::Max, "-1", "max"),
            (Limit::Value(64 * MI), "67108864", "67108864"),
            (Limit::Value(1024), "1024", "1024"),
        ];
        for (limit, v1, v2) in cases {
            assert_eq!(v1_limit(limit), v1);
            assert_eq!(v2_limit(limit), v2);
            assert_eq!(parse_v1_limit(v1), Some(limit));
            assert_eq!(parse_v2_limit(v2), Some(limit));
        }
        // What v1 reports for "no limit" with 4 KiB and 64 KiB pages, and pids.max.
        for unlimited in ["9223372036854771712\n", "9223372036854710272", "max\n"] {
            assert_eq!(parse_v1_limit(unlimited), Some(Limit::Max), "{unlimited}");
        }
        assert_eq!(parse_v1_limit("a lot"), None);
        assert_eq!(parse_v2_limit("-1"), None);
    }

    #[test]
    fn pod_resources_table() {
        let on = PodCgroupSettings::default();
        let off = PodCgroupSettings {
            cpu_cfs_quota: false,
            ..on
        };
        let pids = PodCgroupSettings {
            pod_pids_limit: Some(1024),
            ..on
        };
        let unlimited_pids = PodCgroupSettings {
            pod_pids_limit: Some(-1),
            ..on
        };
        let v = Limit::Value;
        let shares = |s| ResourceConfig {
            cpu_shares: Some(s),
            ..Default::default()
        };
        let full = |s, q, m| ResourceConfig {
            cpu_shares: Some(s),
            cpu_quota: Some(q),
            cpu_period_us: Some(CPU_PERIOD_US),
            memory: Some(m),
            pids: None,
        };
        let cases: Vec<(&str, Value, PodCgroupSettings, ResourceConfig)> = vec![
            // helpers_linux_test.go's TestResourceConfigForPod cases.
            (
                "besteffort",
                json!({"containers": [container("a", ("", ""), ("", ""))]}),
                on,
                shares(2),
            ),
            (
                "burstable-no-limits",
                json!({"containers": [container("a", ("100m", "100Mi"), ("", ""))]}),
                on,
                shares(102),
            ),
            (
                "burstable-with-limits",
                json!({"containers": [container("a", ("100m", "100Mi"), ("200m", "200Mi"))]}),
                on,
                full(102, v(20_000), v(200 * MI)),
            ),
            (
                "burstable-with-limits-no-cpu-enforcement",
                json!({"containers": [container("a", ("100m", "100Mi"), ("200m", "200Mi"))]}),
                off,
                full(102, Limit::Max, v(200 * MI)),
            ),
            (
                "burstable-partial-limits",
                json!({"containers": [
                    container("a", ("100m", "100Mi"), ("200m", "200Mi")),
                    container("b", ("100m", "100Mi"), ("", "")),
                ]}),
                on,
                shares(204),
            ),
            (
                "burstable-cpu-limits-only-everywhere",
                json!({"containers": [
                    container("a", ("100m", "100Mi"), ("200m", "")),
                    container("b", ("100m", "100Mi"), ("300m", "")),
                ]}),
                on,
                ResourceConfig {
                    cpu_shares: Some(204),
                    cpu_quota: Some(v(50_000)),
                    cpu_period_us: Some(CPU_PERIOD_US),
                    ..Default::default()
                },
            ),
            (
                "guaranteed",
                json!({"containers": [container("a", ("100m", "100Mi"), ("100m", "100Mi"))]}),
                on,
                full(102, v(10_000), v(100 * MI)),
            ),
            (
                "guaranteed-no-cpu-enforcement",
                json!({"containers": [container("a", ("100m", "100Mi"), ("100m", "100Mi"))]}),
                off,
                full(102, Limit::Max, v(100 * MI)),
            ),
            (
                "guaranteed-with-overhead",
                json!({
                    "containers": [container("a", ("100m", "100Mi"), ("100m", "100Mi"))],
                    "overhead": {"cpu": "10m", "memory": "5Mi"},
                }),
                on,
                full(112, v(11_000), v(105 * MI)),
            ),
            (
                "burstable-overhead-added-to-set-limits-only",
                json!({
                    "containers": [container("a", ("100m", "100Mi"), ("", "200Mi"))],
                    "overhead": {"cpu": "10m", "memory": "5Mi"},
                }),
                on,
                ResourceConfig {
                    cpu_shares: Some(112),
                    memory: Some(v(205 * MI)),
                    ..Default::default()
                },
            ),
            (
                // A regular init container bigger than the containers sets the pod's
                // request and limit.
                "guaranteed-with-bigger-init-container",
                json!({
                    "initContainers": [container("init", ("1", "1Gi"), ("1", "1Gi"))],
                    "containers": [container("a", ("100m", "100Mi"), ("100m", "100Mi"))],
                }),
                on,
                full(1024, v(100_000), v(1024 * MI)),
            ),
            (
                // Sidecars add to the containers, and an init container after a
                // sidecar runs next to it.
                "guaranteed-with-sidecar",
                json!({
                    "initContainers": [
                        sidecar("proxy", ("200m", "64Mi"), ("200m", "64Mi")),
                        container("migrate", ("500m", "100Mi"), ("500m", "100Mi")),
                    ],
                    "containers": [container("a", ("100m", "100Mi"), ("100m", "100Mi"))],
                }),
                on,
                full(716, v(70_000), v(164 * MI)),
            ),
            (
                "burstable-init-container-without-limit",
                json!({
                    "initContainers": [container("init", ("100m", ""), ("", ""))],
                    "containers": [container("a", ("100m", "100Mi"), ("200m", "200Mi"))],
                }),
                on,
                shares(102),
            ),
            (
                "besteffort-with-pids-limit",
                json!({"containers": [container("a", ("", ""), ("", ""))]}),
                pids,
                ResourceConfig {
                    cpu_shares: Some(2),
                    pids: Some(v(1024)),
                    ..Default::default()
                },
            ),
            (
                "guaranteed-with-pids-limit",
                json!({"containers": [container("a", ("1", "1Gi"), ("1", "1Gi"))]}),
                pids,
                ResourceConfig {
                    pids: Some(v(1024)),
                    ..full(1024, v(100_000), v(1024 * MI))
                },
            ),
            (
                "pids-limit-minus-one-is-unlimited",
                json!({"containers": [container("a", ("", ""), ("", ""))]}),
                unlimited_pids,
                shares(2),
            ),
        ];
        for (name, spec, settings, want) in cases {
            let got = pod_resources(&pod(spec), &settings).unwrap();
            assert_eq!(got, want, "{name}");
        }
        let bad = pod(json!({"containers": [container("a", ("", ""), ("lots", ""))]}));
        let err = pod_resources(&bad, &on).unwrap_err();
        assert!(err.contains("container \"a\": cpu limit"), "{err}");
    }

    #[test]
    fn unset_limits_become_max() {
        let config = ResourceConfig {
            cpu_shares: Some(102),
            ..Default::default()
        };
        assert_eq!(
            config.with_unset_limits_max(),
            ResourceConfig {
                cpu_shares: Some(102),
                cpu_quota: Some(Limit::Max),
                cpu_period_us: Some(CPU_PERIOD_US),
                memory: Some(Limit::Max),
                pids: Some(Limit::Max),
            }
        );
    }

    #[test]
    fn node_allocatable_table() {
        let node = |milli_cpu, gi: u64| NodeResources {
            milli_cpu,
            memory_bytes: gi * 1024 * MI,
        };
        let half = NodeResources {
            milli_cpu: 500,
            memory_bytes: 512 * MI,
        };
        let cases = [
            // enforce "pods": capacity minus both reservations.
            (node(4000, 8), half, half, true, 3072, Some(7 * 1024 * MI)),
            // not enforcing: the whole capacity.
            (node(4000, 8), half, half, false, 4096, Some(8 * 1024 * MI)),
            (
                node(4000, 8),
                NodeResources::default(),
                NodeResources::default(),
                true,
                4096,
                Some(8 * 1024 * MI),
            ),
            // reservations larger than capacity floor at 0 (memory left unset).
            (node(500, 0), half, half, true, 2, None),
        ];
        for (capacity, kube, system, enforce, shares, memory) in cases {
            let got = node_allocatable_resources(capacity, kube, system, enforce);
            assert_eq!(
                got.cpu_shares,
                Some(shares),
                "{capacity:?} enforce {enforce}"
            );
            assert_eq!(
                got.memory,
                memory.map(Limit::Value),
                "{capacity:?} enforce {enforce}"
            );
            assert_eq!((got.cpu_quota, got.pids), (None, None));
        }
    }

    #[test]
    fn burstable_shares_table() {
        let burstable = |cpu| pod(json!({"containers": [container("a", (cpu, ""), ("", ""))]}));
        let guaranteed = pod(json!({"containers": [container("a", ("1", "1Gi"), ("1", "1Gi"))]}));
        let besteffort = pod(json!({"containers": [container("a", ("", ""), ("", ""))]}));
        let cases: Vec<(Vec<Pod>, u64)> = vec![
            (vec![], 2),
            (vec![besteffort.clone(), guaranteed.clone()], 2),
            (vec![burstable("100m")], 102),
            (vec![burstable("100m"), burstable("150m")], 256),
            (
                vec![burstable("1"), guaranteed, besteffort, burstable("1")],
                2048,
            ),
            // A Burstable pod with only a memory request requests no CPU.
            (
                vec![pod(
                    json!({"containers": [container("a", ("", "64Mi"), ("", ""))]}),
                )],
                2,
            ),
        ];
        for (pods, want) in cases {
            assert_eq!(burstable_cpu_shares(&pods), want, "{} pods", pods.len());
        }
    }

    #[test]
    fn oom_score_adj_table() {
        // policy_test.go's TestGetContainerOOMScoreAdjust cases, then sidecars and
        // node-critical pods.
        const STANDARD: u64 = 8_000_000_000;
        let first = |p: &Pod| p.spec.as_ref().unwrap().containers[0].clone();
        let cases: Vec<(&str, Pod, u64, i64)> = vec![
            (
                "cpu limit only (burstable, no memory request)",
                pod(json!({"containers": [container("a", ("", ""), ("10", ""))]})),
                4_000_000_000,
                999,
            ),
            (
                // The kubelet's test feeds this pod undefaulted and gets 999; API
                // defaulting makes the 10G limit the request, and then it is 3.
                "memory limit, cpu request 0",
                pod(json!({"containers": [container("a", ("0", ""), ("", "10G"))]})),
                STANDARD,
                3,
            ),
            (
                "zero memory limit (besteffort)",
                pod(json!({"containers": [container("a", ("", ""), ("", "0"))]})),
                7_230_457_451,
                1000,
            ),
            (
                "no request, no limit",
                pod(json!({"containers": [container("a", ("", ""), ("", ""))]})),
                4_000_000_000,
                1000,
            ),
            (
                "equal request and limit",
                pod(json!({"containers": [container("a", ("5m", "10G"), ("5m", "10G"))]})),
                123_456_789,
                -997,
            ),
            (
                "half the memory requested",
                pod(json!({"containers": [container("a", ("5m", "4000000000"), ("", "10G"))]})),
                STANDARD,
                500,
            ),
            (
                "nearly all memory requested is raised to 3",
                pod(json!({"containers": [container("a", ("5m", "7999999999"), ("", ""))]})),
                STANDARD,
                3,
            ),
            (
                "a tenth of memory",
                pod(json!({"containers": [container("a", ("", "800000000"), ("", ""))]})),
                STANDARD,
                900,
            ),
            (
                "critical priority alone is not node-critical",
                pod(
                    json!({"priority": 2_000_000_000, "containers": [container("a", ("", ""), ("", ""))]}),
                ),
                4_000_000_000,
                1000,
            ),
            (
                "system-node-critical",
                pod(json!({
                    "priority": 2_000_001_000,
                    "priorityClassName": "system-node-critical",
                    "containers": [container("a", ("", ""), ("", ""))],
                })),
                4_000_000_000,
                -997,
            ),
        ];
        for (name, p, capacity, want) in cases {
            assert_eq!(oom_score_adj(&p, &first(&p), capacity), want, "{name}");
        }

        // A sidecar requesting less than the smallest regular container scores like it.
        let p = pod(json!({
            "initContainers": [sidecar("proxy", ("", "100000000"), ("", ""))],
            "containers": [
                container("a", ("", "2000000000"), ("", "")),
                container("b", ("", "4000000000"), ("", "")),
            ],
        }));
        let spec = p.spec.clone().unwrap();
        let proxy = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(oom_score_adj(&p, &spec.containers[0], STANDARD), 750);
        assert_eq!(oom_score_adj(&p, &spec.containers[1], STANDARD), 500);
        assert_eq!(oom_score_adj(&p, proxy, STANDARD), 750, "sidecar");
    }

    #[test]
    fn clamp_oom_score_adj_table() {
        // (wanted, the node's own value, what can be set)
        let cases = [
            (-997, 0, 0),
            (-997, -999, -997),
            (500, 0, 500),
            (3, 0, 3),
            (1000, 0, 1000),
            (999, 999, 999),
            (3, 500, 500),
        ];
        for (value, floor, want) in cases {
            assert_eq!(
                clamp_oom_score_adj(value, floor),
                want,
                "{value} over {floor}"
            );
        }
    }

    #[test]
    fn oom_score_adj_is_read_from_proc() {
        let own = own_oom_score_adj().unwrap();
        assert!((-1000..=1000).contains(&own), "{own}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("oom_score_adj");
        std::fs::write(&file, "-998\n").unwrap();
        assert_eq!(read_oom_score_adj(&file).unwrap(), -998);
        std::fs::write(&file, "high\n").unwrap();
        let err = read_oom_score_adj(&file).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}

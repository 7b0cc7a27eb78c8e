//! Which pod goes first (the kubelet's `rankMemoryPressure`, `rankPIDPressure`,
//! `rankDiskPressureFunc`), what the eviction says (`evictionMessage`), and which
//! pods are never evicted (`IsCriticalPod`).
//!
//! Memory: pods using more than they request first, then lower priority first, then
//! the larger usage above request. Disk (bytes or inodes): the same over the pod's
//! ephemeral storage. PIDs: lower priority first, then more processes. For memory
//! and disk a pod the Summary has no figures for ranks first, as in the kubelet.

use std::cmp::Ordering;

use k8s_openapi::api::core::v1::Pod;

use crate::stats::types::PodStats;
use crate::thresholds::Resource;

/// `scheduling.SystemCriticalPriority`: a pod at or above it is critical.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The kubelet's `IsCriticalPod`: static and mirror pods, and pods of system-critical
/// priority, are never evicted.
pub fn is_critical(pod: &Pod) -> bool {
    crate::pod::is_static(pod)
        || crate::pod::is_mirror(pod)
        || priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// A pod's usage of `resource` from its stats (`None`: no figure).
pub fn usage(stats: &PodStats, resource: Resource) -> Option<u64> {
    match resource {
        Resource::Memory => stats.memory.as_ref()?.working_set_bytes,
        Resource::EphemeralStorage => stats.ephemeral_storage.as_ref()?.used_bytes,
        Resource::Inodes => stats.ephemeral_storage.as_ref()?.inodes_used,
        Resource::Pids => stats.process_stats.as_ref()?.process_count,
    }
}

/// A pod's request of `resource` (bytes; inodes and PIDs are never requested).
pub fn request(pod: &Pod, resource: Resource) -> u64 {
    let name = match resource {
        Resource::Memory => "memory",
        Resource::EphemeralStorage => "ephemeral-storage",
        Resource::Inodes | Resource::Pids => return 0,
    };
    crate::resources::pod_requests(pod)
        .get(name)
        .map_or(0, |v| v.max(0.0) as u64)
}

/// A candidate: the pod and its usage of the starved resource.
pub struct Candidate<'a> {
    pub pod: &'a Pod,
    pub usage: Option<u64>,
    pub request: u64,
}

/// Orders `candidates` for `resource`, first to evict first.
pub fn rank(candidates: &mut [Candidate<'_>], resource: Resource) {
    candidates.sort_by(|a, b| compare(a, b, resource));
}

fn compare(a: &Candidate<'_>, b: &Candidate<'_>, resource: Resource) -> Ordering {
    // PIDs: priority, then more processes (a missing count is none), as
    // `rankPIDPressure`.
    if resource == Resource::Pids {
        let (ua, ub) = (a.usage.unwrap_or(0), b.usage.unwrap_or(0));
        return priority(a.pod).cmp(&priority(b.pod)).then(ub.cmp(&ua));
    }
    // No figures first.
    let (ua, ub) = match (a.usage, b.usage) {
        (Some(x), Some(y)) => (x, y),
        (None, None) => return priority(a.pod).cmp(&priority(b.pod)),
        (None, Some(_)) => return Ordering::Less,
        (Some(_), None) => return Ordering::Greater,
    };
    let by_priority = priority(a.pod).cmp(&priority(b.pod));
    let exceeds = |usage: u64, request: u64| usage > request;
    let above = |usage: u64, request: u64| usage as i128 - request as i128;
    exceeds(ub, b.request)
        .cmp(&exceeds(ua, a.request))
        .then(by_priority)
        .then(above(ub, b.request).cmp(&above(ua, a.request)))
}

/// A quantity in the API's canonical binary form ([`crate::quantity::binary_si`]),
/// negative too (what is available when more than the capacity is used).
pub fn binary_si(n: i64) -> String {
    let q = crate::quantity::binary_si(n.unsigned_abs()).0;
    if n < 0 { format!("-{q}") } else { q }
}

/// The kubelet's eviction message: the starved resource, the threshold and what
/// was available, and each container using more than it requests.
pub fn message(
    resource: Resource,
    threshold: Option<(u64, i64)>,
    pod: &Pod,
    stats: Option<&PodStats>,
) -> String {
    let mut m = format!("The node was low on resource: {}. ", resource.name());
    if let Some((quantity, available)) = threshold {
        m += &format!(
            "Threshold quantity: {}, available: {}. ",
            quantity_of(resource, quantity as i64),
            quantity_of(resource, available)
        );
    }
    let Some(stats) = stats else { return m };
    for cs in &stats.containers {
        let Some(container) = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .find(|c| c.name == cs.name)
        else {
            continue;
        };
        let usage = match resource {
            Resource::Memory => cs.memory.as_ref().and_then(|m| m.working_set_bytes),
            Resource::EphemeralStorage => {
                let rootfs = cs.rootfs.as_ref().and_then(|f| f.used_bytes);
                let logs = cs.logs.as_ref().and_then(|f| f.used_bytes);
                match (rootfs, logs) {
                    (None, None) => None,
                    (r, l) => Some(r.unwrap_or(0) + l.unwrap_or(0)),
                }
            }
            Resource::Inodes | Resource::Pids => None,
        };
        let Some(usage) = usage else { continue };
        let request = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource.name()))
            .and_then(|q| crate::quantity::parse(q).ok())
            .map_or(0, |v| v.max(0.0) as u64);
        if usage > request {
            m += &format!(
                "Container {} was using {}, request is {}, has larger consumption of {}. ",
                container.name,
                binary_si(usage as i64),
                binary_si(request as i64),
                resource.name()
            );
        }
    }
    m
}

fn quantity_of(resource: Resource, n: i64) -> String {
    match resource {
        Resource::Memory | Resource::EphemeralStorage => binary_si(n),
        // Counts are decimal (`resource.NewQuantity(n, DecimalSI)`).
        Resource::Inodes | Resource::Pids => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::types::{ContainerStats, MemoryStats};
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod(name: &str, priority: i32, memory_request: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p.spec = Some(PodSpec {
            priority: Some(priority),
            containers: vec![Container {
                name: "main".into(),
                resources: memory_request.map(|r| ResourceRequirements {
                    requests: Some([("memory".to_owned(), Quantity(r.into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    fn names(c: &[Candidate<'_>]) -> Vec<String> {
        c.iter()
            .map(|c| c.pod.metadata.name.clone().unwrap())
            .collect()
    }

    #[test]
    fn memory_ranks_pods_over_their_request_then_priority_then_usage() {
        let best_effort = pod("best-effort", 0, None);
        let burstable = pod("burstable", 0, Some("100Mi"));
        let guaranteed = pod("guaranteed", 0, Some("300Mi"));
        let important = pod("important", 1000, None);
        let mi = |n: u64| Some(n << 20);
        let mut c = vec![
            Candidate {
                pod: &guaranteed,
                usage: mi(250),
                request: 300 << 20,
            },
            Candidate {
                pod: &important,
                usage: mi(400),
                request: 0,
            },
            Candidate {
                pod: &burstable,
                usage: mi(200),
                request: 100 << 20,
            },
            Candidate {
                pod: &best_effort,
                usage: mi(150),
                request: 0,
            },
        ];
        rank(&mut c, Resource::Memory);
        // Over request: best-effort (150 above) and burstable (100 above) at priority
        // 0, important at 1000; the guaranteed pod is under its request.
        assert_eq!(
            names(&c),
            ["best-effort", "burstable", "important", "guaranteed"]
        );
    }

    #[test]
    fn pods_without_figures_go_first_and_pids_rank_by_priority_then_count() {
        let a = pod("a", 0, None);
        let b = pod("b", 0, None);
        let low = pod("low", -10, None);
        let mut c = vec![
            Candidate {
                pod: &a,
                usage: Some(10),
                request: 0,
            },
            Candidate {
                pod: &b,
                usage: Some(500),
                request: 0,
            },
            Candidate {
                pod: &low,
                usage: Some(1),
                request: 0,
            },
        ];
        rank(&mut c, Resource::Pids);
        assert_eq!(names(&c), ["low", "b", "a"]);
        let mut c = vec![
            Candidate {
                pod: &a,
                usage: Some(10),
                request: 0,
            },
            Candidate {
                pod: &b,
                usage: None,
                request: 0,
            },
        ];
        rank(&mut c, Resource::Memory);
        assert_eq!(names(&c), ["b", "a"]);
    }

    #[test]
    fn critical_pods_are_static_mirror_or_system_critical() {
        let mut p = pod("p", 0, None);
        assert!(!is_critical(&p));
        p.spec.as_mut().unwrap().priority = Some(SYSTEM_CRITICAL_PRIORITY);
        assert!(is_critical(&p));
        let mut s = pod("s", 0, None);
        s.metadata.annotations =
            Some([("kubernetes.io/config.source".to_owned(), "file".to_owned())].into());
        assert!(is_critical(&s));
    }

    #[test]
    fn the_message_is_the_kubelets() {
        let p = pod("hog", 0, Some("64Mi"));
        let stats = PodStats {
            containers: vec![ContainerStats {
                name: "main".into(),
                memory: Some(MemoryStats {
                    working_set_bytes: Some(300 << 20),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let m = message(
            Resource::Memory,
            Some((100 << 20, 96_257 << 10)),
            &p,
            Some(&stats),
        );
        assert_eq!(
            m,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 96257Ki. \
             Container main was using 300Mi, request is 64Mi, has larger consumption of memory. "
        );
        assert_eq!(binary_si(0), "0");
        assert_eq!(binary_si(1500), "1500");
        assert_eq!(binary_si(-(2 << 30)), "-2Gi");
    }
}

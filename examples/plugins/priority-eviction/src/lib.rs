//! `priority-eviction`: ranks eviction candidates in the kubelet's own order, as a
//! starting point for a policy of your own.
//!
//! The order (the kubelet's `rankMemoryPressure` / `rankDiskPressure`):
//!
//! 1. pods whose usage of the starved resource exceeds their request come first;
//! 2. then lower `spec.priority` first;
//! 3. then the larger usage above request first;
//!
//! ties keep the order the node gave. The signal (`memory.available`,
//! `nodefs.available`, ...) does not change the order: the node passes usage and
//! request of the resource the signal starves.
//!
//! Setting `protect-namespaces` (node settings, comma-separated, e.g.
//! `kube-system`) moves that namespace's pods to the end.

use std::cmp::Reverse;

use wasmlet_plugin_sdk::eviction::{Candidate, Eviction};
use wasmlet_plugin_sdk::host;

/// The ranking, as indexes into `candidates`.
fn rank(candidates: &[Candidate], protected: &[&str]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    // A stable sort: equal keys keep the node's order.
    order.sort_by_key(|&i| {
        let c = &candidates[i];
        (
            protected.contains(&c.pod.namespace.as_str()),
            !c.exceeds_request(),
            c.pod.priority,
            Reverse(c.above_request()),
        )
    });
    order
        .into_iter()
        .map(|i| u32::try_from(i).expect("fewer than 2^32 candidates"))
        .collect()
}

struct PriorityEviction;

impl Eviction for PriorityEviction {
    fn rank(signal: String, candidates: Vec<Candidate>) -> Vec<u32> {
        let settings = host::settings();
        let protected: Vec<&str> = settings
            .get_or("protect-namespaces", "")
            .split(',')
            .map(str::trim)
            .filter(|ns| !ns.is_empty())
            .collect();
        let order = rank(&candidates, &protected);
        if let Some(&first) = order.first() {
            let pod = &candidates[first as usize].pod;
            host::debug!(
                "{signal}: {} candidates, first {}/{}",
                candidates.len(),
                pod.namespace,
                pod.name
            );
        }
        order
    }
}

wasmlet_plugin_sdk::export_eviction!(PriorityEviction);

#[cfg(test)]
mod tests {
    use wasmlet_plugin_sdk::types::PodInfo;

    use super::*;

    fn candidate(name: &str, priority: i32, usage: u64, request: u64) -> Candidate {
        Candidate {
            pod: PodInfo {
                namespace: if name.starts_with("sys") {
                    "kube-system"
                } else {
                    "default"
                }
                .into(),
                name: name.into(),
                uid: name.into(),
                labels: vec![],
                annotations: vec![],
                qos_class: "Burstable".into(),
                priority,
                runtime_class: String::new(),
                containers: vec![],
            },
            usage,
            request,
        }
    }

    #[test]
    fn over_request_then_priority_then_excess() {
        let candidates = vec![
            candidate("within-low", 0, 50, 100),      // 0
            candidate("over-high", 1000, 300, 100),   // 1
            candidate("over-low-small", 0, 150, 100), // 2
            candidate("over-low-big", 0, 900, 100),   // 3
            candidate("within-lower", -5, 10, 100),   // 4
            candidate("sys-over", 0, 5000, 0),        // 5
        ];
        assert_eq!(rank(&candidates, &[]), vec![5, 3, 2, 1, 4, 0]);
        assert_eq!(rank(&candidates, &["kube-system"]), vec![3, 2, 1, 4, 0, 5]);
        assert!(rank(&[], &[]).is_empty());
    }
}

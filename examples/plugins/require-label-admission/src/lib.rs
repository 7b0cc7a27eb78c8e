//! `require-label-admission`: node-local admission rules.
//!
//! Node settings (`host::settings()`):
//!
//! | key | meaning |
//! | --- | --- |
//! | `label` | a label every pod must carry; denied with reason `MissingLabel` |
//! | `max-cpu-millis` | the most CPU (millicores) one pod may request, its containers' requests summed (init containers count as the scheduler counts them); denied with `RequestTooLarge` |
//!
//! An unset key turns its rule off. A setting that does not parse denies every pod
//! with `InvalidPluginSettings`: a broken policy must not admit silently.

use wasmlet_plugin_sdk::admission::{Admission, Decision, NodeState};
use wasmlet_plugin_sdk::host::{self, SettingError, Settings};
use wasmlet_plugin_sdk::types::PodInfo;

/// The rules, read from the settings.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rules {
    label: Option<String>,
    max_cpu_millis: Option<u64>,
}

impl Rules {
    fn from_settings(settings: &Settings) -> Result<Self, SettingError> {
        Ok(Rules {
            label: settings
                .get("label")
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string),
            max_cpu_millis: settings.parse("max-cpu-millis")?,
        })
    }

    fn decide(&self, pod: &PodInfo, node: &NodeState) -> Decision {
        if let Some(label) = &self.label
            && pod.label(label).is_none()
        {
            return Decision::deny(
                "MissingLabel",
                format!(
                    "pod {} has no label `{label}`, which node {} requires",
                    pod.key(),
                    node.node_name
                ),
            );
        }
        if let Some(max) = self.max_cpu_millis {
            let cpu = pod.request("cpu");
            if cpu > max {
                return Decision::deny(
                    "RequestTooLarge",
                    format!(
                        "pod {} requests {cpu}m CPU; node {} admits at most {max}m per pod",
                        pod.key(),
                        node.node_name
                    ),
                );
            }
        }
        Decision::Admit
    }
}

struct RequireLabel;

impl Admission for RequireLabel {
    fn admit(pod: PodInfo, node: NodeState) -> Decision {
        match Rules::from_settings(&host::settings()) {
            Ok(rules) => rules.decide(&pod, &node),
            Err(e) => {
                host::error!("{e}");
                Decision::deny("InvalidPluginSettings", e.to_string())
            }
        }
    }
}

wasmlet_plugin_sdk::export_admission!(RequireLabel);

#[cfg(test)]
mod tests {
    use wasmlet_plugin_sdk::admission::Denial;
    use wasmlet_plugin_sdk::types::{ContainerInfo, Pair, ResourceAmount};

    use super::*;

    fn pod(labels: &[(&str, &str)], cpus: &[u64]) -> PodInfo {
        PodInfo {
            namespace: "default".into(),
            name: "web".into(),
            uid: "u".into(),
            labels: labels.iter().map(|&(k, v)| Pair::new(k, v)).collect(),
            annotations: vec![],
            qos_class: "Burstable".into(),
            priority: 0,
            runtime_class: String::new(),
            containers: cpus
                .iter()
                .map(|&cpu| ContainerInfo {
                    name: "c".into(),
                    image: "i".into(),
                    requests: vec![ResourceAmount {
                        name: "cpu".into(),
                        amount: cpu,
                    }],
                    limits: vec![],
                    init: false,
                })
                .collect(),
        }
    }

    fn node() -> NodeState {
        NodeState {
            node_name: "n1".into(),
            allocatable: vec![],
            requested: vec![],
            pod_count: 0,
            labels: vec![],
        }
    }

    fn reason(decision: Decision) -> Option<String> {
        match decision {
            Decision::Admit => None,
            Decision::Deny(Denial { reason, .. }) => Some(reason),
        }
    }

    #[test]
    fn rules() {
        let rules = Rules::from_settings(&Settings::from_iter([
            ("label", "team"),
            ("max-cpu-millis", "500"),
        ]))
        .unwrap();
        let cases = [
            (pod(&[("team", "a")], &[200, 300]), None),
            (pod(&[("app", "a")], &[100]), Some("MissingLabel")),
            (pod(&[("team", "a")], &[400, 101]), Some("RequestTooLarge")),
        ];
        for (pod, want) in cases {
            assert_eq!(reason(rules.decide(&pod, &node())).as_deref(), want);
        }
        let off = Rules::from_settings(&Settings::default()).unwrap();
        assert!(off.decide(&pod(&[], &[9000]), &node()).is_admit());
        assert!(
            Rules::from_settings(&Settings::from_iter([("max-cpu-millis", "1 core")])).is_err()
        );
    }
}

//! The pod's QoS class, computed the kubelet's way from requests and limits.

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const SUPPORTED: [&str; 2] = ["cpu", "memory"];

fn nonzero(q: &Quantity) -> bool {
    let s = q.0.trim();
    !(s.is_empty()
        || s.trim_start_matches(['0', '.'])
            .chars()
            .next()
            .is_none_or(|c| !c.is_ascii_digit()))
}

/// `Guaranteed`, `Burstable` or `BestEffort`.
pub fn qos_class(pod: &Pod) -> &'static str {
    let Some(spec) = &pod.spec else {
        return "BestEffort";
    };
    let containers: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let mut any_set = false;
    let mut guaranteed = true;
    for c in &containers {
        let res = c.resources.clone().unwrap_or_default();
        let requests = res.requests.unwrap_or_default();
        let limits = res.limits.unwrap_or_default();
        for r in SUPPORTED {
            let req = requests.get(r).filter(|q| nonzero(q));
            let lim = limits.get(r).filter(|q| nonzero(q));
            if req.is_some() || lim.is_some() {
                any_set = true;
            }
            // Guaranteed needs a limit for cpu and memory in every container, and
            // requests (defaulted from limits) equal to them.
            match (req, lim) {
                (_, None) => guaranteed = false,
                (Some(q), Some(l)) if q.0 != l.0 => guaranteed = false,
                _ => {}
            }
        }
    }
    if !any_set {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use std::collections::BTreeMap;

    fn pod(req: &[(&str, &str)], lim: &[(&str, &str)]) -> Pod {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect::<BTreeMap<_, _>>()
            })
        };
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: map(req),
                        limits: map(lim),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn classes() {
        type Resources<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Resources<'_>, Resources<'_>, &str)] = &[
            (&[], &[], "BestEffort"),
            (&[("cpu", "0")], &[], "BestEffort"),
            (&[("cpu", "100m")], &[], "Burstable"),
            (&[], &[("cpu", "1"), ("memory", "64Mi")], "Guaranteed"),
            (
                &[("cpu", "1"), ("memory", "64Mi")],
                &[("cpu", "1"), ("memory", "64Mi")],
                "Guaranteed",
            ),
            (
                &[("cpu", "500m"), ("memory", "64Mi")],
                &[("cpu", "1"), ("memory", "64Mi")],
                "Burstable",
            ),
            (&[], &[("memory", "64Mi")], "Burstable"),
        ];
        for (req, lim, want) in cases {
            assert_eq!(qos_class(&pod(req, lim)), *want, "{req:?} {lim:?}");
        }
    }
}

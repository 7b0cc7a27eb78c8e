//! Resource requests: the kubelet's formulas for what a pod asks of the node.
//!
//! [`pod_requests`] is the effective request (KEP-753: init containers, sidecars,
//! pod-level resources, overhead) that admission checks against allocatable and the
//! container manager turns into pod cgroup values; eviction ranks by it too. A pod
//! fact like those of [`crate::pod`]: it imports nothing of the node but quantities.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The effective resource request of a pod, by resource name: cpu in cores, every
/// other resource in its units (bytes for memory).
///
/// `max(sum of regular containers and sidecars, each init container's request plus
/// the sidecars started before it) + overhead` (KEP-753). Sidecars are init
/// containers with `restartPolicy: Always`. A container with a limit but no request
/// for a resource requests its limit (API defaulting). Pod-level `spec.resources`
/// requests for cpu, memory and hugepages replace the containers' sum (pod-level
/// limits stand in for missing requests, as defaulting does). Quantities that do not
/// parse are left out (API validation never lets them through;
/// [`crate::admission::admit`] rejects them).
pub fn pod_requests(pod: &Pod) -> BTreeMap<String, f64> {
    let units = requests_in_units(pod, &|_| true, false).unwrap_or_default();
    units
        .into_iter()
        .map(|(name, v)| {
            let v = if name == "cpu" {
                v as f64 / 1000.0
            } else {
                v as f64
            };
            (name, v)
        })
        .collect()
}

/// Amounts by resource name: cpu in millicores, everything else in whole units.
pub(crate) type Units = BTreeMap<String, i64>;

/// The pod's effective request in [`Units`], keeping only the container requests
/// `keep` accepts. With `strict`, an unparsable quantity is an error; otherwise it is
/// left out.
pub(crate) fn requests_in_units(
    pod: &Pod,
    keep: &dyn Fn(&str) -> bool,
    strict: bool,
) -> Result<Units, String> {
    let Some(spec) = &pod.spec else {
        return Ok(Units::new());
    };
    let mut total = Units::new();
    for c in &spec.containers {
        add(&mut total, &container_requests(c, keep, strict)?);
    }
    // An init container runs next to the sidecars started before it; a sidecar keeps
    // running next to everything after it, so it also adds to the containers' sum.
    let mut sidecars = Units::new();
    let mut init_peak = Units::new();
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(c, keep, strict)?;
        let during = if c.restart_policy.as_deref() == Some("Always") {
            add(&mut total, &r);
            add(&mut sidecars, &r);
            sidecars.clone()
        } else {
            let mut during = r;
            add(&mut during, &sidecars);
            during
        };
        max_into(&mut init_peak, &during);
    }
    max_into(&mut total, &init_peak);

    if let Some(resources) = &spec.resources {
        let requests = resources.requests.as_ref();
        for (name, q) in requests.into_iter().flatten() {
            if is_pod_level(name)
                && let Some(v) = to_units(name, q, strict)?
            {
                total.insert(name.clone(), v);
            }
        }
        for (name, q) in resources.limits.iter().flatten() {
            let has_request = requests.is_some_and(|r| r.contains_key(name));
            if is_pod_level(name)
                && !has_request
                && !total.contains_key(name)
                && let Some(v) = to_units(name, q, strict)?
            {
                total.insert(name.clone(), v);
            }
        }
    }

    let mut overhead = Units::new();
    for (name, q) in spec.overhead.iter().flatten() {
        if let Some(v) = to_units(name, q, strict)? {
            overhead.insert(name.clone(), v);
        }
    }
    add(&mut total, &overhead);
    Ok(total)
}

/// A container's requests, a limit standing in for a missing request.
fn container_requests(
    c: &Container,
    keep: &dyn Fn(&str) -> bool,
    strict: bool,
) -> Result<Units, String> {
    let mut out = Units::new();
    let Some(resources) = &c.resources else {
        return Ok(out);
    };
    let requests = resources.requests.as_ref();
    let defaulted = resources
        .limits
        .iter()
        .flatten()
        .filter(|(name, _)| !requests.is_some_and(|r| r.contains_key(*name)));
    for (name, q) in requests.into_iter().flatten().chain(defaulted) {
        if keep(name)
            && let Some(v) = to_units(name, q, strict)?
        {
            out.insert(name.clone(), v);
        }
    }
    Ok(out)
}

/// A quantity in [`Units`], rounded up (`MilliValue()` for cpu, `Value()` otherwise),
/// forgiving float noise so `0.1 + 0.2` cores stays 300 millicores.
pub(crate) fn to_units(name: &str, q: &Quantity, strict: bool) -> Result<Option<i64>, String> {
    let value = match crate::quantity::parse(q) {
        Ok(v) => v,
        Err(e) if strict => return Err(format!("resource {name}: {e}")),
        Err(_) => return Ok(None),
    };
    let scaled = if name == "cpu" { value * 1000.0 } else { value };
    let nearest = scaled.round();
    let v = if (scaled - nearest).abs() <= 1e-9 * nearest.abs().max(1.0) {
        nearest
    } else {
        scaled.ceil()
    };
    // `as` saturates at the i64 range, which is what a capacity check wants.
    Ok(Some(v as i64))
}

pub(crate) fn add(into: &mut Units, other: &Units) {
    for (name, v) in other {
        let slot = into.entry(name.clone()).or_insert(0);
        *slot = slot.saturating_add(*v);
    }
}

fn max_into(into: &mut Units, other: &Units) {
    for (name, v) in other {
        let slot = into.entry(name.clone()).or_insert(*v);
        *slot = (*slot).max(*v);
    }
}

/// Resources pod-level `spec.resources` may set (`IsSupportedPodLevelResource`).
fn is_pod_level(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// `v1helper.IsExtendedResourceName`: a domain-prefixed name outside `kubernetes.io`.
pub(crate) fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// `schedutil.IsScalarResourceName`: what the scheduler accounts besides cpu, memory,
/// ephemeral-storage and pods.
pub(crate) fn is_scalar(name: &str) -> bool {
    is_extended(name)
        || name.starts_with("hugepages-")
        || name.starts_with("attachable-volumes-")
        || name.contains("kubernetes.io/")
}

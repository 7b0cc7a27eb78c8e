//! The hint merging, case by case as upstream's `TestPolicyMerge` tables run them:
//! the same providers' hints through each policy, the merged hint and the admit
//! decision checked; then the manager's admission with fake providers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::policy::{NumaInfo, Policy, PolicyOptions, ProviderHints, TopologyHint, merge};
use super::*;

fn h(nodes: &[u32], preferred: bool) -> TopologyHint {
    TopologyHint::new(nodes, preferred)
}

fn any(preferred: bool) -> TopologyHint {
    TopologyHint {
        affinity: None,
        preferred,
    }
}

/// A provider's answer: (resource, hints), `None` for "no preference".
fn provider(resources: &[(&str, Option<Vec<TopologyHint>>)]) -> ProviderHints {
    resources
        .iter()
        .map(|(r, hints)| (r.to_string(), hints.clone()))
        .collect()
}

struct Case {
    name: &'static str,
    providers: Vec<ProviderHints>,
    expected: TopologyHint,
}

fn case(name: &'static str, providers: Vec<ProviderHints>, expected: TopologyHint) -> Case {
    Case {
        name,
        providers,
        expected,
    }
}

/// Cases every policy that merges answers the same way (upstream's
/// `commonPolicyMergeTestCases`), on two NUMA nodes.
fn common_cases() -> Vec<Case> {
    vec![
        case(
            "two providers, 1 hint each, same mask, both preferred 1/2",
            vec![
                provider(&[("r1", Some(vec![h(&[0], true)]))]),
                provider(&[("r2", Some(vec![h(&[0], true)]))]),
            ],
            h(&[0], true),
        ),
        case(
            "two providers, 1 hint each, same mask, both preferred 2/2",
            vec![
                provider(&[("r1", Some(vec![h(&[1], true)]))]),
                provider(&[("r2", Some(vec![h(&[1], true)]))]),
            ],
            h(&[1], true),
        ),
        case(
            "two providers, 1 no hints, 1 single hint preferred 1/2",
            vec![provider(&[]), provider(&[("r", Some(vec![h(&[0], true)]))])],
            h(&[0], true),
        ),
        case(
            "two providers, 1 no hints, 1 single hint preferred 2/2",
            vec![provider(&[]), provider(&[("r", Some(vec![h(&[1], true)]))])],
            h(&[1], true),
        ),
        case(
            "two providers, 1 with 2 hints, 1 with single hint matching 1/2",
            vec![
                provider(&[("r1", Some(vec![h(&[0], true), h(&[1], true)]))]),
                provider(&[("r2", Some(vec![h(&[0], true)]))]),
            ],
            h(&[0], true),
        ),
        case(
            "two providers, 1 with 2 hints, 1 with single hint matching 2/2",
            vec![
                provider(&[("r1", Some(vec![h(&[0], true), h(&[1], true)]))]),
                provider(&[("r2", Some(vec![h(&[1], true)]))]),
            ],
            h(&[1], true),
        ),
        case(
            "two providers, both with 2 hints, matching narrower preferred hint from both",
            vec![
                provider(&[("r1", Some(vec![h(&[0], true), h(&[1], true)]))]),
                provider(&[("r2", Some(vec![h(&[0], true), h(&[0, 1], false)]))]),
            ],
            h(&[0], true),
        ),
        case(
            "less narrow preferred hints are chosen over narrower non-preferred hints",
            vec![
                provider(&[("r1", Some(vec![h(&[1], true), h(&[0, 1], false)]))]),
                provider(&[(
                    "r2",
                    Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                )]),
            ],
            h(&[1], true),
        ),
        case(
            "multiple resources, same provider",
            vec![provider(&[
                ("r1", Some(vec![h(&[1], true), h(&[0, 1], false)])),
                (
                    "r2",
                    Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                ),
            ])],
            h(&[1], true),
        ),
    ]
}

/// Cases where best-effort and restricted give the same hint (upstream's
/// `bestEffortPolicy.mergeTestCases`, which restricted reuses).
fn best_effort_cases(nodes: &[u32]) -> Vec<Case> {
    let all: Vec<u32> = nodes.to_vec();
    vec![
        case(
            "two providers, 2 hints each, same mask (some with different bits), same preferred",
            vec![
                provider(&[("r1", Some(vec![h(&[0, 1], true), h(&[0, 2], true)]))]),
                provider(&[("r2", Some(vec![h(&[0, 1], true), h(&[0, 2], true)]))]),
            ],
            h(&[0, 1], true),
        ),
        case("no providers", vec![], h(&all, true)),
        case(
            "a provider with an empty map",
            vec![provider(&[])],
            h(&all, true),
        ),
        case(
            "a provider with no preference for a resource",
            vec![provider(&[("r", None)])],
            h(&all, true),
        ),
        case(
            "a provider that cannot place a resource",
            vec![provider(&[("r", Some(vec![]))])],
            h(&all, false),
        ),
        case(
            "a single preferred hint with no affinity",
            vec![provider(&[("r", Some(vec![any(true)]))])],
            h(&all, true),
        ),
        case(
            "a single non-preferred hint with no affinity",
            vec![provider(&[("r", Some(vec![any(false)]))])],
            h(&all, false),
        ),
        case(
            "two providers, 1 hint each, no common mask",
            vec![
                provider(&[("r1", Some(vec![h(&[0], true)]))]),
                provider(&[("r2", Some(vec![h(&[1], true)]))]),
            ],
            h(&all, false),
        ),
        case(
            "two providers, 1 hint each, same mask, 1 preferred, 1 not",
            vec![
                provider(&[("r1", Some(vec![h(&[1], true)]))]),
                provider(&[("r2", Some(vec![h(&[1], false)]))]),
            ],
            h(&[1], false),
        ),
        case(
            "two providers, 1 hint each, 1 wider mask, both preferred",
            vec![
                provider(&[("r1", Some(vec![h(&[0], true)]))]),
                provider(&[("r2", Some(vec![h(&[0, 1], true)]))]),
            ],
            h(&[0], false),
        ),
        case(
            "two providers, 1 with 2 hints, 1 with a single non-preferred hint matching",
            vec![
                provider(&[("r1", Some(vec![h(&[0], true), h(&[1], true)]))]),
                provider(&[("r2", Some(vec![h(&[0, 1], false)]))]),
            ],
            h(&[0], false),
        ),
        case(
            "bestNonPreferredAffinityCount (1)",
            vec![
                provider(&[("r1", Some(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]))]),
                provider(&[("r2", Some(vec![h(&[0, 1], false)]))]),
            ],
            h(&[0, 1], false),
        ),
        case(
            "bestNonPreferredAffinityCount (2)",
            vec![
                provider(&[("r1", Some(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]))]),
                provider(&[("r2", Some(vec![h(&[0, 3], false)]))]),
            ],
            h(&[0, 3], false),
        ),
        case(
            "bestNonPreferredAffinityCount (3)",
            vec![
                provider(&[("r1", Some(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]))]),
                provider(&[("r2", Some(vec![h(&[1, 2], false)]))]),
            ],
            h(&[1, 2], false),
        ),
    ]
}

fn numa(nodes: &[u32]) -> NumaInfo {
    NumaInfo::new(nodes.to_vec())
}

fn run(policy: Policy, numa: &NumaInfo, opts: &PolicyOptions, cases: Vec<Case>) {
    for c in cases {
        let (hint, admit) = merge(policy, numa, opts, &c.providers);
        assert_eq!(hint, c.expected, "{}: {}", policy.name(), c.name);
        let want_admit = match policy {
            Policy::None | Policy::BestEffort => true,
            Policy::Restricted | Policy::SingleNumaNode => c.expected.preferred,
        };
        assert_eq!(admit, want_admit, "{}: admit of {}", policy.name(), c.name);
    }
}

#[test]
fn best_effort_merges_as_upstream() {
    let opts = PolicyOptions::default();
    run(Policy::BestEffort, &numa(&[0, 1]), &opts, common_cases());
    run(
        Policy::BestEffort,
        &numa(&[0, 1, 2, 3]),
        &opts,
        best_effort_cases(&[0, 1, 2, 3]),
    );
}

#[test]
fn restricted_merges_like_best_effort_and_admits_only_preferred() {
    let opts = PolicyOptions::default();
    run(Policy::Restricted, &numa(&[0, 1]), &opts, common_cases());
    run(
        Policy::Restricted,
        &numa(&[0, 1, 2, 3]),
        &opts,
        best_effort_cases(&[0, 1, 2, 3]),
    );
}

#[test]
fn none_admits_everything_with_no_affinity() {
    for c in common_cases().into_iter().chain(best_effort_cases(&[0, 1])) {
        let (hint, admit) = merge(
            Policy::None,
            &numa(&[0, 1]),
            &PolicyOptions::default(),
            &c.providers,
        );
        assert_eq!(hint, TopologyHint::ANY, "{}", c.name);
        assert!(admit, "{}", c.name);
    }
}

#[test]
fn single_numa_node_keeps_only_single_node_preferred_hints() {
    let two = numa(&[0, 1]);
    let opts = PolicyOptions::default();
    run(Policy::SingleNumaNode, &two, &opts, common_cases());
    let cases = vec![
        // "any" for the whole machine is reported as no affinity.
        case("no providers", vec![], any(true)),
        case(
            "a provider with no preference",
            vec![provider(&[("r", None)])],
            any(true),
        ),
        case(
            "a provider that cannot place a resource",
            vec![provider(&[("r", Some(vec![]))])],
            any(false),
        ),
        case(
            "two providers, 1 hint each, no common mask",
            vec![
                provider(&[("r1", Some(vec![h(&[0], true)]))]),
                provider(&[("r2", Some(vec![h(&[1], true)]))]),
            ],
            any(false),
        ),
        case(
            "a resource that needs both nodes leaves nothing to merge",
            vec![
                provider(&[("r1", Some(vec![h(&[0], true)]))]),
                provider(&[("r2", Some(vec![h(&[0, 1], true)]))]),
            ],
            any(false),
        ),
        case(
            "non-preferred single-node hints are dropped",
            vec![
                provider(&[("r1", Some(vec![h(&[0], false), h(&[1], true)]))]),
                provider(&[("r2", Some(vec![h(&[0], true), h(&[1], true)]))]),
            ],
            h(&[1], true),
        ),
    ];
    run(Policy::SingleNumaNode, &two, &opts, cases);
}

#[test]
fn prefer_closest_numa_nodes_picks_the_closest_pair() {
    // Four nodes; 0-2 and 1-3 are close, 0-1 far: of equally wide preferred masks
    // the closest pair wins, though {0,1} is the narrower by upstream's order.
    let mut info = numa(&[0, 1, 2, 3]);
    info.distances = BTreeMap::from([
        (0, vec![10, 30, 11, 30]),
        (1, vec![30, 10, 30, 11]),
        (2, vec![11, 30, 10, 30]),
        (3, vec![30, 11, 30, 10]),
    ]);
    let providers = vec![provider(&[(
        "r",
        Some(vec![h(&[0, 1], true), h(&[0, 2], true), h(&[1, 3], true)]),
    )])];
    let closest = PolicyOptions {
        prefer_closest_numa: true,
        ..PolicyOptions::default()
    };
    let (hint, _) = merge(Policy::BestEffort, &info, &closest, &providers);
    assert_eq!(hint, h(&[0, 2], true));
    let (hint, _) = merge(
        Policy::BestEffort,
        &info,
        &PolicyOptions::default(),
        &providers,
    );
    assert_eq!(hint, h(&[0, 1], true));
}

#[test]
fn options_parse_as_the_kubelet_spells_them() {
    let opts = PolicyOptions::parse(&BTreeMap::from([
        ("prefer-closest-numa-nodes".to_string(), "true".to_string()),
        ("max-allowable-numa-nodes".to_string(), "12".to_string()),
    ]))
    .unwrap();
    assert!(opts.prefer_closest_numa);
    assert_eq!(opts.max_allowable_numa_nodes, 12);
    let err = PolicyOptions::parse(&BTreeMap::from([("bogus".to_string(), "1".to_string())]));
    assert!(err.unwrap_err().contains("bogus"));
    assert!(Policy::parse("single-numa-node").is_ok());
    assert!(
        Policy::parse("strict")
            .unwrap_err()
            .contains("unknown policy")
    );
}

#[test]
fn more_numa_nodes_than_allowed_is_refused_unless_policy_none() {
    let nine = numa(&[0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let restricted = Config {
        policy: Policy::Restricted,
        ..Config::default()
    };
    let err = TopologyManager::new(restricted, nine.clone())
        .err()
        .unwrap();
    assert!(err.contains("more than 8 NUMA Nodes"), "{err}");
    assert!(TopologyManager::new(Config::default(), nine).is_ok());
}

/// A provider with fixed hints per container that records its allocations.
struct Fake {
    resource: &'static str,
    hints: BTreeMap<&'static str, Vec<TopologyHint>>,
    pod: Option<Vec<TopologyHint>>,
    allocated: Mutex<Vec<(String, TopologyHint)>>,
    fail: bool,
}

impl Fake {
    fn new(resource: &'static str) -> Self {
        Fake {
            resource,
            hints: BTreeMap::new(),
            pod: None,
            allocated: Mutex::new(Vec::new()),
            fail: false,
        }
    }
}

#[async_trait::async_trait]
impl HintProvider for Fake {
    fn container_hints(&self, _pod: &Pod, c: &Container) -> ProviderHints {
        match self.hints.get(c.name.as_str()) {
            Some(list) => provider(&[(self.resource, Some(list.clone()))]),
            None => ProviderHints::new(),
        }
    }
    fn pod_hints(&self, _pod: &Pod) -> ProviderHints {
        match &self.pod {
            Some(list) => provider(&[(self.resource, Some(list.clone()))]),
            None => ProviderHints::new(),
        }
    }
    async fn allocate(&self, _pod: &Pod, c: &Container, hint: TopologyHint) -> Result<(), String> {
        if self.fail {
            return Err("device plugin went away".into());
        }
        self.allocated.lock().unwrap().push((c.name.clone(), hint));
        Ok(())
    }
    fn remove_pod(&self, _uid: &str) {
        self.allocated.lock().unwrap().clear();
    }
    fn retain_pods(&self, _active: &std::collections::HashSet<String>) {}
}

fn pod(containers: &[&str]) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
        "spec": {"containers": containers.iter().map(|c| serde_json::json!({"name": c, "image": "x"})).collect::<Vec<_>>()},
    }))
    .unwrap()
}

fn manager(policy: Policy, scope: Scope, providers: Vec<Arc<Fake>>) -> TopologyManager {
    let config = Config {
        policy,
        scope,
        options: PolicyOptions::default(),
    };
    let mut m = TopologyManager::new(config, numa(&[0, 1])).unwrap();
    for p in providers {
        m.add_provider(p);
    }
    m
}

#[tokio::test]
async fn container_scope_admits_aligned_containers_and_allocates_with_the_hint() {
    let mut devices = Fake::new("example.com/widget");
    devices
        .hints
        .insert("a", vec![h(&[1], true), h(&[0, 1], false)]);
    let mut cpus = Fake::new("cpu");
    cpus.hints
        .insert("a", vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]);
    let (devices, cpus) = (Arc::new(devices), Arc::new(cpus));
    let m = manager(
        Policy::SingleNumaNode,
        Scope::Container,
        vec![devices.clone(), cpus.clone()],
    );
    m.admit(&pod(&["a"])).await.unwrap();
    assert_eq!(m.affinity("u1", "a"), Some(h(&[1], true)));
    assert_eq!(
        *cpus.allocated.lock().unwrap(),
        [("a".to_string(), h(&[1], true))]
    );
}

#[tokio::test]
async fn single_numa_node_refuses_a_pod_that_needs_both_nodes_and_keeps_nothing() {
    let mut devices = Fake::new("example.com/widget");
    devices.hints.insert("a", vec![h(&[0, 1], true)]);
    let mut cpus = Fake::new("cpu");
    cpus.hints.insert("a", vec![h(&[0], true), h(&[1], true)]);
    let (devices, cpus) = (Arc::new(devices), Arc::new(cpus));
    let m = manager(
        Policy::SingleNumaNode,
        Scope::Container,
        vec![devices.clone(), cpus.clone()],
    );
    let rejection = m.admit(&pod(&["a"])).await.unwrap_err();
    assert_eq!(rejection.reason, "TopologyAffinityError");
    assert_eq!(
        rejection.message,
        "Resources cannot be allocated with Topology locality"
    );
    assert_eq!(m.affinity("u1", "a"), None);

    // best-effort takes the same pod, with the best it can do.
    let m = manager(
        Policy::BestEffort,
        Scope::Container,
        vec![devices, cpus.clone()],
    );
    m.admit(&pod(&["a"])).await.unwrap();
    assert_eq!(m.affinity("u1", "a"), Some(h(&[0], false)));
}

#[tokio::test]
async fn pod_scope_merges_once_for_every_container() {
    let mut devices = Fake::new("example.com/widget");
    devices.pod = Some(vec![h(&[1], true)]);
    let devices = Arc::new(devices);
    let m = manager(Policy::Restricted, Scope::Pod, vec![devices.clone()]);
    m.admit(&pod(&["a", "b"])).await.unwrap();
    assert_eq!(m.affinity("u1", "a"), Some(h(&[1], true)));
    assert_eq!(m.affinity("u1", "b"), Some(h(&[1], true)));
    assert_eq!(devices.allocated.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_failed_allocation_is_an_unexpected_admission_error() {
    let mut devices = Fake::new("example.com/widget");
    devices.fail = true;
    let m = manager(Policy::None, Scope::Container, vec![Arc::new(devices)]);
    let rejection = m.admit(&pod(&["a"])).await.unwrap_err();
    assert_eq!(rejection.reason, "UnexpectedAdmissionError");
    assert_eq!(
        rejection.message,
        "Allocate failed due to device plugin went away, which is unexpected"
    );
}

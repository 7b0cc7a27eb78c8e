//! Merging the hint providers' NUMA hints into one hint per container (or pod), and
//! whether a policy admits it: the kubelet's `none`, `best-effort`, `restricted` and
//! `single-numa-node` policies with the `prefer-closest-numa-nodes` option.

use std::collections::BTreeMap;
use std::fmt;

use super::bitmask::{BitMask, all_masks};

/// One way to place a resource: the NUMA nodes it would use (`None`: any, the
/// provider has no preference), and whether that placement is a good one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TopologyHint {
    pub affinity: Option<BitMask>,
    pub preferred: bool,
}

impl TopologyHint {
    pub fn new(nodes: &[u32], preferred: bool) -> Self {
        TopologyHint {
            affinity: Some(BitMask::new(nodes)),
            preferred,
        }
    }

    /// "No preference": any NUMA node will do.
    pub const ANY: TopologyHint = TopologyHint {
        affinity: None,
        preferred: true,
    };
}

impl fmt::Debug for TopologyHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.affinity {
            Some(m) => write!(f, "{{{m} {}}}", self.preferred),
            None => write!(f, "{{<nil> {}}}", self.preferred),
        }
    }
}

/// One provider's answer: per resource, `None` when it has no preference for the
/// resource, `Some(vec![])` when it cannot place it at all, else the possible
/// placements.
pub type ProviderHints = BTreeMap<String, Option<Vec<TopologyHint>>>;

/// `topologyManagerPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    #[default]
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

impl Policy {
    pub fn parse(name: &str) -> Result<Self, String> {
        Ok(match name {
            "none" => Policy::None,
            "best-effort" => Policy::BestEffort,
            "restricted" => Policy::Restricted,
            "single-numa-node" => Policy::SingleNumaNode,
            other => {
                return Err(format!(
                    "unknown policy: \"{other}\" (none, best-effort, restricted, single-numa-node)"
                ));
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::BestEffort => "best-effort",
            Policy::Restricted => "restricted",
            Policy::SingleNumaNode => "single-numa-node",
        }
    }
}

/// `topologyManagerPolicyOptions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyOptions {
    /// `prefer-closest-numa-nodes`: among equally wide masks, the one whose nodes are
    /// closest to each other (lowest average distance) wins.
    pub prefer_closest_numa: bool,
    /// `max-allowable-numa-nodes` (8): the topology manager refuses to run on a
    /// machine with more NUMA nodes, as the number of masks grows as 2^n.
    pub max_allowable_numa_nodes: usize,
}

/// The kubelet's default `max-allowable-numa-nodes`.
pub const DEFAULT_MAX_ALLOWABLE_NUMA_NODES: usize = 8;

impl Default for PolicyOptions {
    fn default() -> Self {
        PolicyOptions {
            prefer_closest_numa: false,
            max_allowable_numa_nodes: DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
        }
    }
}

impl PolicyOptions {
    /// From the configuration's map of option → value (both strings, as upstream).
    pub fn parse(options: &BTreeMap<String, String>) -> Result<Self, String> {
        let mut out = PolicyOptions::default();
        for (name, value) in options {
            match name.as_str() {
                "prefer-closest-numa-nodes" => {
                    out.prefer_closest_numa = parse_bool(value)
                        .ok_or_else(|| format!("bad value for option {name:?}: {value:?}"))?;
                }
                "max-allowable-numa-nodes" => {
                    out.max_allowable_numa_nodes = value
                        .parse()
                        .map_err(|_| format!("bad value for option {name:?}: {value:?}"))?;
                }
                other => return Err(format!("unsupported topology manager option: {other:?}")),
            }
        }
        Ok(out)
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// The machine's NUMA nodes and their distances.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaInfo {
    pub nodes: Vec<u32>,
    /// `distances[a]` is node `a`'s row, in the order of `nodes`.
    pub distances: BTreeMap<u32, Vec<u32>>,
}

impl NumaInfo {
    pub fn new(nodes: Vec<u32>) -> Self {
        NumaInfo {
            nodes,
            distances: BTreeMap::new(),
        }
    }

    /// Every node: the affinity of "any".
    pub fn default_affinity(&self) -> BitMask {
        BitMask::new(&self.nodes)
    }

    fn distance(&self, a: u32, b: u32) -> u32 {
        let index = self.nodes.iter().position(|n| *n == b);
        self.distances
            .get(&a)
            .zip(index)
            .and_then(|(row, i)| row.get(i).copied())
            .unwrap_or(if a == b { 10 } else { 20 })
    }

    /// The average distance between the mask's nodes (upstream's
    /// `CalculateAverageFor`: every ordered pair, a node with itself included).
    pub fn average_distance(&self, mask: BitMask) -> f64 {
        let bits = mask.bits();
        if bits.is_empty() {
            return 0.0;
        }
        let mut sum = 0u64;
        let mut pairs = 0u64;
        for &a in &bits {
            for &b in &bits {
                sum += u64::from(self.distance(a, b));
                pairs += 1;
            }
        }
        sum as f64 / pairs as f64
    }
}

/// Each provider's hints as the merge sees them: one list per (provider, resource),
/// "no preference" and "cannot place" made explicit.
fn filter_providers_hints(providers: &[ProviderHints]) -> Vec<Vec<TopologyHint>> {
    let mut all = Vec::new();
    for hints in providers {
        if hints.is_empty() {
            all.push(vec![TopologyHint::ANY]);
            continue;
        }
        for resource in hints.values() {
            match resource {
                None => all.push(vec![TopologyHint::ANY]),
                Some(list) if list.is_empty() => all.push(vec![TopologyHint {
                    affinity: None,
                    preferred: false,
                }]),
                Some(list) => all.push(list.clone()),
            }
        }
    }
    all
}

/// `single-numa-node` keeps only "any" and preferred one-node hints.
fn filter_single_numa_hints(all: Vec<Vec<TopologyHint>>) -> Vec<Vec<TopologyHint>> {
    all.into_iter()
        .map(|hints| {
            hints
                .into_iter()
                .filter(|h| match h.affinity {
                    None => h.preferred,
                    Some(m) => m.count() == 1 && h.preferred,
                })
                .collect()
        })
        .collect()
}

/// Chooses the best merged hint over every combination of one hint per list.
struct HintMerger<'a> {
    numa: &'a NumaInfo,
    hints: Vec<Vec<TopologyHint>>,
    /// The width a non-preferred result should get as close to (from below): the
    /// widest of the lists' narrowest masks, i.e. what the most demanding resource
    /// needs at least.
    best_non_preferred_count: u32,
    /// `prefer-closest-numa-nodes`, which `single-numa-node` ignores.
    prefer_closest: bool,
}

impl<'a> HintMerger<'a> {
    fn new(numa: &'a NumaInfo, hints: Vec<Vec<TopologyHint>>, prefer_closest: bool) -> Self {
        let best_non_preferred_count = hints
            .iter()
            .filter_map(|list| {
                list.iter()
                    .filter_map(|h| h.affinity)
                    .reduce(|narrowest, m| {
                        if m.is_narrower_than(narrowest) {
                            m
                        } else {
                            narrowest
                        }
                    })
            })
            .map(BitMask::count)
            .max()
            .unwrap_or(0);
        HintMerger {
            numa,
            hints,
            best_non_preferred_count,
            prefer_closest,
        }
    }

    /// The better of two masks: the narrower one, or with `prefer-closest-numa-nodes`
    /// among equally wide ones the one whose nodes are closer together (the lower
    /// mask on a tie). The current one stays when they are equal.
    fn fitter(&self, current: TopologyHint, candidate: TopologyHint) -> TopologyHint {
        let (Some(cur), Some(cand)) = (current.affinity, candidate.affinity) else {
            return current;
        };
        if cur == cand {
            return current;
        }
        let candidate_wins = if self.prefer_closest && cur.count() == cand.count() {
            let (d_cur, d_cand) = (
                self.numa.average_distance(cur),
                self.numa.average_distance(cand),
            );
            if d_cur == d_cand {
                cand.is_less_than(cur)
            } else {
                d_cand < d_cur
            }
        } else {
            cand.is_narrower_than(cur)
        };
        if candidate_wins { candidate } else { current }
    }

    fn compare(
        &self,
        current: Option<TopologyHint>,
        candidate: TopologyHint,
    ) -> Option<TopologyHint> {
        let count = |h: &TopologyHint| h.affinity.map_or(0, BitMask::count);
        if count(&candidate) == 0 {
            return current;
        }
        let Some(current) = current else {
            return Some(candidate);
        };
        let best = self.best_non_preferred_count;
        let (cur, cand) = (count(&current), count(&candidate));
        Some(match (current.preferred, candidate.preferred) {
            (false, true) => candidate,
            (true, false) => current,
            (true, true) => self.fitter(current, candidate),
            // Both non-preferred: get as close as possible to, but not above, the
            // narrowest width the most demanding resource allows.
            (false, false) if cur > best => self.fitter(current, candidate),
            (false, false) if cur == best => {
                if cand == best {
                    self.fitter(current, candidate)
                } else {
                    current
                }
            }
            (false, false) if cand > best => current,
            (false, false) if cand == best => candidate,
            (false, false) if cand > cur => candidate,
            (false, false) if cand < cur => current,
            (false, false) => self.fitter(current, candidate),
        })
    }

    /// One permutation merged: the AND of its masks ("any" counts as every node),
    /// preferred only when every hint is preferred and every mask is the same.
    fn merge_permutation(&self, permutation: &[TopologyHint]) -> TopologyHint {
        let mut mask = self.numa.default_affinity();
        let mut first: Option<BitMask> = None;
        let mut preferred = true;
        for hint in permutation {
            if let Some(affinity) = hint.affinity {
                mask = mask.and(affinity);
                match first {
                    None => first = Some(affinity),
                    Some(f) if f != affinity => preferred = false,
                    Some(_) => {}
                }
            }
            preferred &= hint.preferred;
        }
        TopologyHint {
            affinity: Some(mask),
            preferred,
        }
    }

    fn merge(&self) -> TopologyHint {
        let mut best: Option<TopologyHint> = None;
        if self.hints.iter().all(|l| !l.is_empty()) {
            // Every permutation of one hint per list, the last list fastest.
            let mut index = vec![0usize; self.hints.len()];
            let mut permutation = Vec::with_capacity(self.hints.len());
            'permutations: loop {
                permutation.clear();
                permutation.extend(self.hints.iter().zip(&index).map(|(l, &i)| l[i]));
                best = self.compare(best, self.merge_permutation(&permutation));
                let mut k = self.hints.len();
                loop {
                    if k == 0 {
                        break 'permutations;
                    }
                    k -= 1;
                    index[k] += 1;
                    if index[k] < self.hints[k].len() {
                        break;
                    }
                    index[k] = 0;
                }
            }
        }
        best.unwrap_or(TopologyHint {
            affinity: Some(self.numa.default_affinity()),
            preferred: false,
        })
    }
}

/// The merged hint for `providers` under `policy`, and whether the policy admits it.
pub fn merge(
    policy: Policy,
    numa: &NumaInfo,
    opts: &PolicyOptions,
    providers: &[ProviderHints],
) -> (TopologyHint, bool) {
    match policy {
        Policy::None => (TopologyHint::ANY, true),
        Policy::BestEffort => {
            let hints = filter_providers_hints(providers);
            let hint = HintMerger::new(numa, hints, opts.prefer_closest_numa).merge();
            (hint, true)
        }
        Policy::Restricted => {
            let hints = filter_providers_hints(providers);
            let hint = HintMerger::new(numa, hints, opts.prefer_closest_numa).merge();
            (hint, hint.preferred)
        }
        Policy::SingleNumaNode => {
            let filtered = filter_single_numa_hints(filter_providers_hints(providers));
            let mut hint = HintMerger::new(numa, filtered, false).merge();
            if hint.affinity == Some(numa.default_affinity()) {
                hint.affinity = None;
            }
            (hint, hint.preferred)
        }
    }
}

/// Every placement of `n` units among the nodes, for providers that count units per
/// node (the CPU manager): the masks that hold `n` available units, preferred when no
/// narrower mask could hold `n` units of the whole machine.
pub fn count_hints(
    numa: &NumaInfo,
    n: usize,
    available_in: impl Fn(BitMask) -> usize,
    total_in: impl Fn(BitMask) -> usize,
) -> Vec<TopologyHint> {
    let masks = all_masks(&numa.nodes);
    let min_width = masks
        .iter()
        .filter(|m| total_in(**m) >= n)
        .map(|m| m.count())
        .min()
        .unwrap_or(numa.nodes.len() as u32);
    masks
        .into_iter()
        .filter(|m| available_in(*m) >= n)
        .map(|m| TopologyHint {
            affinity: Some(m),
            preferred: m.count() == min_width,
        })
        .collect()
}

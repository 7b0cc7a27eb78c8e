//! What the node does when a plugin cannot answer, per world, and the kubelet's
//! built-in eviction ranking that an eviction plugin's answer falls back to.

use std::cmp::Ordering;

use crate::types::Candidate;

/// The kubelet's built-in ranking (`rankMemoryPressure` and the disk rankings):
/// pods whose usage exceeds their request first, then by priority (lowest first),
/// then by how far usage exceeds the request (most first). Ties keep the input order.
pub fn builtin_rank(candidates: &[Candidate]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..candidates.len() as u32).collect();
    order.sort_by(|&a, &b| builtin_cmp(&candidates[a as usize], &candidates[b as usize]));
    order
}

fn builtin_cmp(a: &Candidate, b: &Candidate) -> Ordering {
    let exceeds = |c: &Candidate| c.usage > c.request;
    let above = |c: &Candidate| i128::from(c.usage) - i128::from(c.request);
    exceeds(b)
        .cmp(&exceeds(a))
        .then(a.pod.priority.cmp(&b.pod.priority))
        .then(above(b).cmp(&above(a)))
}

/// Checks a plugin's ranking (every index in range, none repeated) and completes it:
/// the candidates it left out follow in the built-in order.
pub(crate) fn complete_ranking(
    ranked: &[u32],
    candidates: &[Candidate],
) -> Result<Vec<u32>, String> {
    let mut seen = vec![false; candidates.len()];
    for &i in ranked {
        match seen.get_mut(i as usize) {
            None => {
                return Err(format!(
                    "index {i} is out of range for {} candidates",
                    candidates.len()
                ));
            }
            Some(true) => return Err(format!("index {i} is ranked twice")),
            Some(s) => *s = true,
        }
    }
    let mut order = ranked.to_vec();
    order.extend(
        builtin_rank(candidates)
            .into_iter()
            .filter(|&i| !seen[i as usize]),
    );
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::PodInfo;

    fn candidate(name: &str, priority: i32, usage: u64, request: u64) -> Candidate {
        Candidate {
            pod: PodInfo {
                namespace: "default".into(),
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
    fn builtin_order_is_exceeds_then_priority_then_excess() {
        let c = [
            candidate("within-low", 0, 50, 100),         // 0
            candidate("exceeds-high", 1000, 300, 100),   // 1
            candidate("exceeds-low-small", 0, 150, 100), // 2
            candidate("exceeds-low-big", 0, 900, 100),   // 3
            candidate("within-high", 1000, 10, 100),     // 4
            candidate("besteffort", 0, 20, 0),           // 5: exceeds (request 0)
        ];
        assert_eq!(builtin_rank(&c), [3, 2, 5, 1, 0, 4]);
    }

    #[test]
    fn ties_keep_the_input_order() {
        let c = [candidate("a", 0, 1, 1), candidate("b", 0, 1, 1)];
        assert_eq!(builtin_rank(&c), [0, 1]);
    }

    #[test]
    fn a_partial_ranking_is_completed_in_builtin_order() {
        let c = [
            candidate("a", 0, 50, 100),
            candidate("b", 0, 900, 100),
            candidate("c", 0, 300, 100),
        ];
        assert_eq!(complete_ranking(&[0], &c).unwrap(), [0, 1, 2]);
        assert_eq!(complete_ranking(&[], &c).unwrap(), [1, 2, 0]);
        assert!(
            complete_ranking(&[3], &c)
                .unwrap_err()
                .contains("out of range")
        );
        assert!(complete_ranking(&[1, 1], &c).unwrap_err().contains("twice"));
    }
}

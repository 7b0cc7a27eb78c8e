//! NUMA affinity masks: bit `n` set means NUMA node `n` (ids below 64, the same bound
//! as upstream's `bitmask`).

use std::fmt;

/// A set of NUMA node ids.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BitMask(u64);

impl BitMask {
    /// The mask with `nodes` set. Ids of 64 and above are not representable and
    /// are refused where the node's NUMA nodes are read ([`super::MAX_NUMA_ID`]).
    pub fn new(nodes: &[u32]) -> Self {
        BitMask(
            nodes
                .iter()
                .filter(|n| **n < 64)
                .fold(0, |m, n| m | (1u64 << n)),
        )
    }

    pub fn count(self) -> u32 {
        self.0.count_ones()
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn is_set(self, node: u32) -> bool {
        node < 64 && self.0 & (1u64 << node) != 0
    }

    pub fn and(self, other: BitMask) -> BitMask {
        BitMask(self.0 & other.0)
    }

    pub fn or(self, other: BitMask) -> BitMask {
        BitMask(self.0 | other.0)
    }

    /// The set node ids, ascending.
    pub fn bits(self) -> Vec<u32> {
        (0..64).filter(|b| self.is_set(*b)).collect()
    }

    /// Every node of `self` is in `other`.
    pub fn is_subset_of(self, other: BitMask) -> bool {
        self.0 & !other.0 == 0
    }

    /// Upstream's `IsLessThan`: the masks compared as numbers, so the one whose
    /// highest differing node is unset is less (`{0}` < `{1}`, `{1,2}` < `{0,3}`).
    pub fn is_less_than(self, other: BitMask) -> bool {
        self.0 < other.0
    }

    /// Upstream's `IsNarrowerThan`: fewer nodes, or as many and less.
    pub fn is_narrower_than(self, other: BitMask) -> bool {
        if self.count() == other.count() {
            return self.is_less_than(other);
        }
        self.count() < other.count()
    }
}

impl fmt::Debug for BitMask {
    /// As upstream prints masks: the bits, highest first (`01` is node 0).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = 64 - self.0.leading_zeros().min(63) as usize;
        write!(f, "{:0width$b}", self.0, width = width.max(1))
    }
}

impl fmt::Display for BitMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Every non-empty subset of `nodes`, smallest first and, within a size, in
/// lexicographic order of the node lists (upstream's `IterateBitMasks`).
pub fn all_masks(nodes: &[u32]) -> Vec<BitMask> {
    fn combine(
        nodes: &[u32],
        size: usize,
        start: usize,
        picked: &mut Vec<u32>,
        out: &mut Vec<BitMask>,
    ) {
        if picked.len() == size {
            out.push(BitMask::new(picked));
            return;
        }
        for i in start..nodes.len() {
            picked.push(nodes[i]);
            combine(nodes, size, i + 1, picked, out);
            picked.pop();
        }
    }
    let mut out = Vec::new();
    for size in 1..=nodes.len() {
        combine(nodes, size, 0, &mut Vec::new(), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_count_compare_and_print_as_upstream() {
        let m = BitMask::new(&[0, 2]);
        assert_eq!(m.count(), 2);
        assert_eq!(m.bits(), [0, 2]);
        assert_eq!(format!("{m}"), "101");
        assert!(BitMask::new(&[0]).is_narrower_than(BitMask::new(&[1, 2])));
        assert!(BitMask::new(&[0]).is_narrower_than(BitMask::new(&[1])));
        assert!(!BitMask::new(&[1]).is_narrower_than(BitMask::new(&[0])));
        assert!(BitMask::new(&[1, 2]).is_less_than(BitMask::new(&[0, 3])));
        assert!(!BitMask::new(&[1]).is_less_than(BitMask::new(&[1])));
        assert!(BitMask::new(&[1]).is_subset_of(BitMask::new(&[0, 1])));
        assert_eq!(
            BitMask::new(&[0, 1]).and(BitMask::new(&[1, 2])),
            BitMask::new(&[1])
        );
    }

    #[test]
    fn all_masks_go_by_size_then_order() {
        let masks: Vec<Vec<u32>> = all_masks(&[0, 1, 2])
            .into_iter()
            .map(BitMask::bits)
            .collect();
        assert_eq!(
            masks,
            [
                vec![0],
                vec![1],
                vec![2],
                vec![0, 1],
                vec![0, 2],
                vec![1, 2],
                vec![0, 1, 2]
            ]
        );
    }
}

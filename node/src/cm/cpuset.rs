//! A set of logical CPU ids in the kernel's list format (`0-3,6,8-9`), as cpuset
//! cgroups, sysfs and the kubelet's `cpu_manager_state` write it.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// Logical CPU ids, ordered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    pub fn insert(&mut self, cpu: u32) {
        self.0.insert(cpu);
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }

    /// The CPUs of `self` that pass `keep`.
    pub fn filter(&self, keep: impl Fn(u32) -> bool) -> CpuSet {
        CpuSet(self.0.iter().copied().filter(|c| keep(*c)).collect())
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        CpuSet(iter.into_iter().collect())
    }
}

/// Why a CPU list does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CPU list {list:?}: {reason}")]
pub struct ParseError {
    pub list: String,
    pub reason: String,
}

impl FromStr for CpuSet {
    type Err = ParseError;

    /// `""` is the empty set; whitespace around the list (sysfs ends it with a
    /// newline) is ignored; a range's end must not be below its start.
    fn from_str(list: &str) -> Result<Self, ParseError> {
        let fail = |reason: String| ParseError {
            list: list.to_owned(),
            reason,
        };
        let mut set = BTreeSet::new();
        let trimmed = list.trim();
        if trimmed.is_empty() {
            return Ok(CpuSet(set));
        }
        for part in trimmed.split(',') {
            let number = |s: &str| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| fail(format!("{s:?} is not a CPU number")))
            };
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (number(a)?, number(b)?);
                    if b < a {
                        return Err(fail(format!("range {part:?} ends before it starts")));
                    }
                    set.extend(a..=b);
                }
                None => {
                    set.insert(number(part)?);
                }
            }
        }
        Ok(CpuSet(set))
    }
}

impl fmt::Display for CpuSet {
    /// Runs of consecutive ids as ranges: `0-2,4,6-7`; two in a row are a range too
    /// (`0-1`), as the kubelet prints them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end = iter.next().unwrap_or(end);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    #[test]
    fn lists_parse_and_print_in_the_kernels_format() {
        for (input, printed, len) in [
            ("", "", 0),
            ("0", "0", 1),
            ("0-1\n", "0-1", 2),
            ("0-3,6,8-9", "0-3,6,8-9", 7),
            ("5,1,2,3", "1-3,5", 4),
            ("0,2,4", "0,2,4", 3),
        ] {
            let s = set(input);
            assert_eq!(s.len(), len, "{input:?}");
            assert_eq!(s.to_string(), printed, "{input:?}");
        }
    }

    #[test]
    fn bad_lists_are_refused_with_the_reason() {
        for bad in ["3-1", "a", "1,,2", "1-", "-1"] {
            let err = bad.parse::<CpuSet>().unwrap_err();
            assert_eq!(err.list, bad);
        }
        assert!(
            "3-1"
                .parse::<CpuSet>()
                .unwrap_err()
                .to_string()
                .contains("ends before it starts")
        );
    }

    #[test]
    fn set_operations() {
        let all = set("0-7");
        let used = set("2-3,6");
        assert_eq!(all.difference(&used).to_string(), "0-1,4-5,7");
        assert_eq!(all.intersection(&set("6-9")).to_string(), "6-7");
        assert_eq!(used.union(&set("0")).to_string(), "0,2-3,6");
        assert!(used.is_subset(&all));
        assert_eq!(all.filter(|c| c % 2 == 0).to_string(), "0,2,4,6");
    }
}

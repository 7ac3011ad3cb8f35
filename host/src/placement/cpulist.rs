//! CPU lists in the kernel's notation (`0-47,96-143`): parsing, printing and set operations.
//!
//! The same notation is used by sysfs (`/sys/devices/system/cpu/online`), `/proc/*/status`
//! (`Cpus_allowed_list`), `taskset -c` and `numactl --physcpubind`, so one type reads all of
//! them and prints what a user can paste back into `--cpus`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize, Serializer};

/// The largest CPU number accepted: Linux supports at most 8192 CPUs (`CONFIG_NR_CPUS`).
pub const MAX_CPU: usize = 8191;

/// A set of logical CPU numbers, kept sorted and without duplicates. May be empty (e.g. the CPUs
/// left over by a plan); parsing a user's list never gives an empty one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct CpuList {
    cpus: Vec<usize>,
}

/// Why a CPU list does not parse. The message shows the list and the expected notation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CPU list `{list}`: {problem}; write CPU numbers and ranges like `0-47,96-143`")]
pub struct CpuListError {
    /// The text given.
    pub list: String,
    /// What is wrong with it.
    pub problem: String,
}

impl CpuList {
    /// The set of `cpus`, in any order, duplicates dropped.
    pub fn from_cpus(cpus: impl IntoIterator<Item = usize>) -> Self {
        let mut cpus: Vec<usize> = cpus.into_iter().collect();
        cpus.sort_unstable();
        cpus.dedup();
        Self { cpus }
    }

    /// The CPU numbers, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.cpus.iter().copied()
    }

    /// How many CPUs the set holds.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// Whether the set holds no CPU.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }

    /// The lowest CPU number, if any.
    pub fn first(&self) -> Option<usize> {
        self.cpus.first().copied()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        self.cpus.binary_search(&cpu).is_ok()
    }

    /// Whether every CPU of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuList) -> bool {
        self.iter().all(|cpu| other.contains(cpu))
    }

    /// Whether the two sets share a CPU.
    pub fn intersects(&self, other: &CpuList) -> bool {
        self.iter().any(|cpu| other.contains(cpu))
    }

    /// The CPUs of `self` that are not in `other`.
    pub fn difference(&self, other: &CpuList) -> CpuList {
        Self::from_cpus(self.iter().filter(|&cpu| !other.contains(cpu)))
    }

    /// The CPUs in both sets.
    pub fn intersection(&self, other: &CpuList) -> CpuList {
        Self::from_cpus(self.iter().filter(|&cpu| other.contains(cpu)))
    }

    /// The CPUs in either set.
    pub fn union(&self, other: &CpuList) -> CpuList {
        Self::from_cpus(self.iter().chain(other.iter()))
    }
}

impl FromStr for CpuList {
    type Err = CpuListError;

    /// Parses comma-separated CPU numbers and inclusive ranges (`0-3,8,10-11`); whitespace
    /// around entries and one trailing newline (as sysfs writes) are allowed.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let problem = |problem: String| CpuListError {
            list: text.trim().to_owned(),
            problem,
        };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(problem("it is empty, so no CPU would run anything".into()));
        }
        let number = |entry: &str| -> Result<usize, CpuListError> {
            let cpu: usize = entry
                .trim()
                .parse()
                .map_err(|_| problem(format!("`{}` is not a CPU number", entry.trim())))?;
            if cpu > MAX_CPU {
                return Err(problem(format!(
                    "CPU {cpu} is beyond the largest CPU number Linux supports ({MAX_CPU})"
                )));
            }
            Ok(cpu)
        };
        let mut cpus = Vec::new();
        for entry in trimmed.split(',') {
            if entry.trim().is_empty() {
                return Err(problem(
                    "it has an empty entry; separate entries with single commas".into(),
                ));
            }
            match entry.split_once('-') {
                Some((first, last)) => {
                    let (first, last) = (number(first)?, number(last)?);
                    if first > last {
                        return Err(problem(format!(
                            "the range `{first}-{last}` runs backwards; write `{last}-{first}`"
                        )));
                    }
                    cpus.extend(first..=last);
                }
                None => cpus.push(number(entry)?),
            }
        }
        Ok(Self::from_cpus(cpus))
    }
}

impl TryFrom<String> for CpuList {
    type Error = CpuListError;

    /// Parses the list, as [`FromStr`] does (for config files).
    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl fmt::Display for CpuList {
    /// Prints runs of two or more consecutive CPUs as ranges, as the kernel does: `0-47,96-143`.
    /// An empty set prints as nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut cpus = self.cpus.iter().copied().peekable();
        let mut first_entry = true;
        while let Some(start) = cpus.next() {
            let mut end = start;
            while cpus.peek() == Some(&(end + 1)) {
                end += 1;
                cpus.next();
            }
            if !first_entry {
                f.write_str(",")?;
            }
            first_entry = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl Serialize for CpuList {
    /// Serialises as the kernel notation string, e.g. `"0-47,96-143"`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> CpuList {
        text.parse()
            .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    #[test]
    fn parses_numbers_and_ranges_in_any_order() {
        let list = parse("96-98, 0-2,5\n");
        assert_eq!(
            list.iter().collect::<Vec<_>>(),
            vec![0, 1, 2, 5, 96, 97, 98],
            "got {list}"
        );
        assert_eq!(parse("3,1,3,2").iter().collect::<Vec<_>>(), vec![1, 2, 3]);
    }

    #[test]
    fn prints_runs_as_ranges_and_round_trips() {
        for text in ["0-47,96-143", "0", "0-1", "0,2,4", "0-3,8,10-11"] {
            assert_eq!(parse(text).to_string(), text, "round trip of {text}");
        }
        assert_eq!(parse("5,4,3,7").to_string(), "3-5,7");
        assert_eq!(CpuList::default().to_string(), "");
    }

    #[test]
    fn rejects_bad_lists_naming_the_problem() {
        for (text, needle) in [
            ("", "empty"),
            ("  \n", "empty"),
            ("0,,2", "empty entry"),
            ("0,", "empty entry"),
            ("a-3", "`a` is not a CPU number"),
            ("-3", "`` is not a CPU number"),
            ("1-2-3", "`2-3` is not a CPU number"),
            ("7-3", "write `3-7`"),
            ("9000", "beyond the largest"),
        ] {
            let err = text.parse::<CpuList>().expect_err(text).to_string();
            assert!(
                err.contains(needle),
                "{text:?}: wanted `{needle}` in: {err}"
            );
            assert!(
                err.contains("0-47,96-143"),
                "{text:?}: no example in: {err}"
            );
        }
    }

    #[test]
    fn set_operations() {
        let all = parse("0-7");
        let low = parse("0-3");
        assert_eq!(all.difference(&low).to_string(), "4-7");
        assert_eq!(all.intersection(&parse("2,9")).to_string(), "2");
        assert_eq!(low.union(&parse("6")).to_string(), "0-3,6");
        assert!(low.is_subset(&all) && !all.is_subset(&low));
        assert!(low.intersects(&parse("3-9")) && !low.intersects(&parse("4-9")));
        assert_eq!((all.len(), all.first()), (8, Some(0)));
        assert!(all.difference(&all).is_empty());
    }

    #[test]
    fn serialises_as_the_kernel_string() {
        let json = serde_json::to_string(&parse("0-1,4")).expect("serialises");
        assert_eq!(json, "\"0-1,4\"");
    }
}

//! Memory settings that decide how the weights are paged: transparent huge pages (THP),
//! reserved hugetlb pools and automatic NUMA balancing.
//!
//! Files read, relative to the root: `sys/kernel/mm/transparent_hugepage/{enabled,defrag}`,
//! `sys/kernel/mm/hugepages/hugepages-*kB/{nr_hugepages,free_hugepages}`, `proc/meminfo` and
//! `proc/sys/kernel/numa_balancing`. Every one is optional: a missing file reads as unknown.

use std::path::Path;

use serde::Serialize;

use super::sysfs::{self, Root};

/// One pool of reserved (hugetlbfs) pages of one size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HugepagePool {
    /// Page size in KiB (2048 or 1048576 on x86-64).
    pub page_kib: u64,
    /// Pages reserved.
    pub total: u64,
    /// Pages not in use.
    pub free: u64,
}

/// The machine's memory paging settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemorySettings {
    /// `MemTotal` of `/proc/meminfo`, in KiB.
    pub total_kib: Option<u64>,
    /// The selected THP mode: `always`, `madvise` or `never`.
    pub thp_enabled: Option<String>,
    /// The selected THP defrag mode.
    pub thp_defrag: Option<String>,
    /// Anonymous memory backed by transparent huge pages now, in KiB.
    pub anon_huge_kib: Option<u64>,
    /// Reserved hugetlb pools, smallest page size first.
    pub hugepage_pools: Vec<HugepagePool>,
    /// Whether the kernel migrates pages between NUMA nodes on its own.
    pub numa_balancing: Option<bool>,
}

const THP_DIR: &str = "sys/kernel/mm/transparent_hugepage";
const HUGEPAGES_DIR: &str = "sys/kernel/mm/hugepages";

impl MemorySettings {
    /// Reads the settings of the machine this process runs on.
    pub fn read_host() -> Self {
        Self::read(Path::new("/"))
    }

    /// Reads the settings from the kernel files under `root`.
    pub fn read(root: &Path) -> Self {
        let root = Root::new(root);
        let meminfo = root.read("proc/meminfo").unwrap_or_default();
        let selected = |file: &str| {
            root.read(&format!("{THP_DIR}/{file}"))
                .and_then(|modes| selected_mode(&modes))
        };
        let hugepage_pools: Vec<HugepagePool> = root
            .numbered_entries(HUGEPAGES_DIR, "hugepages-", "kB")
            .into_iter()
            .filter_map(|(page_kib, name)| {
                Some(HugepagePool {
                    page_kib,
                    total: root.number(&format!("{HUGEPAGES_DIR}/{name}/nr_hugepages"))?,
                    free: root.number(&format!("{HUGEPAGES_DIR}/{name}/free_hugepages"))?,
                })
            })
            .collect();
        Self {
            total_kib: sysfs::kib_field(&meminfo, "MemTotal"),
            thp_enabled: selected("enabled"),
            thp_defrag: selected("defrag"),
            anon_huge_kib: sysfs::kib_field(&meminfo, "AnonHugePages"),
            hugepage_pools,
            numa_balancing: root
                .number("proc/sys/kernel/numa_balancing")
                .map(|mode| mode != 0),
        }
    }

    /// The pools with pages reserved.
    pub fn reserved_pools(&self) -> impl Iterator<Item = &HugepagePool> {
        self.hugepage_pools.iter().filter(|pool| pool.total > 0)
    }
}

/// The bracketed word of a sysfs mode list: `always [madvise] never` gives `madvise`.
fn selected_mode(modes: &str) -> Option<String> {
    let start = modes.find('[')? + 1;
    let end = start + modes[start..].find(']')?;
    Some(modes[start..end].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::fixtures::fixture;

    #[test]
    fn picks_the_bracketed_mode() {
        assert_eq!(
            selected_mode("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(
            selected_mode("always defer defer+madvise [madvise] never").as_deref(),
            Some("madvise")
        );
        assert_eq!(selected_mode("always madvise never"), None);
    }

    #[test]
    fn reads_thp_pools_and_balancing_from_fixtures() {
        let epyc = MemorySettings::read(&fixture("epyc-9655"));
        assert_eq!(epyc.thp_enabled.as_deref(), Some("always"));
        assert_eq!(epyc.total_kib, Some(1_188_003_840));
        assert_eq!(epyc.reserved_pools().count(), 0);
        assert_eq!(epyc.numa_balancing, Some(false));

        let xeon = MemorySettings::read(&fixture("xeon-2s"));
        assert_eq!(xeon.thp_enabled.as_deref(), Some("never"));
        assert_eq!(xeon.thp_defrag.as_deref(), Some("madvise"));
        let reserved: Vec<&HugepagePool> = xeon.reserved_pools().collect();
        assert_eq!(
            reserved,
            [&HugepagePool {
                page_kib: 1_048_576,
                total: 16,
                free: 16
            }]
        );
        assert_eq!(
            xeon.hugepage_pools.first().map(|p| p.page_kib),
            Some(2048),
            "pools sorted by page size"
        );
        assert_eq!(xeon.numa_balancing, Some(true));
    }

    #[test]
    fn missing_files_read_as_unknown() {
        let none = MemorySettings::read(Path::new("/nonexistent-root"));
        assert_eq!(
            (none.thp_enabled, none.total_kib, none.hugepage_pools.len()),
            (None, None, 0)
        );
    }
}

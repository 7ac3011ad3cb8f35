//! The placement half of `spechost info`: the machine's layout, its memory settings, the plan
//! and the advice, as text for people and as JSON (serde) for scripts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::advice::{Advice, advise};
use super::memory::MemorySettings;
use super::plan::Plan;
use super::topology::{Cache, Topology};

/// Everything `spechost info` says about CPUs, memory and placement.
#[derive(Debug, Clone, Serialize)]
pub struct PlacementReport {
    /// The CPU layout.
    pub topology: Topology,
    /// Sockets with online CPUs.
    pub sockets: usize,
    /// Logical CPUs per physical core (2 with two-way SMT).
    pub threads_per_core: usize,
    /// THP, hugetlb pools, NUMA balancing.
    pub memory: MemorySettings,
    /// The `OMP_*` and `GOMP_*` variables of the environment.
    pub openmp_env: BTreeMap<String, String>,
    /// What spechost would do with the given flags.
    pub plan: Plan,
    /// What to change on this machine.
    pub advice: Vec<Advice>,
}

impl PlacementReport {
    /// Puts the facts together and derives the advice.
    pub fn new(
        topology: Topology,
        memory: MemorySettings,
        plan: Plan,
        openmp_env: BTreeMap<String, String>,
    ) -> Self {
        let advice = advise(&topology, &memory, &plan, &openmp_env);
        Self {
            sockets: topology.sockets(),
            threads_per_core: topology.threads_per_core(),
            topology,
            memory,
            openmp_env,
            plan,
            advice,
        }
    }

    /// The report as aligned `label  value` lines, with the plan and the advice last.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let topology = &self.topology;
        let mut line = |label: &str, value: String| {
            let _ = writeln!(out, "{label:<15}{value}");
        };
        line(
            "CPU",
            topology
                .cpu_model
                .clone()
                .unwrap_or_else(|| "unknown".into()),
        );
        line("sockets", self.sockets.to_string());
        line(
            "cores",
            format!(
                "{} physical, {} CPUs online ({}), {} per core; this process may use {}",
                topology.cores.len(),
                topology.online.len(),
                topology.online,
                self.threads_per_core,
                topology.allowed
            ),
        );
        if self.threads_per_core > 1 {
            line("SMT siblings", smt_siblings(topology));
        }
        for node in &topology.nodes {
            line(
                &format!("NUMA node {}", node.id),
                format!(
                    "CPUs {}, {} ({} free)",
                    if node.cpus.is_empty() {
                        "none".to_owned()
                    } else {
                        node.cpus.to_string()
                    },
                    optional_size(node.mem_total_kib),
                    optional_size(node.mem_free_kib)
                ),
            );
        }
        if topology.nodes.is_empty() {
            line("NUMA nodes", "none reported (kernel without NUMA)".into());
        }
        for cache in &topology.caches {
            line(&cache_label(cache), cache_value(cache));
        }
        let memory = &self.memory;
        line("memory", optional_size(memory.total_kib));
        line(
            "THP",
            format!(
                "enabled {}, defrag {}, {} in use",
                memory.thp_enabled.as_deref().unwrap_or("unknown"),
                memory.thp_defrag.as_deref().unwrap_or("unknown"),
                optional_size(memory.anon_huge_kib)
            ),
        );
        line(
            "hugetlb pools",
            if memory.hugepage_pools.is_empty() {
                "none".into()
            } else {
                memory
                    .hugepage_pools
                    .iter()
                    .map(|pool| {
                        format!(
                            "{} pages: {} reserved, {} free",
                            size(pool.page_kib),
                            pool.total,
                            pool.free
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            },
        );
        if let Some(balancing) = memory.numa_balancing {
            line(
                "NUMA balancing",
                if balancing { "on" } else { "off" }.into(),
            );
        }
        line(
            "OpenMP env",
            if self.openmp_env.is_empty() {
                "none set".into()
            } else {
                self.openmp_env
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        );
        out.push_str("\nplan\n");
        out.push_str(&render_plan(&self.plan, topology));
        if !self.advice.is_empty() {
            out.push_str("\nadvice\n");
            for advice in &self.advice {
                let _ = writeln!(out, "  [{}] {}", advice.topic, advice.text);
            }
        }
        out
    }
}

fn render_plan(plan: &Plan, topology: &Topology) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "  {label:<15}{value}");
    };
    line(
        "threads",
        format!(
            "{} on {}",
            count(plan.threads, "compute thread"),
            count(plan.compute_cores, "physical core")
        ),
    );
    line(
        "compute CPUs",
        match &plan.compute_cpus {
            Some(cpus) => format!("pinned to {cpus}"),
            None => format!(
                "not pinned (the scheduler picks among {})",
                topology.allowed
            ),
        },
    );
    line(
        "draft CPUs",
        plan.draft_cpus
            .as_ref()
            .map_or_else(|| "not pinned".into(), |cpus| format!("pinned to {cpus}")),
    );
    line(
        "other threads",
        match (&plan.auxiliary_cpus, &plan.compute_cpus) {
            (Some(cpus), _) => format!("pinned to {cpus} (plugin host ticker, compiler threads)"),
            (None, Some(_)) => "share the compute CPUs (no CPU left)".into(),
            (None, None) => "not pinned".into(),
        },
    );
    line("NUMA strategy", plan.numa.name().into());
    line(
        "one CPU/core",
        format!(
            "{} (pass as --cpus for one pinned thread per core)",
            plan.one_cpu_per_core
        ),
    );
    for warning in &plan.warnings {
        line("warning", warning.clone());
    }
    out
}

/// The first few cores' sibling groups: `0,96 1,97 2,98 3,99 ...`.
fn smt_siblings(topology: &Topology) -> String {
    const SHOWN: usize = 4;
    let mut groups: Vec<String> = topology
        .cores
        .iter()
        .take(SHOWN)
        .map(|core| {
            core.cpus
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    if topology.cores.len() > SHOWN {
        groups.push(format!("... ({} cores)", topology.cores.len()));
    }
    groups.join("  ")
}

fn cache_label(cache: &Cache) -> String {
    let kind = match cache.kind.as_str() {
        "Data" => "d",
        "Instruction" => "i",
        _ => "",
    };
    format!("L{}{kind} cache", cache.level)
}

fn cache_value(cache: &Cache) -> String {
    let sharing = cache.shared_cpus.len();
    format!(
        "{} per instance, shared by {sharing} CPU{} ({})",
        size(cache.size_kib),
        if sharing == 1 { "" } else { "s" },
        cache.shared_cpus
    )
}

/// `1 core`, `2 cores`.
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

fn optional_size(kib: Option<u64>) -> String {
    kib.map_or_else(|| "unknown".into(), size)
}

/// `48 KiB`, `32 MiB`, `1 GiB`, `1133.0 GiB`.
fn size(kib: u64) -> String {
    const MIB: u64 = 1024;
    const GIB: u64 = 1024 * 1024;
    if kib >= GIB && kib.is_multiple_of(GIB) {
        format!("{} GiB", kib / GIB)
    } else if kib >= GIB {
        format!("{:.1} GiB", kib as f64 / GIB as f64)
    } else if kib >= MIB && kib.is_multiple_of(MIB) {
        format!("{} MiB", kib / MIB)
    } else if kib >= MIB {
        format!("{:.1} MiB", kib as f64 / MIB as f64)
    } else {
        format!("{kib} KiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::fixtures::fixture;
    use crate::placement::{CpuList, PlacementRequest};

    fn report(machine: &str, request: PlacementRequest) -> PlacementReport {
        let root = fixture(machine);
        let topology = Topology::read(&root).expect("fixture reads");
        let plan = Plan::new(&topology, &request).expect("valid plan");
        PlacementReport::new(topology, MemorySettings::read(&root), plan, BTreeMap::new())
    }

    #[test]
    fn epyc_text_names_the_layout_and_the_plan() {
        let text = report("epyc-9655", PlacementRequest::default()).render();
        for needle in [
            "AMD EPYC 9655 96-Core Processor",
            "96 physical, 192 CPUs online (0-191), 2 per core",
            "0,96  1,97  2,98  3,99  ... (96 cores)",
            "NUMA node 0    CPUs 0-191, 1133.0 GiB",
            "L3 cache       32 MiB per instance, shared by 16 CPUs (0-7,96-103)",
            "L1d cache      48 KiB",
            "enabled always",
            "96 compute threads on 96 physical cores",
            "not pinned (the scheduler picks among 0-191)",
            "[smt]",
        ] {
            assert!(text.contains(needle), "`{needle}` not in:\n{text}");
        }
    }

    #[test]
    fn pinned_plan_lists_compute_and_other_cpus() {
        let request = PlacementRequest {
            cpus: Some("0-7".parse::<CpuList>().expect("valid")),
            ..PlacementRequest::default()
        };
        let text = report("xeon-2s", request).render();
        for needle in [
            "pinned to 0-7",
            "pinned to 16-23 (plugin host ticker",
            "NUMA node 1    CPUs 8-15,24-31",
        ] {
            assert!(text.contains(needle), "`{needle}` not in:\n{text}");
        }
        assert!(
            text.contains("1 GiB pages: 16 reserved, 16 free"),
            "hugetlb pool line missing:\n{text}"
        );
    }

    #[test]
    fn json_has_the_plan_and_topology_fields() {
        let json = serde_json::to_value(report("dev-vm", PlacementRequest::default()))
            .expect("serialises");
        assert_eq!(json["plan"]["threads"], 2, "{json}");
        assert_eq!(json["topology"]["online"], "0-1", "{json}");
        assert_eq!(json["topology"]["cores"][1]["cpus"], "1", "{json}");
        assert_eq!(json["memory"]["thp_enabled"], "madvise", "{json}");
        assert_eq!(json["plan"]["numa"], "off", "{json}");
    }

    #[test]
    fn sizes_read_naturally() {
        assert_eq!(size(48), "48 KiB");
        assert_eq!(size(32 * 1024), "32 MiB");
        assert_eq!(size(1536), "1.5 MiB");
        assert_eq!(size(1_188_003_840), "1133.0 GiB");
        assert_eq!(size(1_048_576), "1 GiB");
    }
}

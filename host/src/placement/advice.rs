//! Advice on the machine's settings, from what the seeds measured on the EPYC 9655: SMT siblings
//! halve throughput, `numactl --interleave=all` with one thread per core was the best placement,
//! and reserved 1 GB hugepages go unused unless the engine maps with `MAP_HUGETLB` (llama.cpp
//! does not).

use std::collections::BTreeMap;

use serde::Serialize;

use super::memory::MemorySettings;
use super::plan::{NumaMode, Plan};
use super::topology::Topology;

/// One piece of advice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Advice {
    /// What it is about: `smt`, `numa`, `thp`, `hugetlb` or `openmp`.
    pub topic: &'static str,
    /// What was found and what to do, in one or two sentences.
    pub text: String,
}

/// OpenMP variables that make libgomp bind its threads itself.
const OPENMP_BINDING_VARIABLES: [&str; 3] = ["OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"];

/// Advice for running the plan on this machine. `openmp_env` holds the `OMP_*` and `GOMP_*`
/// variables of the environment.
pub fn advise(
    topology: &Topology,
    memory: &MemorySettings,
    plan: &Plan,
    openmp_env: &BTreeMap<String, String>,
) -> Vec<Advice> {
    let mut advice = Vec::new();
    let mut say = |topic, text: String| advice.push(Advice { topic, text });

    let per_core = topology.threads_per_core();
    if per_core > 1 {
        let pin = if plan.compute_cpus.is_none() {
            format!(
                " To pin one thread per core, pass --cpus {}.",
                plan.one_cpu_per_core
            )
        } else {
            String::new()
        };
        say(
            "smt",
            format!(
                "SMT is on ({per_core} CPUs per core): spechost runs one compute thread per physical core, since the seeds measured 3.77 tok/s with 96 threads on 96 cores and 1.62 tok/s with 192.{pin}"
            ),
        );
    }

    let nodes = topology.nodes.len();
    if nodes > 1 && plan.numa == NumaMode::Off {
        say(
            "numa",
            format!(
                "{nodes} NUMA nodes: spread the weights over every node's memory with `numactl --interleave=all spechost ...` (the seeds' best placement, with one thread per core), or let llama.cpp spread its threads with --numa distribute."
            ),
        );
    }
    if nodes > 1 && memory.numa_balancing == Some(true) {
        say(
            "numa",
            "automatic NUMA balancing is on, and llama.cpp has seen it hurt inference; turn it off with `echo 0 > /proc/sys/kernel/numa_balancing`.".into(),
        );
    }

    match memory.thp_enabled.as_deref() {
        Some("never") => say(
            "thp",
            "transparent huge pages are off, so llama.cpp's buffers (the weights with --no-mmap, the KV cache) get 4 KiB pages; `echo always > /sys/kernel/mm/transparent_hugepage/enabled` and load with --no-mmap to back the weights with 2 MiB pages.".into(),
        ),
        Some("madvise") => say(
            "thp",
            "transparent huge pages are `madvise` and llama.cpp never asks for them, so its buffers (the weights with --no-mmap, the KV cache) get 4 KiB pages; `echo always > /sys/kernel/mm/transparent_hugepage/enabled` and load with --no-mmap to back the weights with 2 MiB pages.".into(),
        ),
        Some("always") => say(
            "thp",
            "transparent huge pages are `always`: with --no-mmap the weights are anonymous memory that THP backs with 2 MiB pages; with the default mmap they stay page cache, whose page size depends on the kernel and filesystem.".into(),
        ),
        _ => {}
    }

    for pool in memory.reserved_pools() {
        say(
            "hugetlb",
            format!(
                "{} hugetlb pages of {} KiB are reserved ({} free) and spechost cannot use them: llama.cpp maps the weights without MAP_HUGETLB. Unless another program needs them, give the memory back with `echo 0 > /sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages`.",
                pool.total, pool.page_kib, pool.free, pool.page_kib
            ),
        );
    }

    for (name, value) in openmp_env {
        if OPENMP_BINDING_VARIABLES.contains(&name.as_str()) {
            let effect = if plan.compute_cpus.is_some() {
                "which overrides --cpus; unset it"
            } else {
                "so libgomp, not spechost, decides where llama.cpp's threads run"
            };
            say(
                "openmp",
                format!("{name}={value} makes libgomp bind its threads itself, {effect}."),
            );
        } else if name == "OMP_NUM_THREADS" {
            say(
                "openmp",
                format!(
                    "OMP_NUM_THREADS={value} does not change llama.cpp's thread count, which spechost sets from --threads ({})",
                    plan.threads
                ),
            );
        }
    }
    advice
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::PlacementRequest;
    use crate::placement::fixtures::fixture;

    fn advice_for(machine: &str, env: &[(&str, &str)]) -> Vec<Advice> {
        let root = fixture(machine);
        let topology = Topology::read(&root).expect("fixture reads");
        let memory = MemorySettings::read(&root);
        let plan = Plan::new(&topology, &PlacementRequest::default()).expect("valid");
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        advise(&topology, &memory, &plan, &env)
    }

    fn topics(advice: &[Advice]) -> Vec<&'static str> {
        advice.iter().map(|a| a.topic).collect()
    }

    #[test]
    fn epyc_gets_smt_advice_with_the_one_per_core_list() {
        let advice = advice_for("epyc-9655", &[]);
        assert_eq!(topics(&advice), ["smt", "thp"]);
        assert!(
            advice[0].text.contains("--cpus 0-95"),
            "got {}",
            advice[0].text
        );
    }

    #[test]
    fn two_sockets_get_numa_thp_and_hugetlb_advice() {
        let advice = advice_for("xeon-2s", &[("OMP_PLACES", "cores")]);
        assert_eq!(
            topics(&advice),
            ["smt", "numa", "numa", "thp", "hugetlb", "openmp"]
        );
        let text: String = advice.iter().map(|a| a.text.as_str()).collect();
        for needle in [
            "numactl --interleave=all",
            "numa_balancing",
            "--no-mmap",
            "MAP_HUGETLB",
            "hugepages-1048576kB",
            "OMP_PLACES=cores",
        ] {
            assert!(text.contains(needle), "`{needle}` not in {text}");
        }
    }

    #[test]
    fn this_vm_gets_only_thp_advice() {
        let advice = advice_for("dev-vm", &[("OMP_NUM_THREADS", "1")]);
        assert_eq!(topics(&advice), ["thp", "openmp"]);
        assert!(advice[0].text.contains("`madvise`"), "{}", advice[0].text);
    }
}

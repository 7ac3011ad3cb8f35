//! The machine's CPU layout, read from sysfs and procfs: sockets, physical cores and their SMT
//! siblings, NUMA nodes with their memory, and the caches of the first CPU.
//!
//! Files read, relative to the root (`/` live, a fixture directory in tests):
//! - `sys/devices/system/cpu/online` (required);
//! - `sys/devices/system/cpu/cpuN/topology/{physical_package_id,thread_siblings_list}`;
//! - `sys/devices/system/cpu/cpuN/cache/indexM/{level,type,size,shared_cpu_list}` of the first
//!   online CPU;
//! - `sys/devices/system/node/nodeN/{cpulist,meminfo}`;
//! - `proc/cpuinfo` (`model name`) and `proc/self/status` (`Cpus_allowed_list`).
//!
//! Missing optional files are tolerated the way the kernel's own tools do: a CPU without
//! topology files is its own core on socket 0, a kernel without NUMA has no nodes.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::cpulist::CpuList;
use super::sysfs::{self, Root, TopologyError};

/// One physical core: the logical CPUs (SMT siblings) that share its execution units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Core {
    /// The socket (`physical_package_id`).
    pub package: u32,
    /// Its online logical CPUs, lowest first; more than one when SMT is on.
    pub cpus: CpuList,
}

/// One NUMA node: its CPUs and memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    /// The node number.
    pub id: u32,
    /// Its CPUs (empty for a memory-only node).
    pub cpus: CpuList,
    /// Its memory in KiB, when the kernel reports it.
    pub mem_total_kib: Option<u64>,
    /// Its free memory in KiB, when the kernel reports it.
    pub mem_free_kib: Option<u64>,
}

/// One cache of the first online CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cache {
    /// 1, 2, 3, ...
    pub level: u8,
    /// `Data`, `Instruction` or `Unified`.
    pub kind: String,
    /// Size of one instance in KiB.
    pub size_kib: u64,
    /// The CPUs sharing this instance.
    pub shared_cpus: CpuList,
}

/// The CPU layout of one machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// `model name` from `/proc/cpuinfo`, when there is one.
    pub cpu_model: Option<String>,
    /// The online logical CPUs.
    pub online: CpuList,
    /// The CPUs this process may run on when it starts (set by `taskset`, `numactl` or a cgroup),
    /// within the online ones.
    pub allowed: CpuList,
    /// The physical cores, ordered by their lowest CPU.
    pub cores: Vec<Core>,
    /// The NUMA nodes (none on a kernel without NUMA support).
    pub nodes: Vec<NumaNode>,
    /// The caches of the first online CPU, by level.
    pub caches: Vec<Cache>,
}

const CPU_DIR: &str = "sys/devices/system/cpu";
const NODE_DIR: &str = "sys/devices/system/node";

impl Topology {
    /// Reads the layout of the machine this process runs on.
    pub fn read_host() -> Result<Self, TopologyError> {
        Self::read(Path::new("/"))
    }

    /// Reads the layout from the kernel files under `root` (`/` for this machine).
    pub fn read(root: &Path) -> Result<Self, TopologyError> {
        let root = Root::new(root);
        let online_path = format!("{CPU_DIR}/online");
        let online = root.parse_cpu_list(&online_path, &root.require(&online_path)?)?;
        let allowed = match root.read("proc/self/status").as_deref() {
            Some(status) => match sysfs::field(status, "Cpus_allowed_list") {
                Some(list) => root
                    .parse_cpu_list("proc/self/status", list)?
                    .intersection(&online),
                None => online.clone(),
            },
            None => online.clone(),
        };
        let cpu_model = root
            .read("proc/cpuinfo")
            .and_then(|cpuinfo| sysfs::field(&cpuinfo, "model name").map(str::to_owned));
        Ok(Self {
            cpu_model,
            cores: read_cores(&root, &online)?,
            nodes: read_nodes(&root)?,
            caches: match online.first() {
                Some(cpu) => read_caches(&root, cpu)?,
                None => Vec::new(),
            },
            online,
            allowed,
        })
    }

    /// Number of sockets that have online CPUs.
    pub fn sockets(&self) -> usize {
        let mut packages: Vec<u32> = self.cores.iter().map(|core| core.package).collect();
        packages.sort_unstable();
        packages.dedup();
        packages.len()
    }

    /// The most logical CPUs any core has: 1 without SMT, 2 with two-way SMT.
    pub fn threads_per_core(&self) -> usize {
        self.cores
            .iter()
            .map(|core| core.cpus.len())
            .max()
            .unwrap_or(1)
    }

    /// How many physical cores have at least one CPU in `cpus`.
    pub fn cores_within(&self, cpus: &CpuList) -> usize {
        self.cores
            .iter()
            .filter(|core| core.cpus.intersects(cpus))
            .count()
    }

    /// The lowest CPU of `cpus` on each physical core: one CPU per core, SMT siblings left out.
    pub fn one_cpu_per_core(&self, cpus: &CpuList) -> CpuList {
        CpuList::from_cpus(
            self.cores
                .iter()
                .filter_map(|core| core.cpus.intersection(cpus).first()),
        )
    }
}

/// Groups the online CPUs into physical cores by their `thread_siblings_list`.
fn read_cores(root: &Root, online: &CpuList) -> Result<Vec<Core>, TopologyError> {
    let mut cores: BTreeMap<usize, Core> = BTreeMap::new();
    for cpu in online.iter() {
        let dir = format!("{CPU_DIR}/cpu{cpu}/topology");
        let siblings = root
            .cpu_list(&format!("{dir}/thread_siblings_list"))?
            .map_or_else(|| CpuList::from_cpus([cpu]), |s| s.intersection(online))
            .union(&CpuList::from_cpus([cpu]));
        let package = root
            .number(&format!("{dir}/physical_package_id"))
            .and_then(|id| u32::try_from(id).ok())
            .unwrap_or(0);
        let first = siblings.first().unwrap_or(cpu);
        cores.entry(first).or_insert(Core {
            package,
            cpus: siblings,
        });
    }
    Ok(cores.into_values().collect())
}

fn read_nodes(root: &Root) -> Result<Vec<NumaNode>, TopologyError> {
    let mut nodes = Vec::new();
    for (id, name) in root.numbered_entries(NODE_DIR, "node", "") {
        let Ok(id) = u32::try_from(id) else {
            continue;
        };
        let dir = format!("{NODE_DIR}/{name}");
        let Some(cpus) = root.cpu_list(&format!("{dir}/cpulist"))? else {
            continue;
        };
        let meminfo = root.read(&format!("{dir}/meminfo")).unwrap_or_default();
        nodes.push(NumaNode {
            id,
            cpus,
            mem_total_kib: sysfs::kib_field(&meminfo, &format!("Node {id} MemTotal")),
            mem_free_kib: sysfs::kib_field(&meminfo, &format!("Node {id} MemFree")),
        });
    }
    Ok(nodes)
}

fn read_caches(root: &Root, cpu: usize) -> Result<Vec<Cache>, TopologyError> {
    let cache_dir = format!("{CPU_DIR}/cpu{cpu}/cache");
    let mut caches = Vec::new();
    for (_, name) in root.numbered_entries(&cache_dir, "index", "") {
        let dir = format!("{cache_dir}/{name}");
        let (Some(level), Some(kind), Some(size_kib), Some(shared_cpus)) = (
            root.number(&format!("{dir}/level"))
                .and_then(|l| u8::try_from(l).ok()),
            root.read(&format!("{dir}/type")),
            root.read(&format!("{dir}/size"))
                .and_then(|s| sysfs::size_kib(&s)),
            root.cpu_list(&format!("{dir}/shared_cpu_list"))?,
        ) else {
            continue;
        };
        caches.push(Cache {
            level,
            kind: kind.trim().to_owned(),
            size_kib,
            shared_cpus,
        });
    }
    caches.sort_by_key(|cache| (cache.level, cache.kind.clone()));
    Ok(caches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::fixtures::fixture;

    fn cpus(text: &str) -> CpuList {
        text.parse().expect("valid list")
    }

    #[test]
    fn epyc_9655_has_96_cores_with_siblings_n_and_n_plus_96() {
        let topology = Topology::read(&fixture("epyc-9655")).expect("fixture reads");
        assert_eq!(topology.online, cpus("0-191"));
        assert_eq!(
            topology.cores.len(),
            96,
            "cores: {:?}",
            topology.cores.len()
        );
        assert_eq!(topology.sockets(), 1);
        assert_eq!(topology.threads_per_core(), 2);
        for (n, core) in topology.cores.iter().enumerate() {
            assert_eq!(core.cpus, CpuList::from_cpus([n, n + 96]), "core {n}");
        }
        assert_eq!(
            topology.cpu_model.as_deref(),
            Some("AMD EPYC 9655 96-Core Processor")
        );
        assert_eq!(topology.nodes.len(), 1);
        assert_eq!(topology.nodes[0].cpus, cpus("0-191"));
        assert_eq!(topology.nodes[0].mem_total_kib, Some(1_188_003_840));
        let l3 = topology
            .caches
            .iter()
            .find(|c| c.level == 3)
            .expect("an L3 cache");
        assert_eq!(
            (l3.size_kib, l3.shared_cpus.to_string()),
            (32 * 1024, "0-7,96-103".to_owned())
        );
        assert_eq!(topology.one_cpu_per_core(&topology.online), cpus("0-95"));
        assert_eq!(topology.cores_within(&cpus("0-47,96-143")), 48);
    }

    #[test]
    fn two_sockets_interleave_core_numbers_across_packages() {
        let topology = Topology::read(&fixture("xeon-2s")).expect("fixture reads");
        assert_eq!(topology.online, cpus("0-31"));
        assert_eq!(
            (
                topology.sockets(),
                topology.cores.len(),
                topology.threads_per_core()
            ),
            (2, 16, 2)
        );
        let socket_of = |cpu: usize| {
            topology
                .cores
                .iter()
                .find(|core| core.cpus.contains(cpu))
                .map(|core| core.package)
        };
        assert_eq!(
            [0, 7, 8, 15, 16, 24].map(socket_of),
            [0, 0, 1, 1, 0, 1].map(Some)
        );
        let nodes: Vec<String> = topology.nodes.iter().map(|n| n.cpus.to_string()).collect();
        assert_eq!(nodes, ["0-7,16-23", "8-15,24-31"]);
        assert_eq!(topology.one_cpu_per_core(&cpus("0-31")), cpus("0-15"));
        assert_eq!(topology.one_cpu_per_core(&cpus("16-23")), cpus("16-23"));
    }

    #[test]
    fn this_vm_has_two_cores_without_smt() {
        let topology = Topology::read(&fixture("dev-vm")).expect("fixture reads");
        assert_eq!(topology.online, cpus("0-1"));
        assert_eq!(topology.allowed, cpus("0-1"));
        assert_eq!(
            (
                topology.sockets(),
                topology.cores.len(),
                topology.threads_per_core()
            ),
            (1, 2, 1)
        );
        assert_eq!(topology.cpu_model.as_deref(), Some("AMD EPYC"));
        let levels: Vec<(u8, &str, u64)> = topology
            .caches
            .iter()
            .map(|c| (c.level, c.kind.as_str(), c.size_kib))
            .collect();
        assert_eq!(
            levels,
            [
                (1, "Data", 48),
                (1, "Instruction", 32),
                (2, "Unified", 1024),
                (3, "Unified", 32768)
            ]
        );
    }

    #[test]
    fn allowed_cpus_come_from_the_process_status() {
        let topology = Topology::read(&fixture("xeon-2s")).expect("fixture reads");
        assert_eq!(
            topology.allowed,
            cpus("0-7,16-23"),
            "the fixture's process runs under numactl --cpunodebind=0"
        );
    }

    #[test]
    fn missing_online_file_is_an_error_naming_the_file() {
        let err = Topology::read(Path::new("/nonexistent-root")).expect_err("no sysfs");
        let text = err.to_string();
        assert!(
            text.contains("/nonexistent-root/sys/devices/system/cpu/online"),
            "got {text}"
        );
    }

    #[test]
    fn reads_this_machine() {
        let topology = Topology::read_host().expect("this Linux machine has sysfs");
        assert!(!topology.online.is_empty(), "no online CPU");
        assert!(
            topology.allowed.is_subset(&topology.online) && !topology.allowed.is_empty(),
            "allowed {} vs online {}",
            topology.allowed,
            topology.online
        );
        let in_cores: usize = topology.cores.iter().map(|c| c.cpus.len()).sum();
        assert_eq!(
            in_cores,
            topology.online.len(),
            "every online CPU is in one core"
        );
    }
}

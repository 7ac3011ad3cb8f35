//! The placement plan: how many compute threads the target gets, which CPUs they are pinned to,
//! which CPUs are left for everything else, and llama.cpp's NUMA strategy.
//!
//! Rules, from the seeds' EPYC measurements (96 threads on 96 cores: 3.77 tok/s; 192 threads on
//! the same cores with SMT: 1.62 tok/s):
//! - threads default to the physical cores under them (SMT siblings are not counted);
//! - with `--cpus`, the compute threads are pinned to that set and may not outnumber its CPUs;
//!   everything the process may run on outside it (and outside `--draft-cpus`) is the auxiliary
//!   set, for the threads that are not compute threads;
//! - without `--cpus`, nothing is pinned and the threads count the physical cores of the CPUs the
//!   process was started on (so `taskset`/`numactl` wrappers keep working).

use serde::{Deserialize, Serialize};

use super::cpulist::CpuList;
use super::topology::Topology;

/// llama.cpp's NUMA strategies (`--numa`), applied once per process when llama.cpp starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NumaMode {
    /// Spread the compute threads evenly over all nodes (thread i on node i mod nodes).
    Distribute,
    /// Keep the compute threads on the node the process started on.
    Isolate,
    /// Keep the compute threads on the CPUs the process was given (by numactl, taskset or
    /// `--cpus`).
    Numactl,
    /// No NUMA handling in llama.cpp (its default).
    #[default]
    Off,
}

impl NumaMode {
    /// The flag value: `distribute`, `isolate`, `numactl` or `off`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Distribute => "distribute",
            Self::Isolate => "isolate",
            Self::Numactl => "numactl",
            Self::Off => "off",
        }
    }
}

/// What the user asked for: `--threads`, `--cpus`, `--draft-cpus`, `--numa`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlacementRequest {
    /// Compute threads of the target; `None` picks one per physical core.
    pub threads: Option<usize>,
    /// CPUs the target's compute threads are pinned to; `None` pins nothing.
    pub cpus: Option<CpuList>,
    /// CPUs the draft model's compute threads are pinned to.
    pub draft_cpus: Option<CpuList>,
    /// llama.cpp's NUMA strategy.
    pub numa: NumaMode,
}

/// Why a placement cannot be made on this machine. Every message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// A CPU list with no CPU in it.
    #[error("{flag} is empty; give at least one CPU, e.g. {flag} 0-3 (see `spechost info`)")]
    Empty {
        /// The flag.
        flag: &'static str,
    },
    /// CPUs that this machine does not have online.
    #[error(
        "{flag} {list} names CPU(s) {missing} that do not exist on this machine; its online CPUs are {online} (see `spechost info`)"
    )]
    NotOnline {
        /// The flag.
        flag: &'static str,
        /// The list given.
        list: CpuList,
        /// The CPUs of it that are not online.
        missing: CpuList,
        /// The online CPUs.
        online: CpuList,
    },
    /// `--threads 0`.
    #[error("--threads must be at least 1")]
    ZeroThreads,
    /// More compute threads than pinned CPUs.
    #[error(
        "--threads {threads} is more than the {count} CPU(s) pinned by --cpus {cpus}; give --threads {count} or fewer, or more CPUs to --cpus"
    )]
    TooManyThreads {
        /// Threads asked for.
        threads: usize,
        /// The pinned set.
        cpus: CpuList,
        /// Its size.
        count: usize,
    },
    /// A NUMA strategy that re-pins llama.cpp's threads, together with `--cpus`.
    #[error(
        "--numa {} makes llama.cpp pin its threads to whole NUMA nodes at every decode, which undoes --cpus; drop one of them, or use --numa numactl, which keeps llama.cpp's threads on the --cpus set", numa.name()
    )]
    NumaOverridesCpus {
        /// The strategy.
        numa: NumaMode,
    },
}

/// Where the compute threads run and how many there are. Build with [`Plan::new`]; apply with
/// [`Plan::pin_auxiliary`] and [`Plan::pin_compute`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Compute threads of the target (llama.cpp's `n_threads` and `n_threads_batch`).
    pub threads: usize,
    /// The CPUs the compute threads are pinned to; `None` leaves them to the scheduler.
    pub compute_cpus: Option<CpuList>,
    /// Physical cores under the compute threads: of `compute_cpus`, or of the process's CPUs
    /// when nothing is pinned.
    pub compute_cores: usize,
    /// The CPUs the draft model's compute threads are pinned to, if asked.
    pub draft_cpus: Option<CpuList>,
    /// The CPUs threads other than compute threads run on (plugin host ticker, compiler
    /// threads, server): the process's CPUs outside the compute and draft sets. `None` when
    /// nothing is pinned or no CPU is left.
    pub auxiliary_cpus: Option<CpuList>,
    /// One CPU per physical core of the CPUs the process may use: the `--cpus` that runs one
    /// compute thread per core without SMT siblings.
    pub one_cpu_per_core: CpuList,
    /// llama.cpp's NUMA strategy.
    pub numa: NumaMode,
    /// Legal but probably slow choices, one sentence each.
    pub warnings: Vec<String>,
}

impl Plan {
    /// Checks `request` against `topology` and decides threads and CPU sets.
    pub fn new(topology: &Topology, request: &PlacementRequest) -> Result<Self, PlacementError> {
        let check = |flag: &'static str, list: &CpuList| -> Result<(), PlacementError> {
            if list.is_empty() {
                return Err(PlacementError::Empty { flag });
            }
            let missing = list.difference(&topology.online);
            if !missing.is_empty() {
                return Err(PlacementError::NotOnline {
                    flag,
                    list: list.clone(),
                    missing,
                    online: topology.online.clone(),
                });
            }
            Ok(())
        };
        if let Some(cpus) = &request.cpus {
            check("--cpus", cpus)?;
            if matches!(request.numa, NumaMode::Distribute | NumaMode::Isolate) {
                return Err(PlacementError::NumaOverridesCpus { numa: request.numa });
            }
        }
        if let Some(cpus) = &request.draft_cpus {
            check("--draft-cpus", cpus)?;
        }
        if request.threads == Some(0) {
            return Err(PlacementError::ZeroThreads);
        }

        let mut warnings = Vec::new();
        let threads_cpus = request.cpus.as_ref().unwrap_or(&topology.allowed);
        let compute_cores = topology.cores_within(threads_cpus).max(1);
        let threads = request.threads.unwrap_or(compute_cores);
        match &request.cpus {
            Some(cpus) if threads > cpus.len() => {
                return Err(PlacementError::TooManyThreads {
                    threads,
                    cpus: cpus.clone(),
                    count: cpus.len(),
                });
            }
            None if threads > topology.allowed.len() => warnings.push(format!(
                "{threads} threads on {} CPUs: threads take turns on the same CPUs; use --threads {compute_cores}",
                topology.allowed.len()
            )),
            _ if threads > compute_cores => warnings.push(format!(
                "{threads} threads on {compute_cores} physical cores: SMT siblings share a core's execution units (the seeds measured 192 threads on 96 cores at 1.62 tok/s, 96 threads at 3.77); use --threads {compute_cores}"
            )),
            _ => {}
        }
        if let Some(cpus) = &request.cpus {
            let outside = cpus.difference(&topology.allowed);
            if !outside.is_empty() {
                warnings.push(format!(
                    "--cpus includes CPUs {outside} outside the {} this process was started on (taskset, numactl or a cgroup); pinning widens the set where the kernel allows it",
                    topology.allowed
                ));
            }
        }

        let auxiliary_cpus = request.cpus.as_ref().and_then(|cpus| {
            let taken = cpus.union(request.draft_cpus.as_ref().unwrap_or(&CpuList::default()));
            let left = topology.allowed.difference(&taken);
            (!left.is_empty()).then_some(left)
        });
        if request.cpus.is_some() && auxiliary_cpus.is_none() {
            warnings.push(
                "no CPU is left outside --cpus: the plugin host's threads share the compute CPUs"
                    .into(),
            );
        }
        Ok(Self {
            threads,
            compute_cpus: request.cpus.clone(),
            compute_cores,
            draft_cpus: request.draft_cpus.clone(),
            auxiliary_cpus,
            one_cpu_per_core: topology.one_cpu_per_core(&topology.allowed),
            numa: request.numa,
            warnings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::fixtures::fixture;

    fn cpus(text: &str) -> CpuList {
        text.parse().expect("valid list")
    }

    fn plan(machine: &str, request: PlacementRequest) -> Result<Plan, PlacementError> {
        let topology = Topology::read(&fixture(machine)).expect("fixture reads");
        Plan::new(&topology, &request)
    }

    fn pinned(list: &str, threads: Option<usize>) -> PlacementRequest {
        PlacementRequest {
            threads,
            cpus: Some(cpus(list)),
            ..PlacementRequest::default()
        }
    }

    #[test]
    fn epyc_defaults_to_96_unpinned_threads_and_suggests_one_cpu_per_core() {
        let plan = plan("epyc-9655", PlacementRequest::default()).expect("valid");
        assert_eq!(plan.threads, 96, "one thread per physical core, not 192");
        assert_eq!(
            (plan.compute_cpus.as_ref(), plan.auxiliary_cpus.as_ref()),
            (None, None)
        );
        assert_eq!(plan.one_cpu_per_core, cpus("0-95"));
        assert!(plan.warnings.is_empty(), "warnings: {:?}", plan.warnings);
    }

    #[test]
    fn epyc_pinned_to_one_thread_per_core_leaves_the_siblings_to_the_rest() {
        let plan = plan("epyc-9655", pinned("0-95", None)).expect("valid");
        assert_eq!(plan.threads, 96);
        assert_eq!(plan.compute_cpus, Some(cpus("0-95")));
        assert_eq!(plan.auxiliary_cpus, Some(cpus("96-191")));
    }

    #[test]
    fn epyc_half_the_cores_with_their_siblings_counts_cores_not_cpus() {
        let plan = plan("epyc-9655", pinned("0-47,96-143", None)).expect("valid");
        assert_eq!((plan.threads, plan.compute_cores), (48, 48));
        assert_eq!(plan.auxiliary_cpus, Some(cpus("48-95,144-191")));
        let smt = super::Plan::new(
            &Topology::read(&fixture("epyc-9655")).expect("fixture"),
            &pinned("0-47,96-143", Some(96)),
        )
        .expect("96 threads on 96 CPUs is allowed");
        assert!(
            smt.warnings.iter().any(|w| w.contains("SMT siblings")),
            "expected an SMT warning: {:?}",
            smt.warnings
        );
    }

    #[test]
    fn draft_cpus_are_kept_out_of_the_auxiliary_set() {
        let request = PlacementRequest {
            draft_cpus: Some(cpus("88-95")),
            ..pinned("0-87", None)
        };
        let plan = plan("epyc-9655", request).expect("valid");
        assert_eq!(plan.threads, 88);
        assert_eq!(plan.draft_cpus, Some(cpus("88-95")));
        assert_eq!(plan.auxiliary_cpus, Some(cpus("96-191")));
    }

    #[test]
    fn two_sockets_under_numactl_count_the_cores_of_the_allowed_node() {
        let plan = plan("xeon-2s", PlacementRequest::default()).expect("valid");
        assert_eq!(plan.threads, 8, "node 0 has 8 physical cores");
        assert_eq!(plan.one_cpu_per_core, cpus("0-7"));
        let pinned = super::Plan::new(
            &Topology::read(&fixture("xeon-2s")).expect("fixture"),
            &pinned("0-15", None),
        )
        .expect("valid");
        assert_eq!(pinned.threads, 16);
        assert_eq!(pinned.auxiliary_cpus, Some(cpus("16-23")));
        assert!(
            pinned.warnings.iter().any(|w| w.contains("8-15")),
            "CPUs outside the numactl set are named: {:?}",
            pinned.warnings
        );
    }

    #[test]
    fn this_vm_pins_one_cpu_and_leaves_the_other() {
        let plan = plan("dev-vm", pinned("0", None)).expect("valid");
        assert_eq!(plan.threads, 1);
        assert_eq!(plan.auxiliary_cpus, Some(cpus("1")));
        let all = super::Plan::new(
            &Topology::read(&fixture("dev-vm")).expect("fixture"),
            &pinned("0-1", None),
        )
        .expect("valid");
        assert_eq!((all.threads, all.auxiliary_cpus), (2, None));
        assert!(
            all.warnings.iter().any(|w| w.contains("no CPU is left")),
            "{:?}",
            all.warnings
        );
    }

    #[test]
    fn bad_requests_are_errors_naming_the_fix() {
        let cases = [
            (pinned("0-200", None), "CPU(s) 192-200 that do not exist"),
            (pinned("0", Some(4)), "give --threads 1 or fewer"),
            (
                PlacementRequest {
                    cpus: Some(CpuList::default()),
                    ..PlacementRequest::default()
                },
                "--cpus is empty",
            ),
            (
                PlacementRequest {
                    draft_cpus: Some(cpus("300")),
                    ..PlacementRequest::default()
                },
                "--draft-cpus 300",
            ),
            (
                PlacementRequest {
                    numa: NumaMode::Distribute,
                    ..pinned("0-95", None)
                },
                "use --numa numactl",
            ),
            (
                PlacementRequest {
                    threads: Some(0),
                    ..PlacementRequest::default()
                },
                "at least 1",
            ),
        ];
        for (request, needle) in cases {
            let err = plan("epyc-9655", request.clone())
                .expect_err(needle)
                .to_string();
            assert!(
                err.contains(needle),
                "{request:?}: wanted `{needle}` in {err}"
            );
        }
    }

    #[test]
    fn numactl_strategy_may_be_combined_with_cpus() {
        let request = PlacementRequest {
            numa: NumaMode::Numactl,
            ..pinned("0-7", None)
        };
        let plan = plan("xeon-2s", request).expect("numactl keeps threads on --cpus");
        assert_eq!(plan.numa, NumaMode::Numactl);
    }

    #[test]
    fn unpinned_oversubscription_is_a_warning() {
        let plan = plan(
            "dev-vm",
            PlacementRequest {
                threads: Some(4),
                ..PlacementRequest::default()
            },
        )
        .expect("allowed without --cpus");
        assert!(
            plan.warnings.iter().any(|w| w.contains("take turns")),
            "{:?}",
            plan.warnings
        );
    }
}

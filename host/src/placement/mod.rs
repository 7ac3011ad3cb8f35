//! CPU placement: where the target's compute threads run, how many there are, and how memory is
//! paged, decided from the machine's sysfs topology instead of by hand with `numactl`.
//!
//! In order:
//! 1. [`Topology::read_host`] and [`MemorySettings::read_host`] read the layout (sockets,
//!    physical cores and SMT siblings, NUMA nodes, caches) and the paging settings (THP,
//!    hugetlb pools); both take a root directory so tests read fixtures instead;
//! 2. [`Plan::new`] checks a [`PlacementRequest`] (`--threads`, `--cpus`, `--draft-cpus`,
//!    `--numa`) against the topology: threads default to physical cores, pinned threads may not
//!    outnumber their CPUs, CPUs must exist;
//! 3. at start-up the thread that will run the target calls [`Plan::pin_auxiliary`] before the
//!    plugin host starts (so its ticker and wasmtime's compiler threads inherit the auxiliary
//!    CPUs), then [`Plan::pin_compute`] before the target loads (so llama.cpp's OpenMP workers,
//!    started at the first decode, inherit the compute CPUs); [`thread_cpus`] reads back where
//!    every thread may run;
//! 4. [`PlacementReport`] renders all of it, with [`Advice`], for `spechost info`.
//!
//! What is pinned: the engine thread and llama.cpp's OpenMP workers (compute CPUs); with
//! `--draft-cpus`, one worker thread per draft-model context and its OpenMP workers (draft
//! CPUs, see [`PinnedDraftFactory`]); the plugin host's epoch ticker, wasmtime's compiler
//! threads and the server's HTTP threads (auxiliary CPUs). What is not: plugin calls run on the
//! engine thread between decodes (while the compute CPUs would otherwise wait for them), so
//! they share the compute CPUs; OpenMP workers are pinned as a set, not one per CPU. The NUMA
//! strategy itself is applied by `engine`, which owns llama.cpp.

mod advice;
mod affinity;
mod cpulist;
mod draft;
mod memory;
mod plan;
mod report;
mod sysfs;
mod topology;

pub use self::advice::Advice;
pub use self::affinity::{
    AffinityError, ThreadCpus, current_thread_cpus, pin_current_thread, thread_cpu_time,
    thread_cpus,
};
pub use self::cpulist::{CpuList, CpuListError, MAX_CPU};
pub use self::draft::{DRAFT_THREAD_NAME, PinnedDraftBatch, PinnedDraftFactory};
pub use self::memory::{HugepagePool, MemorySettings};
pub use self::plan::{NumaMode, PlacementError, PlacementRequest, Plan};
pub use self::report::PlacementReport;
pub use self::sysfs::TopologyError;
pub use self::topology::{Cache, Core, NumaNode, Topology};

#[cfg(test)]
mod fixtures {
    use std::path::PathBuf;

    /// The fixture tree of `machine` under `tests/fixtures/topology/`.
    pub(crate) fn fixture(machine: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/topology")
            .join(machine)
    }
}

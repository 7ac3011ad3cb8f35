//! Applying a plan: pinning the calling thread to a CPU set, and reading back where every
//! thread of the process may run.
//!
//! Only the calling thread is pinned; threads it starts afterwards inherit its CPU set. That is
//! how the plan reaches threads spechost does not create itself: llama.cpp's OpenMP workers are
//! started by the engine thread at its first decode (libgomp reads `OMP_*` variables when it is
//! loaded, before `main`, so setting them at run time would do nothing), and wasmtime's compiler
//! threads and the plugin host's epoch ticker are started while plugins load.

use std::path::PathBuf;
use std::time::Duration;

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;
use serde::Serialize;

use super::cpulist::CpuList;
use super::plan::Plan;

/// CPU time the calling thread has used so far: what its own work cost, however many other
/// threads share its CPUs. Zero if the clock cannot be read (it always can on Linux).
pub fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

/// Why a thread could not be pinned or its CPU set read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AffinityError {
    /// A CPU number past what `sched_setaffinity` can express.
    #[error(
        "CPU {cpu} is past the {limit} CPUs a thread can be pinned to here; choose CPUs below {limit}"
    )]
    CpuTooLarge {
        /// The CPU.
        cpu: usize,
        /// The number of CPUs a CPU set holds.
        limit: usize,
    },
    /// The kernel refused the CPU set.
    #[error(
        "cannot pin to CPUs {cpus}: {source}; a cgroup cpuset or container limit may exclude them, choose CPUs from `Cpus_allowed_list` in /proc/self/status"
    )]
    Refused {
        /// The CPUs asked for.
        cpus: CpuList,
        /// The system error.
        source: nix::Error,
    },
    /// The kernel applied a smaller set than asked for.
    #[error(
        "asked to pin to CPUs {requested} but the kernel allows only {granted} (a cgroup cpuset or container limit); choose CPUs from {granted}"
    )]
    Narrowed {
        /// The CPUs asked for.
        requested: CpuList,
        /// The CPUs the thread got.
        granted: CpuList,
    },
    /// The calling thread's CPU set cannot be read.
    #[error("cannot read the CPU set of this thread: {0}")]
    Query(nix::Error),
    /// A thread's status file cannot be read.
    #[error("cannot read {path}: {source}")]
    Status {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl Plan {
    /// Pins the calling thread to the auxiliary CPUs, when the plan pins anything and CPUs are
    /// left; threads it starts from now on (the plugin host's ticker, wasmtime's compiler
    /// threads) inherit them. Call it first, before the plugin host starts.
    pub fn pin_auxiliary(&self) -> Result<(), AffinityError> {
        match &self.auxiliary_cpus {
            Some(cpus) => pin_current_thread(cpus),
            None => Ok(()),
        }
    }

    /// Pins the calling thread, the one that will run the target, to the compute CPUs when the
    /// plan has them. Call it after the plugin host has started and before the target's first
    /// decode, so llama.cpp's OpenMP workers inherit the set.
    pub fn pin_compute(&self) -> Result<(), AffinityError> {
        match &self.compute_cpus {
            Some(cpus) => pin_current_thread(cpus),
            None => Ok(()),
        }
    }
}

/// Restricts the calling thread to `cpus`, then checks that the kernel applied exactly that set.
pub fn pin_current_thread(cpus: &CpuList) -> Result<(), AffinityError> {
    let mut set = CpuSet::new();
    for cpu in cpus.iter() {
        set.set(cpu).map_err(|_| AffinityError::CpuTooLarge {
            cpu,
            limit: CpuSet::count(),
        })?;
    }
    // Pid 0 is the calling thread, not the whole process.
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|source| AffinityError::Refused {
        cpus: cpus.clone(),
        source,
    })?;
    let granted = current_thread_cpus()?;
    if &granted != cpus {
        return Err(AffinityError::Narrowed {
            requested: cpus.clone(),
            granted,
        });
    }
    tracing::debug!(%cpus, "pinned thread");
    Ok(())
}

/// The CPUs the calling thread may run on.
pub fn current_thread_cpus() -> Result<CpuList, AffinityError> {
    let set = sched_getaffinity(Pid::from_raw(0)).map_err(AffinityError::Query)?;
    Ok(CpuList::from_cpus(
        (0..CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false)),
    ))
}

/// One thread of this process and the CPUs it may run on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThreadCpus {
    /// The kernel's thread id.
    pub tid: u32,
    /// The thread's name (`comm`): its Rust name, or the process name for threads started by C
    /// code such as llama.cpp's OpenMP workers.
    pub name: String,
    /// Its `Cpus_allowed_list`.
    pub cpus: CpuList,
}

/// Every thread of this process with its CPU set, by thread id, from `/proc/self/task`.
pub fn thread_cpus() -> Result<Vec<ThreadCpus>, AffinityError> {
    let task_dir = PathBuf::from("/proc/self/task");
    let unreadable = |path: PathBuf| move |source| AffinityError::Status { path, source };
    let mut threads = Vec::new();
    for entry in std::fs::read_dir(&task_dir).map_err(unreadable(task_dir.clone()))? {
        let entry = entry.map_err(unreadable(task_dir.clone()))?;
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let status_path = entry.path().join("status");
        // A thread that ended between listing and reading is simply gone.
        let Ok(status) = std::fs::read_to_string(&status_path) else {
            continue;
        };
        let cpus = super::sysfs::field(&status, "Cpus_allowed_list")
            .and_then(|list| list.parse().ok())
            .unwrap_or_default();
        let name = super::sysfs::field(&status, "Name")
            .unwrap_or_default()
            .to_owned();
        threads.push(ThreadCpus { tid, name, cpus });
    }
    threads.sort_by_key(|thread| thread.tid);
    Ok(threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_a_thread_and_its_children_inherit_the_set() {
        // A fresh thread, so the test harness's threads keep their CPUs.
        std::thread::spawn(|| {
            let all = current_thread_cpus().expect("readable");
            let first = CpuList::from_cpus(all.first());
            pin_current_thread(&first).expect("pin to one allowed CPU");
            assert_eq!(current_thread_cpus().expect("readable"), first);
            let child = std::thread::spawn(current_thread_cpus)
                .join()
                .expect("child runs")
                .expect("readable");
            assert_eq!(
                child, first,
                "a thread started after pinning inherits the set"
            );
            let me = nix::unistd::gettid().as_raw() as u32;
            let listed = thread_cpus().expect("task list");
            let mine = listed
                .iter()
                .find(|t| t.tid == me)
                .unwrap_or_else(|| panic!("thread {me} not in {listed:?}"));
            assert_eq!(mine.cpus, first, "/proc agrees with sched_getaffinity");
        })
        .join()
        .expect("test thread");
    }

    #[test]
    fn refuses_cpus_past_the_set_size() {
        let err = pin_current_thread(&CpuList::from_cpus([CpuSet::count()]))
            .expect_err("too large")
            .to_string();
        assert!(err.contains("choose CPUs below"), "got {err}");
    }
}

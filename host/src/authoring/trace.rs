//! The trace `plugin check` and `plugin bench` replay when the author names none: the default
//! model's greedy answers to the example workloads, recorded with
//!
//! ```text
//! spechost trace --model smollm2 --prompt-style auto --threads 2 \
//!     --workload examples/workloads/edit.jsonl --workload examples/workloads/summarize.jsonl \
//!     --workload examples/workloads/extract.jsonl --workload examples/workloads/code.jsonl \
//!     --out examples/traces/smollm2-chat.jsonl
//! ```
//!
//! and built into the binary, so both commands work from an installed `spechost` alone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context as _;
use sha2::{Digest as _, Sha256};

/// The bundled trace's text.
const BUNDLED_TRACE: &str = include_str!("../../../examples/traces/smollm2-chat.jsonl");

/// How the bundled trace is named in reports.
pub const BUNDLED_TRACE_NAME: &str = "smollm2-chat (bundled)";

/// The trace to replay: `given`, else the bundled one, written once into `cache_dir` (as
/// `traces/bundled-<sha256 prefix>.jsonl`) so it can be read like any other.
pub fn trace_file(given: Option<&Path>, cache_dir: &Path) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path.to_owned());
    }
    let digest = Sha256::digest(BUNDLED_TRACE.as_bytes());
    let prefix: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let dir = cache_dir.join("traces");
    let path = dir.join(format!("bundled-{prefix}.jsonl"));
    if !path.is_file() {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // One partial file per writer: several `plugin check` runs (or threads) may start at once,
        // and the last rename wins with the same bytes.
        static WRITERS: AtomicUsize = AtomicUsize::new(0);
        let writer = WRITERS.fetch_add(1, Ordering::Relaxed);
        let partial = path.with_extension(format!("partial-{}-{writer}", std::process::id()));
        std::fs::write(&partial, BUNDLED_TRACE)
            .and_then(|()| std::fs::rename(&partial, &path))
            .with_context(|| format!("writing the bundled trace to {}", path.display()))?;
    }
    Ok(path)
}

/// How to name `given` (or the bundled trace) in a report.
pub fn trace_name(given: Option<&Path>) -> String {
    given.map_or_else(
        || BUNDLED_TRACE_NAME.to_owned(),
        |path| path.display().to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::trace::Trace;

    #[test]
    fn the_bundled_trace_reads_and_covers_the_example_workloads() {
        let trace = Trace::parse(Path::new("bundled"), BUNDLED_TRACE).expect("the bundled trace");
        let workloads: Vec<&str> = trace.workloads().iter().map(|(name, _)| *name).collect();
        assert_eq!(workloads, ["edit", "summarize", "extract", "code"]);
        assert!(
            !trace.target.verify_costs_us.is_empty(),
            "cost curve recorded"
        );
    }

    #[test]
    fn the_bundled_trace_is_written_once_and_a_given_one_is_used_as_is() {
        let dir = std::env::temp_dir().join(format!("spechost-trace-{}", std::process::id()));
        let first = trace_file(None, &dir).expect("written");
        let second = trace_file(None, &dir).expect("found");
        assert_eq!(first, second);
        assert_eq!(
            std::fs::read_to_string(&first).expect("read"),
            BUNDLED_TRACE
        );
        let given = Path::new("/some/trace.jsonl");
        assert_eq!(trace_file(Some(given), &dir).expect("given"), given);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn writers_starting_at_once_all_get_the_bundled_trace() {
        let dir = std::env::temp_dir().join(format!("spechost-trace-race-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let paths: Vec<PathBuf> = std::thread::scope(|scope| {
            let writers: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| trace_file(None, &dir).expect("written")))
                .collect();
            writers
                .into_iter()
                .map(|w| w.join().expect("joined"))
                .collect()
        });
        for path in &paths {
            assert_eq!(std::fs::read_to_string(path).expect("read"), BUNDLED_TRACE);
        }
        let leftovers = std::fs::read_dir(dir.join("traces"))
            .expect("listed")
            .count();
        assert_eq!(leftovers, 1, "one trace, no partial files left");
        std::fs::remove_dir_all(&dir).ok();
    }
}

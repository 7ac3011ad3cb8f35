//! `spechost info`: this machine's CPUs, NUMA nodes, caches and memory paging, the thread and
//! pinning plan spechost would use with the flags given, advice, and the llama.cpp build.

use crate::config::InfoConfig;
use crate::engine::BuildInfo;
use crate::placement::{MemorySettings, PlacementReport};

/// Prints the report on stdout, as text or (`--json`) as one JSON object with the placement
/// report's fields and a `llama_cpp` object.
pub fn run(config: InfoConfig) -> anyhow::Result<()> {
    let report = PlacementReport::new(
        config.topology,
        MemorySettings::read_host(),
        config.plan,
        config.openmp_env,
    );
    let build = BuildInfo::detect();
    if config.json {
        let mut json = serde_json::to_value(&report)?;
        json["llama_cpp"] = serde_json::to_value(&build)?;
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{}\nllama.cpp\n{}", report.render(), build.render());
    }
    Ok(())
}

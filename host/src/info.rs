//! `spechost info`: this machine's CPUs, NUMA nodes, caches and memory paging, the thread and
//! pinning plan spechost would use with the flags given, advice, the llama.cpp build, and with
//! `--model`, what a model is (architecture, experts, metadata keys) and how speculation runs
//! on it.

use crate::config::InfoConfig;
use crate::engine::{BuildInfo, ModelDescription};
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
    let model = config
        .model
        .as_deref()
        .map(ModelDescription::read)
        .transpose()?;
    if config.json {
        let mut json = serde_json::to_value(&report)?;
        json["llama_cpp"] = serde_json::to_value(&build)?;
        if let Some(model) = &model {
            json["model"] = serde_json::to_value(model)?;
        }
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{}\nllama.cpp\n{}", report.render(), build.render());
        if let Some(model) = &model {
            print!("\n{}", model.render());
        }
    }
    Ok(())
}

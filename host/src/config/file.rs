//! The TOML configuration file of `spechost run --config`: a `[run]` table with the flags'
//! names and `[plugins.NAME]` tables of plugin settings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::ConfigError;
use crate::engine::DraftAcceptance;
use crate::placement::{CpuList, NumaMode};

/// The `[run]` and `[plugins.NAME]` tables of a TOML config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    #[serde(default)]
    pub(super) run: FileRun,
    #[serde(default)]
    pub(super) plugins: BTreeMap<String, toml::Table>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileRun {
    pub(super) model: Option<String>,
    pub(super) cascade: Option<String>,
    pub(super) policy: Option<String>,
    pub(super) cascade_mode: Option<String>,
    pub(super) state_dir: Option<PathBuf>,
    pub(super) max_tokens: Option<usize>,
    #[serde(rename = "draft_max")]
    pub(super) max_draft_len: Option<usize>,
    pub(super) threads: Option<usize>,
    pub(super) cpus: Option<CpuList>,
    pub(super) numa: Option<NumaMode>,
    pub(super) ctx_size: Option<u32>,
    pub(super) draft_model: Option<String>,
    pub(super) draft_threads: Option<usize>,
    pub(super) temp: Option<f32>,
    pub(super) top_k: Option<i32>,
    pub(super) top_p: Option<f32>,
    pub(super) min_p: Option<f32>,
    pub(super) draft_acceptance: Option<DraftAcceptance>,
    pub(super) seed: Option<u32>,
    #[serde(default)]
    pub(super) stop: Vec<String>,
}

pub(super) fn read_file_config(path: &Path) -> Result<FileConfig, ConfigError> {
    let problem = |problem: String| ConfigError::File {
        path: path.to_owned(),
        problem,
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| problem(format!("{e}; check the path")))?;
    toml::from_str(&text).map_err(|e| problem(format!("{e}")))
}

/// Turns one plugin's TOML table into its `key=value,key=value` configuration string.
pub(super) fn table_to_plugin_config(table: &toml::Table) -> String {
    table
        .iter()
        .map(|(key, value)| match value {
            toml::Value::String(s) => format!("{key}={s}"),
            other => format!("{key}={other}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn toml_tables_become_config_strings() {
        let file: FileConfig = toml::from_str(
            "[run]\ncascade = \"lookup\"\n[plugins.lookup]\nmax_ngram = 3\nmode = \"fast\"\n",
        )
        .expect("valid toml");
        assert_eq!(
            table_to_plugin_config(&file.plugins["lookup"]),
            "max_ngram=3,mode=fast"
        );
    }
    #[test]
    fn toml_run_table_takes_cpus_and_numa() {
        let file: FileConfig =
            toml::from_str("[run]\ncpus = \"0-3,8\"\nnuma = \"numactl\"\nthreads = 2\n")
                .expect("valid toml");
        assert_eq!(
            file.run.cpus.map(|c| c.to_string()).as_deref(),
            Some("0-3,8")
        );
        assert_eq!(file.run.numa, Some(NumaMode::Numactl));
        let err = toml::from_str::<FileConfig>("[run]\ncpus = \"3-1\"\n")
            .expect_err("backwards range")
            .to_string();
        assert!(err.contains("write `1-3`"), "got {err}");
    }
}

//! `spechost prompts`: writes every workload request's prompt exactly as the target reads it
//! (chat template applied), so other tools (llama.cpp's, in `bench/peers.sh`) run on the same
//! text as `bench`.
//!
//! Layout of the output directory: `<workload>/<n>.txt` holds the prompt of the workload's
//! `n`-th request (from 1, file order), byte for byte (no newline added); `index.jsonl` lists
//! every request in order: `{"workload", "id", "file", "max_tokens", "prompt_tokens"}`, with
//! `file` relative to the directory and `max_tokens` after the caps `bench` applies.

use anyhow::Context as _;
use serde::Serialize;

use super::prepare::prepare_greedy;
use super::workload::Workload;
use crate::config::PromptsConfig;
use crate::engine::Target;

/// The index file of the output directory.
pub const PROMPTS_INDEX: &str = "index.jsonl";

/// One line of [`PROMPTS_INDEX`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PromptEntry {
    /// The workload's name (its file stem).
    pub workload: String,
    /// The request's id.
    pub id: String,
    /// The prompt file, relative to the output directory.
    pub file: String,
    /// Most tokens the request may generate.
    pub max_tokens: usize,
    /// Tokens in the prompt, as the target tokenizes it.
    pub prompt_tokens: usize,
}

/// Templates every request of the configured workloads and writes the prompts and the index.
pub fn run(config: &PromptsConfig) -> anyhow::Result<()> {
    let inputs = &config.inputs;
    let workloads = Workload::read_all(&inputs.workloads)?;
    let target = Target::load(&inputs.model, &inputs.target)?;
    let prepared = prepare_greedy(inputs, &target, &workloads, inputs.session.ctx_size)?;
    let mut index = String::new();
    for (workload, requests) in workloads.iter().zip(prepared) {
        let dir = config.out.join(&workload.name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (n, request) in requests.into_iter().enumerate() {
            let file = format!("{}/{}.txt", workload.name, n + 1);
            let path = config.out.join(&file);
            std::fs::write(&path, &request.text)
                .with_context(|| format!("writing {}", path.display()))?;
            let entry = PromptEntry {
                workload: workload.name.clone(),
                id: request.id,
                file,
                max_tokens: request.request.max_tokens,
                prompt_tokens: request.request.prompt.len(),
            };
            index.push_str(&serde_json::to_string(&entry).context("serialising the index")?);
            index.push('\n');
        }
    }
    let path = config.out.join(PROMPTS_INDEX);
    std::fs::write(&path, index).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("prompts written to {}", config.out.display());
    Ok(())
}

//! `spechost check-outputs`: flags other tools' answers to workload requests by the rule `bench`
//! applies to its own ([`degenerate::check`]), so a comparison with them (`bench/peers.sh`)
//! can leave out the same kind of non-answers on both sides. llama.cpp's default numerics can
//! make its greedy answer to a request loop where spechost's does not, and prompt lookup
//! predicts a loop trivially.
//!
//! Input: one JSON object per line with the request's `workload` (its file stem), `id` and the
//! generated `text`; blank lines are skipped. Output (stdout): each object again, every field
//! kept, with `degenerate` set to `"echo"`, `"loop"` or `null`, or nothing but an error naming
//! the first bad line. The loop check runs on the text tokenized by the target, since other
//! tools print text, not token ids.

use std::collections::HashMap;
use std::io::Write as _;

use anyhow::Context as _;

use super::degenerate;
use super::prepare::prepare_greedy;
use super::workload::Workload;
use crate::config::{CheckOutputsConfig, WorkloadTargetConfig};
use crate::engine::Target;

/// Checks every output of the configured file and writes it back with its verdict.
pub fn run(config: &CheckOutputsConfig) -> anyhow::Result<()> {
    let inputs = &config.inputs;
    let workloads = Workload::read_all(&inputs.workloads)?;
    let target = Target::load(&inputs.model, &inputs.target)?;
    let openings = openings(inputs, &target, &workloads)?;
    let path = &config.outputs;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {}; check the path", path.display()))?;
    // Every line is checked before any is written: a bad line leaves no partial output.
    let mut checked = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), index + 1);
        let mut output: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(line).with_context(|| format!("{}: not a JSON object", at()))?;
        let field = |name: &str| {
            output.get(name).and_then(|v| v.as_str()).with_context(|| {
                format!(
                    "{}: needs a string `{name}` (fields: workload, id, text)",
                    at()
                )
            })
        };
        let key = (field("workload")?.to_owned(), field("id")?.to_owned());
        let opening = openings.get(&key).with_context(|| {
            format!(
                "{}: no request `{}` in a workload named `{}`; pass its file with --workload",
                at(),
                key.1,
                key.0
            )
        })?;
        let answer = field("text")?;
        let verdict = degenerate::check(opening, answer, &target.tokenize_text(answer));
        output.insert(
            "degenerate".into(),
            verdict.map_or(serde_json::Value::Null, |d| d.name().into()),
        );
        checked.push(output);
    }
    let mut stdout = std::io::stdout().lock();
    for output in &checked {
        serde_json::to_writer(&mut stdout, output).context("writing stdout")?;
        writeln!(stdout).context("writing stdout")?;
    }
    Ok(())
}

/// The opening `bench` checks echoes against, of every request, by (workload, id).
fn openings(
    inputs: &WorkloadTargetConfig,
    target: &Target,
    workloads: &[Workload],
) -> anyhow::Result<HashMap<(String, String), String>> {
    let prepared = prepare_greedy(inputs, target, workloads, inputs.session.ctx_size)?;
    Ok(workloads
        .iter()
        .zip(prepared)
        .flat_map(|(workload, requests)| {
            requests
                .into_iter()
                .map(|request| ((workload.name.clone(), request.id), request.opening))
        })
        .collect())
}

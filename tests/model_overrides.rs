//! Metadata overrides on a generated mixture-of-experts model (issue 30): `--experts` and
//! `--override-kv` change what the model computes exactly as the same value written in the
//! file does, bad overrides are refused naming the fix, and `spechost info --model` describes
//! the model. The model (8 experts, 2 used, random weights, SmolLM2's tokenizer) is written at
//! test time by scripts/make-test-model.py with the `gguf` package (scripts/test.sh installs it
//! and sets SPECHOST_GGUF_PYTHON); nothing is committed.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use spechost::cascade::Cascade;
use spechost::engine::{KvOverride, ModelOverrides, SamplingParams, Target, TargetParams};

/// The test MoE model with `experts_used` experts per token.
fn moe_model(experts_used: u32) -> PathBuf {
    generated_model(
        "moe",
        &["--experts-used", &experts_used.to_string()],
        &format!("moe-{experts_used}.gguf"),
    )
}

fn load_with(path: &Path, overrides: ModelOverrides) -> Target {
    Target::load(
        path,
        &TargetParams {
            overrides,
            ..TargetParams::default()
        },
    )
    .expect("the test model loads")
}

fn greedy(target: &Target) -> Vec<u32> {
    let mut session = target
        .session(&spechost::engine::SessionParams {
            ctx_size: 512,
            ..session_params()
        })
        .expect("session");
    generate_in(
        target,
        &mut session,
        "Tell me about the sea.",
        32,
        SamplingParams::greedy(),
        8,
        &mut Cascade::empty(),
    )
    .tokens
}

#[test]
fn experts_and_overrides_change_the_model_as_its_file_would() {
    let _guard = exclusive();
    let (two, one) = (moe_model(2), moe_model(1));
    let as_written = greedy(&load_with(&two, ModelOverrides::default()));
    let written_with_one = greedy(&load_with(&one, ModelOverrides::default()));
    assert_ne!(
        as_written, written_with_one,
        "one expert per token should change a random model's output"
    );
    let one_expert = greedy(&load_with(
        &two,
        ModelOverrides {
            experts: Some(1),
            ..ModelOverrides::default()
        },
    ));
    assert_eq!(
        one_expert, written_with_one,
        "--experts 1 is the file's own 1"
    );
    let overridden = greedy(&load_with(
        &two,
        ModelOverrides {
            kv: vec![
                "llama.expert_used_count=int:1"
                    .parse::<KvOverride>()
                    .expect("valid"),
            ],
            experts: None,
        },
    ));
    assert_eq!(overridden, written_with_one, "--override-kv is llama.cpp's");
}

#[test]
fn bad_overrides_are_refused_naming_the_fix() {
    let two = moe_model(2);
    for (args, needles) in [
        (vec!["--experts", "9"], vec!["has 8 experts", "give 1 to 8"]),
        (vec!["--experts", "0"], vec!["give 1 to 8"]),
        (
            vec!["--override-kv", "llama.no_such_key=int:1"],
            vec!["has no such key", "spechost info --model"],
        ),
        (
            vec!["--override-kv", "llama.expert_used_count=float:1"],
            vec!["stores it as int", "give it as int"],
        ),
        (
            vec!["--override-kv", "llama.expert_used_count"],
            vec!["KEY=TYPE:VALUE"],
        ),
        (
            vec![
                "--experts",
                "1",
                "--override-kv",
                "llama.expert_used_count=int:2",
            ],
            vec!["both set llama.expert_used_count"],
        ),
    ] {
        let mut full = vec!["run", "--model", arg(&two), "--ctx-size", "512", "-n", "1"];
        full.extend(args.iter().copied());
        full.extend(["--prompt", "hi"]);
        assert_fails_with(&spechost(&full), &needles);
    }
    // A dense model has no experts to choose from.
    assert_fails_with(
        &spechost(&[
            "run",
            "--model",
            "smollm2",
            "--experts",
            "2",
            "-n",
            "1",
            "--prompt",
            "hi",
        ]),
        &["not a mixture of experts", "drop --experts"],
    );
    assert_fails_with(
        &spechost(&["run", "--draft-experts", "2", "-n", "1", "--prompt", "hi"]),
        &["no draft model", "add --draft-model"],
    );
}

#[test]
fn info_describes_the_model_its_experts_and_its_speculation() {
    let two = moe_model(2);
    let out = spechost(&["info", "--model", arg(&two)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "architecture  llama",
        "experts       8, 2 per token",
        "rolled back with seq_rm",
        "llama.expert_used_count = 2",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    let out = spechost(&["info", "--model", "smollm2", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["model"]["architecture"]["arch"], "llama");
    assert_eq!(
        json["model"]["architecture"]["experts"],
        serde_json::Value::Null
    );
    assert_eq!(json["model"]["recurrent"], false);
}

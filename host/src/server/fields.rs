//! Request fields spechost does not read: the harmless ones pass, every other one is refused
//! with a 400 naming it, so that a client asking for something the server would not do
//! (constrained output, a penalty, a time limit) learns it instead of getting output made
//! without it.
//!
//! Harmless means the output is what it would be without the field: bookkeeping fields
//! (`user`, `metadata`, `cache_prompt`: spechost keeps every slot's prompt cache, and a kept
//! prefix never changes a token), and llama-server's sampler settings at their neutral value
//! (`repeat_penalty: 1`, `mirostat: 0`, `grammar: ""`, ...), which its web UI and clients send
//! with every request.

use serde_json::{Map, Value};

use super::error::ApiError;

/// When a field spechost does not read is harmless.
#[derive(Debug, Clone, Copy)]
enum Harmless {
    /// Whatever its value.
    Always,
    /// When it is null or this number.
    At(f64),
    /// When it is null, false, 0, or empty (string, list or object).
    Unset,
}

/// Fields spechost does not read and when they are harmless, by name.
const HARMLESS: &[(&str, Harmless)] = &[
    // OpenAI bookkeeping.
    ("user", Harmless::Always),
    ("metadata", Harmless::Always),
    ("store", Harmless::Always),
    ("service_tier", Harmless::Always),
    ("parallel_tool_calls", Harmless::Always),
    ("prediction", Harmless::Unset),
    ("modalities", Harmless::Unset),
    ("audio", Harmless::Unset),
    // llama-server bookkeeping and caching: no effect on the tokens.
    ("cache_prompt", Harmless::Always),
    ("id_slot", Harmless::Always),
    ("n_keep", Harmless::Always),
    ("timings_per_token", Harmless::Always),
    ("return_progress", Harmless::Always),
    ("t_max_prompt_ms", Harmless::Always),
    // llama-server sampler settings at their neutral values.
    ("typical_p", Harmless::At(1.0)),
    ("repeat_penalty", Harmless::At(1.0)),
    ("repeat_last_n", Harmless::Always),
    ("penalty_last_n", Harmless::Always),
    ("mirostat", Harmless::Unset),
    ("mirostat_tau", Harmless::Always),
    ("mirostat_eta", Harmless::Always),
    ("dynatemp_range", Harmless::Unset),
    ("dynatemp_exponent", Harmless::Always),
    ("xtc_probability", Harmless::Unset),
    ("xtc_threshold", Harmless::Always),
    ("dry_multiplier", Harmless::Unset),
    ("dry_base", Harmless::Always),
    ("dry_allowed_length", Harmless::Always),
    ("dry_penalty_last_n", Harmless::Always),
    ("dry_sequence_breakers", Harmless::Always),
    ("top_n_sigma", Harmless::At(-1.0)),
    // The order of the samplers: spechost's is fixed (top-k, top-p, min-p, temperature), and
    // greedy decoding does not depend on it.
    ("samplers", Harmless::Always),
    ("ignore_eos", Harmless::Unset),
    ("n_probs", Harmless::Unset),
    ("n_indent", Harmless::Unset),
    ("t_max_predict_ms", Harmless::Unset),
    ("grammar_lazy", Harmless::Unset),
    ("grammar_triggers", Harmless::Unset),
    ("preserved_tokens", Harmless::Unset),
    ("lora", Harmless::Unset),
    ("post_sampling_probs", Harmless::Unset),
    ("return_tokens", Harmless::Unset),
    ("add_generation_prompt", Harmless::At(1.0)),
    ("chat_template_kwargs", Harmless::Unset),
];

/// Refuses the first of `fields` (those of a request body spechost does not read) that is not
/// harmless, naming it.
pub fn refuse_unknown(fields: &Map<String, Value>) -> Result<(), ApiError> {
    for (name, value) in fields {
        let harmless = HARMLESS
            .iter()
            .find(|(known, _)| known == name)
            .is_some_and(|&(_, when)| is_harmless(when, value));
        if !harmless {
            let known = HARMLESS.iter().any(|(known, _)| known == name);
            let message = if known {
                format!(
                    "`{name}` = {value} is not supported: spechost would generate without it; leave it out or send its neutral value (docs/compatibility.md)"
                )
            } else {
                format!(
                    "unknown field `{name}`: spechost does not support it and would generate without it; leave it out (docs/compatibility.md lists the fields)"
                )
            };
            return Err(ApiError::invalid_field(name, message));
        }
    }
    Ok(())
}

fn is_harmless(when: Harmless, value: &Value) -> bool {
    match when {
        Harmless::Always => true,
        Harmless::At(neutral) => {
            value.is_null()
                || value.as_f64() == Some(neutral)
                || value.as_bool().map(f64::from) == Some(neutral)
        }
        Harmless::Unset => match value {
            Value::Null => true,
            Value::Bool(set) => !set,
            Value::Number(number) => number.as_f64() == Some(0.0),
            Value::String(text) => text.is_empty(),
            Value::Array(items) => items.is_empty(),
            Value::Object(entries) => entries.is_empty(),
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(body: Value) -> Result<(), String> {
        let Value::Object(fields) = body else {
            panic!("an object");
        };
        refuse_unknown(&fields).map_err(|error| error.message().to_owned())
    }

    #[test]
    fn bookkeeping_and_neutral_sampler_settings_pass() {
        let web_ui = json!({
            "cache_prompt": true, "user": "me", "repeat_penalty": 1.0, "repeat_last_n": 64,
            "typical_p": 1, "mirostat": 0, "dynatemp_range": 0.0, "xtc_probability": 0,
            "dry_multiplier": 0, "top_n_sigma": -1,
            "ignore_eos": false, "n_probs": 0, "timings_per_token": true, "samplers": "edkypmxt",
        });
        assert_eq!(check(web_ui), Ok(()));
    }

    #[test]
    fn settings_that_change_the_output_are_refused_by_name() {
        for (body, name) in [
            (json!({"grammar_lazy": true}), "grammar_lazy"),
            (json!({"repeat_penalty": 1.1}), "repeat_penalty"),
            (json!({"mirostat": 2}), "mirostat"),
            (json!({"ignore_eos": true}), "ignore_eos"),
            (
                json!({"chat_template_kwargs": {"x": 1}}),
                "chat_template_kwargs",
            ),
            (json!({"t_max_predict_ms": 500}), "t_max_predict_ms"),
        ] {
            let error = check(body).expect_err(name);
            assert!(error.contains(&format!("`{name}`")), "{error}");
            assert!(error.contains("neutral value"), "{error}");
        }
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let error = check(json!({"frobnicate": 3})).expect_err("unknown");
        assert!(error.contains("unknown field `frobnicate`"), "{error}");
    }
}

//! Workload requests made ready to decode: the prompt text the target sees (chat template
//! applied), its tokens, and the request's `max_tokens` after the caps. `bench`, `trace` and
//! `prompts` all prepare requests here, so the three see exactly the same prompts.

use anyhow::Context as _;

use super::workload::{Prompt, Workload, WorkloadRequest};
use crate::config::{PromptStyle, WorkloadTargetConfig};
use crate::engine::{Request, SamplingParams, StopStrings, Target};

/// How many tokens a request may generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenLimits {
    /// `max_tokens` of requests that do not give one.
    pub default_max_tokens: usize,
    /// Cap on every request's `max_tokens`, if any.
    pub max_tokens_cap: Option<usize>,
}

impl TokenLimits {
    /// The request's `max_tokens` (or the default), cut to the cap.
    pub fn max_tokens(&self, requested: Option<usize>) -> usize {
        let max_tokens = requested.unwrap_or(self.default_max_tokens);
        self.max_tokens_cap
            .map_or(max_tokens, |cap| max_tokens.min(cap))
    }
}

/// A workload request ready to decode.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The request's id.
    pub id: String,
    /// The prompt as the target reads it: the chat template applied to the messages, or the
    /// raw prompt as given.
    pub text: String,
    /// What the prompt opens with, for the echo check: the first user message, or the raw
    /// prompt.
    pub opening: String,
    /// Prompt tokens, `max_tokens`, sampling (at the request's seed), the request's stop strings;
    /// `max_draft_len` is 0, to be set per configuration.
    pub request: Request,
}

/// The style `style` stands for with `target`: `Auto` is `Chat` for a model with its own chat
/// template (instruction-tuned) and `Raw` for one without (a base model).
pub fn resolve_prompt_style(style: PromptStyle, target: &Target) -> PromptStyle {
    match style {
        PromptStyle::Auto if target.has_chat_template() => PromptStyle::Chat,
        PromptStyle::Auto => PromptStyle::Raw,
        chosen => chosen,
    }
}

/// `Raw` for `Chat` and back.
fn other_style(style: PromptStyle) -> PromptStyle {
    match style {
        PromptStyle::Raw => PromptStyle::Chat,
        PromptStyle::Chat | PromptStyle::Auto => PromptStyle::Raw,
    }
}

/// The form of `request` a model is prompted with: `preferred` (the style `style` resolved to
/// for the model); with `Auto`, a request that has only the other form gets that one, while
/// `Chat` and `Raw` require their form. The error names what to add.
pub fn choose_prompt(
    request: &WorkloadRequest,
    style: PromptStyle,
    preferred: PromptStyle,
) -> Result<Prompt<'_>, String> {
    match (request.prompt(preferred), style) {
        (Err(_), PromptStyle::Auto) => request.prompt(other_style(preferred)),
        (prompt, _) => prompt,
    }
}

/// Every request of `workloads` prepared greedily for `target` within a context of `ctx_size`
/// tokens, with the limits and prompt style of `inputs`: what `trace` decodes, `prompts` writes
/// and `check-outputs` checks answers to. One list per workload, in order.
pub fn prepare_greedy(
    inputs: &WorkloadTargetConfig,
    target: &Target,
    workloads: &[Workload],
    ctx_size: u32,
) -> anyhow::Result<Vec<Vec<Prepared>>> {
    let limits = TokenLimits {
        default_max_tokens: inputs.default_max_tokens,
        max_tokens_cap: inputs.max_tokens_cap,
    };
    workloads
        .iter()
        .map(|workload| {
            prepare(
                target,
                workload,
                inputs.prompt_style,
                &limits,
                &SamplingParams::greedy(),
                ctx_size,
            )
        })
        .collect()
}

/// Prompts every request of `workload` as `style` says ([`choose_prompt`]), tokenizes it and
/// checks that it fits in a context of `ctx_size` tokens; each request samples with
/// `sampling` at its own seed ([`SamplingParams::for_request`], by its index in the workload).
pub fn prepare(
    target: &Target,
    workload: &Workload,
    style: PromptStyle,
    limits: &TokenLimits,
    sampling: &SamplingParams,
    ctx_size: u32,
) -> anyhow::Result<Vec<Prepared>> {
    let preferred = resolve_prompt_style(style, target);
    let model = if target.has_chat_template() {
        "the model has a chat template"
    } else {
        "the model has no chat template (a base model)"
    };
    workload
        .requests
        .iter()
        .enumerate()
        .map(|(index, request)| {
            let where_ = || {
                format!(
                    "{}:{} (request `{}`)",
                    workload.path.display(),
                    request.line,
                    request.id
                )
            };
            let prompt = choose_prompt(request, style, preferred)
                .map_err(|problem| anyhow::anyhow!("{}: {problem} ({model})", where_()))?;
            let (opening, text, stop) = match prompt {
                Prompt::Chat(messages) => {
                    let pairs: Vec<(&str, &str)> = messages
                        .iter()
                        .map(|m| (m.role.as_str(), m.content.as_str()))
                        .collect();
                    let opening = messages
                        .iter()
                        .find(|m| m.role == "user")
                        .map_or_else(String::new, |m| m.content.clone());
                    let text = target
                        .template_messages(&pairs)
                        .with_context(|| format!("templating {}", where_()))?;
                    (opening, text, Vec::new())
                }
                Prompt::Raw(completion) => (
                    completion.text.clone(),
                    completion.text.clone(),
                    completion.stop.clone(),
                ),
            };
            let prompt = target.tokenize_raw(&text);
            let max_tokens = limits.max_tokens(request.max_tokens);
            let needed = prompt.len() + max_tokens;
            if needed > ctx_size as usize {
                anyhow::bail!(
                    "{}: prompt ({} tokens) + max_tokens ({max_tokens}) = {needed} do not fit in the context of {ctx_size} tokens; raise --ctx-size or lower --max-tokens",
                    where_(),
                    prompt.len()
                );
            }
            let stop = StopStrings::new(stop)
                .map_err(|problem| anyhow::anyhow!("{}: {problem}", where_()))?;
            Ok(Prepared {
                id: request.id.clone(),
                text,
                opening,
                request: Request {
                    prompt,
                    max_tokens,
                    sampling: SamplingParams {
                        grammar: request.grammar.clone(),
                        ..sampling.for_request(index)
                    },
                    stop,
                    max_draft_len: 0,
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tokens_takes_the_request_or_default_then_the_cap() {
        let uncapped = TokenLimits {
            default_max_tokens: 256,
            max_tokens_cap: None,
        };
        assert_eq!(uncapped.max_tokens(Some(64)), 64);
        assert_eq!(uncapped.max_tokens(None), 256);
        let capped = TokenLimits {
            max_tokens_cap: Some(100),
            ..uncapped
        };
        assert_eq!(capped.max_tokens(Some(64)), 64);
        assert_eq!(capped.max_tokens(Some(512)), 100);
        assert_eq!(capped.max_tokens(None), 100);
    }
}

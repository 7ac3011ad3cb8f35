//! What the clients send: each workload request as an HTTP body, the configurations (rows) it
//! is sent with, and which requests each client of a level takes.
//!
//! A level of `C` clients sends `C × requests_per_client` requests: request `i` of the level is
//! workload request `i mod n` (the workloads' requests in order, cycled), and client `c` sends
//! requests `c, c + C, c + 2C, ...`, one after the other (a closed loop).

use serde_json::{Value, json};

use super::super::prepare::{TokenLimits, choose_prompt};
use super::super::runner::Configuration;
use super::super::workload::{Prompt, Workload};
use crate::config::PromptStyle;
use crate::engine::SamplingParams;

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `messages`, templated by the server.
    Chat,
    /// A raw `prompt`, continued.
    Completion,
}

impl Endpoint {
    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Completion => "/v1/completions",
        }
    }
}

/// One workload request, ready to send (sampled as the bench's, streamed, usage in the last chunk), without
/// speculation settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRequest {
    /// The workload's name.
    pub workload: String,
    /// The request's id.
    pub id: String,
    /// Where it goes.
    pub endpoint: Endpoint,
    /// The JSON body.
    pub body: Value,
}

impl PlannedRequest {
    /// The body with `speculative` added when `configuration` has one.
    pub fn body_for(&self, configuration: &Row) -> Value {
        let mut body = self.body.clone();
        if let (Some(speculative), Some(fields)) =
            (&configuration.speculative, body.as_object_mut())
        {
            fields.insert("speculative".to_owned(), speculative.clone());
        }
        body
    }
}

/// Every request of `workloads`, in order, in the form `style` (resolved to `preferred` for
/// the model) chooses, as `bench` prompts it ([`choose_prompt`]), with `max_tokens` after
/// `limits` and `sampling` (with a temperature, each request's seed is `sampling`'s plus its
/// index in its workload, as in `bench`'s own decoding).
pub fn plan_requests(
    workloads: &[Workload],
    style: PromptStyle,
    preferred: PromptStyle,
    limits: &TokenLimits,
    sampling: &SamplingParams,
) -> anyhow::Result<Vec<PlannedRequest>> {
    let mut planned = Vec::new();
    for workload in workloads {
        for (index, request) in workload.requests.iter().enumerate() {
            let prompt = choose_prompt(request, style, preferred).map_err(|problem| {
                anyhow::anyhow!(
                    "{}:{} (request `{}`): {problem}",
                    workload.path.display(),
                    request.line,
                    request.id
                )
            })?;
            let mut body = json!({
                "max_tokens": limits.max_tokens(request.max_tokens),
                "temperature": 0,
                "stream": true,
                "stream_options": {"include_usage": true},
            });
            if !sampling.is_greedy() {
                let seeded = sampling.for_request(index);
                body["temperature"] = json!(seeded.temperature);
                body["top_k"] = json!(seeded.top_k);
                body["top_p"] = json!(seeded.top_p);
                body["min_p"] = json!(seeded.min_p);
                body["seed"] = json!(seeded.seed);
            }
            let (endpoint, fields) = match prompt {
                Prompt::Chat(messages) => (
                    Endpoint::Chat,
                    json!({"messages": messages
                        .iter()
                        .map(|message| json!({"role": message.role, "content": message.content}))
                        .collect::<Vec<_>>()}),
                ),
                Prompt::Raw(completion) => {
                    let mut fields = json!({"prompt": completion.text});
                    if !completion.stop.is_empty() {
                        fields["stop"] = json!(completion.stop);
                    }
                    (Endpoint::Completion, fields)
                }
            };
            let object = body.as_object_mut().expect("built as an object");
            if let Value::Object(fields) = fields {
                object.extend(fields);
            }
            planned.push(PlannedRequest {
                workload: workload.name.clone(),
                id: request.id.clone(),
                endpoint,
                body,
            });
        }
    }
    Ok(planned)
}

/// A row of the report: a configuration the server decodes with.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `plain`, `lookup cost K≤24`, or the `--label` of a server at `--url`.
    pub label: String,
    /// The `speculative` block every request carries; `None` for a server at `--url`.
    pub speculative: Option<Value>,
    /// Whether this is plain decoding (the reference of every output).
    pub plain: bool,
}

impl Row {
    /// The row of a bench configuration: its cascade, draft length, mode, grammar-source
    /// setting and policy sent with
    /// every request (plain decoding sends `cascade: none`).
    pub fn of(configuration: &Configuration) -> Self {
        let speculative = match configuration.max_draft_len {
            Some(max_draft_len) if !configuration.is_plain() => json!({
                "cascade": configuration.cascade_name(),
                "draft_max": max_draft_len,
                "mode": configuration.mode.as_str(),
                "grammar_drafts": configuration.grammar_drafts,
                "policy": configuration.policy_name(),
            }),
            _ => json!({"cascade": "none"}),
        };
        Self {
            label: configuration.label(),
            speculative: Some(speculative),
            plain: configuration.is_plain(),
        }
    }

    /// The one row of a server at `--url`: it decodes as it was started, so its own output at
    /// the fewest clients is the reference.
    pub fn running(label: &str) -> Self {
        Self {
            label: label.to_owned(),
            speculative: None,
            plain: true,
        }
    }
}

/// The level's request indices (into the cycled workload requests) that client `client` of
/// `clients` sends, in order.
pub fn client_share(
    client: usize,
    clients: usize,
    requests_per_client: usize,
) -> impl Iterator<Item = usize> {
    (0..requests_per_client).map(move |turn| client + turn * clients)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORKLOAD: &str = concat!(
        r#"{"id": "both", "messages": [{"role": "user", "content": "hi"}], "prompt": "Q: hi\nA:", "stop": ["\n"], "max_tokens": 64}"#,
        "\n",
        r#"{"id": "chat-only", "messages": [{"role": "user", "content": "yo"}]}"#,
        "\n",
    );

    fn workload() -> Workload {
        Workload::parse("w/mixed.jsonl".as_ref(), WORKLOAD).expect("valid workload")
    }

    #[test]
    fn sampled_requests_carry_the_sampling_and_their_own_seeds() {
        let limits = TokenLimits {
            default_max_tokens: 16,
            max_tokens_cap: None,
        };
        let sampling = SamplingParams {
            temperature: 0.7,
            top_k: 40,
            seed: 10,
            ..SamplingParams::greedy()
        };
        let plan = |sampling: &SamplingParams| {
            plan_requests(
                &[workload()],
                PromptStyle::Auto,
                PromptStyle::Chat,
                &limits,
                sampling,
            )
            .expect("planned")
        };
        for (index, request) in plan(&sampling).iter().enumerate() {
            let body = &request.body;
            assert_eq!(body["seed"], 10 + index, "{body}");
            assert_eq!((&body["top_k"], &body["top_p"]), (&json!(40), &json!(1.0)));
            assert!((body["temperature"].as_f64().unwrap_or(0.0) - 0.7).abs() < 1e-6);
        }
        let greedy = plan(&SamplingParams::greedy());
        assert_eq!(greedy[0].body["temperature"], 0);
        assert!(greedy[0].body.get("seed").is_none(), "{:?}", greedy[0].body);
    }

    #[test]
    fn requests_take_the_preferred_form_and_auto_falls_back_to_the_other() {
        let limits = TokenLimits {
            default_max_tokens: 256,
            max_tokens_cap: Some(32),
        };
        let planned = plan_requests(
            &[workload()],
            PromptStyle::Auto,
            PromptStyle::Raw,
            &limits,
            &SamplingParams::greedy(),
        )
        .expect("auto falls back to chat");
        assert_eq!(planned[0].endpoint, Endpoint::Completion, "{planned:?}");
        assert_eq!(planned[0].body["prompt"], "Q: hi\nA:", "{planned:?}");
        assert_eq!(planned[0].body["stop"], json!(["\n"]), "{planned:?}");
        assert_eq!(planned[0].body["max_tokens"], 32, "capped: {planned:?}");
        assert_eq!(planned[1].endpoint, Endpoint::Chat, "{planned:?}");
        assert_eq!(planned[1].body["messages"][0]["content"], "yo");
        assert_eq!(planned[1].body["stream"], true);
        assert_eq!(planned[1].body["temperature"], 0);
        let chat = plan_requests(
            &[workload()],
            PromptStyle::Chat,
            PromptStyle::Chat,
            &limits,
            &SamplingParams::greedy(),
        )
        .expect("both lines have messages");
        assert_eq!(chat[0].endpoint, Endpoint::Chat, "{chat:?}");
        assert!(
            chat[0].body.get("stop").is_none(),
            "the raw form's stop strings would cut a chat answer short: {chat:?}"
        );
        let error = plan_requests(
            &[workload()],
            PromptStyle::Raw,
            PromptStyle::Raw,
            &limits,
            &SamplingParams::greedy(),
        )
        .expect_err("raw is required")
        .to_string();
        assert!(
            error.contains("w/mixed.jsonl:2 (request `chat-only`)") && error.contains("raw"),
            "seen {error}"
        );
    }

    #[test]
    fn clients_take_interleaved_shares_of_the_level() {
        let shares: Vec<Vec<usize>> = (0..3).map(|c| client_share(c, 3, 2).collect()).collect();
        assert_eq!(shares, [[0, 3], [1, 4], [2, 5]]);
        assert_eq!(client_share(0, 1, 3).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn plain_rows_send_cascade_none_and_a_running_server_gets_no_speculative_block() {
        let plain = Row::of(&Configuration::plain());
        assert_eq!(plain.speculative, Some(json!({"cascade": "none"})));
        assert!(plain.plain && plain.label == "plain", "{plain:?}");
        let request = &plan_requests(
            &[workload()],
            PromptStyle::Chat,
            PromptStyle::Chat,
            &TokenLimits {
                default_max_tokens: 16,
                max_tokens_cap: None,
            },
            &SamplingParams::greedy(),
        )
        .expect("chat forms")[0];
        assert_eq!(request.body_for(&plain)["speculative"]["cascade"], "none");
        let running = request.body_for(&Row::running("llama-server"));
        assert!(running.get("speculative").is_none(), "{running}");
    }
}

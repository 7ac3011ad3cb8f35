//! Workload files: JSONL, one request per line, read into typed requests.
//!
//! A line is a chat request, as in `shared/workloads/*.jsonl`:
//!
//! ```text
//! {"id": "edit-1", "category": "edit", "messages": [{"role": "user", "content": "..."}], "max_tokens": 256}
//! ```
//!
//! or a raw prompt, continued without the chat template: `{"prompt": "...", "id": "p1",
//! "max_tokens": 64, "stop": ["\n\n"]}`, or both: the same task asked of an instruction-tuned
//! model (`messages`) and of a base model (`prompt`, usually with `stop` strings, since a base
//! model does not end its turn). `stop` belongs to the raw form: a chat answer ends at the
//! model's end of turn, and a raw form's stop strings (a newline after a one-line extraction)
//! would cut it short. `bench` picks the form for the model ([`PromptStyle`]).
//! A line may constrain its output with `json_schema` (a JSON schema, as in a llama-server
//! request): every configuration, plain decoding included, then generates under its grammar.
//! Only `messages` or `prompt` is required; a request without an id is called `line-N`. Blank
//! lines are skipped. A bad line is an error naming the file, the line and what is wrong.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::PromptStyle;
use crate::engine::Grammar;

/// Why a workload file cannot be used. Every message names the file (and line) to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// The file cannot be read.
    #[error("cannot read workload {path}: {source}; check the path")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line is not a valid request.
    #[error(
        "{path}:{line}: {problem}; each line must be a JSON object with `messages` \
         ([{{\"role\", \"content\"}}, ...]) or `prompt`, and optionally `id`, `category`, `max_tokens`, `json_schema`"
    )]
    Line {
        /// The file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// Two requests share an id.
    #[error(
        "{path}:{line}: id `{id}` was already used on line {first_line}; give each request its own id"
    )]
    DuplicateId {
        /// The file.
        path: PathBuf,
        /// The line of the second use.
        line: usize,
        /// The id.
        id: String,
        /// The line of the first use.
        first_line: usize,
    },
    /// No requests at all.
    #[error("workload {path} has no requests; add one JSON object per line")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// The requests of one workload file, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// The file stem (`edit` for `workloads/edit.jsonl`).
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// The requests, in file order.
    pub requests: Vec<WorkloadRequest>,
}

/// One request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadRequest {
    /// The request's id, or `line-N`.
    pub id: String,
    /// Its category, if the line gives one.
    pub category: Option<String>,
    /// The task as a conversation, for instruction-tuned models; never empty.
    pub messages: Option<Vec<ChatMessage>>,
    /// The task as text to continue, for base models.
    pub completion: Option<Completion>,
    /// Most tokens to generate, if the line gives a limit.
    pub max_tokens: Option<usize>,
    /// The grammar of the line's `json_schema`: the output must follow it.
    pub grammar: Option<Grammar>,
    /// Line number in the file, from 1.
    pub line: usize,
}

/// The raw form of a request: text for a base model to continue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The text to continue; never empty.
    pub text: String,
    /// Generation ends before any of these strings.
    pub stop: Vec<String>,
}

/// The form of a request a model is given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Prompt<'a> {
    /// A conversation, templated with the model's chat template.
    Chat(&'a [ChatMessage]),
    /// Text sent as-is, with its stop strings.
    Raw(&'a Completion),
}

impl WorkloadRequest {
    /// The form for a model prompted as `style` says (`Auto` resolved already): the request's
    /// form of that style, or an error naming what to add.
    pub fn prompt(&self, style: PromptStyle) -> Result<Prompt<'_>, String> {
        match style {
            PromptStyle::Chat | PromptStyle::Auto => self
                .messages
                .as_deref()
                .map(Prompt::Chat)
                .ok_or_else(|| "it has no `messages` to send through the chat template; add them, or pass --prompt-style raw".to_owned()),
            PromptStyle::Raw => self.completion.as_ref().map(Prompt::Raw).ok_or_else(|| {
                "it has no raw `prompt` for a base model to continue; add one (the task as text to continue), or pass --prompt-style chat to template its messages anyway".to_owned()
            }),
        }
    }
}

/// One message of a chat request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// A line as written, before the checks that serde cannot express.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    id: Option<String>,
    category: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    prompt: Option<String>,
    #[serde(default)]
    stop: Vec<String>,
    max_tokens: Option<usize>,
    json_schema: Option<serde_json::Value>,
}

impl Workload {
    /// Reads and parses every workload file of `paths`, in order; the first bad one is the error.
    pub fn read_all(paths: &[PathBuf]) -> Result<Vec<Self>, WorkloadError> {
        paths.iter().map(|path| Self::read(path)).collect()
    }

    /// Reads and parses the workload file at `path`.
    pub fn read(path: &Path) -> Result<Self, WorkloadError> {
        let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses the text of a workload file; `path` names the workload and its errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, WorkloadError> {
        let mut requests: Vec<WorkloadRequest> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line_number = index + 1;
            if line.trim().is_empty() {
                continue;
            }
            let request = parse_line(line, line_number).map_err(|problem| WorkloadError::Line {
                path: path.to_owned(),
                line: line_number,
                problem,
            })?;
            if let Some(first) = requests.iter().find(|r| r.id == request.id) {
                return Err(WorkloadError::DuplicateId {
                    path: path.to_owned(),
                    line: line_number,
                    id: request.id,
                    first_line: first.line,
                });
            }
            requests.push(request);
        }
        if requests.is_empty() {
            return Err(WorkloadError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Self {
            name: workload_name(path),
            path: path.to_owned(),
            requests,
        })
    }
}

/// A workload is named by its file stem, as `BenchConfig` requires them to be distinct.
fn workload_name(path: &Path) -> String {
    path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

fn parse_line(text: &str, line_number: usize) -> Result<WorkloadRequest, String> {
    let line: Line = serde_json::from_str(text).map_err(|e| format!("{e}"))?;
    if line.messages.is_none() && line.prompt.is_none() {
        return Err("it has neither `messages` nor `prompt`".into());
    }
    if let Some(messages) = &line.messages {
        if messages.is_empty() {
            return Err("`messages` is empty".into());
        }
        if let Some(position) = messages.iter().position(|m| m.role.trim().is_empty()) {
            return Err(format!("message {} has an empty `role`", position + 1));
        }
    }
    if line.prompt.as_deref() == Some("") {
        return Err("`prompt` is empty".into());
    }
    if line.stop.iter().any(String::is_empty) {
        return Err("a `stop` string is empty".into());
    }
    if line.prompt.is_none() && !line.stop.is_empty() {
        return Err("`stop` applies to the raw `prompt` form and this line has none (a chat answer ends at the model's end of turn); add a `prompt` or remove `stop`".into());
    }
    if line.max_tokens == Some(0) {
        return Err("`max_tokens` is 0; use at least 1".into());
    }
    let grammar = line
        .json_schema
        .as_ref()
        .map(Grammar::json_schema)
        .transpose()
        .map_err(|error| format!("`json_schema`: {error}"))?;
    Ok(WorkloadRequest {
        id: line.id.unwrap_or_else(|| format!("line-{line_number}")),
        category: line.category,
        messages: line.messages,
        completion: line.prompt.map(|text| Completion {
            text,
            stop: line.stop,
        }),
        max_tokens: line.max_tokens,
        grammar,
        line: line_number,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Workload, WorkloadError> {
        Workload::parse(Path::new("dir/edit.jsonl"), text)
    }

    #[test]
    fn parses_chat_and_prompt_lines_in_order() {
        let workload = parse(concat!(
            r#"{"id": "e1", "category": "edit", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 32}"#,
            "\n\n",
            r#"{"prompt": "Once upon a time"}"#,
            "\n",
        ))
        .expect("valid workload");
        assert_eq!(workload.name, "edit");
        assert_eq!(workload.requests.len(), 2, "seen {workload:?}");
        let chat = &workload.requests[0];
        assert_eq!(
            (
                chat.id.as_str(),
                chat.category.as_deref(),
                chat.max_tokens,
                chat.line
            ),
            ("e1", Some("edit"), Some(32), 1)
        );
        let Ok(Prompt::Chat(messages)) = chat.prompt(PromptStyle::Chat) else {
            panic!("expected a chat prompt, seen {chat:?}");
        };
        assert_eq!(messages[1].content, "hi");
        let error = chat.prompt(PromptStyle::Raw).expect_err("no raw prompt");
        assert!(error.contains("--prompt-style chat"), "{error}");
        let raw = &workload.requests[1];
        let Ok(Prompt::Raw(completion)) = raw.prompt(PromptStyle::Raw) else {
            panic!("expected a raw prompt, seen {raw:?}");
        };
        assert_eq!(completion.text, "Once upon a time");
        assert!(completion.stop.is_empty());
        assert!(raw.prompt(PromptStyle::Chat).is_err());
        assert_eq!(
            (raw.id.as_str(), raw.max_tokens, raw.line),
            ("line-3", None, 3)
        );
    }

    #[test]
    fn a_line_may_give_both_forms_and_stop_strings() {
        let workload = parse(
            r#"{"messages": [{"role": "user", "content": "Summarize: A."}], "prompt": "A.\n\nTL;DR:", "stop": ["\n\n"]}"#,
        )
        .expect("both forms");
        let request = &workload.requests[0];
        assert!(matches!(
            request.prompt(PromptStyle::Chat),
            Ok(Prompt::Chat(_))
        ));
        assert_eq!(
            request.prompt(PromptStyle::Raw),
            Ok(Prompt::Raw(&Completion {
                text: "A.\n\nTL;DR:".into(),
                stop: vec!["\n\n".into()],
            }))
        );
    }

    #[test]
    fn parses_the_shared_workload_format() {
        let line = r#"{"id": "edit-textwrap-wrap", "category": "edit", "messages": [{"role": "user", "content": "Rewrite..."}], "max_tokens": 256}"#;
        let workload = parse(line).expect("shared format");
        assert_eq!(workload.requests[0].max_tokens, Some(256));
    }

    #[test]
    fn bad_lines_name_file_line_and_problem() {
        let good = r#"{"prompt": "x"}"#;
        for (bad, needle) in [
            ("{not json", "key must be a string"),
            (r#"{"id": "a"}"#, "neither `messages` nor `prompt`"),
            (
                r#"{"prompt": "x", "stop": [""]}"#,
                "a `stop` string is empty",
            ),
            (r#"{"messages": []}"#, "`messages` is empty"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "stop": ["\n"]}"#,
                "`stop` applies to the raw `prompt` form",
            ),
            (
                r#"{"messages": [{"role": "", "content": "x"}]}"#,
                "empty `role`",
            ),
            (
                r#"{"messages": [{"role": "user"}]}"#,
                "missing field `content`",
            ),
            (r#"{"prompt": "x", "max_tokens": 0}"#, "`max_tokens` is 0"),
            (
                r#"{"prompt": "x", "max_token": 5}"#,
                "unknown field `max_token`",
            ),
            (r#"{"prompt": "x", "max_tokens": -1}"#, "invalid value"),
            (r#"{"prompt": 3}"#, "invalid type"),
        ] {
            let text = format!("{good}\n{bad}\n");
            let err = parse(&text).expect_err(bad).to_string();
            assert!(
                err.starts_with("dir/edit.jsonl:2: ") && err.contains(needle),
                "for {bad} wanted `dir/edit.jsonl:2:` and `{needle}`, got: {err}"
            );
        }
    }

    #[test]
    fn duplicate_ids_and_empty_files_are_errors() {
        let err = parse("{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"a\", \"prompt\": \"y\"}")
            .expect_err("duplicate")
            .to_string();
        assert!(
            err.contains(":2: id `a` was already used on line 1"),
            "got: {err}"
        );
        let err = parse("\n  \n").expect_err("empty").to_string();
        assert!(err.contains("has no requests"), "got: {err}");
    }

    #[test]
    fn unreadable_file_names_the_path() {
        let err = Workload::read(Path::new("/nonexistent/w.jsonl"))
            .expect_err("missing")
            .to_string();
        assert!(err.contains("/nonexistent/w.jsonl"), "got: {err}");
    }
}

//! `spechost suffix warm`: fills a drafter's cross-request state from a corpus, offline.
//!
//! The suffix drafter's global tree holds earlier *responses*. Warming replays each corpus text
//! through the plugin exactly as a request whose response it was: a session opens with a
//! one-token prompt (BOS, or the text's first token when the model has none), the text's tokens
//! are fed as if the target had generated them, and the session ends,
//! at which point the plugin files the text in its cache. Then the plugin is asked to
//! checkpoint, and its state blob is written atomically to `--out`. Nothing here knows the
//! blob's format: any drafter that keeps cross-request state can be warmed this way.
//!
//! Corpus: JSONL, one text per line, as a JSON string, an object with `text`, `response`,
//! `output`, `completion` or `content`, or a workload request (`messages`: the assistant
//! messages' contents, or all contents when there is no assistant message).

use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;

use crate::cascade::DraftSource;
use crate::config::WarmConfig;
use crate::engine::{SessionParams, Target, TargetParams};
use crate::plugins::{PluginHost, PluginHostConfig};

/// Tokens fed per call while warming, like a long round's worth: keeps each guest call well
/// inside its deadline whatever the text's length.
const FEED_CHUNK: usize = 256;

/// Fields of a corpus object that hold a text, in the order they are tried.
const TEXT_FIELDS: &[&str] = &["text", "response", "output", "completion", "content"];

/// What warming did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmReport {
    /// Texts fed.
    pub texts: usize,
    /// Tokens fed.
    pub tokens: usize,
    /// Size of the state file written.
    pub bytes: usize,
}

/// Feeds every corpus text to the plugin and writes its state to `config.out`.
pub fn warm(config: &WarmConfig, cache_dir: &Path) -> anyhow::Result<WarmReport> {
    let texts = read_corpus(&config.corpus)?;
    let host = PluginHost::new(PluginHostConfig {
        cache_dir: Some(cache_dir.to_owned()),
        plugin_dirs: config.plugin_dirs.clone(),
        ..PluginHostConfig::default()
    })
    .context("starting the plugin host")?;
    let plugin = host.load_with_state_file(&config.plugin, &config.out)?;
    let target = Target::load(&config.model, &TargetParams::default())?;
    let facts = target.facts(SessionParams::default().ctx_size);
    plugin.check_config(&config.plugin_config, &facts)?;
    let mut source = plugin.source(config.plugin_config.clone());
    let mut tokens_fed = 0;
    for text in &texts {
        let tokens = target.tokenize_text(text);
        // A drafter takes its first feed as the prompt; the response is what follows.
        let (prompt, response) = match facts.bos {
            Some(bos) => (vec![bos], tokens.as_slice()),
            None if tokens.len() > 1 => (tokens[..1].to_vec(), &tokens[1..]),
            None => continue,
        };
        source
            .begin(&facts, &prompt)
            .map_err(|fault| anyhow::anyhow!("{fault}"))?;
        for chunk in response.chunks(FEED_CHUNK) {
            source
                .feed(chunk)
                .map_err(|fault| anyhow::anyhow!("{fault}"))?;
        }
        source.end();
        tokens_fed += response.len();
    }
    source
        .checkpoint()
        .map_err(|fault| anyhow::anyhow!("{fault}"))?;
    let written = plugin
        .state()
        .persist()
        .with_context(|| format!("writing {}", config.out.display()))?;
    anyhow::ensure!(
        written || config.out.is_file(),
        "plugin `{}` saved no state; only drafters that keep a cross-request cache (suffix) can be warmed",
        plugin.name()
    );
    let bytes = std::fs::metadata(&config.out).map_or(0, |meta| meta.len() as usize);
    Ok(WarmReport {
        texts: texts.len(),
        tokens: tokens_fed,
        bytes,
    })
}

/// Reads the texts of a corpus file (see the module docs for the accepted lines).
pub fn read_corpus(path: &Path) -> anyhow::Result<Vec<String>> {
    let content = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read corpus {}; check the path", path.display()))?;
    let mut texts = Vec::new();
    for (index, line) in content.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not valid JSON", path.display(), index + 1))?;
        let text = corpus_text(&value).with_context(|| {
            format!(
                "{}:{}: no text found; write a JSON string, or an object with one of {} or `messages`",
                path.display(),
                index + 1,
                TEXT_FIELDS.join(", ")
            )
        })?;
        if !text.is_empty() {
            texts.push(text);
        }
    }
    anyhow::ensure!(
        !texts.is_empty(),
        "corpus {} holds no text; give one JSON text per line",
        path.display()
    );
    Ok(texts)
}

/// The text of one corpus line, if it has one.
fn corpus_text(value: &Value) -> Option<String> {
    if let Some(text) = value.as_str() {
        return Some(text.to_owned());
    }
    let object = value.as_object()?;
    if let Some(text) = TEXT_FIELDS
        .iter()
        .find_map(|field| object.get(*field)?.as_str())
    {
        return Some(text.to_owned());
    }
    let messages = object.get("messages")?.as_array()?;
    let content = |role: Option<&str>| -> Vec<&str> {
        messages
            .iter()
            .filter(|m| role.is_none_or(|role| m.get("role").and_then(Value::as_str) == Some(role)))
            .filter_map(|m| m.get("content")?.as_str())
            .collect()
    };
    let assistant = content(Some("assistant"));
    let parts = if assistant.is_empty() {
        content(None)
    } else {
        assistant
    };
    (!parts.is_empty()).then(|| parts.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_lines_take_strings_fields_and_messages() {
        let cases = [
            (r#""plain text""#, Some("plain text")),
            (r#"{"response": "r", "id": 1}"#, Some("r")),
            (r#"{"text": "t", "response": "r"}"#, Some("t")),
            (
                r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}"#,
                Some("a"),
            ),
            (
                r#"{"messages": [{"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}]}"#,
                Some("q1\nq2"),
            ),
            (r#"{"id": 3}"#, None),
            ("42", None),
        ];
        for (line, expected) in cases {
            let value: Value = serde_json::from_str(line).expect("valid JSON");
            assert_eq!(corpus_text(&value).as_deref(), expected, "line {line}");
        }
    }

    #[test]
    fn bad_corpus_lines_name_file_line_and_fix() {
        let dir = std::env::temp_dir().join(format!("spechost-warm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("corpus.jsonl");
        std::fs::write(&path, "\"ok\"\n{\"id\": 1}\n").expect("write");
        let message = format!("{:#}", read_corpus(&path).expect_err("line 2 has no text"));
        assert!(
            message.contains("corpus.jsonl:2") && message.contains("`messages`"),
            "message: {message}"
        );
        std::fs::write(&path, "\n\n").expect("write");
        let message = format!("{:#}", read_corpus(&path).expect_err("empty"));
        assert!(message.contains("holds no text"), "message: {message}");
    }
}

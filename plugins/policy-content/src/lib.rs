//! `policy-content`: picks K by the kind of text being generated: code, JSON or prose.
//!
//! The research spechost grew from measured the same model at 28.8 tokens/s on code with K=24
//! (83% accepted) and at 6.2 tokens/s on prose with the same K (15% accepted), where prose did
//! better at K=8: the best K follows the content. This policy asks the host for the text of
//! every round's committed tokens ([`Policy::wants_text`]), keeps the last 256 characters, and
//! classifies them with cheap counts each round:
//!
//! * **JSON**: at least two `"key":` pairs (a closing quote, optional spaces, a colon), and more
//!   of them than code-like lines.
//! * **Code**: at least two lines, half of them code-like (indented, starting with a keyword
//!   such as `def `, `fn `, `let `, `return`, `#include`, or ending in `;`, `{`, `}`, `:` or
//!   `)`); or a density of programming symbols (`{}[]()<>;=_|&$*/\`) of at least 8% of the
//!   characters (minified code, expressions).
//! * **Prose**: anything else, including text too short to judge (under 32 characters).
//!
//! K is then the class's setting (`code`, `json`, `prose`), capped at the host's `--draft-max`.
//!
//! Content can be right and speculation still not pay (a source with nothing useful to say), so
//! the SDK's [`Backoff`] watches the acceptance of the last `evidence` drafted tokens: below
//! `off`, every round is plain decoding with shadow drafts of `shadow_len` tokens from cheap
//! sources, and when their acceptance over `evidence` tokens reaches `resume` (or, with no
//! shadow results at all, after `probe_after` rounds, twice as long after each failed probe),
//! speculation resumes at the current class's K.
//!
//! # Config
//!
//! | key           | default | meaning                                                     |
//! |---------------|---------|-------------------------------------------------------------|
//! | `code`        | 24      | K while the text looks like code                            |
//! | `json`        | 16      | K while it looks like JSON                                  |
//! | `prose`       | 8       | K while it looks like prose, or before there is enough text |
//! | `off`         | 0.3     | switch speculation off below this acceptance; 0 never does  |
//! | `resume`      | 0.6     | switch back on at this shadow acceptance or more            |
//! | `evidence`    | 64      | tokens measured before switching off or on                  |
//! | `shadow_len`  | 8       | shadow tokens asked for each round while off                |
//! | `probe_after` | 64      | rounds off without shadow results before a probe            |
//!
//! with `off <= resume`. A class K of 0 turns speculation off for that class.

use std::collections::VecDeque;

use spechost_sdk::adaptive::{Backoff, BackoffSettings};
use spechost_sdk::config::Config;
use spechost_sdk::{Decision, ModelFacts, Policy, PolicySetup, RoundRecord, export_policy};

/// Committed characters kept for classification.
const TEXT_WINDOW_CHARS: usize = 256;
/// Fewer characters than this are not classified (the class stays prose).
const MIN_CLASSIFY_CHARS: usize = 32;
/// Share of programming symbols above which text is code whatever its lines look like.
const CODE_SYMBOL_DENSITY: f32 = 0.08;
/// Characters counted as programming symbols.
const CODE_SYMBOLS: &str = "{}[]()<>;=_|&$*/\\";
/// Starts of a line (after indentation) that mark it as code.
const CODE_LINE_STARTS: [&str; 24] = [
    "def ",
    "fn ",
    "pub ",
    "let ",
    "const ",
    "class ",
    "import ",
    "from ",
    "return",
    "if (",
    "for (",
    "while ",
    "#include",
    "function ",
    "var ",
    "async ",
    "struct ",
    "impl ",
    "use ",
    "elif ",
    "else",
    "}",
    "//",
    "#!",
];
/// Line endings that mark a line as code.
const CODE_LINE_ENDS: [char; 5] = [';', '{', '}', ':', ')'];
/// Default K for code: the research measured 83% acceptance at K=24 on code.
const DEFAULT_CODE_K: u32 = 24;
/// Default K for JSON.
const DEFAULT_JSON_K: u32 = 16;
/// Default K for prose: K=8 beat K=24 on prose in the research.
const DEFAULT_PROSE_K: u32 = 8;
/// Back-off defaults: off below 30% acceptance, back on at 60%, over 64 tokens.
const DEFAULT_BACKOFF: BackoffSettings = BackoffSettings {
    off: 0.3,
    resume: 0.6,
    evidence: 64,
    shadow_len: 8,
    probe_after: 64,
};

/// What kind of text is being generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Source code.
    Code,
    /// JSON (or JSON-like objects).
    Json,
    /// Natural language, or too little text to tell.
    Prose,
}

/// Classifies `text` (the last committed characters) as code, JSON or prose.
pub fn classify(text: &str) -> Class {
    let n_chars = text.chars().count();
    if n_chars < MIN_CLASSIFY_CHARS {
        return Class::Prose;
    }
    let json_pairs = count_json_pairs(text);
    let (lines, code_lines) = count_code_lines(text);
    if json_pairs >= 2 && json_pairs > code_lines {
        return Class::Json;
    }
    let symbols = text.chars().filter(|c| CODE_SYMBOLS.contains(*c)).count();
    // Character counts stay far below 2^24, where f32 loses integer precision.
    let density = symbols as f32 / n_chars as f32;
    if (lines >= 2 && code_lines * 2 >= lines) || density >= CODE_SYMBOL_DENSITY {
        Class::Code
    } else {
        Class::Prose
    }
}

/// `"key":` pairs: a `"` followed by optional spaces and a `:`.
fn count_json_pairs(text: &str) -> usize {
    text.match_indices('"')
        .filter(|&(at, _)| {
            text[at + 1..]
                .trim_start_matches([' ', '\t'])
                .starts_with(':')
        })
        .count()
}

/// Non-blank lines, and those of them that look like code.
fn count_code_lines(text: &str) -> (usize, usize) {
    let mut lines = 0;
    let mut code_lines = 0;
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        lines += 1;
        let indented = line.starts_with("    ") || line.starts_with('\t');
        let body = line.trim();
        let starts_like_code = CODE_LINE_STARTS.iter().any(|start| body.starts_with(start));
        let ends_like_code = body.ends_with(CODE_LINE_ENDS);
        if indented || starts_like_code || ends_like_code {
            code_lines += 1;
        }
    }
    (lines, code_lines)
}

/// The content-aware policy for one request.
#[derive(Debug)]
pub struct Content {
    /// The last committed characters, oldest first.
    text: VecDeque<char>,
    class: Class,
    code_k: u32,
    json_k: u32,
    prose_k: u32,
    backoff: Backoff,
}

impl Policy for Content {
    fn new(config: &str, _facts: &ModelFacts, setup: &PolicySetup) -> Result<Self, String> {
        let config = Config::parse(config)?;
        let code_k = config.get_u32("code", DEFAULT_CODE_K)?;
        let json_k = config.get_u32("json", DEFAULT_JSON_K)?;
        let prose_k = config.get_u32("prose", DEFAULT_PROSE_K)?;
        let backoff = BackoffSettings::from_config(&config, DEFAULT_BACKOFF)?;
        config.finish()?;
        let cap = setup.max_draft_len;
        Ok(Content {
            text: VecDeque::with_capacity(TEXT_WINDOW_CHARS),
            class: Class::Prose,
            code_k: code_k.min(cap),
            json_k: json_k.min(cap),
            prose_k: prose_k.min(cap),
            backoff: Backoff::new(backoff),
        })
    }

    fn wants_text(&self) -> bool {
        true
    }

    fn observe(&mut self, round: &RoundRecord) {
        // The back-off restarts at the class's K, which `decide` reads: its transition needs no
        // handling here.
        self.backoff.observe(round);
        if round.committed_text.is_empty() {
            return;
        }
        for c in round.committed_text.chars() {
            if self.text.len() == TEXT_WINDOW_CHARS {
                self.text.pop_front();
            }
            self.text.push_back(c);
        }
        let text: String = self.text.iter().collect();
        self.class = classify(&text);
    }

    fn decide(&mut self) -> Decision {
        if self.backoff.is_off() {
            return self.backoff.decision_while_off();
        }
        Decision::draft(match self.class {
            Class::Code => self.code_k,
            Class::Json => self.json_k,
            Class::Prose => self.prose_k,
        })
    }
}

impl Content {
    /// The class of the recent text.
    pub fn class(&self) -> Class {
        self.class
    }
}

export_policy!(Content);

#[cfg(test)]
mod tests {
    use spechost_sdk::testing::{
        PolicyHarness, drafted_round, facts, plain_round, policy_setup, shadow_round,
    };

    use super::*;

    /// The host's `--draft-max` in most tests.
    const CAP: u32 = 32;

    const PYTHON: &str = "def mean(values):\n    total = 0\n    for value in values:\n        \
                          total += value\n    return total / len(values)\n";
    const RUST: &str = "fn main() {\n    let numbers = vec![1, 2, 3];\n    let sum: i32 = \
                        numbers.iter().sum();\n    println!(\"{sum}\");\n}\n";
    const C: &str = "#include <stdio.h>\nint main(void) {\n    printf(\"hello\\n\");\n    \
                     return 0;\n}\n";
    const JSON: &str = "{\"name\": \"spechost\", \"version\": \"0.2.0\", \"tags\": [\"llm\", \
                        \"cpu\"], \"stars\": 42}";
    const JSON_LINES: &str = "{\n  \"id\": 1,\n  \"title\": \"Fix the parser\",\n  \"done\": \
                              false\n}\n";
    const PROSE: &str = "The committee met on Tuesday to discuss the budget. After a long \
                         debate, they agreed to postpone the vote until next month, when more \
                         figures would be available.";
    const MARKDOWN: &str = "Here is a summary of the changes:\n\n- The parser now handles \
                            nested lists.\n- Errors name the line they occur on.\n";
    const MINIFIED: &str = "var a=function(b){return b*2};var c=[1,2,3].map(a);if(c[0]>1){x=c}";

    #[test]
    fn classifies_code() {
        for text in [PYTHON, RUST, C, MINIFIED] {
            assert_eq!(classify(text), Class::Code, "{text}");
        }
    }

    #[test]
    fn classifies_json() {
        for text in [JSON, JSON_LINES] {
            assert_eq!(classify(text), Class::Json, "{text}");
        }
    }

    #[test]
    fn classifies_prose_and_short_text() {
        for text in [PROSE, MARKDOWN, "", "fn main() {}"] {
            assert_eq!(classify(text), Class::Prose, "{text:?}");
        }
    }

    fn content(config: &str, cap: u32) -> PolicyHarness<Content> {
        PolicyHarness::new(config, facts(100), policy_setup(cap)).expect("valid config")
    }

    /// A round that drafted `k` tokens, all accepted, committing `text`.
    fn committing(k: u32, text: &str) -> RoundRecord {
        RoundRecord {
            committed_text: text.to_owned(),
            ..drafted_round(k, k)
        }
    }

    #[test]
    fn wants_text_and_starts_as_prose() {
        let mut harness = content("", CAP);
        assert!(harness.wants_text());
        assert_eq!(harness.decide(), Decision::draft(8));
    }

    #[test]
    fn k_follows_the_committed_text() {
        let mut harness = content("", CAP);
        harness.observe(&committing(8, PYTHON));
        assert_eq!(harness.policy().class(), Class::Code);
        assert_eq!(harness.decide(), Decision::draft(24));
        // 256 characters of JSON push the code out of the window.
        for _ in 0..4 {
            harness.observe(&committing(24, JSON));
        }
        assert_eq!(harness.policy().class(), Class::Json);
        assert_eq!(harness.decide(), Decision::draft(16));
        for _ in 0..2 {
            harness.observe(&committing(16, PROSE));
        }
        assert_eq!(harness.policy().class(), Class::Prose);
        assert_eq!(harness.decide(), Decision::draft(8));
    }

    #[test]
    fn text_arrives_in_small_pieces() {
        let mut harness = content("", CAP);
        for piece in RUST.as_bytes().chunks(3) {
            let piece = std::str::from_utf8(piece).expect("ASCII sample");
            harness.observe(&committing(2, piece));
        }
        assert_eq!(harness.decide(), Decision::draft(24));
    }

    #[test]
    fn rounds_without_text_keep_the_class() {
        let mut harness = content("", CAP);
        harness.observe(&committing(8, JSON));
        harness.observe(&plain_round());
        assert_eq!(harness.decide(), Decision::draft(16));
    }

    #[test]
    fn class_ks_come_from_config_and_are_capped() {
        let mut harness = content("code=12,json=6,prose=2", CAP);
        harness.observe(&committing(2, C));
        assert_eq!(harness.decide(), Decision::draft(12));
        let mut harness = content("", 10);
        harness.observe(&committing(8, C));
        assert_eq!(harness.decide(), Decision::draft(10));
    }

    #[test]
    fn sustained_low_acceptance_switches_off_and_shadows_resume_at_the_class_k() {
        let mut harness = content("", CAP);
        harness.observe(&committing(8, PYTHON));
        // 24-token drafts with 2 accepted: 64 tokens after 3 rounds, 6/72 accepted.
        for _ in 0..3 {
            assert_eq!(harness.decide(), Decision::draft(24));
            harness.observe(&RoundRecord {
                committed_text: "x = 1\n".to_owned(),
                ..drafted_round(24, 2)
            });
        }
        assert_eq!(harness.decide(), Decision::skip(8));
        for _ in 0..8 {
            harness.observe(&shadow_round(8, 7));
        }
        assert_eq!(
            harness.decide(),
            Decision::draft(24),
            "7/8 shadow acceptance"
        );
    }

    #[test]
    fn never_reorders() {
        let mut harness = content("", CAP);
        assert_eq!(harness.decide().order, None);
    }

    #[test]
    fn rejects_bad_settings_naming_the_key() {
        for (config, expected) in [
            ("code=-4", "`code`"),
            ("json=x", "`json`"),
            ("resume=0.1", "`resume` (0.1) is below `off` (0.3)"),
            ("sql=8", "unknown setting `sql`"),
        ] {
            let error =
                PolicyHarness::<Content>::new(config, facts(100), policy_setup(CAP)).unwrap_err();
            assert!(error.contains(expected), "{config}: {error}");
        }
    }
}

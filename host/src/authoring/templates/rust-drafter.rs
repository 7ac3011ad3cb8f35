//! {{name}}: a spechost drafter.
//!
//! It proposes what followed the last time the context's final `ngram` tokens appeared earlier
//! in the context (prompt lookup): edits, summaries and extractions repeat their prompt, so the
//! target often accepts several tokens per round. Replace `propose` with your own idea; the
//! tests below drive it the way the host does, natively.

use spechost_sdk::config::Config;
use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Tokens matched at the end of the context before looking back for them.
const DEFAULT_NGRAM: usize = 3;

/// One request's drafter: the host opens one per generation request.
pub struct Lookup {
    ngram: usize,
    facts: ModelFacts,
    context: Vec<Token>,
}

impl Drafter for Lookup {
    fn new(config: &str, facts: &ModelFacts) -> Result<Self, String> {
        let config = Config::parse(config)?;
        let ngram = config.get_usize("ngram", DEFAULT_NGRAM)?;
        config.finish()?;
        if ngram == 0 {
            return Err("ngram is 0; it counts the tokens to match, use 1 or more".to_owned());
        }
        Ok(Self {
            ngram,
            facts: facts.clone(),
            context: Vec::new(),
        })
    }

    fn feed(&mut self, tokens: &[Token]) {
        self.context.extend_from_slice(tokens);
    }

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        let context = &self.context;
        let Some(start) = context.len().checked_sub(self.ngram) else {
            return Proposal::empty();
        };
        let tail = &context[start..];
        let Some(found) = (0..start).rev().find(|&i| &context[i..i + self.ngram] == tail) else {
            return Proposal::empty();
        };
        let mut tokens = Vec::new();
        for &token in context[found + self.ngram..].iter().take(max_draft_len) {
            tokens.push(token);
            if self.facts.is_eog(token) {
                break;
            }
        }
        Proposal::tokens(tokens)
    }
}

export_drafter!(Lookup);

#[cfg(test)]
mod tests {
    use super::*;
    use spechost_sdk::testing::{Harness, facts};

    #[test]
    fn drafts_the_repeated_part_of_the_prompt() {
        let mut harness = Harness::<Lookup>::new("", facts(100)).expect("default config");
        // The prompt ends with `1 2 3`, seen at its start followed by `4 5 6 7 8`.
        let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3];
        let output = [4, 5, 6, 7, 8, 9];
        let stats = harness.replay(&prompt, &output, 4);
        assert!(stats.accepted >= 4, "accepted {} tokens", stats.accepted);
    }

    #[test]
    fn a_misspelt_setting_is_an_error_naming_it() {
        let error = Harness::<Lookup>::new("ngarm=2", facts(100)).err();
        assert!(error.is_some_and(|e| e.contains("ngarm")));
    }
}

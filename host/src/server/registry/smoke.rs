//! The smoke test every new plugin version and config passes before the registry publishes it.

use super::error::UpdateError;
use crate::cascade::{DraftSource, Feedback, ModelFacts, SourceFault, Token};
use crate::plugins::LoadedPlugin;

/// Rounds of propose → feedback → feed in a smoke test. The `panic` test plugin fails on its
/// third `propose`, so at least three.
const SMOKE_ROUNDS: usize = 4;
/// Draft length asked for in a smoke test.
const SMOKE_DRAFT_LEN: usize = 8;
/// Length of the smoke test's context.
const SMOKE_CONTEXT_LEN: usize = 64;
/// Distinct tokens in the smoke test's repeating context: a pattern that repeats gives drafters
/// that copy from their context something to propose.
const SMOKE_PATTERN_LEN: u32 = 7;

/// Runs `plugin` with `config` through a short request in a throw-away instance; any fault
/// (a rejected config, a trap, a time-out, an invalid proposal) fails the test.
pub fn smoke_test(
    plugin: &LoadedPlugin,
    config: &str,
    facts: &ModelFacts,
) -> Result<(), UpdateError> {
    let name = plugin.name().to_owned();
    plugin
        .check_config(config, facts)
        .map_err(|source| UpdateError::Load {
            plugin: name.clone(),
            source,
        })?;
    let failed = |fault: SourceFault| UpdateError::SmokeTest {
        plugin: name.clone(),
        fault: fault.what,
    };
    let mut source = plugin.source(config);
    let context = smoke_context(facts.vocab_size);
    source.begin(facts, &context).map_err(failed)?;
    for round in 0..SMOKE_ROUNDS {
        let proposal = source.propose(SMOKE_DRAFT_LEN).map_err(failed)?;
        let target_token = context[(context.len() + round) % context.len()];
        let n_accepted = usize::from(proposal.tokens.first() == Some(&target_token));
        source
            .feedback(Feedback {
                won: !proposal.tokens.is_empty(),
                n_accepted: n_accepted as u32,
                target_token,
            })
            .map_err(failed)?;
        source.feed(&[target_token]).map_err(failed)?;
    }
    source.end();
    match source.last_fault() {
        Some(fault) => Err(failed(fault.clone())),
        None => Ok(()),
    }
}

/// A context that repeats a short pattern of valid token ids.
fn smoke_context(vocab_size: u32) -> Vec<Token> {
    let distinct = SMOKE_PATTERN_LEN.min(vocab_size).max(1);
    (0..SMOKE_CONTEXT_LEN as u32)
        .map(|i| i % distinct)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoke_context_repeats_valid_tokens() {
        let context = smoke_context(5);
        assert_eq!(context.len(), SMOKE_CONTEXT_LEN);
        assert!(context.iter().all(|&t| t < 5), "context: {context:?}");
        assert_eq!(&context[..6], &[0, 1, 2, 3, 4, 0]);
        assert!(smoke_context(1).iter().all(|&t| t == 0));
    }
}

//! The host side of `wit/drafter.wit`: the only `bindgen!` call in spechost.
//!
//! Generated code stays in the private `generated` module. This file re-exports, to the rest of
//! `plugins` only, the few generated items the host needs, and converts the WIT records to and
//! from the [`cascade`](crate::cascade) types with `From`. Nothing generated is visible outside
//! `plugins`, so a change to the WIT breaks compilation here and nowhere else.
//!
//! Only the `drafter` world is bound; the `policy` world gets its own bindings when policies
//! are hosted.

use crate::cascade;

mod generated {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "drafter",
    });
}

pub(super) use self::generated::spechost::drafter::host::{Host as LogHost, Level};
pub(super) use self::generated::spechost::drafter::types::{
    Feedback, Host as TypesHost, ModelFacts, Proposal,
};
pub(super) use self::generated::{Drafter, DrafterPre};

/// The WIT package version this host speaks; plugins must be built against the same minor.
pub(super) const WIT_VERSION: &str = "0.1.0";
/// The interface a drafter component must export, exactly as it appears in its type.
pub(super) const DRAFTER_API_EXPORT: &str = "spechost:drafter/drafter-api@0.1.0";

impl From<&cascade::ModelFacts> for ModelFacts {
    fn from(facts: &cascade::ModelFacts) -> Self {
        ModelFacts {
            vocab_size: facts.vocab_size,
            bos: facts.bos,
            eos: facts.eos,
            eog: facts.eog.clone(),
            context_size: facts.context_size,
        }
    }
}

impl From<Proposal> for cascade::Proposal {
    fn from(proposal: Proposal) -> Self {
        cascade::Proposal {
            tokens: proposal.tokens,
            confidence: proposal.confidence,
        }
    }
}

impl From<cascade::Feedback> for Feedback {
    fn from(feedback: cascade::Feedback) -> Self {
        Feedback {
            won: feedback.won,
            n_accepted: feedback.n_accepted,
            target_token: feedback.target_token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_name_matches_package_and_version() {
        let expected = format!("spechost:drafter/drafter-api@{WIT_VERSION}");
        assert_eq!(
            DRAFTER_API_EXPORT, expected,
            "export name drifted from package/version"
        );
    }

    #[test]
    fn model_facts_convert_field_by_field() {
        let facts = cascade::ModelFacts {
            vocab_size: 49_152,
            bos: Some(1),
            eos: Some(2),
            eog: vec![2, 3],
            context_size: 4096,
        };
        let wit = ModelFacts::from(&facts);
        assert_eq!(
            (
                wit.vocab_size,
                wit.bos,
                wit.eos,
                wit.eog.clone(),
                wit.context_size
            ),
            (49_152, Some(1), Some(2), vec![2, 3], 4096),
            "converted facts: {wit:?}"
        );
    }
}

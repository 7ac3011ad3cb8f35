//! The host side of `sdk/wit/drafter.wit`: the only `bindgen!` call in spechost.
//!
//! Generated code stays in the private `generated` module. This file re-exports, to the rest of
//! `plugins` only, the few generated items the host needs, and converts the WIT records to and
//! from the [`cascade`](crate::cascade) types with `From`, building or destructuring each one
//! field by field. Nothing generated is visible outside `plugins`, so a change to a WIT record
//! breaks the host's compilation here and nowhere else (and, on the guest side, spechost-sdk's).
//! The interface names the loader checks are derived from [`spechost_sdk::WIT_VERSION`], the
//! one place the version is written.
//!
//! Both worlds are bound: `drafter` here, `policy` in `policy_world`, which reuses the
//! interfaces the two share (`types`, `host`) through `with`, so each host import is
//! implemented once.

use crate::cascade;
use crate::cascade::{
    Decision as CascadeDecision, PolicySetup as CascadeSetup, RoundRecord as CascadeRecord,
    SourceRound as CascadeSourceRound,
};

mod generated {
    wasmtime::component::bindgen!({
        path: "../sdk/wit",
        world: "drafter",
    });
}

mod policy_world {
    wasmtime::component::bindgen!({
        path: "../sdk/wit",
        world: "policy",
        with: {
            "spechost:drafter/types": super::generated::spechost::drafter::types,
            "spechost:drafter/host": super::generated::spechost::drafter::host,
        },
    });
}

pub(super) use self::generated::spechost::drafter::draft_model::{
    DraftedPosition, DraftedToken, Host as DraftModelHost,
};
pub(super) use self::generated::spechost::drafter::host::{Host as LogHost, Level};
pub(super) use self::generated::spechost::drafter::state::Host as StateHost;
pub(super) use self::generated::spechost::drafter::tree::Host as TreeHost;
pub(super) use self::generated::spechost::drafter::types::{
    Feedback, Host as TypesHost, ModelFacts, Proposal,
};
pub(super) use self::generated::{Drafter, DrafterPre};
pub(super) use self::policy_world::exports::spechost::drafter::policy_api::{
    Decision, DraftModelCosts, PolicySetup, RoundRecord, SourceRound,
};
pub(super) use self::policy_world::{Policy, PolicyPre};

/// The WIT package version this host speaks; plugins must be built against the same minor. The
/// SDK owns the WIT and writes its version once; every interface name below is derived from it.
pub(super) use spechost_sdk::WIT_VERSION;

/// The interface a drafter component must export.
pub(super) const DRAFTER_API: &str = "drafter-api";
/// The interface a policy component must export.
pub(super) const POLICY_API: &str = "policy-api";
/// The draft-model import; a plugin that uses the draft model imports it.
pub(super) const DRAFT_MODEL: &str = "draft-model";

/// `interface` of the WIT package, named as it appears in a component's type:
/// `spechost:drafter/<interface>@<WIT_VERSION>`.
pub(super) fn interface_name(interface: &str) -> String {
    format!("{}/{interface}@{WIT_VERSION}", spechost_sdk::WIT_PACKAGE)
}

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
        // Destructured, as every record the guest sends: a field added to the WIT fails to
        // compile here until the host decides what to do with it.
        // Its tree shape, if any, comes through the `tree` import (`plugins/tree.rs`).
        let Proposal { tokens, confidence } = proposal;
        cascade::Proposal {
            tokens,
            confidence,
            parents: Vec::new(),
        }
    }
}

impl From<cascade::DraftedToken> for DraftedToken {
    fn from(drafted: cascade::DraftedToken) -> Self {
        DraftedToken {
            token: drafted.token,
            prob: drafted.prob,
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

impl From<&CascadeSourceRound> for SourceRound {
    fn from(round: &CascadeSourceRound) -> Self {
        Self {
            source: round.source.clone(),
            drafted: saturating_u32(round.drafted),
            accepted: saturating_u32(round.accepted),
            won: round.won,
            shadow: round.shadow,
            censored: round.censored,
            draft_us: micros(round.draft_time),
            catch_up_us: micros(round.catch_up_time),
        }
    }
}

impl From<&CascadeRecord> for RoundRecord {
    fn from(round: &CascadeRecord) -> Self {
        Self {
            max_draft_len: saturating_u32(round.max_draft_len),
            sources: round.sources.iter().map(Into::into).collect(),
            draft_us: micros(round.draft_time),
            verify_us: micros(round.verify_time),
            n_verified: saturating_u32(round.n_verified),
            n_accepted: saturating_u32(round.n_accepted),
            batch_verified: saturating_u32(round.batch_verified),
            batch_committed: saturating_u32(round.batch_committed),
            committed_text: round.committed_text.clone(),
        }
    }
}

impl From<&CascadeSetup> for PolicySetup {
    fn from(setup: &CascadeSetup) -> Self {
        Self {
            sources: setup.sources.clone(),
            max_draft_len: saturating_u32(setup.max_draft_len),
            verify_us: setup
                .verify_costs
                .iter()
                .map(|&cost| micros_f32(cost))
                .collect(),
            draft_model: setup
                .draft_model
                .as_ref()
                .map(|draft_model| DraftModelCosts {
                    sources: draft_model.sources.clone(),
                    per_token_us: micros_f32(draft_model.costs.per_token),
                    catch_up_per_token_us: micros_f32(draft_model.costs.catch_up_per_token),
                    agreement: draft_model.costs.agreement,
                }),
            prompt_len: saturating_u32(setup.prompt_len),
            max_tokens: saturating_u32(setup.max_tokens),
        }
    }
}

impl From<Decision> for CascadeDecision {
    fn from(decision: Decision) -> Self {
        let Decision {
            max_draft_len,
            shadow_len,
            order,
            exclude,
        } = decision;
        Self {
            max_draft_len: max_draft_len as usize,
            shadow_len: shadow_len as usize,
            order,
            exclude,
        }
    }
}

fn saturating_u32(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

fn micros(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn micros_f32(duration: std::time::Duration) -> f32 {
    duration.as_secs_f32() * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_carry_package_and_version() {
        let name = interface_name(DRAFTER_API);
        assert_eq!(
            name,
            format!("spechost:drafter/drafter-api@{WIT_VERSION}"),
            "drafter export name"
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

//! Glue between the generated `policy` world and [`Policy`].

use std::cell::RefCell;

use crate::policy::Policy;
use crate::policy_types::{Decision, PolicySetup, RoundRecord, SourceRound};

use super::drafter_world::spechost::drafter::types as wit_types;
use super::policy_world::exports::spechost::drafter::policy_api as api;
use super::{forward_panics_to_host_log, model_facts};

pub use super::policy_world::{export, exports};

/// A policy as the generated bindings see it: one per policy-session resource.
///
/// As for drafters, the `RefCell` turns the `&self` of exported resource methods into the
/// `&mut self` of [`Policy`] methods; calls never overlap, so a borrow can never fail.
pub struct PolicyCell<P>(RefCell<P>);

impl<P: Policy> api::Guest for PolicyCell<P> {
    type PolicySession = Self;
}

impl<P: Policy> api::GuestPolicySession for PolicyCell<P> {
    fn open(
        config: String,
        facts: wit_types::ModelFacts,
        setup: api::PolicySetup,
    ) -> Result<api::PolicySession, String> {
        forward_panics_to_host_log();
        let setup = PolicySetup {
            sources: setup.sources,
            max_draft_len: setup.max_draft_len,
            verify_us: setup.verify_us,
        };
        let policy = P::new(&config, &model_facts(facts), &setup)?;
        Ok(api::PolicySession::new(PolicyCell(RefCell::new(policy))))
    }

    fn wants_text(&self) -> bool {
        self.0.borrow().wants_text()
    }

    fn observe(&self, round: api::RoundRecord) {
        self.0.borrow_mut().observe(&round_record(round));
    }

    fn decide(&self) -> api::Decision {
        let Decision {
            max_draft_len,
            shadow_len,
            order,
            exclude,
        } = self.0.borrow_mut().decide();
        api::Decision {
            max_draft_len,
            shadow_len,
            order,
            exclude,
        }
    }
}

/// Fails to compile unless `P` implements [`Policy`]; lets [`crate::export_policy!`] report a
/// readable error, and check the type natively, where nothing is exported.
pub const fn assert_policy<P: Policy>() {}

fn round_record(round: api::RoundRecord) -> RoundRecord {
    let api::RoundRecord {
        max_draft_len,
        sources,
        draft_us,
        verify_us,
        n_verified,
        n_accepted,
        committed_text,
    } = round;
    RoundRecord {
        max_draft_len,
        sources: sources.into_iter().map(source_round).collect(),
        draft_us,
        verify_us,
        n_verified,
        n_accepted,
        committed_text,
    }
}

fn source_round(source: api::SourceRound) -> SourceRound {
    let api::SourceRound {
        source,
        drafted,
        accepted,
        won,
        shadow,
        censored,
        draft_us,
    } = source;
    SourceRound {
        source,
        drafted,
        accepted,
        won,
        shadow,
        censored,
        draft_us,
    }
}

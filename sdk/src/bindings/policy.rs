//! Glue between the generated `policy` world and [`Policy`].

use std::cell::RefCell;

use crate::policy::Policy;
use crate::records::{Decision, ModelFacts, PolicySetup, RoundRecord};

use super::forward_panics_to_host_log;
use super::policy_world::exports::spechost::drafter::policy_api as api;

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
        facts: ModelFacts,
        setup: PolicySetup,
    ) -> Result<api::PolicySession, String> {
        forward_panics_to_host_log();
        let policy = P::new(&config, &facts, &setup)?;
        Ok(api::PolicySession::new(PolicyCell(RefCell::new(policy))))
    }

    fn wants_text(&self) -> bool {
        self.0.borrow().wants_text()
    }

    fn observe(&self, round: RoundRecord) {
        self.0.borrow_mut().observe(&round);
    }

    fn decide(&self) -> Decision {
        self.0.borrow_mut().decide()
    }
}

/// Fails to compile unless `P` implements [`Policy`]; lets [`crate::export_policy!`] report a
/// readable error, and check the type natively, where nothing is exported.
pub const fn assert_policy<P: Policy>() {}

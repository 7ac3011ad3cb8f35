//! The [`Policy`] trait: what the author of an adaptive draft-length policy implements.

use crate::records::{Decision, ModelFacts, PolicySetup, RoundRecord};

/// Chooses each round's draft length (adaptive K), one value per generation request.
///
/// The host opens one policy session per request and the SDK turns it into one `Self` value,
/// created by [`Policy::new`] and dropped when the request ends. It asks
/// [`Policy::wants_text`] once after opening, then every round goes:
///
/// 1. [`Policy::decide`] chooses the round's draft length (and possibly shadow drafts or a new
///    source order);
/// 2. the round runs: sources propose, the target verifies;
/// 3. [`Policy::observe`] gets the round's [`RoundRecord`].
///
/// Calls never overlap. A panic in any method is a fault, as for a drafter: generation goes on
/// without the policy's decision, and the panic's message and location reach the host's log.
///
/// Implement it in a `cdylib` crate and export it with [`crate::export_policy!`];
/// [`crate::testing::PolicyHarness`] drives it natively in unit tests.
pub trait Policy: Sized + 'static {
    /// Opens a policy for one request.
    ///
    /// `config` is the plugin's own configuration, `key=value` pairs separated by `,` (parse it
    /// with [`crate::config::Config`]), empty when the user gave none. `facts` describes the
    /// target model and `setup` the cascade, the largest allowed draft length and, when the host
    /// measured it, the target's verify time per batch size.
    ///
    /// Return `Err` with a message naming the bad setting and how to fix it; the host shows it to
    /// the user as a configuration error naming the plugin.
    fn new(config: &str, facts: &ModelFacts, setup: &PolicySetup) -> Result<Self, String>;

    /// Whether the host should fill [`RoundRecord::committed_text`]. Detokenizing costs the host
    /// time every round, so the default is `false`; content-aware policies return `true`.
    fn wants_text(&self) -> bool {
        false
    }

    /// Records a finished round: what was drafted, what each source proposed and got accepted,
    /// shadow results settled this round, and the time drafting and verifying took.
    fn observe(&mut self, round: &RoundRecord);

    /// Chooses the next round's draft length, shadow drafts and, optionally, source order.
    ///
    /// A `max_draft_len` above [`PolicySetup::max_draft_len`] is cut to it by the host. Return
    /// [`Decision::skip`] to decode the round without speculation (when drafting does not pay),
    /// with a shadow length above 0 to keep measuring whether it would.
    fn decide(&mut self) -> Decision;
}

//! The [`Drafter`] trait: what a plugin author implements.

use crate::records::{Feedback, ModelFacts, Proposal, Token};

/// A source of draft tokens, one value per generation request.
///
/// The host opens one session per request and the SDK turns it into one `Self` value, created by
/// [`Drafter::new`] and dropped when the request ends. Within a request, every round goes:
///
/// 1. [`Drafter::propose`], if the host wants a draft from this drafter this round;
/// 2. [`Drafter::feedback`], if it proposed;
/// 3. [`Drafter::feed`] with the tokens the round committed.
///
/// Calls never overlap: a plugin instance is single-threaded. State that must outlive a request
/// (a cache shared by all requests) lives outside `Self`, in a `thread_local!` or `static` of the
/// plugin; it survives for as long as the host keeps the plugin loaded, and is lost when the
/// plugin traps (a panic, a timeout, running out of memory) and the host re-creates it. To keep
/// it across those, and across host restarts, save it in [`Drafter::checkpoint`] through
/// [`crate::state`]. In a server, such state can also learn from the requests other instances
/// served, through [`Drafter::observe_response`].
///
/// A panic in any method is a fault: the host discards the round's proposal, restarts the plugin
/// and, after repeated faults, quarantines it. Generation itself never depends on a drafter
/// being right. The panic's message and location reach the host's log at error level first.
pub trait Drafter: Sized + 'static {
    /// Opens a session for one request.
    ///
    /// `config` is the plugin's own configuration: the user's `--plugin-config` values for this
    /// plugin, as `key=value` pairs separated by `,` (parse it with [`crate::config::Config`]).
    /// It is empty when the user gave none. `facts` describes the target model.
    ///
    /// Return `Err` with a message naming the bad setting and how to fix it; the host shows it to
    /// the user as a configuration error naming the plugin. Do no expensive work here: the
    /// constructor runs once per request, under the host's time limit.
    fn new(config: &str, facts: &ModelFacts) -> Result<Self, String>;

    /// Appends `tokens` to the context.
    ///
    /// Called first with the whole prompt, then once per round with only the tokens that round
    /// committed: the accepted prefix of the draft followed by the target's token. Tokens are
    /// never sent twice, so keep whatever history you need. The rounds a policy left this
    /// drafter out of come together, in one call before it is next asked or its session ends.
    fn feed(&mut self, tokens: &[Token]);

    /// Proposes up to `max_draft_len` tokens continuing the context fed so far.
    ///
    /// Called at most once per round, only when the host wants a draft from this drafter.
    /// Return [`Proposal::empty`] when there is nothing worth proposing; the cascade then asks its
    /// next source. Never return more than `max_draft_len` tokens or a token `>= vocab_size`: the
    /// host treats that as a fault and the proposal is lost. Keep the work per call small and
    /// independent of the context length: it is on the critical path of every round.
    fn propose(&mut self, max_draft_len: usize) -> Proposal;

    /// Tells the drafter how its last proposal fared.
    ///
    /// Called after each round in which this drafter proposed, before that round's
    /// [`Drafter::feed`]. `outcome.won` is false when another source's draft was verified
    /// instead; then `n_accepted` is 0. The default does nothing; override it to adapt.
    fn feedback(&mut self, _outcome: Feedback) {}

    /// Saves the plugin's cross-request state now, through [`crate::state::save`].
    ///
    /// Called on the type, not on a session: the host calls it when it is about to write its
    /// state files (end of a run, a periodic checkpoint, shutdown), never while a session call
    /// is running, and possibly on a fresh instance that has opened no session yet. The default
    /// does nothing, which suits drafters without cross-request state.
    fn checkpoint() {}

    /// Learns from `response`, the output tokens of a finished request this plugin instance
    /// did not serve: another slot of the server generated it, or another replica sharing
    /// through `spechost serve --share`.
    ///
    /// Called on the type, not on a session: the host calls it between requests, never while a
    /// session call is running, and possibly on a fresh instance that has opened no session yet
    /// (so no config has been seen). Every token is below the model's `vocab_size`, and the
    /// response is at most `context_size` tokens long. A drafter that keeps cross-request state
    /// (a cache of past responses) should learn from it as from the responses of its own
    /// sessions. The call is under the same time limit as any other: keep it cheap, and index a
    /// long response over later calls. The default does nothing, which suits drafters without
    /// cross-request state.
    fn observe_response(_response: &[Token]) {}
}

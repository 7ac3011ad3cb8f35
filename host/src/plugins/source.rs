//! [`PluginSource`]: a drafter plugin instance as a [`DraftSource`], with faults, restarts and
//! quarantine.
//!
//! The source keeps its own copy of the request's context, so a dead instance can be replaced
//! without the cascade noticing: after a trap (panic, deadline, memory limit) the `Store` is
//! dropped, and the next call that needs the plugin instantiates it again, re-opens the session
//! with the same config and facts, and replays the whole context in one `feed`. Invalid
//! proposals (too long, token ids outside the vocabulary, confidences outside [0, 1]) are faults
//! too, but leave the instance running. After `max_faults` faults the source is quarantined:
//! it is never called again, `propose` returns an empty proposal and `feed`/`feedback` do
//! nothing.

use std::sync::Arc;

use spechost_sdk::check_proposal;
use wasmtime::component::ResourceAny;
use wasmtime::{Store, Trap};

use super::bindings::{self, Drafter};
use super::error::LoadError;
use super::loader::LoadedPlugin;
use super::sandbox::{
    EPOCH_TICK, HostState, SandboxLimits, arm_call, deadline_ticks, enforce_deadline, format_bytes,
    format_duration, sanitize,
};
use crate::cascade::{DraftSource, Feedback, ModelFacts, Proposal, SourceFault, Token};

/// The guest call that faulted, named as in the WIT (`method` field of logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Instantiate,
    Open,
    Feed,
    Propose,
    Feedback,
    Drop,
    Checkpoint,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Instantiate => "instantiate",
            Method::Open => "open",
            Method::Feed => "feed",
            Method::Propose => "propose",
            Method::Feedback => "feedback",
            Method::Drop => "drop",
            Method::Checkpoint => "checkpoint",
        }
    }
}

/// A running plugin instance: its store, its exports, and the open session if any.
struct Live {
    store: Store<HostState>,
    drafter: Drafter,
    session: Option<ResourceAny>,
}

/// The current request, between `begin` and `end`.
struct Request {
    facts: bindings::ModelFacts,
    /// The plugin's `open` returned `Err` for this request: do not call it again until `begin`.
    rejected: bool,
}

/// A drafter plugin as one slot of a cascade. Made by [`LoadedPlugin::source`].
pub struct PluginSource {
    plugin: LoadedPlugin,
    name: Arc<str>,
    config: String,
    limits: SandboxLimits,
    deadline_ticks: u64,
    /// `None` after a trap, until the next call that needs the plugin.
    live: Option<Live>,
    /// The last instance trapped; the next one to be created counts as a restart.
    crashed: bool,
    request: Option<Request>,
    /// Everything fed in the current request, for replay after a restart.
    context: Vec<Token>,
    faults: u32,
    restarts: u32,
    quarantined: bool,
    last_fault: Option<SourceFault>,
}

impl std::fmt::Debug for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginSource")
            .field("name", &self.name)
            .field("faults", &self.faults)
            .field("restarts", &self.restarts)
            .field("quarantined", &self.quarantined)
            .finish_non_exhaustive()
    }
}

impl PluginSource {
    /// A source over a fresh instance of `plugin`; the session opens at
    /// [`DraftSource::begin`]. If the instance cannot start now, `begin` tries again and
    /// reports a fault.
    pub(super) fn start(plugin: LoadedPlugin, config: String, limits: SandboxLimits) -> Self {
        let mut source = Self::without_instance(plugin, config, limits);
        source.live = source.instantiate().ok();
        source
    }

    /// Checks that `plugin` can be instantiated under `limits` (its initial memory fits, its
    /// start-up code runs within the deadline).
    pub(super) fn check_starts(
        plugin: &LoadedPlugin,
        limits: &SandboxLimits,
    ) -> Result<(), LoadError> {
        let probe = Self::without_instance(plugin.clone(), String::new(), limits.clone());
        probe
            .instantiate()
            .map(drop)
            .map_err(|error| LoadError::Instantiate {
                plugin: plugin.name().to_owned(),
                reason: describe_failure(Method::Instantiate, &error, None, None, limits),
            })
    }

    /// Opens and closes one session of `plugin` with `config` in a throw-away instance.
    pub(super) fn check_config(
        plugin: &LoadedPlugin,
        config: &str,
        facts: &ModelFacts,
        limits: &SandboxLimits,
    ) -> Result<(), LoadError> {
        let mut probe = Self::without_instance(plugin.clone(), config.to_owned(), limits.clone());
        let result = probe.begin(facts, &[]);
        let rejected = probe
            .request
            .as_ref()
            .is_some_and(|request| request.rejected);
        probe.end();
        match result {
            Ok(()) => Ok(()),
            Err(fault) if rejected => Err(LoadError::Config {
                plugin: plugin.name().to_owned(),
                detail: fault.what,
            }),
            Err(fault) => Err(LoadError::Instantiate {
                plugin: plugin.name().to_owned(),
                reason: fault.what,
            }),
        }
    }

    fn without_instance(plugin: LoadedPlugin, config: String, limits: SandboxLimits) -> Self {
        Self {
            name: plugin.shared_name(),
            plugin,
            config,
            deadline_ticks: deadline_ticks(limits.call_deadline, EPOCH_TICK),
            limits,
            live: None,
            crashed: false,
            request: None,
            context: Vec::new(),
            faults: 0,
            restarts: 0,
            quarantined: false,
            last_fault: None,
        }
    }

    /// Faults so far: traps, time-outs, memory-limit hits, invalid proposals, rejected configs.
    pub fn faults(&self) -> u32 {
        self.faults
    }

    /// Times the instance was re-created after a trap.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Whether the source reached `max_faults` and is no longer called.
    pub fn is_quarantined(&self) -> bool {
        self.quarantined
    }

    /// The most recent fault, if any.
    pub fn last_fault(&self) -> Option<&SourceFault> {
        self.last_fault.as_ref()
    }

    /// The limits this source runs under.
    pub fn limits(&self) -> &SandboxLimits {
        &self.limits
    }

    /// A fresh store and instance.
    fn instantiate(&self) -> wasmtime::Result<Live> {
        let mut store = Store::new(
            self.plugin.engine(),
            HostState::new(Arc::clone(&self.name), &self.limits, self.plugin.services()),
        );
        store.limiter(|state| &mut state.limiter);
        enforce_deadline(&mut store, self.limits.call_deadline);
        arm_call(&mut store, self.deadline_ticks);
        let drafter = self.plugin.pre().instantiate(&mut store)?;
        Ok(Live {
            store,
            drafter,
            session: None,
        })
    }

    /// Whether guest calls are wanted now: a request is running, its config was accepted, and
    /// the source is not quarantined.
    fn is_active(&self) -> bool {
        !self.quarantined
            && self
                .request
                .as_ref()
                .is_some_and(|request| !request.rejected)
    }

    /// The live instance and its open session, when both exist.
    fn open_session(&mut self) -> Option<(&mut Live, ResourceAny)> {
        let live = self.live.as_mut()?;
        let session = live.session?;
        Some((live, session))
    }

    /// Makes sure an instance is running with an open session that has seen the whole context:
    /// re-creates the instance after a trap, opens the session, replays the context.
    fn ensure_session(&mut self) -> Result<(), SourceFault> {
        if self.live.is_none() {
            let live = self
                .instantiate()
                .map_err(|error| self.trap(Method::Instantiate, error))?;
            self.live = Some(live);
            if std::mem::take(&mut self.crashed) {
                self.restarts += 1;
                tracing::debug!(plugin = %self.name, restarts = self.restarts, "restarted plugin instance");
            }
        }
        if self.open_session().is_some() {
            return Ok(());
        }
        let (Some(live), Some(request)) = (self.live.as_mut(), self.request.as_mut()) else {
            return Ok(());
        };
        arm_call(&mut live.store, self.deadline_ticks);
        let api = live.drafter.spechost_drafter_drafter_api();
        let session = match api
            .session()
            .call_open(&mut live.store, &self.config, &request.facts)
        {
            Ok(Ok(session)) => session,
            Ok(Err(message)) => {
                request.rejected = true;
                let what = format!(
                    "rejected its configuration {:?}: {}; fix the `{}.key=value` plugin config",
                    self.config,
                    sanitize(&message, MAX_GUEST_ERROR_CHARS),
                    self.name
                );
                return Err(self.fault(what));
            }
            Err(error) => return Err(self.trap(Method::Open, error)),
        };
        live.session = Some(session);
        if !self.context.is_empty() {
            arm_call(&mut live.store, self.deadline_ticks);
            let replayed = api
                .session()
                .call_feed(&mut live.store, session, &self.context);
            replayed.map_err(|error| self.trap(Method::Feed, error))?;
        }
        Ok(())
    }

    /// Closes the open session, if any. A fault while closing is recorded, not returned.
    fn close_session(&mut self) {
        let Some(live) = self.live.as_mut() else {
            return;
        };
        let Some(session) = live.session.take() else {
            return;
        };
        arm_call(&mut live.store, self.deadline_ticks);
        if let Err(error) = session.resource_drop(&mut live.store) {
            self.trap(Method::Drop, error);
        }
    }

    /// Records a trap in `method`: the instance is dropped, to be re-created on next use.
    fn trap(&mut self, method: Method, error: wasmtime::Error) -> SourceFault {
        self.crashed = true;
        let deadline = self.limits.call_deadline;
        let (refused_memory, panic, host_busy) = match self.live.take() {
            Some(mut live) => {
                let clock = &live.store.data().clock;
                let host_busy = clock
                    .host_time_exceeded(deadline)
                    .then(|| clock.host_time_cap(deadline));
                (
                    live.store.data_mut().limiter.take_refusal(),
                    live.store.data().last_panic(),
                    host_busy,
                )
            }
            None => (None, None, None),
        };
        let what = if let Some(cap) = host_busy {
            format!(
                "kept the host busy on its behalf (draft model, state) for over {} in {}",
                format_duration(cap),
                method.as_str()
            )
        } else {
            describe_failure(
                method,
                &error,
                refused_memory,
                panic.as_deref(),
                &self.limits,
            )
        };
        tracing::debug!(plugin = %self.name, method = method.as_str(), "trap detail: {error:?}");
        self.fault(what)
    }

    /// Counts a fault, warns, and quarantines the source at `max_faults`.
    fn fault(&mut self, what: String) -> SourceFault {
        self.faults += 1;
        let fault = SourceFault {
            source: self.name.to_string(),
            what,
        };
        tracing::warn!(plugin = %self.name, faults = self.faults, max_faults = self.limits.max_faults, "{fault}");
        if self.faults >= self.limits.max_faults && !self.quarantined {
            self.quarantined = true;
            self.live = None;
            self.request = None;
            self.context = Vec::new();
            tracing::warn!(
                plugin = %self.name,
                faults = self.faults,
                last_fault = %fault.what,
                "draft source `{}` quarantined after {} faults; it will not be called again this run (last fault: {})",
                self.name,
                self.faults,
                fault.what
            );
        }
        self.last_fault = Some(fault.clone());
        fault
    }
}

/// Longest error string from a plugin's `open` kept in a fault, in characters.
const MAX_GUEST_ERROR_CHARS: usize = 500;

impl DraftSource for PluginSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn begin(&mut self, facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
        if self.quarantined {
            return Ok(());
        }
        self.close_session();
        self.context.clear();
        self.context.extend_from_slice(prompt);
        self.request = Some(Request {
            facts: bindings::ModelFacts::from(facts),
            rejected: false,
        });
        if self.quarantined {
            // Closing the previous session faulted for the last time.
            return Ok(());
        }
        self.ensure_session()
    }

    fn propose(&mut self, max_draft_len: usize) -> Result<Proposal, SourceFault> {
        if !self.is_active() || max_draft_len == 0 {
            return Ok(Proposal::empty());
        }
        self.ensure_session()?;
        let deadline_ticks = self.deadline_ticks;
        let Some((live, session)) = self.open_session() else {
            return Ok(Proposal::empty());
        };
        arm_call(&mut live.store, deadline_ticks);
        let asked = u32::try_from(max_draft_len).unwrap_or(u32::MAX);
        let api = live.drafter.spechost_drafter_drafter_api();
        let proposal = match api.session().call_propose(&mut live.store, session, asked) {
            Ok(proposal) => Proposal::from(proposal),
            Err(error) => return Err(self.trap(Method::Propose, error)),
        };
        let vocab_size = self
            .request
            .as_ref()
            .map_or(0, |request| request.facts.vocab_size);
        match check_proposal(
            &proposal.tokens,
            &proposal.confidence,
            max_draft_len,
            vocab_size,
        ) {
            Ok(()) => Ok(proposal),
            Err(broken) => Err(self.fault(broken.to_string())),
        }
    }

    fn feedback(&mut self, feedback: Feedback) -> Result<(), SourceFault> {
        if !self.is_active() {
            return Ok(());
        }
        let deadline_ticks = self.deadline_ticks;
        // After a restart the new instance never made the proposal this feedback is about.
        let Some((live, session)) = self.open_session() else {
            return Ok(());
        };
        arm_call(&mut live.store, deadline_ticks);
        let api = live.drafter.spechost_drafter_drafter_api();
        let outcome = bindings::Feedback::from(feedback);
        match api
            .session()
            .call_feedback(&mut live.store, session, outcome)
        {
            Ok(()) => Ok(()),
            Err(error) => Err(self.trap(Method::Feedback, error)),
        }
    }

    fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
        if self.quarantined {
            return Ok(());
        }
        self.context.extend_from_slice(tokens);
        if !self.is_active() {
            return Ok(());
        }
        let deadline_ticks = self.deadline_ticks;
        let Some((live, session)) = self.open_session() else {
            // Restarting replays the whole context, these tokens included.
            return self.ensure_session();
        };
        arm_call(&mut live.store, deadline_ticks);
        let api = live.drafter.spechost_drafter_drafter_api();
        match api.session().call_feed(&mut live.store, session, tokens) {
            Ok(()) => Ok(()),
            Err(error) => Err(self.trap(Method::Feed, error)),
        }
    }

    fn end(&mut self) {
        self.close_session();
        self.request = None;
        self.context.clear();
    }

    fn is_expensive(&self) -> bool {
        self.plugin.uses_draft_model()
    }

    fn checkpoint(&mut self) -> Result<(), SourceFault> {
        if self.quarantined {
            return Ok(());
        }
        let deadline_ticks = self.deadline_ticks;
        // Only a running instance has state worth saving: a trapped one lost it.
        let Some(live) = self.live.as_mut() else {
            return Ok(());
        };
        arm_call(&mut live.store, deadline_ticks);
        let api = live.drafter.spechost_drafter_drafter_api();
        match api.call_checkpoint(&mut live.store) {
            Ok(()) => Ok(()),
            Err(error) => Err(self.trap(Method::Checkpoint, error)),
        }
    }
}

/// Why a guest call failed, in words for a warning: the memory limit, the deadline, a trap
/// (with the guest's panic message when it printed one), or another runtime error.
fn describe_failure(
    method: Method,
    error: &wasmtime::Error,
    refused_memory: Option<usize>,
    panic: Option<&str>,
    limits: &SandboxLimits,
) -> String {
    let method = method.as_str();
    if let Some(desired) = refused_memory {
        return format!(
            "exceeded its {} memory limit in {method} (tried to grow a memory to {})",
            format_bytes(limits.memory_limit),
            format_bytes(desired)
        );
    }
    let cause = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => {
            return format!(
                "exceeded its {} deadline in {method}",
                format_duration(limits.call_deadline)
            );
        }
        Some(trap) => {
            let text = trap.to_string();
            format!(
                "trapped in {method}: {}",
                text.strip_prefix("wasm trap: ").unwrap_or(&text)
            )
        }
        None => format!("failed in {method}: {error}"),
    };
    match panic {
        Some(panic) => format!("{cause} ({panic})"),
        None => cause,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn describes_deadline_memory_and_panic_faults() {
        let limits = SandboxLimits::default();
        let deadline = wasmtime::Error::new(Trap::Interrupt);
        assert_eq!(
            describe_failure(Method::Propose, &deadline, None, None, &limits),
            "exceeded its 50 ms deadline in propose"
        );
        let unreachable = wasmtime::Error::new(Trap::UnreachableCodeReached);
        assert_eq!(
            describe_failure(
                Method::Propose,
                &unreachable,
                Some(512 << 20),
                None,
                &limits
            ),
            "exceeded its 256 MiB memory limit in propose (tried to grow a memory to 512 MiB)"
        );
        assert_eq!(
            describe_failure(
                Method::Open,
                &unreachable,
                None,
                Some("panicked at src/lib.rs:1:1: boom"),
                &limits
            ),
            "trapped in open: wasm `unreachable` instruction executed (panicked at src/lib.rs:1:1: boom)"
        );
        let short = SandboxLimits {
            call_deadline: Duration::from_millis(10),
            ..limits
        };
        assert_eq!(
            describe_failure(Method::Feed, &deadline, None, None, &short),
            "exceeded its 10 ms deadline in feed"
        );
    }
}

//! [`PluginPolicy`]: a policy component as a [`RoundPolicy`], with faults and quarantine.
//!
//! One instance serves every request of its cascade, one session per request, so a policy may
//! carry what it learned from one request to the next inside its instance (the `cost` policy
//! does). Recovery is simpler than a drafter's: after a trap the instance is dropped and the next
//! call re-creates it and re-opens the session, which starts from scratch. A fault in `decide` makes the round plain
//! decoding (K = 0), which can never be slower than plain decoding. After `max_faults` faults
//! the policy is quarantined: speculation stays off for the rest of the run, with one warning.

use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::ResourceAny;

use super::bindings::{self, Policy};
use super::error::LoadError;
use super::loader::LoadedPolicy;
use super::sandbox::{
    EPOCH_TICK, HostState, Services, arm_call, deadline_ticks, enforce_deadline, sanitize,
};
use crate::cascade::{Decision, ModelFacts, PolicySetup, RoundPolicy, RoundRecord, SourceFault};

/// Longest error string from a policy's `open` kept in a fault, in characters.
const MAX_GUEST_ERROR_CHARS: usize = 500;

/// A running policy instance and its open session.
struct Live {
    store: Store<HostState>,
    policy: Policy,
    session: Option<ResourceAny>,
}

/// What a session is opened with.
struct Opening {
    facts: bindings::ModelFacts,
    setup: bindings::PolicySetup,
}

/// A policy plugin for one cascade. Made by [`LoadedPolicy::policy`].
pub struct PluginPolicy {
    plugin: LoadedPolicy,
    name: Arc<str>,
    config: String,
    deadline_ticks: u64,
    live: Option<Live>,
    opening: Option<Opening>,
    wants_text: bool,
    faults: u32,
    quarantined: bool,
}

impl std::fmt::Debug for PluginPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginPolicy")
            .field("name", &self.name)
            .field("faults", &self.faults)
            .field("quarantined", &self.quarantined)
            .finish_non_exhaustive()
    }
}

impl PluginPolicy {
    pub(super) fn start(plugin: LoadedPolicy, config: String) -> Self {
        Self {
            name: plugin.shared_name(),
            deadline_ticks: deadline_ticks(plugin.limits().call_deadline, EPOCH_TICK),
            plugin,
            config,
            live: None,
            opening: None,
            wants_text: false,
            faults: 0,
            quarantined: false,
        }
    }

    /// Checks that the component instantiates under the host's limits.
    pub(super) fn check_starts(plugin: &LoadedPolicy) -> Result<(), LoadError> {
        let probe = Self::start(plugin.clone(), String::new());
        probe
            .instantiate()
            .map(drop)
            .map_err(|error| LoadError::Instantiate {
                plugin: plugin.name().to_owned(),
                reason: format!("{error:#}"),
            })
    }

    /// Opens one session with `config` in a throw-away instance; `Err` if the policy rejects it.
    pub(super) fn check_config(
        plugin: &LoadedPolicy,
        config: &str,
        facts: &ModelFacts,
        setup: &PolicySetup,
    ) -> Result<(), LoadError> {
        let mut probe = Self::start(plugin.clone(), config.to_owned());
        probe.opening = Some(Opening {
            facts: bindings::ModelFacts::from(facts),
            setup: bindings::PolicySetup::from(setup),
        });
        match probe.ensure_session() {
            Ok(()) => Ok(()),
            Err(OpenFailure::Rejected(detail)) => Err(LoadError::Config {
                plugin: plugin.name().to_owned(),
                detail,
            }),
            Err(OpenFailure::Trapped(fault)) => Err(LoadError::Instantiate {
                plugin: plugin.name().to_owned(),
                reason: fault.what,
            }),
        }
    }

    /// Faults so far.
    pub fn faults(&self) -> u32 {
        self.faults
    }

    /// Whether the policy is quarantined (speculation is off for the rest of the run).
    pub fn is_quarantined(&self) -> bool {
        self.quarantined
    }

    fn instantiate(&self) -> wasmtime::Result<Live> {
        let limits = self.plugin.limits();
        let mut store = Store::new(
            self.plugin.engine(),
            HostState::new(Arc::clone(&self.name), limits, Services::default()),
        );
        store.limiter(|state| &mut state.limiter);
        enforce_deadline(&mut store, limits.call_deadline);
        arm_call(&mut store, self.deadline_ticks);
        let policy = self.plugin.pre().instantiate(&mut store)?;
        Ok(Live {
            store,
            policy,
            session: None,
        })
    }

    /// Makes sure an instance runs with an open session.
    fn ensure_session(&mut self) -> Result<(), OpenFailure> {
        if self.live.is_none() {
            let live = self
                .instantiate()
                .map_err(|error| OpenFailure::Trapped(self.trap("instantiate", &error)))?;
            self.live = Some(live);
        }
        let (Some(live), Some(opening)) = (self.live.as_mut(), self.opening.as_ref()) else {
            return Ok(());
        };
        if live.session.is_some() {
            return Ok(());
        }
        arm_call(&mut live.store, self.deadline_ticks);
        let api = live.policy.spechost_drafter_policy_api();
        let opened = api.policy_session().call_open(
            &mut live.store,
            &self.config,
            &opening.facts,
            &opening.setup,
        );
        let session = match opened {
            Ok(Ok(session)) => session,
            Ok(Err(message)) => {
                return Err(OpenFailure::Rejected(format!(
                    "rejected its configuration {:?}: {}; fix the settings after `{},` (in `--policy`, the config file's `policy`, or a request's `speculative.policy`)",
                    self.config,
                    sanitize(&message, MAX_GUEST_ERROR_CHARS),
                    self.name
                )));
            }
            Err(error) => return Err(OpenFailure::Trapped(self.trap("open", &error))),
        };
        live.session = Some(session);
        arm_call(&mut live.store, self.deadline_ticks);
        match api
            .policy_session()
            .call_wants_text(&mut live.store, session)
        {
            Ok(wants_text) => self.wants_text = wants_text,
            Err(error) => return Err(OpenFailure::Trapped(self.trap("wants-text", &error))),
        }
        Ok(())
    }

    /// Records a trap: the instance is dropped, to be re-created on next use.
    fn trap(&mut self, method: &str, error: &wasmtime::Error) -> SourceFault {
        let panic = self
            .live
            .take()
            .and_then(|live| live.store.data().last_panic());
        let mut what = match error.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::Interrupt) => format!("exceeded its deadline in {method}"),
            Some(trap) => format!("trapped in {method}: {trap}"),
            None => format!("failed in {method}: {error}"),
        };
        if let Some(panic) = panic {
            what = format!("{what} ({panic})");
        }
        self.fault(what)
    }

    fn fault(&mut self, what: String) -> SourceFault {
        self.faults += 1;
        let fault = SourceFault {
            source: self.name.to_string(),
            what,
        };
        let max_faults = self.plugin.limits().max_faults;
        tracing::warn!(policy = %self.name, faults = self.faults, max_faults, "policy {}", fault.what);
        if self.faults >= max_faults && !self.quarantined {
            self.quarantined = true;
            self.live = None;
            tracing::warn!(
                policy = %self.name,
                "policy `{}` quarantined after {} faults; speculation is off for the rest of this run (last fault: {})",
                self.name,
                self.faults,
                fault.what
            );
        }
        fault
    }

    /// The live instance and its session, opening one if needed.
    fn session(&mut self) -> Result<Option<(&mut Live, ResourceAny)>, SourceFault> {
        if self.quarantined || self.opening.is_none() {
            return Ok(None);
        }
        match self.ensure_session() {
            Ok(()) => {}
            Err(OpenFailure::Trapped(fault)) => return Err(fault),
            Err(OpenFailure::Rejected(what)) => {
                // Checked at startup; a policy that changes its mind is faulty.
                return Err(self.fault(what));
            }
        }
        let Some(live) = self.live.as_mut() else {
            return Ok(None);
        };
        Ok(live.session.map(|session| (live, session)))
    }
}

/// Why a session could not be opened.
enum OpenFailure {
    /// The policy rejected its configuration: the message to show.
    Rejected(String),
    /// The instance trapped.
    Trapped(SourceFault),
}

impl RoundPolicy for PluginPolicy {
    fn name(&self) -> &str {
        &self.name
    }

    fn begin(&mut self, facts: &ModelFacts, setup: &PolicySetup) -> Result<(), SourceFault> {
        self.end();
        self.opening = Some(Opening {
            facts: bindings::ModelFacts::from(facts),
            setup: bindings::PolicySetup::from(setup),
        });
        self.session().map(drop)
    }

    fn wants_text(&self) -> bool {
        self.wants_text && !self.quarantined
    }

    fn observe(&mut self, round: &RoundRecord) -> Result<(), SourceFault> {
        let deadline_ticks = self.deadline_ticks;
        let Some((live, session)) = self.session()? else {
            return Ok(());
        };
        arm_call(&mut live.store, deadline_ticks);
        let record = bindings::RoundRecord::from(round);
        let api = live.policy.spechost_drafter_policy_api();
        match api
            .policy_session()
            .call_observe(&mut live.store, session, &record)
        {
            Ok(()) => Ok(()),
            Err(error) => Err(self.trap("observe", &error)),
        }
    }

    fn decide(&mut self) -> Result<Decision, SourceFault> {
        let deadline_ticks = self.deadline_ticks;
        let Some((live, session)) = self.session()? else {
            return Ok(Decision::default());
        };
        arm_call(&mut live.store, deadline_ticks);
        let api = live.policy.spechost_drafter_policy_api();
        match api.policy_session().call_decide(&mut live.store, session) {
            Ok(decision) => Ok(Decision::from(decision)),
            Err(error) => Err(self.trap("decide", &error)),
        }
    }

    fn end(&mut self) {
        self.opening = None;
        let Some(live) = self.live.as_mut() else {
            return;
        };
        let Some(session) = live.session.take() else {
            return;
        };
        arm_call(&mut live.store, self.deadline_ticks);
        if let Err(error) = session.resource_drop(&mut live.store) {
            self.trap("drop", &error);
        }
    }
}

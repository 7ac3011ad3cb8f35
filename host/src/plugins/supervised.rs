//! [`Supervised`]: one plugin instance under the host's supervision, for drafters and policies
//! alike.
//!
//! Every guest call goes through it, in this order:
//! 1. **instantiate** when no instance is running (at the first call, or after a trap), counting
//!    a restart when the last one trapped;
//! 2. **open** the request's session if it is not open, then **catch up** (a drafter replays
//!    the context it was fed; a policy starts from scratch and says whether it wants text); a
//!    plugin that rejects its config is not called again until the next request;
//! 3. **call** with the deadline armed;
//! 4. on a trap, drop the `Store` and **describe** what happened (the deadline, the memory
//!    limit, host work done on the plugin's behalf, or the guest's panic message); the next
//!    call starts over at step 1;
//! 5. **fault**: every trap, rejected config or invalid result (the caller's to judge) is
//!    counted and warned about, naming the plugin; at `max_faults` the plugin is
//!    **quarantined** for the run, with one warning saying what that means.
//!
//! What differs between drafters and policies comes from their [`World`]; what their calls
//! mean (a proposal, a decision) is for [`PluginSource`](super::PluginSource) and
//! [`PluginPolicy`](super::PluginPolicy).

use std::time::Duration;

use wasmtime::component::ResourceAny;
use wasmtime::{Store, Trap};

use super::error::LoadError;
use super::loaded::Loaded;
use super::sandbox::{
    HostState, SandboxLimits, arm_call, enforce_deadline, format_bytes, format_duration, sanitize,
};
use super::world::World;
use crate::cascade::SourceFault;
use crate::placement::thread_cpu_time;

/// Longest error string from a plugin's `open` kept in a fault, in characters.
const MAX_GUEST_ERROR_CHARS: usize = 500;

/// A guest call, named as in the WIT (the `method` field of logs and fault messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Creating the instance (its start-up code runs then).
    Instantiate,
    /// A session's `open`.
    Open,
    /// A drafter's `feed`.
    Feed,
    /// A drafter's `propose`.
    Propose,
    /// A drafter's `feedback`.
    Feedback,
    /// A drafter's `checkpoint`.
    Checkpoint,
    /// A drafter's `observe-response`.
    ObserveResponse,
    /// A policy's `wants-text`.
    WantsText,
    /// A policy's `observe`.
    Observe,
    /// A policy's `decide`.
    Decide,
    /// Closing a session (dropping its resource).
    Drop,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Instantiate => "instantiate",
            Method::Open => "open",
            Method::Feed => "feed",
            Method::Propose => "propose",
            Method::Feedback => "feedback",
            Method::Checkpoint => "checkpoint",
            Method::ObserveResponse => "observe-response",
            Method::WantsText => "wants-text",
            Method::Observe => "observe",
            Method::Decide => "decide",
            Method::Drop => "drop",
        }
    }
}

/// A running instance: its store, its exports, and the open session if any.
struct Live<W: World> {
    store: Store<HostState>,
    instance: W::Instance,
    session: Option<ResourceAny>,
}

/// The current request, between `begin` and `end`.
struct Request<W: World> {
    state: W::Request,
    /// The plugin's `open` returned `Err` for this request: do not call it again until `begin`.
    rejected: bool,
}

/// One plugin instance under supervision; see the [module docs](self) for the order of things.
pub(super) struct Supervised<W: World> {
    plugin: Loaded<W>,
    config: String,
    limits: SandboxLimits,
    /// `None` after a trap, until the next call that needs the plugin.
    live: Option<Live<W>>,
    /// The last instance trapped; the next one to be created counts as a restart.
    crashed: bool,
    request: Option<Request<W>>,
    faults: u32,
    restarts: u32,
    quarantined: bool,
    last_fault: Option<SourceFault>,
    /// The largest linear memory of the instances dropped so far.
    dropped_peak_memory: usize,
}

impl<W: World> Supervised<W> {
    /// `plugin` with `config` under `limits`, with no instance yet: the first call that needs
    /// one creates it.
    pub(super) fn new(plugin: Loaded<W>, config: String, limits: SandboxLimits) -> Self {
        Self {
            plugin,
            config,
            limits,
            live: None,
            crashed: false,
            request: None,
            faults: 0,
            restarts: 0,
            quarantined: false,
            last_fault: None,
            dropped_peak_memory: 0,
        }
    }

    /// Creates the instance now if it can, so that state it keeps outside sessions lives from
    /// now on. If it cannot, the next call that needs it tries again and reports the fault then.
    pub(super) fn start_instance(&mut self) {
        if self.live.is_none() {
            self.live = self.instantiate().ok();
        }
    }

    /// Checks that `plugin` can be instantiated under `limits` (its initial memory fits, its
    /// start-up code runs within the start-up deadline); returns the CPU time starting took.
    pub(super) fn check_starts(
        plugin: &Loaded<W>,
        limits: &SandboxLimits,
    ) -> Result<Duration, LoadError> {
        let probe = Self::new(plugin.clone(), String::new(), limits.clone());
        let started = thread_cpu_time();
        probe
            .instantiate()
            .map(|_| thread_cpu_time().saturating_sub(started))
            .map_err(|error| LoadError::Instantiate {
                plugin: plugin.name().to_owned(),
                reason: describe_failure(Method::Instantiate, &error, None, None, limits),
            })
    }

    /// Opens and closes one session of `plugin` with `config` for `request`, in a throw-away
    /// instance: a config the plugin rejects is a [`LoadError::Config`].
    pub(super) fn check_config(
        plugin: &Loaded<W>,
        config: &str,
        request: W::Request,
        limits: &SandboxLimits,
    ) -> Result<(), LoadError> {
        let mut probe = Self::new(plugin.clone(), config.to_owned(), limits.clone());
        let opened = probe.begin(request);
        let rejected = probe
            .request
            .as_ref()
            .is_some_and(|request| request.rejected);
        probe.end();
        match opened {
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

    /// The plugin's name, as warnings and stats show it.
    pub(super) fn name(&self) -> &str {
        self.plugin.name()
    }

    /// The plugin this instance runs.
    pub(super) fn plugin(&self) -> &Loaded<W> {
        &self.plugin
    }

    /// Faults so far: traps, time-outs, memory-limit hits, rejected configs, invalid results.
    pub(super) fn faults(&self) -> u32 {
        self.faults
    }

    /// Times the instance was re-created after a trap.
    pub(super) fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Whether the plugin reached `max_faults` and is no longer called.
    pub(super) fn is_quarantined(&self) -> bool {
        self.quarantined
    }

    /// The most recent fault, if any.
    pub(super) fn last_fault(&self) -> Option<&SourceFault> {
        self.last_fault.as_ref()
    }

    /// The largest size, in bytes, a linear memory of this plugin's instances has had so far
    /// (those dropped after a trap included).
    pub(super) fn peak_memory(&self) -> usize {
        let live = self
            .live
            .as_ref()
            .map_or(0, |live| live.store.data().limiter.peak_memory());
        self.dropped_peak_memory.max(live)
    }

    /// Drops the running instance, if any, remembering its peak memory.
    fn drop_instance(&mut self) -> Option<Live<W>> {
        let live = self.live.take()?;
        self.dropped_peak_memory = self
            .dropped_peak_memory
            .max(live.store.data().limiter.peak_memory());
        Some(live)
    }

    /// The limits this instance runs under.
    /// The running instance's store data, if an instance is running.
    pub(super) fn store_mut(&mut self) -> Option<&mut HostState> {
        self.live.as_mut().map(|live| live.store.data_mut())
    }

    pub(super) fn limits(&self) -> &SandboxLimits {
        &self.limits
    }

    /// The current request; `None` between requests and after quarantine.
    pub(super) fn request(&self) -> Option<&W::Request> {
        self.request.as_ref().map(|request| &request.state)
    }

    /// The current request, to record what a new session must catch up on.
    pub(super) fn request_mut(&mut self) -> Option<&mut W::Request> {
        self.request.as_mut().map(|request| &mut request.state)
    }

    /// Whether guest calls are wanted now: a request is running, its config was accepted, and
    /// the plugin is not quarantined.
    pub(super) fn is_active(&self) -> bool {
        !self.quarantined
            && self
                .request
                .as_ref()
                .is_some_and(|request| !request.rejected)
    }

    /// Whether a session is open in a live instance.
    pub(super) fn has_session(&self) -> bool {
        self.live
            .as_ref()
            .is_some_and(|live| live.session.is_some())
    }

    /// Starts a request: closes the previous session and opens one for `request`.
    pub(super) fn begin(&mut self, request: W::Request) -> Result<(), SourceFault> {
        if self.quarantined {
            return Ok(());
        }
        self.close_session();
        if self.quarantined {
            // Closing the previous session faulted for the last time.
            return Ok(());
        }
        self.request = Some(Request {
            state: request,
            rejected: false,
        });
        self.ensure_session()
    }

    /// Ends the request: closes its session. A fault while closing is recorded, not returned.
    pub(super) fn end(&mut self) {
        self.close_session();
        self.request = None;
    }

    /// Makes sure an instance is running with an open, caught-up session for the current
    /// request (steps 1 and 2 of the [module docs](self)). Does nothing when no call is wanted.
    pub(super) fn ensure_session(&mut self) -> Result<(), SourceFault> {
        if !self.is_active() {
            return Ok(());
        }
        if self.live.is_none() {
            let live = self
                .instantiate()
                .map_err(|error| self.trap(Method::Instantiate, error))?;
            self.live = Some(live);
            if std::mem::take(&mut self.crashed) {
                self.restarts += 1;
                tracing::debug!(
                    plugin = %self.name(),
                    restarts = self.restarts,
                    "restarted plugin instance"
                );
            }
        }
        let (Some(live), Some(request)) = (self.live.as_mut(), self.request.as_mut()) else {
            return Ok(());
        };
        if live.session.is_some() {
            return Ok(());
        }
        arm_call(&mut live.store, self.limits.call_deadline);
        let opened = W::open(
            &live.instance,
            &mut live.store,
            &self.config,
            &request.state,
        );
        let session = match opened {
            Ok(Ok(session)) => session,
            Ok(Err(message)) => {
                request.rejected = true;
                let what = format!(
                    "rejected its configuration {:?}: {}; {}",
                    self.config,
                    sanitize(&message, MAX_GUEST_ERROR_CHARS),
                    W::config_fix(self.plugin.name())
                );
                return Err(self.fault(what));
            }
            Err(error) => return Err(self.trap(Method::Open, error)),
        };
        live.session = Some(session);
        arm_call(&mut live.store, self.limits.call_deadline);
        let caught_up = W::catch_up(&live.instance, &mut live.store, session, &mut request.state);
        caught_up.map_err(|error| self.trap(W::CATCH_UP, error))
    }

    /// Calls `call` on the open session with the deadline armed. `Ok(None)` when no session is
    /// open (none was wanted, or the instance trapped since; reopening is
    /// [`Self::ensure_session`]'s job). A trap becomes the fault returned.
    pub(super) fn call<R>(
        &mut self,
        method: Method,
        call: impl FnOnce(&W::Instance, &mut Store<HostState>, ResourceAny) -> wasmtime::Result<R>,
    ) -> Result<Option<R>, SourceFault> {
        let Some(live) = self.live.as_mut() else {
            return Ok(None);
        };
        let Some(session) = live.session else {
            return Ok(None);
        };
        arm_call(&mut live.store, self.limits.call_deadline);
        match call(&live.instance, &mut live.store, session) {
            Ok(result) => Ok(Some(result)),
            Err(error) => Err(self.trap(method, error)),
        }
    }

    /// Like [`Self::call`], on the instance rather than a session: `Ok(None)` when no instance
    /// is running.
    pub(super) fn call_instance<R>(
        &mut self,
        method: Method,
        call: impl FnOnce(&W::Instance, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<Option<R>, SourceFault> {
        let Some(live) = self.live.as_mut() else {
            return Ok(None);
        };
        arm_call(&mut live.store, self.limits.call_deadline);
        match call(&live.instance, &mut live.store) {
            Ok(result) => Ok(Some(result)),
            Err(error) => Err(self.trap(method, error)),
        }
    }

    /// Counts a fault `what` (the plugin did something wrong, "proposed token 7 ..."), warns
    /// naming the plugin, and quarantines it at `max_faults`.
    pub(super) fn fault(&mut self, what: String) -> SourceFault {
        self.faults += 1;
        let fault = SourceFault {
            source: self.name().to_owned(),
            what,
        };
        tracing::warn!(
            plugin = %self.name(),
            faults = self.faults,
            max_faults = self.limits.max_faults,
            "{} `{}` {}",
            W::NOUN,
            self.name(),
            fault.what
        );
        if self.faults >= self.limits.max_faults && !self.quarantined {
            self.quarantined = true;
            self.drop_instance();
            self.request = None;
            tracing::warn!(
                plugin = %self.name(),
                faults = self.faults,
                last_fault = %fault.what,
                "{} `{}` quarantined after {} faults; {} (last fault: {})",
                W::NOUN,
                self.name(),
                self.faults,
                W::QUARANTINE_MEANS,
                fault.what
            );
        }
        self.last_fault = Some(fault.clone());
        fault
    }

    /// A fresh store and instance.
    fn instantiate(&self) -> wasmtime::Result<Live<W>> {
        let mut store = Store::new(
            self.plugin.engine(),
            HostState::new(
                self.plugin.shared_name(),
                &self.limits,
                W::services(self.plugin.extras()),
            ),
        );
        store.limiter(|state| &mut state.limiter);
        enforce_deadline(&mut store);
        arm_call(&mut store, self.limits.start_deadline);
        let instance = W::instantiate(self.plugin.pre(), &mut store)?;
        Ok(Live {
            store,
            instance,
            session: None,
        })
    }

    /// Closes the open session, if any. A fault while closing is recorded, not returned.
    fn close_session(&mut self) {
        let Some(live) = self.live.as_mut() else {
            return;
        };
        let Some(session) = live.session.take() else {
            return;
        };
        arm_call(&mut live.store, self.limits.call_deadline);
        if let Err(error) = session.resource_drop(&mut live.store) {
            self.trap(Method::Drop, error);
        }
    }

    /// Records a trap in `method`: the instance is dropped, to be re-created on next use.
    fn trap(&mut self, method: Method, error: wasmtime::Error) -> SourceFault {
        self.crashed = true;
        let interrupted = matches!(error.downcast_ref::<Trap>(), Some(Trap::Interrupt));
        let (refused_memory, panic, overrun) = match self.drop_instance() {
            Some(mut live) => {
                let overrun = interrupted
                    .then(|| live.store.data().clock.overrun(method.as_str()))
                    .flatten();
                (
                    live.store.data_mut().limiter.take_refusal(),
                    live.store.data().last_panic(),
                    overrun,
                )
            }
            None => (None, None, None),
        };
        let what = overrun.unwrap_or_else(|| {
            describe_failure(
                method,
                &error,
                refused_memory,
                panic.as_deref(),
                &self.limits,
            )
        });
        tracing::debug!(plugin = %self.name(), method = method.as_str(), "trap detail: {error:?}");
        self.fault(what)
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
    let name = method.as_str();
    if let Some(desired) = refused_memory {
        return format!(
            "exceeded its {} memory limit in {name} (tried to grow a memory to {})",
            format_bytes(limits.memory_limit),
            format_bytes(desired)
        );
    }
    let cause = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) if method == Method::Instantiate => {
            return format!(
                "exceeded its {} start-up deadline in {name}",
                format_duration(limits.start_deadline)
            );
        }
        Some(Trap::Interrupt) => {
            return format!(
                "exceeded its {} deadline in {name}",
                format_duration(limits.call_deadline)
            );
        }
        Some(trap) => {
            let text = trap.to_string();
            format!(
                "trapped in {name}: {}",
                text.strip_prefix("wasm trap: ").unwrap_or(&text)
            )
        }
        None => format!("failed in {name}: {error}"),
    };
    match panic {
        Some(panic) => format!("{cause} ({panic})"),
        None => cause,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            describe_failure(Method::Decide, &deadline, None, None, &short),
            "exceeded its 10 ms deadline in decide"
        );
        assert_eq!(
            describe_failure(Method::Instantiate, &deadline, None, None, &short),
            "exceeded its 500 ms start-up deadline in instantiate"
        );
    }
}

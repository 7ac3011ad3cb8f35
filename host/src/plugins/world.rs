//! The two kinds of plugin as types: [`DrafterWorld`] (WIT world `drafter`: a cascade source)
//! and [`PolicyWorld`] (WIT world `policy`: a draft-length policy).
//!
//! Loading ([`Loaded`](super::Loaded)) and supervision (`Supervised`: deadlines, traps, faults,
//! restarts, quarantine) are written once, generic over a [`World`]. This module holds only
//! what differs between the two worlds: the generated bindings of an instance, how a session
//! opens and catches up after a restart (a drafter replays its context, a policy starts from
//! scratch and says whether it wants text), what a loaded plugin carries besides its component,
//! and how messages name it.

use std::sync::{Arc, OnceLock};

use wasmtime::Store;
use wasmtime::component::{InstancePre, ResourceAny};

use super::bindings::{self, Drafter, DrafterPre, Policy, PolicyPre};
use super::registry::PluginKind;
use super::sandbox::{HostState, Services};
use super::state::StateSlot;
use super::supervised::Method;
use crate::cascade::{DraftModelCosts, DraftModelFactory, ModelFacts, PolicySetup, Token};

/// A kind of plugin: one world of the WIT. Sealed: [`DrafterWorld`] and [`PolicyWorld`] are the
/// only two.
pub trait World: sealed::WorldBindings {}

/// Drafters: components of the WIT world `drafter`, run as cascade sources
/// ([`PluginSource`](super::PluginSource)).
#[derive(Debug)]
pub enum DrafterWorld {}

/// Draft-length policies: components of the WIT world `policy`
/// ([`PluginPolicy`](super::PluginPolicy)).
#[derive(Debug)]
pub enum PolicyWorld {}

impl World for DrafterWorld {}
impl World for PolicyWorld {}

/// The draft model, attached to the host once it is loaded (after the plugins, so that a
/// misspelt cascade fails before any model loads) and seen by every drafter loaded from it.
pub(super) type DraftModelCell = Arc<OnceLock<AttachedDraftModel>>;

/// The draft model as the plugin host holds it.
pub(super) struct AttachedDraftModel {
    /// Opens a context per plugin instance.
    pub(super) factory: Arc<dyn DraftModelFactory>,
    /// What drafting with it costs, if it was measured.
    pub(super) costs: Option<DraftModelCosts>,
}

/// What a loaded drafter holds besides its component.
pub struct DrafterExtras {
    /// The plugin's cross-request state, shared by all its instances.
    pub(super) state: StateSlot,
    pub(super) draft_model: DraftModelCell,
    /// Whether the component imports `draft-model` (it then counts as an expensive source).
    pub(super) uses_draft_model: bool,
}

/// A drafter's current request: what its session opens with, and everything fed so far, which
/// is replayed into a new instance after a trap.
pub struct DrafterRequest {
    pub(super) facts: bindings::ModelFacts,
    /// The prompt, then every token fed since.
    pub(super) context: Vec<Token>,
    /// How many of `context`'s tokens are the prompt.
    prompt_len: usize,
}

/// A policy's current request: what its session opens with, and whether the open session asked
/// for committed text.
pub struct PolicyRequest {
    pub(super) facts: bindings::ModelFacts,
    pub(super) setup: bindings::PolicySetup,
    pub(super) wants_text: bool,
}

impl DrafterRequest {
    /// A request whose session opens with `facts` and is first fed `prompt`.
    pub(super) fn new(facts: &ModelFacts, prompt: &[Token]) -> Self {
        Self {
            facts: bindings::ModelFacts::from(facts),
            context: prompt.to_vec(),
            prompt_len: prompt.len(),
        }
    }
}

impl PolicyRequest {
    /// A request whose session opens with `facts` and `setup`.
    pub(super) fn new(facts: &ModelFacts, setup: &PolicySetup) -> Self {
        Self {
            facts: bindings::ModelFacts::from(facts),
            setup: bindings::PolicySetup::from(setup),
            wants_text: false,
        }
    }
}

pub(super) mod sealed {
    use super::*;

    /// What a [`World`](super::World) stands for. Public in a private module, so that only this
    /// crate can implement it.
    pub trait WorldBindings: Sized + 'static {
        /// How the registry and load errors call this kind.
        const KIND: PluginKind;
        /// How warnings name a plugin of this kind: "draft source `lookup` trapped ...".
        const NOUN: &'static str;
        /// What quarantine means for generation, for the warning that announces it.
        const QUARANTINE_MEANS: &'static str;
        /// The guest call [`WorldBindings::catch_up`] makes, for the fault if it traps.
        const CATCH_UP: Method;

        /// A component linked against the sandbox's imports, cheap to instantiate.
        type Pre: Send + Sync;
        /// The generated exports of one instance.
        type Instance: Send;
        /// What a loaded plugin of this kind holds besides its component.
        type Extras: Send + Sync;
        /// The current request: what a session opens with and what it must catch up on.
        type Request: Send;

        /// Checks that a linked component has this world's exports.
        fn pre(instance_pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre>;

        /// A fresh instance in `store`.
        fn instantiate(
            pre: &Self::Pre,
            store: &mut Store<HostState>,
        ) -> wasmtime::Result<Self::Instance>;

        /// The host services an instance of this kind gets.
        fn services(extras: &Self::Extras) -> Services;

        /// Calls the guest's `open` for `request`: `Ok(Err(..))` is the plugin rejecting
        /// `config`.
        fn open(
            instance: &Self::Instance,
            store: &mut Store<HostState>,
            config: &str,
            request: &Self::Request,
        ) -> wasmtime::Result<Result<ResourceAny, String>>;

        /// Brings a session that has just opened up to date, in at most one guest call
        /// ([`WorldBindings::CATCH_UP`]).
        fn catch_up(
            instance: &Self::Instance,
            store: &mut Store<HostState>,
            session: ResourceAny,
            request: &mut Self::Request,
        ) -> wasmtime::Result<()>;

        /// How the user fixes a configuration that plugin `name` rejected.
        fn config_fix(name: &str) -> String;
    }
}

impl sealed::WorldBindings for DrafterWorld {
    const KIND: PluginKind = PluginKind::Drafter;
    const NOUN: &'static str = "draft source";
    const QUARANTINE_MEANS: &'static str = "it will not be called again this run";
    const CATCH_UP: Method = Method::Feed;

    type Pre = DrafterPre<HostState>;
    type Instance = Drafter;
    type Extras = DrafterExtras;
    type Request = DrafterRequest;

    fn pre(instance_pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre> {
        DrafterPre::new(instance_pre)
    }

    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Drafter> {
        pre.instantiate(store)
    }

    fn services(extras: &DrafterExtras) -> Services {
        Services {
            state: Some(extras.state.clone()),
            draft_model: extras
                .draft_model
                .get()
                .map(|attached| Arc::clone(&attached.factory)),
        }
    }

    fn open(
        drafter: &Drafter,
        store: &mut Store<HostState>,
        config: &str,
        request: &DrafterRequest,
    ) -> wasmtime::Result<Result<ResourceAny, String>> {
        let api = drafter.spechost_drafter_drafter_api();
        api.session().call_open(store, config, &request.facts)
    }

    /// Feeds the prompt, even an empty one, as the WIT promises the first feed is; after a
    /// trap, then feeds all that followed it in one more `feed`.
    fn catch_up(
        drafter: &Drafter,
        store: &mut Store<HostState>,
        session: ResourceAny,
        request: &mut DrafterRequest,
    ) -> wasmtime::Result<()> {
        let api = drafter.spechost_drafter_drafter_api();
        let (prompt, response) = request.context.split_at(request.prompt_len);
        api.session().call_feed(&mut *store, session, prompt)?;
        if response.is_empty() {
            return Ok(());
        }
        api.session().call_feed(store, session, response)
    }

    fn config_fix(name: &str) -> String {
        format!("fix the `{name}.key=value` plugin config")
    }
}

impl sealed::WorldBindings for PolicyWorld {
    const KIND: PluginKind = PluginKind::Policy;
    const NOUN: &'static str = "policy";
    const QUARANTINE_MEANS: &'static str = "speculation is off for the rest of this run";
    const CATCH_UP: Method = Method::WantsText;

    type Pre = PolicyPre<HostState>;
    type Instance = Policy;
    type Extras = ();
    type Request = PolicyRequest;

    fn pre(instance_pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre> {
        PolicyPre::new(instance_pre)
    }

    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Policy> {
        pre.instantiate(store)
    }

    /// Policies get logging only: no state, no draft model.
    fn services(_extras: &()) -> Services {
        Services::default()
    }

    fn open(
        policy: &Policy,
        store: &mut Store<HostState>,
        config: &str,
        request: &PolicyRequest,
    ) -> wasmtime::Result<Result<ResourceAny, String>> {
        let api = policy.spechost_drafter_policy_api();
        api.policy_session()
            .call_open(store, config, &request.facts, &request.setup)
    }

    /// Asks the new session whether it wants committed text. A policy's session starts from
    /// scratch after a restart: nothing is replayed.
    fn catch_up(
        policy: &Policy,
        store: &mut Store<HostState>,
        session: ResourceAny,
        request: &mut PolicyRequest,
    ) -> wasmtime::Result<()> {
        let api = policy.spechost_drafter_policy_api();
        request.wants_text = api.policy_session().call_wants_text(store, session)?;
        Ok(())
    }

    fn config_fix(name: &str) -> String {
        format!(
            "fix the settings after `{name},` (in `--policy`, the config file's `policy`, or a \
             request's `speculative.policy`)"
        )
    }
}

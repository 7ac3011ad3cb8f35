//! The WIT `draft-model` import: a plugin instance's handle on the host's draft model.
//!
//! Each instance gets its own [`DraftModel`] context, opened from the process's
//! [`DraftModelFactory`] at the instance's first call that needs one (plugins that never touch
//! the bridge never cost a context). The time the host spends in these calls is credited back to
//! the guest call's deadline (see `sandbox::CallClock`): the deadline bounds the plugin's own
//! code, not the native model it asked to run.

use std::sync::Arc;
use std::time::Instant;

use super::bindings::{DraftModelHost, DraftedToken};
use super::sandbox::HostState;
use crate::cascade::{DraftModel, DraftModelFactory, Token};

/// Longest draft a plugin may ask the draft model for in one call; a larger `max-draft-len` is cut.
pub const MAX_BRIDGE_DRAFT_LEN: usize = 256;

/// The draft model as one instance sees it.
pub(super) struct DraftBridge {
    factory: Option<Arc<dyn DraftModelFactory>>,
    model: Option<Box<dyn DraftModel>>,
    /// Opening a context failed once for this instance: do not retry on every call.
    failed: bool,
}

impl DraftBridge {
    pub(super) fn new(factory: Option<Arc<dyn DraftModelFactory>>) -> Self {
        Self {
            factory,
            model: None,
            failed: false,
        }
    }

    /// The instance's context, opened on first use; `None` without a draft model.
    fn model(&mut self, plugin: &str) -> Option<&mut Box<dyn DraftModel>> {
        if self.model.is_none() && !self.failed {
            let factory = self.factory.as_ref()?;
            match factory.open() {
                Ok(model) => self.model = Some(model),
                Err(reason) => {
                    self.failed = true;
                    tracing::warn!(
                        plugin,
                        "cannot open a draft-model context: {reason}; the plugin gets no draft tokens"
                    );
                }
            }
        }
        self.model.as_mut()
    }
}

impl HostState {
    /// Runs `call` on the draft model, crediting its time back to the guest's deadline.
    fn with_draft_model<T>(
        &mut self,
        default: T,
        call: impl FnOnce(&mut dyn DraftModel) -> T,
    ) -> T {
        let started = Instant::now();
        let result = match self.draft.model(&self.name) {
            Some(model) => call(model.as_mut()),
            None => default,
        };
        self.clock.credit(started.elapsed());
        result
    }
}

impl DraftModelHost for HostState {
    fn available(&mut self) -> bool {
        self.draft.factory.is_some() && !self.draft.failed
    }

    fn reset(&mut self) {
        self.with_draft_model((), |model| model.reset());
    }

    fn feed(&mut self, tokens: Vec<Token>) {
        self.with_draft_model((), |model| model.feed(&tokens));
    }

    fn propose(&mut self, max_draft_len: u32, p_min: f32) -> Vec<DraftedToken> {
        let max_draft_len = (max_draft_len as usize).min(MAX_BRIDGE_DRAFT_LEN);
        let p_min = if p_min.is_finite() { p_min } else { 0.0 };
        self.with_draft_model(Vec::new(), |model| {
            model
                .propose(max_draft_len, p_min)
                .into_iter()
                .map(DraftedToken::from)
                .collect()
        })
    }
}

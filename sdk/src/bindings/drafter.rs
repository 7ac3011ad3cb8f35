//! The only code generated from `wit/drafter.wit`, and the glue between it and [`Drafter`].
//!
//! `wit_bindgen::generate!` runs once, in the private `generated` module. Nothing generated
//! appears in a public signature: [`SessionCell`] implements the generated session trait for any
//! [`Drafter`], converting WIT records to and from the plain types of [`crate::types`], and
//! [`crate::export_drafter!`] reaches it through the hidden `__private` module.
//!
//! Proposals pass through unchanged, even invalid ones: checking them is the host's job (it must
//! distrust every plugin anyway), and hostile test plugins rely on reaching it unfiltered.

use std::cell::RefCell;

use crate::drafter::Drafter;
use crate::types::{Feedback, ModelFacts, Proposal, Token};

use self::generated::exports::spechost::drafter::drafter_api as api;
use self::generated::spechost::drafter::types as wit;

// The generated ABI code is unsafe by nature, and its items, reachable only through the hidden
// `__private` module, are not API; both allowances stop at this module.
#[allow(unsafe_code, missing_docs)]
mod generated {
    wit_bindgen::generate!({
        path: "../wit",
        world: "drafter",
        pub_export_macro: true,
        default_bindings_module: "spechost_sdk::__private",
    });
}

pub use self::generated::{export, exports};

/// A drafter as the generated bindings see it: one per session resource.
///
/// wit-bindgen hands exported resource methods `&self`, while [`Drafter`] methods take
/// `&mut self`; the `RefCell` bridges the two. Calls into one instance never overlap, so a borrow
/// can never fail.
pub struct SessionCell<D>(RefCell<D>);

impl<D: Drafter> api::Guest for SessionCell<D> {
    type Session = Self;
}

impl<D: Drafter> api::GuestSession for SessionCell<D> {
    fn open(config: String, facts: wit::ModelFacts) -> Result<api::Session, String> {
        #[cfg(target_arch = "wasm32")]
        forward_panics_to_host_log();
        let drafter = D::new(&config, &model_facts(facts))?;
        Ok(api::Session::new(SessionCell(RefCell::new(drafter))))
    }

    fn feed(&self, tokens: Vec<Token>) {
        self.0.borrow_mut().feed(&tokens);
    }

    fn propose(&self, max_len: u32) -> wit::Proposal {
        // `usize` has at least 32 bits on every target spechost plugins build for.
        let max_len = usize::try_from(max_len).unwrap_or(usize::MAX);
        let Proposal { tokens, confidence } = self.0.borrow_mut().propose(max_len);
        wit::Proposal { tokens, confidence }
    }

    fn feedback(&self, outcome: wit::Feedback) {
        self.0.borrow_mut().feedback(Feedback {
            won: outcome.won,
            n_accepted: outcome.n_accepted,
            target_token: outcome.target_token,
        });
    }
}

/// Fails to compile unless `D` implements [`Drafter`]; lets [`crate::export_drafter!`] report a
/// readable error, and check the type natively, where nothing is exported.
pub const fn assert_drafter<D: Drafter>() {}

fn model_facts(facts: wit::ModelFacts) -> ModelFacts {
    let wit::ModelFacts {
        vocab_size,
        bos,
        eos,
        eog,
        context_size,
    } = facts;
    ModelFacts {
        vocab_size,
        bos,
        eos,
        eog,
        context_size,
    }
}

/// Makes every panic also log its message and location at error level, before the default hook
/// runs and the instance traps.
///
/// Runs at the start of every session, so before any other guest code. Without it the host
/// would see only "unreachable executed": a sandboxed plugin's stderr is usually discarded.
#[cfg(target_arch = "wasm32")]
fn forward_panics_to_host_log() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info.payload_as_str().unwrap_or("(non-string payload)");
            let line = match info.location() {
                Some(location) => format!("panicked at {location}: {message}"),
                None => format!("panicked: {message}"),
            };
            host_log(crate::log::Level::Error, &line);
            default_hook(info);
        }));
    });
}

/// Sends a log line through the host's `log` import.
#[cfg(target_arch = "wasm32")]
pub(crate) fn host_log(level: crate::log::Level, message: &str) {
    use self::generated::spechost::drafter::host;
    use crate::log::Level;

    let level = match level {
        Level::Trace => host::Level::Trace,
        Level::Debug => host::Level::Debug,
        Level::Info => host::Level::Info,
        Level::Warn => host::Level::Warn,
        Level::Error => host::Level::Error,
    };
    host::log(level, message);
}

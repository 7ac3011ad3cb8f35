//! Hostile drafter: a plugin built against the retired WIT `spechost:drafter@0.1.0` (the copy in
//! `wit/` is the file as it stood at that version), exporting `drafter-api@0.1.0`. It works under
//! that contract; this host speaks 0.3 and must refuse to load it, naming the SDK version to
//! rebuild with.
//!
//! Bindings come from `wit_bindgen` directly: `spechost-sdk` only generates the current version.

// The generated ABI glue is unsafe by nature; this module holds nothing else.
#[allow(unsafe_code, missing_docs)]
mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "drafter",
    });

    #[cfg(target_arch = "wasm32")]
    use super::OldDrafter;
    #[cfg(target_arch = "wasm32")]
    export!(OldDrafter);
}

use bindings::exports::spechost::drafter::drafter_api::{
    Feedback, Guest, GuestSession, ModelFacts, Proposal, Session, Token,
};

/// The exported `drafter-api@0.1.0`: sessions that propose nothing.
pub struct OldDrafter;

impl Guest for OldDrafter {
    type Session = OldSession;
}

/// One 0.1.0 session.
pub struct OldSession;

impl GuestSession for OldSession {
    fn open(_config: String, _facts: ModelFacts) -> Result<Session, String> {
        Ok(Session::new(OldSession))
    }

    fn feed(&self, _tokens: Vec<Token>) {}

    fn propose(&self, _max_len: u32) -> Proposal {
        Proposal {
            tokens: Vec::new(),
            confidence: Vec::new(),
        }
    }

    fn feedback(&self, _outcome: Feedback) {}
}

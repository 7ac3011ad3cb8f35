//! A drafter built against `spechost:drafter@0.8.0`, before the `tree` import: it proposes what
//! followed the latest earlier occurrence of the context's last two tokens. A 0.8.1 host links
//! it unchanged (a patch of the same minor), and its proposals are chains.
//!
//! Bindings come from `wit_bindgen` directly: `spechost-sdk` only generates the current version.

use std::cell::RefCell;

// The generated ABI glue is unsafe by nature; this module holds nothing else.
#[allow(unsafe_code, missing_docs)]
mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "drafter",
        generate_all,
    });

    #[cfg(target_arch = "wasm32")]
    use super::Bigram;
    #[cfg(target_arch = "wasm32")]
    export!(Bigram);
}

use bindings::exports::spechost::drafter::drafter_api::{
    Feedback, Guest, GuestSession, ModelFacts, Proposal, Session, Token,
};

/// The exported `drafter-api@0.8.0`.
pub struct Bigram;

impl Guest for Bigram {
    type Session = BigramSession;

    fn checkpoint() {}

    fn observe_response(_response: Vec<Token>) {}
}

/// One session: the context fed so far.
pub struct BigramSession {
    context: RefCell<Vec<Token>>,
}

impl GuestSession for BigramSession {
    fn open(_config: String, _facts: ModelFacts) -> Result<Session, String> {
        Ok(Session::new(BigramSession {
            context: RefCell::new(Vec::new()),
        }))
    }

    fn feed(&self, tokens: Vec<Token>) {
        self.context.borrow_mut().extend(tokens);
    }

    fn propose(&self, max_draft_len: u32) -> Proposal {
        let context = self.context.borrow();
        let len = context.len();
        let tokens = match context.get(len.saturating_sub(2)..) {
            Some(last @ [_, _]) => (0..len - 2)
                .rev()
                .find(|&start| context[start..start + 2] == *last)
                .map(|start| {
                    let from = start + 2;
                    context[from..(from + max_draft_len as usize).min(len)].to_vec()
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        Proposal {
            tokens,
            confidence: Vec::new(),
        }
    }

    fn feedback(&self, _outcome: Feedback) {}
}

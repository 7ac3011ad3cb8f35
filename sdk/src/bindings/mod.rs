//! The only code generated from `wit/drafter.wit`, and the glue between it and the SDK's traits.
//!
//! `wit_bindgen::generate!` runs twice, once per world, each in its own module: `drafter_world`
//! (world `drafter`: imports `host`, `state`, `draft-model` and `tree`, exports `drafter-api`) and
//! `policy_world` (world `policy`: imports `host`, exports `policy-api`). The second reuses the
//! first's `types` and `host` interfaces through `with:`, so each WIT type exists once in Rust.
//! Both calls are written by `build.rs`, because `with:` keys carry the package version and the
//! version is written once, in `version.rs`.
//!
//! The records and the `level` enum are used as generated: [`crate::records`] and [`crate::log`]
//! re-export them by name, so they pass between the traits and the host with no conversion.
//! The rest stays private: [`drafter::SessionCell`] implements the generated drafter traits for
//! any [`crate::Drafter`], [`policy::PolicyCell`] the policy traits for any [`crate::Policy`],
//! and the export macros reach them through the hidden `__private` module. The import wrappers
//! used by [`crate::log`], [`crate::state`], [`crate::draft_model`] and [`crate::tree`] on `wasm32`
//! live here too.

pub mod drafter;
pub mod policy;

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// Makes every panic also log its message and location at error level, before the default hook
/// runs and the instance traps.
///
/// Runs at the start of every export that can come first (opening a session, a checkpoint, an
/// observed response), so before any other guest code. Without it the host would see only
/// "unreachable executed": a sandboxed plugin's stderr is usually discarded.
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

/// Natively a panic already prints to the terminal; nothing to forward.
#[cfg(not(target_arch = "wasm32"))]
fn forward_panics_to_host_log() {}

/// Sends a log line through the host's `log` import.
#[cfg(target_arch = "wasm32")]
pub(crate) fn host_log(level: crate::log::Level, message: &str) {
    self::drafter_world::spechost::drafter::host::log(level, message);
}

//! [`export_drafter!`](crate::export_drafter) and [`export_policy!`](crate::export_policy): turn
//! a [`Drafter`](crate::Drafter) or [`Policy`](crate::Policy) type into the plugin's exported
//! `drafter-api` or `policy-api` interface.

/// Exports a [`Drafter`](crate::Drafter) type as this plugin's drafter.
///
/// Invoke it once, at the top level of a `cdylib` crate:
///
/// ```
/// use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};
///
/// struct Silent;
///
/// impl Drafter for Silent {
///     fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
///         Ok(Silent)
///     }
///     fn feed(&mut self, _tokens: &[Token]) {}
///     fn propose(&mut self, _max_draft_len: usize) -> Proposal {
///         Proposal::empty()
///     }
/// }
///
/// export_drafter!(Silent);
/// ```
///
/// Built with `cargo build --target wasm32-wasip2`, the crate then becomes a component exporting
/// `spechost:drafter/drafter-api`, each host session backed by one value of the type, and the
/// interface's `checkpoint` and `observe-response` calling
/// [`Drafter::checkpoint`](crate::Drafter::checkpoint) and
/// [`Drafter::observe_response`](crate::Drafter::observe_response). Built for
/// any other target the macro only checks that the type implements `Drafter`, so the same crate
/// also builds natively for unit tests with [`crate::testing::Harness`].
#[macro_export]
macro_rules! export_drafter {
    ($drafter:ty) => {
        // The generated ABI functions are `unsafe extern "C"`, yet this needs no
        // `#[allow(unsafe_code)]`: rustc does not lint code expanded from another crate's macro,
        // and an allow here would clash with a plugin's own `#![forbid(unsafe_code)]`.
        const _: () = {
            $crate::__private::drafter::assert_drafter::<$drafter>();

            #[cfg(target_arch = "wasm32")]
            type SpechostExportedDrafter = $crate::__private::drafter::SessionCell<$drafter>;
            #[cfg(target_arch = "wasm32")]
            $crate::__private::drafter::export!(
                SpechostExportedDrafter with_types_in $crate::__private::drafter
            );
        };
    };
}

/// Exports a [`Policy`](crate::Policy) type as this plugin's adaptive draft-length policy.
///
/// Invoke it once, at the top level of a `cdylib` crate:
///
/// ```
/// use spechost_sdk::{Decision, ModelFacts, Policy, PolicySetup, RoundRecord, export_policy};
///
/// /// Always drafts the most the host allows.
/// struct Greedy(u32);
///
/// impl Policy for Greedy {
///     fn new(_config: &str, _facts: &ModelFacts, setup: &PolicySetup) -> Result<Self, String> {
///         Ok(Greedy(setup.max_draft_len))
///     }
///     fn observe(&mut self, _round: &RoundRecord) {}
///     fn decide(&mut self) -> Decision {
///         Decision::draft(self.0)
///     }
/// }
///
/// export_policy!(Greedy);
/// ```
///
/// Built with `cargo build --target wasm32-wasip2`, the crate then becomes a component exporting
/// `spechost:drafter/policy-api`, each host policy session backed by one value of the type.
/// Built for any other target the macro only checks that the type implements `Policy`, so the
/// crate also builds natively for unit tests with [`crate::testing::PolicyHarness`].
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        // No `#[allow(unsafe_code)]`, for the reason given in `export_drafter!`.
        const _: () = {
            $crate::__private::policy::assert_policy::<$policy>();

            #[cfg(target_arch = "wasm32")]
            type SpechostExportedPolicy = $crate::__private::policy::PolicyCell<$policy>;
            #[cfg(target_arch = "wasm32")]
            $crate::__private::policy::export!(
                SpechostExportedPolicy with_types_in $crate::__private::policy
            );
        };
    };
}

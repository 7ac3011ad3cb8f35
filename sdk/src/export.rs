//! [`export_drafter!`](crate::export_drafter): turns a [`Drafter`](crate::Drafter) type into the
//! plugin's exported `drafter-api` interface.

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
///     fn propose(&mut self, _max_len: usize) -> Proposal {
///         Proposal::empty()
///     }
/// }
///
/// export_drafter!(Silent);
/// ```
///
/// Built with `cargo build --target wasm32-wasip2`, the crate then becomes a component exporting
/// `spechost:drafter/drafter-api`, each host session backed by one value of the type. Built for
/// any other target the macro only checks that the type implements `Drafter`, so the same crate
/// also builds natively for unit tests with [`crate::testing::Harness`].
#[macro_export]
macro_rules! export_drafter {
    ($drafter:ty) => {
        // The generated ABI functions are `unsafe extern "C"`, yet this needs no
        // `#[allow(unsafe_code)]`: rustc does not lint code expanded from another crate's macro,
        // and an allow here would clash with a plugin's own `#![forbid(unsafe_code)]`.
        const _: () = {
            $crate::__private::assert_drafter::<$drafter>();

            #[cfg(target_arch = "wasm32")]
            type SpechostExportedDrafter = $crate::__private::SessionCell<$drafter>;
            #[cfg(target_arch = "wasm32")]
    $crate::__private::export!(SpechostExportedDrafter with_types_in $crate::__private);
        };
    };
}

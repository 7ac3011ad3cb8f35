// The WIT package this SDK speaks, by name and version: the one place Rust code writes the
// version. `build.rs` includes this file too, to check it against `wit/drafter.wit` and to write
// the bindings' `with:` keys from it. No `//!` here: an included file cannot hold inner docs.

/// The WIT package plugins and the host speak, without its version.
pub const WIT_PACKAGE: &str = "spechost:drafter";

/// The version of the [`WIT_PACKAGE`] this SDK builds plugins for (`package` line of
/// `wit/drafter.wit`).
///
/// It is written once, here, because the SDK owns the WIT: the build fails until this constant
/// follows a new `package` line, the host derives every interface name it checks from it
/// (`spechost:drafter/drafter-api@` and this version), and the crate's own version must share its
/// major.minor. So a change to the WIT breaks compilation in two places only: this crate (the
/// version, and the helpers on records that build them field by field) and the host's
/// conversions to its own records (`host/src/plugins/bindings.rs`).
pub const WIT_VERSION: &str = "0.8.2";

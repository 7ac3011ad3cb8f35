//! Writes the SDK's two `wit_bindgen::generate!` calls over `wit/drafter.wit` to
//! `$OUT_DIR/bindings.rs`, which `src/bindings/mod.rs` includes.
//!
//! They are written here rather than in the source because the policy world reuses the drafter
//! world's `types` and `host` interfaces through `with:`, and wit-bindgen keys those by versioned
//! name (`spechost:drafter/types@<version>`), while the version is written once in Rust, in
//! `src/version.rs`. Before writing, the script checks that the WIT declares that version, so
//! a new `package` line fails the build until `WIT_VERSION` follows it.

use std::path::PathBuf;

include!("src/version.rs");

/// The WIT file, relative to the crate: inside it, so that `cargo package` ships it.
const WIT_FILE: &str = "wit/drafter.wit";

fn main() {
    println!("cargo::rerun-if-changed={WIT_FILE}");
    println!("cargo::rerun-if-changed=src/version.rs");

    let wit = std::fs::read_to_string(WIT_FILE)
        .unwrap_or_else(|error| panic!("cannot read {WIT_FILE}: {error}"));
    let package = format!("package {WIT_PACKAGE}@{WIT_VERSION};");
    if !wit.lines().any(|line| line.trim() == package) {
        let found = wit
            .lines()
            .find(|line| line.starts_with("package "))
            .unwrap_or("no `package` line");
        panic!(
            "{WIT_FILE} declares `{found}`, but src/version.rs says `{package}`; set WIT_VERSION \
             in sdk/src/version.rs to the WIT's version (and the workspace version in the root \
             Cargo.toml to its major.minor)"
        );
    }

    let bindings = format!(
        r#"
// The generated ABI code is unsafe by nature. Every record, field, enum and function carries
// the WIT's `///` docs (wit-bindgen copies them); only the export glue the macros reach through
// the hidden `__private` module (`exports`, `Guest*` traits) has none, hence `missing_docs`.
#[allow(unsafe_code, missing_docs)]
pub mod drafter_world {{
    wit_bindgen::generate!({{
        path: "wit",
        world: "drafter",
        pub_export_macro: true,
        default_bindings_module: "spechost_sdk::__private::drafter",
        additional_derives: [PartialEq, Default],
        additional_derives_ignore: ["level"],
    }});
}}

#[allow(unsafe_code, missing_docs)]
pub mod policy_world {{
    wit_bindgen::generate!({{
        path: "wit",
        world: "policy",
        pub_export_macro: true,
        default_bindings_module: "spechost_sdk::__private::policy",
        additional_derives: [PartialEq, Default],
        with: {{
            "{WIT_PACKAGE}/types@{WIT_VERSION}": crate::bindings::drafter_world::spechost::drafter::types,
            "{WIT_PACKAGE}/host@{WIT_VERSION}": crate::bindings::drafter_world::spechost::drafter::host,
        }},
    }});
}}
"#
    );
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let path = out_dir.join("bindings.rs");
    std::fs::write(&path, bindings)
        .unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
}

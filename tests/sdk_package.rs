//! `cargo package -p spechost-sdk` makes a crate a stranger can build plugins with: the WIT
//! ships inside it, and a drafter built against the unpacked `.crate` (not the workspace's
//! `sdk/`) loads in the host and proposes.
//!
//! Offline: the drafter's build uses the workspace's `Cargo.lock` and the registry cache that
//! building the workspace filled. Its build directory is kept under the target directory, so
//! only the first run compiles `wit-bindgen` for `wasm32-wasip2` from scratch.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::wasm_dir;
use spechost::cascade::{DraftSource, ModelFacts};
use spechost::plugins::{PluginHost, PluginHostConfig};

/// The drafter built against the packaged SDK: it proposes its last fed token twice.
const DRAFTER_SOURCE: &str = r#"
use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

struct Echo(Option<Token>);

impl Drafter for Echo {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        Ok(Echo(None))
    }

    fn feed(&mut self, tokens: &[Token]) {
        self.0 = tokens.last().copied().or(self.0);
    }

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        match self.0 {
            Some(last) => Proposal::tokens(vec![last; max_draft_len.min(2)]),
            None => Proposal::empty(),
        }
    }
}

export_drafter!(Echo);
"#;

/// The workspace root: `host/`'s parent.
fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ sits in the workspace root")
}

/// Runs `command` (a `cargo` invocation, for messages), failing the test with its output.
fn run(what: &str, command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("cannot run cargo to {what}: {error}"));
    assert!(
        output.status.success(),
        "cargo failed to {what} ({}):\n{}\nthe build needs the wasm32-wasip2 target (`rustup \
         target add wasm32-wasip2`) and a registry cache filled by building the workspace",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A directory emptied for this run.
fn fresh_dir(path: PathBuf) -> PathBuf {
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path)
        .unwrap_or_else(|error| panic!("cannot create {}: {error}", path.display()));
    path
}

#[test]
fn a_drafter_built_from_the_packaged_sdk_loads_and_proposes() {
    // `<target>/wasm32-wasip2/release` -> `<target>/sdk-package`.
    let scratch = wasm_dir()
        .ancestors()
        .nth(2)
        .expect("the wasm directory is inside the target directory")
        .join("sdk-package");
    let package_dir = fresh_dir(scratch.join("package"));
    run(
        "package spechost-sdk",
        Command::new(env!("CARGO"))
            .current_dir(workspace_root())
            .args([
                "package",
                "-p",
                "spechost-sdk",
                "--allow-dirty",
                "--no-verify",
            ])
            .args(["--offline", "--target-dir"])
            .arg(&package_dir),
    );
    let crate_file = std::fs::read_dir(package_dir.join("package"))
        .expect("cargo package writes <target-dir>/package/")
        .map(|entry| entry.expect("directory entry").path())
        .find(|path| {
            path.extension()
                .is_some_and(|extension| extension == "crate")
        })
        .expect("cargo package made a .crate");

    let unpacked = fresh_dir(scratch.join("unpacked"));
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&crate_file)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .expect("tar runs");
    assert!(
        status.success(),
        "tar could not unpack {}",
        crate_file.display()
    );
    let sdk = std::fs::read_dir(&unpacked)
        .expect("unpacked directory")
        .map(|entry| entry.expect("directory entry").path())
        .next()
        .expect("the .crate holds one directory");
    assert!(
        sdk.join("wit/drafter.wit").is_file(),
        "the packaged SDK at {} lacks wit/drafter.wit",
        sdk.display()
    );

    let drafter = fresh_dir(scratch.join("drafter"));
    let manifest = format!(
        "[package]\nname = \"packaged-drafter\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\
         publish = false\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n[dependencies]\n\
         spechost-sdk = {{ path = {:?} }}\n\n[workspace]\n",
        sdk.display().to_string()
    );
    std::fs::write(drafter.join("Cargo.toml"), manifest).expect("write Cargo.toml");
    std::fs::create_dir_all(drafter.join("src")).expect("create src/");
    std::fs::write(drafter.join("src/lib.rs"), DRAFTER_SOURCE).expect("write src/lib.rs");
    std::fs::copy(
        workspace_root().join("Cargo.lock"),
        drafter.join("Cargo.lock"),
    )
    .expect("copy the workspace's Cargo.lock");
    let build_dir = scratch.join("build");
    run(
        "build a drafter against the packaged SDK",
        Command::new(env!("CARGO"))
            .current_dir(&drafter)
            .args([
                "build",
                "--release",
                "--offline",
                "--target",
                "wasm32-wasip2",
            ])
            .arg("--target-dir")
            .arg(&build_dir),
    );

    let wasm = build_dir.join("wasm32-wasip2/release/packaged_drafter.wasm");
    let host = PluginHost::new(PluginHostConfig::default()).expect("plugin host starts");
    let plugin = host
        .load_file(&wasm)
        .unwrap_or_else(|error| panic!("{error}"));
    let mut source = plugin.source("");
    let facts = ModelFacts {
        vocab_size: 100,
        bos: None,
        eos: None,
        eog: Vec::new(),
        context_size: 4096,
    };
    source.begin(&facts, &[1, 2, 7]).expect("opens");
    let proposal = source.propose(8).expect("proposes");
    assert_eq!(proposal.tokens, [7, 7], "proposal: {proposal:?}");
    assert_eq!(source.faults(), 0, "last fault: {:?}", source.last_fault());
}

//! A plugin author's path from nothing, on the packaged SDK: `cargo package -p spechost-sdk`
//! makes a crate a stranger can build plugins with (the WIT ships inside it); `spechost plugin
//! new` makes a Rust drafter project on the unpacked `.crate` (not the workspace's `sdk/`); its
//! own test passes natively, it builds for `wasm32-wasip2`, passes `spechost plugin check`, and
//! `spechost run` with it gives plain decoding's greedy output, with drafts accepted.
//!
//! Offline: the project's build uses the workspace's `Cargo.lock` and the registry cache that
//! building the workspace filled. Its build directory is kept under the target directory, so
//! only the first run compiles `wit-bindgen` from scratch.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{arg, spechost, wasm_dir};

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

/// Generates from the edit prompt with `cascade`: the text and the stats on stderr.
fn generate(cascade: &str) -> (String, String) {
    let prompt = workspace_root().join("examples/prompts/edit.txt");
    let output = spechost(&[
        "run",
        "--model",
        "smollm2",
        "--threads",
        "2",
        "--max-tokens",
        "64",
        "--cascade",
        cascade,
        "--prompt-file",
        arg(&prompt),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "run --cascade {cascade}: {stderr}");
    (String::from_utf8_lossy(&output.stdout).into_owned(), stderr)
}

#[test]
fn plugin_new_on_the_packaged_sdk_builds_passes_check_and_runs_exactly() {
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

    let projects = fresh_dir(scratch.join("projects"));
    let made = spechost(&[
        "plugin",
        "new",
        "echo-drafter",
        "--dir",
        arg(&projects),
        "--sdk",
        arg(&sdk),
    ]);
    assert!(
        made.status.success(),
        "plugin new: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let project = projects.join("echo-drafter");
    std::fs::copy(
        workspace_root().join("Cargo.lock"),
        project.join("Cargo.lock"),
    )
    .expect("copy the workspace's Cargo.lock");
    let build_dir = scratch.join("build");
    run(
        "run the new project's own test natively",
        Command::new(env!("CARGO"))
            .current_dir(&project)
            .args(["test", "--release", "--offline", "--target-dir"])
            .arg(&build_dir),
    );
    run(
        "build the new project against the packaged SDK",
        Command::new(env!("CARGO"))
            .current_dir(&project)
            .args([
                "build",
                "--release",
                "--offline",
                "--target",
                "wasm32-wasip2",
                "--target-dir",
            ])
            .arg(&build_dir),
    );
    let wasm = build_dir.join("wasm32-wasip2/release/echo_drafter.wasm");

    let checked = spechost(&["plugin", "check", arg(&wasm)]);
    let report = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "plugin check failed:\n{report}");
    assert!(report.ends_with("result: conforms\n"), "{report}");

    let (plain, _) = generate("none");
    let (drafted, stats) = generate(arg(&wasm));
    assert_eq!(drafted, plain, "the new drafter changed the greedy output");
    let accepted = stats
        .lines()
        .find(|line| line.contains("source echo_drafter"))
        .and_then(|line| line.split(" accepted ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|count| count.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no accepted count for echo_drafter in:\n{stats}"));
    assert!(
        accepted > 0,
        "the edit prompt repeats code; stats:\n{stats}"
    );
}

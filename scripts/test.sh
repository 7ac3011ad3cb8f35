#!/usr/bin/env bash
# Runs the whole test suite: builds the plugins and the deliberately broken test plugins,
# fetches both default models (the tests run on real models), installs the openai Python client
# for the server test that uses it, the gguf package for the generated test models and
# componentize-py for the Python example drafter (examples/python-drafter/, built here), then
# `cargo test` in release.
set -euo pipefail
source "$(dirname "$0")/env.sh"
install_prerequisites
install_componentize_py
build_all
build_python_drafter
fetch_models smollm2 gemma3
install_openai_client
install_gguf_writer
cd "$SPECHOST_ROOT"
cargo test --release --locked --workspace --no-fail-fast

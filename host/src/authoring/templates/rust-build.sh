#!/usr/bin/env bash
# Tests {{name}} natively, builds it as a WebAssembly component and checks it against the host:
# `./build.sh` prints the path of the .wasm file to load with `spechost run --{{flag}} PATH`.
set -euo pipefail
cd "$(dirname "$0")"
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    echo "==> adding the wasm32-wasip2 Rust target"
    rustup target add wasm32-wasip2
fi
cargo test --quiet
cargo build --release --target wasm32-wasip2
target_dir=$(cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
wasm=$target_dir/wasm32-wasip2/release/{{crate}}.wasm
if command -v "${SPECHOST:-spechost}" >/dev/null; then
    "${SPECHOST:-spechost}" plugin check "$wasm" >&2
fi
echo "$wasm"

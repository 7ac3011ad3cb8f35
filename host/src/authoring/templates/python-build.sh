#!/usr/bin/env bash
# Builds {{name}} into a WebAssembly component with componentize-py and checks it against the
# host: `./build.sh` prints the path of the .wasm file to load with `spechost run --{{flag}} PATH`.
set -euo pipefail
cd "$(dirname "$0")"
componentize=${SPECHOST_COMPONENTIZE_PY:-componentize-py}
if ! command -v "$componentize" >/dev/null; then
    echo "error: componentize-py is missing; install it with \`pip install componentize-py==0.25.1\`" \
        "(or point SPECHOST_COMPONENTIZE_PY at it)" >&2
    exit 1
fi
# `--export-interface-name` lets app.py implement the exported interface (componentize-py would
# otherwise look for a module named after it).
"$componentize" --wit-path wit/spechost --wit-path wit/plugin --world spechost-plugin:project/plugin \
    --export-interface-name "spechost:drafter/{{api}}@{{wit_version}}=app" --quiet \
    componentize app --output {{name}}.wasm
if command -v "${SPECHOST:-spechost}" >/dev/null; then
    "${SPECHOST:-spechost}" plugin check {{name}}.wasm >&2
fi
echo "$PWD/{{name}}.wasm"

#!/usr/bin/env bash
# Builds the Python drafter (app.py) into a WebAssembly component with componentize-py, against
# spechost's WIT (sdk/wit/) and this example's world (wit/world.wit: the `drafter` world's
# export and logging import, see there why not the whole `drafter` world).
#
# Usage: examples/python-drafter/build.sh [OUTPUT.wasm]
# Default output: $CARGO_TARGET_DIR/wasm32-wasip2/release/python_drafter.wasm (beside the Rust
# plugins, where the host and the tests look), with CARGO_TARGET_DIR defaulting as in
# scripts/env.sh. componentize-py is $SPECHOST_COMPONENTIZE_PY, else the one on PATH.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cache_dir=${SPECHOST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/spechost}
target_dir=${CARGO_TARGET_DIR:-$cache_dir/target}
output=${1:-$target_dir/wasm32-wasip2/release/python_drafter.wasm}

componentize_py=${SPECHOST_COMPONENTIZE_PY:-$(command -v componentize-py || true)}
if [[ -z $componentize_py || ! -x $componentize_py ]]; then
    echo "error: componentize-py is missing; install it with" \
        "\`source scripts/env.sh && install_componentize_py\` (it sets SPECHOST_COMPONENTIZE_PY)," \
        "or \`pip install componentize-py==0.25.1\`" >&2
    exit 1
fi

mkdir -p "$(dirname "$output")"
# componentize-py runs the app while it builds, and that Python writes __pycache__ beside its
# sources: build from a copy so the source tree stays clean.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/app.py" "$work/"
# componentize-py names the module that implements an exported interface after the interface
# (`drafter_api`); naming it `app` keeps the whole plugin in app.py. The component is written
# beside its final name, then renamed, so that a reader (a server watching the directory)
# never sees half a file.
partial="$output.partial"
(
    cd "$work"
    "$componentize_py" \
        --wit-path "$root/sdk/wit" --wit-path "$here/wit" \
        --world spechost-example:python-drafter/python-drafter \
        --export-interface-name "spechost:drafter/drafter-api@0.8.2=app" \
        --quiet \
        componentize app --output "$partial"
)
mv -f "$partial" "$output"
echo "python drafter built: $output ($(wc -c <"$output") bytes)"

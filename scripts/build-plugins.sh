#!/usr/bin/env bash
# Builds every WebAssembly plugin crate (plugins/*, examples/*, tests/hostile/*, tests/compat/*)
# as components, in one `cargo build --release --target wasm32-wasip2`, then prints where each
# .wasm file is.
#
# Honours CARGO_TARGET_DIR (and any target-dir set in cargo config): the files land in
# <target dir>/wasm32-wasip2/release/<lib name>.wasm. Extra arguments go to cargo, e.g.
# `scripts/build-plugins.sh --locked`.
set -euo pipefail

cd "$(dirname "$0")/.."

if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-wasip2; then
    echo "error: the wasm32-wasip2 target is missing; install it with" \
        "\`rustup target add wasm32-wasip2\`" >&2
    exit 1
fi

# Prints "<package name> <lib name>" for one crate manifest, or nothing if the crate is not a
# `cdylib` (not a plugin). The lib name defaults to the package name with `-` replaced by `_`,
# as in cargo.
plugin_names() {
    awk '
        /^\[/ { section = $0 }
        section == "[lib]" && /^crate-type[[:space:]]*=.*"cdylib"/ { cdylib = 1 }
        /^name[[:space:]]*=/ {
            value = $0
            sub(/^name[[:space:]]*=[[:space:]]*"/, "", value)
            sub(/".*$/, "", value)
            if (section == "[package]") package = value
            if (section == "[lib]") lib = value
        }
        END {
            if (!cdylib) exit
            if (lib == "") { lib = package; gsub(/-/, "_", lib) }
            print package, lib
        }
    ' "$1"
}

packages=()
libs=()
for manifest in plugins/*/Cargo.toml examples/*/Cargo.toml tests/hostile/*/Cargo.toml tests/compat/*/Cargo.toml; do
    [[ -f $manifest ]] || continue
    names=$(plugin_names "$manifest")
    [[ -n $names ]] || continue
    read -r package lib <<<"$names"
    packages+=(-p "$package")
    libs+=("$lib")
done
if [[ ${#libs[@]} -eq 0 ]]; then
    echo "error: no plugin crates found under plugins/, examples/, tests/hostile/ or tests/compat/" >&2
    exit 1
fi

cargo build --release --target wasm32-wasip2 "${packages[@]}" "$@"

target_dir=$(cargo metadata --format-version 1 --no-deps |
    grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)
out_dir="$target_dir/wasm32-wasip2/release"
echo "plugins built in $out_dir:"
for lib in "${libs[@]}"; do
    wasm="$out_dir/$lib.wasm"
    if [[ ! -f $wasm ]]; then
        echo "error: expected $wasm, but cargo did not produce it" >&2
        exit 1
    fi
    echo "  $wasm ($(wc -c <"$wasm") bytes)"
done

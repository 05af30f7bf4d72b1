#!/usr/bin/env bash
# Counts the machine instructions a redis-server executes per call of each script operation the
# limiters send, beside a GCRA decision in the style of go-redis/redis_rate — the same rows as
# `simulate calibrate`, counted instead of timed:
#
#   scripts/script-instructions.sh              # CALLS=2000 LEASERS=10,1000 by default
#   CALLS=500 LEASERS=10 scripts/script-instructions.sh
#
# It starts a throwaway redis-server under Valgrind's callgrind (on a unix socket in a temp
# dir, killed on exit) and runs `simulate calibrate --callgrind` against it, which reads the
# server's running instruction totals before and after each operation. Counts do not swing
# with the machine's load as times do (±20 % between runs on a small VM; counts repeat within
# about 1 %), so a change of a few percent to a script shows; times under Valgrind are meaningless (it runs the server ~50× slower), read
# only the instruction columns. Installs valgrind with apt-get when it is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v valgrind >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: valgrind is not installed and this is not an apt-based system." >&2
        exit 1
    fi
    echo "valgrind not found; installing it with apt-get..." >&2
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq valgrind
fi
server=${REDIS_SERVER_BIN:-redis-server}
command -v "$server" >/dev/null 2>&1 || {
    echo "error: $server not found (scripts/test.sh installs it)." >&2
    exit 1
}

cargo build --release -q -p simulations
dir=$(mktemp -d)
pid=""
cleanup() {
    [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
    "$server" --port 0 --unixsocket "$dir/redis.sock" --save '' --appendonly no \
    --dir "$dir" >"$dir/server.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
    [[ -S $dir/redis.sock ]] && break
    sleep 0.1
done
[[ -S $dir/redis.sock ]] || {
    echo "error: redis-server under callgrind did not start:" >&2
    cat "$dir/server.log" >&2
    exit 1
}
# One client: every call is read, run and answered on its own, as a lone node's lease is.
target/release/simulate calibrate --redis "redis+unix://$dir/redis.sock" --callgrind \
    --calls "${CALLS:-2000}" --clients 1 --leasers "${LEASERS:-10,1000}"

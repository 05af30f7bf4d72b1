#!/usr/bin/env bash
# Prints the trace hash of every mode of every shipped scenario, one line each:
#
#   scripts/trace-hashes.sh > before.txt   # ... move code ...   scripts/trace-hashes.sh | diff before.txt -
#
# A commit that only moves code must leave every line unchanged: the hash covers every request
# and store call of a run (simulations/src/record.rs), so any change in behaviour shows.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

cargo build --release -q -p simulations
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for scenario in simulations/scenarios/*.toml; do
    name=$(basename "$scenario" .toml)
    target/release/simulate --quiet --out "$out/$name" "$scenario" >/dev/null
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for mode, m in d["modes"].items():
    print(sys.argv[2], mode, m["trace_hash"])' "$out/$name/report.json" "$name"
done

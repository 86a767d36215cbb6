#!/usr/bin/env bash
# Capture -> search -> export -> bench for one family, on the attached GPU, in a fresh TUNER_HOME
# (the build cache, and so the family's binding, is kept):
#
#   tools/tune_captured.sh rms_norm OUT [search options, e.g. --trials 100]
#
# Captures tools/capture_shapes.py's set of 8 shapes, tunes them all with `tuner search
# --problems`, exports, then benches the export against torch at those shapes and at a held-out set
# that was never searched (torch's op, or the nearest winner within reach, serves those). Writes
# OUT/{shapes,held-out}.json, OUT/search.log, OUT/bench/ and OUT/held-out/, and prints each step's
# wall time from the start.
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0;; esac
family=$1 out=$2
shift 2
mkdir -p "$out"
export TUNER_HOME
TUNER_HOME=$(mktemp -d)
start=$SECONDS
step() { echo "== $1: $((SECONDS - start)) s from the start"; }
python tools/capture_shapes.py "$family" "$out/shapes.json"
step "captured"
tuner search --family "$family" --gpu auto --problems "$out/shapes.json" --quiet "$@" 2>&1 | tee "$out/search.log"
step "searched"
tuner export-best --family "$family" --gpu auto
step "exported (capture -> search -> export)"
tuner bench --family "$family" --problems "$out/shapes.json" --out "$out/bench"
step "benched the tuned shapes"
python tools/capture_shapes.py "$family" "$out/held-out.json" --held-out
tuner bench --family "$family" --problems "$out/held-out.json" --out "$out/held-out"
step "benched the held-out shapes"

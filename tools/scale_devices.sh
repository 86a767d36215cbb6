#!/usr/bin/env bash
# One GPU against all of them, on one host: the same search (same problem, trials and seed) with
# --devices 0 and --devices all, first on a cold build cache (each in a fresh TUNER_HOME; compile
# is then shared by both and may be the limit), then on a warm one (the variants already built:
# the GPUs are the limit); then a worker killed in a run on all GPUs. Prints each run's summary.
#
#     bash tools/scale_devices.sh H200 450 OUT_DIR
set -u
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0;; esac
GPU=${1:-H200}; TRIALS=${2:-450}; OUT=${3:-.}; BASE=${TMPDIR:-/tmp}/scale-devices
mkdir -p "$OUT"
for d in 0 all; do
  export TUNER_HOME=$BASE/cold-$d TUNER_CACHE=$BASE/cache-$d  # nothing built: the cache is the user's, not the home's
  /usr/bin/time -f "cold --devices $d: command wall %e s" tuner search --gpu "$GPU" --devices $d --trials "$TRIALS" \
    --sampler random --seed 1 --quiet > "$OUT/cold-$d.log" 2>&1
  tail -4 "$OUT/cold-$d.log"
done
export TUNER_HOME=$BASE/cold-0 TUNER_CACHE=$BASE/cache-0  # its variants are built
for d in 0 all; do
  /usr/bin/time -f "warm --devices $d: command wall %e s" tuner search --gpu "$GPU" --devices $d --trials "$TRIALS" \
    --sampler random --seed 1 --study "warm-$d" --quiet > "$OUT/warm-$d.log" 2>&1
  tail -4 "$OUT/warm-$d.log"
done
mkdir -p "$OUT/kill"
python "$(dirname "$0")/kill_shared.py" --searchers 1 --kill worker --after 60 --logs "$OUT/kill" -- --gpu "$GPU" \
  --devices all --trials "$TRIALS" --sampler random --storage "$BASE/kill.journal" --study kill

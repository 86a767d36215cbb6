#!/usr/bin/env bash
# One GPU against all of them, on one host: the same search (same problem, trials and seed) with
# --devices 0 and --devices all, first on a cold build cache (each in a fresh TUNER_HOME; compile
# is then shared by both and may be the limit), then on a warm one (the variants already built:
# the GPUs are the limit); then a worker killed in a run on all GPUs. Prints each run's summary.
# With `warm` last, one cold run builds the variants and only the warm runs are compared (no kill).
#
#     bash tools/scale_devices.sh H200 450 OUT_DIR [FAMILY] [warm]
set -u
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0;; esac
GPU=${1:-H200}; TRIALS=${2:-450}; OUT=${3:-.}; FAMILY=${4:-giou}; ONLY=${5:-}
BASE=${TMPDIR:-/tmp}/scale-devices-$FAMILY
mkdir -p "$OUT"
COLD="0 all"; [ "$ONLY" = warm ] && COLD=all
for d in $COLD; do
  export TUNER_HOME=$BASE/cold-$d TUNER_CACHE=$BASE/cache-$d  # nothing built: the cache is the user's, not the home's
  /usr/bin/time -f "$FAMILY cold --devices $d: command wall %e s" tuner search --family "$FAMILY" --gpu "$GPU" \
    --devices $d --trials "$TRIALS" --sampler random --seed 1 --quiet > "$OUT/$FAMILY-cold-$d.log" 2>&1
  tail -4 "$OUT/$FAMILY-cold-$d.log"
done
d0=${COLD%% *}
export TUNER_HOME=$BASE/cold-$d0 TUNER_CACHE=$BASE/cache-$d0  # its variants are built
for d in 0 all; do
  /usr/bin/time -f "$FAMILY warm --devices $d: command wall %e s" tuner search --family "$FAMILY" --gpu "$GPU" \
    --devices $d --trials "$TRIALS" --sampler random --seed 1 --study "warm-$d" --quiet > "$OUT/$FAMILY-warm-$d.log" 2>&1
  tail -4 "$OUT/$FAMILY-warm-$d.log"
done
[ "$ONLY" = warm ] && exit 0
mkdir -p "$OUT/kill"
python "$(dirname "$0")/kill_shared.py" --searchers 1 --kill worker --after 60 --logs "$OUT/kill" -- --family "$FAMILY" \
  --gpu "$GPU" --devices all --trials "$TRIALS" --sampler random --storage "$BASE/kill.journal" --study kill

#!/usr/bin/env bash
# README's main job as a new user meets it, per family: `tuner search --gpu auto` in a fresh
# TUNER_HOME on an empty build cache (the first search ever: nothing built), then in another fresh
# TUNER_HOME with the cache's variants removed and its binding kept ("built": what a later search
# of variants not built yet pays), then in a third with the cache kept whole ("cached": the same
# search again on this machine, its variants built). Before "built" it waits for the binding's
# background build, and says how long after the first search that ended. Prints each run's
# summary lines.
#
#     bash tools/first_search.sh OUT [FAMILY ...]      (default: giou rms_norm embedding_bag)
#     (cd OTHER && TUNER="python3 -m tuner" bash tools/first_search.sh OUT ...)   another checkout: from its folder
#     (`python -m` puts the working folder first on the path, ahead of PYTHONPATH)
set -u
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0;; esac
OUT=${1:?usage: first_search.sh OUT [FAMILY ...]}; shift
FAMILIES=${*:-giou rms_norm embedding_bag}
TUNER=${TUNER:-tuner}
BASE=$(mktemp -d "${TMPDIR:-/tmp}/first-search-XXXX")
mkdir -p "$OUT"
for family in $FAMILIES; do
  export TUNER_CACHE=$BASE/cache-$family
  for run in first built cached; do
    if [ "$run" = built ]; then
      ended=$(date +%s.%N)
      while pgrep -f "tuner.build.binding $family" > /dev/null; do sleep 0.5; done
      echo "$family: the binding's background build ended $(python3 -c "print(round($(date +%s.%N) - $ended, 1))") s after the first search"
      rm -rf "$TUNER_CACHE"/variants/sm_*
    fi
    export TUNER_HOME=$BASE/home-$family-$run
    /usr/bin/time -f "$family $run: command wall %e s" $TUNER search --gpu auto --family "$family" --quiet \
      > "$OUT/$family-$run.log" 2>&1
    grep -E "this run:|^time:|pipeline:|command wall|Error|error:" "$OUT/$family-$run.log" | sed "s/^/$family $run | /"
  done
done

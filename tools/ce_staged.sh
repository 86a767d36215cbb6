#!/usr/bin/env bash
# Cross-entropy's rows kept on chip (`cross_entropy.space(staged=True)`) against the same variant
# reading each row twice, on the GPU: their GPU test first (float64, each stage), then
# tools/ce_reduction.py (forward+backward µs a step, reduction mean and none, and the fused floor)
# for a block a row (1024 threads, the widest loads) at each stage and without one, at shapes of the
# cross-entropy table whose float64 check fits the GPU's memory beside the logits (the check holds
# [rows, vocab] float64 three times: 16384 x 128256 and 8192 x 256000 do not fit 80 GB). One JSON
# line a run in OUT/ce_staged.jsonl.
#
#     bash tools/ce_staged.sh OUT [DTYPE]      (default bfloat16)
set -u
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0;; esac
OUT=${1:?usage: ce_staged.sh OUT [DTYPE]}
DTYPE=${2:-bfloat16}
mkdir -p "$OUT"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cross_entropy_gpu.py -k staged 2>&1 | tail -5 | tee "$OUT/ce_staged_test.log"
VEC=$(python3 -c "from tuner.space import itemsize; print(16 // itemsize('$DTYPE'))")
for shape in "4096 128256" "2048 151936" "4096 32000" "16384 32000"; do  # the widest rows first
  set -- $shape
  for stage in null 1 2 4 8; do
    python3 tools/ce_reduction.py "{\"threads_per_row\": 1024, \"block_size\": 1024, \"vec\": $VEC, \"gradient\": \"forward\", \"stage\": $stage}" \
      --rows "$1" --vocab "$2" --dtype "$DTYPE" 2>&1 | tail -1 | sed "s/^{/{\"rows\": $1, \"vocab\": $2, /" | tee -a "$OUT/ce_staged.jsonl"
  done
done

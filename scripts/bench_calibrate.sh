#!/usr/bin/env bash
# `grpo-launch calibrate` of the tiny CPU recipe, timed: with transformers' decode alone, then with vLLM's CPU build
# (.venv-vllm) measured too. Each must finish in under 5 minutes (issue 39); prints the wall time of each and exits
# 1 when one is over. Run from the repository root after scripts/make_tiny_assets.py (and scripts/setup_vllm_cpu.sh
# for the second).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
LIMIT=300
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for variant in transformers vllm; do
  extra=()
  if [ "$variant" = vllm ]; then
    [ -x .venv-vllm/bin/python ] || { echo "vllm: skipped (no .venv-vllm)"; continue; }
    extra=(--vllm-python .venv-vllm/bin/python)
  fi
  start=$(date +%s.%N)
  GRPO_LAUNCH_CALIBRATIONS="$out/$variant" HF_HUB_OFFLINE=1 "$PY" -m grpo_launch calibrate recipes/tiny-cpu.yaml \
    --minutes 5 "${extra[@]}" >"$out/$variant.log" 2>&1 || { echo "$variant: calibrate failed"; tail -5 "$out/$variant.log"; exit 1; }
  seconds=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$start" "$(date +%s.%N)")
  echo "$variant: calibrate took ${seconds} s (limit ${LIMIT} s)"
  grep -E "decode|vLLM start-up|TRL's own" "$out/$variant.log" | sed 's/^/  /'
  [ "$seconds" -le "$LIMIT" ] || status=1
done
exit $status

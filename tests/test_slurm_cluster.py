"""grpo-launch on a real Slurm cluster: slurmctld + 3 slurmd nodes (n1, n2, n3) on this machine, 4 fake GPUs each
(gres on character devices), started by scripts/slurm_cluster.sh. The trainers are real (TRL GRPOTrainer on the tiny
CPU model); only the GPUs are fake, so GPU plans are checked as commands (``--dry-run``) and through the GPU-narrowing
shim in a real step.

Skipped when slurm-wlm is not installed (scripts/install_system_packages.sh installs it; CI does), unless
GRPO_LAUNCH_REQUIRE_SLURM=1, which turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_launch.rundir.layout import RunPaths

from .helpers import (
    ROOT,
    ensure_tiny_assets,
    free_port,
    metric_steps,
    processes_of,
    pynvml_stand_in,
    require_root_tool,
    vllm_cpu_env,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_root_tool(shutil.which("slurmctld") is not None, "GRPO_LAUNCH_REQUIRE_SLURM", "slurm-wlm")
    ensure_tiny_assets()
    d = tmp_path_factory.mktemp("slurm")
    script = ROOT / "scripts" / "slurm_cluster.sh"
    subprocess.run(["bash", str(script), "start", str(d)], check=True, timeout=120, capture_output=True)
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    env.pop("SLURM_JOB_ID", None)
    try:
        yield env
    finally:
        subprocess.run(["bash", str(script), "stop", str(d)], timeout=120)


def sh(env, *argv, check=True, timeout=60) -> str:
    done = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv} failed: {done.stderr}")
    return done.stdout


def job_field(env, job: str, key: str) -> str:
    text = sh(env, "scontrol", "show", "job", "-o", job)
    m = re.search(rf"(?:^|\s){key}=(\S*)", text)
    return m.group(1) if m else ""


def wait_state(env, job: str, states: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_field(env, job, "JobState")
        if state in states:
            return state
        time.sleep(1)
    raise AssertionError(f"job {job} not in {states} after {timeout:.0f} s (now {state})")


def wait_for_text(path: Path, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if re.search(pattern, text):
            return text
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} not in {path} after {timeout:.0f} s:\n{text[-3000:]}")


def wait_no_processes(run: Path, timeout: float = 40) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and processes_of(run):
        time.sleep(0.5)
    return processes_of(run)


def submit(env, run: Path, *args: str, extra: tuple[str, ...] = ()) -> str:
    # The test cluster's nodes share this machine's loopback: a rendezvous port of its own, not the default 29500,
    # which any other run on this machine may hold (a busy neighbour broke every job here with "port 29500 in use").
    port = () if any("main_process_port" in a for a in args) else (f"launch.main_process_port={free_port()}",)
    out = sh(
        env,
        sys.executable,
        "-m",
        "grpo_launch",
        "sbatch",
        str(ROOT / "recipes" / "tiny-cpu.yaml"),
        "--nodes",
        "2",
        "--gpus-per-node",
        "0",
        "--time",
        "15",
        "--run-dir",
        str(run),
        *args,
        *port,
        *(("--", *extra) if extra else ()),
        timeout=120,
    )
    m = re.search(r"submitted Slurm job (\d+)", out)
    assert m, out
    return m.group(1)


TRAINER = re.compile(r"trainer process (\d+)/(\d+) world_size=(\d+) .*node_rank=(\d+) local_rank=(\d+) node=(\S+)")


def test_two_node_job_trains_across_both_nodes(cluster, tmp_path):
    run = tmp_path / "run"
    job = submit(cluster, run, "max_steps=3")
    assert wait_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, 300) == "COMPLETED", (
        run / f"slurm-{job}.out"
    ).read_text()[-3000:]
    log = (run / f"slurm-{job}.out").read_text()
    every = log + "".join(p.read_text() for p in (run / "logs").glob("train-rank*.log"))  # ranks > 0 log to files
    trainers = {(int(r), int(w), int(nr), node) for r, w, _, nr, _, node in TRAINER.findall(every)}
    # One process per node (launch.num_processes=2 over 2 nodes); each node's machine rank is its own.
    assert trainers == {(0, 2, 0, "n1"), (1, 2, 1, "n2")}
    assert "step 3/3 done" in log and "training done" in log
    logs = {p.name.split("-2")[0] for p in (run / "logs").glob("*.log")}
    assert logs == {"launcher.log", "train-n1", "train-n2", "train-rank1-n2"}, logs  # the launcher's own, too
    assert (run / "job.sbatch").is_file() and (run / "output" / "model.safetensors").is_file()
    status = sh(cluster, sys.executable, "-m", "grpo_launch", "status", str(run))
    assert f"{job}: COMPLETED, restarts 0" in status, status
    assert "step 3/3" in status and "finished" in status


@pytest.mark.extended
def test_scancel_leaves_no_process_on_any_node(cluster, tmp_path):
    run = tmp_path / "run"
    job = submit(cluster, run, "max_steps=500")
    wait_for_text(run / f"slurm-{job}.out", r"step 2/500 done", 240)
    assert processes_of(run), "the trainers should be running"
    sh(cluster, "scancel", job)
    assert wait_state(cluster, job, {"CANCELLED"}, 60) == "CANCELLED"
    assert wait_no_processes(run) == []


@pytest.mark.extended
def test_failing_trainer_on_one_node_fails_the_job_with_its_root_cause(cluster, tmp_path):
    pkg = tmp_path / "flaky_rewards"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "node.py").write_text(
        "import os\n"
        "def reward(completions, **kw):\n"
        "    if os.environ.get('SLURMD_NODENAME') == 'n2':\n"
        "        raise RuntimeError('reward server unreachable from n2')\n"
        "    return [0.0] * len(completions)\n"
    )
    run = tmp_path / "run"
    env = {**cluster, "PYTHONPATH": str(tmp_path)}
    job = submit(env, run, "max_steps=50", "reward_funcs=[flaky_rewards.node:reward]")
    assert wait_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, 300) == "FAILED"
    assert job_field(cluster, job, "ExitCode") == "1:0"
    log = (run / f"slurm-{job}.out").read_text()
    assert re.search(r"train@n2 failed \(exit code 1\)", log), log[-3000:]
    assert re.search(r"root cause: \[train@n2( rank 1)?\] RuntimeError: reward server unreachable from n2", log), log[
        -3000:
    ]
    assert wait_no_processes(run) == []


# SIGUSR2 checkpoints and stops in test_run.py; a Slurm requeue resumes without repeating steps in the preemption test
@pytest.mark.extended
def test_usr2_checkpoints_requeues_and_resumes_without_repeating_steps(cluster, tmp_path):
    run = tmp_path / "run"
    job = submit(cluster, run, "max_steps=12", "save_steps=1000")
    out = run / f"slurm-{job}.out"
    wait_for_text(out, r"step 3/12 done", 240)
    # What Slurm sends 90 s before the time limit (--signal=B:USR2@90), sent now.
    sh(cluster, "scancel", "--signal=USR2", "--batch", job)
    text = wait_for_text(out, r"requeued Slurm job", 120)
    stopped = int(re.search(r"stopped on request after step (\d+)", text).group(1))
    # Slurm holds a requeued job for the credential lifetime (BeginTime; 120 s by default, 10 s in the test cluster:
    # scripts/slurm_cluster.sh). Forcing an earlier start races slurmd, which refuses a revoked credential.
    assert wait_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, 400) == "COMPLETED", out.read_text()[-3000:]
    assert job_field(cluster, job, "Restarts") == "1"
    log = out.read_text()
    first, second = log.split("(restart 1)", 1)
    assert f"resuming from {run}/output/checkpoint-{stopped}" in second
    done_first = [int(s) for s in re.findall(r"step (\d+)/12 done", first)]
    done_second = [int(s) for s in re.findall(r"step (\d+)/12 done", second)]
    assert done_first == list(range(1, stopped + 1))
    assert done_second == list(range(stopped + 1, 13)), "the requeued run repeats or skips optimizer steps"
    assert "training done" in second


def test_preemption_checkpoints_the_step_in_flight_and_the_requeued_job_resumes_at_the_next(cluster, tmp_path):
    """A job of the urgent partition (PriorityTier 10) preempts the training job (PreemptMode=REQUEUE; the debug
    partition's GraceTime is 30 s: scripts/slurm_cluster.sh). Slurm sends SIGTERM to the trainers' steps, not to
    grpo-launch: the steps hold it (node.shim --hold-term), the trainers save a checkpoint at the end of the step in
    flight and stop, grpo-launch requeues the job, and after the urgent job it resumes at the next step: every step
    once in metrics.jsonl."""
    run = tmp_path / "run"
    job = submit(cluster, run, "max_steps=12", "save_steps=1000", f"launch.main_process_port={free_port()}")
    out = run / f"slurm-{job}.out"
    wait_for_text(out, r"step 3/12 done", 240)
    urgent = sh(cluster, "sbatch", "--parsable", "--partition=urgent", "-N3", "--exclusive",
                f"--output={tmp_path / 'urgent.out'}", "--wrap", "sleep 3").strip()  # fmt: skip
    try:
        text = wait_for_text(out, r"requeued Slurm job", 120)
        assert re.search(
            r"the trainers received SIGTERM \(a preemption's warning\): they save a checkpoint at the "
            r"end of step \d+ and stop \(waiting up to 25 s: the partition's GraceTime 30 s",
            text,
        ), text
        stopped = int(re.search(r"stopped on request after step (\d+)", text).group(1))
        assert (run / "output" / f"checkpoint-{stopped}" / "trainer_state.json").is_file()
        assert wait_state(cluster, urgent, {"COMPLETED", "FAILED", "CANCELLED"}, 180) == "COMPLETED"
        assert wait_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, 400) == "COMPLETED", out.read_text()[
            -3000:
        ]
    finally:
        sh(cluster, "scancel", job, urgent, check=False)
    assert job_field(cluster, job, "Restarts") == "1"
    first, second = out.read_text().split("(restart 1)", 1)
    assert f"resuming from {run}/output/checkpoint-{stopped}" in second
    assert [int(s) for s in re.findall(r"step (\d+)/12 done", first)] == list(range(1, stopped + 1))
    assert metric_steps(run) == list(range(1, 13)), "a step lost or repeated"
    assert wait_no_processes(run) == []


# A reward that hangs at step 3 in every rank and ignores SIGINT: the step in flight can never end. (SIGTERM keeps
# the trainers' own handler: the shim holds it and the rank turns it into a checkpoint request, which is how a
# preemption's signal reaches the launcher; the sleep goes on after the handler.)
HANG = (
    "import signal, time\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "def reward(completions, trainer_state=None, **kw):\n"
    "    if trainer_state is not None and trainer_state.global_step + 1 >= 3:\n"
    "        time.sleep(3600)\n"
    "    return [0.0] * len(completions)\n"
)


def test_a_signal_to_a_hung_step_stops_within_the_grace_and_leaves_nothing(cluster, tmp_path):
    """scancel --signal=TERM reaches the trainers' steps (they hold it: a checkpoint request), while their step 3
    hangs. The launcher does not wait for a checkpoint that cannot come (Slurm's KillWait, 5 s in the test cluster,
    follows a cancel): it stops within launch.grace_period_s of the request, says why, and nothing is left on
    either node."""
    (tmp_path / "hangrewards.py").write_text(HANG)
    run = tmp_path / "run"
    env = {**cluster, "PYTHONPATH": str(tmp_path)}
    job = submit(env, run, "max_steps=50", "save_steps=1000", "reward_funcs=[hangrewards:reward]",
                 "launch.grace_period_s=3", f"launch.main_process_port={free_port()}")  # fmt: skip
    out = run / f"slurm-{job}.out"
    try:
        text = wait_for_text(out, r"step 2/50 done", 240)
        # 10 s into the hang, and past five times step 2 (the bound: a loaded machine's steps are slower)
        time.sleep(max(10.0, 5 * float(re.search(r"step 2/50 done in ([\d.]+) s", text)[1]) + 2))
        sh(cluster, "scancel", "--signal=TERM", job)
        # timed from the trainers' SIGTERM, their stop request's file: Slurm's own delivery is not the launcher's
        request, deadline = RunPaths(run).stop_request, time.monotonic() + 60
        while not request.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert request.exists(), "the trainers wrote no stop request on SIGTERM"
        signalled = request.stat().st_mtime
        text = wait_for_text(out, r"no checkpoint possible; stopping now", 60)
        took = time.time() - signalled
        assert re.search(r"step 3 has run \d+ s, \d+× the median: no checkpoint possible", text), text[-3000:]
        assert took < 5, took  # within Slurm's KillWait of the signal
        assert wait_no_processes(run, timeout=3 + 10) == []
        assert not list((run / "output").glob("checkpoint-*"))
    finally:
        sh(cluster, "scancel", job, check=False)


@pytest.mark.extended
def test_the_same_signal_to_a_healthy_step_still_saves_it(cluster, tmp_path):
    """The same scancel --signal=TERM on a run whose steps end: the step in flight is saved, the job requeued."""
    run = tmp_path / "run"
    job = submit(cluster, run, "max_steps=500", "save_steps=1000", f"launch.main_process_port={free_port()}")
    out = run / f"slurm-{job}.out"
    try:
        wait_for_text(out, r"step 3/500 done", 240)
        sh(cluster, "scancel", "--signal=TERM", job)
        text = wait_for_text(out, r"stopped on request after step \d+", 120)
        stopped = int(re.search(r"stopped on request after step (\d+)", text).group(1))
        assert (run / "output" / f"checkpoint-{stopped}" / "trainer_state.json").is_file()
        assert "no checkpoint possible" not in text
    finally:
        sh(cluster, "scancel", job, check=False)
    assert wait_no_processes(run) == []


@pytest.mark.extended
def test_a_job_saves_and_requeues_before_its_time_limit(cluster, tmp_path):
    """A 1-minute job: grpo-launch reads its end time (scontrol EndTime) and, when the time left no longer covers
    a measured step and save (and the exit), checkpoints and requeues it, before Slurm's warning signal and kill
    (a step longer than the warning's lead would otherwise be cut)."""
    run = tmp_path / "run"
    # Slurm's own warning moved to 5 s before the end (USR2@90 would come first in a 1-minute job).
    job = submit(cluster, run, "max_steps=5000", "save_steps=100000", "--time", "1", extra=("--signal=B:USR2@5",))
    out = run / f"slurm-{job}.out"
    try:
        text = wait_for_text(out, r"requeued Slurm job", 120)
        assert "before the time limit" in text and "saving a checkpoint now" in text
        stopped = int(re.search(r"stopped on request after step (\d+)", text).group(1))
        assert (run / "output" / f"checkpoint-{stopped}" / "trainer_state.json").is_file()
        assert "DUE TO TIME LIMIT" not in text
    finally:
        sh(cluster, "scancel", job, check=False)
    assert wait_state(cluster, job, {"CANCELLED", "COMPLETED", "FAILED"}, 60) in {"CANCELLED", "COMPLETED"}


@pytest.mark.extended
def test_gpu_job_places_server_and_trainers_per_node(cluster, tmp_path):
    """A 2 × 4-GPU allocation (fake GPUs): the plan grpo-launch makes inside it, and its srun steps (dry run)."""
    run = tmp_path / "run"
    cmd = (
        f"{sys.executable} -m grpo_launch run --slurm {ROOT}/recipes/qwen1.5b.yaml --dry-run --run-dir {run} && "
        f"srun --nodes=1 --ntasks=1 --nodelist=n2 --overlap --gres=gpu:4 {sys.executable} -m grpo_launch.node.shim "
        "--gpus 2,3 -- printenv CUDA_VISIBLE_DEVICES"
    )
    out = tmp_path / "job.out"
    job = sh(
        cluster,
        "sbatch",
        "--parsable",
        "-N2",
        "--exclusive",
        "--gpus-per-node=4",
        f"--output={out}",
        f"--chdir={ROOT}",
        "--wrap",
        cmd,
    ).strip()
    assert wait_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, 120) == "COMPLETED", out.read_text()
    lines = out.read_text().splitlines()
    steps = [line for line in lines if "srun --nodes=1 " in line]
    assert lines[-1] == "2,3"  # the shim picked positions 2,3 of the GPUs Slurm gave the step
    import json

    plan = json.loads((run / "plan.json").read_text())
    assert plan["topology"]["source"] == "slurm" and plan["topology"]["description"].startswith("2 × 4")
    assert plan["vllm"]["mode"] == "server" and plan["vllm"]["host"] == "n2"
    trains = [s for s in steps if "accelerate.commands.launch" in s]
    servers = [s for s in steps if "--job-name=vllm" in s]
    assert len(servers) == 1 and "--nodelist=n2" in servers[0] and "--gres=gpu:4" in servers[0]
    assert len(trains) == len(plan["train"]["hosts"])
    for host in plan["train"]["hosts"]:
        (step,) = [s for s in trains if f"--nodelist={host['name']} " in s]
        assert f"--machine_rank {host['machine_rank']} " in step
        assert f"--gpus {','.join(host['gpus'])} " in step
        assert f"--main_process_ip {plan['train']['main_process_ip']} " in step or len(trains) == 1


@pytest.mark.extended
def test_hostile_job_name_and_run_dir_reach_slurm_unchanged(cluster, tmp_path):
    name = "grpo 'x' \"$(id)\" `id`"
    run = tmp_path / "runs with 'space' $(id)" / "100%"
    job = submit(cluster, run, "--job-name", name, "max_steps=1", extra=("--hold",))
    try:
        assert job_field(cluster, job, "JobState") == "PENDING"
        text = sh(cluster, "scontrol", "show", "job", job)
        assert re.search(r"JobName=(.*)\n", text).group(1) == name
        sh(cluster, "scontrol", "release", job)
        assert wait_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, 300) == "COMPLETED"
        # (scontrol prints StdOut with the %% unexpanded; the file itself is where it should be.)
        assert "training done" in (run / f"slurm-{job}.out").read_text()
    finally:
        sh(cluster, "scancel", job, check=False)


# NVML cannot run without a GPU: this stand-in for pynvml answers as the node it runs on (SLURMD_NODENAME) would,
# so the test shows which node each report came from. Everything else (sbatch, the srun steps, the gres) is real.
NODE_GPU = {"n1": ("NVIDIA H100 80GB HBM3", 85520809984), "n2": ("NVIDIA A100-SXM4-40GB", 42505273344)}
FAKE_PYNVML = f"NODE_GPU = {NODE_GPU!r}\n" + pynvml_stand_in('return NODE_GPU[os.environ["SLURMD_NODENAME"]]', "4")


def plan_in_two_node_job(cluster, tmp_path: Path, stand_in: str, *overrides: str) -> dict:
    """`plan --slurm recipes/qwen1.5b.yaml OVERRIDES --json` run by sbatch in a 2-node job (4 GPUs a node, --mem
    1500), each node's NVML answered by ``stand_in`` (pynvml's source): the plan.json it printed."""
    import json

    fake = tmp_path / "fake_nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(stand_in)
    out = tmp_path / "job.out"
    cmd = " ".join([sys.executable, "-m", "grpo_launch", "plan", "--slurm", f"{ROOT}/recipes/qwen1.5b.yaml",
                    *overrides, "--json", "--no-write"])  # fmt: skip
    env = {**cluster, "PYTHONPATH": f"{fake}:{cluster.get('PYTHONPATH', '')}"}
    job = sh(env, "sbatch", "--parsable", "-N2", "--exclusive", "--gpus-per-node=4", "--mem=1500",
             f"--output={out}", f"--chdir={ROOT}", "--wrap", cmd).strip()  # fmt: skip
    assert wait_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, 120) == "COMPLETED", out.read_text()
    text = out.read_text()
    return json.loads(text[text.index("{") :])


@pytest.mark.extended
def test_a_heterogeneous_job_serves_on_one_component_and_trains_on_the_other(cluster, tmp_path):
    """A real heterogeneous job (`sbatch -w n1 --gres=gpu:2 : -w n2 --gres=gpu:4`, Slurm's own components): the
    probe reads both components' nodes and their different GPU counts, each node reports its own model from a step
    in its own component (n2's step needs --het-group=1: without it srun refuses, and n2 would be assumed an H20
    like n1), the plan serves on n1 (the two H20s) and trains on n2 (the four H100s), and the run's steps for n2
    name its component."""
    import json

    stand_in = f"NODE_GPU = {MIXED_GPU!r}\n" + pynvml_stand_in('return NODE_GPU[os.environ["SLURMD_NODENAME"]]', "4")
    fake = tmp_path / "fake_nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(stand_in)
    recipe = f"{ROOT}/recipes/qwen1.5b.yaml"
    grpo = f"{sys.executable} -m grpo_launch"
    script = tmp_path / "het.sh"
    plan_json, run = tmp_path / "plan.json", tmp_path / "run"
    script.write_text(f"#!/bin/bash\n{grpo} plan --slurm {recipe} launch.vllm=server --json --no-write > {plan_json}\n"
                      f"{grpo} run --slurm {recipe} launch.vllm=server --run-dir {run} --dry-run\n")  # fmt: skip
    out = tmp_path / "job.out"
    env = {**cluster, "PYTHONPATH": f"{fake}:{cluster.get('PYTHONPATH', '')}"}
    # not --exclusive: an exclusive component is given all of its node's GPUs (4, not the 2 asked for)
    sbatch = ["sbatch", "--parsable", f"--output={out}", f"--chdir={ROOT}", "-w", "n1", "--gres=gpu:2", "--mem=1500",
              ":", "-w", "n2", "--gres=gpu:4", "--mem=1500", str(script)]  # fmt: skip
    job = sh(env, *sbatch).strip().split("+")[0]
    assert wait_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, 120) == "COMPLETED", out.read_text()
    plan = json.loads(plan_json.read_text())
    hosts = plan["topology"]["hosts"]
    assert [(h["name"], {g["name"] for g in h["gpus"]}, len(h["gpus"])) for h in hosts] == [
        ("n1", {"NVIDIA H20"}, 2),
        ("n2", {"NVIDIA H100 80GB HBM3"}, 4),
    ], plan["warnings"]
    why = {d["what"]: d["why"] for d in plan["decisions"]}
    assert plan["vllm"]["host"] == "n1" and [h["name"] for h in plan["train"]["hosts"]] == ["n2"], why["gpu_types"]
    steps = [line for line in out.read_text().splitlines() if " srun " in f" {line}"]
    on = {node: [line for line in steps if f"--nodelist={node}" in line] for node in ("n1", "n2")}
    assert on["n1"] and on["n2"], out.read_text()[-3000:]
    assert all("--het-group=1" in line for line in on["n2"]), on["n2"]
    assert not any("--het-group" in line for line in on["n1"]), on["n1"]


@pytest.mark.extended
def test_every_node_of_the_allocation_is_probed_in_its_own_step(cluster, tmp_path):
    """`plan --slurm` inside a 2-node job: each node reports its own GPU model (n1 H100, n2 A100-40GB, from a pynvml
    stand-in keyed by the node the srun step runs on), the plan is sized for the smaller GPU with a warning naming
    both, and host RAM is the job's --mem (below the nodes' RealMemory=2000 and their /proc/meminfo)."""
    plan = plan_in_two_node_job(cluster, tmp_path, FAKE_PYNVML)
    hosts = plan["topology"]["hosts"]
    assert [(h["name"], {g["name"] for g in h["gpus"]}, len(h["gpus"])) for h in hosts] == [
        ("n1", {"NVIDIA H100 80GB HBM3"}, 4),
        ("n2", {"NVIDIA A100-SXM4-40GB"}, 4),
    ]
    assert [h["memory_bytes"] for h in hosts] == [1500 * 1024 * 1024] * 2
    assert any("differ (n1: NVIDIA H100 80GB HBM3, n2: NVIDIA A100-SXM4-40GB)" in w for w in plan["warnings"])
    assert abs(plan["estimate"]["gpu_memory_gib"] - 42505273344 / 2**30) < 0.01  # sized for the smaller GPU


VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"


def dedicated_node_recipe(
    path: Path, tiny: Path, port: int, *, vllm_gpus: int = 4, dp_here: int | None = 2, pp: int | None = None
) -> Path:
    """A server-mode plan whose server takes whole hosts (launch.vllm_gpus), run by the real vLLM CPU build; the
    trainers run tests/standin_trainer.py (launch.train_module): TRL's NCCL weight sync needs CUDA on both sides.

    With 4 (fake) GPUs per host the plan's TP 1 × DP 4 is judged by vLLM's parser in the conformance suite and the
    CPU build serves 2 data-parallel replicas (this machine has 2 cores; ``dp_here`` sets them). With 1 GPU per host
    and 2 serving hosts the planned server runs as planned: vLLM's multi-node data parallel, one engine per host,
    or with ``pp`` one replica whose pipeline stages span the hosts (``--nnodes``). vLLM 0.31's CPU build runs a
    pipeline only compiled: with --enforce-eager its later stage finds no intermediate tensors (they are made by
    the compile warm-up, vllm/v1/worker/cpu_model_runner.py), so a pipeline runs without it."""
    import yaml

    recipe = {
        "model_name_or_path": str(tiny / "model"),
        "dataset_name": str(tiny / "data"),
        "max_prompt_length": 64,
        "max_completion_length": 16,
        "num_generations": 2,
        "per_device_train_batch_size": 1,
        "trust_remote_code": True,
        "max_steps": 1,
        "launch": {
            "vllm": "server",
            "vllm_gpus": vllm_gpus,
            "vllm_tensor_parallel_size": 1,
            **({"vllm_pipeline_parallel_size": pp} if pp else {}),
            "vllm_port": port,
            "backend": "ddp",
            "train_module": "tests.standin_trainer",
            "vllm_command": [str(VLLM_PY.parent / "vllm"), "serve"],  # `vllm serve`: its --headless mode
            "vllm_extra_args": [
                *(() if pp else ("--enforce-eager",)),
                *(("--data-parallel-size", str(dp_here)) if dp_here else ()),
            ],
            "vllm_env": vllm_cpu_env(),
            "vllm_health_timeout_s": 400,
        },
    }
    path.write_text(yaml.safe_dump(recipe))
    return path


def check_dedicated_node_run(
    run: Path, server_hosts: list[str], train_hosts: list[str], per_host: int = 4, server_world: int = 2
) -> None:
    """What the trainers saw: one process group over the training hosts, each host its machine rank and its GPUs,
    and the vLLM server on the other host(s) generating for every host."""
    import json

    plan = json.loads((run / "plan.json").read_text())
    assert [plan["vllm"]["host"], *(n["name"] for n in plan["vllm"]["nodes"])] == server_hosts
    ranks = [(h["name"], h["machine_rank"]) for h in plan["train"]["hosts"]]
    assert ranks == [(h, r) for r, h in enumerate(train_hosts)]
    world = per_host * len(train_hosts)
    records = [json.loads(p.read_text()) for p in sorted((run / "standin").glob("rank*.json"))]
    assert sorted(r["rank"] for r in records) == list(range(world))
    assert {r["world_size"] for r in records} == {world} and {r["rank_sum"] for r in records} == {sum(range(world))}
    assert {r["rank"]: r["machine_rank"] for r in records} == {i: i // per_host for i in range(world)}
    assert {r["cuda_visible_devices"] for r in records} == {",".join(map(str, range(per_host)))}
    if world > 1:  # torchrun's rendezvous at the main process's address (one process runs without one)
        assert {r["master_addr"] for r in records} == {plan["train"]["main_process_ip"]}
    asked = [r for r in records if "completions" in r]
    assert len(asked) == len(train_hosts)
    assert all(len(r["completions"]) == 2 and r["server_world_size"] == server_world for r in asked)
    assert {r["vllm_mode"] for r in records} == {"server"}
    assert {r["vllm_url"] for r in records} == {plan["vllm"]["base_url"]}  # the API server's host


def run_dedicated_job(cluster, tmp_path: Path, nodes: int, gpus_per_node: int, recipe: Path) -> tuple[Path, str]:
    run, out = tmp_path / "run", tmp_path / "job.out"
    # The launcher and the trainers run from the vLLM environment: TRL's server mode needs vLLM where it trains.
    launch = f"{VLLM_PY} -m grpo_launch run --slurm {recipe} --run-dir {run}"
    # --exclusive would give each job every GPU of its nodes: only a whole node's 4 are asked for exclusively.
    whole = ("--exclusive",) if gpus_per_node == 4 else ()
    job = sh(cluster, "sbatch", "--parsable", f"-N{nodes}", *whole, f"--gpus-per-node={gpus_per_node}",
             f"--output={out}", f"--chdir={ROOT}", "--wrap", launch).strip()  # fmt: skip
    try:
        state = wait_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 420)
    finally:
        sh(cluster, "scancel", job, check=False)
    text = out.read_text(errors="replace")
    assert state == "COMPLETED", text[-4000:]
    assert "vLLM server healthy after" in text and "training finished" in text
    return run, text


@pytest.mark.extended
@pytest.mark.vllm
def test_a_dedicated_vllm_node_serves_two_training_nodes(cluster, tmp_path):
    """Three nodes of 4 (fake) GPUs: n3 runs the real vLLM server from the rendered command through srun and the
    GPU shim, n1 and n2 run accelerate (machine ranks 0 and 1) with the stand-in trainer, which reaches the server
    on the other node; the job completes and nothing is left running."""
    if not VLLM_PY.exists():
        pytest.fail("the vLLM CPU environment is missing: run scripts/setup_vllm_cpu.sh (scripts/test.sh does)")
    recipe = dedicated_node_recipe(tmp_path / "dedicated.yaml", ensure_tiny_assets(), free_port())
    run, _ = run_dedicated_job(cluster, tmp_path, 3, 4, recipe)
    check_dedicated_node_run(run, ["n3"], ["n1", "n2"])
    assert wait_no_processes(run) == []


@pytest.mark.extended
@pytest.mark.vllm
def test_a_data_parallel_server_over_two_nodes_serves_the_third(cluster, tmp_path):
    """Three nodes of 1 (fake) GPU, the server on 2: vLLM's multi-node data parallel as planned, unchanged: the API
    server and rank 0 on n2, rank 1 headless on n3 (its own srun step); the stand-in trainer on n1 gets completions
    and a weight-sync world of 2 (TRL's client would join as rank 2)."""
    if not VLLM_PY.exists():
        pytest.fail("the vLLM CPU environment is missing: run scripts/setup_vllm_cpu.sh (scripts/test.sh does)")
    recipe = dedicated_node_recipe(tmp_path / "dp.yaml", ensure_tiny_assets(), free_port(), vllm_gpus=2, dp_here=None)
    run, text = run_dedicated_job(cluster, tmp_path, 3, 1, recipe)
    import json

    headless = json.loads((run / "plan.json").read_text())["vllm"]["headless"]
    assert [h["host"] for h in headless] == ["n3"] and "--headless" in headless[0]["argv"] and "[vllm@n3]" in text
    check_dedicated_node_run(run, ["n2", "n3"], ["n1"], per_host=1, server_world=2)
    assert wait_no_processes(run) == []


@pytest.mark.extended
@pytest.mark.vllm
def test_a_pipeline_over_two_nodes_serves_the_third(cluster, tmp_path):
    """Three nodes of 1 (fake) GPU, the server one replica of 2 pipeline stages over n2 and n3 (vLLM's --nnodes:
    the API server and stage 0 on n2, stage 1's worker headless on n3, one torch.distributed group between the
    nodes); the stand-in trainer on n1 gets completions and a weight-sync world of TP × PP = 2."""
    if not VLLM_PY.exists():
        pytest.fail("the vLLM CPU environment is missing: run scripts/setup_vllm_cpu.sh (scripts/test.sh does)")
    recipe = dedicated_node_recipe(tmp_path / "pp.yaml", ensure_tiny_assets(), free_port(), vllm_gpus=2,
                                   dp_here=None, pp=2)  # fmt: skip
    run, text = run_dedicated_job(cluster, tmp_path, 3, 1, recipe)
    import json

    plan = json.loads((run / "plan.json").read_text())
    assert plan["vllm"]["pipeline_parallel_size"] == 2 and plan["vllm"]["data_parallel_size"] == 1
    (head,) = plan["vllm"]["headless"]
    assert head["host"] == "n3" and head["argv"][-1] == "--headless" and "[vllm@n3]" in text
    assert head["argv"][head["argv"].index("--node-rank") + 1] == "1"
    check_dedicated_node_run(run, ["n2", "n3"], ["n1"], per_host=1, server_world=2)
    assert wait_no_processes(run) == []


@pytest.mark.extended
@pytest.mark.vllm
def test_adapt_resplits_inside_the_allocation_and_resumes(cluster, tmp_path):
    """launch.adapt inside a Slurm job (one node, 3 fake L4s probed through the pynvml stand-in of
    tests/test_adapt_run.py): the first decision is injected as there (why: see that module), the vLLM servers and
    trainers of each layout run as srun steps of the same allocation, and the run resumes on the new layout without
    asking for more nodes; steps are logged exactly once."""
    from .test_adapt_run import DRIVER, fake_nvml, records, server_recipe

    if not VLLM_PY.exists():
        pytest.fail("the vLLM CPU environment is missing: run scripts/setup_vllm_cpu.sh (scripts/test.sh does)")
    recipe = server_recipe(tmp_path / "adapt.yaml", learning_rate=1e-9, max_steps=24, adapt=True)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    run, out = tmp_path / "run", tmp_path / "job.out"
    env = {**cluster, "PYTHONPATH": str(fake_nvml(tmp_path)), "FAKE_L4_GPUS": "3"}
    launch = f"{VLLM_PY} {driver} run --slurm {recipe} --run-dir {run}"
    job = sh(env, "sbatch", "--parsable", "-N1", "--gpus-per-node=3", f"--output={out}", f"--chdir={ROOT}",
             "--wrap", launch).strip()  # fmt: skip
    try:
        state = wait_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 600)
    finally:
        sh(cluster, "scancel", job, check=False)
    text = out.read_text(errors="replace")
    assert state == "COMPLETED", text[-5000:]
    steps = [r["step"] for r in records(run / "metrics.jsonl") if "step_s" in r]
    assert steps == list(range(1, 25)), steps
    attempts = records(run / "control" / "attempts.jsonl")
    moved = attempts[0]["adaptations"][0]
    assert attempts[0]["state"] == "stopped-for-checkpoint" and moved["action"] == "resplit"
    assert moved["split"] != moved["new_split"] and attempts[-1]["state"] == "succeeded"
    assert "adapt: resuming from step" in text and len(attempts) >= 2
    plan = json.loads((run / "plan.json").read_text())
    assert plan["topology"]["source"] == "slurm" and len(plan["topology"]["hosts"]) == 1  # the same allocation
    assert plan["topology"]["description"] == "3 × NVIDIA L4 22 GiB"
    assert wait_no_processes(run) == []


# Mixed GPU types (issue 38): the same stand-in keyed by SLURMD_NODENAME, n1 an H20 (memory bandwidth), n2 an H100
# (FLOPs). The fake gres has no types (gres.conf names gpu only): the models come from each node's own probe step.
MIXED_GPU = {"n1": ("NVIDIA H20", 102641664000), "n2": ("NVIDIA H100 80GB HBM3", 85520809984)}


@pytest.mark.extended
def test_a_mixed_allocation_serves_on_its_bandwidth_node_and_trains_on_its_flops_node(cluster, tmp_path):
    """`plan --slurm` inside a 2-node job whose nodes report different GPU models: the server goes to n1 (the H20),
    the trainers to n2 (the H100, machine rank 0), the sbatch steps are rendered for those nodes, and the plan says
    why."""
    stand_in = f"NODE_GPU = {MIXED_GPU!r}\n" + pynvml_stand_in('return NODE_GPU[os.environ["SLURMD_NODENAME"]]', "4")
    plan = plan_in_two_node_job(cluster, tmp_path, stand_in, "launch.vllm=server")
    assert [(h["name"], {g["name"] for g in h["gpus"]}) for h in plan["topology"]["hosts"]] == [
        ("n1", {"NVIDIA H20"}),
        ("n2", {"NVIDIA H100 80GB HBM3"}),
    ]
    assert plan["vllm"]["host"] == "n1"
    assert [(h["name"], h["machine_rank"]) for h in plan["train"]["hosts"]] == [("n2", 0)]
    why = {d["what"]: d["why"] for d in plan["decisions"]}
    assert "H20 serves vLLM" in why["gpu_types"] and "H100-80GB trains" in why["gpu_types"]

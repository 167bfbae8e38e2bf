"""`grpo-launch RECIPE` end to end on CPU: real TRL GRPOTrainer, real `accelerate launch`, real DeepSpeed."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_launch.analysis.step_means import read_run
from grpo_launch.errors import ConfigError
from grpo_launch.planning.measured_scales import calibration_from
from grpo_launch.rundir.checkpoints import checkpoint_problems, checkpoints

from .helpers import ROOT, TINY_RECIPE, ensure_tiny_assets, tiny_overrides

pytestmark = pytest.mark.slow
RECIPE = TINY_RECIPE


def launch(tmp_path: Path, *overrides: str, run_dir: Path | None = None, env: dict | None = None, timeout: int = 600):
    run_dir = run_dir or tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "grpo_launch",
        RECIPE,
        *tiny_overrides(tmp_path),
        *overrides,
        "--run-dir",
        str(run_dir),
    ]
    return subprocess.run(
        args, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env={**os.environ, **(env or {})}
    )


def rank_logs(run: Path) -> str:
    """What the ranks other than 0 printed: each writes its own log file (rank 0 speaks on the console)."""
    return "".join(p.read_text(errors="replace") for p in sorted((run / "logs").glob("train-rank*.log")))


def world_sizes(output: str) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in re.findall(r"trainer process (\d+)/(\d+) world_size", output)}


def logged_steps(run: Path) -> list[dict]:
    """TRL's logged metrics per optimizer step, as the trainers wrote them to metrics.jsonl."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x["log"] for x in lines if "loss" in (x.get("log") or {})]


@pytest.mark.parametrize("processes", [pytest.param(1, marks=pytest.mark.extended), 2])  # one process: every other run
def test_tiny_grpo(tmp_path, processes):
    proc = launch(tmp_path, f"launch.num_processes={processes}", "max_steps=3")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert world_sizes(out + rank_logs(tmp_path / "run")) == {(r, processes) for r in range(processes)}
    steps = logged_steps(tmp_path / "run")
    assert len(steps) == 3 and all("rewards/format_reward/mean" in s and "reward" in s for s in steps)
    # The console: one line per step with its metrics, nothing twice, no warning grpo-launch's own settings cause.
    console = [line for line in proc.stdout.splitlines() if line.startswith("[train")]
    assert len(console) == len(set(console)), "a line printed twice"
    assert (
        sum(bool(re.match(r"\[train\] step \d/3 done in .* \| reward [\d.]+ ± [\d.]+ \| length", x)) for x in console)
        == 3
    )
    for noise in ("`gradient_checkpointing` is deprecated", "Setting accelerator to CPU", "find_unused_parameters=True",
                  "'loss':", "it/s]"):  # fmt: skip
        assert noise not in out, noise
    if processes == 2:
        (own,) = (tmp_path / "run" / "logs").glob("train-rank1-*.log")
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", own.read_text())  # every line time-stamped
    report = tmp_path / "run" / "report" / "report.html"
    assert report.is_file() and (tmp_path / "run" / "report" / "reward.png").is_file()
    assert (tmp_path / "run" / "output" / "model.safetensors").is_file()
    assert list((tmp_path / "run" / "logs").glob("train-*.log"))
    # RUN_DIR/metrics.jsonl: one line per optimizer step, every rank's peak memory, the tokens so far.
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    metrics = [m for m in lines if "step_s" in m]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(len(m["peak_memory_bytes"]) == processes and min(m["peak_memory_bytes"]) > 10 * 2**20 for m in metrics)
    tokens = [m["num_tokens"] for m in metrics]
    assert tokens == sorted(tokens) and tokens[0] > 0 and all(m["generation_s"] > 0 for m in metrics)
    # TRL's own logged metrics (logging_steps=1) as their own lines; read back as a run's measurements.
    logs = [m["log"] for m in lines if "log" in m]
    assert sum("completions/mean_length" in g for g in logs) == 3
    measured = read_run(tmp_path / "run")
    assert measured.steps == 3 and measured.last_step == 3 and measured.memory_kind == "rss_max"
    assert 0 < measured.mean_completion_len <= 64 and measured.training_s > 0
    with pytest.raises(ConfigError, match="no estimate"):  # a CPU plan predicts no time: nothing to calibrate
        calibration_from(measured)
    status = subprocess.run([sys.executable, "-m", "grpo_launch", "status", str(tmp_path / "run"), "--json"],
                            capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert status.returncode == 0, status.stderr
    state = json.loads(status.stdout)
    assert (state["state"], state["step"], state["max_steps"], state["eta_s"]) == ("finished", 3, 3, 0.0)
    assert "reward" in state["last_log"] and any(log.endswith(".log") for log in state["logs"])


def test_deepspeed_zero2_two_processes(tmp_path):
    proc = launch(tmp_path, "launch.backend=zero2", "max_steps=2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    every = out + rank_logs(tmp_path / "run")
    assert world_sizes(every) == {(0, 2), (1, 2)}
    assert every.count("distributed_type=DEEPSPEED zero_stage=2 num_processes=2") == 2
    assert len(logged_steps(tmp_path / "run")) == 2


@pytest.mark.extended
def test_reward_by_import_path_runs_in_every_trainer(tmp_path):
    mod = tmp_path / "pkg_rewards"
    mod.mkdir()
    calls = tmp_path / "calls"
    (mod / "__init__.py").write_text("")
    (mod / "mine.py").write_text(
        "import os\n"
        "def count_reward(prompts, completions, **kw):\n"
        f"    with open({str(calls)!r}, 'a') as f:\n"
        "        f.write(os.environ.get('RANK', '?') + '\\n')\n"
        "    return [0.5] * len(completions)\n"
    )
    proc = launch(
        tmp_path,
        "reward_funcs=[pkg_rewards.mine:count_reward,format]",
        "max_steps=2",
        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert set(calls.read_text().split()) == {"0", "1"}
    assert all(s["rewards/count_reward/mean"] == 0.5 for s in logged_steps(tmp_path / "run"))


def test_killed_run_resumes_without_repeating_steps(tmp_path):
    run = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "grpo_launch",
        RECIPE,
        *tiny_overrides(tmp_path),
        "max_steps=60",
        "save_steps=2",
        "--run-dir",
        str(run),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert proc.stdout is not None
    for _line in proc.stdout:  # kill as soon as the first checkpoint is complete
        if (run / "output" / "checkpoint-2" / "trainer_state.json").is_file():
            break
    # SIGKILL leaves grpo-launch no chance to clean up (like a node crash); its children run in their own
    # sessions, so they are killed here by hand.
    proc.kill()
    proc.wait()
    subprocess.run(["pkill", "-9", "-f", str(run / "trainer_recipe.yaml")], check=False)
    # the trainers ran on until the kill above: a later checkpoint may be half-written, and the resume skips it
    done = sorted(n for n, path in checkpoints(run / "output") if not checkpoint_problems(path))
    assert done and done[-1] < 60
    again = launch(tmp_path, "max_steps=60", "save_steps=2", run_dir=run)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert f"resuming from {run / 'output' / f'checkpoint-{done[-1]}'}" in out
    assert len(re.findall(r"step \d+/60 done", again.stdout)) == 60 - done[-1]
    state = json.loads((run / "output" / "checkpoint-60" / "trainer_state.json").read_text())
    steps = [h["step"] for h in state["log_history"] if "loss" in h]
    assert steps == list(range(1, 61))


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["model_name_or_path=./no/such/model"], "model path './no/such/model' has no config.json"),
        (["dataset_name=./missing.jsonl"], "dataset file './missing.jsonl' not found"),
        (["reward_funcs=[acuracy]"], "unknown reward 'acuracy' (did you mean 'accuracy'?)"),
    ],
)
def test_bad_input_fails_before_starting(tmp_path, overrides, needle):
    proc = launch(tmp_path, *overrides)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = launch(tmp_path, f"launch.main_process_port={port}")
    assert proc.returncode == 1
    assert f"trainer rendezvous port {port} is in use" in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_dry_run_prints_commands_and_starts_nothing(tmp_path):
    proc = launch(tmp_path, "--dry-run")
    assert proc.returncode == 0
    assert "ACCELERATE_USE_CPU=true" in proc.stdout and "--num_processes 2" in proc.stdout
    assert not (tmp_path / "run" / "logs").exists()


RELOCATED_DRIVER = """
import dataclasses, json, os, signal, sys
from grpo_launch.spec import RunContext
from grpo_launch.backends.local import LocalBackend
from grpo_launch.planning import make_plan
from grpo_launch.planning.plan_types import Runtime
from grpo_launch.recipe import load_recipe
from grpo_launch.execute.run import run_plan
from grpo_launch.machines.topology import parse_gpu_spec

recipe_path, default_dir, other_dir, *overrides = sys.argv[1:]
recipe = load_recipe(recipe_path, [*overrides, f"launch.run_dir={default_dir}"])
plan = make_plan(parse_gpu_spec("cpu", cpu_processes=recipe.launch.num_processes), recipe,
                 runtime=Runtime(python=sys.executable))
assert plan.run_dir == default_dir
moved = dataclasses.replace(plan, run_dir=other_dir)
asked = []

def emit(line):
    print(line, flush=True)
    if "] step 2/" in line and not asked:
        asked.append(True)
        os.kill(os.getpid(), signal.SIGUSR2)

result = run_plan(moved, LocalBackend(), RunContext(sys.executable, os.getcwd(), dict(os.environ), emit))
print("RESULT " + json.dumps({"state": str(result.state), "step": result.stopped_at_step}), flush=True)
"""


def test_sigusr2_checkpoints_and_stops_in_a_relocated_run_dir(tmp_path):
    """A plan rendered into a run dir other than its default (a caller other than the CLI): SIGUSR2 still reaches
    the trainers through that dir's control files, they save a checkpoint there and stop; the default dir is
    never touched."""
    default, other = tmp_path / "default", tmp_path / "other"
    proc = subprocess.run(
        [
            *(sys.executable, "-c", RELOCATED_DRIVER, RECIPE, str(default), str(other)),
            *tiny_overrides(tmp_path),
            *("max_steps=200", "save_steps=1000"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result["state"] == "stopped-for-checkpoint", out[-3000:]
    step = result["step"]
    assert 2 <= step < 200
    assert (other / "output" / f"checkpoint-{step}" / "trainer_state.json").is_file()
    assert (other / "control" / "stopped-at-step").read_text().strip() == str(step)
    assert not default.exists()


def test_zero3_run_saves_a_model_from_pretrained_loads(tmp_path):
    """ZeRO-3 shards every parameter: unless the 16-bit weights are gathered on save, save_model writes empty
    tensors. The saved model must load with from_pretrained and hold every parameter at full shape.
    (FSDP cannot be shown here: accelerate runs FSDP on CPU as a single-process NO/MULTI_CPU job, not FSDP; its
    FULL_STATE_DICT setting is checked against TRL's own FSDP2 config in tests/conformance.)"""
    from transformers import AutoModelForCausalLM

    proc = launch(tmp_path, "launch.backend=zero3", "max_steps=2")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "zero_stage=3" in proc.stdout
    saved = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "output"))
    original = AutoModelForCausalLM.from_pretrained(str(ensure_tiny_assets() / "model"))
    shapes = {n: tuple(p.shape) for n, p in original.named_parameters()}
    assert {n: tuple(p.shape) for n, p in saved.named_parameters()} == shapes
    # Gathered, not placeholders: every tensor that was non-zero before is non-zero in the saved model.
    before = dict(original.named_parameters())
    assert all(float(p.abs().sum()) > 0 for n, p in saved.named_parameters() if float(before[n].abs().sum()) > 0)


@pytest.mark.extended
@pytest.mark.parametrize("backend", ["ddp", "zero2", "zero3"])
def test_checkpoint_size_matches_the_plans_estimate(tmp_path, backend):
    """The disk preflight's estimate (planning/storage.py) against the checkpoint and final model a real run
    writes: the weight and optimizer files of checkpoint-1, and the final model.safetensors."""
    from grpo_launch.enums import DistBackend
    from grpo_launch.planning.cost.storage import save_bytes
    from grpo_launch.probe.model import resolve_model_shape

    proc = launch(tmp_path, f"launch.backend={backend}", "max_steps=1", "save_steps=1")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    out = tmp_path / "run" / "output"
    weights = (".safetensors", ".pt", ".bin")
    written = sum(
        p.stat().st_size
        for p in (out / "checkpoint-1").rglob("*")
        if p.suffix in weights and not p.name.startswith(("rng_state", "training_args", "scheduler"))
    )
    shape, _ = resolve_model_shape(str(ensure_tiny_assets() / "model"))
    checkpoint, final = save_bytes(shape, DistBackend(backend), {})
    assert 0.8 <= written / checkpoint <= 1.25, (written, checkpoint)
    assert 0.8 <= (out / "model.safetensors").stat().st_size / final <= 1.25

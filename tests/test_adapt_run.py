"""launch.adapt and the stale-weights watch in real runs: the real vLLM CPU server (0.31, .venv-vllm) started by the
launcher, real TRL 1.16 GRPOTrainer processes in server mode (tests/cpu_server_trainer.py: grpo_launch.train with
TRL's NCCL weight transfer made a no-op, since NCCL needs CUDA), on a plan for 3 (simulated) L4s.

What cannot be relied on here, and why: for a tiny model on these GPUs the two server sizes are within the 15 %
threshold of each other (in a trial run the measurements re-planned the other size 14 % faster), so whether a real
decision moves is up to the noise of a shared 2-core machine (test_adapt.py shows clear decisions on a 7B). The
first decision is therefore replaced by a move to the other server size (1 or 2 GPUs) planned by the real planner
(``launch.vllm_gpus``), named "injected" in its record with what the planner said. Everything after it is real:
the checkpoint at the stop, the new layout's vLLM server and trainers, the resume, the second decision from the new
layout's own measurements (keep or revert), and every record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from .helpers import ROOT, ensure_tiny_assets, free_port, pynvml_stand_in, vllm_cpu_env

VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DRIVER = textwrap.dedent(
    """
    import dataclasses, sys
    from grpo_launch.cli import main
    from grpo_launch.execute import adapt as running
    from grpo_launch.planning import make_plan
    from grpo_launch.planning.after_run.adapt import per_prompt_s, split_key

    real = running.decide

    def injected(plan, measured, *, tried, resplits, previous=None):
        made = real(plan, measured, tried=tried, resplits=resplits, previous=previous)
        if resplits or made.action != "keep":
            return made
        other = 1 if plan.vllm.data_parallel_size > 1 else 2  # the other server size
        launch = dataclasses.replace(plan.recipe.launch, vllm_gpus=other)
        new = make_plan(plan.topology, dataclasses.replace(plan.recipe, launch=launch), plan.model,
                        runtime=plan.runtime)
        return dataclasses.replace(made, action="resplit", reason="injected by the test (the planner said: "
                                   + made.reason + ")", new_split=split_key(new), new_s=per_prompt_s(new), plan=new)

    running.decide = injected
    sys.exit(main(sys.argv[1:]))
    """
)

# NVML cannot run without a GPU: this stand-in for pynvml answers as a host with GPUS × NVIDIA L4 would, so the
# launcher probes this machine (or a Slurm node) as it would a GPU host.
FAKE_PYNVML = pynvml_stand_in('return ("NVIDIA L4", 24152899584)', 'int(os.environ.get("FAKE_L4_GPUS", "3"))')


def fake_nvml(tmp_path: Path) -> Path:
    where = tmp_path / "fake_nvml"
    where.mkdir(exist_ok=True)
    (where / "pynvml.py").write_text(FAKE_PYNVML)
    return where


def server_recipe(path: Path, *, learning_rate: float, max_steps: int, adapt: bool) -> Path:
    tiny = ensure_tiny_assets()
    recipe = {
        "model_name_or_path": str(tiny / "model"),
        "dataset_name": str(tiny / "data" / "train.jsonl"),
        "dataset_prompt_column": "prompt",
        "dataset_answer_column": "answer",
        "reward_funcs": ["digits"],
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "max_prompt_length": 64,
        "max_completion_length": 48,
        "learning_rate": learning_rate,
        "max_steps": max_steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 42,
        "bf16": False,
        "gradient_checkpointing": False,
        "trust_remote_code": True,
        "dataloader_num_workers": 0,
        "launch": {
            "vllm": "server",
            "vllm_tensor_parallel_size": 1,
            "vllm_port": free_port(),
            "main_process_port": free_port(),
            "prompts_per_step": 2,
            "backend": "ddp",
            "train_module": "tests.cpu_server_trainer",
            "train_env": {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"},
            "vllm_command": [str(VLLM_PY.parent / "vllm"), "serve"],
            "vllm_extra_args": ["--enforce-eager"],
            "vllm_env": vllm_cpu_env(),
            "vllm_health_timeout_s": 400,
            "adapt": adapt,
            "adapt_warmup_steps": 3,
        },
    }
    path.write_text(yaml.safe_dump(recipe))
    return path


def drive(tmp_path: Path, recipe: Path, timeout: float) -> tuple[int, str]:
    """``grpo-launch run RECIPE`` on this machine probed as 3 L4s, with the first adapt decision injected."""
    if not VLLM_PY.exists():
        pytest.fail("the vLLM CPU environment is missing: run scripts/setup_vllm_cpu.sh (scripts/test.sh does)")
    env = {**os.environ, "PYTHONPATH": str(fake_nvml(tmp_path))}
    argv = [str(VLLM_PY), "-c", DRIVER, "run", str(recipe), "--run-dir", str(tmp_path / "run")]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.timeout(1500)  # three vLLM CPU starts and two sets of trainers: 400–590 s in CI, twice that loaded
def test_a_resplit_resumes_on_the_new_layout_without_losing_or_repeating_a_step(tmp_path):
    """learning_rate 1e-9: Adam moves each weight by about 1e-9 a step, so the trainers' weights stay the server's,
    the no-op weight transfer changes nothing and the stale-weights watch must stay quiet (the control of the next
    test)."""
    recipe = server_recipe(tmp_path / "adapt.yaml", learning_rate=1e-9, max_steps=30, adapt=True)
    code, out = drive(tmp_path, recipe, timeout=1400)
    assert code == 0, out[-5000:]
    run = tmp_path / "run"
    metrics = records(run / "metrics.jsonl")
    steps = [r["step"] for r in metrics if "step_s" in r]
    assert steps == list(range(1, 31)), steps  # every step once, in order, across the layouts
    attempts = records(run / "control" / "attempts.jsonl")
    first = attempts[0]
    assert first["state"] == "stopped-for-checkpoint"
    (moved,) = first["adaptations"]
    assert moved["action"] == "resplit" and moved["reason"].startswith("injected by the test")
    sizes = {"server on 1 GPU(s) (TP 1)", "server on 2 GPU(s) (TP 1 × DP 2)"}
    assert {moved["split"], moved["new_split"]} == sizes
    # Decided once 1 + 3 warm-up steps of the layout were read (the watchdog reads the metrics every second).
    assert moved["measured_s"] > 0 and moved["predicted_s"] > 0 and 4 <= moved["at_step"] < 30
    resumed_at = int(out.split("adapt: resuming from step ")[1].split()[0])
    assert resumed_at >= moved["at_step"] and (run / "output" / f"checkpoint-{resumed_at}").is_dir()
    # The second layout's own decision, from its own steps: a revert exactly when it measured slower.
    second = attempts[1]["adaptations"][0]
    assert second["split"] == moved["new_split"] and second["at_step"] >= resumed_at + 4
    slower = second["measured_s"] > moved["measured_s"] * 1.05
    assert second["action"] == ("revert" if slower else "keep"), second
    if slower:
        assert second["new_split"] == moved["split"] and len(attempts) == 3
    assert attempts[-1]["state"] == "succeeded"
    # Each layout's vLLM server was started as planned: data parallel 2 exactly on the 2-GPU layouts.
    served = sorted((run / "logs").glob("vllm-*.log"))
    layouts = [moved["split"], moved["new_split"], *(a["adaptations"][0]["new_split"] for a in attempts[1:-1])]
    assert len(served) == len(attempts) == len(layouts)
    for log, split in zip(served, layouts, strict=True):
        assert ("'data_parallel_size': 2" in log.read_text(errors="replace")) == ("DP 2" in split), (log, split)
    # Time to the first step, term by term, for every attempt.
    phases = [r["startup"] for r in metrics if "startup" in r]
    for phase in ("model_load", "vllm_ready", "first_sync", "first_generation"):
        assert phases.count(phase) == len(attempts), (phase, phases)
    assert "stale weights" not in out
    status = subprocess.run([sys.executable, "-m", "grpo_launch", "status", str(run)], capture_output=True,
                            text=True, cwd=ROOT)  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert f"step {moved['at_step']}: resplit {moved['split']} → {moved['new_split']}" in status.stdout
    assert "time to first step" in status.stdout


@pytest.mark.extended
def test_a_server_left_on_old_weights_is_caught_and_named(tmp_path):
    """The fault: the trainers learn (learning_rate 1e-3) while the weight transfer does nothing, so vLLM keeps
    sampling from the start-up weights (trl#3247's state). The run stops with the stale-weights failure at the first
    step after the weights part, and nothing is left running. Without the fault (the test above) it completes."""
    # Room for the drift: a tiny model's GRPO update is zero while a group's rewards tie, so how soon the weights move
    # varies (the gap stayed at 0.001 for 7 steps in one CI run); the run stops at the first stale step anyway.
    recipe = server_recipe(tmp_path / "stale.yaml", learning_rate=1e-3, max_steps=30, adapt=False)
    code, out = drive(tmp_path, recipe, timeout=600)
    assert code == 1, out[-5000:]
    (ended,) = records(tmp_path / "run" / "control" / "attempts.jsonl")
    assert ended["failure"] == "stale-weights" and ended["side"] == "vllm", ended
    assert ended["message"].startswith("stale weights: at step ") and "grpo-launch: error: stale weights" in out
    gaps = [r["log"]["sampling/sampling_logp_difference/mean"] for r in records(tmp_path / "run" / "metrics.jsonl")
            if "sampling/sampling_logp_difference/mean" in r.get("log", {})]  # fmt: skip
    assert gaps[0] < 0.01 < 0.05 < gaps[-1]  # in sync at the first step, then two policies apart
    left = subprocess.run(["pgrep", "-af", str(tmp_path / "run")], capture_output=True, text=True).stdout
    assert [x for x in left.splitlines() if "pgrep" not in x] == []

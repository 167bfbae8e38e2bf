"""scripts/gpu_acceptance.sh without a GPU (issue 39 item 4): its syntax, its dry run (the phases and the 8-minute
budget), its stack check against this CPU environment, its own timer, and the JSON its Python helper writes, from a
fake measurement: the real measurement needs a GPU, which no test here has."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from grpo_launch.models.builtin import find_model_shape

from .helpers import ROOT

SCRIPT = ROOT / "scripts" / "gpu_acceptance.sh"
_spec = importlib.util.spec_from_file_location("gpu_acceptance", ROOT / "scripts" / "gpu_acceptance.py")
assert _spec and _spec.loader
acceptance = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(acceptance)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src"), **extra}


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_the_dry_run_lists_every_phase_within_the_eight_minute_budget(tmp_path):
    out = subprocess.run([str(SCRIPT), "--dry-run", str(tmp_path / "o")], capture_output=True, text=True, env=_env())
    assert out.returncode == 0, out.stderr
    names = re.findall(r"^  (\S+)\s+≤\s+(\d+) s", out.stdout, re.M)
    assert [n for n, _ in names] == ["check", "assets", "calibrate-0.5b", "calibrate-1.5b", "run", "report"]
    assert sum(int(s) for _, s in names) <= 480 == acceptance.BUDGET_S
    assert "--random-weights" in out.stdout and "budget 480 s" in out.stdout
    assert not (tmp_path / "o").exists()  # a dry run starts nothing


def test_the_dry_run_refuses_caps_beyond_the_budget(tmp_path):
    out = subprocess.run([str(SCRIPT), "--dry-run", str(tmp_path)], capture_output=True, text=True,
                         env=_env(GPU_ACCEPTANCE_BUDGET_S="300"))  # fmt: skip
    assert out.returncode == 1 and "exceed the budget" in out.stderr


def test_the_check_says_what_this_cpu_environment_lacks(tmp_path):
    """The real check, here: no CUDA build of torch (and no vLLM in the main venv). Exit 3, no traceback."""
    out = subprocess.run([str(SCRIPT), "--check", str(tmp_path)], capture_output=True, text=True, env=_env())
    assert out.returncode == 3, out.stdout + out.stderr
    assert "cannot run the acceptance" in out.stdout and "Traceback" not in out.stdout + out.stderr
    assert "CPU build" in out.stdout or "no CUDA GPU" in out.stdout


def test_the_timer_skips_what_the_budget_cannot_hold_and_still_writes_the_json(tmp_path):
    """A 12 s budget: after the report's reserve no phase has 5 s, so each is skipped by the timer, and the report
    (its reserve) still writes the JSON, with no measurement."""
    out = subprocess.run([str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env=_env(GPU_ACCEPTANCE_BUDGET_S="12"))  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    phases = [json.loads(x) for x in (tmp_path / "phases.jsonl").read_text().splitlines()]
    assert [p["status"] for p in phases[:5]] == ["skipped"] * 5
    assert phases[5]["phase"] == "report" and phases[5]["status"] == "ok" and phases[5]["limit_s"] <= 12
    doc = json.loads((tmp_path / "gpu_acceptance.json").read_text())
    assert doc["schema"] == acceptance.SCHEMA and doc["run"]["measured"] is None
    assert doc["comparison"]["step_s"] is None


def test_the_report_from_a_fake_measurement_has_the_schema():
    """A fake measurement (a GPU run's numbers): the ratios are measured ÷ predicted, the colocated peak is compared
    with the trainer's memory alone and with vLLM's share added."""
    phases = [{"phase": "check", "status": "ok", "seconds": 3, "limit_s": 20, "exit": 0},
              {"phase": "run", "status": "ok", "seconds": 150, "limit_s": 210, "exit": 0}]  # fmt: skip
    measured = {"steps": 5, "step_s": 6.0, "generation_s": 4.0, "training_s": 2.0, "peak_memory_gib": 30.0,
                "memory_kind": "cuda_max_allocated"}  # fmt: skip
    predicted = {"step_s": 5.0, "generation_s": 4.0, "training_s": 1.0, "train_memory_gib": 10.0,
                 "vllm_memory_gib": 20.0}  # fmt: skip
    doc = acceptance.build_report(device="NVIDIA H100 80GB HBM3", versions={"trl": "1.16.0"}, phases=phases,
                                  budget_s=480, measured=measured, predicted=predicted,
                                  calibrations=["cache/b.json", "cache/a.json"])  # fmt: skip
    assert set(doc) == {"schema", "device", "versions", "budget_s", "elapsed_s", "within_budget", "phases",
                        "calibrations", "calibrated", "run", "comparison"}  # fmt: skip
    assert doc["elapsed_s"] == 153 and doc["within_budget"] and doc["calibrations"] == ["cache/a.json", "cache/b.json"]
    c = doc["comparison"]
    assert c["step_s"] == pytest.approx(1.2) and c["training_s"] == pytest.approx(2.0)
    assert c["peak_memory_vs_train"] == pytest.approx(3.0) and c["peak_memory_vs_train_and_vllm"] == pytest.approx(1.0)
    assert doc["run"]["steps"] == 5 and doc["run"]["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    json.dumps(doc)  # it serialises
    late = acceptance.build_report(device="x", versions={}, phases=[{"seconds": 481}], budget_s=480, measured=None,
                                   predicted=None, calibrations=[])  # fmt: skip
    assert not late["within_budget"]


@pytest.mark.parametrize(
    "versions, devices, said",
    [
        ({"torch": "2.9.0+cu128", "transformers": "4.57.1", "trl": "1.16.0", "vllm": "0.31.0", "accelerate": "1.11"},
         1, None),
        ({"torch": "2.9.0+cu128", "transformers": "4.57.1", "trl": "1.16.0", "vllm": None, "accelerate": "1.11"},
         1, "vllm is not installed"),
        ({"torch": "2.9.0+cu128", "transformers": "4.57.1", "trl": "1.16.0", "vllm": "0.32.1", "accelerate": "1.11"},
         1, "newer than TRL 1.16 supports"),
        ({"torch": "2.9.0+cu128", "transformers": "4.55.0", "trl": "1.16.0", "vllm": "0.31.0", "accelerate": "1.11"},
         1, "transformers 4.55.0 is older"),
        ({"torch": "2.9.0", "transformers": "4.57.1", "trl": "1.16.0", "vllm": "0.31.0", "accelerate": "1.11"},
         0, "no CUDA GPU"),
    ],
)  # fmt: skip
def test_the_stack_check(versions, devices, said):
    problems = acceptance.stack_problems(versions, devices)
    assert (not problems) if said is None else any(said in p for p in problems), problems


@pytest.mark.parametrize("model, tied", [("Qwen/Qwen2.5-0.5B-Instruct", True), ("Qwen/Qwen2.5-1.5B-Instruct", True),
                                         ("Qwen/Qwen2.5-7B-Instruct", False)])  # fmt: skip
def test_the_random_weight_configs_come_from_the_built_in_shapes(model, tied):
    shape = find_model_shape(model)
    cfg = acceptance.hf_config(model)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["vocab_size"], cfg["intermediate_size"]) == (shape.hidden, shape.layers, shape.heads, shape.kv_heads,
                                                              shape.vocab, shape.intermediate)  # fmt: skip
    assert cfg["tie_word_embeddings"] is tied


def test_the_run_recipe_plans_colocated_on_one_h100(tmp_path):
    """The recipe the script runs (its random model stood in by the same built-in shape): TRL accepts its values,
    it plans colocated on one GPU, and the plan counts the completions' full length the random model generates."""
    import yaml

    from .helpers import plan_recipe

    values = yaml.safe_load(acceptance._recipe(tmp_path / "m", tmp_path / "d.jsonl", tmp_path / "run", [0, 1, 2]))
    values["model_name_or_path"] = acceptance.RUN_MODEL
    plan = plan_recipe(values, "1xH100-80GB")
    assert plan.vllm.mode == "colocate" and plan.layout.num_generations == 8
    assert plan.estimate.workload.mean_completion_len == 256 and values["max_steps"] == acceptance.RUN_STEPS


def test_the_report_reads_a_run_directory_as_the_launcher_wrote_it(tmp_path):
    """The report's reading of the 5-step run: plan.json written by the real `grpo-launch plan` of the script's recipe
    (the random model stood in by its built-in shape), metrics.jsonl with a GPU run's step lines (fake numbers:
    the real ones need a GPU). The measured means leave out the first step (it warms up), as `status` does."""
    import yaml

    from grpo_launch.cli import main

    recipe = acceptance._recipe(tmp_path / "m", tmp_path / "d.jsonl", tmp_path / "run", [0, 1, 2])
    values = yaml.safe_load(recipe) | {"model_name_or_path": acceptance.RUN_MODEL}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(values))
    assert main(["plan", str(tmp_path / "recipe.yaml"), "--gpus", "1xH100-80GB"], environ={}) == 0
    gib = 2**30
    steps = [
        {"step": s, "step_s": 9.0 if s == 1 else 2.0, "generation_s": 1.5, "training_s": 0.5, "max_steps": 5,
         "peak_memory_bytes": [int((30 + s) * gib)], "memory_kind": "cuda_max_allocated"}
        for s in range(1, 6)
    ]  # fmt: skip
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (tmp_path / "phases.jsonl").write_text(json.dumps({"phase": "run", "status": "ok", "seconds": 100}) + "\n")
    assert acceptance.report(tmp_path, tmp_path / "out.json") == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    measured, predicted = doc["run"]["measured"], doc["run"]["predicted"]
    assert measured["steps"] == 5 and measured["step_s"] == pytest.approx(2.0) and measured["peak_memory_gib"] == 35
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())["estimate"]
    assert predicted["step_s"] == pytest.approx(plan["time_s"]["step"])
    assert predicted["train_memory_gib"] == pytest.approx(plan["memory_per_training_gpu_gib"]["total"])
    assert predicted["vllm_memory_gib"] == pytest.approx(plan["vllm_memory_per_gpu_gib"]["total"])
    assert doc["comparison"]["step_s"] == pytest.approx(2.0 / predicted["step_s"])
    assert doc["phases"] == [{"phase": "run", "status": "ok", "seconds": 100}] and doc["within_budget"]


def test_the_report_names_each_calibrations_memory_and_sync_against_the_model(tmp_path):
    """The calibrations the acceptance made, read back: the training step's peak against the memory model's tensors
    (with and without checkpointing) and the weight sync with its path."""
    from grpo_launch.machines.measured import MeasuredTerms
    from grpo_launch.probe.calibration import CalibrationKey, CalibrationRecord, save_calibration

    terms = MeasuredTerms(device="NVIDIA H100 80GB HBM3", step_peak_bytes=3 * 2**30, step_peak_predicted_bytes=2**31,
                          step_peak_bytes_ckpt=2**31, step_peak_predicted_bytes_ckpt=2**31, sync_s=0.25,
                          sync_path="nccl")  # fmt: skip
    key = CalibrationKey("NVIDIA H100 80GB HBM3", "abc", "bfloat16", (("trl", "1.16.0"),))
    save_calibration(CalibrationRecord(key, terms), {"GRPO_LAUNCH_CALIBRATIONS": str(tmp_path / "cal")})
    (one,) = acceptance.calibration_summaries(tmp_path / "cal")
    assert (one["sync_s"], one["sync_path"]) == (0.25, "nccl")
    assert [(p["checkpointing"], p["ratio"]) for p in one["step_peak"]] == [(False, 1.5), (True, 1.0)]
    doc = acceptance.build_report(device="x", versions={}, phases=[], budget_s=480, measured=None, predicted=None,
                                  calibrations=[], calibrated=[one])  # fmt: skip
    assert doc["calibrated"] == [one]

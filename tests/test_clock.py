"""A clock the plan can run by: the plan takes each term ``grpo-launch calibrate`` measured for its case and the
table's for the rest (side by side in --explain and plan.json), prices transformers' decode and ZeRO-3 as they
behave on small models, forecasts the time to first step as the phases the run records, and stores the planner's
own step (its overlap included) so that nothing reading plan.json adds the terms up again.

The replay reads the first real GPU evidence (one H200, no vLLM), copied from ../shared/gpu-evidence into
tests/data/gpu-evidence: the plan for its recipe on --gpus 1xH200-141GB with its calibration file must predict
the run's warm generation, training and step within ±25 % and its time to first step within ±50 %. The constants
the decode floor, the per-sequence cost and the first step's warm-up take from that evidence are named as such in
constants.py: the replay shows the model reproduces its evidence, not that it holds on other hosts (the evidence
itself says the launch floor differs 4× between two H200 hosts; only a calibration on the machine fixes it)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from grpo_launch.cli import main
from grpo_launch.machines.calibrated_speed import MeasuredTerms
from grpo_launch.machines.gpus import find_gpu_spec
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning.cost.constants import CONSTANTS
from grpo_launch.planning.cost.steptime import (
    StepTime,
    transformers_decode_step_s,
    zero3_gather_time,
)
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.measured_scales import from_record
from grpo_launch.probe.calibration_store import read_calibration
from grpo_launch.render import plan_json, render_files
from grpo_launch.rundir.files import write_run_files
from grpo_launch.rundir.records import StepRecord, append

from .helpers import ROOT, ensure_tiny_assets, plan_recipe

EVIDENCE = ROOT / "tests" / "data" / "gpu-evidence" / "h200-2026-11-28"
SHARED = ROOT.parent / "shared" / "gpu-evidence" / "h200-2026-11-28"
QWEN05 = "Qwen/Qwen2.5-0.5B-Instruct"


def _evidence_plan(backend: str | None = None, calibration: str = "qwen2.5-0.5b-shape-h200.json"):
    """The evidence run's recipe (its model by the built-in shape, its data by the tiny set), planned on one H200
    with the evidence's calibration file, as ``plan`` would take it on that machine."""
    values = yaml.safe_load((EVIDENCE / "ddp-vllm-off-0.5b" / "recipe.yaml").read_text())
    values["model_name_or_path"] = QWEN05
    values["dataset_name"] = str(ensure_tiny_assets() / "data" / "train.jsonl")
    values["launch"].pop("run_dir")
    if backend:
        values["launch"]["backend"] = backend
    record = read_calibration(EVIDENCE / "calibrations" / calibration)
    model = find_model_shape(QWEN05)
    gpu = parse_gpu_spec("1xH200-141GB").planning_gpu_spec
    cal, _ = from_record(record.terms, calibration, model, gpu, {k: int(v) for k, v in record.at})
    return plan_recipe(values, "1xH200-141GB", calibration=cal)


def _measured_run() -> tuple[dict[str, float], float]:
    """The evidence run's warm steps (2-6: the first warms up) and its time to first step (start-up + first
    generation, as its records say)."""
    rows = [json.loads(line) for line in (EVIDENCE / "ddp-vllm-off-0.5b" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step_s" in r][1:]
    warm = {k: sum(r[k] for r in steps) / len(steps) for k in ("generation_s", "training_s", "step_s")}
    return warm, sum(r["seconds"] for r in rows if "startup" in r)


def test_the_evidence_copy_is_the_shared_evidence():
    """The replay reads the copy CI has; where ../shared is beside the checkout, the copy is the same."""
    if not SHARED.is_dir():
        pytest.skip("no ../shared/gpu-evidence beside this checkout (CI): the copy is what is replayed")
    for path in SHARED.rglob("*"):
        if path.is_file():
            assert (EVIDENCE / path.relative_to(SHARED)).read_bytes() == path.read_bytes(), path


def test_the_h200_evidence_is_replayed_within_its_bands():
    """Before: generation 0.84 s against 7.4–9.8 s measured (×9–10), the step ×5.7, the first step ×12."""
    plan = _evidence_plan()
    est = plan.estimate
    warm, first = _measured_run()
    ratios = {
        "generation": est.step.trainer_generation_s / warm["generation_s"],
        "training": est.step.training_s / warm["training_s"],
        "step": est.step.total_s / warm["step_s"],
        "first step": est.startup_s / first,
    }
    print("\npredicted / measured:", {k: round(v, 2) for k, v in ratios.items()})
    for term in ("generation", "training", "step"):
        assert 0.75 <= ratios[term] <= 1.25, (term, ratios)
    assert 0.5 <= ratios["first step"] <= 1.5, ratios
    # the calibration's decode (batch 1) is used, extended to the 128 sequences TRL decodes at once
    used = {t.name: t for t in est.terms}
    assert used["generation"].used == "measured" and used["training"].used == "table"
    assert any("128 sequences per trainer" in line and "extended" in line for line in est.explain)


def test_the_evidence_run_decodes_its_whole_round_at_once():
    """TRL 1.16 hands generate the whole round's share of a trainer (grpo_trainer.py _generate_single_turn): 128
    sequences here, not four micro-batches of 32 (the step the plan used to price)."""
    plan = _evidence_plan()
    assert plan.layout.per_device_train_batch_size == 32 and plan.layout.generation_batch_size == 128
    assert any("128 sequences" in line for line in plan.estimate.explain)


def test_zero3_on_a_small_model_pays_a_cost_per_layer_and_pass():
    """The evidence's ZeRO-3 run of the same recipe trained far slower than DDP: the gathers' cost per layer and
    pass, which the table had as a flat ×1.1 ("assumed"), now dominates a 0.5B model's training step."""
    ddp, zero3 = _evidence_plan().estimate.step, _evidence_plan("zero3").estimate.step
    work = _evidence_plan("zero3").estimate.workload
    gathers = zero3_gather_time(find_model_shape(QWEN05), 1, work, passes=3)
    assert zero3.training_s == pytest.approx(ddp.training_s + gathers, rel=1e-6)
    assert gathers > 0.5 * ddp.training_s  # 4 micro-batches × 3 passes × 24 layers


# --- every constant this adds, against its source ------------------------------------------------------------


def test_the_decode_floor_is_the_h200_evidences_batch_one_step():
    """transformers_decode_s_per_layer: calibrate's batch-1 decode on the H200, 20.7 ms (0.5B, 24 layers) and
    27.0 ms (1.5B, 28 layers), at the table's bandwidth the floor is the whole step at batch 1."""
    h200 = find_gpu_spec("H200-141GB")
    for name, file, measured in ((QWEN05, "qwen2.5-0.5b-shape-h200.json", 20.7e-3),
                                 ("Qwen/Qwen2.5-1.5B-Instruct", "qwen2.5-1.5b-shape-h200.json", 27.0e-3)):  # fmt: skip
        assert read_calibration(EVIDENCE / "calibrations" / file).terms.decode[0][1] == pytest.approx(measured, 0.01)
        assert transformers_decode_step_s(find_model_shape(name), h200, 1, 192) == pytest.approx(measured, rel=0.15)


def test_the_cost_per_sequence_lies_within_the_evidences_two_hosts():
    """transformers_decode_s_per_seq_layer: the second H200 host rose 73 → 92 ms from batch 1 to 128 and to 116 ms
    at 256 (6.2 and 7.8 µs a sequence and layer); the first host's run, 256 steps in 7.4–8.5 s warm at batch 128
    against 20.7 ms at batch 1, 2.7–3.5 µs. The constant lies between them."""
    per_layer = CONSTANTS["transformers_decode_s_per_seq_layer"].value
    second = ((92 - 73) / 127 / 24 * 1e-3, (116 - 92) / 128 / 24 * 1e-3)
    first = ((7.47 / 256 - 20.7e-3) / 127 / 24, (8.13 / 256 - 20.7e-3) / 127 / 24)
    assert min(first) <= per_layer <= max(second)


def test_zero3s_cost_per_layer_reproduces_its_sources():
    """zero3_layer_pass_s: DeepSpeed #1174 after PR #1188 (5.1B BERT, 64 layers, 8 × A100 NVLink) forward 270 ms
    against ZeRO-2's 60 ms; BELLE #402 (BLOOM-560M, 24 layers, 2 × TITAN RTX over PCIe 3, batch 1 × 512): 2.6 against
    6.8 batches/s. The fixed cost plus each layer's bytes at the link's rate."""
    fixed = CONSTANTS["zero3_layer_pass_s"].value
    nvlink = CONSTANTS["zero3_gather_bytes_per_s"].value
    bert = 64 * (fixed + 2 * 5.1e9 / 64 * 7 / 8 / nvlink)
    assert bert == pytest.approx(0.270 - 0.060, rel=0.2)
    pcie3 = 12e9  # PCIe 3.0 x16, what a TITAN RTX has
    bloom = 2 * 24 * (fixed + 2 * 0.56e9 / 24 / 2 / pcie3)
    assert bloom == pytest.approx(1 / 2.6 - 1 / 6.8, rel=0.3)


def test_the_first_steps_warm_up_is_the_h200_evidences():
    """first_generation_warmup_s_per_step, first_training_warmup_s: the evidence run's first generation 22.3 s
    against 7.4–9.8 s warm (256 steps), its first training step 3.4 s against 0.73–0.93 s."""
    rows = [json.loads(line) for line in (EVIDENCE / "ddp-vllm-off-0.5b" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step_s" in r]
    warm_gen = [s["generation_s"] for s in steps[1:]]
    per_step = [(steps[0]["generation_s"] - w) / 256 for w in warm_gen]
    assert min(per_step) <= CONSTANTS["first_generation_warmup_s_per_step"].value <= max(per_step)
    warm_train = [s["training_s"] for s in steps[1:]]
    extra = [steps[0]["training_s"] - w for w in warm_train]
    assert min(extra) <= CONSTANTS["first_training_warmup_s"].value <= max(extra)


def test_the_trainers_start_constants_lie_within_their_sources():
    """launcher_start_s: accelerate launch + torchrun of a no-op, 5.7 s on this project's 2-core machines where
    `import torch` takes 4.1 s (a GPU host's CPU is faster); trainer_imports_s: TRL's import ≈ 5 s (REAL-COMPONENTS),
    12.4 s for torch + transformers + TRL on the 2-core machines."""
    assert 2.0 <= CONSTANTS["launcher_start_s"].value <= 5.7
    assert 5.0 <= CONSTANTS["trainer_imports_s"].value <= 12.4


# --- the plan uses each measured term for its case -------------------------------------------------------------


def _gpu_terms(**more) -> MeasuredTerms:
    return MeasuredTerms(device="NVIDIA H200", decode=((1, 0.020), (64, 0.024), (128, 0.030)), prefill_s=0.02,
                         prefill_batch=32, train_tokens_per_s=60_000.0, train_tokens_per_s_ckpt=45_000.0,
                         fused_head=True, **more)  # fmt: skip


def _plan_with(terms: MeasuredTerms, backend: str | None = None):
    values = yaml.safe_load((EVIDENCE / "ddp-vllm-off-0.5b" / "recipe.yaml").read_text())
    values["model_name_or_path"] = QWEN05
    values["launch"] = {"vllm": "off", "expected_completion_length": 256} | ({"backend": backend} if backend else {})
    model, gpu = find_model_shape(QWEN05), parse_gpu_spec("1xH200-141GB").planning_gpu_spec
    at = {"per_device_train_batch_size": 32, "prompt_len": 64, "completion_len": 256}
    cal, _ = from_record(terms, "f.json", model, gpu, at)
    return plan_recipe(values, "1xH200-141GB", calibration=cal)


def test_a_decode_curve_at_the_plans_batch_is_the_generation():
    plan = _plan_with(_gpu_terms())
    gen = plan.estimate.step.generation_s
    assert gen == pytest.approx(256 * 0.030 + 0.02 * 128 / 32, rel=1e-6)  # 256 steps at batch 128 + 4 prompt passes
    terms = {t.name: t for t in plan.estimate.terms}
    assert terms["generation"].measured_s == pytest.approx(gen) and terms["generation"].table_s not in (None, gen)


def test_a_measured_backend_is_the_training_and_an_unmeasured_one_adds_the_tables_cost():
    tokens = 128 * (64 + 256)
    ddp = _plan_with(_gpu_terms()).estimate.step.training_s
    assert ddp == pytest.approx(tokens / 45_000, rel=1e-6)  # the recipe checkpoints its activations
    measured = _plan_with(_gpu_terms(backend_train=(("zero3", True, 9_000.0),)), "zero3").estimate
    assert measured.step.training_s == pytest.approx(tokens / 9_000, rel=1e-6)
    unmeasured = _plan_with(_gpu_terms(), "zero3").estimate
    gathers = zero3_gather_time(find_model_shape(QWEN05), 1, unmeasured.workload, passes=3)
    assert unmeasured.step.training_s == pytest.approx(tokens / 45_000 + gathers, rel=1e-6)


def test_a_calibration_from_before_the_fused_head_scales_the_table_instead():
    """Format-1 files measured training through torch's log-softmax over the whole logits, not TRL's fused head:
    their rates stand for the GPU's speed against the table, not for the step."""
    old = dataclasses.replace(_gpu_terms(), fused_head=False)
    terms = {t.name: t for t in _plan_with(old).estimate.terms}
    assert terms["training"].used == "table" and terms["generation"].used == "measured"


def test_explain_shows_the_table_and_the_measured_terms_side_by_side(tmp_path, capsys):
    from grpo_launch.cli.explain import explain_sections

    plan = _plan_with(_gpu_terms())
    text = "\n".join(str(row) for section in explain_sections(plan) for row in [section.title, *section.rows])
    assert "Step terms: the table's and calibrate's" in text
    assert "generation" in text and "measured" in text and "table" in text


def test_the_first_steps_phases_are_named_as_the_run_records_them():
    from grpo_launch.rundir.startup_phases import STARTUP_PHASES

    plan = _plan_with(_gpu_terms(imports_s=6.0, load_s=2.0, load_bytes=4_000_000_000,
                                 warmup_decode_s_per_step=0.01))  # fmt: skip
    startup = plan.estimate.startup
    names = [p.name for p in startup.phases]
    assert set(names) <= set(STARTUP_PHASES) and names[0] == "start" and names[-1] == "first_generation"
    by = {p.name: p for p in startup.phases}
    assert by["start"].measured and by["start"].seconds == pytest.approx(6.0 + CONSTANTS["launcher_start_s"].value)
    model = find_model_shape(QWEN05)
    assert by["model_load"].seconds == pytest.approx(model.weight_bytes_bf16 / 2e9)  # 4 GB in 2 s: 2 GB/s
    assert by["first_generation"].seconds == pytest.approx(plan.estimate.step.generation_s + 256 * 0.01)
    assert plan.estimate.startup_s == pytest.approx(sum(p.seconds for p in startup.phases))


# --- one prediction -----------------------------------------------------------------------------------------------


def test_plan_json_stores_the_planners_own_step_and_status_follows_it(tmp_path, monkeypatch, capsys):
    """Before: plan.json's prediction added the terms without the overlap (qwen7b-math async on 8 × H100: 26.56 s
    where the planner said 16.64 s), and status, the report and calibration compared against that sum. Here the
    planner's rule is changed, and status's planned time follows it."""
    plan = plan_recipe(ROOT / "recipes" / "qwen7b-math.yaml", "8xH100-80GB", "launch.mode=async")
    step = plan.estimate.step
    assert step.overlapped and step.total_s < step.sequential_s
    data = json.loads(json.dumps(plan_json.plan_to_dict(plan), default=str))
    assert data["estimate"]["time_s"]["step"] == pytest.approx(step.total_s)
    assert data["estimate"]["time_s"]["overlapped"] is True

    monkeypatch.setattr(StepTime, "total_s", property(lambda self: 42.0))  # another overlap rule
    run = tmp_path / "run"
    write_run_files(run, render_files(plan))
    for i in range(1, 3):
        append(run / "metrics.jsonl", StepRecord(i, 30.0, 20.0, 10.0, max_steps=12, time=1e9 + 30 * i))
    assert main(["status", str(run), "--json"], environ={}) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["planned_eta_s"] == pytest.approx(10 * 42.0)


# --- the trainers' own start -------------------------------------------------------------------------------------


def test_a_rank_counts_its_start_from_the_launchers_start_of_it():
    from grpo_launch.rundir.layout import SPAWNED_AT_ENV
    from grpo_launch.train.startup import started_at

    assert started_at({SPAWNED_AT_ENV: "1000.5"}, now=1010.0) == 1000.5
    # a time from another clock (ahead, or days old) is not taken: the process's own start is
    import time

    own = started_at({SPAWNED_AT_ENV: "2000"}, now=1010.0)
    assert own != 2000.0 and started_at({}, now=1010.0) == pytest.approx(own, abs=0.05)
    assert own <= time.time()  # this process's start: before now


def test_a_workload_records_whether_it_generates_by_continuous_batching():
    work = Workload(prompt_len=8, completion_len=8, completions=8, num_generations=4, per_device=4,
                    gradient_checkpointing=False, continuous_batching=True)  # fmt: skip
    assert Workload.from_dict(work.to_dict()).continuous_batching is True


def test_the_evidence_files_are_what_the_readme_says(tmp_path):
    """The copy holds the calibrations and the run the replay reads."""
    for name in ("calibrations/qwen2.5-0.5b-shape-h200.json", "ddp-vllm-off-0.5b/metrics.jsonl",
                 "ddp-vllm-off-0.5b/recipe.yaml", "ddp-vllm-off-0.5b/plan.json"):  # fmt: skip
        assert (EVIDENCE / name).is_file(), name
    assert Path(EVIDENCE / "README.md").read_text().startswith("# Real GPU evidence")

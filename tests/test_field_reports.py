"""The field as a judge: every report in tests/field_reports.py that the planner can judge, judged. A run that
worked must plan (it fits) and its measured peak fall within ±15 % of the prediction; an out-of-memory report must
be refused for memory with the reporter's settings; a layout error must get a layout TRL's own GRPOConfig accepts
with the reporter's group size, or a refusal that says what to change. Known disagreements are listed with their
reason in the table, and fail here the day they start to agree (so the table stays true)."""

from __future__ import annotations

import pytest

from grpo_launch.errors import ConfigError, PlanError

from .field_reports import LAYOUT, OOM_TRAIN, OOM_VLLM, REPORTS, Report
from .helpers import plan_recipe
from .trl_oracle import grpo_config

PEAK_BAND = 0.15
JUDGED = [r for r in REPORTS if not r.not_judged]


def judge(r: Report) -> tuple[bool, str]:
    """Whether the planner agrees with what the reporter saw, and what it said."""
    try:
        plan = plan_recipe(r.values, r.gpus)
    except (PlanError, ConfigError) as exc:
        said = " ".join(exc.render().split())
        if r.outcome == LAYOUT:
            return bool(getattr(exc, "fixes", None)) or "num_generations" in said, f"refused: {said}"
        memory = any(w in said for w in ("does not fit", "out of memory", "KV cache"))
        return r.outcome in (OOM_TRAIN, OOM_VLLM) and memory, f"refused: {said}"
    if r.outcome == LAYOUT:
        lay = plan.layout
        grpo_config(plan.trainer_values, lay.num_processes)  # raises where TRL would
        same_group = lay.num_generations == r.values.get("num_generations")
        shape = f"{lay.per_device_train_batch_size}×{lay.num_processes}×{lay.gradient_accumulation_steps}"
        return same_group, f"layout {shape} ({lay.num_generations} per prompt), accepted by TRL"
    est = plan.estimate
    mem = est.train_memory_gib if est else None
    if r.outcome in (OOM_TRAIN, OOM_VLLM):
        return False, f"predicted to fit: {mem:.1f} GiB per training GPU" if mem else "predicted to fit"
    if r.peak_gib is not None and mem is not None:
        share = est.vllm_memory_gib if plan.vllm.mode == "colocate" and est.vllm_memory_gib else 0.0
        ratio = (mem + share) / r.peak_gib
        return abs(
            ratio - 1
        ) <= PEAK_BAND, f"fits; predicted peak {mem + share:.1f} GiB ÷ measured {r.peak_gib:.1f} = {ratio:.2f}"
    return True, "fits" + (f": {mem:.1f} GiB per training GPU" if mem else "")


@pytest.mark.parametrize("report", JUDGED, ids=lambda r: r.id)
def test_the_planner_agrees_with_the_field_report(report):
    agrees, said = judge(report)
    if report.disagrees:
        assert not agrees, f"{report.id} now agrees ({said}): drop its disagreement from tests/field_reports.py"
    else:
        assert agrees, f"{report.id} ({report.outcome}, {report.url}): the planner {said}"


def test_the_field_table_is_large_and_mostly_agreed_with():
    """At least 20 reports, every one with its link and the reporter's words; ≥ 90 % of the judged agree."""
    assert len(REPORTS) >= 20 and len({r.id for r in REPORTS}) == len(REPORTS)
    assert all(r.url.startswith("https://") and r.quote for r in REPORTS)
    outcomes = {r.outcome for r in JUDGED}
    assert outcomes >= {"ran", OOM_TRAIN, LAYOUT}
    agreeing = [r for r in JUDGED if not r.disagrees]
    assert len(JUDGED) >= 20 and len(agreeing) / len(JUDGED) >= 0.90, [r.id for r in JUDGED if r.disagrees]


def test_the_qwen3_1_7b_disagreement_is_the_fragmentation_term_at_the_gpu_limit():
    """Issue 39: trl #3456's 1.7B run read 95.4 % of its A100, where PyTorch's allocator frees its cache and retries
    rather than fail, so its peak carries little allocator fragmentation. Planned on a GPU large enough to plan it:
    the tensors and the CUDA context alone are within 10 % above the reading, while the whole prediction (with the
    15 % fragmentation) is more than 15 % above it; the 0.6B run, at 59 % of the GPU, measured above its tensors
    (its fragmentation is there) and within the band of the whole prediction."""
    from grpo_launch.planning.cost.constants import OVERHEAD_FRACTION

    from .field_reports import REPORTS

    def tensors_and_total(rid: str) -> tuple[float, float, float]:
        r = next(x for x in REPORTS if x.id == rid)
        m = plan_recipe(r.values, "1xGPU-200GB").estimate.train_memory
        tensors = (m.total / m.scale - m.overhead) / (1 + OVERHEAD_FRACTION) + m.overhead
        return tensors / 2**30, m.total / 2**30, float(r.peak_gib)

    tensors, total, peak = tensors_and_total("trl-3456-qwen3-1.7b-a100")
    assert 1.0 <= tensors / peak <= 1.10 and total / peak > 1 + PEAK_BAND, (tensors, total, peak)
    tensors, total, peak = tensors_and_total("trl-3456-qwen3-0.6b-a100")
    assert tensors < peak and abs(total / peak - 1) <= PEAK_BAND, (tensors, total, peak)

"""make_plan(topology, recipe, model) → Plan: the planner's face. Pure: no torch/trl import, no environment reads,
no files.

One planning pass (:func:`.planner.plan_once`) makes the plan. When it refuses, every fix the refusal offers is
planned again with that same pass before it is shown (:mod:`.refusal.verify`), and a refusal for want of GPUs says
how many would do. Calls run downward only: this module → :mod:`.planner` → :mod:`.modes` → :mod:`.search` →
:mod:`.one_split`.
"""

from __future__ import annotations

from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.planning.one_split import DEFAULT_RUN_ROOT, default_run_dir
from grpo_launch.planning.planner import plan_once, plan_split
from grpo_launch.planning.refusal import verify
from grpo_launch.planning.types import Plan, Runtime
from grpo_launch.recipe import Recipe

__all__ = ["DEFAULT_RUN_ROOT", "Plan", "default_run_dir", "make_plan", "plan_split"]


def make_plan(
    topology: Topology,
    recipe: Recipe,
    model: ModelShape | None = None,
    *,
    runtime: Runtime | None = None,
    calibration: Calibration | None = None,
) -> Plan:
    """Plan a GRPO run of ``recipe`` on ``topology``. Raises :class:`PlanError` listing every problem.

    ``runtime`` holds what the plan needs of where it runs (run directory, Python, vLLM version, dataset rows);
    ``calibration`` scales the estimates by a previous run's measurements (``plan --calibrate-from``).
    """
    runtime = runtime or Runtime()
    try:
        return plan_once(topology, recipe, model, calibration, runtime)
    except PlanError as exc:
        error = verify.verified(exc, recipe, lambda r: plan_once(topology, r, model, calibration, runtime))
        raise verify.with_gpu_count(
            error, topology, lambda t: plan_once(t, recipe, model, calibration, runtime)
        ) from None

"""Planning (pure: no torch/trl import, no environment reads, no files): ``make_plan(topology, recipe, model)``
→ :class:`Plan`. Calls run downward: :mod:`.planner` → :mod:`.planner` → :mod:`.modes` → :mod:`.search` →
:mod:`.split_in_full` (one split in full: placement, batch layout, training, vLLM sizing, the estimate); the splits
and the set the recipe allows are :mod:`.splits`, the cost model :mod:`.cost`, refusals :mod:`.refusal`."""

from grpo_launch.planning.plan_types import Plan
from grpo_launch.planning.planner import DEFAULT_RUN_ROOT, default_run_dir, make_plan, plan_split

__all__ = ["DEFAULT_RUN_ROOT", "Plan", "default_run_dir", "make_plan", "plan_split"]

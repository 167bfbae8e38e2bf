"""Planning (pure: no torch/trl import, no environment reads, no files): ``make_plan(topology, recipe, model)``
→ :class:`Plan`. Calls run downward: :mod:`.plan` → :mod:`.modes` → :mod:`.search` → :mod:`.one_split` (one split in
full: placement, batch layout, training, vLLM sizing, the estimate); the splits and the set the recipe allows are
:mod:`.splits`, the cost model :mod:`.cost`, refusals :mod:`.refusal`."""

from grpo_launch.planning.plan import DEFAULT_RUN_ROOT, default_run_dir, make_plan, plan_split
from grpo_launch.planning.types import Plan

__all__ = ["DEFAULT_RUN_ROOT", "Plan", "default_run_dir", "make_plan", "plan_split"]

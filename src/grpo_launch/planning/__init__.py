"""Planning (pure: no torch/trl import, no environment reads, no files): ``make_plan(topology, recipe, model)``
→ :class:`Plan`. :mod:`.plan` searches the splits and plans each one; placement, layout, training and the estimate
each have their module, the cost model its folder (:mod:`.cost`), refusals theirs (:mod:`.refusal`)."""

from grpo_launch.planning.plan import DEFAULT_RUN_ROOT, default_run_dir, make_plan, plan_split
from grpo_launch.planning.types import Plan

__all__ = ["DEFAULT_RUN_ROOT", "Plan", "default_run_dir", "make_plan", "plan_split"]

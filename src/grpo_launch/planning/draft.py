"""The plan under construction (pure data): what one split's steps have decided by the time the estimate prices
it. Passed whole to :func:`grpo_launch.planning.estimate.estimate_plan` instead of its parts one by one."""

from __future__ import annotations

from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.batch_layout import Layout
from grpo_launch.planning.cost.memory import VllmMemory
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.training import Training
from grpo_launch.planning.types import TrainPlan, VllmPlan
from grpo_launch.recipe import Recipe
from grpo_launch.spec import frozen


@frozen
class Draft:
    """One split's decisions before its estimate: where vLLM and the trainers run (``vllm``, ``train``), the batch
    ``layout``, the ``workload`` one step processes, the ``training`` setting and its memory, vLLM's ``sizing``, and
    the training set's ``rows`` when known (``rows_why``: where they came from, or why they are unknown)."""

    topology: Topology
    recipe: Recipe
    model: ModelShape | None
    vllm: VllmPlan
    train: TrainPlan
    layout: Layout
    workload: Workload
    training: Training
    sizing: VllmMemory | None = None
    rows: int | None = None
    rows_why: str = ""

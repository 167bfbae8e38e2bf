"""The split search's context: what every split of one plan shares, computed once (pure). The topology, the recipe
and the model; the previous run's calibration and the runtime; what was decided before any split (``base``); and
the values each split would otherwise recompute: the recipe's batch request, its group size, the GPU the estimate
prices, and whether there is an estimate at all."""

from __future__ import annotations

from grpo_launch.machines.gpus import GpuSpec
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.batch_layout import LayoutRequest
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.planning.plan_types import Runtime, Trace
from grpo_launch.recipe import Recipe
from grpo_launch.spec import frozen


@frozen
class Context:
    """One plan's inputs, shared by every split it plans (``base`` collects what is decided before any split)."""

    topology: Topology
    recipe: Recipe
    model: ModelShape | None
    calibration: Calibration | None
    runtime: Runtime
    base: Trace
    request: LayoutRequest  # the recipe's batch values (None: chosen)
    gpu: GpuSpec | None  # the GPU the step time is priced on (None: its speed is unknown)

    @classmethod
    def of(
        cls,
        topology: Topology,
        recipe: Recipe,
        model: ModelShape | None,
        calibration: Calibration | None,
        runtime: Runtime,
        base: Trace,
    ) -> Context:
        request = LayoutRequest.from_values(recipe.values)
        return cls(topology, recipe, model, calibration, runtime, base, request, topology.planning_gpu_spec)

    @property
    def group(self) -> int:
        """Completions per prompt (num_generations, else TRL's default)."""
        return self.request.group

    @property
    def estimable(self) -> bool:
        """Whether the splits can be compared: the model, the GPU's speed and its memory are known."""
        return self.model is not None and self.gpu is not None and self.topology.min_gpu_memory_bytes is not None

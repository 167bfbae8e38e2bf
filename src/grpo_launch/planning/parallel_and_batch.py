"""The planner's small value types (pure): how a vLLM engine or server is parallelised (:class:`Parallelism`),
how large one optimizer step's batch is (:class:`Batch`) and the batch layout TRL gets (:class:`Layout`, which
:mod:`.batch_layout` solves). The lowest module of planning (it reads only TRL's
generated defaults): the cost model, the splits and the plan all take them, so none of them passes loose TP/PP/DP
values or a bare completion count."""

from __future__ import annotations

from typing import Any

from grpo_launch.recipe.trl_schema import DEFAULTS
from grpo_launch.spec import frozen

# TRL's GRPOConfig.num_generations default (the schema generated from TRL): the group size wherever the recipe
# leaves it unset.
TRL_GROUP_SIZE = int(DEFAULTS["num_generations"])


def group_size(num_generations: int | None) -> int:
    """The completions per prompt: the recipe's num_generations, else TRL's default."""
    return num_generations or TRL_GROUP_SIZE


@frozen
class Parallelism:
    """One vLLM engine or server's parallelism: ``tp`` tensor-parallel GPUs × ``pp`` pipeline stages per replica,
    ``dp`` replicas (a server's data-parallel ranks, or colocated engines), and ``ep``: the routed experts of a
    mixture of experts spread over all of its GPUs (vLLM's ``--enable-expert-parallel``)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: bool = False

    @property
    def gpus(self) -> int:
        """Every GPU it holds: TP × PP × DP."""
        return self.tp * self.pp * self.dp

    @property
    def replica_gpus(self) -> int:
        """The GPUs of one replica: TP × PP."""
        return self.tp * self.pp

    @property
    def label(self) -> str:
        """ "TP 4", "TP 2 × DP 4", "TP 8 × PP 2 × DP 2": the stages and replicas only when there are several."""
        return self._label(always_dp=False)

    @property
    def server_label(self) -> str:
        """A server's shape as its estimate states it: the DP size always, and expert parallelism when on."""
        return self._label(always_dp=True) + (" with expert parallelism" if self.ep else "")

    def _label(self, *, always_dp: bool) -> str:
        label = f"TP {self.tp}" + (f" × PP {self.pp}" if self.pp > 1 else "")
        return label + (f" × DP {self.dp}" if always_dp or self.dp > 1 else "")


@frozen
class Batch:
    """One optimizer step's batch: ``prompts`` prompt groups of ``group`` completions each (num_generations)."""

    prompts: int
    group: int

    @property
    def completions(self) -> int:
        return self.prompts * self.group

    def times(self, factor: int) -> Batch:
        """The same groups, ``factor`` times as many prompts."""
        return Batch(self.prompts * factor, self.group)


@frozen
class Layout:
    """The batch layout TRL gets: processes, per-device batch, accumulation, generation batch and group size."""

    num_processes: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    generation_batch_size: int
    num_generations: int
    per_device_eval_batch_size: int | None = None  # set when evaluation is on
    num_generations_eval: int | None = None
    generation_batch_size_given: bool = False  # the user set generation_batch_size (not steps_per_generation)
    # The key by which the recipe sets its own batch when this layout keeps the recipe's values (each split runs them
    # on its own trainers); None when it meets a pinned or default batch (launch.prompts_per_step).
    recipe_batch_key: str | None = None

    @property
    def prompts_per_generation(self) -> int:
        return self.generation_batch_size // self.num_generations

    @property
    def completions_per_optimizer_step(self) -> int:
        return self.per_device_train_batch_size * self.num_processes * self.gradient_accumulation_steps

    def trl_values(self) -> dict[str, Any]:
        """The keys to write into the trainer's recipe. Exactly one of generation_batch_size/steps_per_generation."""
        out: dict[str, Any] = {
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "num_generations": self.num_generations,
        }
        if self.generation_batch_size_given:
            out["generation_batch_size"] = self.generation_batch_size
        else:
            out["steps_per_generation"] = self.steps_per_generation
        if self.per_device_eval_batch_size is not None:
            out["per_device_eval_batch_size"] = self.per_device_eval_batch_size
        return out

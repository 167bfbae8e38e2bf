"""launch.mode async: AsyncGRPOTrainer's pipeline values, chosen from the split's predicted rates and explained, and
the trainer values AsyncGRPOConfig takes. Pure.

The split, the server and the trainers' memory are planned by the same steps as a sync plan (the split search
scores async candidates beside the sync ones at the same completions per step); what differs:

- the trainers run FSDP2 (AsyncGRPO is FSDP2-only: TRL docs async_grpo_trainer.md:4);
- the policy loads in AsyncGRPOConfig.dtype, float32 unless the recipe sets dtype (async_grpo_config.py:178-186):
  a LoRA base is 4 bytes a parameter, and the weight sync streams float32 (async_grpo_trainer.py:1348-1352 reads
  each parameter's own dtype; accelerate's FSDP2 upcasts trainable parameters to float32 under mixed precision,
  accelerate/utils/fsdp_utils.py:816-820);
- the step is the slower side plus the sync (:mod:`grpo_launch.planning.cost.overlap`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from grpo_launch.enums import DistBackend
from grpo_launch.planning.cost.overlap import lag_steps, max_staleness_for, overlap_bound, staleness
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.plan_types import AsyncSettings, StepTime, Trace, VllmPlan
from grpo_launch.recipe import Recipe
from grpo_launch.recipe.async_schema import ASYNC_DEFAULTS, GRPO_NOT_ASYNC
from grpo_launch.spec import frozen

SYNC_SHARE = 0.2  # a weight sync longer than this share of the overlapped step is spread over several steps
MAX_SYNC_STEPS = 4  # … at most this many (TRL's default max_staleness, async_grpo_config.py:360)
MAX_LAG_STEPS = 4  # in-flight requests beyond this many steps of samples only add staleness
SYNC_TIMEOUT_FACTOR = 30  # a weight sync this many times slower than predicted is stuck
SYNC_TIMEOUT_MIN_S = 300  # … and never below TRL's own control timeout (weight_transfer.py:61, _CONTROL_TIMEOUT)


@frozen
class _Pace:
    """One async step's predicted seconds (generation, training, weight sync) and the samples it consumes."""

    gen: float
    train: float
    sync: float
    per_step: int


def choose_async(
    recipe: Recipe,
    vllm: VllmPlan,
    step: StepTime | None,
    per_step: int,
    trace: Trace,
    *,
    lora_rank: int | None,
    dtype: str | None = None,
) -> AsyncSettings:
    """max_inflight_tasks, queue_maxsize, weight_sync_steps, max_staleness and token_budget for one async plan,
    each recorded with its reason; the recipe's own values are kept. ``dtype``: what the trainer values already
    load the policy in (None: AsyncGRPOConfig's float32 default)."""
    values = recipe.values
    gen, train = (step.generation_s, step.training_s) if step else (1.0, 1.0)
    pace = _Pace(gen, train, step.sync_s if step else 0.0, per_step)
    inflight = _decide(trace, "max_inflight_tasks", _inflight(values, pace, vllm))
    queue = _decide(trace, "queue_maxsize", _queue(values, per_step))
    sync_steps = _decide(trace, "weight_sync_steps", _sync_steps(values, pace))
    lag = lag_steps(inflight, queue, per_step, gen, train)
    max_stale = _decide(trace, "max_staleness", _max_staleness(values, pace, lag, inflight, queue, sync_steps))
    predicted = staleness(lag, sync_steps)
    if predicted > max_stale:
        trace.warn(
            f"the predicted staleness {predicted:.1f} is above max_staleness={max_stale}: samples will be "
            "dropped as stale (sample/dropped_stale_total); lower max_inflight_tasks or queue_maxsize"
        )
    budget = _decide(trace, "token_budget", _token_budget(values, vllm.max_model_len))
    if dtype is None:
        dtype = str(ASYNC_DEFAULTS["dtype"])
        trace.decide("dtype", dtype, "AsyncGRPOConfig's default (async_grpo_config.py:178-186)")
    sync_timeout = _decide(trace, "weight_sync_timeout", _sync_timeout(values, pace.sync))
    max_loras = max_stale + 2 if lora_rank else None  # async_grpo_trainer.py:895-905
    return AsyncSettings(
        max_inflight_tasks=inflight,
        max_staleness=max_stale,
        token_budget=budget,
        weight_sync_steps=sync_steps,
        queue_maxsize=queue,
        dtype=dtype,
        predicted_staleness=round(predicted, 3),
        overlap_bound=round(overlap_bound(gen, train), 3),
        weight_sync_timeout=sync_timeout,
        lora_rank=lora_rank,
        max_loras=max_loras,
    )


def _decide(trace: Trace, what: str, chosen: tuple[int, str]) -> int:
    trace.decide(what, chosen[0], chosen[1])
    return chosen[0]


def _inflight(values: Mapping[str, Any], pace: _Pace, vllm: VllmPlan) -> tuple[int, str]:
    gen, train, per_step = pace.gen, pace.train, pace.per_step
    capacity = (vllm.max_num_seqs or per_step) * vllm.data_parallel_size
    if "max_inflight_tasks" in values and int(values["max_inflight_tasks"]) > 0:
        return int(values["max_inflight_tasks"]), "set in the recipe"
    if gen >= train:
        return max(per_step, min(capacity, MAX_LAG_STEPS * per_step)), (
            f"generation-bound ({gen:.1f} s vs training {train:.1f} s): enough requests to fill the server's "
            f"{capacity} sequence slots (max_num_seqs × DP), at least one step's {per_step} samples, at most "
            f"{MAX_LAG_STEPS} steps' worth (more only adds staleness)"
        )
    return per_step, (
        f"training-bound ({train:.1f} s vs generation {gen:.1f} s): one step's {per_step} samples keep the "
        "trainers fed; more would only wait in the queue and grow stale"
    )


def _queue(values: Mapping[str, Any], per_step: int) -> tuple[int, str]:
    if "queue_maxsize" in values:
        return int(values["queue_maxsize"]), "set in the recipe"
    return per_step, (
        f"one step of ready samples ({per_step}); TRL's default {ASYNC_DEFAULTS['queue_maxsize']} would let a "
        "training-bound run queue samples that are dropped as stale before they are trained"
    )


def _sync_steps(values: Mapping[str, Any], pace: _Pace) -> tuple[int, str]:
    top, sync = max(pace.gen, pace.train), pace.sync
    if "weight_sync_steps" in values:
        return int(values["weight_sync_steps"]), "set in the recipe"
    if sync > SYNC_SHARE * top and top > 0:
        sync_steps = min(MAX_SYNC_STEPS, math.ceil(sync / (SYNC_SHARE * top)))
        why = f"the sync ({sync:.2f} s) is over {SYNC_SHARE:.0%} of the overlapped step ({top:.1f} s)"
        return sync_steps, why + f": every {sync_steps} steps"
    return 1, f"the sync ({sync:.2f} s) is under {SYNC_SHARE:.0%} of the step ({top:.1f} s): every step (TRL's default)"


def _max_staleness(
    values: Mapping[str, Any], pace: _Pace, lag: float, inflight: int, queue: int, sync_steps: int
) -> tuple[int, str]:
    if "max_staleness" in values:
        return int(values["max_staleness"]), "set in the recipe"
    return max_staleness_for(lag, sync_steps), (
        f"the predicted lag is {lag:.2f} steps = {staleness(lag, sync_steps):.2f} weight versions "
        f"((in flight {inflight}" + (f" + queue {queue}" if pace.train > pace.gen else "") + f") ÷ {pace.per_step} "
        "per step" + (f" ÷ sync every {sync_steps}" if sync_steps > 1 else "") + "), plus one of slack: no sample is "
        "predicted dropped as stale"
    )


def _token_budget(values: Mapping[str, Any], length: int | None) -> tuple[int, str]:
    if values.get("token_budget") is not None:
        return int(values["token_budget"]), "set in the recipe"
    return int(length or 0), (
        f"the server's --max-model-len {length} (prompt + completion), as TRL defaults it "
        "(async_grpo_trainer.py:1437-1439): no sample exceeds a row and none is dropped"
    )


def _sync_timeout(values: Mapping[str, Any], sync: float) -> tuple[int, str]:
    if "weight_sync_timeout" in values:
        return int(values["weight_sync_timeout"]), "set in the recipe"
    return max(SYNC_TIMEOUT_MIN_S, math.ceil(SYNC_TIMEOUT_FACTOR * sync)), (
        f"{SYNC_TIMEOUT_FACTOR:g}× the predicted sync ({sync:.1f} s), at least {SYNC_TIMEOUT_MIN_S} s (TRL's "
        "control timeout, weight_transfer.py:61): a stuck sync raises (weight_transfer.py:43-48) instead of "
        "waiting TRL's default 1800 s"
    )


def async_trainer_values(values: dict[str, Any], settings: AsyncSettings, vllm: VllmPlan) -> dict[str, Any]:
    """The sync trainer values made AsyncGRPOConfig's: GRPOConfig-only keys dropped (every one checked at plan time
    not to change the algorithm: planning/refusal/async_problems.py; reward_weights stay for the training entry, which
    scales each reward), the pipeline values set."""
    out = {k: v for k, v in values.items() if k not in GRPO_NOT_ASYNC or k == "reward_weights"}
    out.update(
        vllm_server_base_url=vllm.base_url,
        max_inflight_tasks=settings.max_inflight_tasks,
        max_staleness=settings.max_staleness,
        token_budget=settings.token_budget,
        weight_sync_steps=settings.weight_sync_steps,
        queue_maxsize=settings.queue_maxsize,
        dtype=settings.dtype,
        weight_sync_timeout=settings.weight_sync_timeout,
    )
    return out


def lora_rank(recipe: Recipe, vllm: VllmPlan, trace: Trace) -> int | None:
    """The adapter rank the server must serve (--max-lora-rank), rounded up as TRL rounds it (round_lora_rank,
    async_grpo_trainer.py:690-722: vLLM's LoRA ranks), when the recipe trains LoRA and the server can take
    adapter-only syncs (one data-parallel replica: async_grpo_trainer.py:869-877)."""
    if not recipe.values.get("use_peft"):
        return None
    if vllm.data_parallel_size > 1:
        why = f"the server has {vllm.data_parallel_size} data-parallel replicas, and a runtime adapter reaches only "
        trace.decide("lora_sync", "merged", why + "one: TRL syncs merged weights (async_grpo_trainer.py:869-877)")
        return None
    r = int(recipe.values.get("lora_r") or 16)  # TRL ModelConfig.lora_r default 16
    rank = next((x for x in VLLM_LORA_RANKS if x >= r), VLLM_LORA_RANKS[-1])
    why = f"adapter-only syncs: the server serves LoRA rank {rank} (lora_r {r} rounded up to vLLM's ranks) and "
    trace.decide("lora_sync", "adapter", why + "reads output_dir/.vllm_lora (async_grpo_trainer.py:1309)")
    if vllm.nodes:
        trace.warn("the server spans hosts: output_dir/.vllm_lora (the adapter it loads) must be on a shared disk")
    return rank


# vLLM's servable LoRA ranks (trl async_grpo_trainer.py VLLM_LORA_RANKS, from vllm/config/lora.py MaxLoRARanks)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def async_recipe(recipe: Recipe) -> Recipe:
    """The recipe as the async trainers run it: FSDP2 (the only backend AsyncGRPO supports)."""
    return dataclasses.replace(recipe, launch=dataclasses.replace(recipe.launch, backend=DistBackend.FSDP))


def async_workload(work: Workload, recipe: Recipe) -> Workload:
    """One step's work as AsyncGRPOTrainer does it: overlapped, no old log-probs pass and no reference model, the
    policy in AsyncGRPOConfig.dtype (a float32 LoRA base; float32 weights streamed at each full sync)."""
    fp32 = str(recipe.values.get("dtype") or ASYNC_DEFAULTS["dtype"]) == "float32"
    adapter_sync = bool(recipe.values.get("use_peft"))
    return dataclasses.replace(
        work,
        overlapped=True,
        old_logprobs=False,
        reference_model=False,
        lora_base_bytes=4 if fp32 else 2,
        sync_weight_bytes=2 if adapter_sync else 4,
    )

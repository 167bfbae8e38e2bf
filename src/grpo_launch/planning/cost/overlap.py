"""The async cost model (AsyncGRPOTrainer, launch.mode async): generation and training overlap on disjoint GPUs.
Pure arithmetic.

- Step: the slower side sets the pace, ``max(generation, training) + weight sync``. The trainer does no extra
  forward for the old log-probs: the rollout worker trains on the server's sampled log-probs (TRL 1.16
  trl/experimental/async_grpo/async_rollout_worker.py:151-155 requires one sampled logprob per trained token), and
  there is no reference model (async_grpo_trainer.py:1174-1175). The weight sync pauses the server
  (async_grpo_trainer.py:1745-1748: pause, barrier, transfer) and stays on the critical path.
- Overlap gain: the same work done one side after the other over the overlapped step is at most
  ``(gen + train) / max(gen, train)`` ≤ 2: overlap alone never gives more than 2×. Published async speed-ups above
  that (AReaL 2.77×, HF's LoRA run 3.9×) came with other changes (tests/published_async_cases.py).
- Staleness (Little's law): a sample's lag in optimizer steps is the samples in the pipeline over the samples one
  step consumes. Generation-bound, the queue stays empty and the pipeline holds the in-flight requests:
  ``lag = in_flight / per_step``. Training-bound, the queue fills to its cap before backpressure stops the scorer
  (async_rollout_worker.py:776-792): ``lag = (in_flight + queue_maxsize) / per_step``. In weight versions:
  ``lag / weight_sync_steps`` (the version moves at each sync, async_grpo_trainer.py:1403).
"""

from __future__ import annotations

import dataclasses
import math

from grpo_launch.planning.cost.steptime import StepTime


def overlapped(step: StepTime) -> StepTime:
    """The async step of a split's synchronous estimate: no old log-probs pass, generation and training overlapped."""
    return dataclasses.replace(step, old_logprobs_s=0.0, overlapped=True)


def overlap_bound(generation_s: float, training_s: float) -> float:
    """The most overlapping the two sides can gain: (gen + train) / max(gen, train), between 1 and 2."""
    top = max(generation_s, training_s)
    return (generation_s + training_s) / top if top > 0 else 1.0


def lag_steps(in_flight: int, queue_maxsize: int, per_step: int, generation_s: float, training_s: float) -> float:
    """Mean lag of a trained sample in optimizer steps (Little's law; see the module docstring)."""
    held = in_flight + (queue_maxsize if training_s > generation_s else 0)
    return held / max(1, per_step)


def staleness(lag: float, weight_sync_steps: int) -> float:
    """The lag in weight versions, what TRL's ``sample/staleness_mean`` reports (async_grpo_trainer.py:366-387)."""
    return lag / max(1, weight_sync_steps)


def max_staleness_for(lag: float, weight_sync_steps: int) -> int:
    """The least max_staleness that drops no sample at the predicted lag, with one version of slack for jitter."""
    return max(1, math.ceil(staleness(lag, weight_sync_steps)) + 1)


def overlap_line(generation_s: float, training_s: float, sync_s: float, sync_bytes: int) -> str:
    """The async step's arithmetic for --explain."""
    bound = overlap_bound(generation_s, training_s)
    return (
        f"async (AsyncGRPOTrainer): no old log-probs pass (the server's sampled log-probs); weight sync of "
        f"{sync_bytes}-byte weights {sync_s:.2f} s; overlap gain at most (gen + train) ÷ max(gen, train) = "
        f"({generation_s:.1f} + {training_s:.1f}) ÷ {max(generation_s, training_s):.1f} = {bound:.2f}×"
    )

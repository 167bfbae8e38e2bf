"""Stale weights, read from what TRL logs: the gap between the log-probabilities vLLM sampled with and the ones the
trainers compute for the same tokens (``sampling/sampling_logp_difference/mean``, nats per token; TRL 1.16 logs it
whenever vLLM generates with importance-sampling correction on, trl/trainer/grpo_trainer.py).

With the weights in sync the gap is numerical noise (the same weights in two kernels: 0.0009–0.0012 on the CPU runs
of tests/test_adapt.py, fp32). When vLLM generates with weights the trainers no longer hold (a server left on its
start-up weights after a resume, trl#3247; sleep-mode weights not synced, trl#5312) the gap becomes the distance
between two policies: 0.19–0.26 after one optimizer step on the same runs. A value above both :data:`JUMP` × the
running band (the median of the run's earlier values, earlier attempts' included) and :data:`FLOOR` stops the run."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

GAP_KEY = "sampling/sampling_logp_difference/mean"
JUMP = 10.0  # × the band: one policy step of real drift stays well inside it (TRL's own clip range is 1 ± 0.2)
FLOOR = 0.05  # nats per token: never below this (40× the in-sync gap measured on CPU; bf16 kernels are noisier)
BAND_WINDOW = 20  # the band is the median of this many earlier values


@dataclass
class GapWatch:
    """Feed it each logged gap in step order; it answers the problem when the gap jumps."""

    history: list[float] = field(default_factory=list)

    def add(self, step: int, value: float, *, resumed: bool = False) -> str | None:
        band = statistics.median(self.history[-BAND_WINDOW:]) if self.history else None
        if band is not None and value > max(FLOOR, JUMP * band):
            after = "right after a resume" if resumed else "after a weight sync"
            return (
                f"stale weights: at step {step} the log-probability gap between vLLM and the trainers jumped to "
                f"{value:.3g} nats/token {after}, {value / max(band, 1e-12):.0f}× its band of {band:.2g} (TRL's "
                f"{GAP_KEY}). vLLM is generating with weights the trainers no longer hold: the weight sync to the "
                "server did not happen (a server left on its start-up weights after a resume, trl#3247; sleep-mode "
                "weights not synced, trl#5312). Training on these samples is off-policy. Check the server's log for "
                "the weight update, then resume: grpo-launch restarts the server on every attempt, and TRL syncs "
                "before its first generation"
            )
        self.history.append(value)
        return None

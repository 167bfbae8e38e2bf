"""How often to checkpoint: the interval that loses the least time to failures and to saving (Young 1974, "A first
order approximation to the optimum checkpoint interval"; Daly 2006, "A higher order estimate of the optimum
checkpoint interval for restart dumps"): τ = √(2 · C · M) for a save of C seconds and a mean time between failures M,
as long as C is small against M (Daly's higher-order estimate then differs by less than C). Pure.

Over a day of training at an interval τ, saving costs D · C / τ and failures cost D / M · (τ / 2 + R): each loses on
average half an interval of steps and a restart R (the time to first step). The sum is least at Young's τ.

M comes from the GPUs the run holds: Meta's Llama 3 training counted 419 unexpected interruptions in 54 days on
16,384 H100 GPUs (The Llama 3 Herd of Models, §3.3.4, Table 5): one per 50,700 GPU-hours, so a run of N GPUs meets
one every 50,700 / N hours. ``launch.mtbf_hours`` gives the cluster's own figure instead.
"""

from __future__ import annotations

import math

from grpo_launch.planning.cost.constants import _c
from grpo_launch.spec import frozen

DAY_S = 86400.0
TRL_SAVE_STEPS = 500  # TRL's (the Trainer's) default save_steps
OFF_BY = 2.0  # a recipe's own interval losing more than this × the optimum's time gets a notice


@frozen
class SaveInterval:
    """A run's checkpoint interval and what it costs: ``save_s`` seconds per save (``save_why``: the checkpoint's
    bytes over the disk's speed), the run's mean time between failures ``mtbf_s`` (``mtbf_why``), a step of ``step_s``
    and a restart of ``restart_s``; Young's optimum and the interval used (the recipe's, or the optimum)."""

    save_s: float
    save_why: str
    mtbf_s: float
    mtbf_why: str
    step_s: float
    restart_s: float
    optimum_steps: int
    steps: int
    recipes: bool  # the recipe set save_steps

    def waste_per_day_s(self, steps: int) -> tuple[float, float]:
        """(seconds lost to failures, seconds spent saving) per day of training at a save every ``steps`` steps."""
        interval = max(1, steps) * self.step_s
        lost = DAY_S / self.mtbf_s * (interval / 2 + self.restart_s)
        saving = DAY_S / interval * self.save_s
        return lost, saving

    def lines(self) -> list[str]:
        """The arithmetic, for --explain: the optimum, and the day's waste at the interval used and at TRL's 500."""
        tau = math.sqrt(2 * self.save_s * self.mtbf_s)
        out = [
            f"checkpoint interval (Young/Daly): √(2 · {self.save_s:.1f} s per save · {duration(self.mtbf_s)} between "
            f"failures) = {duration(tau)} = {self.optimum_steps} steps of {self.step_s:.1f} s; saving: "
            f"{self.save_why}; failures: {self.mtbf_why}"
        ]
        for label, steps in (
            (f"save_steps={self.steps}" + (" (the recipe's)" if self.recipes else ""), self.steps),
            (f"TRL's default save_steps={TRL_SAVE_STEPS}", TRL_SAVE_STEPS),
        ):
            lost, saving = self.waste_per_day_s(steps)
            out.append(
                f"  {label}: per day of training ≈ {duration(lost)} lost to failures (half an interval and "
                f"a restart of {self.restart_s:.0f} s each) + {duration(saving)} saving"
            )
        return out


def duration(seconds: float) -> str:
    """Seconds as a person reads them: s, min or h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def run_mtbf_s(gpus: int, mtbf_hours: float | None) -> tuple[float, str]:
    """The run's mean time between failures and its source: ``launch.mtbf_hours``, else the Llama 3 per-GPU rate
    over the GPUs the run holds."""
    if mtbf_hours is not None:
        return mtbf_hours * 3600, f"launch.mtbf_hours={mtbf_hours:g}"
    per_gpu = _c("gpu_hours_between_failures")
    return per_gpu * 3600 / max(1, gpus), (
        f"{per_gpu:,.0f} GPU-hours per failure (Llama 3: 419 in 54 days on 16,384 GPUs) ÷ {gpus} GPUs"
    )


def save_interval(
    save_bytes: float,
    write_bytes_per_s: float,
    write_why: str,
    gpus: int,
    mtbf_hours: float | None,
    step_s: float,
    restart_s: float,
    recipe_steps: int | None,
) -> SaveInterval:
    """Young's interval for a checkpoint of ``save_bytes`` written at ``write_bytes_per_s`` (``write_why``: where that
    speed comes from), in steps of ``step_s``; the recipe's own save_steps kept where it set one."""
    save_s = save_bytes / write_bytes_per_s
    mtbf_s, mtbf_why = run_mtbf_s(gpus, mtbf_hours)
    optimum = max(1, round(math.sqrt(2 * save_s * mtbf_s) / max(step_s, 1e-9)))
    save_why = f"{save_bytes / 1e9:.1f} GB at {write_bytes_per_s / 1e9:.2f} GB/s ({write_why})"
    return SaveInterval(
        save_s,
        save_why,
        mtbf_s,
        mtbf_why,
        step_s,
        restart_s,
        optimum,
        recipe_steps if recipe_steps else optimum,
        recipe_steps is not None,
    )


def off_the_optimum(interval: SaveInterval) -> float:
    """How many times the optimum's daily waste the interval used loses (1: the optimum)."""
    used = sum(interval.waste_per_day_s(interval.steps))
    best = sum(interval.waste_per_day_s(interval.optimum_steps))
    return used / best if best > 0 else 1.0

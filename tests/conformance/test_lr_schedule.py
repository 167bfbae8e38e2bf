"""The learning-rate schedules as transformers builds and resumes them, against what ``run`` and ``resume`` say
when max_steps changes over a run's checkpoint (:func:`grpo_launch.rundir.continuity.schedule_change`): which
lr_scheduler_type values run over the training's length (``get_scheduler``, every SchedulerType), a warmup given as
a fraction (``TrainingArguments.get_warmup_steps``), and the resume order of ``Trainer._load_optimizer_and_scheduler``
(the optimizer's state, then the scheduler's, into a schedule built for the new length)."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainingArguments, get_scheduler
from transformers.trainer_utils import SchedulerType

from grpo_launch.rundir.continuity import LENGTH_FREE_SCHEDULES

# What some schedules need besides the length (transformers refuses them without it).
KWARGS = {"cosine_with_min_lr": {"min_lr_rate": 0.1}, "cosine_warmup_with_min_lr": {"min_lr_rate": 0.1},
          "warmup_stable_decay": {"num_decay_steps": 10}}  # fmt: skip


def _scheduler(name: str, length: int, warmup: int = 0):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    return optimizer, get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=length,
                                    scheduler_specific_kwargs=KWARGS.get(name))  # fmt: skip


def _step(scheduler) -> None:
    try:
        scheduler.step()
    except TypeError:  # reduce_lr_on_plateau and greedy take the metric
        scheduler.step(1.0)


def _rates(name: str, length: int, steps: int) -> list[float]:
    optimizer, scheduler = _scheduler(name, length)
    rates = []
    for _ in range(steps):
        optimizer.step()
        _step(scheduler)
        rates.append(optimizer.param_groups[0]["lr"])
    return rates


@pytest.mark.parametrize("name", [s.value for s in SchedulerType])
def test_a_schedule_runs_over_max_steps_exactly_when_the_launcher_says_so(name):
    """The rates of the first 59 steps differ between a 60- and a 70-step training exactly for the schedules not
    named length-free (every SchedulerType of the installed transformers is asked)."""
    depends = _rates(name, 60, 59) != pytest.approx(_rates(name, 70, 59), rel=1e-9)
    assert depends == (name not in LENGTH_FREE_SCHEDULES), name


def test_a_fractional_warmup_is_a_fraction_of_max_steps():
    fraction = TrainingArguments(output_dir="unused", warmup_steps=0.1, use_cpu=True)
    steps = TrainingArguments(output_dir="unused", warmup_steps=3, use_cpu=True)
    assert fraction.get_warmup_steps(60) != fraction.get_warmup_steps(70)
    assert steps.get_warmup_steps(60) == steps.get_warmup_steps(70) == 3


def test_a_resumed_schedule_keeps_its_position_and_takes_the_new_length():
    """Trainer's resume order: a schedule built for the new length (70), the checkpoint's optimizer state, then its
    scheduler state (saved at step 60 of a 60-step linear schedule). The first step trains at the saved rate (0: the
    old schedule's end); the next at the new schedule's rate for step 61 (9/70 of the peak)."""
    optimizer, scheduler = _scheduler("linear", 60)
    for _ in range(60):
        optimizer.step()
        scheduler.step()
    saved_optimizer, saved_scheduler = optimizer.state_dict(), scheduler.state_dict()
    optimizer, scheduler = _scheduler("linear", 70)
    optimizer.load_state_dict(saved_optimizer)
    scheduler.load_state_dict(saved_scheduler)
    assert optimizer.param_groups[0]["lr"] == 0.0  # step 61 trains at this
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(9 / 70)  # step 62 at the new schedule's

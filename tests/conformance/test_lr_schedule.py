"""The learning-rate schedules as transformers builds them, against what ``run`` and ``resume`` say when a run
continues from a checkpoint with another training length (:func:`grpo_launch.rundir.same_run.length_dependence`):
every SchedulerType of the installed transformers built by ``get_scheduler`` for both lengths, with the warmup
``TrainingArguments.get_warmup_steps`` gives; the rates after the checkpoint compared. The resume order the
comparison assumes (the optimizer's state, then the scheduler's, into a schedule built for the new length:
``Trainer._load_optimizer_and_scheduler``) is replayed here with torch's own classes; tests/test_resume.py checks it
through a real Trainer."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from transformers import TrainingArguments, get_scheduler
from transformers.trainer_utils import SchedulerType

from grpo_launch.rundir.same_run import length_dependence

# What some schedules need besides the length (transformers refuses them without it), and warmup_stable_decay a
# second time with its stable phase given (then its length is its own).
KWARGS = {"cosine_with_min_lr": {"min_lr_rate": 0.1}, "cosine_warmup_with_min_lr": {"min_lr_rate": 0.1},
          "warmup_stable_decay": {"num_decay_steps": 2}}  # fmt: skip
CASES = [(s.value, KWARGS.get(s.value, {})) for s in SchedulerType] + [
    ("warmup_stable_decay", {"num_decay_steps": 2, "num_stable_steps": 3})
]
# Lengths of real runs: there the launcher's answer is exact. Short ones, with only a few steps left after the
# checkpoint: there it may warn where the rates left happen to coincide, but is never silent where they differ.
REAL = {"warmups": (0, 0.05, 0.1, 10), "lengths": ((60, 70), (70, 60), (100, 200), (200, 100)), "steps": (5, 6, 30, 59)}
SHORT = {"warmups": (0, 0.1, 0.5, 3), "lengths": ((6, 10), (10, 6), (6, 4)), "steps": (1, 2, 5)}


@functools.cache
def _warmup(warmup: float, length: int) -> int:
    return TrainingArguments(output_dir="unused", warmup_steps=warmup, use_cpu=True).get_warmup_steps(length)


@functools.cache
def _rates(name: str, kwargs: tuple, length: int, warmup: int, positions: int) -> tuple[float, ...]:
    """The schedule's rate at each position 0..positions-1 (the rate after that many scheduler steps)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=length,
                              scheduler_specific_kwargs=dict(kwargs) or None)  # fmt: skip
    rates = []
    for _ in range(positions):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        try:
            scheduler.step()
        except TypeError:  # reduce_lr_on_plateau and greedy take the metric
            scheduler.step(1.0)
    return tuple(rates)


def _misjudged(name: str, kwargs: dict, grid: dict) -> list[tuple]:
    """The cases of ``grid`` where the launcher's answer and transformers' rates disagree: (warmup, old length, new
    length, checkpoint step, what the launcher did)."""
    frozen_kwargs = tuple(sorted(kwargs.items()))
    wrong = []
    for warmup, (old, new), step in itertools.product(grid["warmups"], grid["lengths"], grid["steps"]):
        end = max(old, new) + 1
        try:
            before = _rates(name, frozen_kwargs, old, _warmup(warmup, old), end)
            after = _rates(name, frozen_kwargs, new, _warmup(warmup, new), end)
        except ZeroDivisionError:
            continue  # a warmup as long as the training: transformers' own schedule cannot be built
        differ = any(abs(before[k] - after[k]) > 1e-12 for k in range(step + 1, new))
        said = length_dependence(name, warmup, kwargs, (old, new), step) is not None
        if said != differ:
            wrong.append((warmup, old, new, step, "said" if said else "silent"))
    return wrong


IDS = [f"{n}{'-stable' if 'num_stable_steps' in k else ''}" for n, k in CASES]


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=IDS)
def test_the_launcher_says_the_rates_change_exactly_when_transformers_changes_them(name, kwargs):
    """For each warmup, pair of lengths and checkpoint of a real run's size: the rates of the steps after the first
    one past the checkpoint (positions step+1 .. new length - 1) under the recorded length and under the new one
    differ exactly where the launcher warns."""
    assert _misjudged(name, kwargs, REAL) == []


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=IDS)
def test_with_few_steps_left_it_may_warn_but_is_never_silent_where_the_rates_differ(name, kwargs):
    assert [case for case in _misjudged(name, kwargs, SHORT) if case[-1] == "silent"] == []


def test_a_resumed_schedule_keeps_its_position_and_takes_the_new_length():
    """The resume order: a schedule built for the new length (70), the checkpoint's optimizer state, then its
    scheduler state (saved at step 60 of a 60-step linear schedule). The first step trains at the saved rate (0: the
    old schedule's end); the next at the new schedule's rate for position 61 (9/70 of the peak)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=60)
    for _ in range(60):
        optimizer.step()
        scheduler.step()
    saved_optimizer, saved_scheduler = optimizer.state_dict(), scheduler.state_dict()
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=70)
    optimizer.load_state_dict(saved_optimizer)
    scheduler.load_state_dict(saved_scheduler)
    assert optimizer.param_groups[0]["lr"] == 0.0  # step 61 trains at this
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(9 / 70)  # step 62 at the new schedule's

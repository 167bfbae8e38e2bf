"""A run's course attempt by attempt, from its records (pure, standard library only): which attempt wrote each
metrics record, the run's curve with each step once, and each attempt's steps, step time and end.

- **Which attempt**: the trainers write their attempt's number into every record (``GRPO_LAUNCH_ATTEMPT``). A record
  of an older version has none: it belongs to the attempt before it, and a step that does not move past the last
  one starts the next attempt (a restart or resume goes back to its checkpoint).
- **The curve**: an attempt that resumes from a checkpoint trains again the steps after it, so its first step
  supersedes every record of an earlier attempt from that step on (the later attempt's record of a repeated step
  wins, and steps an abandoned attempt trained past its last checkpoint are not the run's).
- **An attempt** (:class:`AttemptCourse`): its first and last step, its mean step time without its own first step
  (compiling, warming up and, after a resume, loading the checkpoint), the last checkpoint it saved, and how it
  ended (the launcher's :class:`~grpo_launch.rundir.records.Attempt`; None when none was written: it still runs, or its
  launcher was killed). The launcher numbers attempts over the whole run directory, so they match the records' numbers;
  attempts.jsonl of an older version numbered each invocation's from 1, and is then matched in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from grpo_launch.enums import RunState
from grpo_launch.rundir.records import Attempt, MetricRecord, SaveRecord, StartupRecord, StepRecord
from grpo_launch.spec import frozen


def numbered(records: Sequence[MetricRecord]) -> list[tuple[int, MetricRecord]]:
    """Each record with the number of the attempt that wrote it (its own, else inferred; see the module)."""
    out: list[tuple[int, MetricRecord]] = []
    current, last_step = 1, None
    for r in records:
        own = getattr(r, "attempt", None)
        if own is not None:
            if own != current:
                last_step = None
            current = own
        elif isinstance(r, StepRecord) and last_step is not None and r.step <= last_step:
            current += 1
        if isinstance(r, StepRecord):
            last_step = r.step
        out.append((current, r))
    return out


def _curve(records: Sequence[MetricRecord]) -> list[tuple[int, MetricRecord]]:
    """:func:`curve`, each record with its attempt's number (numbered once, before anything is dropped)."""
    tagged = numbered(records)
    first: dict[int, int] = {}
    for n, r in tagged:
        if isinstance(r, StepRecord):
            first.setdefault(n, r.step)
    kept: list[tuple[int, MetricRecord]] = []
    seen: set[int] = set()
    for n, r in tagged:
        if n not in seen:
            seen.add(n)
            if n in first:
                kept = [(m, k) for m, k in kept if m == n or isinstance(k, StartupRecord) or k.step < first[n]]
        kept.append((n, r))
    return kept


def curve(records: Sequence[MetricRecord]) -> list[MetricRecord]:
    """The run's records with each step once: an attempt's first step drops the earlier attempts' records of that
    step and later ones. Startup records are the attempts' own and are all kept."""
    return [r for _, r in _curve(records)]


def warm_steps(records: Sequence[MetricRecord]) -> list[StepRecord]:
    """The curve's steps less each attempt's first step, when the attempt trained more than one."""
    own: dict[int, list[StepRecord]] = {}
    for n, r in numbered(records):
        if isinstance(r, StepRecord):
            own.setdefault(n, []).append(r)
    warming = {id(steps[0]) for steps in own.values() if len(steps) > 1}
    return [r for _, r in _curve(records) if isinstance(r, StepRecord) and id(r) not in warming]


@frozen
class AttemptCourse:
    """One attempt of a run: ``steps`` records (``first_step``..``last_step``), its own mean step time and split
    (None without a step), the last step it saved a checkpoint at, and how it ended (``end``: None when the launcher
    wrote no end: it still runs, or it was killed)."""

    number: int
    steps: int
    first_step: int | None
    last_step: int | None
    step_s: float | None
    generation_s: float | None
    training_s: float | None
    saved_step: int | None
    end: Attempt | None

    @property
    def ended(self) -> str:
        """How it ended, in a few words."""
        a = self.end
        if a is None:
            return "no end recorded (still running, or its launcher was killed)"
        said = str(a.state) + (f" ({a.failure})" if a.failure else "") + f", exit code {a.exit_code}"
        return said + (f": {a.why}" if a.why and a.state != RunState.SUCCEEDED else "")

    def to_json(self) -> dict[str, Any]:
        out = {
            "attempt": self.number,
            "steps": self.steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "step_s": self.step_s,
            "generation_s": self.generation_s,
            "training_s": self.training_s,
            "saved_step": self.saved_step,
        }
        end = self.end.to_json() if self.end is not None else {"state": None, "exit_code": None}
        return out | {k: v for k, v in end.items() if k != "attempt"}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ends(attempts: Sequence[Attempt]) -> dict[int, Attempt]:
    """The launcher's records by attempt number (in order, when an older version numbered them per invocation)."""
    numbers = [a.attempt for a in attempts]
    if all(b > a for a, b in pairwise(numbers)):
        return {a.attempt: a for a in attempts}
    return {i: a for i, a in enumerate(attempts, start=1)}


def courses(records: Sequence[MetricRecord], attempts: Sequence[Attempt]) -> list[AttemptCourse]:
    """Every attempt of the run in order: those the records or the launcher's attempts name."""
    ends = _ends(attempts)
    steps: dict[int, list[StepRecord]] = {}
    saved: dict[int, int] = {}
    for n, r in numbered(records):
        if isinstance(r, StepRecord):
            steps.setdefault(n, []).append(r)
        elif isinstance(r, SaveRecord):
            saved[n] = r.step
    out = []
    for n in sorted({*steps, *ends}):
        mine = steps.get(n, [])
        use = mine[1:] if len(mine) > 1 else mine
        out.append(
            AttemptCourse(
                n,
                len(mine),
                mine[0].step if mine else None,
                mine[-1].step if mine else None,
                _mean([s.step_s for s in use]),
                _mean([s.generation_s or 0.0 for s in use]),
                _mean([s.training_s or 0.0 for s in use]),
                saved.get(n),
                ends.get(n),
            )
        )
    return out


def next_attempt(records: Sequence[MetricRecord], attempts: Sequence[Attempt]) -> int:
    """The number the run's next attempt takes: one past every attempt its records or the launcher's name."""
    known = [n for n, _ in numbered(records)] + list(_ends(attempts))
    return max(known, default=0) + 1

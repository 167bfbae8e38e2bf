"""Progress, read from the run's metrics records (rank 0 appends one per optimizer step and per save): the
hang bound, and the walltime-aware stop.

- **Hang**: no optimizer step within ``first_step_s`` of the start (model loading, compilation, the first
  generation), then within ``hang_s``, or else ``factor`` × the median measured step time but at least ``floor_s``.
  The supervisor then dumps every rank's stack and stops the run.
- **Deadline** (a Slurm job's end time, or ``launch.time_limit``): when the time left no longer covers
  ``DEADLINE_SAFETY`` × (one step + one save, as measured) plus ``DEADLINE_SLACK_S``, the trainers are asked to
  save a checkpoint and stop at the end of the current step; a Slurm job is then requeued.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grpo_launch.analysis.stale_weights import GAP_KEY, GapWatch
from grpo_launch.execute.supervisor import StaleWeights
from grpo_launch.rundir.records import LogRecord, SaveRecord, StepRecord, metric_record, parse_lines

FIRST_STEP_S = 3600.0  # loading and compiling a large model, its first generation
HANG_FACTOR = 10.0  # × the median step
HANG_FLOOR_S = 300.0  # never less than this after the first step
DEADLINE_SAFETY = 2.0  # × (step + save)
# A stop asked for a checkpoint at the end of the step in flight: a step already running this many times the longest
# step the run has measured, and at least STUCK_FLOOR_S, cannot be expected to end (a hung reward, a dead peer).
STUCK_FACTOR = 5.0
STUCK_FLOOR_S = 5.0
DEADLINE_SLACK_S = 30.0  # the processes' own exit after the save


@dataclass
class Watchdog:
    metrics: Path
    first_step_s: float = FIRST_STEP_S
    hang_s: float | None = None
    factor: float = HANG_FACTOR
    floor_s: float = HANG_FLOOR_S
    deadline: float | None = None  # epoch seconds
    on_deadline: Callable[[str], None] | None = None  # asks for the checkpoint and stop, saying why
    # called with the new steps' mean (generation s, training s) at the 5th step of an attempt and every 20th (not at
    # the run's last step: the run's end and its report follow)
    on_split: Callable[[float, float], None] | None = None
    on_step: Callable[[int], None] | None = None  # called with the attempt's step count after each new step
    clock: Callable[[], float] = time.time
    steps: list[float] = field(default_factory=list)  # measured step seconds (earlier attempts' too)
    last_step: int | None = None  # the step of the last step record read (on_split's step)
    split_steps: tuple[int, int] | None = None  # the first and last step on_split's means are over
    saves: list[float] = field(default_factory=list)
    _offset: int = 0
    _last: float = 0.0  # when the last step of this attempt finished (or the attempt started)
    _new_steps: int = 0
    _asked: bool = False
    _split: list[tuple[float, float]] = field(default_factory=list)
    _split_at: list[int] = field(default_factory=list)  # the step of each of _split
    _gap: GapWatch = field(default_factory=GapWatch)
    _stale: str | None = None
    _gaps_new: int = 0
    _attempt: list[float] = field(default_factory=list)  # this attempt's step seconds

    def __post_init__(self) -> None:
        self._last = self.clock()
        self._read(count=False)  # an earlier attempt's measurements seed the bound; its steps are not progress

    def _read(self, *, count: bool = True) -> None:
        try:
            with self.metrics.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += end
        for row in parse_lines(data[:end]):
            record = metric_record(row)
            if isinstance(record, StepRecord):
                self.steps.append(record.step_s)
                if count:
                    self._attempt.append(record.step_s)
                    self._new_steps += 1
                    self._last = self.clock()
                    self._split.append((record.generation_s or 0.0, record.training_s or 0.0))
                    self._split_at.append(record.step)
                    self.last_step = record.step
                    last = record.max_steps is not None and record.step >= record.max_steps  # "training done" next
                    if self.on_split is not None and not last and (self._new_steps == 5 or self._new_steps % 20 == 0):
                        recent = self._split[-20:]
                        self.split_steps = (self._split_at[-len(recent)], record.step)
                        self.on_split(*(sum(x) / len(recent) for x in zip(*recent, strict=True)))
                    if self.on_step is not None:
                        self.on_step(self._new_steps)
            elif isinstance(record, SaveRecord):
                self.saves.append(record.save_s)
            elif isinstance(record, LogRecord) and GAP_KEY in record.log and self._stale is None:
                resumed = count and not self._gaps_new and bool(self._gap.history)
                self._gaps_new += count
                self._stale = self._gap.add(record.step, record.log[GAP_KEY], resumed=resumed)

    def bound(self) -> float:
        """Seconds without a step before the run counts as hung."""
        if not self._new_steps:
            return self.first_step_s
        if self.hang_s is not None:
            return self.hang_s
        return max(self.floor_s, self.factor * statistics.median(self.steps))

    def stuck(self) -> str | None:
        """Why the step in flight cannot be expected to reach its end, or None: it has run past the hang bound, or
        past ``STUCK_FACTOR`` × the longest step this attempt has measured after its first (which loads, compiles
        and warms up; it alone when there is no other), and at least ``STUCK_FLOOR_S``. Unknown (None) before this
        attempt's first step."""
        self._read()
        if not self._attempt:
            return None
        running = self.clock() - self._last
        warm = self._attempt[1:] or self._attempt
        longest, median = max(warm), statistics.median(warm)
        if running <= min(self.bound(), max(STUCK_FACTOR * longest, STUCK_FLOOR_S)):
            return None
        step = (self.last_step or 0) + 1
        times = f", {running / median:.0f}× the median" if median > 0 else ""
        return f"step {step} has run {running:.0f} s{times}: no checkpoint possible"

    def __call__(self) -> str | None:
        """None while the run progresses; a reason when it is hung. Asks for the deadline stop on the way. Raises
        StaleWeights when vLLM's and the trainers' log-probabilities part
        (:mod:`grpo_launch.analysis.stale_weights`)."""
        self._read()
        if self._stale is not None:
            raise StaleWeights(self._stale)
        now = self.clock()
        if self.deadline is not None and not self._asked and self.on_deadline is not None:
            step = statistics.median(self.steps) if self.steps else 0.0
            save = max(self.saves) if self.saves else step
            needed = DEADLINE_SAFETY * (step + save) + DEADLINE_SLACK_S
            if now + needed >= self.deadline:
                self._asked = True
                self.on_deadline(
                    f"{max(0.0, self.deadline - now):.0f} s left before the time limit, and a step plus a save take "
                    f"{step + save:.0f} s as measured (counted {DEADLINE_SAFETY:g}×, with {DEADLINE_SLACK_S:.0f} s "
                    "for the processes' exit): saving a checkpoint now"
                )
        quiet = now - self._last
        bound = self.bound()
        if quiet > bound:
            if not self._new_steps:
                return f"no progress: the first optimizer step did not finish within {bound:.0f} s " + (
                    "(launch.first_step_timeout_s)"
                )
            return f"no progress: no optimizer step for {quiet:.0f} s (bound {bound:.0f} s: launch.hang_timeout_s)"
        return None

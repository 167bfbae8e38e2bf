"""What is written into a run directory as records, each with its one writer and the same reading for every
reader (standard library only: the trainers write some of them).

- ``metrics.jsonl`` (rank 0 of the trainers appends): a :class:`StepRecord` per optimizer step, a
  :class:`SaveRecord` per checkpoint and a :class:`LogRecord` per logging step (TRL's logged metrics). The
  watchdog, ``status``, ``plan --calibrate-from`` and the report read them with :func:`read_metrics`.
- ``control/attempts.jsonl`` (the launcher appends): an :class:`Attempt` per supervised attempt, with the
  launch.adapt decisions made in it (:class:`AdaptRecord`).
- ``plan.json``'s estimate: the :class:`Prediction` the plan made, which calibration, ``status`` and the report
  compare with what was measured.

A line cut short by a crash is skipped; a record of a newer version with more keys still reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, field, fields
from pathlib import Path
from typing import Any, TypeVar

from grpo_launch.enums import AdaptAction, FailureKind, Role, RunState, StrEnum
from grpo_launch.errors import ConfigError
from grpo_launch.spec import frozen

E = TypeVar("E", bound=StrEnum)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _float(value: Any, default: float = 0.0) -> float:
    return float(value) if _number(value) else default


def _enum(kind: type[E], value: Any) -> E | None:
    try:
        return kind(value)
    except ValueError:
        return None


def _float_or_none(value: Any) -> float | None:
    return float(value) if _number(value) else None


def _int_or_none(value: Any) -> int | None:
    return int(value) if _number(value) else None


@frozen
class StepRecord:
    """One optimizer step, as rank 0 timed it. ``generation_s`` is everything TRL does before the backward
    (generating, scoring, the old log-probs and, in server mode, the weight sync); ``training_s`` the rest."""

    step: int
    step_s: float
    generation_s: float | None = None  # None: not measured
    training_s: float | None = None
    max_steps: int | None = None
    time: float | None = None  # wall clock when the step ended
    num_tokens: int | None = None  # TRL counts prompt + completion tokens seen so far
    peak_memory_bytes: tuple[int, ...] = ()  # every rank's peak
    memory_kind: str | None = None  # cuda_max_allocated | rss_max
    gpu_utilization: tuple[int | None, ...] = ()  # NVML's percent busy per rank at the step's end

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["peak_memory_bytes"] = list(self.peak_memory_bytes)
        if any(u is not None for u in self.gpu_utilization):
            out["gpu_utilization"] = list(self.gpu_utilization)
        else:
            out.pop("gpu_utilization")
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> StepRecord:
        peaks = row.get("peak_memory_bytes") or []
        busy = row.get("gpu_utilization") or []
        return cls(
            step=int(row.get("step") or 0),
            step_s=float(row["step_s"]),
            generation_s=_float_or_none(row.get("generation_s")),
            training_s=_float_or_none(row.get("training_s")),
            max_steps=_int_or_none(row.get("max_steps")),
            time=float(row["time"]) if _number(row.get("time")) else None,
            num_tokens=_int_or_none(row.get("num_tokens")),
            peak_memory_bytes=tuple(int(p) for p in peaks if _number(p)),
            memory_kind=row.get("memory_kind") if isinstance(row.get("memory_kind"), str) else None,
            gpu_utilization=tuple(int(u) if _number(u) else None for u in busy),
        )


@frozen
class SaveRecord:
    """A checkpoint saved after ``step``, and how long saving took (for the walltime-aware stop)."""

    step: int
    save_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> SaveRecord:
        return cls(int(row.get("step") or 0), float(row["save_s"]))


@frozen
class LogRecord:
    """TRL's logged metrics at ``step`` (reward, completions/mean_length, kl, …): numbers only."""

    step: int
    log: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "log": dict(self.log)}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> LogRecord:
        return cls(int(row.get("step") or 0), {str(k): float(v) for k, v in row["log"].items() if _number(v)})


STARTUP_PHASES = ("model_load", "vllm_ready", "first_sync", "first_generation")


@frozen
class StartupRecord:
    """One term of an attempt's time to its first step, in seconds: the trainers' model load (from their start to a
    built trainer; the dataset is prepared in it), the vLLM server's start to healthy (the launcher writes it; it
    runs beside the load), the first weight sync and the first generation (rank 0 writes those)."""

    phase: str  # one of STARTUP_PHASES
    seconds: float
    time: float | None = None  # wall clock when it ended

    def to_json(self) -> dict[str, Any]:
        return {"startup": self.phase, "seconds": self.seconds, "time": self.time}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> StartupRecord:
        return cls(str(row["startup"]), _float(row.get("seconds")), _float_or_none(row.get("time")))


MetricRecord = StepRecord | SaveRecord | LogRecord | StartupRecord


def metric_record(row: dict[str, Any]) -> MetricRecord | None:
    """The record a metrics.jsonl line holds, or None for a line of no kind known here."""
    if isinstance(row.get("startup"), str) and _number(row.get("seconds")):
        return StartupRecord.from_json(row)
    if isinstance(row.get("log"), dict):
        return LogRecord.from_json(row)
    if _number(row.get("step_s")):
        return StepRecord.from_json(row)
    if _number(row.get("save_s")):
        return SaveRecord.from_json(row)
    return None


def parse_lines(data: bytes | str) -> Iterator[dict[str, Any]]:
    """The JSON objects of complete lines (a line cut short by a crash is skipped)."""
    for raw in data.splitlines():
        try:
            row = json.loads(raw)
        except ValueError:
            continue
        if isinstance(row, dict):
            yield row


def read_metrics(path: str | Path) -> list[MetricRecord]:
    """Every record of a metrics.jsonl. Raises OSError when it cannot be read."""
    return [r for row in parse_lines(Path(path).read_text(errors="replace")) if (r := metric_record(row))]


def append(path: str | Path, record: MetricRecord | Attempt) -> None:
    """Append one record as one line (the one way every writer writes)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a") as f:
        f.write(json.dumps(record.to_json()) + "\n")


@frozen
class Attempt:
    """One supervised attempt of a run and how it ended: its state, and for a failure its kind, the side it came
    from (the vLLM server or the trainers) and its root cause."""

    attempt: int
    ended: float
    state: RunState
    exit_code: int
    failure: FailureKind | None = None
    side: Role | None = None
    cause: str | None = None
    message: str = ""
    adaptations: tuple[AdaptRecord, ...] = ()  # launch.adapt's decisions in this attempt

    def to_json(self) -> dict[str, Any]:
        out = {k: (str(v) if isinstance(v, StrEnum) else v) for k, v in asdict(self).items()}
        out["adaptations"] = [a.to_json() for a in self.adaptations]
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Attempt:
        return cls(
            attempt=int(row.get("attempt") or 0),
            ended=_float(row.get("ended")),
            state=_enum(RunState, row.get("state")) or RunState.FAILED,
            exit_code=int(row.get("exit_code") or 0),
            failure=_enum(FailureKind, row.get("failure")),
            side=_enum(Role, row.get("side")),
            cause=row.get("cause"),
            message=str(row.get("message") or ""),
            adaptations=tuple(AdaptRecord.from_json(a) for a in row.get("adaptations") or () if isinstance(a, dict)),
        )

    @property
    def why(self) -> str:
        return self.cause or self.message


def read_attempts(path: str | Path) -> list[Attempt]:
    """The attempts of a run ([] when none was recorded). Raises ConfigError, naming the file, for a record this
    version cannot read (a launch.adapt decision with an action it does not know)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    attempts = []
    for row in parse_lines(text):
        try:
            attempts.append(Attempt.from_json(row))
        except ValueError as exc:
            raise ConfigError(
                f"{path}: attempt {row.get('attempt')!r}: {exc}",
                hint="The file was written by another version of grpo-launch, or edited by hand.",
            ) from None
    return attempts


@frozen
class Prediction:
    """What the plan predicted for one optimizer step, as plan.json's estimate records it (render writes it;
    calibration, ``status`` and the report read it). ``workload`` is planning's Workload.to_dict()."""

    generation_s: float
    old_logprobs_s: float
    training_s: float
    sync_s: float
    train_memory_gib: float | None = None
    workload: dict[str, Any] | None = None

    @property
    def step_s(self) -> float:
        return self.generation_s + self.old_logprobs_s + self.training_s + self.sync_s

    @property
    def trainer_generation_s(self) -> float:
        """What the trainer's own "generation" time includes: generation, the old log-probs, the weight sync."""
        return self.generation_s + self.old_logprobs_s + self.sync_s

    def to_json(self) -> dict[str, Any]:
        """The keys of plan.json's estimate this record owns."""
        times = {"generation": self.generation_s, "old_logprobs": self.old_logprobs_s, "training": self.training_s}
        return {"time_s": times | {"sync": self.sync_s, "step": self.step_s}, "workload": self.workload}

    @classmethod
    def from_json(cls, estimate: dict[str, Any] | None) -> Prediction | None:
        """From plan.json's estimate (None when the plan made none)."""
        times = (estimate or {}).get("time_s")
        if not isinstance(times, dict) or not _number(times.get("training")):
            return None
        memory = (estimate or {}).get("memory_per_training_gpu_gib") or {}
        workload = (estimate or {}).get("workload")
        return cls(
            generation_s=_float(times.get("generation")),
            old_logprobs_s=_float(times.get("old_logprobs")),
            training_s=_float(times.get("training")),
            sync_s=_float(times.get("sync")),
            train_memory_gib=float(memory["total"]) if _number(memory.get("total")) else None,
            workload=workload if isinstance(workload, dict) else None,
        )


# launch.adapt's decisions: made by planning/after_run/decision.py, kept with the attempt they were made in.


@frozen
class AdaptRecord:
    """One launch.adapt decision, as ``control/attempts.jsonl`` keeps it (``status`` and the report read it). Times
    are seconds per prompt: ``measured_s`` on the running split; ``predicted_s`` what its plan predicted;
    ``calibrated_s`` the running split re-predicted with the measurements; ``new_s`` the split moved to, predicted
    the same way (a revert: the measured time of the split returned to)."""

    action: AdaptAction
    reason: str
    at_step: int
    split: str
    measured_s: float
    predicted_s: float | None = None
    calibrated_s: float | None = None
    new_split: str | None = None
    new_s: float | None = None

    def __post_init__(self) -> None:
        # a plain "resplit" becomes the enum member (ValueError for a word that is none), so `.action.moves` holds
        object.__setattr__(self, "action", AdaptAction(self.action))

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(AdaptRecord)}
        out["action"] = str(self.action)
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> AdaptRecord:
        """Raises ValueError for an action this version does not know: what follows a decision depends on it."""
        action = _enum(AdaptAction, row.get("action"))
        if action is None:
            known = ", ".join(AdaptAction)
            raise ValueError(f"a launch.adapt decision with the unknown action {row.get('action')!r} (known: {known})")
        new_split = row.get("new_split")
        return cls(
            action=action,
            reason=str(row.get("reason") or ""),
            at_step=_int_or_none(row.get("at_step")) or 0,
            split=str(row.get("split") or ""),
            measured_s=_float(row.get("measured_s")),
            predicted_s=_float_or_none(row.get("predicted_s")),
            calibrated_s=_float_or_none(row.get("calibrated_s")),
            new_split=new_split if isinstance(new_split, str) else None,
            new_s=_float_or_none(row.get("new_s")),
        )

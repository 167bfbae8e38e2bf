"""What is written into a run directory as records, each with its one writer and the same reading for every
reader (standard library only: the trainers write some of them).

- ``metrics.jsonl`` (rank 0 of the trainers appends): a :class:`StepRecord` per optimizer step, a
  :class:`SaveRecord` per checkpoint and a :class:`LogRecord` per logging step (TRL's logged metrics). The
  watchdog, ``status``, ``plan --calibrate-from`` and the report read them with :func:`read_metrics`.
- ``control/attempts.jsonl`` (the launcher appends): an :class:`Attempt` per supervised attempt, with the
  launch.adapt decisions made in it (:class:`AdaptRecord`).
- ``plan.json``: :class:`.plan_record.PlanRecord` (what its readers use) and its :class:`Prediction`, which
  calibration, ``status`` and the report compare with what was measured.
- ``OUTPUT_DIR/grpo_launch_complete.json`` (the training entry writes it after the final save): a
  :class:`CompletionRecord`.
- A host's answer to the check before a hostfile or Ray run (``grpo_launch.node.host_check`` prints it): a
  :class:`HostCheck`.
- Not a file: what a batch system says of the run's job (``Backend.job_state``), a :class:`JobState`.

A line cut short by a crash is skipped; a record of a newer version with more keys still reads. The watchdog reads
the metrics leniently while the run goes (:func:`read_metrics`: a line that does not read is left out);
``status`` and the report read them strictly (:func:`load_lines`: such a line is an error naming the file and line).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import asdict, field
from pathlib import Path
from typing import Any, TypeVar

from grpo_launch.enums import FailureKind, JobStatus, Role, RunState, StrEnum
from grpo_launch.rundir.adapt_record import AdaptRecord, UnknownAction
from grpo_launch.rundir.json_fields import (
    Fields,
    enum_or_none,
    file_error,
    float_or,
    float_or_none,
    int_or_none,
    loads,
    number,
    seconds,
    whole,
)
from grpo_launch.rundir.plan_record import PlanRecord, Prediction
from grpo_launch.rundir.trusted_files import open_nofollow, private_dir, read_text
from grpo_launch.spec import frozen

__all__ = [
    "AdaptRecord",
    "PlanRecord",
    "Prediction",
    "UnknownAction",
]  # plan.json's records live in .plan_record, the adapt decisions in .adapt_record: every reader finds them here
R = TypeVar("R")


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
    attempt: int | None = None  # the run's attempt that trained it (GRPO_LAUNCH_ATTEMPT); None: an older record

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
            step=whole(row.get("step"), "step"),
            step_s=seconds(row.get("step_s"), "step_s"),
            generation_s=float_or_none(row.get("generation_s")),
            training_s=float_or_none(row.get("training_s")),
            max_steps=int_or_none(row.get("max_steps")),
            time=float_or_none(row.get("time")),
            num_tokens=int_or_none(row.get("num_tokens")),
            peak_memory_bytes=tuple(int(p) for p in peaks if number(p)),
            memory_kind=row.get("memory_kind") if isinstance(row.get("memory_kind"), str) else None,
            gpu_utilization=tuple(int(u) if number(u) else None for u in busy),
            attempt=int_or_none(row.get("attempt")),
        )


@frozen
class SaveRecord:
    """A checkpoint saved after ``step``, and how long saving took (for the walltime-aware stop)."""

    step: int
    save_s: float
    attempt: int | None = None  # as StepRecord.attempt

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> SaveRecord:
        step, save_s = whole(row.get("step"), "step"), seconds(row.get("save_s"), "save_s")
        return cls(step, save_s, int_or_none(row.get("attempt")))


@frozen
class LogRecord:
    """TRL's logged metrics at ``step`` (reward, completions/mean_length, kl, …): numbers only."""

    step: int
    log: dict[str, float] = field(default_factory=dict)
    attempt: int | None = None  # as StepRecord.attempt

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "log": dict(self.log), "attempt": self.attempt}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> LogRecord:
        log = {str(k): float(v) for k, v in row["log"].items() if number(v)}
        return cls(whole(row.get("step"), "step"), log, int_or_none(row.get("attempt")))


@frozen
class StartupRecord:
    """One term of an attempt's time to its first step, in seconds: the trainers' start (``start``: from the
    launcher's start of them, or the rank's own when that is not known, to TRL imported), their load (``model_load``:
    from then to a built trainer; the dataset is prepared in it; runs before ``start`` existed counted the imports
    here), the vLLM server's start to
    healthy (the launcher writes it; it runs beside the load), the first weight sync and the first generation (rank
    0 writes those)."""

    phase: str  # one of rundir.startup_phases.STARTUP_PHASES
    seconds: float
    time: float | None = None  # wall clock when it ended

    def to_json(self) -> dict[str, Any]:
        return {"startup": self.phase, "seconds": self.seconds, "time": self.time}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> StartupRecord:
        return cls(str(row["startup"]), float_or(row.get("seconds")), float_or_none(row.get("time")))


MetricRecord = StepRecord | SaveRecord | LogRecord | StartupRecord


def metric_record(row: dict[str, Any]) -> MetricRecord | None:
    """The record a metrics.jsonl line holds, or None for a line of no kind known here or whose values do not read
    (the watchdog reads lines while the run writes them, and must never fail on one)."""
    try:
        return metric_record_strict(row)
    except (ValueError, TypeError, OverflowError):
        return None


def metric_record_strict(row: dict[str, Any]) -> MetricRecord | None:
    """The record a metrics.jsonl line holds, None for a line of no kind known here (a newer version's); a line of
    a known kind whose values do not read (``"step": 1e400``) raises ValueError."""
    if isinstance(row.get("startup"), str) and number(row.get("seconds")):
        return StartupRecord.from_json(row)
    if isinstance(row.get("log"), dict):
        return LogRecord.from_json(row)
    if "step_s" in row:
        return StepRecord.from_json(row)
    if "save_s" in row:
        return SaveRecord.from_json(row)
    return None


def parse_lines(data: bytes | str) -> Iterator[dict[str, Any]]:
    """The JSON objects of complete lines (a line cut short by a crash is skipped)."""
    for raw in data.splitlines():
        try:
            row = loads(raw)
        except ValueError:
            continue
        if isinstance(row, dict):
            yield row


def read_metrics(path: str | Path) -> list[MetricRecord]:
    """Every record of a metrics.jsonl, leniently (a line that does not read is left out). Raises OSError when it
    cannot be read."""
    return [r for row in parse_lines(read_text(path)) if (r := metric_record(row))]


class MetricsTail:
    """A metrics.jsonl read as it grows, for a reader that reads it again and again while the run goes (the
    launcher's Prometheus endpoint, scraped every few seconds): each :meth:`read` reads only the bytes appended since
    the last one and parses only those lines, keeping the records already parsed, as :func:`read_metrics` reads
    (leniently). A line still being written waits for its end. A file replaced (another inode: ``--resume never``
    sets the record aside) or cut shorter is read again from its start. Not thread-safe: one caller at a time."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records: list[MetricRecord] = []
        self.bytes_read = 0  # in all, over every read (what a second read costs is what was appended)
        self._offset = 0
        self._pending = b""
        self._file: tuple[int, int] | None = None

    def read(self) -> tuple[tuple[MetricRecord, ...], bool]:
        """The records so far, and whether the file is there. Raises OSError when it cannot be read (a FIFO or
        device planted in its place is one)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            self._restart(None)
            return (), False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{self.path}: not a regular file")
            if (st.st_dev, st.st_ino) != self._file or st.st_size < self._offset:
                self._restart((st.st_dev, st.st_ino))
            chunks, at = [], self._offset
            while chunk := os.pread(fd, 1 << 20, at):
                chunks.append(chunk)
                at += len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        self._offset += len(data)
        self.bytes_read += len(data)
        whole, _, self._pending = (self._pending + data).rpartition(b"\n")
        self.records += [r for row in parse_lines(whole) if (r := metric_record(row))]
        return tuple(self.records), True

    def _restart(self, file: tuple[int, int] | None) -> None:
        self.records, self._offset, self._pending, self._file = [], 0, b"", file


def load_lines(path: str | Path, text: str, parse: Callable[[dict[str, Any]], R | None]) -> list[R]:
    """Each line of a JSON-lines run file through ``parse``, strictly: a line that is not a JSON object, or whose
    values do not read, is a RunFileError naming the file and the line. A line cut short by a crash (it does not end
    its object) is skipped, and so is a line of a kind ``parse`` does not know (None)."""
    out = []
    lines = text.splitlines()
    for n, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            row = loads(line)
        except ValueError as exc:
            being_written = n == len(lines) and not text.endswith("\n")  # a writer is in the middle of it
            if being_written or not line.endswith("}"):
                continue  # cut short: the writer died mid-line (append() starts the next record on a line of its own)
            raise file_error(path, f", line {n}", f"not JSON ({exc})") from None
        if not isinstance(row, dict):
            raise file_error(path, f", line {n}", f"not a JSON object (got {type(row).__name__})")
        try:
            record = parse(row)
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError) as exc:
            raise file_error(path, f", line {n}", str(exc) or exc.__class__.__name__) from None
        if record is not None:
            out.append(record)
    return out


def append(path: str | Path, record: MetricRecord | Attempt) -> None:
    """Append one record as one line (the one way every writer writes)."""
    target = Path(path)
    private_dir(target.parent)
    with open_nofollow(target, "a+b") as f:  # never through a link planted in the run directory
        # A line an earlier writer left cut short (it died mid-line) is ended first, so this record is whole.
        f.seek(0, 2)
        if f.tell() > 0:
            f.seek(-1, 2)
            ended = f.read(1) == b"\n"
            f.seek(0, 2)
            if not ended:
                f.write(b"\n")
        f.write((json.dumps(record.to_json()) + "\n").encode())


@frozen
class Attempt:
    """One supervised attempt of a run and how it ended: its state, and for a failure its kind, the side it came
    from (the vLLM server or the trainers) and its root cause. ``attempt`` numbers it over the run directory
    (restarts, requeues and resumes go on counting): the number its trainers wrote into their records."""

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
            attempt=whole(row.get("attempt"), "attempt"),
            ended=float_or(row.get("ended")),
            state=enum_or_none(RunState, row.get("state")) or RunState.FAILED,
            exit_code=whole(row.get("exit_code"), "exit_code"),
            failure=enum_or_none(FailureKind, row.get("failure")),
            side=enum_or_none(Role, row.get("side")),
            cause=None if row.get("cause") is None else str(row.get("cause")),
            message=str(row.get("message") or ""),
            adaptations=tuple(AdaptRecord.from_json(a) for a in row.get("adaptations") or () if isinstance(a, dict)),
        )

    @property
    def why(self) -> str:
        return self.cause or self.message


def read_attempts(path: str | Path) -> list[Attempt]:
    """The attempts of a run ([] when none was recorded); a line that does not read is left out, but a launch.adapt
    decision this version does not know is an error naming the file (what follows a decision depends on it)."""
    try:
        text = read_text(path)
    except OSError:
        return []
    return attempts_of(text, path)


def attempts_of(text: str, path: str | Path = "attempts.jsonl") -> list[Attempt]:
    """The attempts of an attempts.jsonl's text, leniently (a line that does not read is left out), except an
    unknown launch.adapt action (:class:`UnknownAction`), which raises naming ``path`` and the attempt."""
    out = []
    for row in parse_lines(text):
        try:
            out.append(Attempt.from_json(row))
        except UnknownAction as exc:
            raise file_error(path, f": attempt {row.get('attempt')!r}", str(exc)) from None
        except (ValueError, TypeError, OverflowError):
            continue
    return out


@frozen
class CompletionRecord:
    """A finished run (``OUTPUT_DIR/grpo_launch_complete.json``, written by the training entry after the final
    save): the step it ended at and its max_steps. A run complete at its max_steps is not trained again."""

    step: int
    max_steps: int | None = None
    time: float | None = None  # wall clock when it was written

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "max_steps": self.max_steps, "time": self.time}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> CompletionRecord:
        return cls(whole(row.get("step"), "step"), int_or_none(row.get("max_steps")), float_or_none(row.get("time")))


@frozen
class JobState:
    """What a batch system says of the job a run belongs to (``Backend.job_state``): its state in grpo-launch's
    words, the batch system's own word for it (Slurm's ``TIMEOUT``, ``NODE_FAIL``), its restarts, run time and time
    limit as the batch system writes them, and its nodes. ``status`` shows it; no batch system's keys reach it."""

    state: JobStatus
    native: str = ""
    restarts: int | None = None
    run_time: str | None = None
    time_limit: str | None = None
    nodes: str | None = None

    @property
    def said(self) -> str:
        """The state as ``status`` says it: the batch system's word, and grpo-launch's where they differ."""
        word = self.native or str(self.state)
        return word if word == str(self.state) else f"{word} ({self.state})"

    def to_json(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, StrEnum) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> JobState:
        state = enum_or_none(JobStatus, row.get("state")) or JobStatus.UNKNOWN
        text = {k: row.get(k) if isinstance(row.get(k), str) else None for k in ("run_time", "time_limit", "nodes")}
        return cls(state, str(row.get("native") or ""), int_or_none(row.get("restarts")), **text)


@frozen
class HostCheck:
    """A host's answer before a run on several hosts starts anything (``grpo_launch.node.host_check`` prints it as
    one JSON line): its grpo-launch version, which of the recipe's local paths it lacks, which of its ports are
    taken, the vLLM version its Python imports, its name and its RAM."""

    version: str
    missing: tuple[str, ...] = ()
    busy: tuple[int, ...] = ()
    vllm: str | None = None
    host: str = ""
    memory_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"missing": list(self.missing), "busy": list(self.busy)}

    @classmethod
    def from_json(cls, row: Any, source: str) -> HostCheck:
        """Strict: ``source`` names where the line came from (``host h1's check``) in the error."""
        f = Fields(row, source)
        return cls(
            f.text("version"),
            tuple(str(p) for p in f.sequence("missing")),
            tuple(int(p) for p in f.sequence("busy") if number(p)),
            f.text_or_none("vllm"),
            f.text("host"),
            f.integer_or_none("memory_bytes"),
        )

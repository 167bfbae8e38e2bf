"""One view of a run directory (standard library only): :meth:`RunView.load` reads plan.json, metrics.jsonl, the
attempts, the lock and the stop marker once each, as records; ``status``, the run report, ``plan --calibrate-from``
(through :func:`grpo_launch.analysis.step_means.measure`) and the resume hint take the view instead of reading the files
again.

Strict by default: a plan.json that is not the record its readers use, or a metrics or attempts line that does not
read, is a :class:`.fields.RunFileError` naming the file and the key or line (``status`` and ``report`` print it, no
traceback). ``strict=False`` is for the launcher reading while the trainers write (launch.adapt): such a metrics
line is left out. A missing file is not an error here: a run that has not stepped yet has no metrics.jsonl, a
directory of a plan alone has no attempts; the readers say what they lack.
"""

from __future__ import annotations

from pathlib import Path

from grpo_launch.analysis.by_attempt import AttemptCourse, courses, curve, next_attempt, warm_steps
from grpo_launch.rundir.control import stopped_at
from grpo_launch.rundir.files import last_holder, lock_holder
from grpo_launch.rundir.json_fields import file_error, loads
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.plan_record import PlanRecord
from grpo_launch.rundir.records import (
    Attempt,
    MetricRecord,
    MetricsTail,
    StepRecord,
    attempts_of,
    load_lines,
    metric_record,
    metric_record_strict,
    parse_lines,
)
from grpo_launch.rundir.trusted_files import read_text
from grpo_launch.spec import frozen


@frozen
class BatchJob:
    """The batch job the run's lock names (``grpo-launch sbatch``, a Slurm allocation): its backend and id."""

    backend: str
    job_id: str


@frozen
class RunView:
    """A run directory read once. ``plan``: None without a plan.json; ``records``: metrics.jsonl's records in order
    (``metrics_found``: whether the file is there); ``holder``: who holds the run's lock now (None: no launcher runs
    it); ``job``: the batch job the lock names; ``stopped_at``: the step the trainers stopped at on request."""

    root: Path
    plan: PlanRecord | None
    records: tuple[MetricRecord, ...]
    metrics_found: bool
    attempts: tuple[Attempt, ...]
    holder: str | None
    job: BatchJob | None
    stopped_at: int | None

    @classmethod
    def load(cls, run_dir: str | Path, *, strict: bool = True, tail: MetricsTail | None = None) -> RunView:
        """``tail``: metrics.jsonl as a reader that reads it again and again keeps it (the launcher's endpoint):
        only what was appended since its last read is read (leniently, as ``strict=False``)."""
        root = Path(run_dir)
        paths = RunPaths(root)
        records, found = tail.read() if tail is not None else _metrics(paths.metrics, strict)
        return cls(
            root=root,
            plan=_plan(paths.plan_json),
            records=tuple(records),
            metrics_found=found,
            attempts=tuple(_attempts(paths.attempts, strict)),
            holder=lock_holder(root),
            job=_job(last_holder(root)),
            stopped_at=stopped_at(root),
        )

    @property
    def paths(self) -> RunPaths:
        return RunPaths(self.root)

    @property
    def last_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def curve(self) -> list[MetricRecord]:
        """The records with each step once: a resumed attempt's records supersede the earlier attempts' from its
        first step on (:func:`.course.curve`). ``records`` keeps every line as written."""
        return curve(self.records)

    def steps(self, after_step: int = 0, *, warm: bool = False) -> list[StepRecord]:
        """The curve's optimizer steps after ``after_step``; ``warm``: without each attempt's first step (it
        compiles, warms up and, after a resume, loads the checkpoint) when the attempt has more."""
        steps = warm_steps(self.records) if warm else [r for r in self.curve() if isinstance(r, StepRecord)]
        return [r for r in steps if r.step > after_step]

    def courses(self) -> list[AttemptCourse]:
        """Each attempt's steps, step time and end, in order (:func:`.course.courses`)."""
        return courses(self.records, self.attempts)

    @property
    def last_step(self) -> int:
        """The newest optimizer step the run's metrics record (0 before the first)."""
        return max((r.step for r in self.records if isinstance(r, StepRecord)), default=0)

    @property
    def next_attempt(self) -> int:
        """The number the run's next attempt takes (attempts are numbered over the whole run directory)."""
        return next_attempt(self.records, self.attempts)

    def logs(self) -> list[Path]:
        """The run's log files (the launcher's, each process's)."""
        return sorted(self.paths.logs.glob("*.log"))


def _read(path: Path) -> str | None:
    """The file's text, None when it is not there; any other failure to read it is an error naming it."""
    try:
        return read_text(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise file_error(path, "", f"cannot be read ({exc.strerror or exc})") from None


def _plan(path: Path) -> PlanRecord | None:
    text = _read(path)
    if text is None:
        return None
    try:
        data = loads(text)
    except ValueError as exc:
        raise file_error(path, "", f"not JSON ({exc})") from None
    return PlanRecord.from_json(data, path)


def _metrics(path: Path, strict: bool) -> tuple[list[MetricRecord], bool]:
    text = _read(path)
    if text is None:
        return [], False
    if not strict:
        return [r for row in parse_lines(text) if (r := metric_record(row))], True
    return load_lines(path, text, metric_record_strict), True


def _attempts(path: Path, strict: bool) -> list[Attempt]:
    text = _read(path)
    if text is None:
        return []
    return load_lines(path, text, Attempt.from_json) if strict else attempts_of(text)


def _job(info: dict) -> BatchJob | None:
    """The batch job the lock's record names."""
    job, name = info.get("job_id"), info.get("backend")
    return BatchJob(str(name), str(job)) if job and name else None

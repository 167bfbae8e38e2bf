"""The run's control directory: how grpo-launch asks the trainers to checkpoint and stop, and how they answer.

grpo-launch (on SIGUSR2, e.g. Slurm's warning before the time limit; on the first Ctrl-C or SIGTERM; before a time
limit) creates ``stop-requested``; the trainers see it at the end of a step, agree on it across ranks, save a
checkpoint and exit 0; rank 0 writes the step into ``stopped-at-step``. A new run clears both.

Under Slurm the platform signals the trainers' own steps too (a preemption's GraceTime sends SIGTERM to every task
of every step, not to the batch shell): there the trainers hold SIGTERM (``node.shim --hold-term``, which sets
``HOLD_SIGTERM_ENV``) and turn it into the same request (:func:`request_stop_on_sigterm`), naming the signal as its
reason, so the launcher learns why the run stops. Standard library only (the training entry imports it).

While a checkpoint is written rank 0 keeps ``saving-checkpoint`` (its step and when the write began): a second
Ctrl-C then abandons a half-written checkpoint, and the launcher says so before (:func:`saving`)."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

from grpo_launch.errors import LaunchError
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.trusted_files import open_nofollow, private_dir, read_text

LAUNCHER = "checkpoint and stop"  # the launcher's own request (its text, for a reader of the file)
SAVING = "saving-checkpoint"  # in the control directory: the checkpoint rank 0 is writing, "STEP EPOCH-SECONDS"


def _write(path: Path, text: str) -> None:
    """A control file, 0600 and never through a link planted in the control directory."""
    with open_nofollow(path, "w", encoding="utf-8") as f:
        f.write(text)


def reset(run_dir: str | Path) -> None:
    """Forget an earlier run's request and answer (a requeued job must not stop at its first step)."""
    paths = RunPaths(run_dir)
    private_dir(paths.control)
    for path in (paths.stop_request, paths.stopped_marker, paths.control / SAVING):
        path.unlink(missing_ok=True)


def request_stop(run_dir: str | Path, reason: str = LAUNCHER) -> None:
    """Ask the trainers to save a checkpoint at the end of the step in flight and stop. ``reason``: who asked (the
    launcher, or a signal the trainers received); an earlier request keeps its reason."""
    paths = RunPaths(run_dir)
    private_dir(paths.control)
    if not paths.stop_request.exists():
        _write(paths.stop_request, f"{reason}\n")


def stop_reason(run_dir: str | Path) -> str | None:
    """Why a stop was requested (:data:`LAUNCHER`, or e.g. ``SIGTERM`` to the trainers), or None: no request."""
    try:
        return read_text(RunPaths(run_dir).stop_request).strip() or LAUNCHER
    except OSError:
        return None


def mark_stopped(run_dir: str | Path, step: int) -> None:
    """Rank 0's answer: it saved a checkpoint after ``step`` and stopped."""
    _write(RunPaths(run_dir).stopped_marker, f"{step}\n")


def stopped_at(run_dir: str | Path) -> int | None:
    """The step the trainers stopped at on request, or None if they did not."""
    try:
        return int(read_text(RunPaths(run_dir).stopped_marker).strip())
    except (OSError, ValueError):
        return None


def mark_saving(run_dir: str | Path, step: int, now: float | None = None) -> None:
    """Rank 0, at the end of a step whose checkpoint is about to be written."""
    _write(RunPaths(run_dir).control / SAVING, f"{step} {time.time() if now is None else now}\n")


def saved(run_dir: str | Path) -> None:
    """Rank 0, once the checkpoint is written."""
    (RunPaths(run_dir).control / SAVING).unlink(missing_ok=True)


def saving(run_dir: str | Path) -> tuple[int, float] | None:
    """The checkpoint being written: (its step, when the write began), or None."""
    try:
        step, began = read_text(RunPaths(run_dir).control / SAVING).split()
        return int(step), float(began)
    except (OSError, ValueError):
        return None


def write_stop_grace(run_dir: str | Path, seconds: float, why: str) -> None:
    """How long this attempt's stop waits for the trainers' checkpoint, and where that comes from (``status``)."""
    paths = RunPaths(run_dir)
    private_dir(paths.control)
    _write(paths.stop_grace, f"{seconds:g} {why}\n")


def stop_grace(run_dir: str | Path) -> tuple[float, str] | None:
    """The last attempt's stop grace and its source, or None (none recorded)."""
    try:
        seconds, _, why = read_text(RunPaths(run_dir).stop_grace).strip().partition(" ")
        return float(seconds), why
    except (OSError, ValueError):
        return None


def request_stop_on_sigterm(run_dir: str | Path) -> None:
    """In a trainer rank started with SIGTERM held (``node.shim --hold-term``): from now on SIGTERM asks for a
    checkpoint at the end of this step (every rank agrees on it there) instead of killing the rank mid-step. Call
    on the main thread. The launcher stops the rank otherwise (SIGINT, SIGKILL)."""

    def handle(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError, LaunchError):  # a full disk or a planted link: no traceback mid-step
            request_stop(run_dir, signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handle)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

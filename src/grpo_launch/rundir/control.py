"""The run's control directory: how grpo-launch asks the trainers to checkpoint and stop, and how they answer.

grpo-launch (on SIGUSR2, e.g. Slurm's warning before the time limit) creates ``stop-requested``; the trainers see it
at the end of a step, agree on it across ranks, save a checkpoint and exit 0; rank 0 writes the step into
``stopped-at-step``. A new run clears both. Standard library only (the training entry imports it)."""

from __future__ import annotations

from pathlib import Path

from grpo_launch.rundir.layout import RunPaths


def reset(run_dir: str | Path) -> None:
    """Forget an earlier run's request and answer (a requeued job must not stop at its first step)."""
    paths = RunPaths(run_dir)
    paths.control.mkdir(parents=True, exist_ok=True)
    for path in (paths.stop_request, paths.stopped_marker):
        path.unlink(missing_ok=True)


def request_stop(run_dir: str | Path) -> None:
    paths = RunPaths(run_dir)
    paths.control.mkdir(parents=True, exist_ok=True)
    paths.stop_request.write_text("checkpoint and stop\n")


def mark_stopped(run_dir: str | Path, step: int) -> None:
    """Rank 0's answer: it saved a checkpoint after ``step`` and stopped."""
    RunPaths(run_dir).stopped_marker.write_text(f"{step}\n")


def stopped_at(run_dir: str | Path) -> int | None:
    """The step the trainers stopped at on request, or None if they did not."""
    try:
        return int(RunPaths(run_dir).stopped_marker.read_text().strip())
    except (OSError, ValueError):
        return None

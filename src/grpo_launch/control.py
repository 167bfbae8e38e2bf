"""The run's control directory: how grpo-launch asks the trainers to checkpoint and stop, and how they answer.

grpo-launch (on SIGUSR2, e.g. Slurm's warning before the time limit) creates ``stop-requested``; the trainers see it
at the end of a step, agree on it across ranks, save a checkpoint and exit 0; rank 0 writes the step into
``stopped-at-step``. A new run clears both. Standard library only (the training entry imports it).
"""

from __future__ import annotations

from pathlib import Path

CONTROL_DIR = "control"
CONTROL_DIR_ENV = "GRPO_LAUNCH_CONTROL_DIR"
METRICS_ENV = "GRPO_LAUNCH_METRICS"  # the trainers append one JSON line per optimizer step to this file
METRICS_FILE = "metrics.jsonl"
STOP_REQUEST = "stop-requested"
STOPPED_MARKER = "stopped-at-step"
ATTEMPTS_FILE = "attempts.jsonl"  # one line per supervised attempt (restarts), written by grpo-launch
STACKS_DIR = "stacks"  # each trainer rank's Python stack, dumped there on SIGUSR1 (the hang watchdog)


def control_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONTROL_DIR


def reset(run_dir: str | Path) -> None:
    """Forget an earlier run's request and answer (a requeued job must not stop at its first step)."""
    d = control_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    for name in (STOP_REQUEST, STOPPED_MARKER):
        (d / name).unlink(missing_ok=True)


def request_stop(run_dir: str | Path) -> None:
    d = control_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / STOP_REQUEST).write_text("checkpoint and stop\n")


def stopped_at(run_dir: str | Path) -> int | None:
    """The step the trainers stopped at on request, or None if they did not."""
    try:
        return int((control_dir(run_dir) / STOPPED_MARKER).read_text().strip())
    except (OSError, ValueError):
        return None


def read_jsonl(path: str | Path) -> list[dict]:
    """The JSON-object lines of a file grpo-launch or the trainers append to (metrics.jsonl, attempts.jsonl); a line
    cut short by a crash is skipped. Raises OSError when the file cannot be read."""
    import json

    rows = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows

"""The run's vLLM server as the launcher replaces it, in the run's control directory: how the launcher tells the
trainers that the server is down, that a replacement is up (its number, the *epoch*: 0 for the attempt's first
server, 1 for its first replacement, …), or that it gave up; and what each fault cost (``faults.jsonl``: one
:class:`FaultRecord` per fault, for ``status`` and the report).

Written by :mod:`grpo_launch.execute.server_keeper`, read by :mod:`grpo_launch.train.server_restart` (every rank, on
the trainers' hosts: the run directory is shared, as the stop request is). Standard library only."""

from __future__ import annotations

import json
import os
import socket
import urllib.parse
from pathlib import Path
from typing import Any

from grpo_launch.rundir.layout import RunPaths
from grpo_launch.spec import frozen

EPOCH, DOWN, GONE, FAULTS = "server-epoch", "server-down", "server-gone", "faults.jsonl"


def _path(run_dir: str | Path, name: str) -> Path:
    return RunPaths(run_dir).control / name


def _write(path: Path, text: str) -> None:
    """Atomically (a reader never sees half a file), private to the user."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def reset(run_dir: str | Path) -> None:
    """A new attempt's first server: epoch 0, up (the fault records stay: they are the run's history)."""
    for name in (EPOCH, DOWN, GONE):
        _path(run_dir, name).unlink(missing_ok=True)


def server_epoch(run_dir: str | Path) -> int:
    """Which server holds the run: 0 the attempt's first, N its N-th replacement."""
    try:
        return int(_path(run_dir, EPOCH).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def server_down(run_dir: str | Path) -> bool:
    """The launcher saw the server go and is replacing it."""
    return _path(run_dir, DOWN).exists()


def server_gone(run_dir: str | Path) -> str | None:
    """Why the launcher gave up on the server (None: it has not)."""
    try:
        return _path(run_dir, GONE).read_text().strip() or "no reason given"
    except OSError:
        return None


def mark_down(run_dir: str | Path, why: str) -> None:
    _write(_path(run_dir, DOWN), f"{why}\n")


def mark_up(run_dir: str | Path) -> int:
    """A replacement answers: the next epoch, and the server no longer down. Returns the new epoch."""
    epoch = server_epoch(run_dir) + 1
    _write(_path(run_dir, EPOCH), f"{epoch}\n")
    _path(run_dir, DOWN).unlink(missing_ok=True)
    return epoch


def mark_gone(run_dir: str | Path, why: str) -> None:
    _write(_path(run_dir, GONE), f"{why}\n")


def port_refused(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to ``url``'s host and port is refused: the host answers and nothing listens on the
    server's port, a sure sign that its API server is gone (a time-out or an unreachable host is not: a busy server
    or network may answer later). Both sides read the server's loss from it: the launcher, whose ssh client or Ray
    runner outlives a remote API server killed alone, and the trainers as a step ends."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return False
    if not parts.hostname or not port:
        return False
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


@frozen
class FaultRecord:
    """One fault of a run and what it cost: what failed (``cause``), what was restarted (``restarted``: "server" —
    the vLLM server alone, the trainers kept their state —, or "attempt"), when (epoch seconds), the seconds from
    the fault to the replacement answering (``down_s``; None: it never came back), the step in flight and the steps
    lost (0 when only the server was restarted: the step in flight generates again)."""

    cause: str
    restarted: str
    time: float
    down_s: float | None
    step: int | None = None
    steps_lost: int = 0
    attempt: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "fault": self.cause,
            "restarted": self.restarted,
            "time": self.time,
            "down_s": self.down_s,
            "step": self.step,
            "steps_lost": self.steps_lost,
            "attempt": self.attempt,
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> FaultRecord:
        down = row.get("down_s")
        step = row.get("step")
        return cls(
            str(row["fault"]),
            str(row["restarted"]),
            float(row["time"]),
            float(down) if isinstance(down, (int, float)) else None,
            int(step) if isinstance(step, int) else None,
            int(row.get("steps_lost") or 0),
            int(row["attempt"]) if isinstance(row.get("attempt"), int) else None,
        )


def record_fault(run_dir: str | Path, record: FaultRecord) -> None:
    path = _path(run_dir, FAULTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(json.dumps(record.to_json()) + "\n")


def read_faults(run_dir: str | Path) -> list[FaultRecord]:
    """Every fault recorded, leniently (a line that does not read is left out)."""
    try:
        lines = _path(run_dir, FAULTS).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            row = json.loads(line)
            out.append(FaultRecord.from_json(row))
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
    return out

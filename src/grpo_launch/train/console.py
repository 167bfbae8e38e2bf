"""What a trainer rank prints. Rank 0 speaks for the run on the console; every other rank writes to its own log
file (``RUN_DIR/logs/train-rankR-HOST-TIME.log``, each line time-stamped), and only its errors reach the console, as
one line with the rank (``[rankR]: ValueError: …``; the launcher shows it as ``[train rR@HOST]``).

Output is redirected at the file-descriptor level, so C++ warnings (DDP, gloo) and library prints follow it.
Progress bars are off (the console is a pipe to the launcher, and grpo-launch prints one line per step).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO

from grpo_launch.errors import LaunchError
from grpo_launch.rundir.trust import open_nofollow
from grpo_launch.train.environment import JobEnvironment

_REAL_STDERR: list[IO[str]] = []


def quiet_progress_bars() -> None:
    """No tqdm bars: before transformers, datasets and huggingface_hub are imported (they read these)."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def _stamp(read_fd: int, out: IO[bytes]) -> None:
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            stamp = time.strftime("%Y-%m-%d %H:%M:%S").encode()
            for line in lines:
                out.write(stamp + b" " + line.rsplit(b"\r", 1)[-1] + b"\n")
            out.flush()
        if pending:
            out.write(pending + b"\n")
            out.flush()


def to_own_log(job: JobEnvironment) -> Path | None:
    """For a rank other than 0 in a run directory: stdout and stderr go to its own time-stamped log file there
    (RUN_DIR/logs). Returns the file."""
    if job.is_rank_zero or job.paths is None:
        return None
    path = job.paths.logs / f"train-rank{job.rank}-{job.node}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = open_nofollow(path, "ab")
    except (OSError, LaunchError):
        return None
    _REAL_STDERR.append(os.fdopen(os.dup(2), "w", buffering=1))
    read_fd, write_fd = os.pipe()
    threading.Thread(target=_stamp, args=(read_fd, out), daemon=True).start()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    return path


def report_error(exc: BaseException, log: Path | None, rank: int) -> None:
    """One line on the console for a rank whose output goes to its own log (the traceback is in the log)."""
    if not _REAL_STDERR or isinstance(exc, KeyboardInterrupt):
        return
    message = str(exc).splitlines()[0] if str(exc) else ""
    where = f" (traceback: {log})" if log else ""
    module = type(exc).__module__
    name = type(exc).__qualname__ if module == "builtins" else f"{module}.{type(exc).__qualname__}"
    with contextlib.suppress(OSError):
        _REAL_STDERR[0].write(f"[rank{rank}]: {name}: {message}{where}\n")


def flush_own_log() -> None:
    """Let the time-stamping thread write what is still in the pipe before the process exits."""
    if _REAL_STDERR:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.2)

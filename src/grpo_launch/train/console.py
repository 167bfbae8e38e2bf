"""What a trainer rank prints. Rank 0 speaks for the run on the console; every other rank writes to its own log
file (``RUN_DIR/logs/train-rankR-HOST-TIME.log``, each line time-stamped), and only its errors reach the console, as
one line with the rank (``[rankR]: ValueError: … (raised TIME in FRAME; traceback: FILE)``, a
:class:`~grpo_launch.rundir.shown_text.Raised`; the launcher shows it as ``[train rR@HOST]``). Rank 0 states its error
the same way, its traceback in a file of its own: every rank says its error when it catches it, with the time, so the
launcher names the rank that raised first (not the one whose traceback was formatted first).

Output is redirected at the file-descriptor level, so C++ warnings (DDP, gloo) and library prints follow it.
Progress bars are off (the console is a pipe to the launcher, and grpo-launch prints one line per step).
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path
from typing import IO

from grpo_launch.errors import LaunchError
from grpo_launch.rundir.shown_text import Raised
from grpo_launch.rundir.trusted_files import open_nofollow
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
    """One line on the console for a rank's error, stated when it is caught (:class:`Raised`: the time, the user's
    frame that raised it, the file holding the traceback). A rank whose output goes to its own log (``log``) has its
    traceback there; rank 0 in a run directory writes it into a file of its own, and Python prints it no more."""
    if isinstance(exc, KeyboardInterrupt):
        return
    at = time.time()
    out: IO[str] | None = _REAL_STDERR[0] if _REAL_STDERR else None
    if out is None:
        log = _traceback_file(exc, rank)
        if log is None:
            return  # not started by grpo-launch: Python prints the traceback, as always
        out = sys.stderr
    message = str(exc).splitlines()[0] if str(exc) else ""
    module = type(exc).__module__
    name = type(exc).__qualname__ if module == "builtins" else f"{module}.{type(exc).__qualname__}"
    said = Raised(f"{name}: {message}", at, user_frame(exc), str(log) if log else None)
    with contextlib.suppress(OSError, ValueError):
        out.write(f"[rank{rank}]: {said.text()}\n")
        out.flush()


def _traceback_file(exc: BaseException, rank: int) -> Path | None:
    """Rank 0's traceback, in RUN_DIR/logs/train-rankR-HOST-TIME.log as the other ranks' are (the console gets its
    one line): the file, or None outside a run directory or when it cannot be written."""
    job = JobEnvironment.from_environ(os.environ)
    if job.paths is None or isinstance(exc, SystemExit):
        return None
    path = job.paths.logs / f"train-rank{rank}-{job.node}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open_nofollow(path, "a", encoding="utf-8") as f:
            f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + "".join(traceback.format_exception(exc)))
    except (OSError, LaunchError):
        return None
    sys.excepthook = _said  # the traceback is in the file: the console had its line
    return path


def _said(*_args: object) -> None:
    """sys.excepthook once a rank's error has been stated: nothing more on the console."""


# Code that is not the user's: the standard library, and grpo-launch itself (installed packages: by their folder).
_LIBRARIES = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"], str(Path(__file__).parents[1]))


def user_frame(exc: BaseException) -> str | None:
    """Where ``exc`` was raised, as ``function at FILE:LINE``: the innermost frame of the user's code (not the
    standard library's, an installed package's or grpo-launch's), else the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None

    def library(path: str) -> bool:
        return path.startswith(("<", *_LIBRARIES)) or "site-packages" in path or "dist-packages" in path

    f = next((f for f in reversed(frames) if not library(f.filename)), frames[-1])
    return f"{f.name} at {f.filename}:{f.lineno}"


def flush_own_log() -> None:
    """Let the time-stamping thread write what is still in the pipe before the process exits."""
    if _REAL_STDERR:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.2)

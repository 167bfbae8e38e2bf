"""Write a run directory's files (the one place planning output touches the disk), and the run directory's lock.

A run holds ``RUN_DIR/.grpo-launch.lock`` (an flock, released by the kernel when the holder dies, even by SIGKILL)
from before it writes anything until its processes are gone; the file names the holder. A second run in the same
directory is refused with the holder's pid, host and start time, and so is a ``plan`` or ``--dry-run`` that would
overwrite a running run's files."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from grpo_launch.errors import ConfigError, LaunchError
from grpo_launch.rundir.json_fields import loads
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.shown_text import command_line
from grpo_launch.rundir.trusted_files import check_run_dir, nofollow_fd, open_nofollow, private_dir
from grpo_launch.spec import redact_argv


def in_use(run_dir: Path, holder: str) -> LaunchError:
    return LaunchError(
        f"run directory {str(run_dir)!r} is in use by another grpo-launch run ({holder})",
        hint=f"Wait for it to finish ({command_line(['grpo-launch', 'status', run_dir])}), stop it, or use another "
        "--run-dir.",
    )


def _holder_text(run_dir: Path) -> str:
    info = last_holder(run_dir)
    if not {"pid", "host", "started"} <= set(info):
        return "holder unknown"
    return f"pid {info['pid']} on {info['host']}, started {info['started']}"


class RunLock:
    """The run directory's lock, taken before anything is written there and held until the run's processes are
    gone (``with RunLock(run_dir):``)."""

    def __init__(self, run_dir: str | Path, *, backend: str | None = None, job_id: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.path = RunPaths(self.run_dir).lock
        self.job = {"backend": backend, "job_id": job_id}  # the batch job the run belongs to, for status
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        check_run_dir(self.run_dir)  # before anything is written there (a planted link, another user's directory)
        _make_dir(self.run_dir)
        fd = nofollow_fd(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise in_use(self.run_dir, _holder_text(self.run_dir)) from None
        info = {
            "pid": os.getpid(),
            "host": os.uname().nodename,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(redact_argv(sys.argv)),  # no secret in the run directory
            **self.job,
        }
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(info) + "\n").encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the lock goes with the descriptor; the file stays (it may be read meanwhile)
            self._fd = None


def last_holder(run_dir: str | Path) -> dict:
    """What the run directory's lock file says about the last run that held it (pid, host, start, its backend and
    batch job)."""
    try:
        fd = _open_lock(RunPaths(run_dir).lock)
        try:
            info = loads(os.read(fd, 1 << 16).decode(errors="replace"))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def lock_holder(run_dir: str | Path) -> str | None:
    """Who holds the run directory's lock (a running run), or None."""
    path = RunPaths(run_dir).lock
    try:
        fd = _open_lock(path)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder_text(Path(run_dir))
    finally:
        os.close(fd)
    return None


def _open_lock(path: Path) -> int:
    """The lock file, to read who holds it (another user's run's too): never through a link, and never a FIFO
    planted there (reading one would hang ``plan``, ``status`` and ``resume``). Any refusal is an OSError: no holder."""
    try:
        return nofollow_fd(path, os.O_RDONLY, own=False)
    except LaunchError as exc:
        raise OSError(exc.message) from None


def _make_dir(root: Path) -> None:
    try:
        private_dir(root)  # 0700, whatever the umask: no other user changes what the run reads back
    except OSError as exc:
        raise ConfigError(
            f"cannot create run directory {str(root)!r}: {exc.strerror}", hint="Choose another with --run-dir DIR."
        ) from None


_TEMP_NAMES = itertools.count()


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new file beside ``path`` for an atomic write, as ``tempfile.mkstemp`` makes one (created exclusively, mode
    0600, not through a link) without importing tempfile and its random-name machinery on ``plan``'s start-up path:
    the name holds this process's id and a counter, and a name left by a crashed process of the same id is passed
    over."""
    while True:
        tmp = str(path.parent / f".{path.name}.{os.getpid()}.{next(_TEMP_NAMES)}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600), tmp
        except FileExistsError:
            continue


def write_run_files(run_dir: str | Path, files: Mapping[str, str], *, locked: bool = False) -> list[Path]:
    """Write each file atomically (temp file + rename), so a crash never leaves a half-written config. Refused
    while another run holds the directory (``locked``: the caller holds it). A whole plan's files replace the
    earlier plan's: a DeepSpeed config the new plan has none of is removed, not left beside a DDP config."""
    root = Path(run_dir)
    if not locked and (holder := lock_holder(root)) is not None:
        raise in_use(root, holder)
    check_run_dir(root)
    _make_dir(root)
    paths = RunPaths(root)
    if paths.relative(paths.accelerate_config) in files:  # a whole plan's files: one plan's, none of an earlier one
        stale = paths.relative(paths.deepspeed_config)  # the one a plan may leave out (DDP, FSDP)
        if stale not in files:
            (root / stale).unlink(missing_ok=True)
    written = []
    for rel, text in files.items():
        path = root / rel
        private_dir(path.parent)
        fd, tmp = _temp_beside(path)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        written.append(path)
    return written


def run_record(run_dir: str | Path) -> list[Path]:
    """The files that make a run directory the record of a run that started (its metrics and attempts)."""
    paths = RunPaths(run_dir)
    return [p for p in (paths.metrics, paths.attempts) if p.is_file()]


def plan_files_dir(run_dir: str | Path) -> tuple[Path, str | None]:
    """Where a plan or a dry run (not a run) may write its files for ``run_dir``: the run directory itself, unless
    it holds a run's record (:func:`run_record`). A run's plan.json, metrics and attempts are its record and are never
    overwritten: the files then go to a new ``RUN_DIR/plans/TIME/``, and the second value says so."""
    record = run_record(run_dir)
    if not record:
        return Path(run_dir), None
    base = RunPaths(run_dir).plans / time.strftime("%Y%m%d-%H%M%S")
    target, n = base, 1
    while target.exists():
        n += 1
        target = base.with_name(f"{base.name}-{n}")
    names = " and ".join(p.name for p in record)
    note = (
        f"{run_dir} holds a run's record ({names}): its plan.json is kept, and these files go to {target} "
        "(--run-dir DIR plans for another directory)"
    )
    return target, note


def set_aside_record(run_dir: str | Path) -> Path | None:
    """Move an earlier run's record (plan.json, metrics.jsonl, control/attempts.jsonl, tracking.json) into
    ``RUN_DIR/superseded-TIME/`` before a run that starts afresh in the same directory (``--resume never``); nothing
    is deleted. None when there is no record."""
    if not run_record(run_dir):
        return None
    paths = RunPaths(run_dir)
    target = paths.root / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while target.exists():
        n += 1
        target = target.with_name(f"{target.name.split('.', 1)[0]}.{n}")
    private_dir(target / "control")
    for path in (paths.plan_json, paths.metrics, paths.attempts, paths.tracking):  # a fresh run: a new W&B run too
        if path.is_file():
            path.rename(target / paths.relative(path))
    return target


def write_plan_files(run_dir: str | Path, files: Mapping[str, str]) -> tuple[list[Path], str | None]:
    """:func:`write_run_files` for a plan or a dry run, which never overwrites a run's record
    (:func:`plan_files_dir`); the note says where the files went instead."""
    if (holder := lock_holder(run_dir)) is not None:
        raise in_use(Path(run_dir), holder)
    target, note = plan_files_dir(run_dir)
    return write_run_files(target, files), note


class LauncherLog:
    """Appends the launcher's console lines to RUN_DIR/logs/launcher.log, each with its time and the launcher's pid,
    so they outlive the console. Lines are held until the run starts (:meth:`start`, once it holds its run
    directory): a run refused before that writes nothing. Never fails the run: a log that cannot be written is
    given up."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = RunPaths(run_dir).launcher_log
        self._ok = True
        self._held: list[str] | None = []

    def start(self) -> None:
        """The run has started: write what was held, and every line from now on."""
        held, self._held = self._held or [], None
        for line in held:
            self._append(line)

    def write(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        lines = "".join(f"{stamp} [pid {os.getpid()}] {line}\n" for line in str(text).splitlines() or [""])
        if self._held is not None:
            self._held.append(lines)
        else:
            self._append(lines)

    def _append(self, lines: str) -> None:
        if not self._ok:
            return
        try:
            private_dir(self.path.parent)
            with open_nofollow(self.path, "a", encoding="utf-8") as f:
                f.write(lines)
        except (OSError, LaunchError):  # a link planted there: refused by the run's start, and never written through
            self._ok = False

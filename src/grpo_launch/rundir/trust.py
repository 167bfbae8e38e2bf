"""What a run directory must be before grpo-launch writes in it or loads from it (standard library only).

A run directory is written by its launcher and read back by the next attempt, ``resume`` and the trainers (auto-resume
unpickles a checkpoint: DeepSpeed's and the Trainer's ``torch.load``). On a shared machine someone else could plant
files there: a symbolic link where the lock or a log will be (the write then lands in the link's target), or a
checkpoint that runs code when it is loaded. So:

- every file the launcher writes in a run directory (the lock, ``launcher.log``, each process's log, the records) is
  opened through :func:`open_nofollow`: never through a symbolic link, only a regular file with one name, owned by
  this user;
- a run directory, ``output_dir`` or checkpoint is refused (:func:`check_trusted`) when it is not owned by this user,
  or is writable by all without the sticky bit, before anything is read from it or written in it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any

from grpo_launch.errors import LaunchError
from grpo_launch.rundir.text import command_line

# How each file is opened, as open()'s modes name it.
_FLAGS = {
    "ab": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    "a+b": os.O_RDWR | os.O_APPEND | os.O_CREAT,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "r+b": os.O_RDWR | os.O_CREAT,  # the lock: read and rewritten in place, never truncated on open
}


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _linked(path: Path) -> LaunchError:
    try:
        target = f" (to {os.readlink(path)!r})"
    except OSError:
        target = ""
    return LaunchError(
        f"{str(path)!r} is a symbolic link{target}: grpo-launch never writes through a link in a run directory "
        "(someone could point it at a file of yours)",
        hint=f"Remove the link ({command_line(['rm', path])}) and check who else can write in {str(path.parent)!r}.",
    )


def nofollow_fd(path: str | Path, flags: int, mode: int = 0o644, *, own: bool = True) -> int:
    """``os.open(path, flags)``, never through a symbolic link (O_NOFOLLOW: a link is refused, not followed), never
    a FIFO or device that would block or misdirect the write, and (``own``: to write it) only a file of this user's
    with one name (a hard link to someone's file would be written through). Every file the launcher writes in a run
    directory is opened here, and the lock when it is read. A refusal is a LaunchError naming the file."""
    p = Path(path)
    try:
        fd = os.open(p, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _linked(p) from None
        if exc.errno == errno.ENXIO:  # a FIFO with no reader (O_NONBLOCK: the open does not hang on it)
            raise _not_own(p, "is not a regular file") from None
        raise
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif own and st.st_nlink > 1:
        problem = f"has {st.st_nlink} names (a hard link to another file)"
    elif own and st.st_uid != os.geteuid():
        problem = f"is owned by {_owner(st.st_uid)}, not by you"
    if problem is not None:
        os.close(fd)
        raise _not_own(p, problem)
    os.set_blocking(fd, True)
    return fd


def read_text(path: str | Path) -> str:
    """A run file's text, as ``Path.read_text(errors="replace")`` reads it, but never blocking on a FIFO nor reading a
    device planted in its place (``status`` and ``report`` read other users' runs): anything but a regular file is an
    OSError naming it, which the readers treat as a file that does not read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, encoding="utf-8", errors="replace", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _not_own(path: Path, problem: str) -> LaunchError:
    return LaunchError(
        f"{str(path)!r} {problem}: grpo-launch writes there only a file of its own",
        hint=f"Remove it ({command_line(['rm', path])}) and check who else can write in {str(path.parent)!r}.",
    )


def open_nofollow(path: str | Path, mode: str = "ab", *, encoding: str | None = None) -> IO[Any]:
    """:func:`nofollow_fd` as a file object; ``mode`` is one of ``ab``, ``a``, ``a+b``, ``w`` (created 0644)."""
    fd = nofollow_fd(path, _FLAGS[mode])
    try:
        return os.fdopen(fd, mode, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def check_trusted(path: str | Path, what: str, *, flag: str = "--run-dir DIR") -> None:
    """Refuse ``path`` (a directory, or a checkpoint and everything in it) when it is not this user's or when every
    user may write in it (mode o+w without the sticky bit): another user could then plant a lock or log link, or a
    checkpoint that runs code when it loads. Nothing there yet is fine (grpo-launch makes it). Called at each
    boundary where a run directory, output_dir or checkpoint is first used: the run's lock, ``resume``, and the
    resume decision (the launcher's and each trainer's) before a checkpoint loads."""
    root = Path(path)
    if not root.exists():
        return
    paths = [root, *sorted(root.rglob("*"))] if what == "checkpoint" else [root]
    me = os.geteuid()
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue  # a dangling link: nothing to load from it
        world = bool(st.st_mode & stat.S_IWOTH) and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX)
        if st.st_uid == me and not world:
            continue
        mode = stat.filemode(st.st_mode)
        where = f"{what} {str(root)!r}" + (f": {str(p.relative_to(root))!r}" if p != root else "")
        if st.st_uid != me:
            raise LaunchError(
                f"{where} is owned by {_owner(st.st_uid)} ({mode}), not by you ({_owner(me)}): grpo-launch does not "
                f"write in or load from what another user controls",
                hint=f"Use one of your own ({flag}), or have its owner hand it over: "
                f"{command_line(['chown', '-R', _owner_name(me), p])}.",
            )
        raise LaunchError(
            f"{where} is writable by every user ({mode}, no sticky bit): anyone on this machine could plant a link "
            "or a checkpoint there",
            hint=f"Take write access away from others: {command_line(['chmod', 'o-w', p])} (or use another: {flag}).",
        )


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def check_run_dir(run_dir: str | Path) -> None:
    """The run directory is this user's and not writable by all, and none of the files the launcher writes there is
    a symbolic link (the lock, the launcher's log, the records; each process's log is opened with O_NOFOLLOW when it
    is made). Called before the run takes its lock."""
    from grpo_launch.rundir.layout import RunPaths

    check_trusted(run_dir, "run directory")
    paths = RunPaths(run_dir)
    for p in (paths.logs, paths.control, paths.lock, paths.launcher_log, paths.metrics, paths.attempts):
        if p.is_symlink():
            raise _linked(p)
    for sub in (paths.logs, paths.control):
        if sub.is_dir():
            check_trusted(sub, "run directory", flag="--run-dir DIR")

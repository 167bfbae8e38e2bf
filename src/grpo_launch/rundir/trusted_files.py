"""What a run directory must be before grpo-launch writes in it or loads from it (standard library only).

A run directory is written by its launcher and read back by the next attempt, ``resume`` and the trainers (auto-resume
unpickles a checkpoint: DeepSpeed's and the Trainer's ``torch.load``). On a shared machine someone else could plant
files there: a symbolic link where the lock or a log will be (the write then lands in the link's target), or a
checkpoint that runs code when it is loaded. So:

- every file the launcher writes in a run directory (the lock, ``launcher.log``, each process's log, the records) is
  opened through :func:`open_nofollow`: never through a symbolic link, only a regular file with one name, owned by
  this user;
- a run directory, ``output_dir`` or checkpoint is refused (:func:`check_trusted`) when it is not owned by this user,
  or is writable by another user (its group, or all) without the sticky bit, before anything is read from it or
  written in it: a group member who can rewrite ``invocation.json`` or a checkpoint's ``.pt`` runs code as you when
  ``resume`` runs the command or auto-resume unpickles the file;
- what the run writes is private whatever the umask (a umask of 002 is common where each user has a group of their
  own, and shared groups inherit it): directories 0700 (:func:`private_dir`), files 0600, and the processes the
  launcher starts run under :data:`PRIVATE_UMASK` (:func:`private_umask`), so the trainers' checkpoints and vLLM's
  sockets are private too.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from grpo_launch.errors import LaunchError
from grpo_launch.rundir.layout import PRIVATE_UMASK, RunPaths
from grpo_launch.rundir.shown_text import command_line

# How each file is opened, as open()'s modes name it.
_FLAGS = {
    "ab": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    "a+b": os.O_RDWR | os.O_APPEND | os.O_CREAT,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "r+b": os.O_RDWR | os.O_CREAT,  # the lock: read and rewritten in place, never truncated on open
}
# What the run writes is its user's alone: the mode of its directories and files, and the umask of its processes.
DIR_MODE = 0o700
FILE_MODE = 0o600
# Mode bits that let a user other than the owner change a file, or add, remove and rename in a directory.
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
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


def nofollow_fd(
    path: str | Path, flags: int, mode: int = FILE_MODE, *, own: bool = True, dir_fd: int | None = None
) -> int:
    """``os.open(path, flags)``, never through a symbolic link (O_NOFOLLOW: a link is refused, not followed), never
    a FIFO or device that would block or misdirect the write, and (``own``: to write it) only a file of this user's
    with one name (a hard link to someone's file would be written through). O_TRUNC takes effect only once the file
    passed these checks. ``dir_fd``: the directory ``path`` is in, already open, and the file is opened by its name
    there (the report's files: the directory cannot be swapped for a link between its check and the write). Every
    file the launcher writes in a run directory is opened here, and the lock when it is read. A refusal is a
    LaunchError naming the file."""
    shown = Path(path)
    name = shown if dir_fd is None else shown.name
    try:
        fd = os.open(name, (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _linked(shown) from None
        if exc.errno == errno.ENXIO:  # a FIFO with no reader (O_NONBLOCK: the open does not hang on it)
            raise _not_own(shown, "is not a regular file") from None
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
        raise _not_own(shown, problem)
    if flags & os.O_TRUNC:
        os.ftruncate(fd, 0)
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
    """:func:`nofollow_fd` as a file object; ``mode`` is one of ``ab``, ``a``, ``a+b``, ``w`` (created 0600)."""
    fd = nofollow_fd(path, _FLAGS[mode])
    try:
        return os.fdopen(fd, mode, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def _others(st: os.stat_result) -> str | None:
    """Who besides the owner may change what ``st`` describes ("its group staff", "every user"), or None. A
    directory with the sticky bit (as /tmp) lets others add files but not replace or rename the owner's: those files
    are then judged by their own owner."""
    if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return None
    if st.st_mode & stat.S_IWOTH:
        return "every user"
    if st.st_mode & stat.S_IWGRP:
        return f"its group {_group(st.st_gid)}"
    return None


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def check_trusted(path: str | Path, what: str, *, flag: str = "--run-dir DIR") -> None:
    """Refuse ``path`` (a directory, or a checkpoint and everything in it) when it is not this user's or when
    another user may write in it (group- or world-writable, a directory without the sticky bit): that user could
    then plant a lock or log link, rewrite the command ``resume`` runs, or a checkpoint that runs code when it
    loads. Nothing there yet is fine (grpo-launch makes it, 0700). Called at each boundary where a run directory,
    output_dir or checkpoint is first used: the run's lock, ``resume``, and the resume decision (the launcher's and
    each trainer's) before a checkpoint loads."""
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
        others = _others(st)
        if st.st_uid == me and others is None:
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
        fix = ["chmod", "-R", "go-w", root] if what == "checkpoint" else ["chmod", "go-w", p]
        raise LaunchError(
            f"{where} is writable by {others} ({mode}{', no sticky bit' if stat.S_ISDIR(st.st_mode) else ''}): "
            f"another user could plant a link or a checkpoint there, or rewrite what grpo-launch loads or runs",
            hint=f"Take write access away from others: {command_line(fix)} (or use another: {flag}).",
        )


def read_own_text(path: str | Path) -> str:
    """The text of a run file grpo-launch acts on (``resume`` runs the command ``invocation.json`` holds), read as
    :func:`read_text` reads it, but only a regular file of this user's that no other user may change, in a directory
    no other user may write in (:func:`check_trusted`): a LaunchError names it otherwise. A file that is not there is
    a FileNotFoundError, as for :func:`read_text`."""
    p = Path(path)
    check_trusted(p.parent, "run directory")
    fd = _open_regular(p)
    try:
        _check_own(p, os.fstat(fd))
        os.set_blocking(fd, True)
        with os.fdopen(fd, encoding="utf-8", errors="replace", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def private_dir(path: str | Path) -> Path:
    """``mkdir -p -m 0700 path``: ``path`` and every directory above it that is missing are made 0700, whatever
    the umask (``Path.mkdir(parents=True)`` makes the ones above with the umask's mode: 0775 under 002). A directory
    already there is left as it is (:func:`check_trusted` judges it)."""
    target = Path(path)
    missing = []
    p = target
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            if not d.is_dir():
                raise
    return target


def open_own_dir(path: str | Path, what: str) -> int:
    """A descriptor of the directory ``path`` to write files in by name (:func:`nofollow_fd`'s ``dir_fd``), made
    0700 when it is missing; refused (a LaunchError) when it is a symbolic link, not a directory, not this user's,
    or writable by another user: whoever owns or may write in it could plant a link where a file will be written.
    ``what`` names it in the refusal."""
    p = Path(path)
    if p.is_symlink():
        raise _linked(p)
    try:
        os.mkdir(p, DIR_MODE)
    except FileExistsError:
        pass
    except OSError as exc:  # another user's run directory, a read-only one
        raise LaunchError(
            f"cannot create {what} {str(p)!r}: {exc.strerror or exc}",
            hint=f"{str(p.parent)!r} is not yours to write in: its owner can make it.",
        ) from None
    try:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a link since
            raise _linked(p) from None
        if exc.errno == errno.ENOTDIR:
            raise _not_own(p, "is not a directory") from None
        raise
    st = os.fstat(fd)
    others = _others(st)
    if st.st_uid == os.geteuid() and others is None:
        return fd
    os.close(fd)
    problem = f"is owned by {_owner(st.st_uid)}" if st.st_uid != os.geteuid() else f"is writable by {others}"
    raise LaunchError(
        f"{what} {str(p)!r} {problem} ({stat.filemode(st.st_mode)}): grpo-launch writes only in a directory no one "
        "else can plant a link in",
        hint=f"Remove it ({command_line(['rm', '-r', p])}) if it is not yours to keep, or check who else can write in "
        f"{str(p.parent)!r}.",
    )


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Run the block under :data:`PRIVATE_UMASK`, and the processes started in it too (a umask is inherited): what
    the trainers and the vLLM server create (checkpoints, logs, vLLM's IPC sockets in TMPDIR: connecting to a Unix
    socket needs write permission on it) is then its user's alone. The umask the block started with comes back."""
    before = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(before)


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def check_run_dir(run_dir: str | Path) -> None:
    """The run directory is this user's and no other user may write in it, and none of the files the launcher writes
    or reads back there (the lock, the launcher's log, the command ``resume`` runs, the plan, the records, the
    trainers' configs) is anything but a regular file of this user's that no other user may change: a symbolic link
    or a FIFO planted there is refused (each process's log is opened with O_NOFOLLOW when it is made). Called before
    the run takes its lock, and by ``resume`` before it reads the run's command."""
    check_trusted(run_dir, "run directory")
    paths = RunPaths(run_dir)
    for sub in (paths.logs, paths.control):
        if sub.is_symlink():
            raise _linked(sub)
        if sub.is_dir():
            check_trusted(sub, "run directory", flag="--run-dir DIR")
    written = (
        paths.lock,
        paths.launcher_log,
        paths.invocation,
        paths.plan_json,
        paths.metrics,
        paths.attempts,
        paths.tracking,
        paths.trainer_recipe,
        paths.accelerate_config,
        paths.deepspeed_config,
    )
    for p in written:
        if (st := _existing(p)) is not None:
            _check_own(p, st)


def _check_own(path: Path, st: os.stat_result) -> None:
    """Refuse a run file grpo-launch acts on (``st``: what it is) that is not this user's or that another user may
    change: it could hold their command or their values."""
    if st.st_uid != os.geteuid():
        raise _not_own(path, f"is owned by {_owner(st.st_uid)}, not by you")
    if (others := _others(st)) is not None:
        raise LaunchError(
            f"{str(path)!r} is writable by {others} ({stat.filemode(st.st_mode)}): grpo-launch does not act on a "
            "file another user could have rewritten",
            hint=f"Check what it holds, then take write access away from others: "
            f"{command_line(['chmod', 'go-w', path])}.",
        )


def _open_regular(path: Path) -> int:
    """``path`` opened for reading as the launcher opens a run file (O_NOFOLLOW | O_NONBLOCK: a link is refused, and
    a FIFO does not hold the open), refused unless fstat says it is a regular file (a LaunchError naming it); a file
    that is not there is a FileNotFoundError. The caller closes the descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _linked(path) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_own(path, "is not a regular file")
    return fd


def _existing(path: Path) -> os.stat_result | None:
    """What ``path`` is, as the launcher would open it (:func:`_open_regular`), None when it is not there."""
    try:
        fd = _open_regular(path)
    except FileNotFoundError:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)

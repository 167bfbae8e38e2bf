"""Every process a run starts, found and stopped, whatever became of its parent.

Each run has an id, set as ``GRPO_LAUNCH_RUN_ID`` in the environment of every process it starts. The environment is
inherited by every descendant (torchrun's ranks in their own sessions, vLLM's EngineCore and workers, a rank's
dataloader workers) and stays readable in ``/proc/PID/environ`` whatever their process group, session or parent
becomes, so ``marked(run_id)`` finds them all.

A guard process (``python -m grpo_launch.node.reaper RUN_ID GRACE``, started by the supervisor in its own session) holds
a pipe from the launcher. When the pipe closes without the launcher's ``done`` line (the launcher was killed, even
with SIGKILL), it stops every marked process: SIGTERM, the grace period, SIGKILL. On an ssh host
:mod:`grpo_launch.node.shim` runs a guard that watches the ssh session's sshd, which ends when the launcher or its ssh
client goes (each host marks its processes ``RUN_ID@HOST``, so a host's guard stops only its own).

Standard library only, Linux ``/proc``: it must start fast and run on every host.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Iterable, Mapping

from grpo_launch.rundir.layout import RUN_ID_ENV

DONE = "done"


def environ_has(pid: int, needle: bytes) -> bool:
    """Whether process ``pid`` was started with ``needle`` (``KEY=VALUE``) in its environment (a zombie's is empty)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def argv_of(pid: int) -> list[str]:
    """The command line of process ``pid`` ([] when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def runs_module(pid: int, module: str) -> bool:
    """Whether ``pid`` is ``python … -m MODULE …`` (a trainer rank is ``-m grpo_launch.train``; the accelerate
    launcher above it only names the module after ``--module``)."""
    argv = argv_of(pid)
    return any(a == "-m" and b == module for a, b in itertools.pairwise(argv))


def marked(run_id: str, *, exclude: Iterable[int] = ()) -> list[int]:
    """PIDs of the live processes whose environment carries ``GRPO_LAUNCH_RUN_ID=run_id`` (never this one)."""
    needle = f"{RUN_ID_ENV}={run_id}".encode()
    skip = {os.getpid(), *exclude}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit() and int(n) not in skip and environ_has(int(n), needle)]


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def sweep(run_id: str, grace_s: float, *, exclude: Iterable[int] = (), first: int = signal.SIGTERM) -> list[int]:
    """Stop every marked process: ``first`` (SIGTERM), up to ``grace_s`` for them to exit, then SIGKILL. Returns the
    PIDs that needed SIGKILL."""
    skip = tuple(exclude)
    followed = follow(run_id, exclude=skip)
    if not followed:
        return []
    _signal(followed, first)
    left = wait_gone(run_id, grace_s, exclude=skip, followed=followed)
    _signal(left, signal.SIGKILL)
    return left


def started(pid: int) -> int | None:
    """Process ``pid``'s start (clock ticks since boot, proc(5) ``starttime``) while it has not exited: None once it is
    a zombie or gone. A zombie has released everything it held: the kernel closes a process's files (a GPU driver's
    too, where its memory is freed) before it reports the exit to its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def follow(run_id: str, *, exclude: Iterable[int] = ()) -> dict[int, int]:
    """The marked processes, each with its start: :func:`wait_gone` follows them until they have exited, also once
    their environment, emptied early in a process's exit, no longer shows the mark."""
    return {pid: start for pid in marked(run_id, exclude=exclude) if (start := started(pid)) is not None}


def wait_gone(
    run_id: str, within_s: float, *, exclude: Iterable[int] = (), followed: Mapping[int, int] | None = None
) -> list[int]:
    """Up to ``within_s`` for the marked processes, and those ``followed`` since earlier (:func:`follow`), to have
    exited: a SIGKILLed process holds its memory (a GPU's too) until the kernel has torn it down, which is not instant
    for a large one. A PID taken again by another process is told apart by its start. Returns those still there."""
    skip = tuple(exclude)
    seen = dict(followed or {})
    deadline = time.monotonic() + within_s
    while True:
        seen = follow(run_id, exclude=skip) | seen
        left = sorted(pid for pid, start in seen.items() if started(pid) == start)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def guard(run_id: str, grace_s: float) -> int:
    """Wait for the launcher's pipe (stdin) to close; unless it said ``done``, stop every marked process."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # only the pipe ends the guard
        signal.signal(sig, signal.SIG_IGN)
    last = b""
    stdin = sys.stdin.buffer
    while True:
        try:
            chunk = stdin.readline()
        except OSError:
            break
        if not chunk:
            break
        last = chunk.strip()
    if last == DONE.encode():
        return 0
    sweep(run_id, grace_s)
    return 0


def watch_pid(pid: int, run_id: str, grace_s: float, poll_s: float = 1.0) -> int:
    """Wait until process ``pid`` is gone (an ssh session's sshd), then stop every marked process."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(poll_s)
    sweep(run_id, grace_s)
    return 0


def main(argv: list[str]) -> int:
    """``RUN_ID GRACE``: the guard on a pipe; ``watch PID RUN_ID GRACE``: the guard on a process (an ssh session);
    ``signal RUN_ID SIGNUM``: signal every marked process on this host once and print how many."""
    if argv[:1] == ["signal"] and len(argv) == 3:
        pids = marked(argv[1])
        _signal(pids, int(argv[2]))
        print(len(pids))  # how many were still there (teardown reports stragglers)
        return 0
    if argv[:1] == ["watch"] and len(argv) == 4:
        return watch_pid(int(argv[1]), argv[2], float(argv[3]))
    if len(argv) == 2:
        return guard(argv[0], float(argv[1]))
    print(
        "usage: python -m grpo_launch.node.reaper RUN_ID GRACE | watch PID RUN_ID GRACE | signal RUN_ID SIGNUM",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Start, watch and tear down the run's processes. All-or-nothing: when one side ends or fails, all stop.

Each child starts in its own session (process group), and every process of the run carries the run's id in its
environment (:mod:`grpo_launch.node.reaper`), so teardown reaches processes that left the group too (torchrun starts
each rank in a new session). Shutdown: the signal to every group and every marked process, one monotonic grace
deadline, then SIGKILL to whatever is left. A guard process stops them all if grpo-launch itself is killed.
Output goes to each process's log file first; the console is best effort (a closed stdout never blocks a run).

:mod:`grpo_launch.execute.session` runs a server and trainers with it to the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from grpo_launch.errors import LaunchError
from grpo_launch.execute import faults
from grpo_launch.node import reaper
from grpo_launch.rundir.layout import PGID_ANNOUNCE, RUN_ID_ENV, SPAWNED_AT_ENV, announced_pgid
from grpo_launch.rundir.shown_text import printable, without_colours
from grpo_launch.rundir.trusted_files import open_nofollow
from grpo_launch.spec import Failure, ProcessSpec

POLL_S = 0.2
_HOSTNAME = socket.gethostname()
HEALTH_POLL_S = 10.0  # the vLLM server's /health while training runs
HEALTH_GRACE_S = 120.0  # … and how long it may fail to answer before the run is stopped
# After SIGKILL, how long the launcher waits for the kernel to tear its processes down before it exits: a next run
# started right after must not find their (GPU) memory still held. Milliseconds usually; a bound, not a measurement.
KILLED_EXIT_S = 10.0


class ChildFailed(LaunchError):
    """A supervised process failed (or never became healthy); ``child`` is the one to blame."""

    def __init__(self, message: str, child: Child, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.child = child


# Signals a process group on a remote host: (process spec, remote pgid, signal number).
RemoteSignaller = Callable[[ProcessSpec, int, int], None]


@dataclass
class Child:
    spec: ProcessSpec
    proc: subprocess.Popen
    log_path: Path
    pump: threading.Thread
    started: float = field(default_factory=time.monotonic)
    remote_pgid: int | None = None  # announced by grpo_launch.node.shim on the remote host

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the child leads its own group

    def tail(self, lines: int = 12) -> str:
        """The log's last lines."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        body = "\n".join(f"  | {line}" for line in text[-lines:])
        return f"last lines of {self.log_path.name}:\n{body}"


class Stalled(LaunchError):
    """No progress: the watchdog's bound passed without an optimizer step, or the vLLM server stopped answering."""


class ServerLost(ChildFailed):
    """The vLLM server (one of its processes) stopped, or stopped answering, while its caller can start it again."""


class StaleWeights(LaunchError):
    """vLLM generates with weights the trainers no longer hold (:mod:`grpo_launch.analysis.stale_weights`)."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unmarked(child: Child) -> Child:
    """``child`` with its spec's environment rid of the run's mark: signalled through it, a remote host's kill line
    reaches the child's process group alone (:func:`grpo_launch.backends.remote.kill_line`)."""
    env = {k: v for k, v in child.spec.env.items() if k != RUN_ID_ENV}
    return replace(child, spec=replace(child.spec, env=env))


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Supervisor:
    """Runs ProcessSpecs; ``emit`` receives each output line with its ``[name]`` prefix."""

    def __init__(
        self,
        log_dir: Path,
        *,
        emit: Callable[[str], None],
        grace_s: float = 30.0,
        environ: Mapping[str, str],
        cwd: str | None = None,
        signal_remote: RemoteSignaller | None = None,
        run_id: str | None = None,
    ) -> None:

        self.log_dir = log_dir
        self.emit = emit
        self.grace_s = grace_s
        self.environ = dict(environ)
        self.cwd = cwd
        self.signal_remote = signal_remote
        self.run_id = run_id or uuid.uuid4().hex
        self.children: list[Child] = []
        self.events: list[faults.Event] = []  # error-looking lines of every child, as they arrived
        # Reentrant: a signal handler on the main thread prints too, maybe while the main thread is printing.
        self._emit_lock = threading.RLock()
        self._guard: subprocess.Popen | None = None
        self._stopped = False
        self.quiet = False  # after an interrupt the console gets a summary, not every process's traceback

    # ------------------------------------------------------------------ start
    def _start_guard(self) -> None:
        """The process that stops every marked process if grpo-launch dies without finishing its teardown."""
        if self._guard is not None:
            return
        env = {k: v for k, v in self.environ.items() if k != RUN_ID_ENV}
        with contextlib.suppress(OSError):
            self._guard = subprocess.Popen(
                [sys.executable, "-m", "grpo_launch.node.reaper", self.run_id, str(self.grace_s)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                cwd=str(Path(reaper.__file__).parent.parent),
            )

    def start(self, spec: ProcessSpec) -> Child:
        self._start_guard()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log_path = self.log_dir / f"{spec.name.replace('@', '-')}-{stamp}.log"
        env = {
            **self.environ,
            **spec.launch_env,
            "PYTHONUNBUFFERED": "1",
            RUN_ID_ENV: self.run_id,
            SPAWNED_AT_ENV: repr(time.time()),
        }
        log_file = open_nofollow(log_path, "ab")  # before the start: never through a link planted in the run dir
        try:
            proc = subprocess.Popen(
                list(spec.argv),
                env=env,
                cwd=self.cwd,
                stdin=subprocess.PIPE if spec.stdin_env else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except FileNotFoundError:
            log_file.close()
            raise LaunchError(
                f"cannot start {spec.name}: command {spec.argv[0]!r} not found",
                hint="Install it, or point grpo-launch at it (launch.vllm_command for the server).",
            ) from None
        if spec.stdin_env and proc.stdin is not None:
            payload = "".join(f"{k}={json.dumps(self.environ[k])}\n" for k in spec.stdin_env if k in self.environ)
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write((payload + "\n").encode())
                proc.stdin.close()
        child = Child(spec, proc, log_path, threading.Thread(daemon=True))
        child.pump = threading.Thread(target=self._pump, args=(child, proc.stdout, log_file), daemon=True)
        child.pump.start()
        self.children.append(child)
        where = f" on {spec.host}" if spec.host else ""
        self.say(f"[grpo-launch] started {spec.name}{where} (pid {proc.pid}); log: {log_path}")
        return child

    def _pump(self, child: Child, stream: IO[bytes] | None, log_file: IO[bytes]) -> None:
        """The child's output into its log file, then to the console. Nothing here may stop the loop: a child
        whose pipe is not drained blocks (a closed console, a full disk for the log, a bad byte)."""
        assert stream is not None
        name = child.spec.name
        log_ok = True
        first = child.spec.remote_group  # a shim announces its pgid as its first line only (> 1: announced_pgid)
        shown = faults.ConsoleFilter()  # tracebacks and torchrun's report stay in the log: the summary says the cause
        for raw in iter(stream.readline, b""):
            if log_ok:
                try:
                    log_file.write(time.strftime("%Y-%m-%d %H:%M:%S ").encode() + raw)
                    log_file.flush()
                except OSError as exc:
                    log_ok = False
                    self.say(f"[grpo-launch] cannot write {child.log_path} ({exc.strerror}): log lost from here")
            line = without_colours(raw.decode(errors="replace").rstrip("\n"))  # wandb's colours: its words only
            if first and line.startswith(PGID_ANNOUNCE):
                first, child.remote_pgid = False, announced_pgid(line)
                if child.remote_pgid is None:
                    self.say(
                        f"[grpo-launch] warning: {name} announced no process group of its own: it is stopped "
                        "through its connection and its host's guard only"
                    )
                continue
            first = False
            if faults.looks_like_error(line) and len(self.events) < 2000:
                self.events.append(faults.Event(time.time(), name, line, child.spec.role))
            if not self.quiet and (text := shown.show(line)) is not None:
                self.say(console_line(child.spec, text))
        with contextlib.suppress(OSError):
            log_file.close()

    def say(self, line: str) -> None:
        # Printable: no escape sequence from a log steers the terminal. The console may be gone: the logs go on.
        with self._emit_lock, contextlib.suppress(Exception):
            self.emit(printable(line))

    def diagnose(self) -> Failure:
        """The run's root cause across every child, from the lines seen so far."""
        return self.explain().failure

    def explain(self) -> faults.Diagnosis:
        """:meth:`diagnose`, with what the root cause's line said besides (a rank's frame and traceback file)."""
        exits = [(c.spec.name, c.proc.returncode, c.spec.role) for c in self.children]
        return faults.explain(self.events, exits=exits)

    # ------------------------------------------------------------------ watch
    def wait_healthy(self, child: Child, url: str, timeout_s: float, also_watch: Sequence[Child] = ()) -> float:
        """Poll ``url`` until it answers 200; fail if ``child`` (or any in ``also_watch``) exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        t0 = time.monotonic()
        while True:
            for c in (child, *also_watch):
                if c.proc.poll() is not None:
                    raise ChildFailed(
                        f"{c.spec.name} exited ({describe_exit(c.proc.returncode)}) before the vLLM server was "
                        f"healthy; log: {c.log_path}",
                        c,
                    )
            if healthy(url):
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                where = f" on {child.spec.host}" if child.spec.host else ""
                raise ChildFailed(
                    f"the vLLM server{where} was not healthy at {url} within {timeout_s:.0f} s; log: {child.log_path}",
                    child,
                    hint="Raise launch.vllm_health_timeout_s if the model is large. If the log shows the server "
                    "up, this node cannot reach it: check the address, firewall and launch.vllm_host (the bind "
                    "address).",
                )
            time.sleep(POLL_S)

    def wait_all(
        self,
        main: Sequence[Child],
        *,
        watch: Callable[[], str | None] | None = None,
        health_url: str | None = None,
        health_poll_s: float = HEALTH_POLL_S,
        health_grace_s: float = HEALTH_GRACE_S,
        server: Sequence[Child] = (),
    ) -> int:
        """Until the ``main`` children (trainers) all exit 0 → 0; any child failing first → ChildFailed; ``watch``
        (called about once a second) returning a reason, or the server not answering ``health_url`` for
        ``health_grace_s`` → Stalled. With ``server`` (its processes, which the caller can start again), a server
        process exiting or the server not answering → ServerLost instead."""
        last_watch = last_health = time.monotonic()
        healthy_at = time.monotonic()
        while True:
            for c in self.children:
                code = c.proc.poll()
                if code is None:
                    continue
                if c in main and code == 0:
                    continue
                if c in server:
                    raise ServerLost(f"{c.spec.name} stopped ({describe_exit(code)}); log: {c.log_path}", c)
                if c not in main:
                    raise ChildFailed(
                        f"{c.spec.name} stopped unexpectedly ({describe_exit(code)}) while training ran; "
                        f"log: {c.log_path}",
                        c,
                    )
                raise ChildFailed(f"{c.spec.name} failed ({describe_exit(code)}); log: {c.log_path}", c)
            if all(c.proc.poll() == 0 for c in main):
                return 0
            now = time.monotonic()
            if watch is not None and now - last_watch >= 1.0:
                last_watch = now
                reason = watch()
                if reason:
                    raise Stalled(reason)
            if health_url and now - last_health >= health_poll_s:
                last_health = now
                if healthy(health_url):
                    healthy_at = now
                elif now - healthy_at > health_grace_s:
                    why = f"the vLLM server stopped answering {health_url} for {now - healthy_at:.0f} s"
                    if server:
                        raise ServerLost(why, server[0])
                    raise Stalled(why)
            time.sleep(POLL_S)

    # ------------------------------------------------------------------ stop
    def stop_children(self, children: Sequence[Child], grace_s: float | None = None) -> None:
        """Stop ``children`` alone (a lost server's processes, before it starts again): SIGTERM to their groups
        (on their hosts for remote ones), the grace period (``grace_s``, else the run's), SIGKILL; reaped, their
        logs drained, and no longer watched.

        A remote child's group alone: the backends' kill line signals every process of the run on the host too
        when the spec carries the host's mark, and a server's host may hold trainer ranks (torchrun starts each in
        a session of its own, so the mark is what finds them at teardown). A remote group has ended when its ssh
        client or Ray runner has: the remote processes hold that connection's output open until they exit."""
        remote = [_unmarked(c) for c in children if c.spec.remote_group and c.remote_pgid]
        local = [c for c in children if not c.spec.remote_group]
        self._signal_remote(remote, signal.SIGTERM)
        for c in local:
            _signal_group(c.pgid, signal.SIGTERM)

        def alive(c: Child) -> bool:
            return c.proc.poll() is None if c.spec.remote_group else _group_alive(c.pgid)

        deadline = time.monotonic() + (self.grace_s if grace_s is None else grace_s)
        while time.monotonic() < deadline and any(alive(c) for c in children):
            time.sleep(0.05)
        self._signal_remote([c for c in remote if alive(c)], signal.SIGKILL)
        for c in children:
            if _group_alive(c.pgid):
                _signal_group(c.pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=10)
            c.pump.join(timeout=2)
            if c in self.children:
                self.children.remove(c)

    def stop_all(self, sig: int = signal.SIGTERM) -> None:
        """``sig`` to every group and marked process, wait out the grace period, SIGKILL what is left; reap and
        drain logs. Runs once; a second call only makes sure nothing is left.

        A remote child's group is signalled on its host (its ssh client exits once the remote tree is gone); the
        local ssh client is killed only after that, because killing it does not stop the remote processes.
        """
        guard = [self._guard.pid] if self._guard else []
        if self._stopped:
            reaper.sweep(self.run_id, 0.0, exclude=guard)
            return
        self._stopped = True
        followed = reaper.follow(self.run_id, exclude=guard)  # waited for at the end, until each has exited
        remote = [c for c in self.children if c.spec.remote_group]
        self._signal_remote([c for c in remote if c.remote_pgid], sig)
        for c in self.children:
            if c not in remote:
                _signal_group(c.pgid, sig)
        local = [p for p in reaper.marked(self.run_id, exclude=guard) if p not in {c.proc.pid for c in remote}]
        for pid in local:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

        def alive(c: Child) -> bool:
            return c.proc.poll() is None if c in remote else _group_alive(c.pgid)

        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and (
            any(alive(c) for c in self.children) or reaper.marked(self.run_id, exclude=guard)
        ):
            for c in self.children:
                c.proc.poll()
            time.sleep(0.05)
        left = [c for c in self.children if alive(c)]
        for c in left:
            self.say(f"[grpo-launch] {c.spec.name} still running after {self.grace_s:.0f} s grace: SIGKILL")
        self._signal_remote([c for c in left if c in remote and c.remote_pgid], signal.SIGKILL)
        for c in self.children:
            if _group_alive(c.pgid):
                _signal_group(c.pgid, signal.SIGKILL)
        stragglers = reaper.sweep(self.run_id, 0.0, exclude=guard, first=signal.SIGKILL)
        if stragglers and not left:
            self.say(f"[grpo-launch] {len(stragglers)} process(es) outside the groups still running: SIGKILL")
        for c in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=10)
            c.pump.join(timeout=2)
        if still := reaper.wait_gone(self.run_id, KILLED_EXIT_S, exclude=guard, followed=followed):
            self.say(f"[grpo-launch] {len(still)} process(es) not exited {KILLED_EXIT_S:.0f} s after SIGKILL: {still}")
            reaper.sweep(self.run_id, 0.0, exclude=guard, first=signal.SIGKILL)  # one started since the sweep above
        self._release_guard()

    def _release_guard(self) -> None:
        if self._guard is None or self._guard.stdin is None:
            return
        with contextlib.suppress(OSError):
            self._guard.stdin.write(f"{reaper.DONE}\n".encode())
            self._guard.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._guard.wait(timeout=5)

    def _signal_remote(self, children: Sequence[Child], sig: int) -> None:
        """Signal each child's remote process group on its host, all hosts at once (bounded by a timeout)."""
        if not children or self.signal_remote is None:
            return
        signaller = self.signal_remote

        def send(c: Child) -> None:
            assert c.remote_pgid is not None
            try:
                signaller(c.spec, c.remote_pgid, sig)
            except (OSError, LaunchError, subprocess.TimeoutExpired) as exc:
                self.say(f"[grpo-launch] could not signal {c.spec.name} on {c.spec.host}: {exc}")

        threads = [threading.Thread(target=send, args=(c,), daemon=True) for c in children]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=35)


_RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?")


def console_line(spec: ProcessSpec, line: str) -> str:
    """A child's output line as the console shows it: ``[train] …``, or for a rank's own line (torchrun's
    ``[rankN]:``) ``[train rN@HOST] …``; a progress bar's redraws (carriage returns) show their last state."""
    text = line.rsplit("\r", 1)[-1].removeprefix("[grpo-launch] ")  # the trainer's own lines: one prefix is enough
    m = _RANK_LINE.match(text)
    if not m:
        return f"[{spec.name}] {text}"
    role = spec.name.split("@")[0]
    host = spec.host or _HOSTNAME
    return f"[{role} r{m.group(1)}@{host}] {text[m.end() :]}"


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False

"""Start, watch and tear down the run's processes. All-or-nothing: when one side ends or fails, all stop.

Each child starts in its own session (process group), so signalling the group reaches grandchildren too (vLLM's
EngineCore and workers, torchrun's ranks). Shutdown: the signal to every group, one monotonic grace deadline,
then SIGKILL to every group that is left — also groups whose leader already exited.

:func:`supervise` runs a server and trainers to the end and returns a :class:`RunResult`; it never raises for a
failed child or a signal, and it prints nothing itself (``emit`` does).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from grpo_launch.errors import LaunchError
from grpo_launch.spec import ProcessSpec, RunResult, RunState
from grpo_launch.task import PGID_ANNOUNCE

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2)
POLL_S = 0.2


class ChildFailed(LaunchError):
    """A supervised process failed (or never became healthy); ``child`` is the one to blame."""

    def __init__(self, message: str, child: Child, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.child = child


# Signals a process group on a remote host: (process spec, remote pgid, signal number).
RemoteSignaller = Callable[[ProcessSpec, int, int], None]


class Interrupted(Exception):
    """A forwarded signal reached grpo-launch; raised on the main thread."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@dataclass
class Child:
    spec: ProcessSpec
    proc: subprocess.Popen
    log_path: Path
    pump: threading.Thread
    started: float = field(default_factory=time.monotonic)
    remote_pgid: int | None = None  # announced by grpo_launch.task on the remote host

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the child leads its own group

    def tail(self, lines: int = 12) -> str:
        """The log's root cause (the last exception line) and its last lines."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        cause = root_cause(text)
        body = "\n".join(f"  | {line}" for line in text[-lines:])
        return (f"root cause: {cause}\n" if cause else "") + f"last lines of {self.log_path.name}:\n{body}"


_EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b.*)$")


def root_cause(lines: Sequence[str]) -> str | None:
    """The last exception line that is not torchrun's wrapper (ChildFailedError), if any."""
    for line in reversed(lines):
        m = _EXCEPTION_LINE.match(line.strip())
        if m and "ChildFailedError" not in line and "error_file" not in line:
            return m.group(1)
    return None


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
    ) -> None:
        self.log_dir = log_dir
        self.emit = emit
        self.grace_s = grace_s
        self.environ = dict(environ)
        self.cwd = cwd
        self.signal_remote = signal_remote
        self.children: list[Child] = []
        self._emit_lock = threading.Lock()

    # ------------------------------------------------------------------ start
    def start(self, spec: ProcessSpec) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log_path = self.log_dir / f"{spec.name.replace('@', '-')}-{stamp}.log"
        env = {**self.environ, **spec.launch_env, "PYTHONUNBUFFERED": "1"}
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
            raise LaunchError(
                f"cannot start {spec.name}: command {spec.argv[0]!r} not found",
                hint="Install it, or point grpo-launch at it (launch.vllm_command for the server).",
            ) from None
        if spec.stdin_env and proc.stdin is not None:
            payload = "".join(f"{k}={json.dumps(self.environ[k])}\n" for k in spec.stdin_env if k in self.environ)
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write((payload + "\n").encode())
                proc.stdin.close()
        log_file = log_path.open("ab")
        child = Child(spec, proc, log_path, threading.Thread(daemon=True))
        child.pump = threading.Thread(target=self._pump, args=(child, proc.stdout, log_file), daemon=True)
        child.pump.start()
        self.children.append(child)
        return child

    def _pump(self, child: Child, stream: IO[bytes] | None, log_file: IO[bytes]) -> None:
        assert stream is not None
        name = child.spec.name
        with log_file:
            for raw in iter(stream.readline, b""):
                log_file.write(raw)
                log_file.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                if child.remote_pgid is None and line.startswith(PGID_ANNOUNCE):
                    with contextlib.suppress(ValueError):
                        child.remote_pgid = int(line[len(PGID_ANNOUNCE) :])
                        continue
                # tqdm redraws with carriage returns: show the last state only.
                line = line.rsplit("\r", 1)[-1]
                with self._emit_lock:
                    self.emit(f"[{name}] {line}")

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
                        hint=c.tail(),
                    )
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                where = f" on {child.spec.host}" if child.spec.host else ""
                raise ChildFailed(
                    f"the vLLM server{where} was not healthy at {url} within {timeout_s:.0f} s; log: {child.log_path}",
                    child,
                    hint="Raise launch.vllm_health_timeout_s if the model is large. If the log shows the server "
                    "up, this node cannot reach it: check the address, firewall and launch.vllm_host (the bind "
                    "address). The server log:\n" + child.tail(),
                )
            time.sleep(POLL_S)

    def wait_all(self, main: Sequence[Child]) -> int:
        """Until the ``main`` children (trainers) all exit 0 → 0; any child failing first → ChildFailed."""
        while True:
            for c in self.children:
                code = c.proc.poll()
                if code is None:
                    continue
                if c in main and code == 0:
                    continue
                if c not in main:
                    raise ChildFailed(
                        f"{c.spec.name} stopped unexpectedly ({describe_exit(code)}) while training ran; "
                        f"log: {c.log_path}",
                        c,
                        hint=c.tail(),
                    )
                raise ChildFailed(f"{c.spec.name} failed ({describe_exit(code)}); log: {c.log_path}", c, hint=c.tail())
            if all(c.proc.poll() == 0 for c in main):
                return 0
            time.sleep(POLL_S)

    # ------------------------------------------------------------------ stop
    def stop_all(self, sig: int = signal.SIGTERM) -> None:
        """``sig`` to every group, wait out the grace period, SIGKILL what is left; reap and drain logs.

        A remote child's group is signalled on its host (its ssh client exits once the remote tree is gone); the
        local ssh client is killed only after that, because killing it does not stop the remote processes.
        """
        remote = [c for c in self.children if c.spec.remote_group]
        self._signal_remote([c for c in remote if c.remote_pgid], sig)
        for c in self.children:
            if c not in remote:
                _signal_group(c.pgid, sig)

        def alive(c: Child) -> bool:
            return c.proc.poll() is None if c in remote else _group_alive(c.pgid)

        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(alive(c) for c in self.children):
            for c in self.children:
                c.proc.poll()
            time.sleep(0.05)
        left = [c for c in self.children if alive(c)]
        for c in left:
            self.emit(f"[grpo-launch] {c.spec.name} still running after {self.grace_s:.0f} s grace: SIGKILL")
        self._signal_remote([c for c in left if c in remote and c.remote_pgid], signal.SIGKILL)
        for c in self.children:
            if _group_alive(c.pgid):
                _signal_group(c.pgid, signal.SIGKILL)
        for c in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=10)
            c.pump.join(timeout=5)

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
                self.emit(f"[grpo-launch] could not signal {c.spec.name} on {c.spec.host}: {exc}")

        threads = [threading.Thread(target=send, args=(c,), daemon=True) for c in children]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=35)


class signal_guard:
    """Turn the forwarded signals into :class:`Interrupted` on the main thread for the duration of a ``with``.

    ``soft`` maps signals to callbacks that run instead (SIGUSR2: ask the trainers to checkpoint and stop).
    """

    def __init__(self, soft: Mapping[int, Callable[[int], None]] | None = None) -> None:
        self.soft = dict(soft or {})

    def __enter__(self) -> signal_guard:
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            for sig in FORWARDED_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        if signum in self.soft:
            self.soft[signum](signum)
            return
        raise Interrupted(signum)

    def ignore(self) -> None:
        """Ignore the forwarded signals until the scope ends: teardown must finish, and a second Ctrl-C must not
        leave children running."""
        if self._old:
            for sig in FORWARDED_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def supervise(
    server: ProcessSpec | None,
    trainers: Sequence[ProcessSpec],
    *,
    health_url: str | None,
    health_timeout_s: float,
    log_dir: Path,
    grace_s: float,
    environ: Mapping[str, str],
    emit: Callable[[str], None],
    on_checkpoint_request: Callable[[], None] | None = None,
    signal_remote: RemoteSignaller | None = None,
) -> RunResult:
    """Start the server (if any) and the trainers, supervise until the trainers finish, tear everything down.

    SUCCEEDED when every trainer exits 0; FAILED naming the first failure; INTERRUPTED (128+N) after signal N.
    SIGUSR2 calls ``on_checkpoint_request`` (without one it is like SIGTERM).
    """
    sup = Supervisor(log_dir, emit=emit, grace_s=grace_s, environ=environ, signal_remote=signal_remote)

    def checkpoint(signum: int) -> None:
        if on_checkpoint_request is None:
            raise Interrupted(signum)
        on_checkpoint_request()
        emit("[grpo-launch] SIGUSR2: the trainers save a checkpoint at the end of this step and stop")

    with signal_guard(soft={signal.SIGUSR2: checkpoint}) as guard:
        try:
            srv = sup.start(server) if server else None
            # The trainers load their model while the server starts; TRL's client waits for /health before the
            # first generation, and we watch the same deadline here to fail early with the server's log.
            train_children = [sup.start(t) for t in trainers]
            if srv is not None and health_url:
                took = sup.wait_healthy(srv, health_url, health_timeout_s, train_children)
                emit(f"[grpo-launch] vLLM server healthy after {took:.1f} s")
            sup.wait_all(train_children)
            emit(f"[grpo-launch] training finished; logs in {log_dir}")
            result = RunResult(RunState.SUCCEEDED, 0)
        except Interrupted as sig:
            emit(f"[grpo-launch] {sig}: stopping every process (grace {sup.grace_s:.0f} s)")
            guard.ignore()
            sup.stop_all(sig.signum)
            result = RunResult(RunState.INTERRUPTED, 128 + sig.signum, message=f"interrupted by {sig}")
        except ChildFailed as exc:
            result = RunResult.failure(exc, exc.child.spec.name, str(exc.child.log_path))
        except LaunchError as exc:
            result = RunResult.failure(exc, None, None)
        finally:
            guard.ignore()
            sup.stop_all()
    return result

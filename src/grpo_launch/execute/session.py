"""One supervised session of a run: the signals grpo-launch forwards, the start order (server, then trainers,
then the server's health), the watch until the trainers finish, and the RunResult with the root cause. It never
raises for a failed child or a signal, and it prints nothing itself (``emit`` does)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from grpo_launch.enums import FailureKind, Role, RunState
from grpo_launch.errors import LaunchError
from grpo_launch.execute import faults
from grpo_launch.execute.server_keeper import ServerKeeper, ServerNotKept
from grpo_launch.execute.stop_channel import StopChannel
from grpo_launch.execute.supervisor import (
    HEALTH_GRACE_S,
    HEALTH_POLL_S,
    ChildFailed,
    RemoteSignaller,
    ServerLost,
    StaleWeights,
    Stalled,
    Supervisor,
    describe_exit,
)
from grpo_launch.node import reaper
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.records import StartupRecord, append
from grpo_launch.spec import Failure, ProcessSpec, RunResult, frozen

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2)


class Interrupted(BaseException):
    """A forwarded signal reached grpo-launch; raised on the main thread. A BaseException, as KeyboardInterrupt
    is: the handler may run inside code that suppresses every Exception (the console's ``say``), and a second
    Ctrl-C swallowed there would leave the run waiting out its stop grace."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


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
                if signal.getsignal(sig) == signal.SIG_IGN and sig == signal.SIGHUP:
                    continue  # started under nohup: a hangup must not stop the run
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
        for sig in self._old:
            signal.signal(sig, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


@frozen
class SessionSpec:
    """One supervised session of a run: its processes (the vLLM server, if any, and the trainers) and how they are
    watched and stopped."""

    server: ProcessSpec | None
    trainers: Sequence[ProcessSpec]
    log_dir: Path
    health_url: str | None = None  # the server's /health
    health_timeout_s: float = 900.0  # for the server to become healthy
    grace_s: float = 30.0  # between SIGTERM and SIGKILL at teardown
    run_id: str | None = None  # marks every process of the run
    paths: RunPaths | None = None  # the run directory: where the trainer ranks dump their stacks (hang watchdog)
    health_poll_s: float = HEALTH_POLL_S  # /health while training runs …
    health_grace_s: float = HEALTH_GRACE_S  # … and how long it may fail before the run stops
    server_workers: Sequence[ProcessSpec] = ()  # the server's headless processes on its other hosts
    server_replacement: Sequence[ProcessSpec] = ()  # the server's processes to start again when it is lost
    server_restarts: int = 0  # at most this many replacements (launch.server_restarts); 0: a lost server fails


@frozen
class Stopping:
    """How a stop on a signal goes: the first Ctrl-C, SIGTERM or SIGHUP asks the trainers to save a
    checkpoint at the end of the step in flight (through the run's stop channel, as SIGUSR2 does) and waits
    ``grace_s`` for them to stop; a second signal, or the grace running out, stops everything at once.

    ``grace_why`` says where the grace comes from; ``step_in_flight`` is the step the trainers are on (None:
    unknown); ``at_once`` says why a signal cannot wait (the platform is already killing the processes: Slurm's
    SIGTERM), or None; ``stuck`` says why the step in flight cannot reach its end
    (the progress watchdog's evidence: it has run far past every step measured), or None: then no checkpoint is
    waited for, before the request or during the wait.

    What a second signal costs is said before it is sent: ``newest`` is the step of the newest complete checkpoint
    (0: none; None: unknown), and ``saving`` the checkpoint the trainers are writing now, with the seconds its save
    should still take from the saves measured or planned (None: unknown), or None when none is being written."""

    grace_s: float
    grace_why: str = ""
    step_in_flight: Callable[[], int | None] = lambda: None
    at_once: Callable[[int], str | None] = lambda _signum: None
    stuck: Callable[[], str | None] = lambda: None
    newest: Callable[[], int | None] = lambda: None
    saving: Callable[[], tuple[int, float | None] | None] = lambda: None


def again(signum: int) -> str:
    """How the user sends ``signum`` a second time: Ctrl-C for SIGINT, else the signal's name (a platform's SIGTERM,
    a hangup)."""
    return "Ctrl-C again" if signum == signal.SIGINT else f"{signal.Signals(signum).name} again"


def steps_lost(newest: int, upto: int) -> str:
    """The steps a stop loses when the newest complete checkpoint is at step ``newest`` (0: none) and training has
    reached step ``upto``: ``steps 1–16 (no complete checkpoint yet)``."""
    span = f"step {upto}" if newest + 1 >= upto else f"steps {newest + 1}–{upto}"
    return f"{span} ({f'back to checkpoint-{newest}' if newest else 'no complete checkpoint yet'})"


class GraceOver(Interrupted):
    """The trainers did not stop with a checkpoint within the stop grace."""


class _SignalStop:
    """The state of a stop on a signal, for :func:`supervise`: the signal handler (``soft``) and the check made
    about once a second while the trainers run (``check``)."""

    def __init__(self, stopping: Stopping | None, channel: StopChannel | None, say: Callable[[str], None]) -> None:
        # A stop on a signal asks through the channel: without one (no run directory) a signal stops at once
        self.stopping = stopping if channel is not None else None
        self.channel, self.say = channel, say
        self.signum: int | None = None  # the signal being honoured
        self.by_launcher = False  # the signal reached grpo-launch (not only the trainers)
        self.deadline = 0.0
        self.training = False  # the trainers run (a server, if any, answers): a step can end and be saved
        self.writing: int | None = None  # the checkpoint being written whose cost was said

    def soft(self, signum: int) -> None:
        """SIGINT, SIGTERM or SIGHUP reached grpo-launch: ask for a checkpoint, or stop at once."""
        st = self.stopping
        if st is None or self.by_launcher:
            raise Interrupted(signum)  # no run directory to save into, or the second signal: stop now
        name = signal.Signals(signum).name
        if (why := st.at_once(signum)) is not None:
            self.say(f"[grpo-launch] {name}: {why}")
            raise Interrupted(signum)
        if not self.training:
            self.say(f"[grpo-launch] {name}: no step has started yet: nothing new to save")
            raise Interrupted(signum)
        if (stuck := st.stuck()) is not None:
            self.say(f"[grpo-launch] {name}: {stuck}; stopping now")
            raise Interrupted(signum)
        assert self.channel is not None
        try:
            self.channel.request()
        except OSError as exc:  # the run directory cannot take the request (a full disk): nothing can be saved
            self.say(f"[grpo-launch] {name}: cannot ask for a checkpoint ({exc.strerror}): stopping now")
            raise Interrupted(signum) from None
        self._begin(signum)
        self.by_launcher = True
        step = st.step_in_flight()
        at = f"step {step}" if step is not None else "the step in flight"
        newest = st.newest()
        cost = f"; stopping now loses {steps_lost(newest, step)}" if newest is not None and step is not None else ""
        self.say(
            f"[grpo-launch] {name}: checkpoint at the end of {at} requested; {again(signum)} to stop now "
            f"(waiting up to {st.grace_s:.0f} s: {st.grace_why}){cost}"
        )

    def _writing(self, st: Stopping, signum: int) -> None:
        """Once the checkpoint asked for is being written: what a second signal would cost now."""
        writing = st.saving()
        if writing is None or writing[0] == self.writing:
            return
        self.writing, (step, left) = writing[0], writing
        if left is None:
            eta = " (no save measured yet)"
        elif left >= 0.5:
            eta = f", about {left:.0f} s left"
        else:
            eta = ", taking longer than the saves measured"
        newest = st.newest()
        loses = f" and loses {steps_lost(newest, step)}" if newest is not None else ""
        self.say(f"[grpo-launch] writing checkpoint-{step}{eta}; {again(signum)} abandons it{loses}")

    def _begin(self, signum: int) -> None:
        assert self.stopping is not None
        if self.signum is None:
            self.signum, self.deadline = signum, time.monotonic() + self.stopping.grace_s

    def _step(self) -> str:
        assert self.stopping is not None
        step = self.stopping.step_in_flight()
        return f"step {step}" if step is not None else "the step in flight"

    def check(self) -> None:
        """A request the trainers made on a signal of their own (announced once); the grace running out."""
        st = self.stopping
        if st is None:
            return
        assert self.channel is not None
        if (
            self.signum is None
            and (reason := self.channel.reason()) is not None
            and reason in signal.Signals.__members__
        ):
            self._begin(signal.Signals[reason])
            self.say(
                f"[grpo-launch] the trainers received {reason} (a preemption's warning): they save a checkpoint at "
                f"the end of {self._step()} and stop (waiting up to {st.grace_s:.0f} s: {st.grace_why})"
            )
        if self.signum is not None and time.monotonic() > self.deadline:
            self.say(f"[grpo-launch] grace of {st.grace_s:.0f} s ran out: stopped without a checkpoint")
            raise GraceOver(self.signum)
        if self.by_launcher and self.signum is not None:
            self._writing(st, self.signum)
        if self.signum is not None and (stuck := st.stuck()) is not None:
            self.say(f"[grpo-launch] {stuck}; stopping now")
            raise GraceOver(self.signum)


def supervise(
    session: SessionSpec,
    *,
    environ: Mapping[str, str],
    emit: Callable[[str], None],
    channel: StopChannel | None = None,
    signal_remote: RemoteSignaller | None = None,
    watch: Callable[[], str | None] | None = None,
    stopping: Stopping | None = None,
) -> RunResult:
    """Start the server (if any) and the trainers, supervise until the trainers finish, tear everything down.

    SUCCEEDED when every trainer exits 0; FAILED with the root cause across every process (and its kind);
    INTERRUPTED (128+N) after signal N. ``channel`` is the run's stop channel: SIGUSR2 asks the trainers for a
    checkpoint and stop through it (without one it is like SIGTERM), and so does, with ``stopping``, the first
    SIGINT, SIGTERM or SIGHUP, which then waits for them (see :class:`Stopping`); the trainers then stopped on
    request (INTERRUPTED, 128+N: the caller reads their step). A lost server given up asks through it too.
    ``watch`` is the progress watchdog: when it returns a reason, every rank's stack is dumped and the run stops.
    """
    s = session
    server, trainers, health_url, log_dir = s.server, s.trainers, s.health_url, s.log_dir
    sup = Supervisor(
        log_dir, emit=emit, grace_s=s.grace_s, environ=environ, signal_remote=signal_remote, run_id=s.run_id
    )
    stop = _SignalStop(stopping, channel, sup.say)

    def checkpoint(signum: int) -> None:
        if channel is None:
            raise Interrupted(signum)
        channel.request("SIGUSR2: the trainers save a checkpoint at the end of this step and stop")

    def watching() -> str | None:
        stop.check()
        return watch() if watch is not None else None

    failed: LaunchError | None = None
    stacks: dict[str, str] = {}
    soft: dict[int, Callable[[int], None]] = {signal.SIGUSR2: checkpoint}
    soft.update({sig: stop.soft for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)})
    with signal_guard(soft=soft) as guard:
        try:
            srv = sup.start(server) if server else None
            workers = [sup.start(w) for w in s.server_workers] if server else []
            # The trainers load their model while the server starts; TRL's client waits for /health before the
            # first generation, and we watch the same deadline here to fail early with the server's log.
            train_children = [sup.start(t) for t in trainers]
            if srv is not None and health_url:
                took = sup.wait_healthy(srv, health_url, s.health_timeout_s, [*workers, *train_children])
                sup.say(f"[grpo-launch] vLLM server healthy after {took:.1f} s")
                if s.paths is not None:
                    append(s.paths.metrics, StartupRecord("vllm_ready", took, time.time()))
            stop.training = True
            keeper = _keeper(sup, s, channel, stopping.grace_s if stopping is not None else s.grace_s)
            running = [srv, *workers] if srv is not None else []
            while True:
                try:
                    sup.wait_all(
                        train_children,
                        watch=watching if keeper is None else keeper.watching(running, watching),
                        health_url=health_url if srv is not None else None,
                        health_poll_s=s.health_poll_s,
                        health_grace_s=s.health_grace_s,
                        server=running if keeper is not None else (),
                    )
                    break
                except ServerLost as lost:
                    assert keeper is not None
                    running = keeper.replace(lost, running, train_children)
            result = _finished(sup, s, stop, channel)
        except Interrupted as sig:
            guard.ignore()
            result = _stop_now(sup, sig)
        except Stalled as exc:
            sup.say(f"[grpo-launch] {exc.message}: dumping every rank's stack, then stopping")
            stacks = dump_stacks(sup, s.paths)
            failed = exc
        except LaunchError as exc:
            failed = exc
        finally:
            guard.ignore()
            sup.stop_all()
    if failed is not None:
        result = _failure_result(sup, failed, stacks)
    return result


def _keeper(sup: Supervisor, s: SessionSpec, channel: StopChannel | None, stop_grace_s: float) -> ServerKeeper | None:
    """Who replaces a lost server (None: a run without one, or whose trainers cannot wait for one). With
    launch.server_restarts 0 it replaces none: a loss ends the attempt, with the trainers' checkpoint at the end of
    the step in flight when they are there (``stop_grace_s`` for it)."""
    if s.server is None or not s.server_replacement or not s.health_url or s.paths is None or channel is None:
        return None
    first, *others = s.server_replacement
    timeout_s, restarts = s.health_timeout_s, s.server_restarts
    return ServerKeeper(
        sup, s.paths, channel, first, others, s.health_url, timeout_s, restarts, stop_grace_s=stop_grace_s
    )


def _stop_now(sup: Supervisor, sig: Interrupted) -> RunResult:
    """Teardown after signal ``sig`` (a second one, or one that cannot wait, or the stop grace spent): every process
    stopped, one line each on the console (their tracebacks stay in the logs)."""
    if not isinstance(sig, GraceOver):
        sup.say(f"[grpo-launch] {sig}: stopping every process (grace {sup.grace_s:.0f} s); tracebacks go to the logs")
    sup.quiet = True
    sup.stop_all(sig.signum)
    for c in sup.children:
        sup.say(f"[grpo-launch] {c.spec.name}: {describe_exit(c.proc.returncode)}; log: {c.log_path}")
    return RunResult(RunState.INTERRUPTED, 128 + sig.signum, message=f"interrupted by {sig}")


def _finished(sup: Supervisor, s: SessionSpec, stop: _SignalStop, channel: StopChannel | None) -> RunResult:
    """Every trainer exited 0: finished, stopped on request, or stopped on request after a signal to grpo-launch
    (INTERRUPTED with 128+N: the exit code still says which signal stopped the run)."""
    stop.check()  # a request of the trainers' own that they honoured before the launcher's look: say so still
    stopped = channel is not None and channel.stopped_at() is not None
    if not stopped:
        sup.say(f"[grpo-launch] training finished; logs in {s.log_dir}")
    if stopped and stop.by_launcher and stop.signum is not None:
        name = signal.Signals(stop.signum).name
        return RunResult(RunState.INTERRUPTED, 128 + stop.signum, message=f"interrupted by {name}")
    return RunResult(RunState.SUCCEEDED, 0)


def _failure_result(sup: Supervisor, exc: LaunchError, stacks: Mapping[str, str]) -> RunResult:
    """The failed run's result, once every process has stopped and every log is drained: the root cause across
    processes (or, after a hang, where each rank was), its kind, and where to read more: the frame that raised it and
    its traceback's file when a rank stated it, else the failing process's last lines (the console had none of
    the tracebacks: :class:`~grpo_launch.execute.faults.ConsoleFilter`)."""
    child = exc.child if isinstance(exc, ChildFailed) else None
    explained = sup.explain()
    diagnosis = explained.failure
    if isinstance(exc, Stalled):
        diagnosis = Failure(FailureKind.HANG, exc.message)
    elif isinstance(exc, StaleWeights):
        diagnosis = Failure(FailureKind.STALE_WEIGHTS, exc.message, where="vllm", side=Role.VLLM)
    elif isinstance(exc, ServerNotKept):  # the trainers' own lines after it are its consequences
        diagnosis = exc.failure
    lines = []
    if stacks:
        lines.append("where each rank was (innermost frame of its main thread):")
        lines += [f"  {who}: {frame}" for who, frame in sorted(stacks.items())]
    elif isinstance(exc, Stalled):
        lines.append("no trainer stack could be read (a rank on another host, or no rank running)")
    headline = diagnosis.headline()
    stated = explained.stated and diagnosis is explained.failure  # a rank's own error is the cause said
    if headline and not isinstance(exc, (Stalled, StaleWeights)):
        lines.append(f"root cause: {headline}")
    if stated and (raised := explained.raised) is not None:
        lines += [f"  raised in {raised.frame}"] if raised.frame else []
        lines += [f"  traceback: {raised.traceback}"] if raised.traceback else []
    if exc.hint:
        lines.append(exc.hint)
    if child is not None and not stated:  # torchrun's report of the cause above: its traceback has it in full
        lines.append(child.tail())
    return RunResult(
        RunState.FAILED,
        1,
        message=exc.message,
        detail="\n".join(lines) or None,
        failed_process=child.spec.name if child else None,
        log=str(child.log_path) if child else None,
        failure=diagnosis,
    )


def dump_stacks(sup: Supervisor, paths: RunPaths | None, wait_s: float = 3.0) -> dict[str, str]:
    """Every local trainer rank's Python stack (the training entry dumps it into the run directory on SIGUSR1),
    and where each one is: {"train rank R": innermost frame of its main thread}."""
    ranks = [p for p in reaper.marked(sup.run_id) if reaper.runs_module(p, "grpo_launch.train")]
    if not ranks or paths is None:
        return {}
    t0 = time.time()
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGUSR1)

    def fresh() -> dict[str, Path]:
        out = {}
        for rank, f in paths.rank_stacks().items():
            with contextlib.suppress(OSError):
                if f.stat().st_mtime >= t0 - 1 and f.stat().st_size:
                    out[rank] = f
        return out

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and len(fresh()) < len(ranks):
        time.sleep(0.1)
    where: dict[str, str] = {}
    for rank, f in fresh().items():
        with contextlib.suppress(OSError):
            frame = faults.stuck_frames(f.read_text(errors="replace")).get("")
            if frame:
                where[f"train rank {rank}"] = frame
    return where

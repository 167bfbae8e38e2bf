"""A vLLM server lost mid-run, on the launcher's side: the same server is started again (the same command: its
address, port and guard token; on the same hosts, each backend placing it as before), and the trainers, which hold
the current weights, wait for it instead of the attempt ending (their side: :mod:`grpo_launch.train.server_restart`).

Covers a server process or engine core that exits, the server's port refusing connections, or ``/health`` that stops
answering past its bound (:meth:`Supervisor.wait_all` or :meth:`ServerKeeper.watching` raises :class:`ServerLost`),
for a one-host server and for one over several hosts (its headless processes restart with it, as a whole), on every
backend that places it on hosts (local, ssh, Ray). The refused port is what finds an API server killed alone on an
ssh or Ray host: its engine core keeps the connection the launcher watches open. Colocated engines live inside the
trainers: their loss is a trainer failure, as before.

In order: the control directory says the server is down (the trainers wait rather than fail), what is left of it is
stopped (its process group alone: a trainer rank may share its host), the same processes start again with
:data:`~grpo_launch.node.vllm_guard.RESTARTED_ENV` (the guard then refuses generation until the trainers' weights are
in), ``/health`` is awaited within ``launch.vllm_health_timeout_s``, and the control directory gives the trainers the
new server's epoch; the fault and what it cost are recorded (:class:`~grpo_launch.rundir.server_state.FaultRecord`).
At most ``launch.server_restarts`` times an attempt (0: none). Past them, or when the replacement does not come back,
the launcher gives the server up: it asks the trainers for a checkpoint and stop, tells them the server is gone, and
waits for them within the stop grace; trainers at the end of a step save it there, trainers inside one end on the
loss. The attempt then fails naming why, an ``infra`` failure that launch.max_restarts restarts from the newest
checkpoint."""

from __future__ import annotations

import dataclasses
import time
import urllib.parse
from collections.abc import Callable, Sequence

from grpo_launch.enums import FailureKind, Role
from grpo_launch.execute import faults
from grpo_launch.execute.stop_channel import StopChannel
from grpo_launch.execute.supervisor import Child, ChildFailed, ServerLost, Supervisor
from grpo_launch.node.vllm_guard import RESTARTED_ENV
from grpo_launch.rundir import server_state
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.records import StepRecord, read_metrics
from grpo_launch.rundir.server_state import port_refused
from grpo_launch.spec import Failure, ProcessSpec

GIVE_UP = "the vLLM server could not be kept"  # the stop request's reason when the launcher gives the server up
# What is left of a lost server (an engine core, its workers) holds nothing worth a graceful end, and the fault's
# cost runs while it ends: SIGKILL after this long (vLLM's own engine core gives its workers 5 s at shutdown).
LEFTOVERS_GRACE_S = 10.0


class ServerNotKept(ChildFailed):
    """The server was lost and could not be replaced: the attempt ends, an ``infra`` failure (``failure``) that
    launch.max_restarts restarts from the newest checkpoint (the one the trainers saved at the end of the step in
    flight, when they were at its end)."""

    def __init__(self, message: str, child: Child, failure: Failure, *, hint: str | None = None) -> None:
        super().__init__(message, child, hint=hint)
        self.failure = failure


class ServerKeeper:
    """Replaces a lost server up to ``restarts`` times: ``server`` and ``workers`` are its processes' specs,
    ``health_url`` and ``timeout_s`` its readiness check."""

    def __init__(
        self,
        sup: Supervisor,
        paths: RunPaths,
        channel: StopChannel,
        server: ProcessSpec,
        workers: Sequence[ProcessSpec],
        health_url: str,
        timeout_s: float,
        restarts: int,
        attempt: int | None = None,
        stop_grace_s: float = 300.0,
    ) -> None:
        self.sup, self.paths, self.server, self.workers = sup, paths, server, list(workers)
        self.channel = channel  # the run's stop channel: a server given up asks for a checkpoint and stop there
        self.health_url, self.timeout_s, self.left, self.attempt = health_url, timeout_s, restarts, attempt
        self.stop_grace_s = stop_grace_s  # for the trainers' checkpoint and stop once the server is given up
        self.refusals = 0  # the server's port refused connections this many looks in a row
        # The seconds the server was down since the trainers' last record, and the metrics' size then: the hang
        # watch does not count them (see _excused)
        self.down_s, self.records_at = 0.0, -1
        self.hung_since: float | None = None  # when the hang watch first said "hung" while down_s was excused
        server_state.reset(paths.root)

    def watching(self, running: Sequence[Child], then: Callable[[], str | None]) -> Callable[[], str | None]:
        """The supervisor's once-a-second watch (``then``), with a look at the server's port before it: raises
        :class:`ServerLost` once the port has refused connections twice in a row.

        Why not wait for the process to exit: on an ssh or Ray host the launcher watches the local ssh client or Ray
        runner, whose output pipe stays open while any process of the remote server holds it; an API server killed
        alone leaves its engine core holding it, and the loss would be seen only by ``/health`` failing for its
        whole grace (120 s). A refused connection, unlike a ``/health`` that does not answer in time (a busy
        server), is certain: the host answers and nothing listens on the server's port.

        A hang that ``then`` reports is held back by the time the server was down (:meth:`_excused`)."""

        def watch() -> str | None:
            if running and port_refused(self.health_url):
                self.refusals += 1
                if self.refusals >= 2:
                    self.refusals = 0
                    where = urllib.parse.urlsplit(self.health_url).netloc
                    raise ServerLost(f"the vLLM server's port ({where}) refuses connections", running[0])
            else:
                self.refusals = 0
            hung = then()
            return None if hung is not None and self._excused() else hung

        return watch

    def _excused(self) -> bool:
        """Whether a hang the progress watchdog sees is the replacement's downtime: the watchdog counts the seconds
        since the trainers' last step, and a replacement that took longer than its bound (a large model loads for
        minutes) would read as a hang as soon as the server is back. Until the trainers record again (the metrics
        grow), the first "hung" starts a wait as long as the server was down: the bound, counted without the
        downtime."""
        if not self.down_s:
            return False
        if self._records_size() != self.records_at:  # a step (or its log, its save) since: the watch is fair again
            self.down_s, self.hung_since = 0.0, None
            return False
        now = time.monotonic()
        self.hung_since = self.hung_since if self.hung_since is not None else now
        return now - self.hung_since < self.down_s

    def _records_size(self) -> int:
        try:
            return self.paths.metrics.stat().st_size
        except OSError:
            return -1

    def replace(self, lost: ServerLost, running: Sequence[Child], trainers: Sequence[Child]) -> list[Child]:
        """The replacement's processes (the server first) once it answers; raises :class:`ServerNotKept` naming why
        when none is left to try or it does not come back (see :meth:`_give_up`)."""
        t0 = time.time()
        step = self._last_step()
        if self.left <= 0:
            why = f"{lost.message}; no restart left (launch.server_restarts)"
            return self._give_up(lost, why, lost.child, running, trainers, t0, step)
        self.left -= 1
        server_state.mark_down(self.paths.root, lost.message)
        self.sup.say(
            f"[grpo-launch] {lost.message}: starting the vLLM server again; the trainers wait "
            f"({self.left} restart(s) left, launch.server_restarts)"
        )
        self.sup.stop_children(list(running), LEFTOVERS_GRACE_S)  # an engine core outlives its API server
        started = time.time()
        specs = [_restarted(self.server), *(_restarted(w) for w in self.workers)]
        children = [self.sup.start(spec) for spec in specs]
        try:
            self.sup.wait_healthy(children[0], self.health_url, self.timeout_s, [*children[1:], *trainers])
        except ChildFailed as exc:
            if exc.child in trainers:
                raise
            why = f"the replacement did not come back: {exc.message}{self._said_since(started)}"
            return self._give_up(lost, why, exc.child, children, trainers, t0, step)
        epoch = server_state.mark_up(self.paths.root)
        down = time.time() - t0
        if self._records_size() != self.records_at:  # the trainers recorded since the last replacement
            self.down_s, self.hung_since = 0.0, None
        self.down_s, self.records_at = self.down_s + down, self._records_size()
        self.sup.say(
            f"[grpo-launch] vLLM server back after {down:.0f} s (restart {epoch}); the trainers push their "
            "weights, then generate the step in flight again"
        )
        server_state.record_fault(
            self.paths.root, server_state.FaultRecord(lost.message, "server", t0, down, step, 0, self.attempt)
        )
        return children

    def _give_up(
        self,
        lost: ServerLost,
        why: str,
        blamed: Child,
        running: Sequence[Child],
        trainers: Sequence[Child],
        t0: float,
        step: int | None,
    ) -> list[Child]:
        """End the attempt as well as it can end. The trainers are asked to save a checkpoint at the end of the step
        in flight and stop (the run's stop request), then told that the server is gone, in that order: a trainer
        rank that finds the server lost as its step ends (:mod:`grpo_launch.train.server_restart`) waits there for
        the launcher's word, and the Trainer's own save at the step's end writes the checkpoint. A step lost inside
        its generation has nothing whole to save: the trainers end on the server's loss. Both are waited for
        within the stop grace; then :class:`ServerNotKept`, an ``infra`` failure naming why. Trainers that ended
        their last step meanwhile have finished the run: no server is left to watch ([])."""
        self.channel.request(reason=GIVE_UP)
        server_state.mark_gone(self.paths.root, why)
        self.sup.say(
            f"[grpo-launch] {GIVE_UP}: {why}. The trainers save a checkpoint if the step in flight "
            f"reached its end, and stop (waiting up to {self.stop_grace_s:.0f} s)"
        )
        self.sup.stop_children(list(running), LEFTOVERS_GRACE_S)
        deadline = time.monotonic() + self.stop_grace_s
        while time.monotonic() < deadline and any(c.proc.poll() is None for c in trainers):
            time.sleep(0.2)
        ended_well = all(c.proc.poll() == 0 for c in trainers)
        saved = self.channel.stopped_at() if ended_well else None
        if ended_well and saved is None:
            return []  # the last step was done: nothing was lost
        server_state.record_fault(
            self.paths.root, server_state.FaultRecord(lost.message, "attempt", t0, None, step, 0, self.attempt)
        )
        ended = (
            f"the trainers saved checkpoint-{saved} at the end of step {saved} and stopped"
            if saved is not None
            else "no checkpoint of the step in flight (the server was lost inside it)"
        )
        hint = "The attempt ends; launch.max_restarts restarts it from the newest checkpoint."
        failure = Failure(FailureKind.INFRA, f"{GIVE_UP}: {why}", where=blamed.spec.name, side=Role.VLLM)
        raise ServerNotKept(f"{GIVE_UP}: {why}; {ended}", blamed, failure, hint=hint)

    def _said_since(self, t0: float) -> str:
        """The replacement's own root cause, from the error lines of the server's processes since ``t0`` (e.g.
        vLLM's "Address already in use"), as `` (cause)``; empty when none was seen."""
        names = {self.server.name, *(w.name for w in self.workers)}
        seen = [e for e in self.sup.events if e.time >= t0 and e.process in names]
        cause = faults.diagnose(seen).cause if seen else None
        return f" ({cause})" if cause else ""

    def _last_step(self) -> int | None:
        """The step in flight when the server was lost: one past the last step recorded."""
        try:
            steps = [r.step for r in read_metrics(self.paths.metrics) if isinstance(r, StepRecord)]
        except OSError:
            return None
        return (steps[-1] + 1) if steps else 1


def _restarted(spec: ProcessSpec) -> ProcessSpec:
    """The same process, marked as a replacement: its guard refuses generation until the weights are pushed."""
    return dataclasses.replace(spec, env={**spec.env, RESTARTED_ENV: "1"})

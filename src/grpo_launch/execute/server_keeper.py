"""A vLLM server lost mid-run, on the launcher's side: the same server is started again (the same command: its
address, port and guard token; on the same hosts, each backend placing it as before), and the trainers, which hold
the current weights, wait for it instead of the attempt ending (their side: :mod:`grpo_launch.train.server_restart`).

Covers a server process or engine core that exits, or ``/health`` that stops answering past its bound
(:meth:`Supervisor.wait_all` raises :class:`ServerLost`), for a one-host server and for one over several hosts (its
headless processes restart with it, as a whole). Colocated engines live inside the trainers: their loss is a trainer
failure, as before.

In order: the control directory says the server is down (the trainers wait rather than fail), what is left of it is
stopped, the same processes start again with :data:`~grpo_launch.node.vllm_guard.RESTARTED_ENV` (the guard then
refuses generation until the trainers' weights are in), ``/health`` is awaited within ``launch.vllm_health_timeout_s``,
and the control directory gives the trainers the new server's epoch; the fault and what it cost are recorded
(:class:`~grpo_launch.rundir.server_state.FaultRecord`). At most ``launch.server_restarts`` times an attempt: past
them, or when the server does not come back, the trainers are told it is gone and the attempt fails, naming why (the
run's restarts, launch.max_restarts, resume it from its newest checkpoint)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from grpo_launch.execute.supervisor import Child, ChildFailed, ServerLost, Supervisor
from grpo_launch.node.vllm_guard import RESTARTED_ENV
from grpo_launch.rundir import server_state
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.records import StepRecord, read_metrics
from grpo_launch.spec import ProcessSpec


class ServerKeeper:
    """Replaces a lost server up to ``restarts`` times: ``server`` and ``workers`` are its processes' specs,
    ``health_url`` and ``timeout_s`` its readiness check."""

    def __init__(self, sup: Supervisor, paths: RunPaths, server: ProcessSpec, workers: Sequence[ProcessSpec],
                 health_url: str, timeout_s: float, restarts: int, attempt: int | None = None) -> None:  # fmt: skip
        self.sup, self.paths, self.server, self.workers = sup, paths, server, list(workers)
        self.health_url, self.timeout_s, self.left, self.attempt = health_url, timeout_s, restarts, attempt
        server_state.reset(paths.root)

    def replace(self, lost: ServerLost, running: Sequence[Child], trainers: Sequence[Child]) -> list[Child]:
        """The replacement's processes (the server first) once it answers; raises ChildFailed naming why when none
        is left to try or it does not come back (the trainers are told it is gone)."""
        t0 = time.time()
        step = self._last_step()
        if self.left <= 0:
            return self._give_up(lost, f"{lost.message}; no restart left (launch.server_restarts)", t0, step)
        self.left -= 1
        server_state.mark_down(self.paths.root, lost.message)
        self.sup.say(f"[grpo-launch] {lost.message}: starting the vLLM server again; the trainers wait "
                     f"({self.left} restart(s) left, launch.server_restarts)")  # fmt: skip
        self.sup.stop_children(list(running))  # what is left of it (an engine core outlives its API server)
        specs = [_restarted(self.server), *(_restarted(w) for w in self.workers)]
        children = [self.sup.start(spec) for spec in specs]
        try:
            self.sup.wait_healthy(children[0], self.health_url, self.timeout_s, [*children[1:], *trainers])
        except ChildFailed as exc:
            if exc.child in trainers:
                raise
            return self._give_up(lost, f"the replacement did not come back: {exc.message}", t0, step)
        epoch = server_state.mark_up(self.paths.root)
        down = time.time() - t0
        self.sup.say(f"[grpo-launch] vLLM server back after {down:.0f} s (restart {epoch}); the trainers push their "
                     "weights, then generate the step in flight again")  # fmt: skip
        server_state.record_fault(self.paths.root, server_state.FaultRecord(
            lost.message, "server", t0, down, step, 0, self.attempt))  # fmt: skip
        return children

    def _give_up(self, lost: ServerLost, why: str, t0: float, step: int | None) -> list[Child]:
        server_state.mark_gone(self.paths.root, why)
        server_state.record_fault(self.paths.root, server_state.FaultRecord(
            lost.message, "attempt", t0, None, step, 0, self.attempt))  # fmt: skip
        hint = "The attempt ends; launch.max_restarts restarts it from the newest checkpoint."
        raise ChildFailed(f"the vLLM server could not be kept: {why}", lost.child, hint=hint)

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

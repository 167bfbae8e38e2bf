"""The run's one stop channel, on the launcher's side: every way a stop is asked for during an attempt reaches the
trainers through :class:`StopChannel`, and every answer they give is read from it.

Who asks: SIGUSR2 (e.g. Slurm's warning before the time limit), the first SIGINT, SIGTERM or SIGHUP
(:mod:`grpo_launch.execute.session`), the allocation's end drawing near (the progress watchdog), a backend whose
machines are being taken away (a Ray node drain), launch.adapt's move to another split, and a vLLM server that
cannot be kept (:mod:`grpo_launch.execute.server_keeper`). The trainers see the request at the end of a step, save
a checkpoint there and stop, and rank 0 answers with the step (:mod:`grpo_launch.rundir.control`, the files both
sides share; the trainers' side writes them itself, standard library only).

One object an attempt, made by :func:`grpo_launch.execute.run.run_plan`'s attempt loop and passed to each part that
asks or reads: a change to what a stop means is made here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from grpo_launch.rundir import control


class StopChannel:
    """The stop requests of the run in ``run_dir`` and the trainers' answers; ``say`` prints a line on the
    launcher's console."""

    def __init__(self, run_dir: str | Path, say: Callable[[str], None]) -> None:
        self.run_dir, self.say = run_dir, say

    def reset(self) -> None:
        """A new attempt: forget an earlier request and answer (a requeued job must not stop at its first step)."""
        control.reset(self.run_dir)

    def request(self, why: str | None = None, *, reason: str = control.LAUNCHER) -> None:
        """Ask the trainers to save a checkpoint at the end of the step in flight and stop. ``why`` is said on the
        console; ``reason`` is what the request records for a reader of the run directory (the launcher's own
        request, or e.g. ``Ray: node drained``). A request already made keeps its reason."""
        if why:
            self.say(f"[grpo-launch] {why}")
        control.request_stop(self.run_dir, reason)

    def reason(self) -> str | None:
        """Why a stop was requested (by the launcher, or a signal the trainers received themselves), or None."""
        return control.stop_reason(self.run_dir)

    def stopped_at(self) -> int | None:
        """The step the trainers saved and stopped at on request, or None if they did not."""
        return control.stopped_at(self.run_dir)

    def saving(self) -> tuple[int, float] | None:
        """The checkpoint rank 0 is writing now: (its step, when the write began), or None."""
        return control.saving(self.run_dir)

    def abandoned(self) -> None:
        """The checkpoint being written will not be finished (every process has ended): no longer said to be."""
        control.saved(self.run_dir)

    def set_grace(self, seconds: float, why: str) -> None:
        """How long a stop waits for the trainers' checkpoint this attempt, and its source (for ``status``)."""
        control.write_stop_grace(self.run_dir, seconds, why)

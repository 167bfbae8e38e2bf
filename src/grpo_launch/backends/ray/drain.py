"""A drain that gives notice: while an attempt runs, a thread looks every :data:`POLL_S` seconds for a planned node
that Ray is draining (``ray drain-node``, or the autoscaler's DrainNode for a preempted or idle node: the node is
marked, takes no new work, and is to be killed at the drain's deadline). On the first, it asks the trainers to save a
checkpoint at the end of the step in flight and stop (:func:`grpo_launch.rundir.control.request_stop`, the path
Ctrl-C and the time limit use), once. The attempt then ends stopped with a checkpoint, which the run loop restarts
like a failure (``Backend.machines_leaving``; launch.max_restarts), on the nodes the cluster holds without the draining
one (:mod:`.recover`).

Ray 2.x tells the driver of a drain only through its GCS state (``get_draining_nodes``: node id → deadline; see
:func:`.cluster.draining_nodes`), and tells the node's own processes nothing (no signal, no file). A drain whose
deadline is shorter than a step, or a node killed without a drain, is a lost node: the restart resumes from the
newest complete checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

POLL_S = 2.0


def notice(host: str, deadline: float | None, now: float) -> str:
    """What the console says of a planned node being drained."""
    when = f"it goes in {max(0.0, deadline - now):.0f} s" if deadline else "no deadline given"
    return f"node {host} is being drained ({when})"


class DrainWatch:
    """Calls ``on_drain(text)`` once, when one of ``hosts`` (node id → host name) shows in ``draining()`` (node id →
    deadline, epoch seconds or None), looked at every ``poll_s`` until :meth:`stop`."""

    def __init__(
        self,
        hosts: Mapping[str, str],
        draining: Callable[[], Mapping[str, float | None]],
        on_drain: Callable[[str], None],
        poll_s: float = POLL_S,
    ) -> None:
        self.hosts, self.draining, self.on_drain, self.poll_s = dict(hosts), draining, on_drain, poll_s
        self.seen: str | None = None  # the notice, once a planned node is draining
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grpo-launch-ray-drain", daemon=True)

    def start(self) -> DrainWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.poll_s + 5)

    def check(self) -> bool:
        """One look; True once a planned node is draining."""
        if self.seen is None:
            found = [(self.hosts[n], d) for n, d in self.draining().items() if n in self.hosts]
            if found:
                self.seen = "; ".join(notice(h, d, time.time()) for h, d in found)
                self.on_drain(self.seen)
        return self.seen is not None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.check():
                return

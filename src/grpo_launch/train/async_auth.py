"""The async rollout worker's aiohttp session with the run's vLLM token (:mod:`grpo_launch.train.server_auth` says
why). A module of its own because it imports TRL's worker at import: the spawned child unpickles
:class:`GuardedRolloutLoop` by reference and imports it here."""

from __future__ import annotations

import os
from typing import Any

from trl.experimental.async_grpo import async_rollout_worker as worker

from grpo_launch.rundir.layout import VLLM_TOKEN_ENV


class GuardedRolloutLoop(worker._AsyncRolloutLoop):
    """TRL's rollout loop whose session, once ``_run_loops`` opens it (``self.session = session``), sends the
    token: the child reads it from the environment it inherits (multiprocessing's spawn keeps os.environ; TRL's
    ``_scrub_child_env`` strips only ranks and devices). The session talks to vllm_server_url only
    (``_AsyncRolloutLoop._post``)."""

    @property
    def session(self) -> Any:
        return self.__dict__.get("_guarded_session")

    @session.setter
    def session(self, value: Any) -> None:
        token = os.environ.get(VLLM_TOKEN_ENV)
        if value is not None and token:
            value.headers["Authorization"] = f"Bearer {token}"
        self.__dict__["_guarded_session"] = value


def use_guarded_loop() -> None:
    """Every AsyncRolloutWorker of this process starts :class:`GuardedRolloutLoop` (TRL's ``_loop_cls`` hook)."""
    worker.AsyncRolloutWorker._loop_cls = GuardedRolloutLoop

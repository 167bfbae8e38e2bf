"""A vLLM server lost mid-run, on the trainers' side: they wait for the launcher's replacement, set the weight
transfer up again, push the current weights and generate the step in flight again (server mode, TRL 1.16's
GRPOTrainer). The launcher's side is :mod:`grpo_launch.execute.server_keeper`.

How TRL 1.16 talks to the server (trl/generation/vllm_generation.py, ``VLLMGeneration``): rank 0 alone holds the
``VLLMClient``. ``generate`` gathers every rank's prompts (``gather_object``), rank 0 calls ``client.generate`` and
broadcasts the completions (``broadcast_object_list(obj_list, from_process=0)``), which every rank unpacks;
``sync_weights`` has rank 0 call ``update_named_params`` while the other ranks walk the parameters with it (the gathers
ZeRO-3 and FSDP need), then ``reset_prefix_cache``. ``tests/test_server_restart.py`` pins each of these.

So a lost server is handled where every rank is (:class:`Keeper`, installed on ``trainer.vllm_generation``):

- ``generate``: were rank 0 to raise inside the client call, the other ranks would wait in the broadcast for ever.
  Rank 0 broadcasts a :data:`LOST` marker instead, whose unpacking raises :class:`ServerLost` on the other ranks
  too. Every rank then waits for the replacement (rank 0 watches the run's control directory and ``/health``, and
  tells the others), and generates again: the first call syncs the weights (below).
- ``sync_weights``: before it, every rank learns from rank 0 whether the server was replaced since the weights last
  reached it; if so, rank 0 sets the weight transfer up again (``init_communicator``: the new server has a new
  group) before TRL pushes the full weights (TRL sends every parameter at each sync). Before a generation, a
  replaced server that has not had the weights yet gets them first.
- A restarted server refuses generation until the weights have been pushed (:mod:`grpo_launch.node.vllm_guard`:
  the ``POST /reset_prefix_cache`` TRL's ``sync_weights`` sends last unlocks it), so generation never runs on the
  weights it loaded from disk.

Bounded: the launcher restarts the server at most ``launch.server_restarts`` times, each within its health timeout.
When it gives up, it asks for a checkpoint and stop, then says so in the control directory:

- a loss found as a step ends (:meth:`Keeper.at_step_end`, on the Trainer's ``on_optimizer_step``, before the
  step's ``on_step_end``: the server was lost after the step's generation) is waited for there, and the Trainer's
  own save at that step's end writes its checkpoint (the stop-on-request callback sets ``should_save`` and
  ``should_training_stop``): the next attempt resumes from it, no step lost;
- a loss found inside a step (in its generation or weight sync) has no whole step to save: the trainers raise
  :class:`ServerGone`, and the run resumes from its newest checkpoint. Saving there would take the Trainer's
  private ``_save_checkpoint`` (``save_model`` writes the weights alone, without the optimizer, scheduler and RNG
  states a resume reads), and the Trainer looks at ``should_save`` only after the step's optimizer step.

A server lost in the middle of a sync under ZeRO-3 or FSDP (whose parameter walk is collective) cannot be pushed
again from rank 0 alone: that attempt ends the same way.

Importing this module is cheap: accelerate and requests are imported where they are used."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from grpo_launch.rundir import control, server_state
from grpo_launch.rundir.layout import RunPaths

POLL_S = 1.0


class ServerLost(RuntimeError):
    """The vLLM server stopped answering during a call; the launcher is replacing it."""


class ServerGone(RuntimeError):
    """The launcher could not bring the vLLM server back: the attempt ends."""


class _Lost:
    """What rank 0 broadcasts in place of the completions when the server is lost: unpacking or indexing it raises
    :class:`ServerLost` on the rank that receives it (TRL unpacks the broadcast payload into four lists)."""

    def __iter__(self) -> Any:
        raise ServerLost("the vLLM server was lost during a generation")

    def __getitem__(self, _key: Any) -> Any:
        raise ServerLost("the vLLM server was lost during a generation")


LOST = _Lost()


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class Keeper:
    """The trainers' side of a server restart, on one rank (see the module docstring). ``generation`` is TRL's
    ``VLLMGeneration``; ``run_dir`` the run's (its control directory); ``timeout_s`` how long to wait for a
    replacement; ``broadcast`` accelerate's ``broadcast_object_list`` (None: a world of one)."""

    def __init__(
        self,
        generation: Any,
        run_dir: str,
        *,
        is_main: bool,
        device: Any,
        timeout_s: float,
        broadcast: Callable[..., Any] | None,
        say: Callable[[str], None] = print,
    ) -> None:
        self.generation, self.run_dir, self.is_main, self.device = generation, run_dir, is_main, device
        self.timeout_s, self.broadcast, self.say = timeout_s, broadcast, say
        self.synced = server_state.server_epoch(run_dir)  # the server that holds the trainers' weights
        self._generate = generation.generate
        self._sync = generation.sync_weights
        client = getattr(generation, "vllm_client", None)
        self.base_url = getattr(client, "base_url", "")
        if is_main and client is not None:
            self._client_generate = client.generate
            client.generate = self._guarded_client_generate

    def install(self) -> None:
        """Put the keeper's ``generate`` and ``sync_weights`` in place of TRL's on this rank's VLLMGeneration."""
        self.generation.generate = self.generate
        self.generation.sync_weights = self.sync_weights

    # ---------------------------------------------------------------- what every rank calls
    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's generate, again after a replacement (with the weights pushed first), until it succeeds."""
        while True:
            if self._state()[1]:
                self.sync_weights()
            try:
                return self._generate(*args, **kwargs)
            except ServerLost as exc:
                self._say(f"{exc}: waiting for the launcher's replacement")
                self._await_replacement()

    def sync_weights(self) -> None:
        """TRL's sync, after setting the weight transfer up again when the server was replaced since the last."""
        epoch, stale = self._state()
        if stale:
            if self.is_main:
                self._reconnect()
            self._say(f"pushing the current weights to the replaced vLLM server (restart {epoch})")
        try:
            self._sync()
        except Exception as exc:
            if not (self.is_main and self._lost()):
                raise
            self._say(f"the vLLM server was lost during a weight sync ({type(exc).__name__}): waiting for it")
            epoch = self._wait()  # rank 0 alone: the other ranks are already on to the next generation's gather
            self._reconnect()
            self._say(f"pushing the current weights to the replaced vLLM server (restart {epoch})")
            self._sync()  # a collective parameter walk (ZeRO-3, FSDP) cannot be done alone: it raises or hangs
        self.synced = epoch  # a server replaced again meanwhile is caught before the next generation

    def at_step_end(self) -> None:
        """Rank 0, once a step's optimizer has stepped and before the step ends (where the Trainer decides whether
        to save it): a server lost since the step's generation is waited for here, while this step can still be
        saved. Replaced: the next sync pushes the weights to it. Given up: the launcher has asked for a checkpoint
        and stop before saying so, and the stop-on-request callback honours it at this step's end on every rank (it
        agrees on the request across ranks): the Trainer saves this step. The other ranks wait for rank 0 in that
        agreement. Only a sure loss is waited for (the launcher says the server is down or gone, or its port
        refuses connections): a busy server that answers /health late must not hold the step."""
        if not self.is_main or not self._surely_lost():
            return
        self._say("the vLLM server was lost after this step's generation: waiting for the launcher's word")
        try:
            self._wait()
        except ServerGone as exc:
            if control.stop_reason(self.run_dir) is None:  # the launcher has not given up: this is no stop
                raise
            self._say(f"{exc}: saving a checkpoint at the end of this step, then stopping")

    def _surely_lost(self) -> bool:
        return (
            server_state.server_down(self.run_dir)
            or server_state.server_gone(self.run_dir) is not None
            or (bool(self.base_url) and server_state.port_refused(self.base_url))
        )

    # ---------------------------------------------------------------- rank 0
    def _guarded_client_generate(self, *args: Any, **kwargs: Any) -> Any:
        """Rank 0's client call: on a lost server, release the other ranks from the broadcast they wait in (they
        receive :data:`LOST`) and raise :class:`ServerLost` here."""
        try:
            return self._client_generate(*args, **kwargs)
        except Exception as exc:
            if not self._lost():
                raise
            if self.broadcast is not None:
                self.broadcast([LOST], from_process=0)
            raise ServerLost(f"the vLLM server was lost during a generation ({type(exc).__name__})") from exc

    def _lost(self) -> bool:
        """Whether the server is gone or being replaced (not a request it refused): the launcher says so, or it
        does not answer /health."""
        return server_state.server_down(self.run_dir) or self._epoch() != self.synced or not _healthy(self.base_url)

    def _reconnect(self) -> None:
        client = self.generation.vllm_client
        client.check_server(self.timeout_s)
        client.init_communicator(device=self.device)

    def _wait(self) -> int:
        """Rank 0: until the launcher has a replacement up (a new epoch, not down, answering /health); raises
        ServerGone when the launcher gave up, or after ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            if (why := server_state.server_gone(self.run_dir)) is not None:
                raise ServerGone(f"the launcher could not bring the vLLM server back: {why}")
            epoch = self._epoch()
            if epoch != self.synced and not server_state.server_down(self.run_dir) and _healthy(self.base_url):
                return epoch
            if time.monotonic() > deadline:
                raise ServerGone(f"no replacement vLLM server within {self.timeout_s:.0f} s")
            time.sleep(POLL_S)

    # ---------------------------------------------------------------- every rank, together
    def _await_replacement(self) -> None:
        """Every rank: rank 0 waits for the replacement and tells the others its epoch (or that it is gone)."""
        outcome: Any = None
        if self.is_main:
            try:
                outcome = self._wait()
            except ServerGone as exc:
                outcome = exc
        outcome = self._agree(outcome)
        if isinstance(outcome, ServerGone):
            raise outcome

    def _state(self) -> tuple[int, bool]:
        """Rank 0's view, on every rank: the server's epoch, and whether it lacks the current weights. Rank 0's
        alone decides (only rank 0 pushes, and a push it redid alone after a loss mid-sync is known only to it), so
        every rank takes the same path through the collectives."""
        epoch = self._epoch()
        return self._agree((epoch, epoch != self.synced))

    def _say(self, message: str) -> None:
        if self.is_main:  # once, not once per rank
            self.say(f"[grpo-launch] {message}")

    def _agree(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        if self.broadcast is None:
            return value
        box = [value]
        self.broadcast(box, from_process=0)
        return box[0]

    def _epoch(self) -> int:
        return server_state.server_epoch(self.run_dir)


def keep_server(trainer: Any, run_dir: str | None, timeout_s: float, say: Callable[[str], None]) -> Keeper | None:
    """Install the keeper on a GRPOTrainer in vLLM server mode inside a run directory (None otherwise)."""
    generation = getattr(trainer, "vllm_generation", None)
    if run_dir is None or generation is None or getattr(generation, "mode", None) != "server":
        return None
    accelerator = trainer.accelerator
    broadcast = None
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast = broadcast_object_list
    keeper = Keeper(
        generation,
        str(RunPaths(run_dir).root),
        is_main=accelerator.is_main_process,
        device=accelerator.device,
        timeout_s=timeout_s,
        broadcast=broadcast,
        say=say,
    )
    keeper.install()
    trainer.add_callback(step_end_callback(keeper))
    return keeper


def step_end_callback(keeper: Keeper) -> Any:
    """A TrainerCallback whose ``on_optimizer_step`` runs :meth:`Keeper.at_step_end`: the Trainer calls it after
    the optimizer's step and before ``on_step_end``, so it comes before the stop-on-request callback's agreement
    whatever the callbacks' order."""
    from transformers import TrainerCallback

    class AtStepEnd(TrainerCallback):
        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            keeper.at_step_end()

    return AtStepEnd()

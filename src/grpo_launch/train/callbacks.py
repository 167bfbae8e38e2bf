"""Trainer callbacks for the training entry: the per-step timing log and checkpoint-and-stop on request.

Importing this module is cheap; :func:`make_callbacks` imports torch and transformers when called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_launch.control import STOP_REQUEST


def make_callbacks(control_dir: str | None, is_main: bool) -> tuple[Any, Any]:
    """(the step log, the stop-on-request callback or None). Imports transformers: call inside the trainer only."""
    import time

    import torch
    from transformers import TrainerCallback

    class StepLog(TrainerCallback):
        """One line per optimizer step on the main process: wall time, and how much of it went to generating
        (and scoring) completions, to compare with ``grpo-launch plan``'s estimate. Generation happens in the
        first micro-step of a generation round, so a step's split can include the round's whole generation."""

        def __init__(self) -> None:
            self.t0 = time.monotonic()
            self.generation_s = 0.0

        def timed(self, fn):
            def wrapper(*a, **kw):
                t = time.monotonic()
                try:
                    return fn(*a, **kw)
                finally:
                    self.generation_s += time.monotonic() - t

            return wrapper

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            dt = time.monotonic() - self.t0
            gen, self.generation_s = self.generation_s, 0.0
            if is_main:
                print(
                    f"[grpo-launch] step {state.global_step}/{state.max_steps} done in {dt:.2f} s "
                    f"(generation {gen:.2f} s, training {max(0.0, dt - gen):.2f} s)",
                    flush=True,
                )

    class StopOnRequest(TrainerCallback):
        """Save a checkpoint and stop at the end of the step in which ``CONTROL_DIR/stop-requested`` appears.

        Every rank must stop at the same step (saving is collective), so the flag is all-reduced each step.
        """

        def __init__(self, directory: str) -> None:
            self.request = Path(directory) / STOP_REQUEST
            self.stopped_at: int | None = None

        def on_step_end(self, args, state, control, **kwargs):
            flag = self.request.exists()
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                t = torch.tensor([1 if flag else 0], device=args.device)
                torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
                flag = bool(t.item())
            if flag and state.global_step < state.max_steps:
                control.should_save = True
                control.should_training_stop = True
                self.stopped_at = state.global_step
            return control

    return StepLog(), (StopOnRequest(control_dir) if control_dir else None)

"""Trainer callbacks for the training entry: the per-step timing log (and RUN_DIR/metrics.jsonl) and
checkpoint-and-stop on request.

Importing this module is cheap: the callbacks' steps are plain classes here, and :func:`make_callbacks` mixes them
into transformers' TrainerCallback when called (torch is imported by the steps that need it).
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from pathlib import Path
from typing import Any

from grpo_launch.errors import LaunchError
from grpo_launch.rundir.async_signals import signals_text
from grpo_launch.rundir.control import mark_saving, request_stop_on_sigterm, saved
from grpo_launch.rundir.layout import HOLD_SIGTERM_ENV
from grpo_launch.rundir.records import LogRecord, SaveRecord, StepRecord, append
from grpo_launch.train.environment import JobEnvironment


def peak_memory_bytes() -> tuple[int, str]:
    """This process's peak memory: the CUDA allocator's peak on a GPU, the peak resident set on CPU."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated()), "cuda_max_allocated"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "rss_max"


def step_line(
    step: int, total: int, dt: float, gen: float, tokens_per_s: float | None, times: list[float]
) -> tuple[str, str]:
    """(``step 3/60 done in 0.19 s (generation 0.15 s, training 0.04 s)``,
    `` | 5,616 tok/s prompt+completion | ETA 11 s``): the step's metrics go between them."""
    train = max(0.0, dt - gen)
    head = f"[grpo-launch] step {step}/{total} done in {dt:.2f} s (generation {gen:.2f} s, training {train:.2f} s)"
    tail = ""
    if tokens_per_s:
        tail += f" | {tokens_per_s:,.0f} tok/s prompt+completion"  # TRL's num_input_tokens_seen counts both
    if total > step and times:
        recent = times[-20:]
        eta = (total - step) * sum(recent) / len(recent)
        tail += " | ETA " + (
            f"{eta / 3600:.1f} h" if eta >= 3600 else f"{eta / 60:.0f} min" if eta >= 120 else f"{eta:.0f} s"
        )
    return head, tail


def metrics_text(logs: dict) -> str:
    """The step's logged metrics worth a glance: reward ± std, completion length, KL or entropy."""
    out = []
    if isinstance(logs.get("reward"), (int, float)):
        std = logs.get("reward_std")
        out.append(f"reward {logs['reward']:.3f}" + (f" ± {std:.3f}" if isinstance(std, (int, float)) else ""))
    if isinstance(logs.get("completions/mean_length"), (int, float)):
        out.append(f"length {logs['completions/mean_length']:.1f}")
    for key in ("kl", "entropy"):
        if isinstance(logs.get(key), (int, float)):
            out.append(f"{key} {logs[key]:#.3g}")  # three significant digits, kept: entropy 5.80 beside 5.79
    return "".join(f" | {x}" for x in out) + signals_text(logs)  # AsyncGRPOTrainer's own, when it logs them


def gpu_utilization(job: JobEnvironment) -> int | None:
    """This rank's GPU busy percent from NVML (its recent sampling window), or None (no CUDA, no NVML)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        token = job.device_token(torch.cuda.current_device())
        if token.startswith(("GPU-", "MIG-")):
            handle = pynvml.nvmlDeviceGetHandleByUUID(token)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(token))
        return int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:  # no NVML library or driver, a MIG instance without utilisation: not measured
        return None


def _gather(mine: tuple[int, int | None], every_rank: bool) -> list[tuple[int, int | None]]:
    """Every rank's (peak memory, GPU utilisation), ``every_rank`` and distributed; else this rank's alone. Every
    rank calls it (callbacks run on all), so the gather is collective."""
    import torch

    if not (every_rank and torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [mine]
    samples = [mine] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(samples, mine)
    return samples


class StepLogSteps:
    """The step log's steps, as TrainerCallback events (:func:`make_callbacks` mixes them into one): one line per
    optimizer step on the main process: wall time, and how much of it went to generating (and scoring)
    completions, to compare with ``grpo-launch plan``'s estimate. Generation happens in the first micro-step of a
    generation round, so a step's split can include the round's whole generation."""

    def __init__(self, job: JobEnvironment, is_main: bool) -> None:
        self.job, self.is_main = job, is_main
        self.metrics_path = job.paths.metrics if job.paths else None
        self.t0 = self.t_end = time.monotonic()
        self.generation_s = 0.0
        self.tokens: int | None = None
        self.times: list[float] = []
        self.pending: tuple[str, str] | None = None
        self.gpu_util: list[int | None] = []

    def timed(self, fn):
        def wrapper(*a, **kw):
            t = time.monotonic()
            try:
                return fn(*a, **kw)
            finally:
                self.generation_s += time.monotonic() - t

        return wrapper

    def on_init_end(self, args, state, control, **kwargs):
        """The run's tracking name as run_name when the recipe sets none: W&B and trackio name their run from it,
        and trackio resumes a run by name (transformers' TrackioCallback: ``resume="allow"``), so every attempt
        reports to one run. The report_to callbacks read it at on_train_begin, after this (the Trainer's last
        step of __init__)."""
        if self.job.run_name and not getattr(args, "run_name", None):
            args.run_name = self.job.run_name

    def on_step_begin(self, args, state, control, **kwargs):
        self.t0 = time.monotonic()

    def on_save(self, args, state, control, **kwargs):
        """The checkpoint's save time (from the end of its step), for the walltime-aware stop."""
        if self.is_main and self.metrics_path:
            append(self.metrics_path, SaveRecord(state.global_step, time.monotonic() - self.t_end, self.job.attempt))

    def on_step_end(self, args, state, control, **kwargs):
        self.t_end = time.monotonic()
        dt = self.t_end - self.t0
        gen, self.generation_s = self.generation_s, 0.0
        peak, kind = peak_memory_bytes()
        samples = _gather((peak, gpu_utilization(self.job)), every_rank=self.metrics_path is not None)
        peaks = [p for p, _ in samples]
        self.gpu_util = [u for _, u in samples]
        if self.is_main:
            tokens = int(state.num_input_tokens_seen)
            rate = (tokens - self.tokens) / dt if dt > 0 and self.tokens is not None else None
            self.tokens = tokens
            self.times.append(dt)
            self.pending = step_line(state.global_step, state.max_steps, dt, gen, rate, self.times)
            if not control.should_log:  # else on_log adds this step's metrics to the line
                self.print_pending({})
            if self.metrics_path:
                self.write_metrics(state, dt, gen, peaks, kind)

    def print_pending(self, logs) -> None:
        if self.pending:
            head, tail = self.pending
            print(head + metrics_text(logs) + tail, flush=True)
            self.pending = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        """TRL's logged metrics (reward, completions/mean_length, …) as their own lines: {"step", "log"}."""
        if self.is_main and logs:
            self.print_pending(logs)
        if self.is_main and self.metrics_path and logs:
            numbers = {k: v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            append(self.metrics_path, LogRecord(state.global_step, numbers, self.job.attempt))

    def write_metrics(self, state, dt: float, gen: float, peaks: list[int], kind: str) -> None:
        assert self.metrics_path is not None
        record = StepRecord(
            step=state.global_step,
            max_steps=state.max_steps,
            time=time.time(),
            step_s=dt,
            generation_s=gen,
            training_s=max(0.0, dt - gen),
            num_tokens=int(state.num_input_tokens_seen),  # TRL counts prompt + completion tokens here
            peak_memory_bytes=tuple(peaks),
            memory_kind=kind,
            gpu_utilization=tuple(self.gpu_util),
            attempt=self.job.attempt,
        )
        append(self.metrics_path, record)


class StopOnRequestSteps:
    """Save a checkpoint and stop at the end of the step in which the run's stop request appears (as a
    TrainerCallback event, mixed in by :func:`make_callbacks`).

    Every rank must stop at the same step (saving is collective), so the flag is all-reduced each step. Where the
    platform signals the ranks themselves (Slurm's steps, started with SIGTERM held), SIGTERM writes the request
    (:func:`grpo_launch.rundir.control.request_stop_on_sigterm`): the step in flight ends, is saved, and the rank
    exits 0 (a torchrun rank dies of SIGTERM otherwise, mid-step).
    """

    def __init__(self, request: Path, run_dir: Path | None = None) -> None:
        self.request = request
        self.run_dir = run_dir  # rank 0 marks the checkpoint it writes there (rundir/control.py: saving)
        self.stopped_at: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        flag = self.request.exists()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            t = torch.tensor([1 if flag else 0], device=args.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            flag = bool(t.item())
        if flag and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        if control.should_save and state.is_world_process_zero and self.run_dir is not None:
            # the Trainer writes the checkpoint next (its schedule's, or the one asked for): while it does, a second
            # Ctrl-C abandons it, and the launcher says so before
            with contextlib.suppress(OSError, LaunchError):
                mark_saving(self.run_dir, state.global_step)
        return control

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.run_dir is not None:
            with contextlib.suppress(OSError):
                saved(self.run_dir)


def make_callbacks(job: JobEnvironment, is_main: bool) -> tuple[Any, Any]:
    """(the step log, the stop-on-request callback or None: only in a run directory). Imports transformers: call
    inside the trainer only.

    In a run directory the main process appends a record per optimizer step to its metrics (:mod:`records`): its
    wall, generation and training seconds, the tokens processed so far, and every rank's peak memory (gathered from
    all ranks) — what `grpo-launch plan` predicted, measured; one per save; one per logging step with TRL's logged
    metrics."""
    from transformers import TrainerCallback

    # The steps first: their events override TrainerCallback's no-op ones, which the Trainer calls for the rest.
    class StepLog(StepLogSteps, TrainerCallback):
        pass

    class StopOnRequest(StopOnRequestSteps, TrainerCallback):
        pass

    if job.paths is None:
        return StepLog(job, is_main), None
    _hold_sigterm(job.paths.root)
    return StepLog(job, is_main), StopOnRequest(job.paths.stop_request, job.paths.root)


def _hold_sigterm(run_dir: Path) -> None:
    """Under ``node.shim --hold-term`` (which marks this process's environment): SIGTERM becomes a stop request."""
    # The shim's mark is read here, where the handler is installed (signals are per process, set on the main thread).
    if os.environ.get(HOLD_SIGTERM_ENV) == "1" and threading.current_thread() is threading.main_thread():
        request_stop_on_sigterm(run_dir)

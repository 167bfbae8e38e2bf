"""The trainers' terms of the time to the first step, written by rank 0 as :class:`StartupRecord` lines of the
run's metrics: the start (from the launcher's start of the trainers, or this process's own, to TRL imported), the
model load (from then to a built trainer: the dataset is prepared in it), the first weight sync to vLLM and the first
generation (the first call of TRL's generation, less the sync inside it). The launcher adds the vLLM server's start
to healthy, which runs beside them (execute/session.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from grpo_launch.rundir.layout import SPAWNED_AT_ENV, RunPaths
from grpo_launch.rundir.records import StartupRecord, append


def started_at(environ: Mapping[str, str], now: float | None = None) -> float:
    """Wall-clock seconds when this rank's start began: the launcher's start of the trainers where it says so (and
    the time is plausible: on this host's clock, not ahead, within a day), else this process's start (Linux's
    /proc), else now."""
    now = time.time() if now is None else now
    try:
        spawned = float(environ.get(SPAWNED_AT_ENV, ""))
        if 0.0 <= now - spawned <= 86400.0:
            return spawned
    except ValueError:
        pass
    return _process_start() or now


def _process_start() -> float | None:
    """This process's start, wall clock, from /proc (None elsewhere): its start in clock ticks since boot (proc(5),
    ``starttime``) on the boot-time clock, which /proc/uptime shows to 10 ms; read here to the nanosecond, beside the
    wall clock, so two calls agree."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return booted + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def record_startup(trainer: Any, paths: RunPaths | None, is_main: bool, marks: tuple[float, float]) -> None:
    """``marks``: wall-clock times when this rank's start began (:func:`started_at`) and when its imports were done.
    Writes the start and the load, and wraps the first sync and generation."""
    if not (is_main and paths):
        return
    metrics = paths.metrics
    began, imported = marks
    now = time.time()
    append(metrics, StartupRecord("start", max(0.0, imported - began), imported))
    append(metrics, StartupRecord("model_load", max(0.0, now - imported), now))
    synced: list[float] = []
    engine = getattr(trainer, "vllm_generation", None)  # TRL 1.16: the vLLM side of GRPOTrainer
    if engine is not None and hasattr(engine, "sync_weights"):
        sync = engine.sync_weights

        def timed_sync(*args: Any, **kwargs: Any) -> Any:
            t = time.monotonic()
            try:
                return sync(*args, **kwargs)
            finally:
                if not synced:
                    synced.append(time.monotonic() - t)
                    append(metrics, StartupRecord("first_sync", synced[0], time.time()))

        engine.sync_weights = timed_sync
    generate = getattr(trainer, "_generate_and_score_completions", None)
    if generate is None:
        return
    done: list[bool] = []

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        t = time.monotonic()
        try:
            return generate(*args, **kwargs)
        finally:
            if not done:
                done.append(True)
                took = time.monotonic() - t - (synced[0] if synced else 0.0)
                append(metrics, StartupRecord("first_generation", max(0.0, took), time.time()))

    trainer._generate_and_score_completions = timed_generate

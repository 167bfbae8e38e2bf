"""The trainers' terms of the time to the first step, written by rank 0 as :class:`StartupRecord` lines of the
run's metrics: the model load (from the entry's start to a built trainer: the dataset is prepared in it), the first
weight sync to vLLM and the first generation (the first call of TRL's generation, less the sync inside it). The
launcher adds the vLLM server's start to healthy, which runs beside the load (execute/session.py)."""

from __future__ import annotations

import time
from typing import Any

from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.records import StartupRecord, append


def record_startup(trainer: Any, paths: RunPaths | None, is_main: bool, started: float) -> None:
    """``started``: time.monotonic() when the training entry began. Wraps the first sync and generation."""
    if not (is_main and paths):
        return
    metrics = paths.metrics
    append(metrics, StartupRecord("model_load", time.monotonic() - started, time.time()))
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

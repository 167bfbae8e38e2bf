"""The phases of an attempt's time to its first step, by the names a run records them (StartupRecord rows in
metrics.jsonl) and the plan forecasts them (planning/cost/startup.py), and how they add up to that time."""

from __future__ import annotations

from collections.abc import Mapping

# In the order they end: the trainers' start and load, the vLLM server's start (beside the load), then the first
# weight sync and the first generation.
STARTUP_PHASES = ("start", "model_load", "vllm_ready", "first_sync", "first_generation")


def critical_path_s(terms: Mapping[str, float]) -> float | None:
    """The time to first step from its phases by name (a run's records or a forecast's): the trainers' start and
    load beside a server's start, then the first sync and the first generation. None without any phase."""
    if not terms:
        return None
    trainers = terms.get("start", 0.0) + terms.get("model_load", 0.0)
    parallel = max(trainers, terms.get("vllm_ready", 0.0))
    return parallel + terms.get("first_sync", 0.0) + terms.get("first_generation", 0.0)

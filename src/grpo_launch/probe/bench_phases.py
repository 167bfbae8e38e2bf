"""``grpo-launch calibrate``'s measurements in its own process, in the order the plan needs them, each started only
while its expected cost fits what is left of the budget: the trainers' imports and the model's load from disk
(:mod:`.bench_start`), decode through the plan's engine and the training step with their warm-ups
(:mod:`.bench`), a prompt pass, a forward alone, the activation memory (:mod:`.bench_memory`), the other
checkpointing setting; and, when calibrate's other measurements are done, the engine the plan does not use. Needs
torch and transformers; imported only by ``calibrate``."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from grpo_launch.probe.bench import (
    CONTINUOUS_COLD_S,
    LONG,
    BenchSpec,
    Budget,
    Report,
    _dtype,
    measure_decode,
    measure_forward,
    measure_prefill,
    measure_train,
    point_need,
)
from grpo_launch.probe.bench_memory import _default_malloc, measure_activation_peak, peak_memory
from grpo_launch.probe.bench_start import load_model, measure_cuda_init, measure_imports

PHASES = (
    "imports",
    "model load",
    "decode",
    "training step",
    "prefill",
    "forward",
    "activation memory",
    "training step (other checkpointing)",
)  # activation memory first on a CPU: _activation_phase


def run_bench(spec: BenchSpec, report: Report) -> tuple[dict[str, Any], Any]:
    """Every phase in the order the plan needs it, each started only while its expected cost fits what is left of
    ``spec.seconds``; the measured values by name, and ``failed``: what was not measured, and why; and the model,
    for :func:`measure_other_engine`. ``report(phase)`` before each."""
    budget = Budget(spec.seconds)
    out: dict[str, Any] = {"failed": [], "decode": [], "continuous": []}
    report(PHASES[0])
    out["imports_s"] = measure_imports() or None
    out["cuda_init_s"] = measure_cuda_init(spec.device)
    import torch

    if spec.device == "cpu":
        torch.set_num_threads(max(1, spec.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)
    report(PHASES[1])
    model = load_model(spec, out)
    if spec.device == "cpu":  # a resident set counts only on a heap no earlier phase has grown (see below)
        _activation_phase(model, spec, budget, out, report)
    model.to(_dtype(spec.train_dtype or spec.dtype))  # the trainers' weights: they generate and train with them
    report(PHASES[2])
    _guarded(out, PHASES[2], lambda: measure_decode(model, spec, budget, spec.engine, out))
    report(PHASES[3])
    train = model
    out["train_tokens_per_s" + ("_ckpt" if spec.checkpointing else "")] = _guarded(
        out,
        PHASES[3],
        lambda: measure_train(
            train, spec, time.monotonic() + min(budget.left(), 10.0), checkpointing=spec.checkpointing, out=out
        ),
    )
    out["peak_memory_bytes" + ("_ckpt" if spec.checkpointing else "")], out["memory_kind"] = peak_memory(spec.device)
    cheap: list[tuple[str, str, Callable[[float], float]]] = [
        (PHASES[4], "prefill_s", functools.partial(measure_prefill, model, spec)),
        (PHASES[5], "forward_tokens_per_s", functools.partial(measure_forward, train, spec)),
    ]
    for name, key, fn in cheap:
        if not _started(out, budget, name, 2.0):
            break
        report(name)
        out[key] = _guarded(out, name, functools.partial(fn, time.monotonic() + min(budget.left(), 5.0)))
    if spec.device != "cpu":
        _activation_phase(model, spec, budget, out, report)
    model.to(_dtype(spec.train_dtype or spec.dtype))
    other = not spec.checkpointing
    if _started(out, budget, PHASES[7], 4.0):
        report(PHASES[7])
        out["train_tokens_per_s" + ("_ckpt" if other else "")] = _guarded(
            out,
            PHASES[7],
            lambda: measure_train(train, spec, time.monotonic() + min(budget.left(), 5.0), checkpointing=other),
        )
        out["peak_memory_bytes" + ("_ckpt" if other else "")], _ = peak_memory(spec.device)
    return out, model


def _activation_phase(model: Any, spec: BenchSpec, budget: Budget, out: dict[str, Any], report: Report) -> None:
    """One micro-batch's activation memory, with and without checkpointing, at the weights' own width (the memory
    model's). On a GPU the allocator's peak is exact whenever it runs; on a CPU the resident set grows only where the
    heap has not been grown before, so it runs first, right after the load (its forward and backward then warm up
    the CPU's kernels before the training step is timed cold: the CPU's warm-up is small)."""
    if not _started(out, budget, PHASES[6], 3.0):
        return
    report(PHASES[6])
    model.to(_dtype(spec.dtype))
    for suffix, ckpt in (("", False), ("_ckpt", True)):
        peak = functools.partial(measure_activation_peak, model, spec, checkpointing=ckpt)
        both = _guarded(out, PHASES[6], peak)
        out["activation_peak_bytes" + suffix], out["step_peak_bytes" + suffix] = both or (None, None)
    if spec.device == "cpu":
        _default_malloc()


def measure_other_engine(model: Any, spec: BenchSpec, seconds: float, out: dict[str, Any]) -> None:
    """The decode curve of the generation engine the plan does not use (TRL's other path without vLLM), within
    ``seconds``: last, since the plan does not need it."""
    engine = "continuous" if spec.engine == "generate" else "generate"
    name = f"decode ({'continuous batching' if engine == 'continuous' else 'transformers generate'})"
    if engine == "continuous" and not hasattr(model, "generate_batch"):
        out["failed"].append(f"{name}: this transformers has no generate_batch")
    elif _started(out, Budget(seconds), name, other_engine_need(engine)):
        _guarded(out, name, lambda: measure_decode(model, spec, Budget(seconds), engine, out))


def other_engine_need(engine: str) -> float:
    """Seconds the other engine's phase needs before it starts: continuous batching's cold first call and its first
    point (a phase that could not reach its first point would spend its time for nothing, and past the budget); 15 s
    for generate, whose cold call is its decode alone."""
    if engine == "continuous":
        return CONTINUOUS_COLD_S + point_need(CONTINUOUS_COLD_S / LONG)
    return 15.0


def _started(out: dict[str, Any], budget: Budget, name: str, need: float) -> bool:
    if budget.fits(need):
        return True
    out["failed"].append(f"{name}: the budget is spent (needs ≈ {need:.0f} s; raise --minutes)")
    return False


def _guarded(out: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, or None with the reason recorded where it runs out of memory or the library cannot run it."""
    import torch

    try:
        return fn()
    except (torch.OutOfMemoryError, ImportError, TypeError, NotImplementedError, RuntimeError) as exc:
        out["failed"].append(f"{name}: not measured ({type(exc).__name__}: {exc})"[:300])
        if isinstance(exc, torch.OutOfMemoryError):
            torch.cuda.empty_cache()
        return None

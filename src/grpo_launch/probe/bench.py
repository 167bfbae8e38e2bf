"""``grpo-launch calibrate``'s measurements in its own process, on the first GPU it sees or on the CPU, of the work the
plan runs at its sizes, in the order the plan needs them, each within what is left of the budget:

1. the imports a trainer pays (torch, transformers, TRL): calibrate's process has imported none of them yet;
2. the model's load from disk: random weights are written to safetensors first (the write timed with fsync: the
   disk's speed for checkpoints), dropped from the page cache, then loaded as a trainer loads them;
3. decode seconds per step against batch size, from 1 up to the trainers' generation batch (or 256), through the
   generation engine the plan uses (transformers' ``generate`` with TRL's generation config, or its continuous
   batching): each point the difference of two generations of different lengths at the mean context, so the prompt
   pass and the call's own cost cancel; the first generation at the plan's batch timed cold, for its warm-up;
4. one training step at the plan's micro-batch and sequence length as GRPOTrainer runs it (TRL's fused LM head, the
   plan's activation checkpointing and precision), the first one cold, for its warm-up;
5. a prompt pass, a forward alone (TRL's old log-probs), the activation memory of one micro-batch (against the
   memory model), the other checkpointing setting; last, once calibrate's other measurements are done, the other
   engine (:func:`measure_other_engine`).

A phase whose expected cost no longer fits is not started, and is named with the reason. vLLM's decode and start-up
(:mod:`.bench_vllm`), the weight sync (:mod:`.bench_sync`) and the distributed engines (:mod:`.bench_backend`) run in
subprocesses that calibrate starts. Needs torch and transformers (the trainers' environment); imported only by
``calibrate``."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

from grpo_launch.spec import frozen


@frozen
class BenchSpec:
    """What to measure: the model (a local path, or its config alone with ``random_weights``), the shapes the
    plan uses, the dtype, the device ("cpu" or "cuda") and the threads per process on CPU; the trainers' generation
    batch (``generation_batch``: sequences each decodes at once), the engine the plan generates with ("generate" or
    "continuous"), TRL's sampling settings (``sampling``: temperature, top_p, top_k, min_p, repetition_penalty), the
    plan's activation checkpointing and the trainers' weight dtype (``train_dtype``; bf16 autocast when it is
    float32 and ``autocast``)."""

    model: str
    prompt_len: int
    completion_len: int
    per_device: int
    dtype: str  # "float32" or "bfloat16": the weights calibrate decodes with
    device: str
    threads: int
    random_weights: bool
    seconds: float  # what this process may spend
    generation_batch: int = 0  # 0: the micro-batch
    engine: str = "generate"
    sampling: tuple[tuple[str, Any], ...] = ()
    checkpointing: bool = False
    train_dtype: str = ""  # "": dtype
    autocast: bool = False
    old_logprobs: bool = True
    weights_dir: str = ""  # where random weights are written for the load from disk ("": not written)


class Budget:
    """The time left, and whether a phase that is expected to take ``need`` seconds still fits."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def fits(self, need: float) -> bool:
        return need <= self.left()


Report = Callable[[str], None]


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def amp(spec: BenchSpec) -> Any:
    """bf16 autocast where the trainers run float32 weights under it (accelerate wraps the model's forward in it,
    and TRL generates through that forward); else nothing."""
    import torch

    return torch.autocast(spec.device, dtype=torch.bfloat16) if spec.autocast else contextlib.nullcontext()


def _dtype(name: str) -> Any:
    import torch

    return torch.bfloat16 if name == "bfloat16" else torch.float32


def _ids(model: Any, batch: int, length: int, device: str) -> Any:
    import torch

    vocab = int(model.config.vocab_size)
    return torch.randint(3, max(4, vocab - 1), (batch, length), device=device)


def _timed(fn: Callable[[], None], device: str, deadline: float, *, at_least: int = 1, at_most: int = 5) -> float:
    """The median seconds of ``fn`` after one warm-up run, repeated until ``deadline`` (at least ``at_least``)."""
    fn()  # warm-up: allocator, kernels, thread pools
    return _median(fn, device, deadline, at_least=at_least, at_most=at_most)


def _median(fn: Callable[[], None], device: str, deadline: float, *, at_least: int = 1, at_most: int = 5) -> float:
    runs: list[float] = []
    while len(runs) < at_most and (len(runs) < at_least or time.monotonic() < deadline):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        runs.append(time.perf_counter() - t0)
    runs.sort()
    return runs[len(runs) // 2]


def decode_batches(generation_batch: int) -> list[int]:
    """The batch sizes decode is measured at: powers of two from 1 up to the trainers' generation batch (capped at
    256), and that batch itself."""
    top = max(1, min(256, generation_batch))
    out, b = [], 1
    while b < top:
        out.append(b)
        b *= 2
    return [*out, top]


SHORT, LONG = 4, 20  # new tokens of the two generations whose difference is a decode step's time
# The first generate_batch (TRL's continuous batching) of the tiny CPU recipe on 2 cores, LONG tokens at batch 4: 14 s
# and 15.6 s in two `calibrate --minutes 1` runs (the needs they printed after it, 34 s and 38 s, are
# point_need(cold / LONG)), its set-up, not its decode (2.8 ms a step through generate). The other engine's phase is
# started only where this and its first point fit; tests/test_calibrate.py measures it against this.
CONTINUOUS_COLD_S = 14.0


def point_need(step_s: float) -> float:
    """Seconds one decode point is expected to take at ``step_s`` a decode step: a long and a short generation, each
    timed up to twice (the median's first runs)."""
    return 2 * (SHORT + LONG) * step_s + 0.5


def _generator(model: Any, spec: BenchSpec, engine: str) -> Callable[[Any, int], None]:
    """One generation of ``n`` new tokens for a batch of prompt ids, as TRL 1.16 calls the engine: ``generate`` with
    TRL's generation config (trl/trainer/grpo_trainer.py: sampling, the recipe's temperature, top_p, top_k, min_p,
    repetition_penalty, no compile), forced to ``n`` tokens; or ``generate_batch`` (continuous batching)."""
    import torch
    from transformers import GenerationConfig

    sampling = dict(spec.sampling)
    base = dict(do_sample=True, pad_token_id=0, disable_compile=True, **sampling)
    if engine == "continuous":
        from transformers.generation import ContinuousBatchingConfig

        cb = ContinuousBatchingConfig(max_memory_percent=0.5)  # TRL's training-aware default

        def run_cb(ids: Any, n: int) -> None:
            config = GenerationConfig(max_new_tokens=n, eos_token_id=None, **base)
            with amp(spec):
                model.generate_batch(
                    [row.tolist() for row in ids],
                    generation_config=config,
                    continuous_batching_config=cb,
                    progress_bar=False,
                )

        return run_cb

    def run(ids: Any, n: int) -> None:
        config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, eos_token_id=None, **base)
        with torch.no_grad(), amp(spec):
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)

    return run


def measure_decode(model: Any, spec: BenchSpec, budget: Budget, engine: str, out: dict[str, Any]) -> None:
    """Seconds per decode step against batch size (``out[engine]``), the plan's batch first: its first generation
    cold (``warmup_decode_s_per_step``: its extra per step over a warm one), then the others from 1 up, while the
    next point's expected cost fits the budget."""
    model.eval()
    context = min(spec.prompt_len + spec.completion_len // 2, _max_positions(model) - LONG - 1)
    run = _generator(model, spec, engine)
    batches = decode_batches(spec.generation_batch or spec.per_device)
    plan_batch = batches[-1]
    points: dict[int, float] = {}
    cold_ids = _ids(model, plan_batch, context, spec.device)
    _sync(spec.device)
    t0 = time.perf_counter()
    run(cold_ids, LONG)
    _sync(spec.device)
    cold = time.perf_counter() - t0
    for batch in [plan_batch, *batches[:-1]]:
        ids = cold_ids if batch == plan_batch else _ids(model, batch, context, spec.device)
        need = point_need(points.get(plan_batch) or cold / LONG)
        if not points and not budget.fits(need):
            out["failed"].append(f"decode ({engine}): the budget is spent (needs ≈ {need:.0f} s; raise --minutes)")
            return
        if points and not budget.fits(need):
            left = ", ".join(str(b) for b in batches if b not in points)
            out["failed"].append(f"decode ({engine}) at batch {left}: the budget is spent (raise --minutes)")
            break
        deadline = time.monotonic() + min(budget.left(), need)
        long_s = _median(functools.partial(run, ids, LONG), spec.device, deadline, at_least=1, at_most=3)
        short_s = _median(functools.partial(run, ids, SHORT), spec.device, deadline, at_least=1, at_most=3)
        points[batch] = max(1e-6, (long_s - short_s) / (LONG - SHORT))
        if batch == plan_batch and engine == spec.engine:
            out["warmup_decode_s_per_step"] = max(0.0, (cold - long_s) / LONG)
    out["decode" if engine == "generate" else "continuous"] = sorted(points.items())


def _max_positions(model: Any) -> int:
    return int(getattr(model.config, "max_position_embeddings", 0) or 1 << 20)


def measure_prefill(model: Any, spec: BenchSpec, deadline: float) -> float:
    import torch

    ids = _ids(model, max(1, spec.per_device), spec.prompt_len, spec.device)

    def run() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    return _timed(run, spec.device, deadline)


def _fused(model: Any) -> None:
    """TRL's fused LM head on the model (GRPOTrainer adds it: per-token log-probs without the whole logits)."""
    from trl.trainer.utils import add_fused_lm_head

    if not getattr(model, "_grpo_launch_fused_head", False):
        add_fused_lm_head(model, outputs=("log_probs", "entropy"))
        model._grpo_launch_fused_head = True


def _checkpointing(model: Any, on: bool) -> None:
    """Activation checkpointing on or off, by transformers' own switch (renamed in transformers 5.2x)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        if on:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_disable()


def grpo_batch(model: Any, spec: BenchSpec) -> tuple[Any, Any, Any]:
    """A micro-batch as GRPOTrainer trains on it: left-padded prompts, scored on the completion tokens."""
    import torch

    batch, seq = max(1, spec.per_device), spec.prompt_len + spec.completion_len
    ids = _ids(model, batch, seq, spec.device)
    mask = torch.ones_like(ids)
    mask[0, : spec.prompt_len // 4] = 0  # a left-padded prompt: GRPO's batches carry a padding mask
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, : seq - spec.completion_len] = -100
    return ids, mask, labels


def training_step(model: Any, spec: BenchSpec) -> Callable[[], None]:
    """One optimizer step on one micro-batch as GRPOTrainer runs it: TRL's fused LM head, AdamW, bf16 autocast over
    float32 weights where the trainers train so (DDP and FSDP's master weights)."""
    import torch

    _fused(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids, mask, labels = grpo_batch(model, spec)

    def step() -> None:
        with amp(spec):
            out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        (-out.log_probs.sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure_train(
    model: Any, spec: BenchSpec, deadline: float, *, checkpointing: bool, out: dict[str, Any] | None = None
) -> float:
    """Tokens per second through one optimizer step on one micro-batch (:func:`training_step`); with ``out``, the
    first step's warm-up over a warm one too (``warmup_training_s``)."""
    _checkpointing(model, checkpointing)
    step = training_step(model, spec)
    _sync(spec.device)
    t0 = time.perf_counter()
    step()
    _sync(spec.device)
    cold = time.perf_counter() - t0
    seconds = _median(step, spec.device, deadline)
    if out is not None:
        out["warmup_training_s"] = max(0.0, cold - seconds)
    _checkpointing(model, False)
    return max(1, spec.per_device) * (spec.prompt_len + spec.completion_len) / seconds


def measure_forward(model: Any, spec: BenchSpec, deadline: float) -> float:
    """Tokens per second through a forward alone at the micro-batch (TRL's old-log-prob pass, its fused head)."""
    import torch

    _fused(model)
    model.eval()
    ids, mask, labels = grpo_batch(model, spec)

    def run() -> None:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)

    return max(1, spec.per_device) * (spec.prompt_len + spec.completion_len) / _timed(run, spec.device, deadline)

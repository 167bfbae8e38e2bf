"""``grpo-launch calibrate``'s microbenchmarks, run in this process on the first GPU it sees, or on the CPU: model
load, decode seconds per step against batch size at the recipe's completion length (transformers' generate, the
path TRL takes without vLLM), a prompt pass, one optimizer step's forward/backward at the planned micro-batch and
sequence length with and without activation checkpointing, a forward alone (TRL's old log-probs), the peak memory,
and one micro-batch's activation memory as GRPOTrainer runs it (against the memory model's terms). vLLM's own decode
and start-up are measured in its Python by :mod:`grpo_launch.probe.bench_vllm`, the weight sync by
:mod:`grpo_launch.probe.bench_sync`.

Each phase stops at its deadline (``Budget``): a phase that runs out keeps what it measured so far.
Needs torch and transformers (the trainers' environment); imported only by ``calibrate``."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from typing import Any

from grpo_launch.spec import frozen


@frozen
class BenchSpec:
    """What to measure: the model (a local path, or its config alone with ``random_weights``), the shapes the
    plan uses, the dtype, the device ("cpu" or "cuda") and the threads per process on CPU."""

    model: str
    prompt_len: int
    completion_len: int
    per_device: int
    dtype: str  # "float32" or "bfloat16"
    device: str
    threads: int
    random_weights: bool
    seconds: float  # the whole budget


class Budget:
    """One deadline per phase: an equal share of what is left, so a slow phase cannot starve the later ones."""

    def __init__(self, seconds: float, phases: int) -> None:
        self.end, self.left = time.monotonic() + seconds, phases

    def phase(self) -> float:
        """The deadline of the next phase (monotonic seconds)."""
        now = time.monotonic()
        share = max(0.0, self.end - now) / max(1, self.left)
        self.left -= 1
        return now + share


Report = Callable[[str], None]


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def load_model(spec: BenchSpec) -> tuple[Any, float]:
    """The model on its device, and the seconds the load took (from the config alone: random weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.bfloat16 if spec.dtype == "bfloat16" else torch.float32
    t0 = time.perf_counter()
    if spec.random_weights:
        config = AutoConfig.from_pretrained(spec.model)
        model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(spec.model, torch_dtype=dtype)
    model.to(spec.device)
    _sync(spec.device)
    return model, time.perf_counter() - t0


def _ids(model: Any, batch: int, length: int, device: str) -> Any:
    import torch

    vocab = int(model.config.vocab_size)
    return torch.randint(3, max(4, vocab - 1), (batch, length), device=device)


def _timed(fn: Callable[[], None], device: str, deadline: float, *, at_least: int = 1, at_most: int = 5) -> float:
    """The median seconds of ``fn`` after one warm-up run, repeated until ``deadline`` (at least ``at_least``)."""
    fn()  # warm-up: allocator, kernels, thread pools
    runs: list[float] = []
    while len(runs) < at_most and (len(runs) < at_least or time.monotonic() < deadline):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        runs.append(time.perf_counter() - t0)
    runs.sort()
    return runs[len(runs) // 2]


def decode_batches(per_device: int) -> list[int]:
    """The batch sizes decode is measured at: 1, the planned micro-batch, and twice it."""
    return sorted({1, max(1, per_device), 2 * max(1, per_device)})


def measure_prefill(model: Any, spec: BenchSpec, deadline: float) -> float:
    import torch

    ids = _ids(model, max(1, spec.per_device), spec.prompt_len, spec.device)

    def run() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    return _timed(run, spec.device, deadline)


def measure_decode(model: Any, spec: BenchSpec, deadline: float, prefill_s: float) -> list[tuple[int, float]]:
    """Seconds per decode step at each batch: transformers' generate, sampling, forced to the full completion
    length (min_new_tokens), less one prompt pass, over the completion length."""
    import torch

    model.eval()
    out: list[tuple[int, float]] = []
    for batch in decode_batches(spec.per_device):
        if out and time.monotonic() > deadline:
            break
        ids = _ids(model, batch, spec.prompt_len, spec.device)
        n = spec.completion_len

        def run(ids: Any = ids, n: int = n) -> None:
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=n,
                               min_new_tokens=n, pad_token_id=0, eos_token_id=None)  # fmt: skip

        seconds = _timed(run, spec.device, deadline, at_most=3)
        out.append((batch, max(1e-6, (seconds - prefill_s * batch / max(1, spec.per_device)) / n)))
    return out


def measure_train(model: Any, spec: BenchSpec, deadline: float, *, checkpointing: bool) -> float:
    """Tokens per second through one optimizer step (forward, backward, AdamW) on one micro-batch."""
    import torch

    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batch, seq = max(1, spec.per_device), spec.prompt_len + spec.completion_len
    ids = _ids(model, batch, seq, spec.device)

    def run() -> None:
        logits = model(input_ids=ids).logits
        # GRPO's loss reads the completion tokens' log-probs: a log-softmax over the completion positions
        logp = torch.log_softmax(logits[:, -spec.completion_len - 1 : -1].float(), dim=-1)
        loss = -logp.gather(-1, ids[:, -spec.completion_len :, None]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    seconds = _timed(run, spec.device, deadline)
    model.gradient_checkpointing_disable()
    return batch * seq / seconds


def measure_forward(model: Any, spec: BenchSpec, deadline: float) -> float:
    """Tokens per second through a forward alone at the micro-batch (TRL's old-log-prob pass)."""
    import torch

    model.eval()
    batch, seq = max(1, spec.per_device), spec.prompt_len + spec.completion_len
    ids = _ids(model, batch, seq, spec.device)

    def run() -> None:
        with torch.no_grad():
            torch.log_softmax(model(input_ids=ids).logits[:, -spec.completion_len - 1 : -1].float(), dim=-1)

    return batch * seq / _timed(run, spec.device, deadline)


def peak_memory(device: str) -> tuple[int, str]:
    """The peak: CUDA's max allocated, or on CPU this process's resident set (not what the GPU model counts)."""
    import torch

    if device == "cuda":
        return int(torch.cuda.max_memory_allocated()), "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss_max"


def measure_activation_peak(model: Any, spec: BenchSpec, *, checkpointing: bool) -> tuple[int, int] | None:
    """(The memory one micro-batch's forward and backward take above what the process holds before it, the
    process's whole peak during them with the weights, gradients and AdamW's moments held: the training step's
    peak as the memory model's tensors count it), run as
    GRPOTrainer runs it (TRL's fused LM head, ``trl.trainer.utils.add_fused_lm_head``; a left-padded batch scored on
    its completion tokens; after a first step, so the gradients are allocated): what the memory model's
    activation terms count (planning/cost/activations.py). CUDA: the allocator's peak above its allocated bytes.
    CPU: the resident set's high-water mark above the resident set, with large allocations sent straight to mmap
    (glibc's M_MMAP_THRESHOLD at 64 KiB) so a freed tensor leaves at once; None where that cannot be read (no
    glibc, no /proc). Called last: the fused head stays on the model."""
    import gc

    import torch
    from trl.trainer.utils import add_fused_lm_head

    if spec.device == "cpu" and not _cpu_peak_readable():
        return None
    if not getattr(model, "_grpo_launch_fused_head", False):
        add_fused_lm_head(model, outputs=("log_probs", "entropy"))
        model._grpo_launch_fused_head = True
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    batch, seq = max(1, spec.per_device), spec.prompt_len + spec.completion_len
    ids = _ids(model, batch, seq, spec.device)
    mask = torch.ones_like(ids)
    mask[0, : spec.prompt_len // 4] = 0  # a left-padded prompt: GRPO's batches carry a padding mask
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, : seq - spec.completion_len] = -100

    def step() -> Any:
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        (-out.log_probs.sum()).backward()
        return out

    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    step()  # warm-up: the gradients allocated (as after a first step), one-time workspaces made
    opt.step()  # AdamW's two moments allocated, as a training process holds them during every later step
    model.zero_grad(set_to_none=False)
    gc.collect()
    if spec.device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_high_water_mark()
        base = resident_bytes()
    out = step()
    if spec.device == "cuda":
        torch.cuda.synchronize()
        whole = torch.cuda.max_memory_allocated()
    else:
        whole = high_water_mark()
    del out, opt
    model.zero_grad(set_to_none=False)
    model.gradient_checkpointing_disable()
    return max(0, int(whole - base)), int(whole)


M_MMAP_THRESHOLD = -3  # glibc malloc.h


def _cpu_peak_readable() -> bool:
    """Large allocations straight to mmap, and the high-water mark resettable (Linux's /proc, glibc's mallopt)."""
    import ctypes
    import ctypes.util

    try:
        reset_high_water_mark()
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 65536))
    except (OSError, AttributeError):
        return False


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def high_water_mark() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def reset_high_water_mark() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux Documentation/filesystems/proc.rst: 5 resets the peak resident set size


PHASES = ("model load", "prefill", "decode", "training step", "training step (checkpointing)", "forward",
          "activation peak")  # fmt: skip


def run_bench(spec: BenchSpec, report: Report) -> dict[str, Any]:
    """Every phase in order under one budget; the measured values by name. ``report(phase)`` before each."""
    import torch

    if spec.device == "cpu":
        torch.set_num_threads(max(1, spec.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)
    budget = Budget(spec.seconds, len(PHASES) - 1)  # the activation peak: one step each, untimed
    report(PHASES[0])
    budget.phase()
    model, load_s = load_model(spec)
    report(PHASES[1])
    prefill = measure_prefill(model, spec, budget.phase())
    report(PHASES[2])
    decode = measure_decode(model, spec, budget.phase(), prefill)
    out: dict[str, Any] = {"load_s": load_s, "prefill_s": prefill, "decode": decode, "failed": []}
    for i, (name, ckpt) in enumerate((("train_tokens_per_s", False), ("train_tokens_per_s_ckpt", True)), start=3):
        report(PHASES[i])
        _reset_peak(spec.device)
        try:
            out[name] = measure_train(model, spec, budget.phase(), checkpointing=ckpt)
        except torch.OutOfMemoryError as exc:  # a model too large for one GPU at this micro-batch: said, not fatal
            out[name] = 0.0
            out["failed"].append(f"{PHASES[i]}: out of memory at micro-batch {spec.per_device} ({exc})"[:300])
        out[name.replace("train_tokens_per_s", "peak_memory_bytes")], kind = peak_memory(spec.device)
    report(PHASES[5])
    out["forward_tokens_per_s"] = measure_forward(model, spec, budget.phase())
    out["memory_kind"] = kind
    report(PHASES[6])
    for suffix, ckpt in (("", False), ("_ckpt", True)):
        name = "activation_peak_bytes" + suffix
        try:
            both = measure_activation_peak(model, spec, checkpointing=ckpt)
            out[name], out["step_peak_bytes" + suffix] = both if both is not None else (None, None)
        except (torch.OutOfMemoryError, ImportError, TypeError) as exc:  # TypeError: no fused head in this TRL
            out[name] = None
            out["failed"].append(f"{PHASES[6]}: not measured ({type(exc).__name__}: {exc})"[:300])
    return out


def _reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

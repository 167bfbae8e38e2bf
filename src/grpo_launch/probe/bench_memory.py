"""``grpo-launch calibrate``'s memory measurements: the training step's peak (CUDA's max allocated; on a CPU the
resident set), and one micro-batch's activation memory as GRPOTrainer runs it, against the memory model's terms. On
a CPU a resident set grows only where the heap has not grown before: large allocations are sent straight to mmap
(glibc's M_MMAP_THRESHOLD) while it is measured, so a freed tensor leaves at once. Needs torch; imported only by
``calibrate`` and the conformance measurements."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import resource
from typing import Any

from grpo_launch.probe.bench import BenchSpec, _checkpointing, _fused, grpo_batch


def peak_memory(device: str) -> tuple[int, str]:
    """The peak: CUDA's max allocated, or on CPU this process's resident set (not what the GPU model counts)."""
    import torch

    if device == "cuda":
        return int(torch.cuda.max_memory_allocated()), "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss_max"


def measure_activation_peak(model: Any, spec: BenchSpec, *, checkpointing: bool) -> tuple[int, int] | None:
    """(The memory one micro-batch's forward and backward take above what the process holds before it, the
    process's whole peak during them with the weights, gradients and AdamW's moments held: the training step's
    peak as the memory model's tensors count it), run as GRPOTrainer runs it (TRL's fused LM head, a left-padded
    batch scored on its completion tokens; after a first step, so the gradients are allocated), at the weights'
    own dtype: what the memory model's activation terms count (planning/cost/activations.py). CUDA: the
    allocator's peak above its allocated bytes. CPU: the resident set's high-water mark above the resident set,
    with large allocations sent straight to mmap (glibc's M_MMAP_THRESHOLD at 64 KiB) so a freed tensor leaves at
    once; None where that cannot be read (no glibc, no /proc)."""
    import torch

    if spec.device == "cpu" and not _cpu_peak_readable():
        return None
    _fused(model)
    model.train()
    _checkpointing(model, checkpointing)
    ids, mask, labels = grpo_batch(model, spec)

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
    model.zero_grad(set_to_none=True)
    _checkpointing(model, False)
    return max(0, int(whole - base)), int(whole)


M_MMAP_THRESHOLD = -3  # glibc malloc.h


def _cpu_peak_readable() -> bool:
    """Large allocations straight to mmap, and the high-water mark resettable (Linux's /proc, glibc's mallopt)."""
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


def _default_malloc() -> None:
    """glibc's mmap threshold where a trainer's settles: its dynamic threshold rises with each large block freed, to
    at most 32 MiB on 64-bit systems (malloc.h DEFAULT_MMAP_THRESHOLD_MAX); below that every step's tensors would be
    mapped and faulted in afresh, and the timed phases would run slower than a trainer."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt(M_MMAP_THRESHOLD, 32 * 2**20)

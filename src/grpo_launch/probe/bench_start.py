"""``grpo-launch calibrate``'s measurements of a trainer's start: the imports it pays before it builds anything,
and the model's load from disk (random weights written to safetensors first, the write timed with fsync: the disk's
speed for checkpoints; then dropped from the page cache and loaded back cold). Needs torch and transformers;
imported only by ``calibrate``."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from grpo_launch.probe.bench import BenchSpec, _dtype, _sync


def measure_imports() -> float:
    """Seconds to import what a trainer imports before it builds anything (0 when already imported here)."""
    if "trl" in sys.modules:
        return 0.0
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from trl import GRPOTrainer  # noqa: F401

    return time.perf_counter() - t0


def measure_cuda_init(device: str) -> float | None:
    """Seconds to start the CUDA context and place a first tensor, as a trainer does before its model moves to its
    GPU (None on a CPU)."""
    if device != "cuda":
        return None
    import torch

    t0 = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def load_model(spec: BenchSpec, out: dict[str, Any]) -> Any:
    """The model on its device. Random weights are written to ``spec.weights_dir`` first (the write's speed, with
    fsync, recorded) and loaded back from disk cold; real weights are loaded from where they are. The load's seconds
    and bytes are recorded (``load_bytes`` 0: random weights not written, an initialisation)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = _dtype(spec.dtype)
    path = spec.model
    if spec.random_weights:
        config = AutoConfig.from_pretrained(spec.model)
        with torch.device(spec.device):  # initialised where it runs: on a CPU a 1.5B model's init takes a minute
            init: Any = AutoModelForCausalLM.from_config(config, dtype=dtype)
        if not spec.weights_dir:
            out.update(load_s=None, load_bytes=0)
            return init.to(spec.device)
        t0 = time.perf_counter()
        init.save_pretrained(spec.weights_dir)
        written = _flush(spec.weights_dir, drop=True)
        out["save_bytes_per_s"] = written / max(1e-9, time.perf_counter() - t0)
        del init
        path = spec.weights_dir
    t0 = time.perf_counter()
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.to(spec.device)
    _sync(spec.device)
    out.update(load_s=time.perf_counter() - t0, load_bytes=_weight_bytes(path))
    torch.manual_seed(0)
    return model


def _flush(folder: str, *, drop: bool) -> int:
    """fsync every file of ``folder`` (the bytes on the disk, as a checkpoint's save must be), then drop them from
    the page cache (``drop``) so the load reads the disk; the bytes written."""
    total = 0
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.fsync(fd)
            total += os.fstat(fd).st_size
            if drop and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return total


def _weight_bytes(path: str) -> int:
    if not os.path.isdir(path):
        return 0
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith((".safetensors", ".bin")))

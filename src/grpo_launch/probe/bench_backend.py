"""``grpo-launch calibrate``'s training step through a distributed engine, in a process of its own (``python -m
grpo_launch.probe.bench_backend JSON``): DeepSpeed ZeRO-2 or ZeRO-3 (``deepspeed.initialize`` with the optimizer the
Trainer hands it: torch's AdamW) or FSDP2 (``fully_shard`` on each decoder layer and the model, as accelerate's
FSDP2 plugin wraps it), at world size 1 on the first GPU (NCCL) or the CPU (gloo), the process group over a file
store in a temporary directory (nothing listens). The step is GRPOTrainer's (:func:`grpo_launch.probe.bench
.training_step`: TRL's fused LM head, the plan's activation checkpointing). At world size 1 a ZeRO-3 gather moves no
bytes: what it measures is the engine's own cost per layer, which dominates a small model.

Prints one JSON line: the engine's start (``init_s``) and tokens per second. :func:`measure_backend` runs it with a
timeout and kills its session on expiry."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Any

from grpo_launch.probe.bench import BenchSpec, _checkpointing, _fused, _median, _sync, grpo_batch, training_step
from grpo_launch.probe.bench_child import json_child


def measure_backend(job: dict[str, Any], seconds: float) -> tuple[dict[str, Any] | None, str]:
    """(the report, or None with why) of one engine's measurement in its own process, within ``seconds``."""
    with tempfile.TemporaryDirectory(prefix="grpo-calibrate-backend-") as tmp:
        # a rank as torchrun starts one (DeepSpeed reads LOCAL_RANK); the process group itself uses a file store
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_SOCKET_IFNAME": "lo",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
        }
        return json_child([sys.executable, "-m", __name__, json.dumps({**job, "store": f"{tmp}/store"})], env, seconds)


def _run(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    spec = BenchSpec(**job["spec"])
    device = spec.device
    if device == "cpu":
        torch.set_num_threads(max(1, spec.threads))
    else:
        torch.cuda.set_device(0)
    t0 = time.perf_counter()
    dist.init_process_group(
        "gloo" if device == "cpu" else "nccl", init_method=f"file://{job['store']}", rank=0, world_size=1
    )
    torch.distributed.barrier()  # NCCL starts its communicator at the first collective
    group_s = time.perf_counter() - t0
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.float32 if (spec.train_dtype or spec.dtype) == "float32" else torch.bfloat16
    if spec.random_weights:
        with torch.device(device):  # initialised where it trains: a CPU initialises a large model slowly
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(spec.model), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(spec.model, dtype=dtype)
    _checkpointing(model, spec.checkpointing)
    backend = job["backend"]
    t0 = time.perf_counter()
    step = _deepspeed(model, spec, int(backend[-1])) if backend.startswith("zero") else _fsdp2(model, spec)
    _sync(device)
    init_s = time.perf_counter() - t0
    step()  # the first step: warm-up
    seconds = _median(step, device, time.monotonic() + job.get("seconds", 10.0), at_least=2, at_most=4)
    dist.destroy_process_group()
    tokens = max(1, spec.per_device) * (spec.prompt_len + spec.completion_len)
    return {
        "backend": backend,
        "checkpointing": spec.checkpointing,
        "tokens_per_s": tokens / seconds,
        "init_s": init_s,
        "process_group_s": group_s,
    }


def _deepspeed(model: Any, spec: Any, stage: int) -> Any:
    """ZeRO-``stage`` as the Trainer runs it through accelerate: DeepSpeed's engine around the model, with the
    optimizer the Trainer builds (torch's AdamW: DeepSpeed's fused one would compile CUDA code here)."""
    import deepspeed
    import torch

    _fused(model)
    bf16 = spec.device == "cuda" and (spec.autocast or spec.dtype == "bfloat16")
    config = {
        "train_micro_batch_size_per_gpu": max(1, spec.per_device),
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": bf16},
        "gradient_clipping": 1.0,
    }
    model = model.to(spec.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    ids, mask, labels = grpo_batch(model, spec)

    def step() -> None:
        out = engine(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        engine.backward(-out.log_probs.sum())
        engine.step()

    return step


def _fsdp2(model: Any, spec: Any) -> Any:
    """FSDP2 as accelerate's plugin wraps a transformers model: ``fully_shard`` on each decoder layer, then on the
    model, bf16 compute over float32 master weights (MixedPrecisionPolicy)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _fused(model)
    model = model.to(spec.device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if spec.autocast else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return training_step(model, dataclasses.replace(spec, autocast=False))  # FSDP2 casts itself


def main(argv: list[str]) -> int:
    print(json.dumps(_run(json.loads(argv[0]))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

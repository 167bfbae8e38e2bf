"""Time to first step: what a run pays before its first optimizer step, and again on every restart. The vLLM
server gets ready (model load, torch.compile, CUDA graphs) while the trainers load the model and start DeepSpeed
and their communicators; colocated engines start inside the trainers, after them. Then the first weight sync.
Each constant's source is in constants.py (``vllm_ready_s_*``, ``load_bytes_per_s``, ``deepspeed_init_s``,
``nccl_init_s_*``). Pure."""

from __future__ import annotations

import itertools
import math

from grpo_launch.enums import VllmMode
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import CONSTANTS
from grpo_launch.planning.cost.steptime import sync_time

# (parameters, seconds) the vLLM ready time is interpolated between (log-linear in the parameters)
_READY = ((1.5e9, "vllm_ready_s_1_5b"), (7e9, "vllm_ready_s_7b"), (70e9, "vllm_ready_s_70b"))


def _c(name: str) -> float:
    return CONSTANTS[name].value


def vllm_ready_s(params: float) -> float:
    """Seconds until a vLLM engine of ``params`` parameters answers, from the published start-up times."""
    points = [(math.log(p), _c(k)) for p, k in _READY]
    x = math.log(max(params, 1.0))
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


def startup_time(
    model: ModelShape, mode: VllmMode, *, deepspeed: bool, machines: int, sync_across_nodes: bool
) -> tuple[float, list[str]]:
    """Seconds to the first optimizer step's start, and the arithmetic: the trainers on ``machines`` hosts (with
    DeepSpeed's start when ``deepspeed``), vLLM in ``mode``, the first weight sync (between hosts when
    ``sync_across_nodes``)."""
    load = model.weight_bytes_bf16 / _c("load_bytes_per_s")
    ds = _c("deepspeed_init_s") if deepspeed else 0.0
    nccl = _c("nccl_init_s_nodes") if machines > 1 else _c("nccl_init_s_node")
    trainers = load + ds + nccl
    parts = f"trainers: load {load:.0f} s" + (f" + DeepSpeed {ds:.0f} s" if ds else "") + f" + NCCL {nccl:.0f} s"
    if mode == VllmMode.OFF:
        return trainers, [f"time to first step ≈ {trainers:.0f} s ({parts})"]
    ready = vllm_ready_s(model.params)
    if mode == VllmMode.COLOCATE:  # the engines start in the trainers, once they are up
        total = trainers + ready
        return total, [f"time to first step ≈ {total:.0f} s ({parts}, then colocated vLLM ready {ready:.0f} s)"]
    sync = sync_time(model, across_nodes=sync_across_nodes)
    total = max(ready, trainers) + _c("nccl_init_s_node") + sync
    return total, [
        f"time to first step ≈ {total:.0f} s: max(vLLM server ready {ready:.0f} s, {parts}) + the weight-sync "
        f"group {_c('nccl_init_s_node'):.0f} s + first sync {sync:.1f} s"
    ]

"""The arithmetic behind a refusal (``plan --explain``): the training budget and the nearest settings tried, term
by term; why not one sequence's KV cache fits beside vLLM's weights. Pure."""

from __future__ import annotations

from grpo_launch.enums import DistBackend, Offload
from grpo_launch.machines.gpus import GIB
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import HEADROOM, HOST_HEADROOM, VLLM_OVERHEAD_BYTES, VLLM_UTILIZATION_MARGIN
from grpo_launch.planning.cost.memory import TrainMemory, margin_lines
from grpo_launch.planning.parallel_and_batch import Parallelism

Setting = tuple[DistBackend, Offload, bool]  # (backend, offload, gradient checkpointing)


def setting_label(setting: Setting) -> str:
    b, o, c = setting
    return str(b) + ("" if o == Offload.NONE else f" + offload {o}") + (" + gradient checkpointing" if c else "")


def training_explain(
    tried: list[tuple[Setting, TrainMemory, float]],
    mem: int,
    share: float,
    budget: float,
    host_ram: int | None,
    n: int = 1,
) -> list[str]:
    """The training budget, then the settings tried nearest to fitting first, each term by term."""
    head = f"budget per training GPU: {HEADROOM:.0%} of {mem / GIB:.1f} GiB"
    if share:
        head += f" − the colocated vLLM's {share:.2f} × {mem / GIB:.1f} GiB"
    head += f" = {budget / GIB:.1f} GiB"
    if host_ram:
        head += f"; offload may use {HOST_HEADROOM:.0%} of {host_ram / GIB:.0f} GiB of host RAM per node"
    lines = [head, *margin_lines(n)]
    for setting, need, host in sorted(tried, key=lambda t: t[1].total)[:4]:
        over = need.total - budget
        verdict = "fits" if over <= 0 else f"over by {over / GIB:.1f} GiB"
        ram = f"; offload needs {host / GIB:.0f} GiB of host RAM per node" if host else ""
        lines.append(f"{setting_label(setting)}: {need.lines()[0]} ({verdict}){ram}")
    return lines


def vllm_explain(
    model: ModelShape, par: Parallelism, mem: int, seq_len: int, util: float, weights: float, need: float
) -> list[str]:
    """Why not one sequence's KV cache fits next to vLLM's weights (of ``par``) at ``util`` of a GPU of ``mem``
    bytes."""
    kv = model.kv_bytes_per_token_per_gpu(par.tp) * seq_len
    room = util * mem - weights - VLLM_OVERHEAD_BYTES
    spread = f"TP {par.tp}" + (f", experts over {par.dp} ranks" if par.ep else "")
    fit = max(room, 0) / kv if kv else 0.0
    return [
        f"vLLM memory per GPU: {util:.2f} × {mem / GIB:.1f} GiB = {util * mem / GIB:.1f} GiB − weights "
        f"{weights / GIB:.1f} GiB ({spread}) − {VLLM_OVERHEAD_BYTES / GIB:.1f} GiB CUDA graphs and activations = "
        f"{room / GIB:.2f} GiB for the KV cache",
        f"one {seq_len}-token sequence needs {kv / GIB:.2f} GiB of KV cache per GPU: {fit:.2f} sequences fit, at "
        "least 1 is needed",
        f"the smallest gpu_memory_utilization that holds one: {need:.2f} (with a {VLLM_UTILIZATION_MARGIN:.2f} margin)",
    ]

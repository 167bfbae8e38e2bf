"""vLLM's sizing, decided once (pure): the memory share it may use (``gpu_memory_utilization``: the colocated share
of each training GPU, or the server's) and how many sequences it decodes at once (``max_num_seqs``), from the KV
cache those sequences need (:func:`grpo_launch.planning.cost.memory.vllm_memory`)."""

from __future__ import annotations

import dataclasses

from grpo_launch.enums import VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.machines.gpus import GIB
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import VLLM_SERVER_UTILIZATION
from grpo_launch.planning.cost.memory import VllmMemory, vllm_memory, vllm_share_needed, vllm_weights
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.plan_types import Trace, VllmPlan
from grpo_launch.planning.refusal.explain import vllm_explain


def size_vllm(
    topology: Topology, model: ModelShape | None, vllm: VllmPlan, work: Workload, trace: Trace, n: int = 1
) -> tuple[VllmPlan, VllmMemory | None]:
    """max_num_seqs (and the colocated memory share) from the KV cache the concurrent sequences need; and the
    sizing itself, which the estimate reports."""
    mem = topology.min_gpu_memory_bytes
    if vllm.mode == VllmMode.OFF or model is None or mem is None:
        return vllm, None
    # The memory vLLM may use: the colocated share, or the server's --gpu-memory-utilization (launch setting or
    # vLLM's default); the server's value stays as planned, only the sequences are sized to it.
    share = vllm.gpu_memory_utilization if vllm.mode == VllmMode.COLOCATE else None
    limit = vllm.gpu_memory_utilization if vllm.mode == VllmMode.SERVER else None
    par = vllm.engines(n)
    sized = vllm_memory(model, par, mem, work, share=share, limit=limit)
    if sized is None:
        weights = vllm_weights(model, par)
        need = vllm_share_needed(model, par, mem, work.seq_len)
        fixes = [
            Fix("gpus", None, "more GPUs (a larger tensor-parallel size spreads the weights)", 3, in_recipe=False),
            Fix("launch.vllm", "off", "generate with transformers in the trainers; slow", rank=4),
        ]
        if need < VLLM_SERVER_UTILIZATION and (vllm.mode == VllmMode.COLOCATE or (share or limit or 0) < need):
            why = "leaves less for training" if vllm.mode == VllmMode.COLOCATE else "the weights need at least that"
            fixes.append(Fix("launch.vllm_gpu_memory_utilization", round(need, 2), why, 0))
        util = share or limit or VLLM_SERVER_UTILIZATION
        explain = vllm_explain(model, par, mem, work.seq_len, util, weights, need)
        raise PlanError(
            f"vLLM ({vllm.mode}) does not fit: {weights / GIB:.1f} GiB of weights per GPU leave no room for the KV "
            f"cache of one {work.seq_len}-token sequence at gpu_memory_utilization {util:.2f}",
            fixes=fixes,
            explain=explain,
        )
    trace.decide("vllm_max_num_seqs", sized.max_num_seqs, sized.lines(share)[0])  # colocated: the share it is given
    sized_plan = dataclasses.replace(
        vllm,
        max_num_seqs=sized.max_num_seqs,
        max_model_len=vllm.max_model_len or sized.max_model_len,
    )
    return sized_plan, sized

"""Step time: one optimizer step of TRL 1.16, which generates, computes the old log-probs, trains and syncs the
weights one after the other. Pure arithmetic on the cost model's constants (:mod:`.costmodel`).

- generation: prefill is compute-bound (2·P FLOPs per prompt token, one prompt per group thanks to prefix
  caching); decode is memory-bound: each decode step reads the weights and the batch's KV cache, on each of the
  DP replicas (TP GPUs each, at a bandwidth efficiency, slowed by TP all-reduces), plus a fixed scheduling and
  sampling cost per step whatever the model size. A decode batch runs as many steps as its longest completion;
- training: 6·P FLOPs per token forward + backward, +2·P with gradient checkpointing, +2·P for a reference model,
  at the GPU class's published MFU, over the padded micro-batches (each runs to its longest completion);
  offload adds its transfers (PCIe) and DeepSpeed's CPU Adam as time;
- old log-probs: TRL's extra forward pass (2·P per token) when it runs it;
- weight sync (server mode): bf16 weights broadcast to the server; colocate: vLLM sleep/wake and weight moves.

A previous run's calibration (``Workload.scale``) multiplies generation and training time.
"""

from __future__ import annotations

import math

from grpo_launch.enums import DistBackend, Offload
from grpo_launch.machines.gpus import GpuSpec
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import DECODE_BW_EFFICIENCY, DECODE_STEP_OVERHEAD_S, PREFILL_MFU, _c, train_mfu
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.parallel_and_batch import Parallelism
from grpo_launch.spec import frozen


def generation_time(
    model: ModelShape,
    gpu: GpuSpec,
    par: Parallelism,
    max_num_seqs: int,
    work: Workload,
    *,
    prompt_copies: int = 1,
    pp_across_nodes: bool = False,
) -> tuple[float, str]:
    """Seconds to generate one optimizer step's completions on ``par.dp`` replicas of TP ``par.tp`` (× PP
    ``par.pp``) GPUs, and the arithmetic. With ``par.ep`` (expert parallelism over all of them) each GPU reads its
    share of the experts the whole batch touches instead of its TP share of every replica's.

    ``prompt_copies``: on how many replicas each prompt is prefilled. vLLM's prefix cache (on by default) prefills
    a prompt once per engine whatever the number of its samples there, but a data-parallel server routes each sample
    on its own (:func:`server_prompt_copies`), so a prompt is prefilled on up to ``num_generations`` replicas.

    ``par.pp``: each replica is a pipeline of ``pp`` stages of TP GPUs. vLLM keeps ``pp`` micro-batches in flight
    (the engine's batch queue, vllm/v1/engine/core.py ``step_with_batch_queue``), so in one decode round every
    stage runs each micro-batch once: it reads its weights ``pp`` times (as much as one TP group reads the whole
    model), its layers' share of every sequence's KV cache, and sends each micro-batch's hidden states and residual
    to the next stage (:func:`p2p_time`, over the network when the stages are on different hosts). Prefill and the
    compute spread over all TP × PP GPUs. The fixed overhead is counted once per micro-batch (conservative: the
    batch queue overlaps some of it)."""
    tp, pp, replicas, ep = par.tp, par.pp, par.dp, par.ep
    flops = gpu.bf16_tflops * 1e12
    bw = gpu.bandwidth_tbs * 1e12 * DECODE_BW_EFFICIENCY
    prompts = work.completions / max(1, work.num_generations)
    active = model.active_params  # compute runs through the active parameters; memory holds them all
    prefill = 2 * active * prompts * prompt_copies * work.prompt_len / (replicas * tp * pp * flops * PREFILL_MFU)
    per_replica = math.ceil(work.completions / replicas)
    batches = math.ceil(per_replica / max(1, max_num_seqs))
    batch = min(per_replica, max_num_seqs)
    steps = work.longest_of(batch)
    avg_ctx = work.prompt_len + work.mean_completion_len / 2
    if ep:
        dense = 2.0 * (model.params - model.routed_params)
        weights = dense / tp + (model.decode_read_bytes(batch * replicas) - dense) / (tp * replicas)
    elif pp > 1:
        weights = pp * model.weight_bytes_per_gpu(tp, pp=pp)
    else:
        weights = model.decode_read_bytes(batch) / tp
    read = weights + batch * avg_ctx * model.kv_bytes_per_token_per_gpu(tp, pp)
    step_mem = read / bw
    step_compute = 2 * active * batch / (tp * pp * flops * PREFILL_MFU)
    # Two all-reduces per layer and decode step (after attention and after the MLP), of the batch's hidden states
    # (a stage's micro-batches together: all layers, the batch's states once).
    comm = 2 * model.layers * allreduce_time(tp, batch / pp * model.hidden * 2, nvlink=gpu.nvlink) if tp > 1 else 0.0
    if pp > 1:  # each micro-batch's hidden states and residual (bf16) to the next stage
        comm += pp * p2p_time(2 * batch / pp * model.hidden * 2, across_nodes=pp_across_nodes)
    decode = batches * steps * (max(step_mem, step_compute) + comm + pp * DECODE_STEP_OVERHEAD_S)
    scale = work.scale.generation
    why = (
        f"prefill 2·{active / 1e9:.2f}B·{prompts:.0f} prompts"
        + (f"×{prompt_copies} replicas" if prompt_copies > 1 else "")
        + f"·{work.prompt_len} tok / ({replicas}×{tp} GPU · "
        f"{gpu.bf16_tflops:.0f} TFLOP/s · {PREFILL_MFU:.0%}) = {prefill:.2f} s; decode {batches} batch(es) × "
        f"{steps:.0f} steps × ({max(step_mem, step_compute) * 1e3:.1f} ms "
        f"{'memory' if step_mem >= step_compute else 'compute'}-bound at batch {batch}"
        + (f" + {comm * 1e3:.2f} ms " + ("TP all-reduces" if pp == 1 else "stage hops and all-reduces") if comm else "")
        + (f" + {pp} micro-batches ×" if pp > 1 else " +")
        + f" {DECODE_STEP_OVERHEAD_S * 1e3:.0f} ms overhead) = {decode:.1f} s"
        + (f"; × {scale:.2f} measured" if scale != 1.0 else "")
    )
    return (prefill + decode) * scale, why


def allreduce_time(tp: int, nbytes: float, *, nvlink: bool = True) -> float:
    """Seconds of one tensor-parallel all-reduce of ``nbytes`` within a node: a fixed latency plus a cost per MiB
    (constants.py). With NVLink vLLM's custom all-reduce up to 1 MiB (the TP 8 figures beyond 8) and its
    size-dispatched two-shot / symmetric-memory all-reduces past it; without NVLink NCCL over PCIe."""
    if not nvlink:
        latency = _c("tp_allreduce_latency_s_pcie" if tp <= 4 else "tp_allreduce_latency_s_pcie_tp8")
        return latency + nbytes / 2**20 * _c("tp_allreduce_s_per_mib_pcie")
    key = 2 if tp <= 2 else 4 if tp <= 4 else 8
    mib = nbytes / 2**20  # the one-shot slope up to 1 MiB, vLLM's size-dispatched all-reduces past it
    small = min(mib, 1.0) * _c(f"tp_allreduce_s_per_mib_tp{key}")
    return _c(f"tp_allreduce_latency_s_tp{key}") + small + max(0.0, mib - 1.0) * _c("tp_allreduce_s_per_mib_large")


def p2p_time(nbytes: float, *, across_nodes: bool) -> float:
    """Seconds of one send between pipeline stages: a fixed latency plus the bytes at the link's rate (NVLink
    within a host, the network between hosts; constants.py)."""
    where = "net" if across_nodes else "node"
    return _c(f"p2p_latency_s_{where}") + nbytes / _c(f"p2p_bytes_per_s_{where}")


def server_prompt_copies(num_generations: int, replicas: int) -> int:
    """Replicas of a data-parallel vLLM server that prefill each prompt. TRL sends a prompt once with
    ``n = num_generations``; vLLM splits such a request into ``n`` child requests (vllm/v1/engine/async_llm.py,
    ``ParentRequest``) and its data-parallel client sends each to the least loaded engine
    (vllm/v1/engine/core_client.py, ``DPLBAsyncMPClient.get_core_engine_for_request``), so the samples of one prompt
    spread over the replicas and each prefills it (its prefix cache is per engine). Measured on vLLM's CPU build with
    data parallel 2 by tests/test_vllm_server.py: 2.0–2.5 prefills per prompt of 4 samples, the excess when two
    samples meet a replica in one scheduler step (this count is the lower end)."""
    return max(1, min(num_generations, replicas))


def colocate_prompt_copies(num_generations: int, engines: int, per_engine: int) -> int:
    """Colocated engines that prefill each prompt: TRL's sampler repeats a prompt ``num_generations`` times in a row
    and each rank generates its own consecutive slice (``per_engine`` completions per engine and call), so a
    prompt's samples reach about ⌈num_generations ÷ per_engine⌉ engines."""
    return max(1, min(engines, math.ceil(num_generations / max(1, per_engine))))


def trainer_decode_batch(n: int, work: Workload) -> int:
    """Sequences each trainer decodes at once without vLLM: TRL 1.16 hands ``generate`` the whole generation round's
    share of the process (trl/trainer/grpo_trainer.py ``_generate_single_turn``: every prompt id of the round, left
    padded into one tensor), not one micro-batch at a time."""
    return max(1, math.ceil(work.generation_completions / max(1, n)))


def transformers_decode_step_s(model: ModelShape, gpu: GpuSpec, batch: int, context: float) -> float:
    """One decode step of transformers' ``generate`` at ``batch`` sequences of ``context`` tokens on one GPU: the
    host's launches (a floor per layer) or the bytes (the weights and the batch's cache at about half vLLM's
    efficiency), whichever is slower, plus what each sequence adds per layer (constants.py)."""
    floor = model.layers * _c("transformers_decode_s_per_layer")
    read = model.decode_read_bytes(batch) + batch * context * model.kv_bytes_per_token_per_gpu(1)
    memory = read / (gpu.bandwidth_tbs * 1e12 * _c("transformers_bw_efficiency"))
    return max(floor, memory) + batch * model.layers * _c("transformers_decode_s_per_seq_layer")


def transformers_generation_time(model: ModelShape, gpu: GpuSpec, n: int, work: Workload) -> tuple[float, str]:
    """One generation round without vLLM: each of ``n`` trainers prefills and decodes its share of the round in one
    ``generate`` call (:func:`trainer_decode_batch`), as many steps as its longest completion; the arithmetic."""
    batch = trainer_decode_batch(n, work)
    steps = work.longest_of(batch)
    context = work.prompt_len + work.mean_completion_len / 2
    per_step = transformers_decode_step_s(model, gpu, batch, context)
    prefill = 2 * model.active_params * batch * work.prompt_len / (gpu.bf16_tflops * 1e12 * PREFILL_MFU)
    scale = work.scale.generation
    seconds = (prefill + steps * per_step) * scale
    why = (
        f"transformers in each of {n} trainer(s), {batch} sequences at once: prefill {prefill:.2f} s + {steps:.0f} "
        f"steps × {per_step * 1e3:.1f} ms (the host's launches, {model.layers} layers × "
        f"{_c('transformers_decode_s_per_layer') * 1e3:.2f} ms, or the bytes, + {batch} sequences × "
        f"{_c('transformers_decode_s_per_seq_layer') * 1e6:.0f} µs a layer) = {seconds:.1f} s"
        + (f"; × {scale:.2f} measured" if scale != 1.0 else "")
    )
    return seconds, why


def padded_tokens(work: Workload) -> float:
    """Tokens the trainers run through per optimizer step: every micro-batch padded to its longest completion."""
    return work.completions * (work.prompt_len + work.longest_of(work.per_device))


def offload_time(
    model: ModelShape, n: int, nodes: int, backend: DistBackend, offload: Offload, work: Workload
) -> float:
    """Seconds per optimizer step that offload adds, as transfers and CPU work (ZeRO-Offload's data flow):

    - optimizer offload: each GPU sends its bf16 gradient partition to the host and receives its updated bf16
      parameters (2 × 2P/n bytes over its PCIe link), and the node's CPUs run Adam on the node's share (P/nodes);
    - parameter offload (ZeRO-3): each micro-batch's forward and backward fetch the GPU's parameter partition from
      the host again (2 × 2P/n bytes), plus one fetch per micro-batch of the old-log-prob forward.
    """
    o = offload
    if o == Offload.NONE:
        return 0.0
    p, pcie = model.params, _c("pcie_bytes_per_s")
    seconds = 4 * p / n / pcie + p / max(1, nodes) / _c("cpu_adam_params_per_s")
    if o.params and backend == DistBackend.ZERO3:
        micro = math.ceil(work.completions / max(1, n * work.per_device))
        passes = 2 + (1 if work.old_logprobs else 0)
        seconds += micro * passes * 2 * p / n / pcie
    return seconds


def training_time(
    model: ModelShape, gpu: GpuSpec, n: int, backend: DistBackend, offload: Offload, work: Workload, *, nodes: int = 1
) -> tuple[float, str]:
    """Seconds of forward + backward over one optimizer step's tokens on ``n`` training GPUs (plus offload's
    transfers and CPU Adam), and the arithmetic."""
    tokens = padded_tokens(work)
    per_token = 6.0 + (2.0 if work.gradient_checkpointing else 0.0) + (2.0 if work.reference_model else 0.0)
    if work.lora:
        per_token -= 2.0  # no weight gradients for the frozen base
    mfu = train_mfu(gpu.name).value
    compute = per_token * model.active_params * tokens / (n * gpu.bf16_tflops * 1e12 * mfu)
    moved = offload_time(model, n, nodes, backend, offload, work)
    gathers = zero3_gather_time(model, n, work, passes=training_passes(work)) if backend == DistBackend.ZERO3 else 0.0
    # the calibration file's ratio is the GPU's compute against the table's; a run's own scale covers the whole term
    seconds = (compute * work.scale.measured_training + moved + gathers) * work.scale.run_training
    why = (
        f"{per_token:.0f}·{model.active_params / 1e9:.2f}B{' active' if model.is_moe else ''}·{tokens:,.0f} padded tok"
        + f" / ({n} GPU · {gpu.bf16_tflops:.0f} TFLOP/s · {mfu:.0%} MFU) = {compute:.1f} s"
        + (
            f" + ZeRO-3 gathers {gathers:.2f} s ({_gathers_why(model, n, work, training_passes(work))})"
            if gathers
            else ""
        )
        + (f" + offload {moved:.1f} s (PCIe + CPU Adam)" if moved else "")
        + (f"; compute × {work.scale.measured_training:.2f} measured" if work.scale.measured_training != 1.0 else "")
        + (f"; × {work.scale.run_training:.2f} from a run" if work.scale.run_training != 1.0 else "")
    )
    return seconds, why


def micro_batches(n: int, work: Workload) -> int:
    """Micro-batches each trainer runs per optimizer step."""
    return max(1, math.ceil(work.completions / max(1, n * work.per_device)))


def training_passes(work: Workload) -> int:
    """Passes over the layers per micro-batch in training: the forward, the backward, and the forward recomputed
    under activation checkpointing."""
    return 3 if work.gradient_checkpointing else 2


def zero3_gather_time(model: ModelShape, n: int, work: Workload, *, passes: int) -> float:
    """What ZeRO-3's parameter gathers add per optimizer step on each of ``n`` trainers: every layer gathered before
    each of its ``passes`` per micro-batch, a fixed cost per layer and pass (the host's hooks and launches) plus the
    layer's bf16 bytes from the other ranks (none on one GPU); constants.py ``zero3_layer_pass_s``."""
    per_layer = _c("zero3_layer_pass_s")
    if n > 1:
        per_layer += 2 * model.params / max(1, model.layers) * (n - 1) / n / _c("zero3_gather_bytes_per_s")
    return micro_batches(n, work) * passes * model.layers * per_layer


def _gathers_why(model: ModelShape, n: int, work: Workload, passes: int) -> str:
    return (
        f"{micro_batches(n, work)} micro-batch(es) × {passes} passes × {model.layers} layers × "
        f"{_c('zero3_layer_pass_s') * 1e3:.1f} ms" + (" + each layer's bytes" if n > 1 else "")
    )


def old_logprobs_time(model: ModelShape, gpu: GpuSpec, n: int, work: Workload) -> float:
    """TRL's extra forward pass (2·P FLOPs per token) that computes the old log-probs before training, at the
    training MFU; 0 when TRL skips it."""
    if not work.old_logprobs:
        return 0.0
    mfu = train_mfu(gpu.name).value
    flops = 2.0 * model.active_params * padded_tokens(work)
    return flops / (n * gpu.bf16_tflops * 1e12 * mfu) * work.scale.training


def sync_time(model: ModelShape, *, across_nodes: bool) -> float:
    """Seconds of TRL's weight sync to a vLLM server: a fixed cost plus the bf16 weights broadcast by one sender
    (constants.py: measured in TRL and verl, within a node and between nodes)."""
    rate = _c("sync_bytes_per_s_net") if across_nodes else _c("sync_bytes_per_s_node")
    return _c("sync_fixed_s") + model.weight_bytes_bf16 / rate


def colocate_switch_time(model: ModelShape, n: int, *, sleep_mode: bool) -> float:
    """Colocated vLLM per step: with sleep mode, a fixed sleep/wake cost plus moving the weights off and back over
    PCIe; without it nothing moves (vLLM keeps its memory share while the trainers run)."""
    if not sleep_mode:
        return 0.0
    return _c("colocate_switch_s") + 2 * model.weight_bytes_bf16 / n / _c("pcie_bytes_per_s")


@frozen
class StepTime:
    """One optimizer step's predicted seconds, side by side: generation, training, the weight sync and TRL's
    old-log-probs forward; overlapped (AsyncGRPOTrainer, :mod:`.overlap`) or one after the other."""

    generation_s: float
    training_s: float
    sync_s: float
    old_logprobs_s: float = 0.0  # TRL's forward pass for the old log-probs (importance sampling)
    # AsyncGRPOTrainer: generation and training overlap on disjoint GPUs (planning/cost/overlap.py)
    overlapped: bool = False

    @property
    def total_s(self) -> float:
        if self.overlapped:
            return max(self.generation_s, self.old_logprobs_s + self.training_s) + self.sync_s
        return self.generation_s + self.old_logprobs_s + self.training_s + self.sync_s

    @property
    def sequential_s(self) -> float:
        """The same work one side after the other (what the overlap saves is measured against)."""
        return self.generation_s + self.old_logprobs_s + self.training_s + self.sync_s

    @property
    def bottleneck(self) -> str:
        return "generation" if self.generation_s >= self.training_s else "training"

    @property
    def trainer_generation_s(self) -> float:
        """What the trainers time as generation: generating, the old log-probs and the weight sync."""
        return self.generation_s + self.old_logprobs_s + self.sync_s


@frozen
class TimeTerm:
    """One term of the estimate, side by side: the table's seconds (None: the table has no speed for this device),
    what ``grpo-launch calibrate`` measured for the same work (None: not measured for this plan's case), and which of
    the two the plan used."""

    name: str
    table_s: float | None
    measured_s: float | None

    @property
    def used(self) -> str:
        return "measured" if self.measured_s is not None else "table"

    @property
    def seconds(self) -> float:
        value = self.measured_s if self.measured_s is not None else self.table_s
        return value or 0.0


def choose(
    name: str, table: tuple[float, str] | None, measured: tuple[float, str] | None
) -> tuple[float, str, TimeTerm]:
    """The measured term where there is one, else the table's; its arithmetic; and the pair for ``--explain``."""
    term = TimeTerm(name, table[0] if table else None, measured[0] if measured else None)
    if measured is not None:
        why = measured[1] + (f" (the table's {table[0]:.2f} s)" if table else "")
        return measured[0], why, term
    assert table is not None, f"{name}: neither measured nor in the table"
    return table[0], table[1], term

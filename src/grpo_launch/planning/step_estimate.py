"""One optimizer step's predicted times for a split: generation (on the server, the colocated engines or in the
trainers), the weight sync, training and TRL's old-log-prob forward, each the measured term of a calibration where it
measured the plan's case and the table's otherwise, side by side (:class:`~.cost.steptime.TimeTerm`). Pure."""

from __future__ import annotations

import dataclasses

from grpo_launch.enums import DistBackend, VllmMode
from grpo_launch.machines.gpus import GpuSpec
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost import measured_time
from grpo_launch.planning.cost.overlap import overlap_line
from grpo_launch.planning.cost.steptime import (
    TimeTerm,
    choose,
    colocate_prompt_copies,
    colocate_switch_time,
    generation_time,
    offload_time,
    old_logprobs_time,
    server_prompt_copies,
    sync_time,
    training_passes,
    training_time,
    transformers_generation_time,
    zero3_gather_time,
)
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.plan_types import StepTime, TrainHost, TrainPlan, VllmPlan


def generation_part(
    model: ModelShape, gpu: GpuSpec, vllm: VllmPlan, hosts: tuple[TrainHost, ...], work: Workload
) -> tuple[float, float, list[str], list[TimeTerm]]:
    """Seconds of generation and of the weight sync (or colocated sleep/wake) per optimizer step, their arithmetic,
    and the table's and the measured terms side by side: on the server's TP × DP GPUs, on every TP group of
    colocated trainers (``hosts``), or in the trainers. A calibration's decode curve replaces the table's wherever it
    measured the same engine on as many GPUs (one per engine)."""
    n = sum(h.processes for h in hosts)
    seqs = vllm.max_num_seqs or work.completions
    par = vllm.engines(n)
    measured = work.scale.measured
    single_gpu_engines = par.tp == 1 and par.pp == 1 and not par.ep
    if vllm.mode == VllmMode.SERVER:
        copies = server_prompt_copies(work.num_generations, par.dp)
        table = generation_time(model, gpu, par, seqs, work, prompt_copies=copies, pp_across_nodes=vllm.spans_hosts)
        mine = (
            measured_time.generation(measured, model, n, work, engine="vllm", engines=par.dp, max_num_seqs=seqs)
            if measured is not None and single_gpu_engines
            else None
        )
        gen, gen_why, term = choose("generation", table, mine)
        # Trainer rank 0 (the first training host) broadcasts the weights to every server rank (one NCCL group).
        across = bool(vllm.nodes) or vllm.host != hosts[0].name
        sync = sync_time(model, across_nodes=across)
        sync_why = f"weight sync: {model.weight_bytes_bf16 / 1e9:.1f} GB broadcast = {sync:.2f} s"
        sync_term = TimeTerm("weight sync", sync, None)
        if not across and measured is not None and measured.sync_s is not None and measured.sync_path == "nccl":
            sync_term = TimeTerm("weight sync", sync, measured.sync_s)
            sync = measured.sync_s  # calibrate sent this model's weights over NCCL between two GPUs of a host
            sync_why = f"weight sync: {sync:.2f} s measured by calibrate (NCCL within a node; the table's {sync_why})"
        lines = [f"generation on the server ({par.gpus} GPU, {par.server_label}): {gen_why}", sync_why]
        return gen, sync, lines, [term, sync_term]
    if vllm.mode == VllmMode.COLOCATE:
        per_engine = (work.generation_batch or work.completions) // max(1, n) * par.tp  # each rank's slice, per call
        copies = colocate_prompt_copies(work.num_generations, par.dp, per_engine)
        table = generation_time(model, gpu, par, seqs, work, prompt_copies=copies)
        mine = (
            measured_time.generation(measured, model, n, work, engine="vllm", engines=par.dp, max_num_seqs=seqs)
            if measured is not None and single_gpu_engines
            else None
        )
        gen, gen_why, term = choose("generation", table, mine)
        sync = colocate_switch_time(model, n, sleep_mode=vllm.sleep_mode)
        lines = [f"generation colocated ({par.dp} engine(s) × TP {par.tp}): {gen_why}"]
        if vllm.sleep_mode:
            lines.append(f"vLLM sleep/wake and weight load per step: {sync:.2f} s")
        return gen, sync, lines, [term]
    engine = "continuous" if work.continuous_batching else "generate"
    table = transformers_generation_time(model, gpu, n, work)
    if work.continuous_batching:
        table = (table[0], table[1] + " (continuous batching priced as generate: no published figure)")
    mine = measured_time.generation(measured, model, n, work, engine=engine) if measured is not None else None
    gen, gen_why, term = choose("generation", table, mine)
    return gen, 0.0, [f"generation in the trainers (no vLLM): {gen_why}"], [term]


def step_time(
    model: ModelShape,
    gpu: GpuSpec,
    vllm: VllmPlan,
    train: TrainPlan,
    work: Workload,
    serve_gpu: GpuSpec | None = None,
) -> tuple[StepTime, list[str]]:
    """One optimizer step's times for ``work``, and their arithmetic: training on ``gpu``, generation on
    ``serve_gpu`` (a server on GPUs of another type; None: the same)."""
    step, lines, _ = step_terms(model, gpu, vllm, train, work, serve_gpu)
    return step, lines


def step_terms(
    model: ModelShape,
    gpu: GpuSpec,
    vllm: VllmPlan,
    train: TrainPlan,
    work: Workload,
    serve_gpu: GpuSpec | None = None,
) -> tuple[StepTime, list[str], tuple[TimeTerm, ...]]:
    """:func:`step_time`, and each term's table and measured values side by side."""
    n = train.num_processes
    # Generation, the weight sync and the old log-probs happen once per generation round, which may serve several
    # optimizer steps (steps_per_generation > gradient_accumulation_steps, num_iterations > 1) or be one of several.
    rounds, one = work.generations_per_step, work.per_generation()
    gen, sync, lines, terms = generation_part(model, serve_gpu or gpu, vllm, train.hosts, one)
    if rounds != 1:
        lines.append(
            f"generation rounds per optimizer step: {rounds:.3g} (TRL generates {one.completions} completions every "
            f"steps_per_generation × num_iterations micro-steps; a step is gradient_accumulation_steps of them)"
        )
        terms = [
            dataclasses.replace(t, table_s=_times(t.table_s, rounds), measured_s=_times(t.measured_s, rounds))
            for t in terms
        ]
    gen, sync = gen * rounds, sync * rounds
    measured = work.scale.measured
    table_train = training_time(model, gpu, n, train.backend, train.offload, work, nodes=len(train.hosts))
    mine = None
    if measured is not None:
        extra = offload_time(model, n, len(train.hosts), train.backend, train.offload, work)
        if train.backend == DistBackend.ZERO3:
            extra += zero3_gather_time(model, n, work, passes=training_passes(work))
        mine = measured_time.training(
            measured,
            n,
            str(train.backend),
            work,
            extra_s=extra,
            extra_why=f"the table's {train.backend} and offload costs",
        )
    train_s, train_why, train_term = choose("training", table_train, mine)
    terms.append(train_term)
    lines.append(f"training: {train_why}")
    old = 0.0
    if vllm.mode != VllmMode.OFF or work.old_logprobs:
        table_old = old_logprobs_time(model, gpu, n, one) * rounds
        if train.backend == DistBackend.ZERO3:  # the forward gathers every layer once per micro-batch of the round
            table_old += zero3_gather_time(model, n, one, passes=1) * rounds
        mine_old = measured_time.old_logprobs(measured, n, work, rounds) if measured is not None else None
        old, _, old_term = choose("old log-probs", (table_old, ""), mine_old)
        terms.append(old_term)
    if work.overlapped:  # AsyncGRPOTrainer: no old log-probs pass; the sync streams the trainer's own dtype
        old, sync = 0.0, sync * work.sync_weight_bytes / 2
        lines.append(overlap_line(gen, train_s, sync, work.sync_weight_bytes))
        terms = [t for t in terms if t.name != "old log-probs"]
    if old:
        lines.append(f"old log-probs (TRL's extra forward, 2·P per token): {old:.1f} s")
    return StepTime(gen, train_s, sync, old, overlapped=work.overlapped), lines, tuple(terms)


def _times(value: float | None, factor: float) -> float | None:
    return value * factor if value is not None else None

"""One optimizer step's time from the terms ``grpo-launch calibrate`` measured on this machine
(:class:`~grpo_launch.planning.cost.workload.MeasuredTerms`), in place of the GPU table's peak and MFU. Pure.

The same structure as :func:`grpo_launch.planning.estimate.step_time`: generation rounds per step, each process's
padded micro-batches through forward/backward, TRL's old-log-prob forward, the weight sync; only the rates are
measured instead of derived. A previous run's scales (``plan --calibrate-from``) multiply on top."""

from __future__ import annotations

import math

from grpo_launch.machines.measured import MeasuredTerms
from grpo_launch.planning.cost.steptime import StepTime, padded_tokens
from grpo_launch.planning.cost.workload import Workload


def measured_generation_s(terms: MeasuredTerms, n: int, work: Workload, *, vllm: bool = False) -> float:
    """One generation round. Without vLLM each of ``n`` processes decodes its completions per_device at a time,
    each batch to its longest completion, after one prompt pass; with vLLM (its decode measured) one engine decodes
    the round's completions together."""
    one = work.per_generation()
    if vllm and terms.vllm_decode:
        batch = one.completions
        return work.longest_of(batch) * terms.decode_step_s(batch, vllm=True)
    batches = math.ceil(one.completions / max(1, n * work.per_device))
    per_batch = work.longest_of(work.per_device) * terms.decode_step_s(work.per_device) + terms.prefill_s
    return batches * per_batch


def measured_step_time(terms: MeasuredTerms, n: int, work: Workload, *, vllm: bool) -> tuple[StepTime, list[str]]:
    """One optimizer step on ``n`` processes from the measured rates, and the arithmetic."""
    rounds = work.generations_per_step
    gen = (
        (measured_generation_s(terms, n, work, vllm=vllm) + terms.overhead_generation_s)
        * rounds
        * work.scale.generation
    )
    rate = terms.train_tokens_per_s_ckpt if work.gradient_checkpointing else terms.train_tokens_per_s
    tokens = padded_tokens(work) / max(1, n)
    train = (tokens / rate + terms.overhead_training_s) * work.scale.training
    old = 0.0
    if (vllm or work.old_logprobs) and terms.forward_tokens_per_s:
        old = padded_tokens(work.per_generation()) / max(1, n) / terms.forward_tokens_per_s * rounds
        old *= work.scale.training
    sync = (terms.sync_s or 0.0) * rounds if vllm else 0.0
    where = f"measured on {terms.device}" + (f" at {terms.threads} threads per process" if terms.threads else "")
    if vllm and terms.vllm_decode:
        batch = work.per_generation().completions
        how = (f"vLLM, {where}): {work.longest_of(batch):.1f} decode steps × "
               f"{terms.decode_step_s(batch, vllm=True) * 1000:.1f} ms at batch {batch}")  # fmt: skip
    else:
        how = (f"transformers, {where}): {work.longest_of(work.per_device):.1f} decode steps × "
               f"{terms.decode_step_s(work.per_device) * 1000:.1f} ms at batch {work.per_device} + "
               f"{terms.prefill_s:.2f} s prefill per batch")  # fmt: skip
    lines = [
        f"generation ({how}"
        + (f" + {terms.overhead_generation_s:.2f} s TRL's own per round" if terms.overhead_steps else "")
        + f", {rounds:.3g} round(s) = {gen:.2f} s"
        + (f" (× {work.scale.generation:.2f} from a run)" if work.scale.generation != 1.0 else ""),
        f"training ({where}): {tokens:,.0f} padded tokens per process / {rate:,.0f} tokens/s"
        + (" (with activation checkpointing)" if work.gradient_checkpointing else "")
        + (f" + {terms.overhead_training_s:.2f} s TRL's own per step" if terms.overhead_steps else "")
        + f" = {train:.2f} s"
        + (f" (× {work.scale.training:.2f} from a run)" if work.scale.training != 1.0 else ""),
    ]
    if old:
        lines.append(f"old log-probs (forward {terms.forward_tokens_per_s:,.0f} tokens/s measured): {old:.2f} s")
    if vllm:
        lines.append(
            f"weight sync: {sync:.2f} s measured" if terms.sync_s is not None else "weight sync: not measured (0 s)"
        )
    return StepTime(gen, train, sync, old), lines

"""The step's terms from what ``grpo-launch calibrate`` measured on this machine
(:class:`~grpo_launch.planning.cost.workload.MeasuredTerms`), where it measured the work this plan runs. Pure.

Each function returns the term's seconds and its arithmetic, or None where the calibration does not cover the plan's
case (another generation engine, an engine over several GPUs, a backend it did not run): the estimate then takes
the table's term (:mod:`grpo_launch.planning.estimate`), and ``--explain`` shows which it used. A run's own scales
(``plan --calibrate-from``, the adapt loop) multiply a measured term; the calibration file's ratio to the table
does not (it stands for the table's terms only)."""

from __future__ import annotations

import math

from grpo_launch.machines.calibrated_speed import MeasuredTerms
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import CONSTANTS
from grpo_launch.planning.cost.steptime import StepTime, padded_tokens, trainer_decode_batch
from grpo_launch.planning.cost.workload import Workload

Term = tuple[float, str]  # seconds, and how they were found


def _per_sequence_s(model: ModelShape | None) -> float:
    """The table's cost of one more sequence in a decode step (constants.py): what a calibration measured at one
    batch size alone is extended by."""
    return (model.layers if model else 1) * CONSTANTS["transformers_decode_s_per_seq_layer"].value


def _where(terms: MeasuredTerms) -> str:
    return f"measured on {terms.device}" + (f" at {terms.threads} threads per process" if terms.threads else "")


def generation(
    terms: MeasuredTerms,
    model: ModelShape | None,
    n: int,
    work: Workload,
    *,
    engine: str,
    engines: int = 1,
    max_num_seqs: int | None = None,
) -> Term | None:
    """One generation round (``work`` is the round's) from the measured decode curve of ``engine``: "generate" or
    "continuous" (each of ``n`` trainers decodes its share of the round at once, TRL's path without vLLM), or "vllm"
    (``engines`` single-GPU engines share the round, ``max_num_seqs`` at a time). None when that curve was not
    measured."""
    curve = terms.curve(engine)
    if not curve:
        return None
    if engine == "vllm":
        per_engine = math.ceil(work.completions / max(1, engines))
        batch = min(per_engine, max_num_seqs or per_engine)
        rounds = math.ceil(per_engine / batch)
        step = terms.decode_step_s(batch, engine=engine)
        seconds = rounds * work.longest_of(batch) * step
        how = (
            f"vLLM, {_where(terms)}: {rounds} batch(es) × {work.longest_of(batch):.0f} decode steps × "
            f"{step * 1e3:.1f} ms at batch {batch}"
        )
    else:
        batch = trainer_decode_batch(n, work)
        step = terms.decode_step_s(batch, engine=engine, per_sequence_s=_per_sequence_s(model))
        at = terms.prefill_batch or max(1, work.per_device)
        prefill = terms.prefill_s * batch / at
        seconds = work.longest_of(batch) * step + prefill
        label = "transformers" if engine == "generate" else "continuous batching"
        beyond = max(b for b, _ in curve) < batch
        how = (
            f"{label}, {_where(terms)}: {work.longest_of(batch):.0f} decode steps × {step * 1e3:.1f} ms at "
            f"{batch} sequences per trainer"
            + (" (beyond the largest batch measured: extended)" if beyond else "")
            + f" + {prefill:.2f} s prefill"
        )
    if terms.overhead_steps:
        seconds += terms.overhead_generation_s
        how += f" + {terms.overhead_generation_s:.2f} s TRL's own per round"
    scale = work.scale.run_generation
    return seconds * scale, f"{how} = {seconds * scale:.2f} s" + (f" (× {scale:.2f} from a run)" if scale != 1 else "")


def training(
    terms: MeasuredTerms,
    n: int,
    backend: str,
    work: Workload,
    *,
    extra_s: float = 0.0,
    extra_why: str = "",
    any_head: bool = False,
) -> Term | None:
    """One optimizer step's forward and backward on each of ``n`` trainers at the rate measured for ``backend`` with
    the plan's activation checkpointing; where only the engine-free rate was measured, that rate plus ``extra_s``
    (the table's cost of the backend: ZeRO-3's gathers, offload). None where no rate was measured as TRL runs it
    (``any_head``: take one measured through torch's whole logits too, where there is no table to scale: CPU)."""
    if not (terms.fused_head or any_head):
        return None
    ckpt = work.gradient_checkpointing
    rate, plus, plus_why = terms.training_rate(backend, ckpt), 0.0, ""
    if rate is None:
        rate, plus, plus_why = terms.training_rate("ddp", ckpt), extra_s, extra_why
    if not rate:
        return None
    tokens = padded_tokens(work) / max(1, n)
    seconds = tokens / rate + plus + (terms.overhead_training_s if terms.overhead_steps else 0.0)
    scale = work.scale.run_training
    engine = backend if terms.training_rate(backend, ckpt) else "no engine"
    how = (
        f"{_where(terms)}, {engine}: {tokens:,.0f} padded tokens per process / {rate:,.0f} tokens/s"
        + (" (with activation checkpointing)" if ckpt else "")
        + (f" + {plus:.2f} s {plus_why}" if plus else "")
        + (f" + {terms.overhead_training_s:.2f} s TRL's own per step" if terms.overhead_steps else "")
    )
    return seconds * scale, f"{how} = {seconds * scale:.2f} s" + (f" (× {scale:.2f} from a run)" if scale != 1 else "")


def old_logprobs(terms: MeasuredTerms, n: int, work: Workload, rounds: float) -> Term | None:
    """TRL's forward for the old log-probs over a round's completions, at the measured forward rate."""
    if not terms.forward_tokens_per_s:
        return None
    seconds = padded_tokens(work.per_generation()) / max(1, n) / terms.forward_tokens_per_s * rounds
    seconds *= work.scale.run_training
    return seconds, f"forward {terms.forward_tokens_per_s:,.0f} tokens/s {_where(terms)}: {seconds:.2f} s"


def measured_step_time(
    terms: MeasuredTerms, n: int, work: Workload, *, vllm: bool, model: ModelShape | None = None
) -> tuple[StepTime, list[str]] | None:
    """One optimizer step on ``n`` processes from the measured terms alone (a CPU plan, which has no table), and the
    arithmetic; None where a term the step needs was not measured."""
    engine = "vllm" if vllm else ("continuous" if work.continuous_batching else "generate")
    rounds = work.generations_per_step
    gen = generation(terms, model, n, work.per_generation(), engine=engine)
    train = training(terms, n, "ddp", work, any_head=True)
    if gen is None or train is None:
        return None
    old = old_logprobs(terms, n, work, rounds) if (vllm or work.old_logprobs) else None
    sync = (terms.sync_s or 0.0) * rounds if vllm else 0.0
    lines = [f"generation ({gen[1]}), {rounds:.3g} round(s)", f"training ({train[1]})"]
    if old:
        lines.append(f"old log-probs ({old[1]})")
    if vllm:
        lines.append(
            f"weight sync: {sync:.2f} s measured" if terms.sync_s is not None else "weight sync: not measured (0 s)"
        )
    return StepTime(gen[0] * rounds, train[0], sync, old[0] if old else 0.0), lines

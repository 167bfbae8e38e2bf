"""From a previous run's measurements to the scales the next plan uses (``grpo-launch plan --calibrate-from``).
Pure: takes the run directory as :class:`grpo_launch.analysis.view.RunView` read it once (:func:`calibrate_from_run`),
or what :func:`grpo_launch.analysis.step_means.measure` made of it.

The trainer times generation and training per step. Its "generation" is TRL's _generate_and_score_completions:
vLLM's generation plus the reward, the old-log-prob forward and (server mode) the weight sync. So:

- training: measured ÷ predicted training, the prediction first rescaled from the completion length the plan
  assumed to the mean length measured (training runs over padded micro-batches, see steptime.padded_tokens);
- generation: what is left of the measured generation after the old log-probs (at the training scale) and the
  sync, ÷ the predicted generation;
- memory: the largest peak of any rank ÷ the predicted memory per training GPU (GPU runs only: a CPU run's
  resident set is not what the GPU estimate counts);
- the mean completion length measured replaces the assumed one.

A run planned with a calibration predicted the calibrated times: its measured ÷ predicted ratios are relative to
that calibration, so the scales returned are the product of the two (:func:`prior_calibration`). Calibrating from
a calibrated run, or re-planning a running one (``launch.adapt``), then converges instead of drifting.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from grpo_launch.analysis.step_means import Measured, measure
from grpo_launch.analysis.view import RunView
from grpo_launch.enums import DistBackend, Offload
from grpo_launch.errors import ConfigError
from grpo_launch.machines.calibrated_speed import MeasuredTerms
from grpo_launch.machines.gpus import GIB, GpuSpec
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.activations import Precision, activation_memory
from grpo_launch.planning.cost.steptime import (
    generation_time,
    old_logprobs_time,
    padded_tokens,
    sync_time,
    training_time,
    transformers_decode_step_s,
)
from grpo_launch.planning.cost.workload import Calibration, Workload
from grpo_launch.planning.parallel_and_batch import Parallelism
from grpo_launch.rundir.plan_record import PlanRecord
from grpo_launch.spec import frozen

FLOOR = 0.05  # no scale below this: a term measured as nothing is a measurement problem, not a 20× speed-up


@frozen
class Comparison:
    term: str
    predicted: float | None
    measured: float | None
    unit: str
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.predicted and self.measured is not None:
            return self.measured / self.predicted
        return None


def prior_calibration(plan: PlanRecord | None) -> Calibration:
    """The calibration a run's plan was made with, as its plan.json records it (none: every scale 1)."""
    recorded = plan.calibration if plan is not None else None
    if recorded is None:
        return Calibration()

    def scale(value: float) -> float:
        return value if value > 0 else 1.0

    # A stored calibrate file's part is left out: the next plan takes it from the file again (calibration file
    # first, a run's scales on top), so it is not counted twice.
    return Calibration(
        scale(recorded.generation) / recorded.measured_generation,
        scale(recorded.training) / recorded.measured_training,
        scale(recorded.memory),
        recorded.mean_completion_len,
        recorded.source,
    )


def with_file_part(run: Calibration, used: Calibration | None) -> Calibration:
    """A run's scales (:func:`calibration_from`) with the stored ``grpo-launch calibrate`` part of the calibration
    the running plan used (``used``) put back on: the file's measured terms and its measured ÷ table ratios. The
    adapt loop re-plans through make_plan, which reads no file itself."""
    if used is None or used.measured is None:
        return run
    return dataclasses.replace(
        run,
        generation=run.generation * used.measured_generation,
        training=run.training * used.measured_training,
        measured=used.measured,
        measured_source=used.measured_source,
        measured_generation=used.measured_generation,
        measured_training=used.measured_training,
        activation_memory=used.activation_memory,
        measured_memory=used.measured_memory,
    )


def calibrate_from_run(view: RunView) -> tuple[Calibration, list[Comparison]]:
    """``plan --calibrate-from RUN_DIR``: the scales a run's measurements give, and the terms compared."""
    return calibration_from(measure(view))


def calibration_from(m: Measured) -> tuple[Calibration, list[Comparison]]:
    pred = m.prediction
    if pred is None or pred.workload is None:
        raise ConfigError(
            f"{m.run_dir}/plan.json has no estimate to compare with (a CPU run, or a model or GPU the planner "
            "does not know)",
            hint="Calibrate from a GPU run planned with a known model and GPU.",
        )
    assumed, mean = Workload.from_dict(pred.workload), m.mean_completion_len
    measured_len = dataclasses.replace(assumed, expected_completion_len=mean) if mean else assumed
    length = padded_tokens(measured_len) / padded_tokens(assumed) if mean else 1.0
    pred_train = pred.training_s * length
    pred_old = pred.old_logprobs_s * length
    train = max(FLOOR, m.training_s / pred_train) if pred_train > 0 else 1.0
    gen_left = m.generation_s - pred_old * train - pred.sync_s
    gen = max(FLOOR, gen_left / pred.generation_s) if pred.generation_s > 0 else 1.0
    rows = [
        Comparison(
            "generation (with scoring, old log-probs, sync)",
            pred.trainer_generation_s,
            m.generation_s,
            "s",
            f"generation × {gen:.2f}",
        ),
        Comparison(
            "training",
            pred.training_s,
            m.training_s,
            "s",
            f"× {train:.2f}" + (f" (after the length correction × {length:.2f})" if mean else ""),
        ),
        Comparison("step", pred.step_s, m.step_s, "s"),
        Comparison(
            "mean completion length",
            assumed.mean_completion_len,
            mean,
            "tokens",
            "used as the expected length" if mean else "not logged (TRL logs it every logging_steps)",
        ),
    ]
    memory = 1.0
    predicted_mem = pred.train_memory_gib
    if m.peak_memory_bytes and predicted_mem and m.memory_kind == "cuda_max_allocated":
        memory = max(FLOOR, m.peak_memory_bytes / GIB / float(predicted_mem))
        rows.append(
            Comparison(
                "peak memory per training GPU",
                float(predicted_mem),
                m.peak_memory_bytes / GIB,
                "GiB",
                f"× {memory:.2f}",
            )
        )
    else:
        why = "a CPU run's resident set" if m.memory_kind == "rss_max" else "no GPU peak measured"
        rows.append(Comparison("peak memory per training GPU", predicted_mem, None, "GiB", f"not calibrated: {why}"))
    source = f"{m.run_dir} ({m.steps} steps)"
    prior = prior_calibration(m.plan)
    if prior.source:
        source += f", over its own calibration ({prior.source})"
    scaled = Calibration(
        gen * prior.generation, train * prior.training, memory * prior.memory, mean or prior.mean_completion_len, source
    )
    return scaled, rows


def measured_against_table(
    model: ModelShape, gpu: GpuSpec | None, terms: MeasuredTerms, per_device: int, prompt_len: int, completion_len: int
) -> tuple[list[Comparison], float, float]:
    """Each term ``grpo-launch calibrate`` measured beside the GPU table's value at the same point (one process,
    ``per_device`` sequences of ``prompt_len`` + ``completion_len`` tokens), and the generation and training time
    ratios (measured ÷ table) the plan applies on that GPU. On CPU (``gpu`` None) the table has no value: 1, 1."""
    b = b_ = max(1, per_device)
    at = Workload(
        prompt_len=prompt_len,
        completion_len=completion_len,
        completions=b,
        num_generations=b,
        per_device=b,
        gradient_checkpointing=False,
    )
    rows: list[Comparison] = []
    gen_ratio = train_ratio = 1.0
    # vLLM's decode speaks for generation where it was measured (a plan with vLLM on a GPU), else transformers', at
    # the measured batch nearest the micro-batch
    context = prompt_len + completion_len / 2
    for path, points in (
        ("transformers", terms.decode),
        ("continuous batching", terms.cb_decode),
        ("vllm", terms.vllm_decode),
    ):
        nearest = min((b for b, _ in points), key=lambda b: abs(math.log(b / b_)), default=None) if points else None
        for batch, seconds in points:
            table = None
            if gpu is not None:
                one = dataclasses.replace(at, completions=batch, num_generations=batch, per_device=batch)
                if path == "vllm":
                    table = generation_time(model, gpu, Parallelism(), batch, one)[0] / completion_len
                else:
                    table = transformers_decode_step_s(model, gpu, batch, context)
            row = Comparison(f"decode step at batch {batch} ({path})", table, seconds, "s")
            rows.append(row)
            if batch == nearest and row.ratio and path != "continuous batching":
                gen_ratio = row.ratio
    for ckpt, rate in ((False, terms.train_tokens_per_s), (True, terms.train_tokens_per_s_ckpt)):
        if not rate:
            continue
        work = dataclasses.replace(at, gradient_checkpointing=ckpt)
        tokens = padded_tokens(work)
        table = None
        if gpu is not None:
            table = tokens / training_time(model, gpu, 1, DistBackend.DDP, Offload.NONE, work)[0]
        # a rate: the time ratio is the table's rate over the measured one
        row = Comparison("training tokens/s" + (" (activation checkpointing)" if ckpt else ""), table, rate, "tok/s")
        rows.append(row)
        if not ckpt and table:
            train_ratio = table / rate
    if terms.forward_tokens_per_s:
        work = dataclasses.replace(at, old_logprobs=True)
        table = padded_tokens(work) / old_logprobs_time(model, gpu, 1, work) if gpu is not None else None
        rows.append(Comparison("forward tokens/s (old log-probs)", table, terms.forward_tokens_per_s, "tok/s"))
    for name, value in (("model load", terms.load_s), ("vLLM start-up", terms.engine_start_s)):
        if value is not None:
            rows.append(Comparison(name, None, value, "s"))
    if terms.sync_s is not None:  # the table's within a node, on a GPU; gloo on CPU is no TRL path to compare with
        table = sync_time(model, across_nodes=False) if gpu is not None and terms.sync_path == "nccl" else None
        rows.append(
            Comparison(
                f"weight sync ({terms.sync_path or 'unknown'})",
                table,
                terms.sync_s,
                "s",
                "the whole model, trainer → server, in vLLM's packed buffers",
            )
        )
    for ckpt, peak in ((False, terms.peak_memory_bytes), (True, terms.peak_memory_bytes_ckpt)):
        if peak:
            name = "peak memory of the timed step (one micro-batch" + (", checkpointing)" if ckpt else ")")
            rows.append(
                Comparison(
                    name,
                    None,
                    peak / GIB,
                    "GiB",
                    "torch's log-softmax over whole logits, not TRL's fused head: no model term (the row below is)",
                )
            )
    for ckpt, predicted, measured in step_peak_points(terms):
        name = "training step's peak memory (fused LM head, AdamW" + (", checkpointing)" if ckpt else ")")
        note = (
            "the memory model's tensors at this point"
            if terms.device != "cpu"
            else "a CPU resident set, libraries included: not the GPU estimate's (not used)"
        )
        rows.append(Comparison(name, predicted / GIB, measured / GIB, "GiB", note))
    for ckpt, modelled, measured in activation_points(model, terms, b, prompt_len, completion_len):
        name = "activation memory of one micro-batch" + (" (activation checkpointing)" if ckpt else "")
        rows.append(Comparison(name, modelled / GIB, measured / GIB, "GiB", "the memory model's activation terms"))
    return rows, max(FLOOR, gen_ratio), max(FLOOR, train_ratio)


def activation_points(
    model: ModelShape, terms: MeasuredTerms, per_device: int, prompt_len: int, completion_len: int
) -> list[tuple[bool, float, int]]:
    """(checkpointing, the memory model's activation peak, the measured one) for each micro-batch calibrate measured
    as GRPOTrainer runs it: at its own width (float32 on CPU, the recipe's dtype on a GPU) and TRL's LM-head path
    there (Triton's tiles on a GPU, torch's on CPU)."""
    if not terms.value_bytes:
        return []
    prec = Precision(terms.value_bytes, terms.value_bytes, triton=terms.device != "cpu")
    seq = prompt_len + completion_len
    return [
        (ckpt, activation_memory(model, max(1, per_device), seq, completion_len, ckpt, prec).peak, measured)
        for ckpt, measured in ((False, terms.activation_peak_bytes), (True, terms.activation_peak_bytes_ckpt))
        if measured
    ]


def step_peak_prediction(
    model: ModelShape,
    value_bytes: int,
    gpu: bool,
    per_device: int,
    prompt_len: int,
    completion_len: int,
    checkpointing: bool,
) -> float:
    """The memory model's tensors of calibrate's training step (one process, the model at ``value_bytes`` width as
    calibrate loads it): weights, gradients and AdamW's two moments at that width (4 × value_bytes × P: torch's
    AdamW keeps its moments in the parameters' dtype), and one micro-batch's activation peak as
    :func:`~grpo_launch.planning.cost.activations.activation_memory` counts it (TRL's fused LM head). No
    fragmentation, CUDA context or NCCL buffers: CUDA's max allocated counts none of them."""
    prec = Precision(value_bytes, value_bytes, triton=gpu)
    states = 4 * value_bytes * model.params
    seq = prompt_len + completion_len
    return states + activation_memory(model, max(1, per_device), seq, completion_len, checkpointing, prec).peak


def step_peak_points(terms: MeasuredTerms) -> list[tuple[bool, float, int]]:
    """(checkpointing, the memory model's prediction, the measured peak) of calibrate's training step, as stored."""
    points = (
        (False, terms.step_peak_predicted_bytes, terms.step_peak_bytes),
        (True, terms.step_peak_predicted_bytes_ckpt, terms.step_peak_bytes_ckpt),
    )
    return [(ckpt, float(predicted), measured) for ckpt, predicted, measured in points if predicted and measured]


def step_peak_scale(
    model: ModelShape,
    terms: MeasuredTerms,
    per_device: int,
    prompt_len: int,
    completion_len: int,
    activations: float = 1.0,
) -> float | None:
    """On a GPU, measured ÷ predicted peak of calibrate's training step, the prediction's activation terms first
    raised by ``activations`` (calibrate's activation ratio, which the plan applies apart: not counted twice); the
    larger of the two points (without and with checkpointing). None on CPU (a resident set counts the libraries
    and the interpreter, not what the GPU estimate counts) or where not measured."""
    if terms.device == "cpu" or not terms.value_bytes:
        return None
    modelled = {ckpt: m for ckpt, m, _ in activation_points(model, terms, per_device, prompt_len, completion_len)}
    ratios = [
        measured / (predicted + (activations - 1.0) * modelled.get(ckpt, 0.0))
        for ckpt, predicted, measured in step_peak_points(terms)
    ]
    return max(ratios) if ratios else None


def activation_scale(
    model: ModelShape, terms: MeasuredTerms, per_device: int, prompt_len: int, completion_len: int
) -> float | None:
    """Measured ÷ modelled activation memory, the larger of the two micro-batches (None: not measured)."""
    ratios = [
        measured / modelled
        for _, modelled, measured in activation_points(model, terms, per_device, prompt_len, completion_len)
        if modelled
    ]
    return max(ratios) if ratios else None


def comparison_to_dict(rows: list[Comparison]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) | {"ratio": r.ratio} for r in rows]


def from_record(
    terms: MeasuredTerms,
    path: str,
    model: ModelShape,
    gpu: GpuSpec | None,
    at: dict[str, int],
    run: Calibration | None = None,
) -> tuple[Calibration, list[str]]:
    """The calibration a plan uses from a stored ``grpo-launch calibrate`` record measured ``at`` a micro-batch and
    lengths: its measured terms (used directly wherever they cover the plan's case), its ratios to the GPU table at
    that point (for the table's terms the record did not measure), its memory scales, and a run's own scales
    (``run``: ``--calibrate-from``, the adapt loop) on top; and the notices that say so."""
    base = run or Calibration()
    gen = train = activations = peak = 1.0
    notes: list[str] = []
    if gpu is not None:  # the table's terms the record did not measure are scaled to it
        point = (at.get("per_device_train_batch_size", 1), at.get("prompt_len", 1), at.get("completion_len", 1))
        _, gen, train = measured_against_table(model, gpu, terms, *point)
        notes.append(
            f"calibration: on {gpu.name} each term it measured for this plan's work is used as measured; "
            f"the table's other terms × {gen:.2f} (generation) and × {train:.2f} (training), measured ÷ "
            "table at its point (plan --explain shows each term)"
        )
        ratio = activation_scale(model, terms, *point)
        if ratio is not None and ratio > 1:
            activations = ratio
            notes.append(f"calibration: activation memory × {ratio:.2f} (one micro-batch measured ÷ the memory model)")
        elif ratio is not None:
            notes.append(
                f"calibration: activation memory measured at {ratio:.2f} × the memory model's; the model's "
                "kept (a calibration only raises a memory estimate)"
            )
        whole = step_peak_scale(model, terms, *point, activations=activations)
        if whole is not None and whole > 1:
            peak = whole
            notes.append(
                f"calibration: memory per training GPU × {whole:.2f} (the training step's peak measured ÷ "
                "the memory model's tensors at that point)"
            )
        elif whole is not None:
            notes.append(
                f"calibration: the training step's peak measured at {whole:.2f} × the memory model's; the "
                "model's kept (a calibration only raises a memory estimate)"
            )
    scaled = dataclasses.replace(
        base,
        generation=base.generation * gen,
        training=base.training * train,
        measured=terms,
        measured_source=path,
        measured_generation=gen,
        measured_training=train,
        activation_memory=activations,
        measured_memory=peak,
    )
    return scaled, notes

"""The plan's estimate: one step's workload from the recipe and the layout, and the predicted step time, memory and
whole-run total of a :class:`Draft` (the plan under construction: what one split's steps decided by the time the
estimate prices it, passed whole instead of its parts one by one). vLLM's sizing is decided before, in
:mod:`.vllm_sizing`; the estimate only reads it. Pure."""

from __future__ import annotations

import dataclasses
import functools
import math

from grpo_launch.enums import VllmMode
from grpo_launch.machines.calibrated_speed import MeasuredTerms
from grpo_launch.machines.gpus import GIB, GpuSpec
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost import measured_time
from grpo_launch.planning.cost.constants import (
    EXPECTED_COMPLETION_SHARE,
    TRL_EPOCHS,
)
from grpo_launch.planning.cost.memory import VllmMemory, margin_lines
from grpo_launch.planning.cost.startup import Startup, startup_time
from grpo_launch.planning.cost.steptime import sync_time, trainer_decode_batch
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.gpu_types import role_specs, serve_topology, train_topology
from grpo_launch.planning.parallel_and_batch import Layout
from grpo_launch.planning.plan_types import Estimate, StepTime, Total, Training, TrainPlan, VllmPlan
from grpo_launch.planning.step_estimate import step_terms, step_time
from grpo_launch.recipe import Recipe
from grpo_launch.spec import frozen


@frozen
class Draft:
    """One split's decisions before its estimate: where vLLM and the trainers run (``vllm``, ``train``), the batch
    ``layout``, the ``workload`` one step processes, the ``training`` setting and its memory, vLLM's ``sizing``, and
    the training set's ``rows`` when known (``rows_why``: where they came from, or why they are unknown)."""

    topology: Topology
    recipe: Recipe
    model: ModelShape | None
    vllm: VllmPlan
    train: TrainPlan
    layout: Layout
    workload: Workload
    training: Training
    sizing: VllmMemory | None = None
    rows: int | None = None
    rows_why: str = ""


def _completions_text(work: Workload) -> str:
    """The completions an optimizer step trains on, and the generation round they come from when it differs."""
    gen = work.generation_completions
    text = f"{work.completions} completions"
    if work.generations_per_step == 1:
        return f"{text} ({gen // work.num_generations} prompts × {work.num_generations})"
    rnd = f"a generation of {gen} ({gen // work.num_generations} prompts × {work.num_generations})"
    every = 1 / work.generations_per_step
    if every > 1:
        return f"{text}; {rnd} every {every:.3g} optimizer steps"
    return (
        f"{text}; {work.generations_per_step:.3g} generations of {gen} ({gen // work.num_generations} prompts × "
        f"{work.num_generations}) per step"
    )


def run_total(
    topology: Topology,
    recipe: Recipe,
    layout: Layout,
    step: StepTime,
    rows: int | None,
    expected: tuple[StepTime, str] | None = None,
    *,
    startup_s: float = 0.0,
) -> Total | None:
    """Steps, hours, GPU-hours and price of the whole run, when the step count is known (``rows``: the training
    set's, when known); ``expected``: the step at the expected mean completion length and where that length came
    from, the range's lower end (``step`` is at the maximum)."""
    max_steps = int(recipe.get("max_steps") or -1)
    if max_steps > 0:
        steps, source = max_steps, f"max_steps={max_steps}"
    elif rows:
        epochs = float(recipe.get("num_train_epochs") or TRL_EPOCHS)
        prompts = layout.completions_per_optimizer_step / layout.num_generations
        iterations = int(recipe.get("num_iterations") or 1)  # TRL's sampler repeats each batch that often
        steps = max(1, math.ceil(epochs * rows * iterations / prompts))
        source = f"{epochs:g} epoch(s) × {rows} rows" + (f" × {iterations} iterations" if iterations > 1 else "")
        source += f" ÷ {prompts:g} prompts per step"
    else:
        return None
    hours = (steps * step.total_s + startup_s) / 3600  # the first start once; each restart pays it again
    gpu_hours = hours * topology.num_gpus
    price = recipe.launch.gpu_hour_price
    low = (steps * expected[0].total_s + startup_s) / 3600 if expected else None
    return Total(
        steps,
        hours,
        gpu_hours,
        gpu_hours * price if price is not None else None,
        source,
        low,
        expected[1] if expected else "",
    )


def _range(
    model: ModelShape,
    gpu: GpuSpec,
    vllm: VllmPlan,
    train: TrainPlan,
    work: Workload,
    step: StepTime,
    serve_gpu: GpuSpec | None = None,
) -> tuple[StepTime, tuple[StepTime, str]]:
    """The step with every completion at the maximum length, and the step at the expected mean with its source."""
    if work.expected_completion_len:
        top = step_time(model, gpu, vllm, train, _at(work, 0.0), serve_gpu)[0]
        said = "measured (--calibrate-from)" if work.scale.mean_completion_len else "launch.expected_completion_length"
        return top, (step, f"mean completion {work.mean_completion_len:.0f} tokens, {said}")
    share = EXPECTED_COMPLETION_SHARE
    at = _at(work, share * work.completion_len)
    said = (
        f"mean completion {at.mean_completion_len:.0f} tokens: the prior {share:.0%} of the maximum (TRL #5697, "
        "#6263; set launch.expected_completion_length or plan --calibrate-from)"
    )
    return step, (step_time(model, gpu, vllm, train, at, serve_gpu)[0], said)


def _at(work: Workload, mean_len: float) -> Workload:
    """The workload with every completion at ``mean_len`` tokens on average (0: at the maximum)."""
    return dataclasses.replace(work, expected_completion_len=float(mean_len))


def estimate_plan(draft: Draft) -> Estimate | None:
    """Predicted memory, when the model and the GPUs' memory are known, and step time when the GPU's speed is too
    (the table's entry, or the peak and bandwidth given with --gpus)."""
    topology, model, vllm, train, training = draft.topology, draft.model, draft.vllm, draft.train, draft.training
    # Each role priced on its own GPUs (a mixed cluster): training on the trainers', decoding on the server's.
    serve_gpu, gpu = role_specs(topology, vllm, train.hosts)
    mem = train_topology(topology, train.hosts).min_gpu_memory_bytes
    vllm_mem = serve_topology(topology, vllm, train.hosts).min_gpu_memory_bytes or mem
    measured = draft.workload.scale.measured
    if topology.is_cpu and measured is not None and measured.device == "cpu":
        return _measured_cpu(draft, measured)
    if model is None or mem is None or topology.is_cpu:
        return None
    train_mem = training.memory
    explain = _workload_lines(draft.workload)
    if train_mem is not None:
        explain.append("memory per training GPU: " + train_mem.lines()[0])
        explain += margin_lines(train.num_processes)
    memory = functools.partial(
        Estimate,
        train_memory_gib=train_mem.total / GIB if train_mem else None,
        vllm_memory_gib=_vllm_gib(vllm, vllm_mem or mem),
        gpu_memory_gib=mem / GIB,
        train_memory=train_mem,
        vllm_memory=draft.sizing,
        host_memory_per_node_gib=training.host_memory / GIB,
        workload=draft.workload,
    )
    if gpu is None or serve_gpu is None:
        explain.append(topology.time_missing or "no step time")
        return memory(step=None, explain=tuple(explain), time_missing=topology.time_missing)
    step, lines, terms = step_terms(model, gpu, vllm, train, draft.workload, serve_gpu)
    explain += lines
    startup = first_step(draft, step)
    explain += [startup.line(), _step_line(step)]
    if training.host_memory:
        explain.append(f"host RAM per node for offload (DeepSpeed's estimate): {training.host_memory / GIB:.0f} GiB")
    restart = once_s(startup, step)
    total, missing = _whole_run(draft, gpu, step, restart, serve_gpu)
    return memory(
        step=step,
        explain=tuple(explain),
        total=total,
        total_missing=missing,
        startup_s=startup.first_step_s,
        startup=startup,
        terms=terms,
        restart_s=restart,
    )


def first_step(draft: Draft, step: StepTime) -> Startup:
    """The plan's time to first step, as phases (:mod:`.cost.startup`): its first generation round is the step's."""
    model, vllm, train, work = draft.model, draft.vllm, draft.train, draft.workload
    assert model is not None
    across = bool(vllm.nodes) or vllm.host != train.hosts[0].name  # the first sync between hosts
    rounds = work.generations_per_step or 1.0
    one = work.per_generation()
    steps = one.longest_of(trainer_decode_batch(train.num_processes, one)) if vllm.mode == VllmMode.OFF else 0.0
    return startup_time(
        model,
        vllm.mode,
        deepspeed=train.backend.is_deepspeed,
        machines=train.num_machines,
        processes=train.num_processes,
        first_sync_s=sync_time(model, across_nodes=across),
        first_generation_s=step.generation_s / rounds,
        first_decode_steps=steps,
        measured=work.scale.measured,
        gloo=draft.topology.is_cpu,
    )


def once_s(startup: Startup, step: StepTime) -> float:
    """What the first step costs beyond a warm step (the whole run counts each step's generation already): the time
    to first step less its warm first generation."""
    warm = min(startup.seconds("first_generation") or 0.0, step.generation_s)
    return max(0.0, startup.first_step_s - warm)


def _measured_cpu(draft: Draft, terms: MeasuredTerms) -> Estimate | None:
    """On CPU the table has no speed: the step time is the one ``grpo-launch calibrate`` measured here, alone (None
    where it did not measure a term the step needs)."""
    work = draft.workload
    found = measured_time.measured_step_time(
        terms, draft.train.num_processes, work, vllm=draft.vllm.mode != VllmMode.OFF, model=draft.model
    )
    if found is None:  # a calibration whose budget did not hold the decode or the training step
        engine = "vLLM's" if draft.vllm.mode != VllmMode.OFF else "this engine's"
        why = (
            f"no step time: the calibration ({terms.device}) has no {engine} decode or no training step at these "
            "sizes (its budget was spent: grpo-launch calibrate --minutes 2 measures more)"
        )
        return Estimate(
            step=None,
            train_memory_gib=None,
            vllm_memory_gib=None,
            gpu_memory_gib=0.0,
            explain=(*_workload_lines(work), why),
            workload=work,
            time_missing=why,
        )
    step, lines = found
    startup = first_step(draft, step) if draft.model is not None else None
    explain = [*_workload_lines(work), *lines, *([startup.line()] if startup else []), _step_line(step)]
    return Estimate(
        step=step,
        train_memory_gib=None,
        vllm_memory_gib=None,
        gpu_memory_gib=0.0,
        explain=tuple(explain),
        workload=work,
        startup_s=startup.first_step_s if startup else None,
        startup=startup,
        total_missing="the whole run is not forecast on CPU",
    )


def _workload_lines(work: Workload) -> list[str]:
    """The workload the estimate assumes, as its first line of arithmetic."""
    return [
        f"workload per optimizer step: {_completions_text(work)}, {work.prompt_len} prompt + {work.completion_len} "
        "completion tokens "
        + (
            f"at most, {work.mean_completion_len:.0f} on average"
            + (" (measured)" if work.scale.mean_completion_len else " (launch.expected_completion_length)")
            if work.expected_completion_len
            else "(every completion assumed to run to the maximum: set launch.expected_completion_length, or "
            "plan --calibrate-from RUN_DIR)"
        ),
    ]


def _vllm_gib(vllm: VllmPlan, mem: int) -> float | None:
    """vLLM's memory per GPU: its share of each GPU, as :mod:`.vllm_sizing` decided it."""
    if vllm.mode == VllmMode.OFF:
        return None
    return (vllm.gpu_memory_utilization or 0.0) * mem / GIB  # placement sets it for every vLLM


def _step_line(step: StepTime) -> str:
    """The step's sum (or, overlapped, its maximum) and its bottleneck."""
    if step.overlapped:
        return (
            f"step ≈ max({step.generation_s:.1f} s generation, {step.training_s:.1f} s training) + {step.sync_s:.1f} s "
            f"sync = {step.total_s:.1f} s (async, overlapped; one after the other {step.sequential_s:.1f} s); "
            f"bottleneck: {step.bottleneck}"
        )
    return (
        f"step ≈ {step.generation_s:.1f} s generation + {step.old_logprobs_s:.1f} s old log-probs + "
        f"{step.training_s:.1f} s training + {step.sync_s:.1f} s sync = {step.total_s:.1f} s; "
        f"bottleneck: {step.bottleneck}"
    )


def _whole_run(
    draft: Draft, gpu: GpuSpec, step: StepTime, startup: float, serve_gpu: GpuSpec | None = None
) -> tuple[Total | None, str | None]:
    """The whole run as a range when the step count is known; else why there is none."""
    recipe, rows = draft.recipe, draft.rows
    total = None
    if int(recipe.get("max_steps") or -1) > 0 or rows:  # a step count: the whole run, as a range
        assert draft.model is not None
        top, expected = _range(draft.model, gpu, draft.vllm, draft.train, draft.workload, step, serve_gpu)
        total = run_total(draft.topology, recipe, draft.layout, top, rows, expected, startup_s=startup)
    if total is not None:
        return total, None
    epochs = float(recipe.get("num_train_epochs") or TRL_EPOCHS)
    return None, (
        f"unknown: {epochs:g} epoch(s) of a training set whose rows are unknown"
        + (f" ({draft.rows_why})" if draft.rows_why else "")
        + "; set launch.dataset_rows=N (or max_steps)"
    )

"""What must hold for a run to continue as the same run (standard library only): the values that define its
algorithm and model, compared between the run's record (plan.json) and a new plan of it; where it would continue
from (read only: nothing is set aside here, unlike :func:`.checkpoints.decide_resume`); and whether that checkpoint
was saved from the model the plan loads (a checkpoint of another model fails only once loaded, after the model load
and, on a cluster, the queue wait).

The keys compared are the algorithm's and the model's, not the layout's: the planner may re-factor the per-device
batch × gradient accumulation for memory (DESIGN.md, the batch rule), so the batch is compared as what the
algorithm sees (completions per optimizer step, per generation, per group), not as its factors. ``max_steps`` and
``save_steps`` are not compared: running longer or saving more often continues the same run. A learning-rate
schedule that runs over the training's length does change with ``max_steps``, though: :func:`schedule_change` says
how.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_launch.recipe.trl_schema import DEFAULTS as TRL_DEFAULTS
from grpo_launch.rundir.checkpoints import checkpoint_problems, checkpoints, completed, max_steps_of
from grpo_launch.rundir.json_fields import loads
from grpo_launch.rundir.plan_record import PlanRecord
from grpo_launch.spec import frozen

# TRL / open-r1 keys (trainer_values) that change what is trained, or on what.
MODEL_KEYS = ("model_name_or_path", "model_revision", "dtype", "torch_dtype", "use_peft", "lora_r", "lora_alpha",
              "lora_target_modules", "load_in_4bit", "load_in_8bit")  # fmt: skip
DATA_KEYS = ("dataset_name", "dataset_config", "dataset_train_split", "dataset_prompt_column", "dataset_mixture",
             "system_prompt", "chat_template")  # fmt: skip
ALGORITHM_KEYS = (
    "num_generations", "learning_rate", "lr_scheduler_type", "warmup_ratio", "warmup_steps", "weight_decay",
    "max_grad_norm", "optim", "beta", "epsilon", "epsilon_high", "delta", "loss_type", "scale_rewards",
    "importance_sampling_level", "num_iterations", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "max_prompt_length", "max_completion_length", "reward_funcs", "reward_weights", "mask_truncated_completions",
    "seed", "output_dir",
)  # fmt: skip
# The batch as the algorithm sees it (plan.json's layout and trainer values).
BATCH_KEYS = ("completions_per_optimizer_step", "completions_per_generation")
COMPARED = MODEL_KEYS + DATA_KEYS + ALGORITHM_KEYS + BATCH_KEYS
_ABSENT = object()
# lr_scheduler_type values transformers builds without the training's length (transformers/optimization.py,
# get_scheduler: constant, reduce_lr_on_plateau and greedy before it asks for num_warmup_steps, constant_with_warmup
# and inverse_sqrt before it asks for num_training_steps; warmup_stable_decay too where lr_scheduler_kwargs give
# num_stable_steps, get_wsd_schedule); every other schedule runs over the training's length. A warmup given as a
# fraction (0 < warmup_steps < 1: TrainingArguments.get_warmup_steps) is a fraction of it, and it shapes every
# schedule but the first three. tests/conformance/test_lr_schedule.py holds :func:`length_dependence` against
# transformers' own schedules.
LENGTH_FREE_SCHEDULES = ("constant", "reduce_lr_on_plateau", "greedy", "constant_with_warmup", "inverse_sqrt")
WARMUP_FREE_SCHEDULES = ("constant", "reduce_lr_on_plateau", "greedy")


@frozen
class Change:
    """A compared value that differs: the run's (recorded) and the new plan's (now); None where one has none."""

    key: str
    recorded: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.key}: {json.dumps(self.recorded)} → {json.dumps(self.now)}"


def compared_values(plan: PlanRecord) -> dict[str, Any]:
    """The values :data:`COMPARED` names, from a plan record (a key the plan does not set is left out)."""
    tv = plan.trainer_values
    values = {k: tv[k] for k in MODEL_KEYS + DATA_KEYS + ALGORITHM_KEYS if k in tv}
    values["completions_per_optimizer_step"] = plan.layout["completions_per_optimizer_step"]
    per_step = plan.layout["per_device_train_batch_size"] * plan.layout["num_processes"]
    spg = tv.get("steps_per_generation") or plan.layout["gradient_accumulation_steps"]
    values["completions_per_generation"] = tv.get("generation_batch_size") or per_step * spg
    return values


def changes(recorded: PlanRecord, now: PlanRecord) -> list[Change]:
    """Every compared value that differs between the run's record and the new plan, in :data:`COMPARED`'s order."""
    before, after = compared_values(recorded), compared_values(now)
    out = []
    for key in COMPARED:
        a, b = before.get(key, _ABSENT), after.get(key, _ABSENT)
        if a != b:
            out.append(Change(key, None if a is _ABSENT else a, None if b is _ABSENT else b))
    return out


def length_dependence(
    name: str, warmup: float, kwargs: Mapping[str, Any], lengths: tuple[int, int] | None, step: int
) -> str | None:
    """Why the learning rates after checkpoint-``step`` differ between a training of ``lengths[0]`` optimizer steps
    and one of ``lengths[1]`` (None: the lengths are not both known in steps) under the schedule ``name``, or None
    where they do not. After the checkpoint the first step trains at the saved rate, each later one at the new
    schedule's rate for its position. Where only a step or two is left (within a warmup, or just past it), the
    rates left may happen to coincide: it may warn there, and is never silent where they differ."""
    if lengths is not None and lengths[1] - 1 <= step:
        return None  # at most one step more, at the saved rate
    length_free = name in LENGTH_FREE_SCHEDULES or (name == "warmup_stable_decay" and "num_stable_steps" in kwargs)
    if not length_free:
        return f"lr_scheduler_type {name} runs over the training's length"
    if name in WARMUP_FREE_SCHEDULES or not 0 < warmup < 1:
        return None
    why = f"its warmup is a fraction of the training's length (warmup_steps {warmup:g}"
    if lengths is None:
        return why + ")"
    old, new = (_warmup_steps(warmup, n) for n in lengths)
    settled = _settled(name, kwargs, max(old, new))
    if old == new or (settled is not None and step + 1 >= settled):
        return None  # the same warmup, or both schedules past their warmup's reach by the first step at new rates
    return why + f": {old} → {new} steps)"


def _settled(name: str, kwargs: Mapping[str, Any], warmup: int) -> int | None:
    """The position from which a length-free schedule gives the same rate whatever its warmup up to ``warmup``
    steps: after the warmup for constant_with_warmup; after warmup, stable and decay phases for warmup_stable_decay
    (get_wsd_schedule: then its floor); never for inverse_sqrt, whose timescale is the warmup."""
    if name == "constant_with_warmup":
        return warmup
    if name == "warmup_stable_decay":
        return warmup + int(kwargs.get("num_stable_steps", 0)) + int(kwargs.get("num_decay_steps", 0))
    return None


def _warmup_steps(warmup: float, length: int) -> int:
    """transformers' TrainingArguments.get_warmup_steps: a count from 1 on, else a fraction of the length."""
    return int(warmup) if warmup >= 1 else math.ceil(length * warmup)


def _length(values: Mapping[str, Any]) -> tuple[str, float]:
    """The training's length as the Trainer takes it: max_steps when set, else the epochs."""
    if (steps := max_steps_of(values)) is not None:
        return "max_steps", steps
    return "num_train_epochs", float(values.get("num_train_epochs") or TRL_DEFAULTS["num_train_epochs"])


def schedule_change(recorded: PlanRecord, now: PlanRecord, step: int) -> str | None:
    """What continuing from checkpoint-``step`` with another training length than the run's record (max_steps, or
    the epochs without it) does to the learning rate, or None. The Trainer builds its schedule for the new length,
    then loads the checkpoint's optimizer and scheduler states (``Trainer._load_optimizer_and_scheduler``), which
    restore the rate and the step count, not the length: the first step after the checkpoint trains at the saved
    rate, and the steps after it follow the new schedule (:func:`length_dependence`)."""
    (old_key, old), (new_key, new) = _length(recorded.trainer_values), _length(now.trainer_values)
    if (old_key, old) == (new_key, new):
        return None
    values = now.trainer_values
    name = str(values.get("lr_scheduler_type") or TRL_DEFAULTS["lr_scheduler_type"])
    warmup = values.get("warmup_steps") or 0
    kwargs = values.get("lr_scheduler_kwargs") or {}
    steps = (int(old), int(new)) if old_key == new_key == "max_steps" else None
    why = length_dependence(
        name,
        float(warmup) if isinstance(warmup, (int, float)) else 0.0,
        kwargs if isinstance(kwargs, Mapping) else {},
        steps,
        step,
    )
    if why is None:
        return None
    changed = f"{old_key} {old:g} → {new:g}" if old_key == new_key else f"{old_key} {old:g} → {new_key} {new:g}"
    follows = (
        f"a schedule over {new:g} steps, not the one over {old:g}"
        if steps
        else "the new length's schedule, not the one"
    )
    return (
        f"{changed} since the run's record, and {why}: from checkpoint-{step} the learning rate follows {follows} of "
        "the steps before it (the first step after the checkpoint still trains at the rate the checkpoint saved). To "
        f"continue one schedule, keep {old_key}={old:g}; for one schedule over the new length, start over "
        "(grpo-launch run with --resume never)."
    )


@frozen
class ResumePoint:
    """Where a run would continue: the newest complete checkpoint (``step``, ``checkpoint``), or nothing saved
    (``checkpoint`` None); ``complete``: the run already finished (the training entry's completion record)."""

    output_dir: Path
    step: int | None
    checkpoint: Path | None
    complete: bool = False

    def describe(self) -> str:
        if self.complete:
            return f"already complete: its final model is in {self.output_dir}; nothing would be trained"
        if self.checkpoint is None:
            return f"nothing was saved (no complete checkpoint in {self.output_dir}): it starts over from step 0"
        return f"from checkpoint-{self.step} (the next step is {self.step + 1})" if self.step is not None else ""


def resume_point(output_dir: Path, max_steps: int | None) -> ResumePoint:
    """Where a run in ``output_dir`` would continue (read only)."""
    done = completed(output_dir)
    if done is not None and (not max_steps or done.step >= max_steps):
        return ResumePoint(output_dir, done.step, None, complete=True)
    for step, path in reversed(checkpoints(output_dir)):
        if not checkpoint_problems(path):
            return ResumePoint(output_dir, step, path)
    return ResumePoint(output_dir, None, None)


# What a checkpoint's config.json must share with the model the plan loads (Trainer saves the model's config in it).
MODEL_IDENTITY = ("model_type", "architectures", "hidden_size", "num_hidden_layers", "vocab_size")


def model_mismatches(checkpoint: Path, model: Mapping[str, Any]) -> list[Change]:
    """What the checkpoint's config.json says of its model that differs from ``model`` (the model's own config.json,
    or what is known of it): the keys of :data:`MODEL_IDENTITY` both name. None to compare (no config.json in the
    checkpoint: an adapter, or a save that writes none) is no mismatch; an unreadable one is left to the
    completeness check."""
    try:
        saved = loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(saved, dict):
        return []
    return [Change(k, saved[k], model[k]) for k in MODEL_IDENTITY if k in saved and k in model and saved[k] != model[k]]

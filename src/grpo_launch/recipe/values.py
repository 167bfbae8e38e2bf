"""Value checks for recipe keys: the kind TRL's dataclasses give each key, the choices generated from TRL's and
transformers' own enums and code (:data:`grpo_launch.recipe.trl_schema.CHOICES`), and the ranges below, each with the
library that enforces it (or would fail on it) when the run starts. Messages never repr a value unbounded."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from grpo_launch.errors import did_you_mean, short
from grpo_launch.recipe.keys import PLANNED_KEYS, POSITIVE_INT_KEYS, RECIPE_KEYS
from grpo_launch.recipe.open_r1_schema import OPEN_R1_CHOICES
from grpo_launch.recipe.trl_schema import CHOICES as TRL_CHOICES

CHOICES = {**OPEN_R1_CHOICES, **TRL_CHOICES}

AUTO = "auto"
# No model's context reaches this: a longer prompt or completion is a typo, and its estimate would be meaningless.
MAX_TOKENS = 10_000_000
# Counts held in int32 by torch's samplers and vLLM's request parameters.
MAX_COUNT = 2**31 - 1

# key → (low, high, low inclusive, high inclusive, who enforces or fails on it)
RANGES: dict[str, tuple[float | None, float | None, bool, bool, str]] = {
    "learning_rate": (0, None, False, True, "torch's optimizers reject a negative rate; 0 trains nothing"),
    "temperature": (0, None, False, True, "vLLM's SamplingParams; 0 is greedy: every completion of a group equal"),
    "top_p": (0, 1, False, True, "vLLM's SamplingParams: top_p must be in (0, 1]"),
    "top_k": (-1, None, True, True, "vLLM's SamplingParams: top_k must be -1 (off), 0 (off) or positive"),
    "min_p": (0, 1, True, True, "vLLM's SamplingParams: min_p must be in [0, 1]"),
    "repetition_penalty": (0, None, False, True, "vLLM's SamplingParams: repetition_penalty must be > 0"),
    # TRL waits this long for the server, and the launcher as long for one it starts (launch.vllm_health_timeout_s).
    "vllm_server_timeout": (1, 7 * 86400, True, True, "seconds to wait for the vLLM server"),
    "num_train_epochs": (0, None, False, True, "transformers' Trainer: a positive number of epochs"),
    "save_steps": (0, None, False, True, "transformers' Trainer: steps (or a fraction of the run) must be > 0"),
    "eval_steps": (0, None, False, True, "transformers' Trainer: steps (or a fraction of the run) must be > 0"),
    "logging_steps": (0, None, False, True, "transformers' TrainingArguments: logging_steps must be > 0"),
    "warmup_steps": (0, None, True, True, "TRL's GRPOConfig: warmup_steps >= 0"),
    "weight_decay": (0, None, True, True, "torch's AdamW rejects a negative weight decay"),
    "adam_beta1": (0, 1, True, False, "torch's Adam: betas in [0, 1)"),
    "adam_beta2": (0, 1, True, False, "torch's Adam: betas in [0, 1)"),
    "adam_epsilon": (0, None, True, True, "torch's Adam rejects a negative epsilon"),
    "max_grad_norm": (0, None, True, True, "transformers' Trainer: a clipping norm >= 0 (0 turns clipping off)"),
    "beta": (0, None, True, True, "GRPO's KL coefficient: >= 0 (0 drops the reference model)"),
    "epsilon": (0, None, False, True, "GRPO's clipping range: > 0"),
    "vllm_gpu_memory_utilization": (0, 1, False, True, "vLLM: gpu_memory_utilization in (0, 1]"),
    "vllm_server_port": (1, 65535, True, True, "a TCP port: TRL's client connects to it"),
    "vllm_group_port": (1, 65535, True, True, "a TCP port: the weight-sync process group listens on it"),
}
# Names that mean nothing empty: the run would fail on them (a dataset or model "" cannot load, an empty column is
# not in any dataset, an empty output_dir writes into the working directory).
NAME_KEYS = frozenset(
    {"model_name_or_path", "dataset_name", "dataset_prompt_column", "dataset_answer_column", "output_dir",
     "dataset_train_split", "dataset_test_split", "reward_model_name_or_path", "hub_model_id", "run_name"}
)  # fmt: skip
# A Hub id (name or org/name: letters, digits, - _ .), or a path: with a "/" or starting with "." or "~" (anything
# else the filesystem takes, spaces included; preflight checks it exists). No line breaks in either.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)?")
MODEL_KEYS = frozenset({"model_name_or_path", "reward_model_name_or_path"})
# Learning rates GRPO recipes use span 1e-7 (large models) to 1e-3 (the tiny CPU demo); beyond these, a typo.
LR_WARN = (1e-8, 1e-2)
LENGTH_KEYS = frozenset({"max_completion_length", "max_prompt_length", "vllm_max_model_length"})

_KIND_NAMES = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "list": "a list",
    "dict": "a mapping",
}


def _matches(kind: str, value: Any) -> bool:
    if value is None:
        return kind.endswith("?")
    base = kind.rstrip("?")
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)
    if base == "bool":
        return isinstance(value, bool)
    if base == "str":
        return isinstance(value, str)
    if base == "list":
        # A single string is accepted where TRL's argparser accepts one item (e.g. report_to: wandb).
        return isinstance(value, (list, str))
    if base == "dict":
        return isinstance(value, (dict, str))
    return True


def finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _in_range(key: str, value: Any) -> str | None:
    if key not in RANGES or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    low, high, low_in, high_in, why = RANGES[key]
    too_low = low is not None and (value < low or (value == low and not low_in))
    too_high = high is not None and (value > high or (value == high and not high_in))
    if not (too_low or too_high):
        return None
    lo = "" if low is None else ("[" if low_in else "(") + f"{low:g}"
    hi = "" if high is None else f"{high:g}" + ("]" if high_in else ")")
    bounds = f"in {lo}, {hi}" if low is not None and high is not None else (f"{'>=' if low_in else '>'} {low:g}")
    return f"{key} must be {bounds}, got {short(value)} ({why})"


def check_value(key: str, value: Any) -> str | None:
    """What is wrong with one recipe key's value, or None."""
    kind = RECIPE_KEYS.get(key)
    if kind is None:
        return f"unknown key {short(key)}{did_you_mean(key, RECIPE_KEYS)}"
    if value == AUTO and key in PLANNED_KEYS:
        return None
    if not _matches(kind, value):
        return f"{key} must be {_KIND_NAMES.get(kind.rstrip('?'), 'a value')}, got {short(value)}"
    if isinstance(value, int) and not isinstance(value, bool) and not finite(value):
        return f"{key} is too large: {short(value, 40)}"
    if key in POSITIVE_INT_KEYS and value is not None:
        if value <= 0:
            return f"{key} must be a positive integer, got {value}"
        if key in LENGTH_KEYS and value > MAX_TOKENS:
            return f"{key}={value} tokens is beyond any model's context (at most {MAX_TOKENS:,})"
        if value > MAX_COUNT:
            return f"{key}={short(value, 40)} is beyond what torch and vLLM count (at most {MAX_COUNT:,})"
    if key in NAME_KEYS and isinstance(value, str) and not value.strip():
        return f"{key} is empty: give a name, or leave the key out"
    named = key in MODEL_KEYS and isinstance(value, str) and value.strip()
    path = named and ("/" in value or value.startswith((".", "~"))) and not re.search(r"[\x00-\x1f]", value)
    if named and not (HUB_ID.fullmatch(value) or path):
        return (
            f"{key}: {short(value)} is neither a Hub id (org/name: letters, digits, - _ .) nor a path (a local "
            "directory starts with /, ./ or ~/)"
        )
    if key == "reward_funcs" and value == []:
        return "reward_funcs is empty: GRPO needs at least one reward (leave the key out for accuracy and format)"
    if key == "num_generations" and value == 1:
        return "num_generations must be at least 2: GRPO compares completions within a group"
    if key == "max_steps" and isinstance(value, int) and not isinstance(value, bool) and (value < -1 or value == 0):
        return f"max_steps must be a positive number of steps, or -1 to train by epochs; got {value}"
    problem = _in_range(key, value)
    if problem:
        return problem
    return _choice_problem(key, value)


def _choice_problem(key: str, value: Any) -> str | None:
    choices = CHOICES.get(key)
    if not choices or value is None:
        return None
    items = value if key == "report_to" and isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, str) and item not in choices:
            hint = did_you_mean(item, choices)
            listed = ", ".join(choices) if len(choices) <= 12 else ", ".join(choices[:12]) + ", …"
            return f"{key}: {short(item)} is not one of {listed}{hint}"
        if key == "report_to" and not isinstance(item, str):
            return f"report_to must list integration names, got {short(item)}"
    return None


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# Secret-valued keys and the environment variable that carries the same secret to the trainers (never into a file).
SECRET_KEYS = {"hub_token": "HF_TOKEN"}


def check_consistency(values: Mapping[str, Any]) -> list[str]:
    """Problems between keys that TRL or transformers would raise on only after a job has started."""
    problems = []
    for key, env in SECRET_KEYS.items():
        if values.get(key):
            problems.append(
                f"{key} in a recipe would be written to the run directory's files (trainer_recipe.yaml, plan.json): "
                f"remove it and set {env} in the environment, which reaches the trainers without being written"
            )
    if values.get("dataset_mixture") is not None:
        problems.append(
            "dataset_mixture (open-r1's dataset mixtures) is not loaded by grpo-launch's training entry: build the "
            "mixture once with datasets (concatenate_datasets / interleave_datasets), save_to_disk or push it, and "
            "set dataset_name to it"
        )
    if values.get("bf16") is True and values.get("fp16") is True:
        problems.append("bf16 and fp16 are both true: choose one (transformers refuses both)")
    rewards, weights = values.get("reward_funcs"), values.get("reward_weights")
    if isinstance(rewards, str):
        rewards = [rewards]
    if isinstance(rewards, list) and isinstance(weights, list) and len(weights) != len(rewards):
        problems.append(
            f"reward_weights has {len(weights)} weight(s) for {len(rewards)} reward function(s): give one per reward"
        )
    if isinstance(weights, list) and not all(_is_number(w) for w in weights):
        problems.append(f"reward_weights must be numbers, got {short(weights)}")
    if isinstance(rewards, list) and not all(isinstance(r, str) and r for r in rewards):
        problems.append(f"reward_funcs must be names or import paths (module:function), got {short(rewards)}")
    return problems


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)


def unlikely(values: Mapping[str, Any]) -> list[str]:
    """Values that run but are most likely typos: warnings, not refusals."""
    out = []
    lr: Any = values.get("learning_rate")
    if _is_number(lr) and lr > 0 and not LR_WARN[0] <= lr <= LR_WARN[1]:
        out.append(
            f"learning_rate={lr:g} is outside {LR_WARN[0]:g}–{LR_WARN[1]:g}, the range GRPO recipes use (open-r1 and "
            "TRL's examples: 1e-6 to 3e-6 for 1.5B–7B models, 1e-3 only for the tiny CPU demo): a typo?"
        )
    return out

"""Reward functions by name (accuracy, format, tag_count, digits, length), by open-r1's registry name (with open-r1
installed), or by import path ``package.module:function`` (names are checked in :mod:`grpo_launch.recipe.rewards`).

Each has TRL's reward signature ``f(prompts, completions, **kwargs) -> list[float | None]``; dataset columns arrive
as keyword lists (the answer column as ``answer``). Importing this module is cheap: math-verify loads on first use.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from grpo_launch.recipe.open_r1_schema import OPEN_R1_DEFAULTS
from grpo_launch.recipe.rewards import (
    OPEN_R1_INSTALL,
    OPEN_R1_MODULE,
    builtin_name,
    check_reward_names,
    is_open_r1_reward,
)

RewardFunc = Callable[..., list]

THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _text(completion: Any) -> str:
    """A completion as text: conversational completions are lists of messages."""
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def format_reward(prompts: list, completions: list, **_: Any) -> list[float]:
    """1 when the completion is exactly <think>…</think> <answer>…</answer>, else 0."""
    return [1.0 if THINK_ANSWER.match(_text(c)) else 0.0 for c in completions]


def tag_count_reward(prompts: list, completions: list, **_: Any) -> list[float]:
    """0.25 for each of the four tags that appears exactly once (partial credit while the format is learned)."""
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    return [sum(0.25 for t in tags if _text(c).count(t) == 1) for c in completions]


def accuracy_reward(prompts: list, completions: list, answer: list | None = None, **_: Any) -> list[float | None]:
    """1 when the completion's answer (inside <answer>, else the whole text) equals the reference, checked with
    math-verify; None (ignored by TRL) when the reference cannot be parsed."""
    if answer is None:
        raise ValueError("the accuracy reward needs the reference answers: set dataset_answer_column in the recipe")
    from math_verify import parse, verify

    out: list[float | None] = []
    for c, ref in zip(completions, answer, strict=False):
        gold = parse(str(ref))
        if not gold:
            out.append(None)
            continue
        text = _text(c)
        m = ANSWER.search(text)
        guess = parse(m.group(1) if m else text)
        out.append(1.0 if guess and verify(gold, guess) else 0.0)
    return out


def digits_reward(prompts: list, completions: list, **_: Any) -> list[float]:
    """The share of the completion's characters that are digits. A signal a random tiny model can climb within a
    CPU demo (it learns to answer with numbers); not a reward for real training."""
    out = []
    for c in completions:
        text = _text(c)
        out.append(sum(ch.isdigit() for ch in text) / len(text) if text else 0.0)
    return out


def length_reward(
    prompts: list, completions: list, completion_ids: list | None = None, *, max_completion_length: int, **_: Any
) -> list[float]:
    """1 − length / max_completion_length: prefers concise completions (tokens when known, else characters)."""
    sizes = [len(ids) for ids in completion_ids] if completion_ids is not None else [len(_text(c)) for c in completions]
    return [max(0.0, 1.0 - n / max_completion_length) for n in sizes]


def make_length_reward(max_completion_length: int) -> RewardFunc:
    """A functools.partial, not a closure: AsyncGRPOTrainer pickles its rewards into a spawned child
    (trl async_rollout_worker.py:1209), and TRL names a partial after the function it wraps (get_callable_name)."""
    return functools.partial(length_reward, max_completion_length=max_completion_length)


REGISTRY: dict[str, Callable[[Mapping[str, Any]], RewardFunc]] = {
    "accuracy": lambda cfg: accuracy_reward,
    "format": lambda cfg: format_reward,
    "tag_count": lambda cfg: tag_count_reward,
    "digits": lambda cfg: digits_reward,
    "length": lambda cfg: make_length_reward(int(cfg.get("max_completion_length") or 512)),
}


def load_reward(name: str, config: Mapping[str, Any]) -> RewardFunc:
    """A reward function by built-in name, open-r1's registry name, or import path. ``config`` holds the recipe's
    reward settings (max_completion_length, open-r1's cosine_* / code_* keys, reward_kwargs)."""
    key = builtin_name(name)
    if key is not None:
        return REGISTRY[key](config)
    problems = check_reward_names([name])
    if problems:
        raise ValueError(problems[0])
    if is_open_r1_reward(name):
        return _open_r1_reward(name, config)
    module_name, _, func_name = name.partition(":") if ":" in name else name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import reward module {module_name!r}: {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"{module_name!r} has no function {func_name!r}")
    return func


def _open_r1_reward(name: str, config: Mapping[str, Any]) -> RewardFunc:
    """open-r1's own reward through its own registry, built from open-r1's script-argument defaults and the
    recipe's values for them."""
    try:
        from open_r1.rewards import get_reward_funcs
    except ImportError as exc:
        raise ValueError(
            f"reward {name!r} is open-r1's ({OPEN_R1_MODULE}), and open-r1 cannot be imported in the trainers' "
            f"Python ({exc}); install it there: {OPEN_R1_INSTALL}"
        ) from exc
    settings = {**OPEN_R1_DEFAULTS, **{k: v for k, v in config.items() if k in OPEN_R1_DEFAULTS}}
    (func,) = get_reward_funcs(SimpleNamespace(**settings, reward_funcs=[name]))
    return func


class Weighted:
    """A reward scaled by its weight, picklable (a module-level class; AsyncGRPOTrainer pickles its rewards into a
    spawned child, async_rollout_worker.py:1209, and sums them unweighted: AsyncGRPOConfig has no reward_weights).
    Named after the reward it scales (TRL's get_callable_name reads ``__name__``)."""

    def __init__(self, func: RewardFunc, weight: float) -> None:
        self.func, self.weight = func, float(weight)
        self.__name__ = getattr(func, "__name__", None) or getattr(getattr(func, "func", None), "__name__", "reward")

    def __call__(self, *args: Any, **kwargs: Any) -> list:
        return [None if r is None else self.weight * r for r in self.func(*args, **kwargs)]

"""Reward names a recipe may give, checked without importing anything: grpo-launch's built-in rewards (by name or
open-r1's / TRL's spelling), open-r1's own registry (``open_r1.rewards.get_reward_funcs``, resolved in the trainers
when open-r1 is installed there), and import paths ``package.module:function``. The plan and the run's preflight
check names with the same code; :mod:`grpo_launch.train.rewards` resolves them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_launch.errors import did_you_mean, short
from grpo_launch.recipe.open_r1_schema import OPEN_R1_COMMIT, OPEN_R1_REWARDS

BUILTIN_REWARDS = ("accuracy", "format", "tag_count", "digits", "length")
# open-r1 / TRL spellings of the same functions.
ALIASES = {
    "accuracy_reward": "accuracy",
    "format_reward": "format",
    "think_format_reward": "format",
    "tag_count_reward": "tag_count",
    "length_reward": "length",
}
OPEN_R1_MODULE = "open_r1.rewards:get_reward_funcs"
OPEN_R1_INSTALL = f"pip install 'open-r1 @ git+https://github.com/huggingface/open-r1@{OPEN_R1_COMMIT}'"


def builtin_name(name: str) -> str | None:
    """The built-in reward a name means, or None."""
    key = ALIASES.get(name, name)
    return key if key in BUILTIN_REWARDS else None


def is_open_r1_reward(name: str) -> bool:
    """A name only open-r1's registry resolves (where both know a name, the built-in is used: it reads the answer
    column the training entry prepares)."""
    return builtin_name(name) is None and name in OPEN_R1_REWARDS


def is_import_path(name: str) -> bool:
    return ":" in name or ("." in name and not name.startswith("."))


def check_reward_names(names: list[str]) -> list[str]:
    """Problems with reward names."""
    problems = []
    for name in names:
        if builtin_name(name) or is_open_r1_reward(name):
            continue
        if is_import_path(name):
            module, _, func = name.partition(":") if ":" in name else name.rpartition(".")
            if module and func and all(p.isidentifier() for p in [*module.split("."), func]):
                continue
            problems.append(f"reward {short(name)} is not a valid import path (use package.module:function)")
            continue
        known = (*BUILTIN_REWARDS, *OPEN_R1_REWARDS)
        problems.append(
            f"unknown reward {short(name)}{did_you_mean(ALIASES.get(name, name), known)}; built-in: "
            f"{', '.join(BUILTIN_REWARDS)}; open-r1's ({OPEN_R1_MODULE}, with open-r1 installed): "
            f"{', '.join(r for r in OPEN_R1_REWARDS if r not in BUILTIN_REWARDS)}; or an import path "
            "package.module:function"
        )
    return problems


def reward_names(values: Mapping[str, Any]) -> list[str]:
    """The recipe's reward names (a single string is one name)."""
    rewards = values.get("reward_funcs") or []
    return [rewards] if isinstance(rewards, str) else [r for r in rewards if isinstance(r, str)]


def reward_imports(values: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """What the trainers must import for the recipe's rewards: the top-level modules of its import paths, with
    ``open_r1`` where a name only open-r1's registry resolves; and those names (the install hint names them)."""
    names = reward_names(values)
    open_r1 = [n for n in names if is_open_r1_reward(n)]
    modules = {n.partition(":")[0].split(".")[0] for n in names if is_import_path(n)}
    return sorted({*modules, "open_r1"} if open_r1 else modules), open_r1

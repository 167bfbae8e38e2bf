"""Recipes: the flat YAML TRL and open-r1 users write, plus an optional ``launch:`` block.

``load_recipe(path, overrides)`` reads the file, applies ``key=value`` overrides, migrates keys TRL renamed or
removed (each migration leaves a notice), checks every key and value, and returns a frozen :class:`Recipe`.
Every problem found is reported in one :class:`ConfigError`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

from grpo_launch.errors import ConfigError, short
from grpo_launch.recipe.launch import LaunchSettings, build_launch, check_launch
from grpo_launch.recipe.ledger import unused_notice
from grpo_launch.recipe.parse import parse_override, read_recipe_file
from grpo_launch.recipe.rewards import (
    OPEN_R1_INSTALL,
    OPEN_R1_MODULE,
    check_reward_names,
    is_open_r1_reward,
    reward_names,
)
from grpo_launch.recipe.trl_schema import CONVERSIONS
from grpo_launch.recipe.values import AUTO, check_consistency, check_value, unlikely
from grpo_launch.spec import frozen

__all__ = ["LOCAL_DATA_SUFFIXES", "LaunchSettings", "Recipe", "as_planned", "build_recipe", "load_recipe"]


# dataset_name values with these suffixes are local files, loaded with the datasets builder named here.
LOCAL_DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


@frozen
class Migration:
    """What to do with a key TRL (or transformers) renamed or removed."""

    old: str
    new: str | None  # None: removed, value dropped with the notice
    why: str
    convert: Any = None  # optional callable old value -> new value


def _first_config(value: Any) -> Any:
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    if isinstance(value, list):
        raise ConfigError(
            f"dataset_configs lists {len(value)} configs {value!r}; TRL 1.16 loads one (dataset_config)",
            hint="Set dataset_config to one of them.",
        )
    return value


MIGRATIONS: tuple[Migration, ...] = (
    Migration("torch_dtype", "dtype", "transformers 5 renamed torch_dtype to dtype"),
    Migration("dataset_configs", "dataset_config", "TRL's ScriptArguments take one dataset_config", _first_config),
    Migration("warmup_ratio", "warmup_steps", "transformers 5 takes a ratio in warmup_steps (a float below 1)"),
    Migration("evaluation_strategy", "eval_strategy", "transformers renamed evaluation_strategy to eval_strategy"),
    Migration("vllm_max_model_len", "vllm_max_model_length", "TRL renamed vllm_max_model_len"),
    Migration("vllm_guided_decoding_regex", "vllm_structured_outputs_regex", "TRL renamed vllm_guided_decoding_regex"),
    Migration(
        "overwrite_output_dir",
        None,
        "removed in transformers 5; grpo-launch resumes from the newest checkpoint in output_dir "
        "(choose a new output_dir for a fresh run)",
    ),
    Migration(
        "vllm_device",
        None,
        "removed from TRL; grpo-launch assigns the vLLM GPUs itself (set launch.vllm_gpus to choose how many)",
    ),
    Migration("vllm_dtype", None, "removed from TRL; vLLM takes the model's dtype"),
    Migration("vllm_enable_prefix_caching", None, "removed from TRL; the vLLM server enables prefix caching"),
    Migration("wandb_log_unique_prompts", None, "removed from TRL 1.16; completions are logged with log_completions"),
    Migration(
        "num_processes",
        None,
        "not a TRL key; grpo-launch derives the number of training processes from the GPUs "
        "(on CPU set launch.num_processes)",
    ),
)


_MIGRATIONS_BY_KEY = {m.old: m for m in MIGRATIONS}


@frozen
class Recipe:
    """A checked recipe. ``values`` holds the TRL-level keys (after migration); ``launch`` grpo-launch's own."""

    values: Mapping[str, Any]
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    source: str | None = None
    notices: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # values that run but are likely mistakes
    migrated: tuple[str, ...] = ()  # the old keys renamed into ``values`` (their notices are in ``notices``)

    def is_set(self, key: str) -> bool:
        """True if the user gave ``key`` a concrete value (not absent, not "auto")."""
        return key in self.values and self.values[key] != AUTO

    def get(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key, default)
        return default if value == AUTO else value

    @property
    def name(self) -> str:
        return Path(self.source).stem if self.source else "recipe"


def load_recipe(path: str | Path | None, overrides: Sequence[str] = ()) -> Recipe:
    """Read a recipe file, apply ``key=value`` overrides and check it all."""
    data = read_recipe_file(path) if path is not None else {}
    return build_recipe(data, [parse_override(o) for o in overrides], source=str(path) if path else None)


def build_recipe(
    data: Mapping[str, Any], overrides: Iterable[tuple[str, Any]] = (), *, source: str | None = None
) -> Recipe:
    """Check a recipe given as a mapping (pure). Collects every problem before raising."""
    values = {str(k): v for k, v in data.items() if k != "launch"}
    launch_raw = data.get("launch") or {}
    problems: list[str] = []
    if not isinstance(launch_raw, dict):
        problems.append(f"launch: must be a mapping of grpo-launch settings, got {short(launch_raw)}")
        launch_raw = {}
    launch_raw = dict(launch_raw)
    for key, value in overrides:
        if key.startswith("launch."):
            launch_raw[key.removeprefix("launch.")] = value
        elif key == "launch":
            problems.append("override 'launch=…' is not supported: set one field, e.g. launch.vllm=server")
        else:
            values[key] = value

    given_launch = sorted(launch_raw)  # before a TRL key sets one of its launch twins
    notices: list[str] = []
    migrated: list[str] = []  # the renamed keys whose value moved (their notice may need the planned value)
    values = _convert(_migrate(values, notices, problems, migrated), notices)
    refused = {key: problem for key, value in values.items() if (problem := check_value(key, value))}
    problems += refused.values()
    # The checks between keys read only values that passed their own check (reward_funcs: 3 is refused once, above).
    checked = {key: value for key, value in values.items() if key not in refused}
    problems += check_consistency(checked)
    names = reward_names(checked)
    problems += check_reward_names(names)
    open_r1 = [n for n in names if is_open_r1_reward(n)]
    if open_r1:
        notices.append(
            f"reward_funcs {', '.join(open_r1)}: open-r1's own ({OPEN_R1_MODULE}); the trainers' Python needs "
            f"open-r1: {OPEN_R1_INSTALL}"
        )
    timeout = checked.get("vllm_server_timeout")
    if (
        "vllm_health_timeout_s" not in launch_raw
        and isinstance(timeout, (int, float))
        and not isinstance(timeout, bool)
    ):
        # TRL's wait for the server to come up is the launcher's health wait when it starts the server: the user's
        # value, not the launcher's default.
        launch_raw["vllm_health_timeout_s"] = timeout
        notices.append(
            f"vllm_server_timeout={timeout:g}: the launcher waits that long for a vLLM server it starts "
            "(launch.vllm_health_timeout_s)"
        )
    launch = build_launch(launch_raw, problems)
    problems += check_launch(launch)
    if launch.num_processes is None and isinstance(data.get("num_processes"), int):
        # open-r1's demo recipes carry num_processes; on CPU it is the only hint of the wanted process count.
        launch = dataclasses.replace(launch, num_processes=data["num_processes"])

    if unused := unused_notice(checked, launch, given_launch):  # the key ledger: every key used, or named here
        notices.append(unused)
    if problems:
        where = f"recipe {source!r}" if source else "recipe"
        raise ConfigError(f"{where} has {len(problems)} problem{'s' if len(problems) > 1 else ''}:", problems=problems)
    return Recipe(
        values=values,
        launch=launch,
        source=source,
        notices=tuple(notices),
        warnings=tuple(unlikely(values)),
        migrated=tuple(migrated),
    )


def _convert(values: dict[str, Any], notices: list[str]) -> dict[str, Any]:
    """The other forms TRL's own ``__post_init__`` accepts for a key (``scale_rewards: false``), turned into the
    value TRL turns them into, so every check and the plan see that value; the user is told."""
    out = dict(values)
    for key, table in CONVERSIONS.items():
        value = out.get(key)
        for given, becomes in table.items():
            if type(value) is type(given) and value == given:
                out[key] = becomes
                notices.append(f"{key}: {short(value)} means {becomes!r} (TRL's GRPOConfig converts it)")
                break
    return out


def _migrate(values: dict[str, Any], notices: list[str], problems: list[str], migrated: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        m = _MIGRATIONS_BY_KEY.get(key)
        if m is None:
            out.setdefault(key, value)
            continue
        if m.new is None:
            notices.append(f"{key}: dropped — {m.why}")
            continue
        if m.new in values:
            problems.append(f"{key} and {m.new} are both set; {m.why}: keep only {m.new}")
            continue
        try:
            out[m.new] = m.convert(value) if m.convert else value
        except ConfigError as exc:
            problems.append(exc.render())
            continue
        notices.append(migration_notice(m, out[m.new]))
        migrated.append(key)
    return out


def migration_notice(m: Migration, value: Any, planned: Any = None) -> str:
    """What a migration did, and with ``planned`` the value the trainer recipe gets when the plan changed the
    recipe's (dtype under DDP: float32 master weights), so the notice never contradicts the rendered recipe."""
    if planned is not None and planned != value:
        return (
            f"{m.old}: migrated to {m.new} — {m.why}; the recipe's {value!r} becomes {m.new}={planned!r} in the "
            f"trainer recipe (the plan's Why row {m.new} says why)"
        )
    return f"{m.old}: migrated to {m.new}={value!r} — {m.why}"


def as_planned(recipe: Recipe, notices: Sequence[str], planned: Mapping[str, Any]) -> list[str]:
    """``notices`` (the recipe's among them) with each migration's notice saying the value the trainer recipe gets
    (``planned``: the planned trainer values) where the plan changed the migrated value."""
    changed: dict[str, str] = {}
    for old in recipe.migrated:
        m = _MIGRATIONS_BY_KEY[old]
        assert m.new is not None  # only renames are recorded
        value, given = recipe.values.get(m.new), planned.get(m.new)
        if given is not None and given != value:
            changed[migration_notice(m, value)] = migration_notice(m, value, given)
    return [changed.get(n, n) for n in notices]

"""Recipes: the flat YAML TRL and open-r1 users write, plus an optional ``launch:`` block.

``load_recipe(path, overrides)`` reads the file, applies ``key=value`` overrides, migrates keys TRL renamed or
removed (each migration leaves a notice), checks every key and value, and returns a frozen :class:`Recipe`.
Every problem found is reported in one :class:`ConfigError`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_launch.errors import ConfigError, did_you_mean
from grpo_launch.recipe_keys import OPEN_R1_UNUSED
from grpo_launch.recipe_values import AUTO, ENV_NAME, check_consistency, check_value, finite, short
from grpo_launch.recipe_yaml import parse_override, read_recipe_file, yaml_load

__all__ = [
    "AUTO",
    "LOCAL_DATA_SUFFIXES",
    "LaunchSettings",
    "Recipe",
    "build_recipe",
    "did_you_mean",
    "load_recipe",
    "parse_override",
    "yaml_load",
]

# dataset_name values with these suffixes are local files, loaded with the datasets builder named here.
LOCAL_DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class LaunchSettings:
    """grpo-launch's own settings: the recipe's optional ``launch:`` block."""

    vllm: str = field(default=AUTO, metadata={"choices": ("auto", "server", "colocate", "off")})
    vllm_gpus: int | None = field(default=None, metadata={"min": 1, "max": 4096})
    vllm_tensor_parallel_size: int | None = field(default=None, metadata={"min": 1, "max": 4096})
    vllm_port: int = field(default=8000, metadata={"min": 1, "max": 65535})
    vllm_host: str | None = field(default=None, metadata={"kind": "str"})
    vllm_gpu_memory_utilization: float | None = field(
        default=None, metadata={"min": 0.05, "max": 0.99, "kind": "float"}
    )
    vllm_max_model_len: int | None = field(default=None, metadata={"min": 1, "max": 10_000_000})
    vllm_command: tuple[str, ...] = field(default=("vllm", "serve"), metadata={"nonempty": True})
    vllm_extra_args: tuple[str, ...] = ()
    vllm_env: Mapping[str, str] = field(default_factory=dict)
    vllm_health_timeout_s: float = field(default=900.0, metadata={"min": 1, "max": 7 * 86400})
    backend: str = field(default=AUTO, metadata={"choices": ("auto", "ddp", "zero2", "zero3", "fsdp")})
    offload: str = field(default=AUTO, metadata={"choices": ("auto", "none", "optimizer", "optimizer+params")})
    num_processes: int | None = field(default=None, metadata={"min": 1, "max": 4096})
    main_process_port: int = field(default=29500, metadata={"min": 1, "max": 65535})
    run_dir: str | None = field(default=None, metadata={"kind": "str"})
    grace_period_s: float = field(default=30.0, metadata={"min": 0, "max": 3600})
    train_env: Mapping[str, str] = field(default_factory=dict)
    # → GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for every process
    network_interface: str | None = field(
        default=None, metadata={"kind": "str", "pattern": r"[A-Za-z0-9_.:@-]{1,15}", "what": "an interface name"}
    )
    # Rows of the training set, for the time and cost to train (counted from a local file when unset).
    dataset_rows: int | None = field(default=None, metadata={"min": 1, "max": 10**12})
    gpu_hour_price: float | None = field(
        default=None, metadata={"min": 0, "kind": "float"}
    )  # price of one GPU-hour, any currency
    # Mean completion length in tokens, for the step time (default: every completion runs to max_completion_length).
    expected_completion_length: int | None = field(default=None, metadata={"min": 1, "max": 10_000_000})
    # Supervision: restarts after failures that are not the user's code, from the newest complete checkpoint.
    max_restarts: int = field(default=0, metadata={"min": 0, "max": 1000})
    restart_backoff_s: float = field(default=10.0, metadata={"min": 0, "max": 3600})  # doubles per restart
    on_oom: str = field(default="stop", metadata={"choices": ("stop", "replan")})
    # The progress watchdog: no optimizer step within these bounds stops the run with every rank's stack.
    first_step_timeout_s: float = field(default=3600.0, metadata={"min": 1, "max": 7 * 86400})
    hang_timeout_s: float | None = field(default=None, metadata={"min": 1, "max": 7 * 86400, "kind": "float"})
    # Wall-clock limit of a run in seconds: save a checkpoint and stop before it (a Slurm job's own limit applies too).
    time_limit_s: float | None = field(default=None, metadata={"min": 1, "max": 365 * 86400, "kind": "float"})


LAUNCH_FIELDS = {f.name: f for f in dataclasses.fields(LaunchSettings)}


@dataclass(frozen=True)
class Recipe:
    """A checked recipe. ``values`` holds the TRL-level keys (after migration); ``launch`` grpo-launch's own."""

    values: Mapping[str, Any]
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    source: str | None = None
    notices: tuple[str, ...] = ()

    def is_set(self, key: str) -> bool:
        """True if the user gave ``key`` a concrete value (not absent, not "auto")."""
        return key in self.values and self.values[key] != AUTO

    def get(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key, default)
        return default if value == AUTO else value

    @property
    def name(self) -> str:
        return Path(self.source).stem if self.source else "recipe"


# ---------------------------------------------------------------------------------------------------------------
# Parsing


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

    notices: list[str] = []
    values = _migrate(values, notices, problems)
    for key, value in values.items():
        problem = check_value(key, value)
        if problem:
            problems.append(problem)
    problems += check_consistency(values)
    launch = _build_launch(launch_raw, problems)
    problems += check_launch(launch)
    if launch.num_processes is None and isinstance(data.get("num_processes"), int):
        # open-r1's demo recipes carry num_processes; on CPU it is the only hint of the wanted process count.
        launch = dataclasses.replace(launch, num_processes=data["num_processes"])

    unused = sorted(k for k in values if k in OPEN_R1_UNUSED)
    if unused:
        notices.append(f"open-r1 keys accepted but not used by grpo-launch's training entry: {', '.join(unused)}")
    if problems:
        where = f"recipe {source!r}" if source else "recipe"
        raise ConfigError(f"{where} has {len(problems)} problem{'s' if len(problems) > 1 else ''}:", problems=problems)
    return Recipe(values=values, launch=launch, source=source, notices=tuple(notices))


def _migrate(values: dict[str, Any], notices: list[str], problems: list[str]) -> dict[str, Any]:
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
        notices.append(f"{key}: migrated to {m.new}={out[m.new]!r} — {m.why}")
    return out


def _build_launch(raw: Mapping[str, Any], problems: list[str]) -> LaunchSettings:
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        f = LAUNCH_FIELDS.get(key)
        if f is None:
            problems.append(f"unknown launch setting {short(key)}{did_you_mean(str(key), LAUNCH_FIELDS)}")
            continue
        factory = f.default_factory
        default = f.default if f.default is not dataclasses.MISSING else (factory() if callable(factory) else None)
        problem, converted = _convert_launch(key, value, default, f.metadata)
        if problem:
            problems.append(problem)
        else:
            kwargs[key] = converted
    return LaunchSettings(**kwargs)


def _convert_launch(key: str, value: Any, default: Any, meta: Mapping[str, Any]) -> tuple[str | None, Any]:
    name = f"launch.{key}"
    if value is None or (value == AUTO and default in (None, AUTO)):
        return None, default
    if "choices" in meta:
        if value is False and "off" in meta["choices"]:
            value = "off"  # YAML 1.1 reads a bare `off` as false
        if value not in meta["choices"]:
            return f"{name} must be one of {', '.join(meta['choices'])}; got {short(value)}", None
        return None, value
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = value.split()
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            return f"{name} must be a list of strings, got {short(value)}", None
        if meta.get("nonempty") and not value:
            return f"{name} must not be empty (e.g. [vllm, serve])", None
        return None, tuple(str(v) for v in value)
    if isinstance(default, Mapping):
        if not isinstance(value, dict):
            return f"{name} must be a mapping of NAME: value, got {short(value)}", None
        bad = [k for k in value if not (isinstance(k, str) and ENV_NAME.match(k))]
        if bad:
            return f"{name}: {short(bad[0])} is not an environment variable name (letters, digits, _)", None
        if not all(isinstance(v, (str, int, float, bool)) for v in value.values()):
            return f"{name} values must be strings, got {short(value)}", None
        return None, {str(k): str(v) for k, v in value.items()}
    if meta.get("kind") == "str":
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            return f"{name} must be a string, got {short(value)}", None
        pattern = meta.get("pattern")
        if pattern and not re.fullmatch(pattern, str(value)):
            return f"{name}: {short(value)} is not {meta.get('what', 'valid')}", None
        return None, str(value)
    if isinstance(default, float) or meta.get("kind") == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{name} must be a number, got {short(value)}", None
        if not finite(value):
            return f"{name} must be a finite number, got {short(value, 40)}", None
    elif isinstance(value, bool) or not isinstance(value, int):
        return f"{name} must be an integer, got {short(value)}", None
    lo, hi = meta.get("min"), meta.get("max")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        return f"{name} must be {bounds}, got {short(value, 40)}", None
    return None, value


def check_launch(launch: LaunchSettings) -> list[str]:
    """Problems between launch settings."""
    problems = []
    if launch.vllm != "off" and launch.vllm_port == launch.main_process_port:
        problems.append(
            f"launch.vllm_port and launch.main_process_port are both {launch.vllm_port}: the vLLM server and the "
            "trainers' rendezvous need different ports"
        )
    return problems

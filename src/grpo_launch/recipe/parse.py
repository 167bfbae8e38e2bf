"""Reading recipe YAML: YAML 1.2 scalars, no duplicate keys, a bounded acyclic tree (no alias bombs, no
self-reference, no 5000-deep nesting), and ``key=value`` overrides. Every failure is one ConfigError."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from grpo_launch.errors import ConfigError, short

# libyaml's parser when PyYAML has it (ten times faster on a recipe); the resolvers and the constructor below are
# Python's either way.
_SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeLoader):
    """SafeLoader with YAML 1.2 scalars: ``1e-5`` is a float (learning_rate), and only true/false are booleans,
    so ``save_strategy: no`` and ``vllm: off`` stay strings instead of turning into false."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)

_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _no_duplicate_keys(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (str, int, float, bool)) and key in seen:  # (an unhashable key: construct_mapping says)
            raise yaml.constructor.ConstructorError(
                None, None, f"key {short(key)} appears twice (the first would be silently lost)", key_node.start_mark
            )
        if isinstance(key, (str, int, float, bool)):
            seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)

MAX_DEPTH = 64  # a recipe is a few levels deep
MAX_NODES = 100_000  # values after aliases are expanded (an alias bomb expands to billions)


def _check_tree(data: Any) -> None:
    """Refuse what no recipe is: a structure that refers to itself through an alias, one nested deeper than
    MAX_DEPTH, or one whose aliases expand beyond MAX_NODES values."""
    count = 0
    stack: list[tuple[Any, int, frozenset[int], str]] = [(data, 0, frozenset(), "")]
    while stack:
        node, depth, parents, top = stack.pop()
        where = f"{top}: " if top else ""
        count += 1
        if count > MAX_NODES:
            raise yaml.YAMLError(f"{where}more than {MAX_NODES:,} values once its aliases are expanded")
        if depth > MAX_DEPTH:
            raise yaml.YAMLError(f"{where}nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, (dict, list)):
            if id(node) in parents:
                raise yaml.YAMLError(f"{where}an alias refers to the value that contains it")
            items = list(node.items()) if isinstance(node, dict) else [(None, c) for c in node]
            for key, child in items:
                name = top
                if isinstance(key, str) and (depth == 0 or (depth == 1 and top == "launch")):
                    name = f"{top}.{key}" if top else key  # a key, or a launch setting
                if key is not None:
                    stack.append((key, depth + 1, parents | {id(node)}, name))
                stack.append((child, depth + 1, parents | {id(node)}, name))


def yaml_load(text: str) -> Any:
    """YAML with the recipe rules (see _Loader), no duplicate keys, and a bounded, acyclic result."""
    try:
        data = yaml.load(text, Loader=_Loader)
    except RecursionError:
        raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels") from None
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):  # libyaml's own limit (CSafeLoader), met before ours
            raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels ({exc})") from None
        raise
    _check_tree(data)
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """``"max_steps=3"`` → ``("max_steps", 3)``; the value is parsed as YAML (``reward_funcs=[a,b]`` is a list)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(c.isspace() for c in key):
        raise ConfigError(
            f"override must be in the form key=value, got {short(text)}",
            hint="Example: grpo-launch plan recipes/qwen1.5b.yaml num_generations=4 launch.vllm=colocate",
        )
    try:
        value = yaml_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {short(text)}: value is not valid YAML ({_yaml_reason(exc)})") from None
    return key, value


def _yaml_reason(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else str(problem)


def read_recipe_file(path: str | Path) -> dict[str, Any]:
    """Read a recipe's YAML into a dict (the only file I/O in this module)."""
    p = Path(path)
    name = short(str(p), 200)
    try:
        if p.is_dir():
            raise ConfigError(
                f"recipe {name} is a directory, not a file",
                hint="Give the path to a YAML recipe inside it, e.g. recipes/qwen1.5b.yaml.",
            )
        if not p.is_file():
            raise ConfigError(
                f"recipe {name} not found", hint="Give the path to a YAML recipe, e.g. recipes/qwen1.5b.yaml."
            )
        text = p.read_text()
    except OSError as exc:  # permission, I/O error, a name too long
        raise ConfigError(f"cannot read recipe {name}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"recipe {name} is not a UTF-8 text file") from None
    try:
        data = yaml_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"recipe {name} is not valid YAML: {_yaml_reason(exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {name} must be a YAML mapping of key: value, got a {type(data).__name__}")
    return data

"""Backends' options on the command line: each backend declares a frozen dataclass whose fields name their flag
(:func:`grpo_launch.backends.base.option`); the CLI adds those flags to a parser and fills the dataclass from the
parsed arguments. Backends never see argparse."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from grpo_launch.errors import ConfigError


def add_options(parser: argparse.ArgumentParser, options: type, groups: dict[str, Any] | None = None) -> None:
    """A flag for every field of ``options`` that declares one (``groups``: the help sections already made)."""
    groups = {} if groups is None else groups
    for f in dataclasses.fields(options):
        meta = dict(f.metadata)
        flag = meta.pop("flag", None)
        if flag is None:
            continue
        group_name = meta.pop("group", None)
        target: Any = parser
        if group_name:
            target = groups.setdefault(group_name, parser.add_argument_group(group_name))
        kwargs = {k: v for k, v in meta.items() if v is not None}
        if kwargs.get("action") == "append":
            kwargs["default"] = []
        elif "required" not in kwargs:
            kwargs["default"] = f.default
        if kwargs.get("action") in (None, "append") and "metavar" not in kwargs and "choices" not in kwargs:
            kwargs["metavar"] = f.name.upper()  # argparse would show the namespaced dest (SBATCHOPTIONS.NODES)
        target.add_argument(flag, dest=_dest(f.name, options), **kwargs)


def read_options(args: argparse.Namespace, options: type) -> Any:
    """``options`` filled from the parsed arguments (fields without a flag keep their defaults)."""
    values = {}
    for f in dataclasses.fields(options):
        if "flag" not in f.metadata:
            continue
        value = getattr(args, _dest(f.name, options), f.default)
        values[f.name] = tuple(value) if isinstance(value, list) else value
    filled = options(**values)
    problems = filled.problems()  # every options class derives from BackendOptions (tests/test_backends.py)
    if problems:
        raise ConfigError(f"{len(problems)} option{'s' if len(problems) > 1 else ''} cannot work:", problems=problems)
    return filled


def _dest(name: str, options: type) -> str:
    """Each backend's fields in their own namespace, so two backends may name a field alike."""
    return f"{options.__name__}.{name}"

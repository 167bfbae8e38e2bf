"""Reading a run file's JSON values into typed fields (standard library only: the trainers import the records).

Two ways, one per kind of record. The lenient helpers (:func:`number`, :func:`float_or`, …) read the lines the
trainers and the launcher append while a run goes (a newer writer may add keys, an older one may lack some); they
never fail on a missing key. :class:`Fields` reads a record whose every key is required (plan.json as its readers use
it): a missing or mistyped key is a :class:`RunFileError` naming the file and the key, so a key renamed on the
writing side fails loudly instead of reading as a default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from grpo_launch.enums import StrEnum
from grpo_launch.errors import ConfigError

E = TypeVar("E", bound=StrEnum)


class RunFileError(ConfigError):
    """A run file (plan.json, metrics.jsonl, attempts.jsonl, …) that cannot be read as its record: the message
    names the file, and the key or line."""


def file_error(path: str | Path, where: str, problem: str) -> RunFileError:
    return RunFileError(
        f"{path}{where}: {problem}",
        hint="The run directory's files are written by grpo-launch; one edited by hand or written by another "
        "version may not read. Re-plan the run (grpo-launch plan RECIPE --run-dir RUN_DIR) to rewrite plan.json.",
    )


# How deep a run file's JSON may nest. grpo-launch's own records nest a few levels; Python's parser recurses per
# level and raises RecursionError near 1,000, and whatever walks a value again (json.dumps, a deep compare) recurses
# as deep: a crafted line is refused here, well before either.
MAX_DEPTH = 64


def loads(text: str | bytes) -> Any:
    """``json.loads`` for a run file's text: a value nested deeper than :data:`MAX_DEPTH` (a crafted metrics line
    1,200 levels deep) is a ValueError, as text that is not JSON is, so every reader skips or refuses it as it does
    a malformed line, never a RecursionError in ``status``, ``report`` or ``--calibrate-from``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    stack = [(value, 1)]
    while stack:  # without recursion: the check must not fail the way it guards against
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= MAX_DEPTH:
                    raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
                stack.append((child, depth + 1))
    return value


def number(value: Any) -> bool:
    """A finite JSON number (not a bool: JSON's true is not 1 here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def float_or(value: Any, default: float = 0.0) -> float:
    return float(value) if number(value) else default


def float_or_none(value: Any) -> float | None:
    return float(value) if number(value) else None


def int_or_none(value: Any) -> int | None:
    return int(value) if number(value) else None


def enum_or_none(kind: type[E], value: Any) -> E | None:
    try:
        return kind(value)
    except ValueError:
        return None


def whole(value: Any, what: str) -> int:
    """A required whole number of a record line (a step, an attempt): anything else is a ValueError the strict
    reader turns into an error naming the line."""
    if value is None:
        return 0
    if not number(value) or value != int(value):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    return int(value)


def seconds(value: Any, what: str) -> float:
    if not number(value):
        raise ValueError(f"{what} must be a finite number of seconds, got {value!r}")
    return float(value)


_KINDS = {str: "a string", int: "a whole number", float: "a number", dict: "an object", list: "a list"}


class Fields:
    """The keys of one JSON object of a run file, each required: ``Fields(data, "RUN/plan.json").text("recipe")``.
    ``at`` is the object's place in the file (``estimate.time_s``), for the message."""

    def __init__(self, data: Any, file: str | Path, at: str = "") -> None:
        if not isinstance(data, dict):
            raise file_error(file, f": {at}" if at else "", f"is not a JSON object (got {type(data).__name__})")
        self.data: dict[str, Any] = data
        self.file = file
        self.at = at

    def _where(self, key: str) -> str:
        return f"{self.at}.{key}" if self.at else key

    def _error(self, key: str, problem: str) -> RunFileError:
        return file_error(self.file, "", f"key {self._where(key)!r} {problem}")

    def _value(self, key: str, kind: type, null: bool) -> Any:
        if key not in self.data:
            raise self._error(key, "is missing")
        value = self.data[key]
        if value is None and null:
            return None
        ok = number(value) if kind in (int, float) else isinstance(value, kind)
        if kind is int and ok:
            ok = value == int(value)
        if not ok:
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise self._error(key, f"must be {_KINDS[kind]}{' or null' if null else ''}, got {shown}")
        return value

    def text(self, key: str) -> str:
        return str(self._value(key, str, False))

    def text_or_none(self, key: str) -> str | None:
        value = self._value(key, str, True)
        return None if value is None else str(value)

    def integer(self, key: str) -> int:
        return int(self._value(key, int, False))

    def integer_or_none(self, key: str) -> int | None:
        value = self._value(key, int, True)
        return None if value is None else int(value)

    def real(self, key: str) -> float:
        return float(self._value(key, float, False))

    def real_or_none(self, key: str) -> float | None:
        value = self._value(key, float, True)
        return None if value is None else float(value)

    def obj(self, key: str) -> Fields:
        return Fields(self._value(key, dict, False), self.file, self._where(key))

    def obj_or_none(self, key: str) -> Fields | None:
        value = self._value(key, dict, True)
        return None if value is None else Fields(value, self.file, self._where(key))

    def mapping(self, key: str) -> dict[str, Any]:
        """An object kept as it is (its keys are open: the trainer values)."""
        return dict(self._value(key, dict, False))

    def sequence(self, key: str) -> list[Any]:
        return list(self._value(key, list, False))

    def objects(self, key: str) -> Iterator[Fields]:
        """A list of objects, each read strictly."""
        for i, item in enumerate(self._value(key, list, False)):
            yield Fields(item, self.file, f"{self._where(key)}[{i}]")

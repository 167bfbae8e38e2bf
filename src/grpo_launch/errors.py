"""The one error hierarchy, and typed fixes. The CLI turns errors into a message and an exit code; nothing else
exits."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from grpo_launch.spec import frozen


@frozen
class Fix:
    """A change that makes a refused plan valid: set ``setting`` to ``value`` (and the ``also`` settings).

    ``setting`` is a recipe key (``num_generations``, ``launch.offload``), or with ``in_recipe=False`` a change
    outside the recipe ("gpus": more of them); ``value`` may be a tuple of equally good choices.
    ``rank`` orders fixes by what they change (the batch before the algorithm before the hardware); ``cost`` orders
    fixes of one rank by how far they move from the request.
    """

    setting: str
    value: Any
    reason: str = ""
    rank: int = 0
    cost: float = 0.0
    also: tuple[tuple[str, Any], ...] = ()
    in_recipe: bool = True

    @property
    def choices(self) -> tuple[Any, ...]:
        return self.value if isinstance(self.value, tuple) else (self.value,)

    def assignments(self) -> tuple[tuple[str, Any], ...]:
        """(key, value) pairs to apply, with the first of several equal choices."""
        return ((self.setting, self.choices[0]), *self.also) if self.in_recipe else ()

    def overrides(self) -> list[str]:
        """The fix as ``key=value`` command-line overrides (empty for a change outside the recipe)."""
        return [f"{k}={override_value(v)}" for k, v in self.assignments()]

    def __str__(self) -> str:
        if not self.in_recipe:
            return self.reason
        text = f"set {self.setting}={' or '.join(map(override_value, self.choices))}"
        text += "".join(f" with {k}={override_value(v)}" for k, v in self.also)
        return text + (f" ({self.reason})" if self.reason else "")


def short(value: Any, limit: int = 80) -> str:
    """A value's repr, cut to ``limit`` characters: a recipe or a command line may hold anything (an alias tree, a
    megabyte string), and a message must stay readable."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def size_text(n: float) -> str:
    """Bytes in the unit that shows them (3 significant digits): "512 B", "8.0 MiB", "1.25 GiB", "3.2 TiB"."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n:.0f} B"


def is_decimal(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` and ``re``'s ``\\d`` also accept '²', '٣' or '８', which ``int`` then reads
    or refuses."""
    return text.isascii() and text.isdigit()


def override_value(value: Any) -> str:
    """A value as a ``key=value`` override spells it (YAML, no spaces: one shell word): true, null, [a,b]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def install_hint(extras: str) -> str:
    """How to install grpo-launch with ``extras`` ("ray", "train,vllm"): from its checkout, as the package is not on
    the package index (README, Install)."""
    return f"pip install '.[{extras}]' in grpo-launch's checkout (it is not on the package index)"


def rank_fixes(fixes: Iterable[Fix]) -> tuple[Fix, ...]:
    """Distinct fixes, nearest first."""
    unique = {str(f): f for f in fixes}
    return tuple(sorted(unique.values(), key=lambda f: (f.rank, f.cost)))


class GrpoLaunchError(Exception):
    """Base class. ``exit_code`` is what the CLI returns for it."""

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        problems: Iterable[str] = (),
        hint: str | None = None,
        fixes: Iterable[Fix] = (),
        explain: Iterable[str] = (),
    ) -> None:
        self.message = message
        self.problems = tuple(problems)
        self.hint = hint
        self.fixes = rank_fixes(fixes)
        self.explain = tuple(explain)  # the arithmetic behind a refusal (``plan --explain`` prints it)
        super().__init__(message)

    def __str__(self) -> str:
        return self.render()

    def render(self, *, explain: bool = False) -> str:
        """The full user-facing text: the message, every problem, the fixes (nearest first), then the hint; with
        ``explain``, the arithmetic behind it last."""
        lines = [self.message]
        lines += [f"  - {p}" for p in self.problems]
        if self.fixes:
            lines.append("Nearest valid alternatives:")
            lines += [f"  {i}. {f}" for i, f in enumerate(self.fixes[:6], 1)]
        if self.hint:
            lines.append(self.hint)
        if explain and self.explain:
            lines.append("The arithmetic (nearest candidates first):")
            lines += [f"  {line}" for line in self.explain]
        elif self.explain:
            lines.append("(grpo-launch plan --explain shows the arithmetic)")
        return "\n".join(lines)


class ConfigError(GrpoLaunchError):
    """The recipe, an override or a command-line value is wrong."""

    exit_code = 2


class ProbeError(GrpoLaunchError):
    """The machine description (CUDA_VISIBLE_DEVICES, --gpus, Slurm, hostfile) cannot be read."""

    exit_code = 2


class PlanError(GrpoLaunchError):
    """No valid plan exists for this recipe on this topology."""

    exit_code = 2


class LaunchError(GrpoLaunchError):
    """Starting the processes failed, or what they need is missing."""

    exit_code = 1


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    import difflib

    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""

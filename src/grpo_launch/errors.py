"""The one error hierarchy. The CLI turns these into a message and an exit code; nothing else exits."""

from __future__ import annotations

from collections.abc import Iterable


class GrpoLaunchError(Exception):
    """Base class. ``exit_code`` is what the CLI returns for it."""

    exit_code = 1

    def __init__(self, message: str, *, problems: Iterable[str] = (), hint: str | None = None) -> None:
        self.message = message
        self.problems = tuple(problems)
        self.hint = hint
        super().__init__(message)

    def __str__(self) -> str:
        return self.render()

    def render(self) -> str:
        """The full user-facing text: the message, every problem, then the hint."""
        lines = [self.message]
        lines += [f"  - {p}" for p in self.problems]
        if self.hint:
            lines.append(self.hint)
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
    """Starting or supervising the processes failed."""

    exit_code = 1

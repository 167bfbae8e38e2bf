"""launch.adapt's decisions as ``control/attempts.jsonl`` keeps them, with the attempt they were made in
(:class:`~grpo_launch.rundir.records.Attempt`): made by ``planning/after_run/adapt.py``, read by ``status``
and the report. Standard library only."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from grpo_launch.enums import AdaptAction
from grpo_launch.rundir.json_fields import enum_or_none, float_or, float_or_none, int_or_none
from grpo_launch.spec import frozen


class UnknownAction(ValueError):
    """A launch.adapt decision whose action this version does not know."""


@frozen
class AdaptRecord:
    """One launch.adapt decision, as ``control/attempts.jsonl`` keeps it (``status`` and the report read it). Times
    are seconds per prompt: ``measured_s`` on the running split; ``predicted_s`` what its plan predicted;
    ``calibrated_s`` the running split re-predicted with the measurements; ``new_s`` the split moved to, predicted
    the same way (a revert: the measured time of the split returned to)."""

    action: AdaptAction
    reason: str
    at_step: int
    split: str
    measured_s: float
    predicted_s: float | None = None
    calibrated_s: float | None = None
    new_split: str | None = None
    new_s: float | None = None

    def __post_init__(self) -> None:
        # a plain "resplit" becomes the enum member (ValueError for a word that is none), so `.action.moves` holds
        object.__setattr__(self, "action", AdaptAction(self.action))

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(AdaptRecord)}
        out["action"] = str(self.action)
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> AdaptRecord:
        """Raises :class:`UnknownAction` (a ValueError) for an action this version does not know: what follows a
        decision depends on it."""
        action = enum_or_none(AdaptAction, row.get("action"))
        if action is None:
            known = ", ".join(AdaptAction)
            raise UnknownAction(
                f"a launch.adapt decision with the unknown action {row.get('action')!r} (known: {known})"
            )
        new_split = row.get("new_split")
        return cls(
            action=action,
            reason=str(row.get("reason") or ""),
            at_step=int_or_none(row.get("at_step")) or 0,
            split=str(row.get("split") or ""),
            measured_s=float_or(row.get("measured_s")),
            predicted_s=float_or_none(row.get("predicted_s")),
            calibrated_s=float_or_none(row.get("calibrated_s")),
            new_split=new_split if isinstance(new_split, str) else None,
            new_s=float_or_none(row.get("new_s")),
        )

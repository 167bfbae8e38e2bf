"""The vLLM versions TRL supports, and how a version string is compared with them (pure, standard library only).

A fact about the TRL release the recipe schema is generated from (:mod:`.trl_schema`, TRL 1.16): its ``vllm`` extra
pins ``vllm>=0.22,<0.32`` (pyproject's ``vllm`` extra mirrors it). It sits here, below every stage that uses it:
render/ (the server's flags), the run's preflight and the backends' host checks import it downward. Not in
probe/pythons.py, which another interpreter runs alone as a script and which only reads the installed version.
"""

from __future__ import annotations

TRL_VLLM_RANGE = ((0, 22), (0, 31))  # TRL 1.16's vllm extra, (major, minor) both ends included
TRL_VLLM_RANGE_TEXT = "–".join(f"{major}.{minor}" for major, minor in TRL_VLLM_RANGE)  # "0.22–0.31", for messages


def version_tuple(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string such as ``0.31.0+cpu``; None when unreadable."""
    parts = (version or "").split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()))
    except (IndexError, ValueError):
        return None

"""The model's shape, from a local ``config.json`` (a directory, or the Hugging Face cache's copy) or the built-in
table. Never downloads."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from grpo_launch.models.builtin import find_model_shape
from grpo_launch.models.config import shape_from_config
from grpo_launch.models.shape import ModelShape


def cached_config(model: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """A hub model's config.json in the local Hugging Face cache (``HF_HUB_CACHE``, ``HF_HOME/hub`` or
    ~/.cache/huggingface/hub), the snapshot ``refs/main`` points at, else the newest; never downloads."""
    env = os.environ if environ is None else environ
    if model.count("/") != 1 or model.startswith(("/", ".")):
        return None
    home = env.get("HF_HOME") or str(Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface")
    repo = Path(env.get("HF_HUB_CACHE") or Path(home) / "hub") / ("models--" + model.replace("/", "--"))
    try:
        ref = (repo / "refs" / "main").read_text().strip()
        candidates = [repo / "snapshots" / ref / "config.json"]
    except OSError:
        candidates = sorted((repo / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime)[::-1]
    return next((c for c in candidates if c.is_file()), None)


def resolve_model_shape(
    model: str | None, environ: Mapping[str, str] | None = None
) -> tuple[ModelShape | None, str | None]:
    """The model's shape from a local ``config.json`` (a directory, or the hub cache's copy) or the built-in table;
    (None, warning) if unknown."""
    if not model:
        return None, "no model_name_or_path in the recipe"
    config = Path(model) / "config.json"
    if not config.is_file():
        config = cached_config(model, environ) or config
    if config.is_file():
        try:
            return shape_from_config(model, json.loads(config.read_text())), None
        except (ValueError, KeyError, TypeError) as exc:
            return None, f"cannot read model shape from {config}: {exc!r}"
    shape = find_model_shape(model)
    if shape:
        return shape, None
    return None, (
        f"model {model!r} is not in the built-in table and has no local config.json: "
        "tensor-parallel size and memory are not checked"
    )

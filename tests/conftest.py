"""Shared fixtures. Heavy fixtures (tiny model, TRL oracle) are built once per session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


TINY = ROOT / ".cache" / "tiny"


def ensure_tiny_assets() -> Path:
    """The tiny local model + dataset (scripts/make_tiny_assets.py; skips work when already built)."""
    if not (TINY / "model" / "config.json").is_file() or not (TINY / "data" / "train.jsonl").is_file():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_tiny_assets.py"), str(TINY)], check=True, capture_output=True
        )
    return TINY


@pytest.fixture(scope="session")
def tiny_assets() -> Path:
    return ensure_tiny_assets()


def require_root_tool(present: bool, flag: str, what: str) -> None:
    """Skip a real-system test when ``what`` is missing or we are not root, unless ``flag``=1 (CI) makes that a
    failure: a skip there would hide a broken set-up."""
    import os

    if present and os.geteuid() == 0:
        return
    if os.environ.get(flag) == "1":
        pytest.fail(f"{what} is required ({flag}=1) but is missing or this is not root")
    pytest.skip(f"{what} not installed or not root: run scripts/install_system_packages.sh")

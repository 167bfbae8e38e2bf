"""Shared fixtures. Heavy fixtures (tiny model, TRL oracle) are built once per session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny local model + dataset (scripts/make_tiny_assets.py), built once per test session."""
    out = tmp_path_factory.mktemp("tiny")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_assets.py"), str(out)], check=True,
                   capture_output=True)  # fmt: skip
    return out

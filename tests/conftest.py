"""Shared fixtures (the helpers themselves are in tests/helpers.py). Heavy fixtures are built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import ensure_tiny_assets, plan_recipe


@pytest.fixture(scope="session")
def tiny_assets() -> Path:
    return ensure_tiny_assets()


@pytest.fixture
def plan_of():
    """Plan a recipe for simulated GPUs: ``plan_of(values_or_recipe_or_path, "8xH100-80GB", "key=value", …)``
    (:func:`tests.helpers.plan_recipe`)."""
    return plan_recipe

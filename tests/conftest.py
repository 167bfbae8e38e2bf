"""Shared fixtures (the helpers themselves are in tests/helpers.py). Heavy fixtures are built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Hermetic: nothing is downloaded here, and plan's one Hub metadata request (the training set's rows) is not made;
# tests/test_dataset_rows.py serves the Hub's API locally where it tests that request.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Nor is a `grpo-launch calibrate` of the developer's machine (~/.cache/grpo-launch/calibrations) read by a plan here:
# tests/test_calibrate.py gives each test its own folder.
os.environ.setdefault("GRPO_LAUNCH_CALIBRATIONS", os.path.join(os.sep, "nonexistent", "grpo-launch-test-calibrations"))

from .helpers import ensure_tiny_assets, plan_recipe

# The markers of tests that share one set of machine-wide resources: the network-namespace hosts (h1, h2, … at fixed
# addresses), the Slurm test cluster's daemons and Ray clusters. scripts/test.sh runs the suite on two workers
# (pytest-xdist, --dist loadgroup): these all go to one of them, one at a time; everything else takes free ports of
# its own and runs beside them.
ONE_AT_A_TIME = ("slurm", "ssh", "ray")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the group into each test's id
def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(name) for name in ONE_AT_A_TIME):
            item.add_marker(pytest.mark.xdist_group("hosts"))


@pytest.fixture(scope="session")
def tiny_assets() -> Path:
    return ensure_tiny_assets()


@pytest.fixture
def plan_of():
    """Plan a recipe for simulated GPUs: ``plan_of(values_or_recipe_or_path, "8xH100-80GB", "key=value", …)``
    (:func:`tests.helpers.plan_recipe`)."""
    return plan_recipe

"""Shared fixtures (the helpers themselves are in tests/helpers.py). Heavy fixtures are built once per session."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

import pytest

# Hermetic: nothing is downloaded here, and plan's one Hub metadata request (the training set's rows) is not made;
# tests/test_dataset_rows.py serves the Hub's API locally where it tests that request.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Nor is a `grpo-launch calibrate` of the developer's machine (~/.cache/grpo-launch/calibrations) read by a plan here:
# tests/test_calibrate.py gives each test its own folder.
os.environ.setdefault("GRPO_LAUNCH_CALIBRATIONS", os.path.join(os.sep, "nonexistent", "grpo-launch-test-calibrations"))

from .helpers import ensure_tiny_assets, plan_recipe

# The markers of tests that share machine-wide resources: the network-namespace hosts (h1, h2, … at fixed addresses),
# the Slurm test cluster's daemons and ports, Ray clusters. Two of them must never run at once, whether the suite's
# two workers (scripts/test.sh) or two suites on one machine run them: each test module holding one takes this
# machine's lock for as long as its tests and its module fixtures (a cluster, the hosts) live. Everything else takes
# free ports of its own and runs beside them.
ONE_AT_A_TIME = ("slurm", "ssh", "ray")
HOSTS_LOCK = Path(tempfile.gettempdir()) / "grpo-launch-tests-hosts.lock"


@pytest.fixture(scope="module", autouse=True)
def _one_module_on_the_hosts_at_a_time(request):
    """Autouse and module-scoped, so it is set up before the module's own fixtures (the cluster, the hosts) and torn
    down after them."""
    mine = [i for i in request.session.items if getattr(i, "module", None) is request.module]
    if not any(i.get_closest_marker(name) for i in mine for name in ONE_AT_A_TIME):
        yield
        return
    with open(HOSTS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def tiny_assets() -> Path:
    return ensure_tiny_assets()


@pytest.fixture
def plan_of():
    """Plan a recipe for simulated GPUs: ``plan_of(values_or_recipe_or_path, "8xH100-80GB", "key=value", …)``
    (:func:`tests.helpers.plan_recipe`)."""
    return plan_recipe

"""Shared fixtures (the helpers themselves are in tests/helpers.py). Heavy fixtures are built once per session."""

from __future__ import annotations

import fcntl
import json
import os
import re
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


# Each module's seconds in a recent run (scripts/module_seconds.py writes it from a suite's log).
MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")
_MARKED = re.compile(r"pytest\.mark\.(" + "|".join(ONE_AT_A_TIME) + r")\b")


def hosts_modules(root: Path) -> set[str]:
    """The test modules (paths under ``root``) holding a slurm, ssh or ray test, read from their marks' text: the
    scheduler needs them before any worker has collected a test."""
    tests = Path(__file__).parent
    return {p.relative_to(root).as_posix() for p in tests.rglob("test_*.py") if _MARKED.search(p.read_text())}


def pytest_collection_modifyitems(config, items):
    """The longest work first: the modules by their seconds, the hosts modules as one block of their summed seconds
    (one worker runs them one after another: :func:`pytest_xdist_make_scheduler`); modules without a figure after
    them, in collection order. The two workers then end on short modules instead of one waiting while the other runs
    a long one alone. Only the order changes."""
    try:
        seconds = json.loads(MODULE_SECONDS.read_text())
    except (OSError, ValueError):
        return
    root = Path(str(config.rootpath))
    hosts = hosts_modules(root)
    together = sum(float(seconds.get(m, 0.0)) for m in hosts)

    def took(item: pytest.Item) -> tuple[float, bool]:
        module = Path(str(item.path)).relative_to(root).as_posix()
        return (-together, False) if module in hosts else (-float(seconds.get(module, 0.0)), True)

    items.sort(key=took)  # stable: within a module, and among modules without a figure, the collection order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With --dist loadscope (scripts/test.sh): whole modules per worker, and every hosts module in one unit, so one
    worker runs them in turn and the other never waits on their lock."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    hosts = hosts_modules(Path(str(config.rootpath)))

    class HostsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "hosts" if nodeid.split("::", 1)[0] in hosts else super()._split_scope(nodeid)

    return HostsTogether(config, log)


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

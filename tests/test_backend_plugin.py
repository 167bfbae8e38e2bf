"""A backend from another package: tests/data/toy_backend is a real package outside grpo-launch's source, installed
here with pip into a folder of its own and put on PYTHONPATH (a temporary environment: the suite's .venv is not
touched). It registers one class under the entry-point group grpo_launch.backends, with its options (--toy-cluster),
detection (the flag, or TOY_CLUSTER), probe, placement (``toyrun --host HOST --``) and a submit verb (toy-submit).
Nothing of it is named in grpo_launch; plan, run --dry-run and the verb go through it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

QWEN = str(ROOT / "recipes" / "qwen1.5b.yaml")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The toy package, copied out of the tree and installed with pip (no index, no build isolation: offline)."""
    where = tmp_path_factory.mktemp("toy")
    shutil.copytree(ROOT / "tests" / "data" / "toy_backend", where / "pkg")
    args = ["--no-deps", "--no-build-isolation", "--no-index", "--target", str(where / "site"), str(where / "pkg")]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert list((where / "site").glob("grpo_launch_toy_backend-*.dist-info"))
    return where / "site"


def cli(site: Path | None, *argv: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    environ.pop("PYTHONPATH", None)
    if site is not None:
        environ["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-m", "grpo_launch", *argv], cwd=ROOT, env=environ, capture_output=True, text=True
    )


def test_a_backend_from_another_package_plans_on_its_machines(site):
    done = cli(site, "plan", QWEN, "--toy-cluster", "2x8xH100-80GB", "--no-write")
    assert done.returncode == 0, done.stderr
    assert "on 2 × 8 × H100-80GB" in done.stdout
    assert "toy0  0-7" in done.stdout and "toy1  0-7" in done.stdout and "main toy0:" in done.stdout
    # Chosen by the environment as well, as Slurm is by SLURM_JOB_ID:
    env = cli(site, "plan", QWEN, "--no-write", "--json", TOY_CLUSTER="1x8xH100-80GB")
    assert env.returncode == 0, env.stderr
    assert '"source": "toy"' in env.stdout and '"name": "toy0"' in env.stdout


def test_its_placement_wraps_every_process_in_a_dry_run(site, tmp_path):
    done = cli(site, "run", QWEN, "--toy-cluster", "2x8xH100-80GB", "--dry-run", "--run-dir", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stdout.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, done.stdout
    for host, line in zip(("toy0", "toy1"), commands, strict=True):
        assert f"toyrun --host {host} -- " in line and "accelerate.commands.launch" in line, line


def test_its_submit_verb_plans_and_prints_its_submission(site, tmp_path):
    done = cli(site, "toy-submit", QWEN, "--toy-nodes", "2", "--dry-run", "--run-dir", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!/bin/sh\n# toy job: 2 machines\nexec grpo-launch run "), done.stdout
    assert "qwen1.5b.yaml on 2 × 8 × H100-80GB" in done.stdout
    # The batch is the user's: the job's run is pinned to the one planned here, as sbatch's is.
    assert "per_device_train_batch_size=1" in done.stdout and "gradient_accumulation_steps=8" in done.stdout
    # Without --dry-run its Submitter (BaseSubmitter's finish) writes the submission and the command's record
    # into the run directory, then submits: the toy scheduler refuses, and that error is the command's.
    run = tmp_path / "s"
    sent = cli(site, "toy-submit", QWEN, "--toy-nodes", "2", "--run-dir", str(run))
    assert sent.returncode == 2 and "the toy scheduler takes no jobs" in sent.stderr, sent.stderr
    assert (run / "toy-job.sh").read_text().startswith("#!/bin/sh\n# toy job: 2 machines\n")
    assert '"verb": "toy-submit"' in (run / "invocation.json").read_text()


def test_its_flags_and_problems_are_its_own(site):
    bad = cli(site, "plan", QWEN, "--toy-cluster", "eight", "--no-write")
    assert bad.returncode == 2 and "--toy-cluster 'eight': name machines as --gpus does" in bad.stderr, bad.stderr
    both = cli(site, "plan", QWEN, "--toy-cluster", "2x8xH100-80GB", "--gpus", "8xH100-80GB", "--no-write")
    assert both.returncode == 2 and "--gpus and --toy-cluster both say which machines" in both.stderr, both.stderr


def test_without_the_package_its_flag_and_verb_are_unknown():
    flag = cli(None, "plan", QWEN, "--toy-cluster", "2x8xH100-80GB", "--no-write")
    assert flag.returncode == 2 and "unrecognized arguments: --toy-cluster" in flag.stderr, flag.stderr
    verb = cli(None, "toy-submit", QWEN, "--dry-run")
    assert verb.returncode == 2 and "unknown command 'toy-submit'" in verb.stderr, verb.stderr


def test_grpo_launch_names_no_backend_of_another_package():
    """Nothing in grpo_launch knows the toy backend: the package alone makes it work."""
    for path in (ROOT / "src" / "grpo_launch").rglob("*.py"):
        assert "toy" not in path.read_text().lower(), path


def _registered(site: Path, name: str, target: str, module: str = "") -> Path:
    """A folder for PYTHONPATH holding a distribution that registers ``target`` as the backend ``name`` (and, with
    ``module``, that module's source as ``target``'s module)."""
    info = site / f"{name}_plugin-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plugin\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[grpo_launch.backends]\n{name} = {target}\n")
    if module:
        (site / f"{target.split(':')[0]}.py").write_text(module)
    return site


# Options declared with dataclasses' own frozen flag, as a plugin written from dataclasses' docs would be.
FROZEN_BY_DATACLASSES = (
    "from dataclasses import dataclass\n"
    "from grpo_launch.backends.base import BackendOptions\n"
    "@dataclass(frozen=True)\nclass DcOptions(BackendOptions):\n    cluster: str = ''\n"
)
# A backend whose submit verb is one of grpo-launch's own.
TAKES_SBATCH = (
    "from grpo_launch.backends.base import BaseBackend\n"
    "class Clash(BaseBackend):\n    name = 'clash'\n    submit_verb = 'sbatch'\n"
    "    detect = create = probe = classmethod(lambda cls, *a: None)\n"
)


def test_a_broken_or_clashing_registration_is_named(tmp_path):
    """A registered object that is not a backend, that takes a built-in name or verb, or whose options dataclasses
    refuses: one error naming the entry point (and for the options, the decorator to use), not a traceback."""
    for name, target, module, said in (
        ("bad", "json:dumps", "", ["the backend 'bad' (json:dumps, entry point group grpo_launch.backends) is not"]),
        ("slurm", "json:JSONDecoder", "", ["grpo-launch already has a backend of that name"]),
        ("gone", "no_such_module_here:X", "", ["cannot be loaded: ModuleNotFoundError"]),
        ("dc", "dc_backend:DcOptions", FROZEN_BY_DATACLASSES,
         ["cannot inherit frozen dataclass", "with @grpo_launch.spec.frozen"]),
        ("clash", "clash_backend:Clash", TAKES_SBATCH, ["its submit_verb 'sbatch' is a verb of grpo-launch's own"]),
    ):  # fmt: skip
        site = _registered(tmp_path / name, name, target, module)
        done = cli(site, "plan", QWEN, "--no-such-flag", "x", "--no-write")
        assert done.returncode == 2 and all(text in done.stderr for text in said), done.stderr

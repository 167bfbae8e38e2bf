"""What a newcomer tripped over (issue 28): `run --gpus` on GPUs that are not here, plan-time checks of what the run
or vLLM would reject later, console lines and flags. Each test runs the CLI in-process, as a user would."""

from __future__ import annotations

import pytest

from grpo_launch.cli import main
from grpo_launch.errors import ConfigError
from grpo_launch.machines.topology import parse_gpu_spec

from .helpers import TINY_RECIPE, tiny_overrides


def test_run_with_gpus_that_are_not_here_is_refused_before_anything_starts(tmp_path, capsys):
    """The trainers used to die 8 s later with "Your setup doesn't support bf16/gpu"."""
    run = tmp_path / "run"
    argv = ["run", TINY_RECIPE, *tiny_overrides(tmp_path), "use_cpu=false", "--run-dir", str(run)]
    assert main([*argv, "--gpus", "4xL20-48GB"], environ={}) == 2
    err = capsys.readouterr().err
    assert "--gpus 4xL20-48GB describes GPUs that are not here" in err and "--dry-run" in err
    assert not run.exists()
    assert main([*argv, "--gpus", "4xL20-48GB", "--dry-run"], environ={}) == 0  # a dry run is what --gpus is for


def test_a_spec_that_disagrees_with_this_machines_gpus_is_refused_and_one_that_agrees_runs():
    """A GPU machine: ``here`` is what the probe would return on 8 H100s (fake: no GPU on this machine)."""
    from grpo_launch.cli.common import _refuse_simulated

    here = parse_gpu_spec("8xH100-80GB")
    _refuse_simulated("8xH100", parse_gpu_spec("8xH100"), here)
    for spec in ("4xH100-80GB", "8xA100-80GB", "2x8xH100-80GB", "cpu"):
        with pytest.raises(ConfigError, match=r"not here \(this machine: 8 × H100"):
            _refuse_simulated(spec, parse_gpu_spec(spec), here)
    _refuse_simulated("cpu", parse_gpu_spec("cpu"), parse_gpu_spec("cpu"))  # CPU on a CPU machine is what is here


def test_a_use_cpu_recipe_is_not_warned_that_nvml_is_missing(tmp_path, capsys):
    """No NVML driver on this machine: news for a GPU recipe, noise on every run of the use_cpu demo recipe."""
    from grpo_launch.probe.local import probe_local

    if not any("NVML" in w for w in probe_local({}).warnings):
        pytest.skip("this machine has an NVML driver")
    base = ["run", TINY_RECIPE, *tiny_overrides(tmp_path), "max_steps=3", "--dry-run", "--run-dir", str(tmp_path)]
    assert main(base, environ={}) == 0
    assert "NVML" not in capsys.readouterr().out
    assert main([*base, "use_cpu=false"], environ={}) == 0
    assert "NVML" in capsys.readouterr().out  # a recipe that did not ask for CPU is told why it gets one

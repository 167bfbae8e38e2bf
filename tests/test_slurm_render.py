"""The sbatch renderer (pure) and the srun step wrapper: golden output, hostile values, refusals."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_launch.backends.slurm.allocation import expand_counts, parse_job_gres, parse_node_addresses, srun_spec
from grpo_launch.backends.slurm.sbatch import SbatchRequest, parse_job_id, render_sbatch_script
from grpo_launch.errors import ConfigError
from grpo_launch.node.shim import select_gpus
from grpo_launch.spec import ProcessSpec

GOLDEN = Path(__file__).parent / "golden"

BASE = SbatchRequest(
    recipe="/shared/recipes/qwen7b-math.yaml",
    run_dir="/shared/runs/qwen7b",
    workdir="/shared/work",
    python="/shared/venv/bin/python",
    nodes=2,
    gpus_per_node=8,
    overrides=("max_steps=500", "launch.vllm_port=8001"),
    partition="gpu",
    time="1-00:00:00",
    account="rl-team",
    extra_args=("--qos=high",),
)

HOSTILE = 'it\'s "$(touch /tmp/pwned)" `id` $HOME; rm -rf ~'


def test_golden_script():
    assert render_sbatch_script(BASE) == (GOLDEN / "qwen7b-2x8.sbatch").read_text()


def test_script_is_valid_bash_and_carries_the_resubmit_essentials():
    script = render_sbatch_script(BASE)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    for directive in ("--nodes=2", "--gpus-per-node=8", "--signal=B:USR2@90", "--requeue", "--open-mode=append"):
        assert f"#SBATCH {directive}\n" in script
    assert "exec /shared/venv/bin/python -m grpo_launch run --slurm /shared/recipes/qwen7b-math.yaml" in script


def _fake_python(tmp_path: Path) -> Path:
    """An executable standing in for python that records the argv the shell gave it."""
    out = tmp_path / "argv.json"
    fake = tmp_path / "fake python"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(out)!r}, 'w'))\n")
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize(
    "field",
    ["overrides", "run_dir", "recipe", "job_name", "workdir"],
)
def test_hostile_values_reach_grpo_launch_unchanged(tmp_path, field):
    """Run the rendered script with bash: the command grpo-launch receives is exactly what was asked, and nothing
    in a value is executed."""
    fake = _fake_python(tmp_path)
    values = {
        "overrides": {"overrides": (f"run_name={HOSTILE}", "max_steps=3")},
        "run_dir": {"run_dir": f"/shared/runs/{HOSTILE.replace('/', '_')}"},
        "recipe": {"recipe": f"/shared/{HOSTILE.replace('/', '_')}.yaml"},
        "job_name": {"job_name": HOSTILE},
        "workdir": {"workdir": f"/tmp/{HOSTILE.replace('/', '_')}"},
    }[field]
    req = SbatchRequest(**{**BASE.__dict__, "python": str(fake), "extra_args": (), **values})
    script = render_sbatch_script(req)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv == ["-m", "grpo_launch", "run", "--slurm", req.recipe, *req.overrides, "--run-dir", req.run_dir]
    assert not Path("/tmp/pwned").exists()
    # The directives hold the value shell-quoted too (sbatch reads them with shell-like quoting).
    if field == "job_name":
        assert f"#SBATCH --job-name={shlex.quote(HOSTILE)}\n" in script


@pytest.mark.parametrize(
    "change, message",
    [
        ({"job_name": "a\nb"}, "--job-name contains a line break"),
        ({"overrides": ("run_name=x\n#SBATCH --nodes=99",)}, "override 'run_name' contains a line break"),
        ({"run_dir": "/runs/a\nb"}, "--run-dir contains a line break"),
        ({"extra_args": ("--qos=a\nb",)}, "extra sbatch argument contains a line break"),
        ({"time": "tomorrow"}, "--time 'tomorrow' is not a Slurm time"),
        ({"partition": "gpu; rm"}, "--partition 'gpu; rm' has characters"),
        ({"job_name": "a\\b"}, "backslash"),
        ({"nodes": 0}, "--nodes must be at least 1"),
    ],
)
def test_refused_values(change, message):
    with pytest.raises(ConfigError) as e:
        render_sbatch_script(SbatchRequest(**{**BASE.__dict__, **change}))
    assert message in e.value.render()


def test_percent_in_run_dir_is_not_a_slurm_pattern():
    script = render_sbatch_script(SbatchRequest(**{**BASE.__dict__, "run_dir": "/runs/100%done"}))
    assert "#SBATCH --output=/runs/100%%done/slurm-%j.out\n" in script


def test_parsers():
    assert parse_job_id("1234\n") == "1234" and parse_job_id("77;cluster2") == "77"
    assert expand_counts("72(x2),36") == [72, 72, 36]
    text = "     Nodes=n[1-2] CPU_IDs=0-1 Mem=0 GRES=gpu:4(IDX:0-3)\n     Nodes=n3 CPU_IDs=0 Mem=0 GRES=\n"
    from grpo_launch.backends.slurm.allocation import expand_nodelist

    assert parse_job_gres(text, expand_nodelist) == {"n1": 4, "n2": 4, "n3": 0}
    assert parse_node_addresses("NodeName=n1 Arch=x NodeAddr=127.0.0.1 NodeHostName=localhost") == {"n1": "127.0.0.1"}


def test_srun_step_narrows_gpus_by_position():
    spec = ProcessSpec(name="vllm", argv=("vllm", "serve", "m"), env={"A": "1"}, host="gpu02", gpus=("6", "7"))
    step = srun_spec(spec, python="/venv/bin/python", gpus_on_node=8, cpus_on_node=64)
    assert step.argv[: step.argv.index("--")] == (
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=gpu02",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--job-name=vllm",
        "--cpus-per-task=64",
        "--gres=gpu:8",
        "/venv/bin/python",
        "-m",
        "grpo_launch.node.shim",
        "--hold-term",
        "--gpus",
        "6,7",
    )
    assert step.argv[step.argv.index("--") + 1 :] == ("vllm", "serve", "m")
    assert "CUDA_VISIBLE_DEVICES" not in step.env and step.env["A"] == "1"


@pytest.mark.parametrize(
    "inherited, positions, expected",
    [
        ("0,1,2,3", "2,3", "2,3"),
        ("4,5,6,7", "2,3", "6,7"),
        (None, "1", "1"),
        ("GPU-a,GPU-b", "1", "GPU-b"),
        ("0", "", ""),
    ],
)
def test_task_selects_gpu_positions(inherited, positions, expected):
    assert select_gpus(inherited, positions) == expected


def test_task_refuses_a_position_the_allocation_lacks():
    with pytest.raises(SystemExit, match="fewer GPUs than planned"):
        select_gpus("0,1", "2")

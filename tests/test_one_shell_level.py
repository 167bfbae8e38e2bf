"""One shell level everywhere: a value holding ``$(…)``, backticks, both quotes, a backslash and a space, given as
the recipe path, an override, the run directory, the working directory and the Python, reaches ``grpo-launch
run``'s argv byte for byte through each backend's real quoting path, and nothing in it runs (no marker file).

Each backend's path, as its batch system or transport executes it (checked against their code):

- Ray (``ray-submit``): the entrypoint Ray's job server runs with ``subprocess.Popen(entrypoint, shell=True)``
  (ray 2.60 dashboard/modules/job/job_supervisor.py, ``_exec_entrypoint``), run here the same way; the entrypoint
  runs RUN_DIR/ray-job.sh by path. The real job server is tests/test_ray_cluster.py's hostile ray-submit test.
- ssh: ``ssh HOST -- LINE``: sshd runs LINE with the user's shell ``-c`` (here ``bash -c``).
- Slurm: the sbatch script, a file bash runs (``#!/bin/bash``).
- SkyPilot: the task's ``run:`` as SkyPilot 0.14.1's own loader returns it (``sky.Task.from_yaml`` in .venv-sky),
  which SkyPilot writes to a file and runs with ``/bin/bash -i FILE`` (sky/skylet/log_lib.py,
  ``run_bash_command_with_log``): the line that starts grpo-launch, run by bash.

No cluster is started: the value's path ends at a recorder standing in for the Python, which writes its argv.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from subprocess import list2cmdline

import pytest

from grpo_launch.backends.ray.submit import RaySubmitOptions, RaySubmitter
from grpo_launch.backends.slurm.sbatch import SbatchRequest, render_sbatch_script
from grpo_launch.backends.ssh import remote_command
from grpo_launch.backends.submission import SubmitJob
from grpo_launch.spec import ProcessSpec, RunContext

from .helpers import ROOT, plan_recipe

SKY_PYTHON = ROOT / ".venv-sky" / "bin" / "python"


def hostile(tmp_path: Path) -> str:
    """``$(…)`` and backticks that would create marker files (in the directory they run in: the commands run in
    ``tmp_path`` or below it), both quotes, a backslash, a space; no ``/``, so that it can name a directory."""
    return "x$(touch M1)y`touch M2`'\"\\ z"


def markers(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("M[12]"))


def recorder(tmp_path: Path, value: str) -> Path:
    """An executable standing in for the nodes' Python, in a directory named with ``value``: writes its argv."""
    directory = tmp_path / f"bin {value}"
    directory.mkdir()
    path = directory / "python"
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "open(os.environ['ARGV_OUT'], 'w').write(json.dumps(sys.argv[1:]))\n")  # fmt: skip
    path.chmod(0o755)
    return path


def recorded(out: Path) -> list[str]:
    assert out.exists(), "the recorder did not run"
    return json.loads(out.read_text())


def env_for(out: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ARGV_OUT": str(out), "HOME": str(out.parent)}


def test_ray_submit_entrypoint_reaches_grpo_launch_run_byte_exact(tmp_path):
    """The entrypoint ray-submit sends is ``bash RUN_DIR/ray-job.sh``, run as Ray's job server runs it (one
    ``sh -c``); recipe, override, run directory, working directory and Python arrive as given; nothing runs."""
    value = hostile(tmp_path)
    python, out = recorder(tmp_path, value), tmp_path / "argv.json"
    run_dir, workdir = tmp_path / f"run {value}", tmp_path / f"work {value}"
    workdir.mkdir()
    plan = plan_recipe(ROOT / "recipes" / "qwen7b-math.yaml", "2x8xH100", run_dir=run_dir)
    job = SubmitJob(str(tmp_path / f"recipe {value}.yaml"), (f"run_name={value}",))
    submitter = RaySubmitter()
    ctx = RunContext(str(python), str(workdir), {}, print)
    submission = submitter.request(job, plan, RaySubmitOptions(address="10.0.0.1:6379"), ctx)
    assert submission.path == str(run_dir / "ray-job.sh")
    run_dir.mkdir()
    Path(submission.path).write_text(submission.text)
    assert submitter.job is not None and shlex.split(submitter.job.entrypoint) == ["bash", submission.path]
    assert submitter.job.submission_id.startswith("grpo-run-x-touch-M1-y-touch-M2-z-")  # the default id: plain
    # ray 2.60 job_supervisor.py: subprocess.Popen(self._entrypoint, shell=True, start_new_session=True, …)
    done = subprocess.run(submitter.job.entrypoint, shell=True, env=env_for(out), capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert recorded(out) == ["-m", "grpo_launch", "run", job.recipe, f"run_name={value}", "--run-dir", str(run_dir)]
    assert markers(tmp_path) == []


def test_the_old_ray_entrypoint_ran_the_value_on_the_head(tmp_path):
    """Why the entrypoint is a file's path: ``ray job submit -- bash -c LINE`` joined its arguments with
    ``list2cmdline`` (Windows quoting; Ray 2.60 still does on Windows) for the job server's ``sh -c``, which then
    ran the command substitutions of a value quoted for one shell (as grpo-launch 0.x rendered it)."""
    value = hostile(tmp_path)
    line = f"exec printf %s {shlex.quote(value)}"
    subprocess.run(list2cmdline(["bash", "-c", line]), shell=True, capture_output=True, timeout=60, cwd=tmp_path)
    assert markers(tmp_path) != []


def test_ssh_remote_line_reaches_the_command_byte_exact(tmp_path):
    """``ssh HOST -- LINE``: the remote user's shell runs ``-c LINE`` once."""
    value = hostile(tmp_path)
    python, out = recorder(tmp_path, value), tmp_path / "argv.json"
    workdir = tmp_path / f"work {value}"
    workdir.mkdir()
    spec = ProcessSpec(name="train@h1", argv=("accelerate", "launch", value), env={"GRPO_X": value}, host="h1")
    line = remote_command(spec, python=str(python), workdir=str(workdir), gpu_positions=None, stdin_env=False)
    done = subprocess.run(
        ["bash", "-c", line], env=env_for(out), capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    argv = recorded(out)
    assert argv[argv.index("--") + 1 :] == ["env", f"GRPO_X={value}", "accelerate", "launch", value]
    assert markers(tmp_path) == []


def test_sbatch_script_reaches_grpo_launch_run_byte_exact(tmp_path):
    """The sbatch script is a file bash runs; a backslash in --run-dir is refused (sbatch drops it from #SBATCH
    lines), everything else arrives as given."""
    value = hostile(tmp_path)
    python, out = recorder(tmp_path, value), tmp_path / "argv.json"
    run_dir = str(tmp_path / f"run {value.replace(chr(92), '')}")
    recipe = str(tmp_path / f"recipe {value}.yaml")
    req = SbatchRequest(recipe=recipe, run_dir=run_dir, workdir=str(tmp_path), python=str(python), nodes=2,
                        overrides=(f"run_name={value}",), env={"GRPO_X": value})  # fmt: skip
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch_script(req))
    env = {**env_for(out), "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert recorded(out) == ["-m", "grpo_launch", "run", "--slurm", req.recipe, f"run_name={value}", "--run-dir",
                             run_dir]  # fmt: skip
    assert markers(tmp_path) == []


READ_RUN = """
import sys
import sky
print(sky.Task.from_yaml(sys.argv[1]).run)
"""


def test_skypilot_run_section_reaches_grpo_launch_run_byte_exact(tmp_path):
    """The task's ``run:`` as SkyPilot's loader returns it; its grpo-launch line, run by bash as SkyPilot runs the
    whole section (a file, ``/bin/bash -i FILE``), gets the recipe, the override and the run directory as given."""
    if not SKY_PYTHON.exists():
        pytest.skip("SkyPilot's environment .venv-sky is missing (scripts/setup_sky.sh builds it)")
    from grpo_launch.backends.skypilot.task import SkyTaskRequest, render_task

    value = hostile(tmp_path)
    python, out = recorder(tmp_path, value), tmp_path / "argv.json"
    req = SkyTaskRequest(name="grpo-x", recipe=f"recipes/{value}.yaml", workdir=str(tmp_path),
                         run_dir=f"grpo_runs/{value}", overrides=(f"run_name={value}",))  # fmt: skip
    task = tmp_path / "task.yaml"
    task.write_text(render_task(req))
    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", ""), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    read = subprocess.run([str(SKY_PYTHON), "-c", READ_RUN, str(task)], capture_output=True, text=True, env=env,
                          timeout=180)  # fmt: skip
    assert read.returncode == 0, read.stderr[-2000:]
    (line,) = [x for x in read.stdout.splitlines() if "-m grpo_launch run" in x]
    script = f"py={shlex.quote(str(python))}; head_ip=10.0.0.1; port=6379\n{line}\n"
    done = subprocess.run(
        ["bash", "-c", script], env=env_for(out), capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert recorded(out) == ["-m", "grpo_launch", "run", req.recipe, f"run_name={value}", "--run-dir", req.run_dir,
                             "--ray", "10.0.0.1:6379"]  # fmt: skip
    assert markers(tmp_path) == []

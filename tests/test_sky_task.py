"""``grpo-launch sky``: the SkyPilot task it renders is parsed by SkyPilot's own code (``sky.Task.from_yaml``,
offline, in .venv-sky: skypilot 0.14.1 pins a click that conflicts with .venv's), and bad input is refused before
anything is written or launched.

Skipped when .venv-sky is missing, unless GRPO_LAUNCH_REQUIRE_SKY=1 (scripts/test.sh), which fails instead.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from grpo_launch.backends.skypilot.accelerators import SKY_ACCELERATORS, parse_accelerators
from grpo_launch.backends.skypilot.task import SkyTaskRequest, render_run_script, render_task
from grpo_launch.cli import main
from grpo_launch.errors import ConfigError
from grpo_launch.machines.gpus import find_gpu_spec

from .helpers import ROOT, ensure_tiny_assets

SKY_PYTHON = ROOT / ".venv-sky" / "bin" / "python"
QWEN = "recipes/qwen1.5b.yaml"
TINY = "recipes/tiny-cpu.yaml"

# What sky.Task.from_yaml makes of a task file: the fields grpo-launch asked for, as SkyPilot's objects hold them.
READ_TASKS = r"""
import json, sys
import sky
out = []
for path in sys.argv[1:]:
    t = sky.Task.from_yaml(path)
    (r,) = list(t.resources)
    out.append({"name": t.name, "num_nodes": t.num_nodes, "accelerators": r.accelerators, "envs": dict(t.envs),
                "secrets": sorted(ref.name for ref in t.managed_secret_refs), "inline_secrets": dict(t.secrets),
                "setup": t.setup, "run": t.run, "workdir": t.workdir, "disk_size": r.disk_size})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sky_python() -> Path:
    if not SKY_PYTHON.exists():
        if os.environ.get("GRPO_LAUNCH_REQUIRE_SKY") == "1":
            pytest.fail(f"GRPO_LAUNCH_REQUIRE_SKY=1 but {SKY_PYTHON} is missing: run scripts/setup_sky.sh")
        pytest.skip("SkyPilot's environment .venv-sky is missing (scripts/setup_sky.sh builds it)")
    return SKY_PYTHON


def sky_reads(sky_python: Path, paths: list[Path], home: Path) -> list[dict]:
    """SkyPilot 0.14.1's parser, offline (its state goes to ``home``: never this user's ~/.sky)."""
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", ""), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    done = subprocess.run([str(sky_python), "-c", READ_TASKS, *map(str, paths)], capture_output=True, text=True,
                          env=env, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def dry_run(capsys, *args: str, environ: dict[str, str] | None = None) -> str:
    assert main(["sky", *args, "--dry-run"], environ=environ or {}) == 0, capsys.readouterr().err
    return capsys.readouterr().out


CASES = [
    # (arguments, environment, num_nodes, accelerators as SkyPilot holds them, secrets declared)
    ((QWEN, "--accelerators", "H100:8", "--nodes", "2", "max_steps=5"), {}, 2, {"H100": 8}, ["RAY_AUTH_TOKEN"]),
    (
        ("recipes/qwen7b-math.yaml", "--accelerators", "a100-80gb:8", "--disk-size", "512"),
        {"HF_TOKEN": "hf_x"},
        1,
        {"A100-80GB": 8},
        ["HF_TOKEN", "RAY_AUTH_TOKEN"],
    ),
    (
        (QWEN, "--accelerators", "L40S:4", "--nodes", "3", "report_to=wandb", "--cluster", "my-run"),
        {},
        3,
        {"L40S": 4},
        ["RAY_AUTH_TOKEN", "WANDB_API_KEY"],
    ),
    ((TINY, "--nodes", "2", "max_steps=3", "--network-interface", "eth0"), {}, 2, None, ["RAY_AUTH_TOKEN"]),
]


def test_every_rendered_task_is_what_skypilot_parses(sky_python, tmp_path, capsys, monkeypatch):
    """The --dry-run output (the YAML with the plan as trailing comments) is a task SkyPilot accepts, and the Task
    it builds has the nodes, accelerators, envs, secrets (by name, no value), setup and run grpo-launch wrote."""
    ensure_tiny_assets()
    monkeypatch.chdir(ROOT)
    paths, ours = [], []
    for i, (args, environ, *_rest) in enumerate(CASES):
        text = dry_run(capsys, *args, "--run-dir", f"grpo_runs/sky-test-{i}", environ=environ)
        assert "hf_x" not in text, "a secret's value is never written into the task"
        path = tmp_path / f"task{i}.yaml"
        path.write_text(text)
        paths.append(path)
        ours.append(yaml.safe_load(text))
    parsed = sky_reads(sky_python, paths, tmp_path / "home")
    for (args, _env, nodes, accelerators, secrets), task, mine in zip(CASES, parsed, ours, strict=True):
        assert task["num_nodes"] == nodes
        assert task["accelerators"] == accelerators
        assert task["secrets"] == secrets and task["inline_secrets"] == {}
        assert task["envs"] == mine["envs"] and task["envs"]["GRPO_LAUNCH_RAY_PORT"] == "6379"
        assert task["setup"] == mine["setup"] and task["run"] == mine["run"]
        assert task["workdir"] == str(ROOT)
        recipe = args[0]
        assert f'"$py" -m grpo_launch run {recipe} ' in task["run"] and '--ray "$head_ip:$port"' in task["run"]
        assert "pip install -e '.[train" in task["setup"]  # ROOT is grpo-launch's source: the nodes install it
    assert parsed[0]["name"] == "grpo-qwen1-5b" and parsed[2]["name"] == "my-run"
    assert parsed[1]["disk_size"] == 512
    # the planned batch pinned after them: the recipe's own values (issue 50)
    pins = "gradient_accumulation_steps=8 num_generations=8 per_device_train_batch_size=1"
    assert f"max_steps=5 {pins}" in parsed[0]["run"]
    assert "per_device_train_batch_size=1 --run-dir grpo_runs/sky-test-0" in parsed[0]["run"]
    assert "launch.network_interface=eth0" in parsed[3]["run"]
    assert "vllm" not in parsed[3]["setup"], "tiny-cpu runs without vLLM: no vllm extra"
    assert ",vllm," in parsed[0]["setup"]


def test_a_task_installs_what_was_planned_with_pips_own_reading(sky_python, tmp_path):
    """Issue 41: from a user's own project the nodes ran ``pip install 'grpo-launch[…]==0.1.0'``, which fails: the
    package is not on the index. They now install the workdir's checkout, a wheel or source directory inside the
    workdir (--install), or a URL; each requirement is read by pip's own parser, and the task by SkyPilot's."""
    from pip._internal.req.constructors import install_req_from_line

    from grpo_launch.backends.skypilot import install_args

    extras = ("train", "vllm", "ray")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "grpo_launch-0.1.0-py3-none-any.whl").write_bytes(b"PK")
    url = "git+https://example.org/grpo-launch@v0.1.0"
    assert install_args(None, str(ROOT), extras) == ("-e", ".[train,vllm,ray]")
    wheel = install_args("wheels/grpo_launch-0.1.0-py3-none-any.whl", str(tmp_path), extras)
    remote = install_args(url, str(tmp_path), extras)
    for args in (wheel, remote):
        req = install_req_from_line(args[-1])
        assert req.extras == set(extras), args
    assert install_req_from_line(remote[0]).link.url == url
    req = SkyTaskRequest(name="grpo-x", recipe="r.yaml", workdir=str(tmp_path), run_dir="grpo_runs/x", num_nodes=2,
                         accelerators="H200:8", install=wheel)  # fmt: skip
    path = tmp_path / "task.yaml"
    path.write_text(render_task(req))
    (task,) = sky_reads(sky_python, [path], tmp_path / "home")
    assert "pip install './wheels/grpo_launch-0.1.0-py3-none-any.whl[train,vllm,ray]'" in task["setup"]
    assert task["run"] == render_run_script(req) and task["accelerators"] == {"H200": 8}


@pytest.mark.parametrize("source", [None, "missing.whl", "../outside.whl", "README.md"])
def test_a_task_with_nothing_a_node_can_install_is_refused(tmp_path, source):
    from grpo_launch.backends.skypilot import install_args
    from grpo_launch.errors import ConfigError

    (tmp_path / "README.md").write_text("not a wheel")
    (tmp_path.parent / "outside.whl").write_bytes(b"PK")
    with pytest.raises(ConfigError) as e:
        install_args(source, str(tmp_path), ("train", "ray"))
    assert ("not on the package index" if source is None else "--install") in str(e.value)


def test_every_skypilot_name_maps_to_a_gpu_of_the_table():
    for sky_name, ours in SKY_ACCELERATORS.items():
        assert find_gpu_spec(ours) is not None, (sky_name, ours)
        name, spec, count = parse_accelerators(f"{sky_name.lower()}:2")
        assert (name, spec.name, count) == (sky_name, find_gpu_spec(ours).name, 2)
    assert parse_accelerators("H100")[2] == 1  # SkyPilot's NAME alone is one GPU


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("FOO:8", r"'FOO' is not a SkyPilot GPU"),
        ("H100:x8", r"count 'x8' is not a whole number"),
        ("H100:0.5", r"count '0.5' is not a whole number"),
        ("H100:0", r"count must be from 1 to 64"),
        ("8xH100", r"'8xH100' is not NAME:COUNT"),
        ("H100:8:2", r"is not NAME:COUNT"),
    ],
)
def test_bad_accelerators_are_refused_naming_the_flag_and_the_fix(value, said, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "r"
    assert main(["sky", QWEN, "--accelerators", value, "--run-dir", str(run_dir)], environ={}) == 2
    err = capsys.readouterr().err
    assert "--accelerators" in err and "H100:8" in err, err
    with pytest.raises(ConfigError, match=said):
        parse_accelerators(value)
    assert not run_dir.exists(), "nothing is written"


def test_bad_node_counts_and_missing_gpus_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    for args, said in [
        (("--accelerators", "H100:8", "--nodes", "0"), "--nodes must be between 1 and"),
        (("--nodes", "2"), "--accelerators is missing"),
        (("--accelerators", "H100:8", "--cluster", "My_Run"), "SkyPilot cluster names"),
    ]:
        assert main(["sky", QWEN, *args, "--run-dir", str(tmp_path / "r")], environ={}) == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "r").exists()

    # a dry run launches nothing; SkyPilot's own options are the task's: nothing passes after `--`
    for args, said in [
        (("--accelerators", "H100:8", "--launch", "--dry-run"), "--launch and --dry-run together"),
        (("--accelerators", "H100:8", "--", "--use-spot"), "sky takes no arguments after `--` (given: --use-spot"),
    ]:
        assert main(["sky", QWEN, *args, "--run-dir", str(tmp_path / "r")], environ={}) == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_plan_that_cannot_run_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    """Plan first, as sbatch does: a 70B model on one L4 per node does not fit."""
    monkeypatch.chdir(ROOT)
    args = ["sky", "recipes/llama70b.yaml", "--accelerators", "L4:1", "--run-dir", str(tmp_path / "r")]
    assert main(args, environ={}) == 2
    assert "does not fit" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_a_recipe_outside_the_workdir_is_refused(tmp_path, capsys, monkeypatch):
    """SkyPilot copies the working directory to the nodes: a recipe elsewhere would not be there."""
    monkeypatch.chdir(tmp_path)
    assert main(["sky", str(ROOT / QWEN), "--accelerators", "H100:8", "--dry-run"], environ={}) == 2
    assert "outside the working directory" in capsys.readouterr().err


def test_launch_without_sky_names_the_extra_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "r"
    args = ["sky", QWEN, "--accelerators", "H100:8", "--run-dir", str(run_dir), "--launch"]
    assert main(args, environ={"PATH": str(tmp_path)}) == 1
    err = capsys.readouterr().err
    assert "pip install '.[sky]'" in err and not run_dir.exists()


def test_launch_runs_sky_launch_on_the_written_task(tmp_path, capsys, monkeypatch):
    """A stand-in `sky` records its arguments: the real one needs a cloud account to launch anything."""
    monkeypatch.chdir(ROOT)
    bin_dir, seen = tmp_path / "bin", tmp_path / "argv"
    bin_dir.mkdir()
    sky = bin_dir / "sky"
    sky.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\nprintf "%s" "$HF_TOKEN" > {seen}.token\n'
                   f'printf "%s" "$RAY_AUTH_TOKEN" > {seen}.ray\n')  # fmt: skip
    sky.chmod(sky.stat().st_mode | stat.S_IXUSR)
    run_dir = tmp_path / "r"
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HF_TOKEN": "hf_secret"}
    args = ["sky", QWEN, "--accelerators", "H100:8", "--nodes", "2", "--run-dir", str(run_dir), "--launch", "--down"]
    assert main(args, environ=environ) == 0, capsys.readouterr().err
    task = run_dir / "sky-task.yaml"
    assert seen.read_text().split("\n")[:-1] == [
        "launch", "-c", "grpo-qwen1-5b", str(task), "--yes", "--secret", "HF_TOKEN", "--secret", "RAY_AUTH_TOKEN",
        "--down"
    ]  # fmt: skip
    assert seen.with_suffix(".token").read_text() == "hf_secret"  # sky reads the value from its environment
    ray_token = seen.with_suffix(".ray").read_text()  # none exported: one drawn for this cluster, in sky's env only
    assert re.fullmatch(r"[0-9a-f]{64}", ray_token) and ray_token not in task.read_text()
    assert "hf_secret" not in task.read_text() and "HF_TOKEN: null" in task.read_text()
    assert "sky logs grpo-qwen1-5b" in capsys.readouterr().out


def test_a_missing_secret_is_refused_before_launch(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sky").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sky").chmod(0o755)
    args = ["sky", QWEN, "--accelerators", "H100:8", "report_to=wandb", "--run-dir", str(tmp_path / "r"), "--launch"]
    assert main(args, environ={"PATH": str(bin_dir)}) == 1
    assert "WANDB_API_KEY, which is not set here" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_tasks_grpo_launch_variables_are_the_run_directory_contracts():
    """The variables the task sets (envs:) and its setup and run sections read are named by rundir/layout.py: the
    task spells none of its own."""
    import re

    from grpo_launch.rundir import layout

    req = SkyTaskRequest(name="grpo-x", recipe="r.yaml", workdir="/w", run_dir="runs/x", accelerators="H100:8")
    task = yaml.safe_load(render_task(req))
    contract = {v for k, v in vars(layout).items() if k.endswith("_ENV") and isinstance(v, str)}
    assert set(task["envs"]) == {layout.NODE_PYTHON_ENV, layout.RAY_PORT_ENV, layout.RAY_JOIN_TIMEOUT_ENV}
    read = set(re.findall(r"\bGRPO_LAUNCH_[A-Z_]+", task["setup"] + task["run"]))
    assert read == {layout.NODE_PYTHON_ENV, layout.RAY_PORT_ENV, layout.RAY_JOIN_TIMEOUT_ENV,
                    layout.RAY_CLIENT_PORT_ENV}  # fmt: skip
    assert read <= contract
    assert not re.findall(r"@[A-Z_]+@", task["setup"] + task["run"]), "every placeholder of the script is filled"


def test_grpo_launch_never_imports_sky():
    code = ("import sys, grpo_launch.cli, grpo_launch.backends.skypilot, grpo_launch.backends.skypilot.task; "
            "assert 'sky' not in sys.modules")  # fmt: skip
    subprocess.run([os.sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


SKY_PORTS = r"""
import json, pathlib, re, sky_templates
from sky.skylet import constants
from sky.provision import instance_setup
start = (pathlib.Path(sky_templates.__file__).parent / "ray" / "start_cluster").read_text()
default = lambda name: int(re.search(r"^" + name + r"=\$\{" + name + r":-(\d+)\}", start, re.M).group(1))
print(json.dumps({"sky_ray": constants.SKY_REMOTE_RAY_PORT, "sky_dashboard": constants.SKY_REMOTE_RAY_DASHBOARD_PORT,
                  "sky_head_cmd": instance_setup.ray_head_start_command(None, None),
                  "template_head": default("RAY_HEAD_PORT"),
                  "template_agent": default("RAY_DASHBOARD_AGENT_LISTEN_PORT")}))
"""


def test_the_ray_ports_are_skypilots_user_ray_ports_and_clash_with_none_of_its_own(sky_python, tmp_path):
    """Read from SkyPilot 0.14.1 itself: its own Ray's ports (constants, the head's `ray start` command) and the user
    Ray template's defaults (sky_templates/ray/start_cluster)."""
    from grpo_launch.backends.skypilot.task import RAY_CLIENT_PORT, RAY_DASHBOARD_AGENT_PORT, RAY_PORT

    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    done = subprocess.run([str(sky_python), "-c", SKY_PORTS], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    sky = json.loads(done.stdout)
    assert sky["template_head"] == RAY_PORT == 6379 and sky["sky_ray"] != RAY_PORT
    assert sky["template_agent"] == RAY_DASHBOARD_AGENT_PORT
    taken = {sky["sky_ray"], sky["sky_dashboard"], 8076, 10001, 52365, 8265}  # 8076: its object manager (head cmd)
    assert "--object-manager-port=${SKYPILOT_RAY_OBJECT_MANAGER_PORT:-8076}" in sky["sky_head_cmd"]
    assert RAY_CLIENT_PORT not in taken and not 10002 <= RAY_CLIENT_PORT <= 19999  # Ray's default worker ports


HOSTILE = ('system_prompt=it\'s "$(touch /tmp/pwned)" `id` $HOME; # not a comment: ü ✓', "run_name='a: b | c'")


def test_hostile_overrides_reach_the_run_command_as_written(sky_python, tmp_path, capsys, monkeypatch):
    """Quotes, command substitutions, YAML's ': ' and '#', non-ASCII: the task still parses, and the command line
    in its run section splits back into exactly the overrides given; a control character is refused."""
    import shlex

    monkeypatch.chdir(ROOT)
    text = dry_run(capsys, QWEN, "--accelerators", "H100:8", *HOSTILE, "--run-dir", "grpo_runs/sky test")
    path = tmp_path / "task.yaml"
    path.write_text(text)
    (task,) = sky_reads(sky_python, [path], tmp_path / "home")
    line = next(x for x in task["run"].splitlines() if "-m grpo_launch run" in x)
    words = shlex.split(line)
    pins = ["gradient_accumulation_steps=8", "num_generations=8", "per_device_train_batch_size=1"]  # the recipe's batch
    assert words[words.index("run") + 1 :] == [QWEN, *HOSTILE, *pins, "--run-dir", "grpo_runs/sky test", "--ray",
                                               "$head_ip:$port"]  # fmt: skip
    with pytest.raises(ConfigError, match="control character"):
        render_task(SkyTaskRequest(name="x", recipe="r.yaml", workdir="/w", run_dir="r", overrides=("a=b\x07",)))


# What sky.Task.from_yaml makes of a managed task: its recovery, spot, bucket and volume as SkyPilot holds them.
READ_MANAGED = r"""
import json, sys
import sky
out = []
for path in sys.argv[1:]:
    t = sky.Task.from_yaml(path)
    (r,) = list(t.resources)
    out.append({"job_recovery": r.job_recovery, "use_spot": r.use_spot, "run": t.run,
                "storage": {k: [s.source, s.mode.value] for k, s in t.storage_mounts.items()},
                "volumes": dict(t.volumes or {})})
print(json.dumps(out))
"""


def test_a_managed_task_keeps_its_run_directory_on_a_bucket_or_volume_skypilot_mounts(sky_python, tmp_path, capsys,
                                                                                       monkeypatch):  # fmt: skip
    """`--managed`: SkyPilot's parser reads the recovery (its default strategy, no restart on errors: grpo-launch
    restarts itself), spot, and the bucket (MOUNT_CACHED) or volume at /grpo-runs; the run section's run directory
    is there, so a relaunched job resumes from the checkpoints of the preempted one."""
    monkeypatch.chdir(ROOT)
    paths = []
    for i, where in enumerate((("--bucket", "s3://my-bucket/grpo", "--spot"), ("--volume", "ckpt-vol"))):
        text = dry_run(capsys, TINY, "--nodes", "2", "--managed", *where, "--run-dir", "grpo_runs/exp1")
        assert "# Managed job: sky jobs launch -n grpo-tiny-cpu THIS_FILE" in text
        paths.append(tmp_path / f"managed{i}.yaml")
        paths[-1].write_text(text)
    env = {"HOME": str(tmp_path / "home"), "PATH": os.environ.get("PATH", ""), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    done = subprocess.run([str(sky_python), "-c", READ_MANAGED, *map(str, paths)], capture_output=True, text=True,
                          env=env, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    bucket, volume = json.loads(done.stdout.strip().splitlines()[-1])
    for task in (bucket, volume):
        assert task["job_recovery"] == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 0}
        assert "--run-dir /grpo-runs/exp1 --ray" in task["run"]
    assert bucket["storage"] == {"/grpo-runs": ["s3://my-bucket/grpo", "MOUNT_CACHED"]} and bucket["use_spot"]
    assert volume["volumes"] == {"/grpo-runs": "ckpt-vol"} and volume["storage"] == {} and not volume["use_spot"]


@pytest.mark.parametrize(
    "args, said",
    [
        (("--managed",), "--managed needs the run directory on a bucket or a volume"),
        (("--managed", "--bucket", "s3://b", "--volume", "v"), "--bucket and --volume both given"),
        (("--managed", "--bucket", "s3://b", "--down"), "--down is for sky launch"),
        (("--managed", "--bucket", "s3://b", "output_dir=/tmp/out"), "output_dir /tmp/out is not on the bucket"),
        (("--managed", "--bucket", "my-bucket"), "--bucket 'my-bucket' is not a bucket URI"),
        (("--managed", "--volume", "Bad_Name"), "--volume 'Bad_Name' is not a SkyPilot volume name"),
    ],
)
def test_a_managed_job_whose_checkpoints_would_die_with_its_nodes_is_refused(args, said, tmp_path, capsys,
                                                                             monkeypatch):  # fmt: skip
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "r"
    assert main(["sky", TINY, "--nodes", "2", *args, "--run-dir", str(run_dir), "--dry-run"], environ={}) == 2
    assert said in capsys.readouterr().err and not run_dir.exists()


def test_launch_managed_runs_sky_jobs_launch(tmp_path, capsys, monkeypatch):
    """A stand-in `sky` records its arguments (the real one needs a cloud account)."""
    monkeypatch.chdir(ROOT)
    bin_dir, seen = tmp_path / "bin", tmp_path / "argv"
    bin_dir.mkdir()
    (bin_dir / "sky").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\n')
    (bin_dir / "sky").chmod(0o755)
    run_dir = tmp_path / "r"
    args = ["sky", TINY, "--nodes", "2", "--managed", "--bucket", "gs://b/runs", "--run-dir", str(run_dir), "--launch"]
    assert main(args, environ={"PATH": f"{bin_dir}:/usr/bin:/bin"}) == 0, capsys.readouterr().err
    task = str(run_dir / "sky-task.yaml")
    assert seen.read_text().split("\n")[:-1] == ["jobs", "launch", "-n", "grpo-tiny-cpu", task, "--yes", "--secret",
                                                 "RAY_AUTH_TOKEN"]  # fmt: skip
    out = capsys.readouterr().out
    assert "managed job grpo-tiny-cpu" in out and "sky jobs logs -n grpo-tiny-cpu" in out

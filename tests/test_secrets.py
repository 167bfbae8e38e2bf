"""Secrets by name only (issue 37, items 3 and 6): a secret-looking name in ``launch.train_env`` / ``launch.vllm_env``
is refused with the way to pass it (``launch.pass_env``); the names in ``launch.pass_env`` travel like HF_TOKEN on
every backend and must be set where the launcher runs; every command line that is printed or written down goes
through one redaction (:func:`grpo_launch.spec.redact_argv`); and a dry run runs nothing of the recipe's: the import
probe is ``python -I`` with the paths as arguments, not the recipe's environment.

The real ssh run (two network-namespace hosts, scripts/ssh_hosts.sh) is marked ssh/slow: run it under the cluster
lock. Everything else runs real processes on this machine (the CLI, the probe's Python) and no cluster."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import string
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_launch.backends.remote import passed_env_names
from grpo_launch.cli import main
from grpo_launch.errors import ConfigError
from grpo_launch.recipe import load_recipe
from grpo_launch.render import render_files
from grpo_launch.render.processes import all_processes
from grpo_launch.rundir.files import RunLock
from grpo_launch.rundir.invocation import Invocation
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.spec import REDACTED, ProcessSpec, RunContext, is_secret_name, redact_argv, redact_env

from .helpers import ROOT, TINY_RECIPE, plan_recipe, ssh_hosts, tiny_overrides

VALUE = "s3cr3t-value-never-written"

# ----------------------------------------------------------------------------------------------- names (fuzz)

SECRET_ENDINGS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "API_KEY", "ACCESS_KEY",
                  "PRIVATE_KEY", "CREDENTIALS", "CREDENTIAL", "APIKEY")  # fmt: skip
HARMLESS_ENDINGS = ("DIR", "PATH", "LEVEL", "THREADS", "MODE", "TOKENS", "KEYS", "SECRETS_DIR", "URL", "HOST")
FIXED_SECRET = ("HF_TOKEN", "WANDB_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
                "GOOGLE_APPLICATION_CREDENTIALS", "DB_PASSWORD", "judge_key", "GITHUB_TOKEN", "KEY", "TOKEN",
                "S3_SECRET", "Anthropic_Api_Key")  # fmt: skip
FIXED_HARMLESS = ("OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "PYTHONPATH", "MAX_TOKENS", "MONKEY",
                  "KEYBOARD_LAYOUT", "PASSWORD_FILE_DIR", "NCCL_DEBUG", "HOTKEY", "SECRETS_DIR",
                  "TOKEN_BUDGET_LEVEL")  # fmt: skip


def _random_names(seed: int, endings: tuple[str, ...], count: int = 12) -> list[str]:
    """Random identifiers ending so (as upper, lower or mixed case)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        head = rng.choice(string.ascii_uppercase) + "".join(rng.choices(string.ascii_uppercase + string.digits, k=5))
        name = f"{head}_{rng.choice(endings)}"
        out.append(rng.choice([name, name.lower(), name.title()]))
    return out


SECRET_NAMES = [*FIXED_SECRET, *_random_names(37, SECRET_ENDINGS)]
HARMLESS_NAMES = [*FIXED_HARMLESS, *_random_names(73, HARMLESS_ENDINGS)]


def _load(*overrides: str):
    return load_recipe(TINY_RECIPE, list(overrides))


@pytest.mark.parametrize("block", ["train_env", "vllm_env"])
class TestSecretNamesInEnvBlocks:
    """One rule (spec.is_secret_name) decides; a refused name is named with the way to pass it, its value never."""

    @pytest.mark.parametrize("name", SECRET_NAMES)
    def test_a_secret_looking_name_is_refused_with_the_way_to_pass_it(self, block, name):
        with pytest.raises(ConfigError) as caught:
            _load(f"launch.{block}={{{name}: {VALUE}}}")
        text = caught.value.render()
        assert f"launch.{block} sets {name}, a secret by its name" in text
        assert "export it and name it in `launch.pass_env`" in text and f"launch.pass_env=[{name}]" in text
        assert VALUE not in text

    @pytest.mark.parametrize("name", HARMLESS_NAMES)
    def test_a_harmless_name_passes(self, block, name):
        recipe = _load(f"launch.{block}={{{name}: '1'}}")
        assert dict(getattr(recipe.launch, block)) == {name: "1"}
        assert not is_secret_name(name)

    def test_every_secret_is_named_at_once_on_the_command_line(self, block, capsys):
        """The CLI: exit 2, each name said, no value echoed."""
        code = main(["plan", TINY_RECIPE, f"launch.{block}={{OPENAI_API_KEY: {VALUE}, S3_SECRET: {VALUE}, A: b}}"])
        out, err = capsys.readouterr()
        assert code == 2
        assert f"launch.{block} sets OPENAI_API_KEY" in err and f"launch.{block} sets S3_SECRET" in err
        assert VALUE not in out + err


class TestPassEnvNames:
    @pytest.mark.parametrize("bad", ["'1BAD'", "'A-B'", "'A B'", "'A=B'", "''", "'É'", "'A.B'", "3"])
    def test_a_name_that_is_not_an_identifier_is_refused(self, bad):
        with pytest.raises(ConfigError, match=r"launch\.pass_env: .* is not an environment variable name"):
            _load(f"launch.pass_env=[{bad}]")

    @pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"])
    def test_a_variable_the_plan_sets_per_process_is_refused(self, name):
        with pytest.raises(ConfigError, match=rf"launch\.pass_env names {name}, which grpo-launch sets"):
            _load(f"launch.pass_env=[{name}]")

    def test_a_name_both_passed_and_set_is_refused(self):
        with pytest.raises(ConfigError, match=r"launch\.pass_env names OMP_NUM_THREADS, which launch\.train_env"):
            _load("launch.pass_env=[OMP_NUM_THREADS]", "launch.train_env={OMP_NUM_THREADS: '2'}")

    @pytest.mark.parametrize("given", ["[JUDGE_API_KEY, S3_SECRET]", "'JUDGE_API_KEY S3_SECRET'"])
    def test_names_are_kept_as_a_list(self, given):
        assert _load(f"launch.pass_env={given}").launch.pass_env == ("JUDGE_API_KEY", "S3_SECRET")


class TestSecretFlagsInVllmExtraArgs:
    @pytest.mark.parametrize("args", ["[--hf-token, hf_x]", "[--hf-token=abc]", "[--port, '1', --hf-token, abc]"])
    def test_a_secret_flag_with_a_value_is_refused(self, args):
        with pytest.raises(ConfigError, match=r"launch\.vllm_extra_args gives --hf-token a value.*launch\.pass_env"):
            _load(f"launch.vllm_extra_args={args}")

    @pytest.mark.parametrize("args", ["[--max-num-seqs, '4']", "[--hf-token]", "[--hf-token, --enforce-eager]"])
    def test_other_arguments_pass(self, args):
        _load(f"launch.vllm_extra_args={args}")


# ------------------------------------------------------------------------------------------------- redaction

HF = "hf_" + "a" * 30


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (["vllm", "--hf-token", VALUE, "--port", "8000"], ["vllm", "--hf-token", REDACTED, "--port", "8000"]),
        ([f"--hf-token={VALUE}"], [f"--hf-token={REDACTED}"]),
        ([f"launch.train_env={{JUDGE_API_KEY: {VALUE}}}"], [f"launch.train_env={REDACTED}"]),
        ([f"--export=ALL,JUDGE_TOKEN={VALUE}"], [f"--export={REDACTED}"]),
        ([f"OPENAI_API_KEY={VALUE}", "x"], [f"OPENAI_API_KEY={REDACTED}", "x"]),
        (["--served-model-name", HF], ["--served-model-name", REDACTED]),
        (["ssh", "h1", "--", f"cd /w && exec env A=1 S3_SECRET={VALUE} python -m x"], None),
        (["learning_rate=1e-3", "--hf-token", "--port", "8000", "--tokenizer", "t"], "same"),
        (["ssh", "h1", "--", "cd /w && exec env A=1 python -m x --flag 'a b'"], "same"),
        (["reward_funcs=[accuracy, rewards.judge_key:score]", "launch.train_env={A: '1'}"], "same"),
    ],
)  # fmt: skip
def test_one_redaction_for_every_recorded_command_line(argv, kept):
    out = redact_argv(argv)
    assert VALUE not in " ".join(out) and HF not in " ".join(out)
    if kept == "same":
        assert out == argv
    elif kept is not None:
        assert out == kept


def test_printed_commands_and_plan_json_are_redacted():
    """ProcessSpec.shell() (--dry-run, the plan's Commands) and plan.json's argv and env take the same redaction:
    a token-shaped value on the server's command line is not written down."""
    spec = ProcessSpec("vllm", ("vllm", "serve", "--hf-token", VALUE), env={"X_TOKEN": VALUE, "A": "1"})
    line = spec.shell()
    assert VALUE not in line and "A=1" in line and f"X_TOKEN={shlex.quote(REDACTED)}" in line
    assert redact_env(spec.env) == {"X_TOKEN": REDACTED, "A": "1"}
    plan = plan_recipe(str(ROOT / "recipes" / "qwen1.5b.yaml"), "8xH100-80GB", "launch.vllm=server",
                       f"launch.vllm_extra_args=[--served-model-name, {HF}]")  # fmt: skip
    text = render_files(plan)["plan.json"]
    assert HF not in text and REDACTED in text
    assert json.loads(text)["vllm"]["command"][-2:] == ["--served-model-name", REDACTED]


def test_the_lock_and_the_invocation_record_never_hold_a_secret(tmp_path, monkeypatch):
    secret_env, export = f"launch.train_env={{JUDGE_API_KEY: {VALUE}}}", f"--export=ALL,X_KEY={VALUE}"
    argv = ["grpo-launch", "r.yaml", secret_env, "--", export]
    monkeypatch.setattr(sys, "argv", argv)
    with RunLock(tmp_path / "run"):
        lock = RunPaths(tmp_path / "run").lock.read_text()
    assert VALUE not in lock and "launch.train_env=" in lock
    record = Invocation.of("run", "r.yaml", [argv[2]], [], extra_args=(argv[4],), backend="local", run_dir="/r",
                           workdir="/", version="0")  # fmt: skip
    assert VALUE not in json.dumps(record.to_json()) and VALUE not in record.command
    assert record.redacted == ("launch.train_env", "--export")


@pytest.mark.parametrize(
    ("verb", "given", "named"),
    [
        (["sbatch", "--nodes", "1"], [f"system_prompt={HF}"], "system_prompt"),
        (["sbatch", "--nodes", "1"], ["--", f"--export=ALL,JUDGE_TOKEN={VALUE}"], "--export"),
        (["sky", "--nodes", "1"], [f"system_prompt={HF}"], "system_prompt"),
    ],
)
def test_a_submission_never_writes_a_secret_into_its_script(verb, given, named, tmp_path, capsys, monkeypatch):
    """The job's script runs the command as given, so it cannot be redacted: a secret on it is refused before
    anything is written, with the way to pass it."""
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    extra = given if given[0] == "--" else []
    args = [verb[0], "recipes/tiny-cpu.yaml", *verb[1:], *(g for g in given if g not in extra), "--run-dir", str(run)]
    assert main([*args, *extra], environ={}) == 2
    err = capsys.readouterr().err
    assert f"the command holds a secret ({named})" in err and "launch.pass_env" in err
    assert HF not in err and VALUE not in err and not run.exists()


# ------------------------------------------------------------------------------------------ pass_env on backends


def test_the_named_variables_travel_with_the_passed_list():
    environ = {"JUDGE_API_KEY": VALUE, "OTHER_KEY": "x", "HF_TOKEN": "h", "PATH": "/b"}
    assert passed_env_names(environ, ("JUDGE_API_KEY", "NOT_SET_HERE")) == ("HF_TOKEN", "JUDGE_API_KEY")
    assert passed_env_names(environ) == ("HF_TOKEN",)


def test_ssh_commands_carry_the_names_on_stdin_never_the_value(tmp_path, capsys):
    """An ssh dry run (hosts that do not resolve: planned from the hostfile alone): every host's command names
    the variable for stdin; the value is in no printed command and no file written."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("nohost-a.invalid slots=1\nnohost-b.invalid slots=1\n")
    run = tmp_path / "run"
    code = main([TINY_RECIPE, "launch.pass_env=[JUDGE_API_KEY]", "--hostfile", str(hostfile), "--run-dir", str(run),
                 "--dry-run"], environ={**os.environ, "JUDGE_API_KEY": VALUE})  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("ssh ")]
    assert len(lines) == 2 and all(re.search(r"# on stdin: (\w+, )*JUDGE_API_KEY\b", line) for line in lines)
    assert VALUE not in out + err
    assert not [p for p in run.rglob("*") if p.is_file() and VALUE.encode() in p.read_bytes()]


def test_ray_runners_carry_the_names_on_stdin_never_the_value():
    """The Ray backend's placement (pure, no cluster): every runner names the variable for stdin."""
    from grpo_launch.backends.ray import RayBackend

    plan = plan_recipe(ROOT / "recipes" / "qwen7b-math.yaml", "2x8xH100", "launch.pass_env=[JUDGE_API_KEY]")
    ctx = RunContext(sys.executable, str(ROOT), {"JUDGE_API_KEY": VALUE, "HF_TOKEN": "h"}, print)
    backend = RayBackend("10.0.0.1:6379")
    for spec in all_processes(plan):
        placed = backend.place(spec, plan, ctx)
        assert placed.stdin_env == ("HF_TOKEN", "JUDGE_API_KEY") and "--env-stdin" in placed.argv
        assert not any(VALUE in a for a in placed.argv) and VALUE not in placed.shell()


def test_skypilot_declares_the_names_as_secrets(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = ["sky", "recipes/tiny-cpu.yaml", "launch.pass_env=[JUDGE_API_KEY]", "--run-dir", str(tmp_path / "r")]
    assert main([*args, "--dry-run"], environ={"JUDGE_API_KEY": VALUE}) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert re.search(r"^secrets:\n(  \w+: null\n)*  JUDGE_API_KEY: null$", out, re.M) and VALUE not in out
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sky").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sky").chmod(0o755)
    assert main([*args, "--launch"], environ={"PATH": str(bin_dir)}) == 1  # not set here: refused before launch
    assert "JUDGE_API_KEY, which is not set here" in capsys.readouterr().err


def test_a_name_not_set_here_refuses_the_run_and_is_said_by_a_dry_run(tmp_path, capsys):
    run = tmp_path / "run"
    args = [TINY_RECIPE, *tiny_overrides(tmp_path), "launch.pass_env=[JUDGE_API_KEY]", "--run-dir", str(run)]
    environ = {k: v for k, v in os.environ.items() if k != "JUDGE_API_KEY"}
    assert main([*args, "--dry-run"], environ=environ) == 0
    out = capsys.readouterr().out
    assert "# warning: launch.pass_env names JUDGE_API_KEY, not set in this environment" in out
    assert main(args, environ=environ) == 1
    err = capsys.readouterr().err
    assert "launch.pass_env names JUDGE_API_KEY, not set in this environment" in err and "Export JUDGE_API_KEY" in err
    assert not (run / "logs").exists()  # nothing started
    sbatch = ["sbatch", TINY_RECIPE, "--nodes", "1", "launch.pass_env=[JUDGE_API_KEY]", "--run-dir", str(run),
              "--dry-run"]  # fmt: skip
    assert main(sbatch, environ=environ) == 0
    assert "# warning: launch.pass_env names JUDGE_API_KEY" in capsys.readouterr().out


# ------------------------------------------------------------------------------------- a dry run runs nothing


@pytest.fixture
def planted(tmp_path) -> tuple[Path, Path]:
    """A PYTHONPATH directory holding a sitecustomize.py that leaves a marker when any Python starts with it, and
    a reward module; the marker file."""
    site, marker = tmp_path / "site", tmp_path / "MARKER"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('ran\\n')\n")
    (site / "judgerewards.py").write_text("def reward(completions, **kw):\n    return [0.0] * len(completions)\n")
    # The plant works: a Python started with the recipe's PYTHONPATH runs it.
    subprocess.run([sys.executable, "-c", "pass"], env={**os.environ, "PYTHONPATH": str(site)}, check=True)
    assert marker.read_text() == "ran\n"
    marker.unlink()
    return site, marker


@pytest.mark.parametrize(
    "verb",
    [[], ["sbatch", "--nodes", "1"], ["sky", "--nodes", "1"]],
    ids=["run", "sbatch", "sky"],
)
def test_a_dry_run_runs_nothing_of_the_recipes(verb, planted, tmp_path, capsys, monkeypatch):
    """The reward and report_to import probes still find the recipe's reward module on its PYTHONPATH (passed to
    an isolated ``python -I`` as an argument), and its sitecustomize.py never runs."""
    site, marker = planted
    monkeypatch.chdir(ROOT)  # sky copies the working directory: the recipe must be inside it
    head = verb[:1]
    args = [*head, "recipes/tiny-cpu.yaml", *verb[1:], f"launch.train_env={{PYTHONPATH: {site}}}",
            "reward_funcs=[judgerewards:reward]", "report_to=[wandb]", "--run-dir", str(tmp_path / "run"),
            "--dry-run"]  # fmt: skip
    assert main(args, environ=dict(os.environ)) == 0, capsys.readouterr().err
    assert not marker.exists(), "the recipe's sitecustomize.py ran during a dry run"
    # Still a check: a reward module on no path is refused, and nothing of the recipe's ran for that either.
    missing = [a if not a.startswith("reward_funcs=") else "reward_funcs=[nosuchmod_xyz:reward]" for a in args]
    assert main(missing, environ=dict(os.environ)) == 2
    assert "module 'nosuchmod_xyz' is not importable" in capsys.readouterr().err
    assert not marker.exists()


# ---------------------------------------------------------------------------- real ssh hosts (cluster lock)


@pytest.mark.ssh
@pytest.mark.slow
def test_a_passed_secret_reaches_every_host_and_no_command_line_or_file(tmp_path):
    """Two sshd hosts in network namespaces (they share this machine's process table and file system). The
    recipe's reward reads JUDGE_API_KEY on each host and, while the run's processes are all up, the host's ``ps``:
    the value arrived on every host, and is in no process's command line, no file of the run directory and no
    console line."""
    from .test_ssh_hosts import command, hostfile

    (tmp_path / "judgerewards").mkdir()
    (tmp_path / "judgerewards" / "__init__.py").write_text("")
    (tmp_path / "judgerewards" / "r.py").write_text(_REWARD.format(seen=str(tmp_path / "seen")))
    (tmp_path / "hosts").mkdir()
    with ssh_hosts(tmp_path / "hosts", 2) as hosts:
        run = tmp_path / "run"
        hf = hostfile(tmp_path, "h1 slots=1", "h2 slots=1")
        argv = command(hosts, hf, run, "max_steps=2", "reward_funcs=[judgerewards.r:reward]",
                       "launch.pass_env=[JUDGE_API_KEY]")  # fmt: skip
        # This checkout's grpo-launch first (a worktree's editable install may point elsewhere), then the reward.
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{tmp_path}", "JUDGE_API_KEY": VALUE}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    _assert_passed_and_never_written(tmp_path, run, out)


# The recipe's reward on every host: the variable as the process got it, and every command line on the host while
# the run's processes are all up (the namespace hosts share this machine's process table).
_REWARD = """import os, subprocess
def reward(completions, **kw):
    base = {seen!r} + '-' + os.uname().nodename
    with open(base, 'w') as f:
        f.write(os.environ.get('JUDGE_API_KEY', 'MISSING'))
    ps = subprocess.run(['ps', '-eww', '-o', 'args'], capture_output=True, text=True).stdout
    with open(base + '.ps', 'a') as f:
        f.write(ps)
    return [0.0] * len(completions)
"""


def _assert_passed_and_never_written(tmp_path: Path, run: Path, out: str) -> None:
    for host in ("h1", "h2"):
        assert (tmp_path / f"seen-{host}").read_text() == VALUE, host
        ps = (tmp_path / f"seen-{host}.ps").read_text()
        assert "grpo_launch.node.shim" in ps and "accelerate" in ps  # the run's processes were up and listed
        assert VALUE not in ps, f"the secret is on a command line on {host}"
    assert VALUE not in out
    leaked = [p for p in run.rglob("*") if p.is_file() and VALUE.encode() in p.read_bytes()]
    assert leaked == [], leaked


@pytest.mark.extended
@pytest.mark.ray
@pytest.mark.slow
def test_a_passed_secret_reaches_every_ray_node_and_no_command_line_or_file(tmp_path):
    """A real Ray cluster (the head here, CPU nodes in the namespace hosts h1 and h2): the runner sends the named
    variable on stdin to the actor on each node; the value arrives there and is in no ``ps`` line, no file of the
    run directory and no console line."""
    from .helpers import ray_cluster

    (tmp_path / "judgerewards").mkdir()
    (tmp_path / "judgerewards" / "__init__.py").write_text("")
    (tmp_path / "judgerewards" / "r.py").write_text(_REWARD.format(seen=str(tmp_path / "seen")))
    run = tmp_path / "run"
    with ray_cluster(tmp_path / "ray", 0, 0) as address:
        argv = [sys.executable, "-m", "grpo_launch", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--ray", address,
                "--run-dir", str(run), "--network-interface", "eth0", "max_steps=2",
                "reward_funcs=[judgerewards.r:reward]", "launch.pass_env=[JUDGE_API_KEY]"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{tmp_path}", "JUDGE_API_KEY": VALUE}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    _assert_passed_and_never_written(tmp_path, run, out)

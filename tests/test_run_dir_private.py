"""A run directory no group member can turn, and nothing that silently goes wrong on a crafted one.

Each class is one way a run directory (or what a run writes) was turned against its user, reproduced for real:
files, directories, sockets and processes on this machine, the real CLI as a process, no network.

- Private whatever the umask: under umask 002 the launcher made its run directory 0775 and trusted group-writable
  files, so a group member rewrote ``invocation.json`` (``resume`` ran their command) or a checkpoint's ``.pt``
  (auto-resume unpickled it). Now directories are 0700 and files 0600, the run's processes run under umask 077, and
  what another user may change is refused where it is acted on.
- ``report`` wrote RUN_DIR/report/ through links planted in someone else's run directory.
- A line break in the recipe's path injected keys into ``trainer_recipe.yaml`` and a command into a pasted dry run.
- Secret names that passed the rule (``API_KEY_2``, ``HF_TOKEN2``, ``GITHUB_PAT``, ``MYSQL_PWD``, a password in a
  URL), and a secret-looking value that travelled in clear on the ssh command line.
- The metrics endpoint: idle connections held a thread each, and every scrape parsed all of metrics.jsonl.
- A metrics line nested 1,200 deep raised RecursionError in ``status``, ``report`` and ``--calibrate-from``.
- A FIFO planted as ``logs/launcher.log`` was not refused.
- Ray's per-node metrics exporter on every interface (the SkyPilot task's and the test cluster's Ray).

Tests that need another user (``nobody``) run as root, as the suite does here, and are skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from grpo_launch.enums import ResumeMode, RunState
from grpo_launch.errors import ConfigError, LaunchError
from grpo_launch.rundir import control
from grpo_launch.rundir.checkpoints import decide_resume
from grpo_launch.rundir.files import LauncherLog, RunLock, write_run_files
from grpo_launch.rundir.invocation import Invocation, write_invocation
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.records import Attempt, LogRecord, MetricsTail, StepRecord, append, read_metrics
from grpo_launch.rundir.trusted_files import private_umask
from grpo_launch.spec import REDACTED, ProcessSpec, holds_secret, is_secret_name, redact_argv, redact_env

from .helpers import ROOT, TINY_RECIPE, free_port, plan_recipe, tiny_overrides

CLI = [sys.executable, "-m", "grpo_launch"]
PRECIOUS = "precious: must never be overwritten\n"
HF = "hf_" + "a" * 30


def _cli(*args: str, timeout: int = 180, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env={**os.environ, **(env or {})})  # fmt: skip


@contextlib.contextmanager
def _umask(mask: int):
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def _nobody() -> int:
    if os.geteuid() != 0:
        pytest.skip("another user is made real with chown or setuid, which needs root")
    return pwd.getpwnam("nobody").pw_uid


def _victim(tmp_path: Path, name: str = "authorized_keys") -> Path:
    victim = tmp_path / "victim" / name
    victim.parent.mkdir(exist_ok=True)
    victim.write_text(PRECIOUS)
    return victim


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)) or ".": stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


def _metrics_run(run: Path, steps: int = 2) -> Path:
    """A run directory as the trainers and the launcher write it (their own writer, the records' own types)."""
    for step in range(1, steps + 1):
        append(RunPaths(run).metrics, StepRecord(step=step, step_s=2.0, generation_s=1.5, training_s=0.5,
                                                 max_steps=10, time=1000.0 + step, num_tokens=100 * step,
                                                 memory_kind="rss_max", attempt=1))  # fmt: skip
        append(RunPaths(run).metrics, LogRecord(step, {"reward": 0.25 * step}, attempt=1))
    return run


# ---------------------------------------------------------------------------------------- 1. private run dir
class TestPrivateWhateverTheUmask:
    """Reproduction: ``umask 002; grpo-launch run …`` made RUN_DIR 0775; a group member replaced invocation.json
    (``resume`` ran it) or rewrote a checkpoint's .pt in place (auto-resume unpickled it)."""

    def test_everything_the_launcher_writes_is_0700_or_0600_under_umask_002(self, tmp_path):
        run = tmp_path / "runs" / "run"  # a missing parent too
        paths = RunPaths(run)
        with _umask(0o002), RunLock(run):
            write_run_files(run, {"plan.json": "{}\n", "trainer_recipe.yaml": "a: 1\n"}, locked=True)
            append(paths.metrics, StepRecord(1, 1.0))
            append(paths.attempts, Attempt(1, time.time(), RunState.FAILED, 1))
            control.reset(run)
            control.write_stop_grace(run, 5.0, "test")
            control.request_stop(run)
            control.mark_stopped(run, 1)
            log = LauncherLog(run)
            log.start()
            log.write("hello")
            write_invocation(Invocation.of("run", "r.yaml", [], [], backend="local", run_dir=str(run),
                                           workdir="/", version="0"))  # fmt: skip
        modes = _modes(tmp_path / "runs")
        assert {"run/invocation.json", "run/logs/launcher.log", "run/control/stop-grace", "run/metrics.jsonl",
                "run/.grpo-launch.lock", "run/control/stopped-at-step"} <= set(modes)  # fmt: skip
        wrong = {name: oct(mode) for name, mode in modes.items()
                 if mode != (0o700 if (tmp_path / "runs" / name).is_dir() else 0o600)}  # fmt: skip
        assert not wrong, wrong

    def test_a_group_member_can_no_longer_replace_the_record_resume_runs(self):
        """A real process of another user in the file's group tries what the reproduction did: replace
        invocation.json (the directory was group-writable) with a record of their own."""
        import tempfile

        nobody = _nobody()
        base = Path(tempfile.mkdtemp(prefix="grpo-group-", dir="/tmp"))  # a path the group member can reach
        try:
            base.chmod(0o755)
            run = base / "run"
            with _umask(0o002):
                write_invocation(Invocation.of("run", "r.yaml", [], [], backend="local", run_dir=str(run),
                                               workdir="/", version="0"))  # fmt: skip
            record = RunPaths(run).invocation
            gid = record.stat().st_gid

            def as_group_member() -> None:
                os.setgroups([gid])
                os.setgid(gid)
                os.setuid(nobody)

            replace = 'echo "{}" > "$0.x" && mv -f "$0.x" "$0"'
            done = subprocess.run(["/bin/sh", "-c", replace, str(record)], preexec_fn=as_group_member,
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
            assert done.returncode != 0 and "Permission denied" in done.stderr, done.stderr
            assert json.loads(record.read_text())["recipe"] == "r.yaml"
        finally:
            shutil.rmtree(base, ignore_errors=True)

    @pytest.mark.parametrize("how", ["group-writable record", "group-writable run directory", "foreign record"])
    def test_resume_refuses_a_record_another_user_could_have_rewritten(self, tmp_path, how):
        run = tmp_path / "run"
        write_invocation(Invocation.of("run", "r.yaml", [], [], backend="local", run_dir=str(run), workdir="/",
                                       version="0"))  # fmt: skip
        record = RunPaths(run).invocation
        if how == "group-writable record":
            record.chmod(0o664)  # as a run under umask 002 left it
        elif how == "group-writable run directory":
            run.chmod(0o775)
        else:
            os.chown(record, _nobody(), -1)
        out = _cli("resume", str(run))
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        expected = "owned by nobody" if how == "foreign record" else "writable by its group"
        assert expected in out.stderr, out.stderr
        assert "resume" not in out.stdout  # the recorded command was never run

    @pytest.mark.parametrize("where", ["a DeepSpeed .pt", "the checkpoint directory", "output_dir"])
    def test_auto_resume_refuses_a_checkpoint_its_group_may_rewrite(self, tmp_path, where):
        from grpo_launch.train.core import resume_checkpoint
        from grpo_launch.train.environment import JobEnvironment

        output = tmp_path / "output"
        ckpt = output / "checkpoint-5"
        (ckpt / "global_step5").mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
        pt = ckpt / "global_step5" / "mp_rank_00_model_states.pt"
        pt.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip: a whole torch archive as the check reads it
        for p in (output, ckpt, ckpt / "global_step5"):
            p.chmod(0o700)
        {"a DeepSpeed .pt": pt, "the checkpoint directory": ckpt, "output_dir": output}[where].chmod(0o775)
        with pytest.raises(LaunchError) as caught:
            decide_resume(output, ResumeMode.AUTO, 10)
        text = caught.value.message + (caught.value.hint or "")
        assert "writable by its group" in text and "go-w" in text, text
        assert ckpt.is_dir()  # nothing moved aside
        job = JobEnvironment(0, 0, 0, "h", (), str(ckpt), None)  # each trainer checks before it loads
        with pytest.raises(LaunchError, match="writable by its group"):
            resume_checkpoint(job, str(output))

    def test_the_processes_a_run_starts_create_private_files_and_sockets(self, tmp_path):
        """A umask is inherited: what the trainers (checkpoints) and vLLM (its IPC sockets in TMPDIR: connecting to
        a Unix socket needs write permission on it) create under the launcher's is private."""
        script = (
            "import os, socket, sys; d = sys.argv[1]\n"
            "open(os.path.join(d, 'f'), 'w').close(); os.mkdir(os.path.join(d, 'd'))\n"
            "s = socket.socket(socket.AF_UNIX); s.bind(os.path.join(d, 's')); s.close()\n"
        )
        with _umask(0o002):
            with private_umask():
                subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=60)
            assert os.umask(0o002) == 0o002  # the launcher's own umask comes back after the run
        assert _modes(tmp_path) == {".": stat.S_IMODE(tmp_path.stat().st_mode), "f": 0o600, "d": 0o700, "s": 0o700}

    def test_the_shim_gives_a_remote_process_the_private_umask(self, tmp_path):
        """On ssh, Slurm and Ray hosts a process does not inherit the launcher's umask: the shim sets it."""
        target = tmp_path / "checkpoint.pt"
        child = f"open({str(target)!r}, 'w').close()"
        subprocess.run([sys.executable, "-m", "grpo_launch.node.shim", "--", sys.executable, "-c", child], check=True,
                       timeout=60, cwd=ROOT, preexec_fn=lambda: os.umask(0o002))  # fmt: skip
        assert stat.S_IMODE(target.stat().st_mode) == 0o600

    @pytest.mark.slow
    def test_a_real_run_under_umask_002_leaves_nothing_its_group_can_write(self, tmp_path):
        run = tmp_path / "run"
        args = [*CLI, TINY_RECIPE, *tiny_overrides(tmp_path), "max_steps=2", "save_steps=1",
                f"launch.main_process_port={free_port()}", "--run-dir", str(run)]  # fmt: skip
        done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600,
                              preexec_fn=lambda: os.umask(0o002))  # fmt: skip
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        modes = _modes(run)
        assert modes["."] == 0o700 and any(name.endswith(".safetensors") for name in modes)
        assert any("checkpoint-2" in name for name in modes), sorted(modes)
        writable = {name: oct(mode) for name, mode in modes.items() if mode & (stat.S_IWGRP | stat.S_IWOTH)}
        assert not writable, writable
        again = _cli("resume", str(run), timeout=600)  # its own checkpoints are trusted
        assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]


# -------------------------------------------------------------------------------------------- 2. the report
class TestTheReportNeverFollowsALink:
    """Reproduction: ``grpo-launch report OTHERS_RUN`` where RUN/report (or RUN/report/reward.png) is a link: the
    link's target was overwritten with HTML and PNG."""

    @pytest.fixture(autouse=True)
    def _matplotlib(self):
        pytest.importorskip("matplotlib")

    @pytest.mark.parametrize("planted", ["report.html", "reward.png"])
    def test_a_linked_file_in_the_report_directory(self, tmp_path, planted):
        from grpo_launch.analysis.report import write_report

        run, victim = _metrics_run(tmp_path / "run"), _victim(tmp_path)
        report = RunPaths(run).report
        report.mkdir(mode=0o700)
        (report / planted).symlink_to(victim)
        with pytest.raises(LaunchError, match="symbolic link"):
            write_report(run)
        assert victim.read_text() == PRECIOUS

    def test_a_linked_report_directory_and_the_real_cli(self, tmp_path):
        run, victim = _metrics_run(tmp_path / "run"), _victim(tmp_path, "report.html")
        (victim.parent / "reward.png").write_text(PRECIOUS)
        RunPaths(run).report.symlink_to(victim.parent)
        out = _cli("report", str(run))
        assert out.returncode != 0 and "symbolic link" in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert victim.read_text() == PRECIOUS and (victim.parent / "reward.png").read_text() == PRECIOUS
        assert sorted(p.name for p in victim.parent.iterdir()) == ["report.html", "reward.png"]

    def test_a_hard_link_planted_in_the_report_directory(self, tmp_path):
        from grpo_launch.analysis.report import write_report

        run, victim = _metrics_run(tmp_path / "run"), _victim(tmp_path)
        report = RunPaths(run).report
        report.mkdir(mode=0o700)
        os.link(victim, report / "report.html")
        with pytest.raises(LaunchError, match="names"):
            write_report(run)
        assert victim.read_text() == PRECIOUS

    @pytest.mark.parametrize("how", ["another user's", "group-writable"])
    def test_a_report_directory_someone_else_may_plant_in(self, tmp_path, how):
        from grpo_launch.analysis.report import write_report

        run = _metrics_run(tmp_path / "run")
        report = RunPaths(run).report
        report.mkdir(mode=0o700)
        if how == "group-writable":
            report.chmod(0o775)
        else:
            os.chown(report, _nobody(), -1)
        with pytest.raises(LaunchError, match="owned by nobody" if how != "group-writable" else "writable by"):
            write_report(run)
        assert not list(report.iterdir())

    def test_the_report_is_written_private(self, tmp_path):
        from grpo_launch.analysis.report import write_report

        run = _metrics_run(tmp_path / "run")
        with _umask(0o002):
            path = write_report(run)
        assert path.read_text().startswith("<!doctype html>")
        modes = _modes(path.parent)
        assert modes.pop(".") == 0o700 and {"report.html", "reward.png"} <= set(modes)
        assert set(modes.values()) == {0o600}, modes


# --------------------------------------------------------------------------- 3. line breaks in the recipe path
BREAKS = {"newline": "\n", "carriage return": "\r", "NEL": "\x85", "line separator": "\u2028",
          "paragraph separator": "\u2029"}  # fmt: skip


class TestLineBreaksInTheRecipePath:
    """Reproduction: a recipe file named ``a<LF>push_to_hub: true<LF>b.yaml`` put ``push_to_hub: true`` into
    trainer_recipe.yaml (its header comment names the recipe); its hostfile ``--dry-run``, pasted, ran a ``touch``."""

    @pytest.mark.parametrize("name", sorted(BREAKS))
    def test_the_trainer_recipes_header_stays_one_comment(self, tmp_path, name):
        from grpo_launch.render import render_files

        brk = BREAKS[name]
        recipe = tmp_path / f"a{brk}push_to_hub: true{brk}hub_model_id: x{brk}#.yaml"  # its last line a comment
        shutil.copy(ROOT / "recipes" / "qwen1.5b.yaml", recipe)
        text = render_files(plan_recipe(str(recipe), "8xH100-80GB"))["trainer_recipe.yaml"]
        values = yaml.safe_load(text)
        assert "push_to_hub" not in values and "hub_model_id" not in values, text[:300]
        header = text.split("\n", 1)[0]
        assert header.startswith("# Resolved by grpo-launch") and header.endswith(".yaml.")

    def test_a_pasted_hostfile_dry_run_runs_no_injected_command(self, tmp_path):
        recipe = tmp_path / "a\ntouch PWNED\nb.yaml"
        shutil.copy(TINY_RECIPE, recipe)
        (tmp_path / "hosts").write_text("localhost slots=1\n")
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "ssh").write_text("#!/bin/sh\nexit 0\n")  # the hosts' probe and the pasted commands reach no host
        (fake / "ssh").chmod(0o755)
        env = {"PATH": f"{fake}:{os.environ['PATH']}"}
        out = _cli("run", str(recipe), *tiny_overrides(tmp_path), "--dry-run", "--run-dir", str(tmp_path / "run"),
                   "--hostfile", str(tmp_path / "hosts"), env=env, cwd=tmp_path)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "a\\ntouch PWNED\\nb.yaml" in out.stdout  # shown, escaped, on its comment line
        pasted = subprocess.run(["bash"], input=out.stdout, cwd=tmp_path, capture_output=True, text=True,
                                timeout=120, env={**os.environ, **env})  # fmt: skip
        assert not (tmp_path / "PWNED").exists(), pasted.stderr

    def test_a_pasted_resume_dry_run_runs_no_injected_command(self, tmp_path):
        run = tmp_path / "run"
        write_invocation(Invocation.of("run", "a\ntouch PWNED\nb.yaml", [], [], backend="local", run_dir=str(run),
                                       workdir=str(tmp_path), version="0"))  # fmt: skip
        out = _cli("resume", str(run), "--dry-run", cwd=tmp_path)
        assert "# resume" in out.stdout, out.stdout + out.stderr
        subprocess.run(["bash"], input=out.stdout, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert not (tmp_path / "PWNED").exists()

    @pytest.mark.parametrize("name", sorted(BREAKS))
    def test_the_sky_task_refuses_every_yaml_line_break(self, name):
        from grpo_launch.backends.skypilot.task import SkyTaskRequest, check_request

        req = SkyTaskRequest(name="c", recipe=f"a{BREAKS[name]}run: id{BREAKS[name]}.yaml", workdir=".", run_dir="r")
        with pytest.raises(ConfigError) as caught:
            check_request(req)
        assert any("line break" in p for p in caught.value.problems)


# ------------------------------------------------------------------------------------------------ 4. secrets
NOW_SECRET = ["API_KEY_2", "HF_TOKEN2", "GITHUB_PAT", "MYSQL_PWD", "SMTP_PASS", "api_key_2", "gitlab-pat",
              "--hf-token-2", "launch.train_env.DB_PWD", "AZURE_DEVOPS_PAT"]  # fmt: skip
# Names that say where a secret is, or hold none: the file's path is no secret, and PWD is the working directory.
STILL_HARMLESS = ["TOKENIZERS_PARALLELISM", "KEY_PATH", "PASSWORD_FILE", "PASSWORD_FILE_DIR", "PWD", "OLDPWD",
                  "BYPASS", "COMPASS", "SHA256", "MAX_TOKENS_2", "MONKEY", "PATH", "HOTKEY"]  # fmt: skip
SECRET_VALUES = ["postgres://user:pw@host/db", "redis://:pw@cache:6379/0", "mysql+pymysql://u:p%40ss@h:3306/d",
                 "host=h user=u password=pw dbname=d", "Server=h;UID=u;PWD=pw", HF]  # fmt: skip
HARMLESS_VALUES = ["http://host:8000/v1", "https://git@github.com/o/r.git", "s3://bucket/key", "/data/key.pem",
                   "a=b c=d", "say key: value"]  # fmt: skip


class TestSecretsThatPassedTheRule:
    """Reproduction: ``launch.train_env={MYSQL_PWD: x}`` was accepted and ``--db postgres://u:pw@h/db`` was written
    down in clear; a token-shaped value under a harmless name went on the ssh command line."""

    @pytest.mark.parametrize("name", NOW_SECRET)
    def test_a_numbered_or_conventional_secret_name(self, name):
        assert is_secret_name(name)

    @pytest.mark.parametrize("name", STILL_HARMLESS)
    def test_a_harmless_name_stays(self, name):
        assert not is_secret_name(name)

    @pytest.mark.parametrize("value", SECRET_VALUES)
    def test_a_password_in_a_url_or_connection_string_is_redacted(self, value):
        assert holds_secret("DATABASE_URL", value)
        assert redact_env({"DATABASE_URL": value}) == {"DATABASE_URL": REDACTED}
        assert value not in " ".join(redact_argv(["app", "--db", value, f"DB={value}"]))

    @pytest.mark.parametrize("value", HARMLESS_VALUES)
    def test_a_url_without_a_password_stays(self, value):
        assert not holds_secret("ENDPOINT", value)
        assert redact_argv(["--endpoint", value]) == ["--endpoint", value]

    def test_the_recipe_refuses_the_new_names_in_its_env_blocks(self):
        from grpo_launch.recipe import load_recipe

        with pytest.raises(ConfigError, match=r"launch\.train_env sets MYSQL_PWD, a secret by its name"):
            load_recipe(TINY_RECIPE, ["launch.train_env={MYSQL_PWD: x}"])

    def test_a_secret_looking_value_travels_on_stdin_not_on_the_ssh_command_line(self, tmp_path):
        """The ssh client is a real process (a stand-in ``ssh`` that runs the remote line here, recording its
        arguments); the value reaches the remote process through the shim's stdin."""
        from grpo_launch.backends.options import SshOptions
        from grpo_launch.backends.ssh import ssh_spec
        from grpo_launch.execute.run import stdin_values
        from grpo_launch.execute.supervisor import Supervisor

        fake = tmp_path / "bin"
        fake.mkdir()
        seen = tmp_path / "ssh-argv"
        (fake / "ssh").write_text(
            f'#!/bin/sh\nprintf "%s\\n" "$@" >> {shlex.quote(str(seen))}\n'
            'while [ "$1" != "--" ]; do shift; done; shift\n'
            'exec env -i PATH="$PATH" sh -c "$*"\n'
        )  # a host: none of this environment
        (fake / "ssh").chmod(0o755)
        out = tmp_path / "got"
        child = f"import os; open({str(out)!r}, 'w').write(os.environ['MY_SETTING'] + ' ' + os.environ['A'])"
        spec = ProcessSpec("train", (sys.executable, "-c", child), env={"MY_SETTING": HF, "A": "1"}, host="h1")
        placed = ssh_spec(spec, SshOptions(), python=sys.executable, workdir=str(ROOT), stdin_env=())
        assert HF not in " ".join(placed.argv) and "A=1" in placed.argv[-1]
        assert placed.stdin_env == ("MY_SETTING",) and HF not in placed.shell()
        environ = {"PATH": f"{fake}:{os.environ['PATH']}", **stdin_values((placed,))}
        sup = Supervisor(tmp_path / "logs", emit=lambda line: None, environ=environ, grace_s=2)
        try:
            sup.start(placed).proc.wait(timeout=60)
        finally:
            sup.stop_all()
        assert out.read_text() == f"{HF} 1"
        assert HF not in seen.read_text(), seen.read_text()

    def test_two_processes_that_need_two_such_values_under_one_name_are_refused(self):
        from grpo_launch.execute.run import stdin_values

        a = ProcessSpec("vllm", ("x",), env={"X": HF}, stdin_env=("X",))
        b = ProcessSpec("train", ("x",), env={"X": HF + "b"}, stdin_env=("X",))
        with pytest.raises(ConfigError, match="X has two values"):
            stdin_values((a, b))


# ------------------------------------------------------------------------------------- 5. the metrics endpoint
class TestTheMetricsEndpoint:
    """Reproduction: 150 idle connections to ``launch.metrics_port`` held 154 threads of the launcher, and every
    scrape parsed the whole metrics.jsonl again."""

    def test_idle_connections_do_not_pile_up_threads(self, tmp_path):
        from grpo_launch.execute.live import serve_metrics

        run = _metrics_run(tmp_path / "run")
        port = free_port()
        before = threading.active_count()
        server = serve_metrics(run, "127.0.0.1", port, timeout_s=1.0, max_connections=4)
        idle = []
        try:
            for _ in range(150):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(0.5)
            assert threading.active_count() <= before + 1 + 4, threading.active_count()  # the server's own + 4
            time.sleep(1.5)  # the served idle ones time out; the rest were closed at once
            closed = 0
            for s in idle:
                s.settimeout(2)
                with contextlib.suppress(OSError):
                    closed += s.recv(1) == b""
            assert closed == 150
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            assert "grpo_launch_step 2.0" in body
        finally:
            for s in idle:
                s.close()
            server.shutdown()
            server.server_close()

    def test_a_second_scrape_reads_only_the_new_bytes(self, tmp_path):
        from grpo_launch.execute.live import serve_metrics

        run = _metrics_run(tmp_path / "run")
        metrics = RunPaths(run).metrics
        port = free_port()
        server = serve_metrics(run, "127.0.0.1", port)
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            assert "grpo_launch_step 2.0" in urllib.request.urlopen(url, timeout=10).read().decode()
            first = metrics.stat().st_size
            assert server.collector.tail.bytes_read == first
            append(metrics, StepRecord(step=3, step_s=2.0, max_steps=10, time=1003.0, attempt=1))
            assert "grpo_launch_step 3.0" in urllib.request.urlopen(url, timeout=10).read().decode()
            assert server.collector.tail.bytes_read == metrics.stat().st_size  # first + only what was appended
            metrics.rename(tmp_path / "set-aside.jsonl")  # --resume never: a new file, read from its start
            append(metrics, StepRecord(step=1, step_s=2.0, max_steps=10, time=2001.0, attempt=2))
            assert "grpo_launch_step 1.0" in urllib.request.urlopen(url, timeout=10).read().decode()
        finally:
            server.shutdown()
            server.server_close()

    def test_a_line_being_written_waits_for_its_end(self, tmp_path):
        path = tmp_path / "metrics.jsonl"
        line = json.dumps(StepRecord(step=1, step_s=2.0).to_json()) + "\n"
        path.write_text(line[:10])
        tail = MetricsTail(path)
        assert tail.read() == ((), True)
        with path.open("a") as f:
            f.write(line[10:])
        records, found = tail.read()
        assert found and [r.step for r in records] == [1]  # type: ignore[union-attr]
        assert tail.bytes_read == len(line)


# ------------------------------------------------------------------------------------ 6. deep JSON in a record
DEEP = "[" * 1200 + "]" * 1200


class TestDeeplyNestedLines:
    """Reproduction: a metrics.jsonl line nested 1,200 deep raised RecursionError (a traceback) in ``status``,
    ``report`` and ``plan --calibrate-from``: it is a malformed line like any other."""

    def test_the_three_verbs_name_the_line_as_for_any_malformed_line(self, tmp_path):
        from .test_rundir_trust import _gpu_run

        run = _gpu_run(tmp_path)
        with (run / "metrics.jsonl").open("a") as f:
            f.write('{"step": 5, "step_s": 1.0, "deep": ' + DEEP + "}\n")
        verbs = [["status", str(run)], ["report", str(run)],
                 ["plan", str(ROOT / "recipes" / "qwen1.5b.yaml"), "--gpus", "8xH100-80GB", "--no-write",
                  "--calibrate-from", str(run)]]  # fmt: skip
        for verb in verbs:
            out = _cli(*verb)
            assert out.returncode == 2, (verb[0], out.stdout[-500:], out.stderr[-2000:])
            assert "RecursionError" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
            assert "metrics.jsonl, line 9" in out.stderr and "nested deeper" in out.stderr, out.stderr[-2000:]

    def test_a_deep_line_that_was_cut_short_is_skipped_as_one(self, tmp_path):
        from .test_rundir_trust import _gpu_run

        run = _gpu_run(tmp_path)
        with (run / "metrics.jsonl").open("a") as f:
            f.write(DEEP + "\n")  # not a record's end: read as a line cut short, and skipped
        for verb in (["status", str(run)], ["report", str(run)]):
            out = _cli(*verb)
            assert out.returncode == 0 and "Traceback" not in out.stderr, (verb[0], out.stderr[-2000:])

    def test_the_lenient_readers_leave_it_out(self, tmp_path):
        run = _metrics_run(tmp_path / "run")
        with RunPaths(run).metrics.open("a") as f:
            f.write('{"step": 9, "step_s": 1.0, "deep": ' + DEEP + "}\n")
        assert [r.step for r in read_metrics(RunPaths(run).metrics)] == [1, 1, 2, 2]
        assert len(MetricsTail(RunPaths(run).metrics).read()[0]) == 4


# ----------------------------------------------------------------------------------- 7. a FIFO as launcher.log
class TestAFifoAsTheLaunchersLog:
    """Reproduction: ``mkfifo RUN/logs/launcher.log`` was not refused (the log was silently given up)."""

    def test_the_run_refuses_it_before_it_starts(self, tmp_path):
        run = tmp_path / "run"
        RunPaths(run).logs.mkdir(parents=True, mode=0o700)
        os.mkfifo(RunPaths(run).launcher_log)
        out = _cli("run", TINY_RECIPE, *tiny_overrides(tmp_path), "max_steps=1", "--run-dir", str(run), timeout=120)
        assert out.returncode == 1 and "launcher.log" in out.stderr and "not a regular file" in out.stderr, out.stderr
        assert "rm " in out.stderr and "Traceback" not in out.stderr
        assert not RunPaths(run).lock.exists() and stat.S_ISFIFO(RunPaths(run).launcher_log.lstat().st_mode)

    def test_the_lock_refuses_it_without_waiting_for_a_writer(self, tmp_path):
        run = tmp_path / "run"
        RunPaths(run).logs.mkdir(parents=True, mode=0o700)
        os.mkfifo(RunPaths(run).launcher_log)
        result: list[BaseException | None] = []

        def take() -> None:
            try:
                with RunLock(run):
                    result.append(None)
            except BaseException as exc:  # the thread's outcome, asserted below
                result.append(exc)

        worker = threading.Thread(target=take, daemon=True)
        worker.start()
        worker.join(timeout=20)
        assert not worker.is_alive(), "the check blocked on the FIFO"
        assert isinstance(result[0], LaunchError) and "not a regular file" in result[0].message


# ---------------------------------------------------------------------------------------- 8. Ray's exporters
class TestRaysMetricsExporter:
    """Ray 2.60 serves each node's Prometheus metrics on every interface, without authentication, unless the node's
    address is loopback; the Ray grpo-launch starts (the SkyPilot task, the test cluster) runs without it."""

    def test_the_sky_tasks_ray_and_the_test_cluster_run_without_it(self):
        from grpo_launch.backends.skypilot.task import RAY_NODE_ENV, SkyTaskRequest, render_run_script

        assert RAY_NODE_ENV == ("RAY_enable_metrics_collection=0",)
        script = render_run_script(SkyTaskRequest(name="c", recipe="r.yaml", workdir=".", run_dir="r"))
        (start,) = [line for line in script.splitlines() if "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0" in line]
        assert "RAY_enable_metrics_collection=0" in start, start
        assert "RAY_enable_metrics_collection=0" in (ROOT / "scripts" / "ray_hosts.sh").read_text()

    @pytest.mark.slow
    @pytest.mark.ray
    def test_a_real_ray_node_with_that_environment_serves_no_exporter(self, tmp_path):
        """``ray start --head --block`` on this machine's own non-loopback address, in a session of its own (stopped
        by its process group: never ``ray stop``, which would stop every Ray here)."""
        pytest.importorskip("ray")
        address = next((a for a in _own_addresses() if not a.startswith("127.")), None)
        if address is None:
            pytest.skip("no non-loopback IPv4 address here")
        export = free_port()
        ports = {name: str(free_port()) for name in ("AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT")}
        temp = Path(f"/tmp/grpo-ray-{os.getpid()}")
        args = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--disable-usage-stats",
                "--node-ip-address", address, "--port", str(free_port()), "--num-cpus", "1", "--temp-dir", str(temp),
                "--metrics-export-port", str(export), "--dashboard-port", str(free_port()),
                "--ray-client-server-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
                "--dashboard-agent-grpc-port", str(free_port()), "--runtime-env-agent-port", str(free_port()),
                "--node-manager-port", str(free_port()), "--object-manager-port", str(free_port())]  # fmt: skip
        from grpo_launch.backends.skypilot.task import RAY_NODE_ENV

        env = {**os.environ, **dict(v.split("=", 1) for v in RAY_NODE_ENV), **ports}
        ray = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            agent = None
            while time.monotonic() < deadline and agent is None:  # the dashboard agent is the exporter's process
                time.sleep(1)
                agent = next((p for p in _listeners() if "DashboardA" in p[1]), None)
            assert agent is not None, "Ray's dashboard agent never listened"
            time.sleep(5)  # the exporter starts with the agent's reporter module
            assert not [p for p in _listeners() if p[0].endswith(f":{export}")], _listeners()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(ray.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                ray.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(ray.pid, signal.SIGKILL)
            ray.wait(timeout=30)
            shutil.rmtree(temp, ignore_errors=True)


def _own_addresses() -> list[str]:
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout
    return [a for a in out.split() if a.count(".") == 3]


def _listeners() -> list[tuple[str, str]]:
    """Every listening TCP socket here: (local address:port, the process that holds it)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return [(cols[3], cols[-1]) for cols in (line.split() for line in out.splitlines()) if len(cols) >= 5]

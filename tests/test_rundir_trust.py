"""A run directory cannot be turned against its user (issue 37, items 7 and 8).

- Links planted where the launcher writes (the lock, launcher.log, a process's log, the records) are refused, and
  the file they point at is left as it was (every such file is opened with O_NOFOLLOW).
- A run directory, output_dir or checkpoint owned by another user, or writable by all without the sticky bit, is
  refused before anything is read from it (auto-resume would load a checkpoint: DeepSpeed and the Trainer unpickle
  it). These tests run as root on this machine: another user's ownership is made for real with ``chown nobody``
  (skipped where the tests cannot chown, i.e. not root).
- Commands printed for copy-paste read back, through ``shlex.split``, as the words they stand for, whatever the run
  directory is called (spaces, ``$(…)``, quotes, backticks, a newline).
- A crafted run directory (a step of 1e400, a `$`, escape or newline in a reward name or a failure's cause, a cut
  JSON line, a wrong type) gives ``status``, ``report`` and ``plan --calibrate-from`` an error naming the file (and the
  line), never a traceback, and no control character from it reaches the terminal (the real CLI, run as a process).
- A remote process-group announcement counts only as the first line of the shim's output and only for a group > 1
  (``kill -- -1`` signals every process of the user on that host): real processes under the real Supervisor.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_launch.analysis.split_verdict import split_verdict
from grpo_launch.enums import ResumeMode, RunState, VllmMode
from grpo_launch.errors import LaunchError
from grpo_launch.rundir.checkpoints import decide_resume
from grpo_launch.rundir.files import LauncherLog, RunLock, in_use
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.records import Attempt, append
from grpo_launch.spec import ProcessSpec

from .helpers import ROOT, TINY_RECIPE

CLI = [sys.executable, "-m", "grpo_launch"]
PRECIOUS = "precious: must never be overwritten\n"


def _cli(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim" / "authorized_keys"
    victim.parent.mkdir(exist_ok=True)
    victim.write_text(PRECIOUS)
    return victim


def _nobody() -> int:
    if os.geteuid() != 0:
        pytest.skip("another user's ownership is made with chown, which needs root")
    return pwd.getpwnam("nobody").pw_uid


# ---------------------------------------------------------------------------------------------------- links
LINKED = {
    "lock": lambda p: p.lock,
    "launcher.log": lambda p: p.launcher_log,
    "attempts.jsonl": lambda p: p.attempts,
    "metrics.jsonl": lambda p: p.metrics,
}


class TestPlantedLinks:
    """A symbolic link where the launcher writes is refused, and its target keeps its text (on main the lock's JSON
    replaced it)."""

    @pytest.mark.parametrize("name", sorted(LINKED))
    def test_the_run_refuses_a_linked_file_and_leaves_its_target(self, tmp_path, name):
        run, victim = tmp_path / "run", _victim(tmp_path)
        target = LINKED[name](RunPaths(run))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(victim)
        with pytest.raises(LaunchError, match="symbolic link") as err, RunLock(run):
            pass
        assert str(target) in err.value.message and "rm " in (err.value.hint or "")
        assert victim.read_text() == PRECIOUS

    def test_the_launcher_log_is_never_written_through_a_link_made_after_the_start(self, tmp_path):
        run, victim = tmp_path / "run", _victim(tmp_path)
        log = LauncherLog(run)
        log.start()
        log.write("first line")
        RunPaths(run).launcher_log.unlink()
        RunPaths(run).launcher_log.symlink_to(victim)  # raced in after the run's checks
        log.write("second line")
        assert victim.read_text() == PRECIOUS

    @pytest.mark.parametrize("record", ["attempts", "metrics"])
    def test_a_record_is_never_appended_through_a_link(self, tmp_path, record):
        victim = _victim(tmp_path)
        path = getattr(RunPaths(tmp_path / "run"), record)
        path.parent.mkdir(parents=True)
        path.symlink_to(victim)
        with pytest.raises(LaunchError, match="symbolic link"):
            append(path, Attempt(1, time.time(), RunState.FAILED, 1))
        assert victim.read_text() == PRECIOUS

    def test_a_hard_link_or_a_fifo_is_refused_too(self, tmp_path):
        run, victim = tmp_path / "run", _victim(tmp_path)
        paths = RunPaths(run)
        paths.control.mkdir(parents=True)
        os.link(victim, paths.attempts)  # the same file under a second name: O_NOFOLLOW alone would write it
        with pytest.raises(LaunchError, match="names"):
            append(paths.attempts, Attempt(1, time.time(), RunState.FAILED, 1))
        assert victim.read_text() == PRECIOUS
        os.mkfifo(paths.lock)  # a FIFO would hang the open for write
        with pytest.raises(LaunchError, match="not a regular file"), RunLock(run):
            pass

    def test_a_fifo_planted_as_the_lock_never_hangs_status_or_plan(self, tmp_path):
        run = tmp_path / "run"
        append(RunPaths(run).attempts, Attempt(1, time.time(), RunState.FAILED, 1, cause="boom"))
        os.mkfifo(RunPaths(run).lock)  # reading who holds the lock opened it, and waited for a writer forever
        status = _cli("status", str(run), timeout=60)
        assert status.returncode == 0 and "not running" in status.stdout, status.stderr
        plan = _cli("plan", TINY_RECIPE, "--run-dir", str(run), timeout=120)
        assert plan.returncode == 0 and "plans for another directory" in plan.stdout, plan.stderr

    @pytest.mark.parametrize("planted", ["metrics", "attempts"])
    def test_a_fifo_planted_as_a_record_never_hangs_status_or_report(self, tmp_path, planted):
        """The records are read as the lock is: a FIFO (or device) in a record's place is a file that does not read,
        never a read that waits for a writer (status and report read other users' runs)."""
        run = tmp_path / "run"
        paths = RunPaths(run)
        append(paths.attempts, Attempt(1, time.time(), RunState.FAILED, 1, cause="boom"))
        target = paths.metrics if planted == "metrics" else paths.attempts
        target.unlink(missing_ok=True)
        os.mkfifo(target)
        status = _cli("status", str(run), timeout=60)  # a hang is a TimeoutExpired here
        assert "Traceback" not in status.stderr, status.stderr
        assert status.returncode == 0 or str(target) in status.stderr, (status.stdout, status.stderr)

    def test_a_process_log_is_never_written_through_a_link(self, tmp_path):
        """The Supervisor's log for each child is named by the time it starts: links planted for the next seconds'
        names are refused, before the process starts."""
        from grpo_launch.execute.supervisor import Supervisor

        victim = _victim(tmp_path)
        logs = tmp_path / "run" / "logs"
        logs.mkdir(parents=True)
        now = time.time()
        for s in range(-1, 6):
            (logs / f"vllm-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now + s))}.log").symlink_to(victim)
        sup = Supervisor(logs, emit=lambda line: None, environ={"PATH": os.environ["PATH"]}, grace_s=2)
        marker = tmp_path / "started"
        spec = ProcessSpec("vllm", (sys.executable, "-c", f"open({str(marker)!r}, 'w'); print('hello')"))
        try:
            with pytest.raises(LaunchError, match="symbolic link"):
                sup.start(spec)
        finally:
            sup.stop_all()
        assert victim.read_text() == PRECIOUS and not marker.exists()

    def test_the_real_cli_refuses_a_planted_lock_link(self, tmp_path):
        run, victim = tmp_path / "run", _victim(tmp_path)
        run.mkdir()
        RunPaths(run).lock.symlink_to(victim)
        out = _cli("run", TINY_RECIPE, "--run-dir", str(run), "max_steps=1")
        assert out.returncode != 0 and "symbolic link" in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert victim.read_text() == PRECIOUS


# ------------------------------------------------------------------------------------------------ ownership
def _complete_checkpoint(output: Path, step: int = 5) -> Path:
    ckpt = output / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return ckpt


class TestUntrustedDirectories:
    """Another user's, or everybody's, run directory / output_dir / checkpoint is refused before anything loads."""

    @pytest.mark.parametrize("how", ["foreign", "world-writable"])
    def test_a_run_directory(self, tmp_path, how):
        run = tmp_path / "run"
        run.mkdir()
        if how == "foreign":
            os.chown(run, _nobody(), -1)
        else:
            run.chmod(0o777)
        with pytest.raises(LaunchError) as err, RunLock(run):
            pass
        text = err.value.message + (err.value.hint or "")
        assert str(run) in text and ("nobody" in text and "chown" in text if how == "foreign" else "chmod go-w" in text)
        assert not RunPaths(run).lock.exists()  # nothing written there

    def test_a_sticky_shared_directory_is_fine(self, tmp_path):
        run = tmp_path / "run"
        run.mkdir()
        run.chmod(0o1777)  # like /tmp: others may write, but not replace what is yours
        with RunLock(run):
            assert RunPaths(run).lock.is_file()

    @pytest.mark.parametrize("how", ["foreign output_dir", "world-writable output_dir", "foreign checkpoint file",
                                     "world-writable checkpoint"])  # fmt: skip
    def test_auto_resume_refuses_before_choosing_a_checkpoint(self, tmp_path, how):
        output = tmp_path / "output"
        ckpt = _complete_checkpoint(output)
        planted = ckpt / "trainer_state.json"
        if how == "foreign output_dir":
            os.chown(output, _nobody(), -1)
        elif how == "world-writable output_dir":
            output.chmod(0o777)
        elif how == "foreign checkpoint file":
            os.chown(planted, _nobody(), -1)
        else:
            ckpt.chmod(0o777)
        with pytest.raises(LaunchError) as err:
            decide_resume(output, ResumeMode.AUTO, 10)
        assert str(output) in err.value.message
        assert ckpt.is_dir()  # nothing moved aside or loaded

    def test_the_training_entry_refuses_the_checkpoint_it_was_given(self, tmp_path):
        from grpo_launch.train.core import resume_checkpoint
        from grpo_launch.train.environment import JobEnvironment

        output = tmp_path / "output"
        ckpt = _complete_checkpoint(output)
        os.chown(ckpt / "trainer_state.json", _nobody(), -1)
        job = JobEnvironment(0, 0, 0, "h", (), str(ckpt), None)
        with pytest.raises(LaunchError, match="nobody"):
            resume_checkpoint(job, str(output))

    def test_the_real_cli_refuses_a_world_writable_checkpoint_before_anything_starts(self, tmp_path):
        from .helpers import free_port, tiny_overrides

        run = tmp_path / "run"
        _complete_checkpoint(run / "output").chmod(0o777)
        port = f"launch.main_process_port={free_port()}"  # other runs on this machine may hold 29500
        out = _cli("run", TINY_RECIPE, *tiny_overrides(tmp_path), "max_steps=1", port, "--run-dir", str(run))
        assert out.returncode != 0 and "writable by every user" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and "chmod -R go-w" in out.stderr
        assert not list((run / "logs").glob("train-*.log"))  # no trainer started

    def test_resume_refuses_another_users_run_directory_before_reading_its_record(self, tmp_path):
        run = tmp_path / "run"
        run.mkdir()
        (run / "invocation.json").write_text("{}")  # would be read and run again
        os.chown(run, _nobody(), -1)
        out = _cli("resume", str(run))
        assert out.returncode != 0 and "owned by nobody" in out.stderr, out.stderr
        assert "invocation.json" not in out.stderr and "Traceback" not in out.stderr


# ------------------------------------------------------------------------------------------- printed commands
HOSTILE_NAMES = ["a b", "$(touch PWNED)", "it's", 'say "hi"', "`id`", "back\\slash", "semi;colon", "new\nline", "-x"]


class TestHostileRunDirNames:
    """Every command printed for copy-paste splits back into the words it stands for."""

    @pytest.mark.parametrize("name", HOSTILE_NAMES)
    def test_the_verdicts_calibrate_command(self, name):
        line = split_verdict(10.0, 1.0, VllmMode.SERVER, run_dir=name)
        command = line.rsplit("; ", 1)[1].removesuffix(" replans with these times")
        assert shlex.split(command) == ["grpo-launch", "plan", "--calibrate-from", name]

    @pytest.mark.parametrize("name", HOSTILE_NAMES)
    def test_the_busy_run_directorys_status_command(self, tmp_path, name):
        hint = in_use(tmp_path / name, "pid 1").hint or ""
        command = hint.split("(", 1)[1].rsplit("), stop it", 1)[0]
        assert shlex.split(command) == ["grpo-launch", "status", str(tmp_path / name)]

    @pytest.mark.parametrize("name", HOSTILE_NAMES)
    def test_the_trust_refusals_fix_commands(self, tmp_path, name):
        run = tmp_path / name
        run.mkdir()
        run.chmod(0o777)
        with pytest.raises(LaunchError) as err, RunLock(run):
            pass
        command = (err.value.hint or "").split(": ", 1)[1].split(" (or use another", 1)[0]
        assert shlex.split(command) == ["chmod", "go-w", str(run)]

    @pytest.mark.parametrize("name", HOSTILE_NAMES)
    def test_status_prints_a_resume_command_that_pastes_back(self, tmp_path, name):
        run = tmp_path / name
        append(RunPaths(run).attempts, Attempt(1, time.time(), RunState.FAILED, 1, cause="boom"))
        out = _cli("status", str(run), "--json")
        assert out.returncode == 0, out.stderr
        command = json.loads(out.stdout)["resume"]
        assert shlex.split(command)[-2:] == ["--run-dir", str(run)]
        if "\n" not in name:  # the table shows the same command
            text = _cli("status", str(run))
            assert command in text.stdout, text.stdout
        assert not (ROOT / "PWNED").exists()


# ---------------------------------------------------------------------------------------- crafted run dirs
def _gpu_run(tmp_path: Path) -> Path:
    """A run directory with a real GPU plan's plan.json (as tests/test_calibration.py makes it), four step lines,
    a logged reward per step and a failed attempt."""
    from grpo_launch.render import render_files
    from grpo_launch.rundir.files import write_run_files

    from .helpers import plan_recipe

    values = {"model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "num_generations": 8, "max_prompt_length": 512,
              "max_completion_length": 2048, "per_device_train_batch_size": 4,
              "launch": {"vllm": "colocate"}}  # fmt: skip
    plan = plan_recipe(values, "8xH100-80GB")
    run = tmp_path / "run"
    write_run_files(run, render_files(plan))
    s = plan.estimate.step
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, 5):
            g, t = s.generation_s + s.old_logprobs_s + s.sync_s, s.training_s
            f.write(json.dumps({"step": step, "max_steps": 100, "time": 1e9 + step, "step_s": g + t,
                                "generation_s": g, "training_s": t, "num_tokens": 1000 * step}) + "\n")  # fmt: skip
            f.write(json.dumps({"step": step, "log": {"rewards/acc/mean": 0.5, "reward": 0.5}}) + "\n")
    append(RunPaths(run).attempts, Attempt(1, 1e9 + 9, RunState.FAILED, 1, cause="boom"))
    return run


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (old, text[:300])
    path.write_text(text.replace(old, new, 1))


def _step_inf(run):
    _edit(run / "metrics.jsonl", '"step": 2, "max_steps"', '"step": 1e400, "max_steps"')


def _step_text(run):
    _edit(run / "metrics.jsonl", '"step": 3, "max_steps"', '"step": "3", "max_steps"')


def _cut_line(run):  # a line cut in the middle, which still ends with a brace: not one the writer left
    _edit(run / "metrics.jsonl", '"reward": 0.5}}\n{"step": 3', '"reward": }\n{"step": 3')


def _workload_type(run):
    plan = json.loads((run / "plan.json").read_text())
    plan["estimate"]["workload"]["prompt_len"] = "$(id)"
    (run / "plan.json").write_text(json.dumps(plan))


def _workload_missing(run):
    plan = json.loads((run / "plan.json").read_text())
    plan["estimate"]["workload"] = {}
    (run / "plan.json").write_text(json.dumps(plan))


CRAFTED = {  # name: (edit, the file and place the error names, or None: it reads, and prints safely)
    "step 1e400": (_step_inf, "metrics.jsonl, line 3"),
    "step as text": (_step_text, "metrics.jsonl, line 5"),
    "JSON line cut": (_cut_line, "metrics.jsonl, line 4"),
    "workload value of the wrong type": (_workload_type, "plan.json"),
    "workload without its keys": (_workload_missing, "plan.json"),
}
ESCAPES = "\x1b]0;owned\x07\x1b[2J\r"


class TestCraftedRunDirectories:
    """``status``, ``report`` and ``plan --calibrate-from`` on crafted files: an error naming the file (and line), exit
    code 2, no traceback; hostile text read back never reaches the terminal raw."""

    @pytest.mark.parametrize("name", sorted(CRAFTED))
    def test_an_error_names_the_file_never_a_traceback(self, tmp_path, name):
        edit, where = CRAFTED[name]
        run = _gpu_run(tmp_path)
        edit(run)
        verbs = [["status", str(run)], ["report", str(run)],
                 ["plan", str(ROOT / "recipes" / "qwen1.5b.yaml"), "--gpus", "8xH100-80GB", "--no-write",
                  "--calibrate-from", str(run)]]  # fmt: skip
        for verb in verbs if where.startswith("metrics") else verbs[2:]:  # plan.json's estimate: calibration's
            out = _cli(*verb)
            assert out.returncode == 2, (verb[0], out.stdout[-500:], out.stderr[-2000:])
            assert "Traceback" not in out.stderr and where in out.stderr, (verb[0], out.stderr[-2000:])

    def test_escape_sequences_and_newlines_in_names_and_causes_are_shown_escaped(self, tmp_path):
        run = _gpu_run(tmp_path)
        _edit(run / "metrics.jsonl", "rewards/acc/mean", "rewards/$\\\\frac{$ $(id)\\nx\\u001b[31m/mean")
        (RunPaths(run).attempts).unlink()
        append(RunPaths(run).attempts, Attempt(1, 1e9 + 9, RunState.FAILED, 1, cause=f"boom{ESCAPES}red"))
        for verb in (["status", str(run)], ["report", str(run)]):
            out = _cli(*verb)
            assert out.returncode == 0, out.stderr
            for c in "\x1b\x07\r":
                assert c not in out.stdout + out.stderr, (verb[0], out.stdout)
        assert "\\x1b]0;owned\\x07" in _cli("status", str(run)).stdout

    def test_the_console_escapes_a_childs_output(self, tmp_path):
        """The launcher's console (the real one the CLI prints through) shows a log line's escapes as text."""
        import io

        from grpo_launch.cli.console import Console

        stream = io.StringIO()
        Console(stream, live=False)(f"[train] loss {ESCAPES}x")
        assert stream.getvalue() == "[train] loss \\x1b]0;owned\\x07\\x1b[2J\\rx\n"


# ------------------------------------------------------------------------------------------- pgid announce
ANNOUNCE = "[grpo-launch-task] pgid="


class TestPgidAnnouncement:
    """Only the shim's own first line, naming a group > 1, is taken as the remote process group teardown signals."""

    @pytest.mark.parametrize(
        ("lines", "expected"),
        [
            ([f"{ANNOUNCE}4242", "hello"], 4242),  # the shim's real announcement
            ([f"{ANNOUNCE}1", "hello"], None),  # kill -- -1: every process of the user
            ([f"{ANNOUNCE}0"], None),  # kill -- -0: the signaller's own group
            ([f"{ANNOUNCE}-5"], None),
            ([f"{ANNOUNCE}4242 ; rm -rf ~"], None),
            ([f"{ANNOUNCE}99999999999999999999"], None),
            (["motd: welcome", f"{ANNOUNCE}4242"], None),  # not the first line: the command's, not the shim's
            ([f"{ANNOUNCE}4242", f"{ANNOUNCE}1"], 4242),  # a later one changes nothing
        ],
    )
    def test_only_the_first_line_naming_a_group_of_its_own(self, tmp_path, lines, expected):
        from grpo_launch.execute.supervisor import Supervisor

        said: list[str] = []
        signalled: list[tuple[int, int]] = []
        # grace 0.3 s: the stand-in ignores the remote signal (recorded, not sent), so the stop waits out the grace
        sup = Supervisor(tmp_path / "logs", emit=said.append, environ={"PATH": os.environ["PATH"]}, grace_s=0.3,
                         signal_remote=lambda spec, pgid, sig: signalled.append((pgid, sig)))  # fmt: skip
        # then a last line: once it is shown, the pump has read every line before it (it reads them in order)
        script = f"import sys, time\nfor line in {[*lines, 'end-of-lines']!r}: print(line, flush=True)\ntime.sleep(30)"
        child = sup.start(ProcessSpec("vllm@h2", (sys.executable, "-c", script), host="h2", remote_group=True))
        try:
            deadline = time.monotonic() + 60
            while not any("end-of-lines" in s for s in said) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert any("end-of-lines" in s for s in said), said
            assert child.remote_pgid == expected
        finally:
            sup.stop_all(signal.SIGTERM)
        assert all(pgid > 1 for pgid, _ in signalled)
        assert bool(signalled) == (expected is not None)

    def test_a_local_childs_line_is_never_an_announcement(self, tmp_path):
        from grpo_launch.execute.supervisor import Supervisor

        sup = Supervisor(tmp_path / "logs", emit=lambda line: None, environ={"PATH": os.environ["PATH"]}, grace_s=2)
        child = sup.start(ProcessSpec("train", (sys.executable, "-c", f"print('{ANNOUNCE}4242')")))
        child.proc.wait(timeout=20)
        child.pump.join(timeout=5)
        sup.stop_all()
        assert child.remote_pgid is None

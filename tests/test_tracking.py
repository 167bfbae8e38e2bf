"""One tracking run per run, and a run's course attempt by attempt (issue 36, parts 5 and 6).

- Every attempt of a run reports to one W&B run: the id and name are made once (RUN_DIR/tracking.json) and every
  attempt's trainers get them (WANDB_RUN_ID, WANDB_RESUME=allow, the run name); a variable the user set is theirs.
- report_to's integrations are checked in the trainers' Python before anything starts or is queued: a Python
  without wandb (a real venv whose site-packages lack it) makes ``run --dry-run``, ``run`` and ``sbatch`` exit 2
  with the pip install command, before any process, file of the run or submission.
- ``status`` and the report show each attempt once (its steps, own step time, checkpoint, end); a resumed run's
  curve has each step once, the later attempt's record of a repeated step winning.
- The real thing (slow): a CPU GRPO run with report_to wandb, offline, a restart and a resume: one W&B run id, whose
  history (read with wandb's own reader) has every step once, the killed attempt's included.
- A rank ended by a signal keeps its W&B history (issue 50): wandb-core writes the run's file only every 15 s unless
  told otherwise and dies with the rank without writing the rest, so the trainers have it write every 0.1 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from grpo_launch.analysis.report_summary import summary_rows
from grpo_launch.analysis.view import RunView
from grpo_launch.cli import main
from grpo_launch.enums import RunState
from grpo_launch.execute.preflight import missing_imports, planned_reporters
from grpo_launch.render import render_files
from grpo_launch.render.processes import attempt_env
from grpo_launch.rundir.files import set_aside_record, write_run_files
from grpo_launch.rundir.layout import ATTEMPT_ENV, RUN_NAME_ENV, RunPaths
from grpo_launch.rundir.records import Attempt, LogRecord, SaveRecord, StepRecord, append
from grpo_launch.rundir.tracking import TrackingRecord, keep_tracking, read_tracking
from grpo_launch.train.tracking import FLUSH_ENV, FLUSH_S, tracking_defaults

from .helpers import ROOT, TINY_RECIPE, plan_recipe, tiny_overrides


def python_without(root: Path, package: str) -> Path:
    """A real Python environment that is this one less ``package``: a venv whose site-packages name every entry of
    this environment's but the package's (its module and its dist-info), as links."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    shadow = root / "site"
    shadow.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.split("-")[0].split(".")[0] != package:
            (shadow / entry.name).symlink_to(entry)
    python = root / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    Path(site, "_this_env.pth").write_text(f"import site; site.addsitedir({str(shadow)!r})\n")
    return python


# ------------------------------------------------------------------------------------------- one tracking run


def test_the_tracking_record_is_made_once_and_set_aside_with_the_run(tmp_path):
    paths = RunPaths(tmp_path / "my-run")
    first = keep_tracking(paths)
    assert len(first.run_id) == 8 and first.run_id.isalnum() and first.run_id.islower()
    assert first.name == "my-run" and keep_tracking(paths) == first == read_tracking(paths)
    append(paths.metrics, StepRecord(1, 1.0))
    aside = set_aside_record(paths.root)  # --resume never: a fresh run, so a new W&B run
    assert aside is not None and (aside / "tracking.json").is_file() and read_tracking(paths) is None
    assert keep_tracking(paths).run_id != first.run_id


def test_every_attempt_gets_the_runs_id_and_name_unless_the_user_set_them():
    tracking = TrackingRecord("abc12345", "my-run")
    env = attempt_env(3, tracking, {})
    assert env == {ATTEMPT_ENV: "3", RUN_NAME_ENV: "my-run", "WANDB_RUN_ID": "abc12345", "WANDB_RESUME": "allow"}
    mine = attempt_env(3, tracking, {"WANDB_RUN_ID": "mine", "WANDB_RESUME": "never", ATTEMPT_ENV: "9"})
    assert "WANDB_RUN_ID" not in mine and "WANDB_RESUME" not in mine and mine[ATTEMPT_ENV] == "3"


# --------------------------------------------------------------------------------- report_to checked before


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, []), ("none", []), (["none"], []), ("all", []), (["all"], []), ("wandb", ["wandb"]),
     (["wandb", "tensorboard"], ["wandb", "tensorboard"]), (["kubeflow"], [])],
)  # fmt: skip
def test_report_to_reads_as_transformers_reads_it(value, expected):
    values = {} if value is None else {"report_to": value}  # unset: TRL's default, transformers' "none"
    assert planned_reporters(values) == expected


@pytest.fixture(scope="module")
def no_wandb(tmp_path_factory) -> Path:
    return python_without(tmp_path_factory.mktemp("no-wandb"), "wandb")


def test_a_missing_integration_is_named_with_its_install_command(no_wandb, tmp_path):
    import dataclasses

    plan = plan_recipe(TINY_RECIPE, "cpu", "report_to=[wandb]", model=None)
    assert missing_imports(dataclasses.replace(plan, python=sys.executable), str(tmp_path)) == []  # installed
    (problem,) = missing_imports(dataclasses.replace(plan, python=str(no_wandb)), str(tmp_path))
    assert f"{no_wandb} -m pip install wandb" in problem and "take wandb out of report_to" in problem


def test_one_probe_finds_the_reward_module_in_the_workdir_and_not_a_leftover_wandb_folder(no_wandb, tmp_path,
                                                                                          monkeypatch):  # fmt: skip
    """Rewards and report_to are checked by one run of the trainers' Python: the reward module is searched in the
    working directory, report_to's integrations are not (a folder there named like the package is not W&B)."""
    import dataclasses

    (tmp_path / "myrewards.py").write_text("def reward(completions, **kw):\n    return [0.0] * len(completions)\n")
    (tmp_path / "wandb").mkdir()  # a folder named like the package, here even a regular one
    (tmp_path / "wandb" / "__init__.py").write_text("")
    plan = plan_recipe(TINY_RECIPE, "cpu", "report_to=[wandb]", "reward_funcs=[myrewards:reward]", model=None)
    runs = []
    real = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: runs.append(a[0]) or real(*a, **k))
    (problem,) = missing_imports(dataclasses.replace(plan, python=str(no_wandb)), str(tmp_path))
    assert problem.startswith("report_to: wandb is not importable") and len(runs) == 1
    problems = missing_imports(dataclasses.replace(plan, python=str(no_wandb)), str(tmp_path / "wandb"))
    assert len(problems) == 2 and "module 'myrewards' is not importable" in problems[0]  # from another directory


def _cli(python: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([str(python), "-m", "grpo_launch", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)  # fmt: skip


@pytest.mark.parametrize("verb", ["run --dry-run", "run", "sbatch --dry-run", "sbatch"])
def test_report_to_wandb_without_wandb_stops_before_anything_starts_or_is_queued(no_wandb, tmp_path, verb):
    """The trainers' Python is the launcher's (plan.python): started with a Python that lacks wandb, every verb
    exits 2 naming ``pip install wandb``, before a process starts, a run file is written or sbatch is called."""
    run = tmp_path / "run"
    head = ["sbatch", TINY_RECIPE, "--nodes", "1"] if verb.startswith("sbatch") else [TINY_RECIPE]
    flags = ["--dry-run"] if verb.endswith("--dry-run") else []
    done = _cli(no_wandb, *head, *tiny_overrides(tmp_path), "report_to=[wandb]", "--run-dir", str(run), *flags)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "report_to: wandb is not importable" in done.stderr and "-m pip install wandb" in done.stderr
    assert not run.exists(), "nothing written: no run file, no job.sbatch"


# -------------------------------------------------------------------------------------- status, per attempt


def _two_attempts(tmp_path: Path) -> Path:
    """Attempt 1 trains steps 1-4, saves at 2 and is interrupted in step 5; attempt 2 resumes from checkpoint-2,
    trains 3-6 (slower: 3 s a step against 1 s) and succeeds. Each attempt's first step is slow (it warms up)."""
    run = tmp_path / "run"
    write_run_files(run, render_files(plan_recipe(TINY_RECIPE, "cpu", "max_steps=6", model=None)))
    paths = RunPaths(run)
    t = 1e9
    for attempt, steps, step_s in ((1, range(1, 5), 1.0), (2, range(3, 7), 3.0)):
        for step in steps:
            took = 10.0 if step == steps[0] else step_s
            t += took
            append(paths.metrics, StepRecord(step, took, took / 2, took / 2, max_steps=6, time=t, attempt=attempt))
            append(paths.metrics, LogRecord(step, {"reward": attempt * 10 + step}, attempt))
            if step == 2 or (attempt == 2 and step == 6):
                append(paths.metrics, SaveRecord(step, 0.5, attempt))
        end = (RunState.INTERRUPTED, 130, "interrupted by SIGINT") if attempt == 1 else (RunState.SUCCEEDED, 0, None)
        append(paths.attempts, Attempt(attempt, t + 1, end[0], end[1], cause=end[2]))
        t += 100  # the time between attempts is not the run's
    return run


def test_a_resumed_runs_curve_has_each_step_once_the_later_attempts_record_winning(tmp_path):
    view = RunView.load(_two_attempts(tmp_path))
    assert [(s.step, s.attempt) for s in view.steps()] == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2), (6, 2)]
    rewards = [(r.step, r.log["reward"]) for r in view.curve() if isinstance(r, LogRecord)]
    assert rewards == [(1, 11), (2, 12), (3, 23), (4, 24), (5, 25), (6, 26)]
    from grpo_launch.analysis.report import series_of

    assert series_of(view.curve())["reward"]["reward"].steps == [1, 2, 3, 4, 5, 6]


def test_a_reward_function_named_reward_is_its_own_line():
    from grpo_launch.analysis.report import series_of

    lines = series_of([LogRecord(1, {"reward": 0.5, "rewards/reward/mean": 0.5, "rewards/digits/mean": 0.2})])["reward"]
    assert {k: s.steps for k, s in lines.items()} == {"reward": [1], "reward (function)": [1], "digits": [1]}


def test_each_attempt_is_shown_once_with_its_steps_own_step_time_and_end(tmp_path):
    view = RunView.load(_two_attempts(tmp_path))
    first, second = view.courses()
    assert (first.number, first.first_step, first.last_step, first.steps, first.saved_step) == (1, 1, 4, 4, 2)
    assert (second.number, second.first_step, second.last_step, second.steps, second.saved_step) == (2, 3, 6, 4, 6)
    assert (first.step_s, second.step_s) == (1.0, 3.0)  # each attempt's own mean, its warm-up step left out
    assert first.ended == "interrupted, exit code 130: interrupted by SIGINT"
    assert view.next_attempt == 3
    rows, _ = summary_rows(view, {"reward": [11.0, 26.0]})
    said = dict(rows)
    assert said["state"] == "succeeded; after 1 earlier attempt(s): interrupted"
    assert said["attempt 1"] == ("steps 1–4 (4 steps), 1 s per step (generation 0.5 s, training 0.5 s); checkpoint "
                                 "at step 2; interrupted, exit code 130: interrupted by SIGINT")  # fmt: skip
    assert said["attempt 2"].startswith("steps 3–6 (4 steps), 3 s per step") and "succeeded" in said["attempt 2"]
    # The wall time of the steps: each attempt's span (13 s and 19 s), not the pause between them.
    assert said["wall time (steps)"].startswith("32 s")


def test_status_json_lists_each_attempt_and_the_step_time_counts_each_step_once(tmp_path, capsys):
    run = _two_attempts(tmp_path)
    assert main(["status", str(run), "--json"], environ={}) == 0
    data = json.loads(capsys.readouterr().out)
    got = [(a["attempt"], a["first_step"], a["last_step"], a["step_s"], a["saved_step"], a["state"], a["exit_code"])
           for a in data["attempts"]]  # fmt: skip
    assert got == [(1, 1, 4, 1.0, 2, "interrupted", 130), (2, 3, 6, 3.0, 6, "succeeded", 0)]
    # The run's mean: steps 1-6 once each (attempt 1's 3 and 4 superseded), each attempt's first step left out.
    assert data["step"] == 6 and data["step_s"] == pytest.approx((1.0 + 3.0 * 3) / 4)
    assert main(["status", str(run)], environ={}) == 0
    out = capsys.readouterr().out
    assert "2 attempt(s)" in out and "interrupted, exit code 130" in out


def test_status_shows_the_last_attempts_one_by_one_and_counts_the_earlier(tmp_path, capsys):
    """A run requeued a dozen times: status names the last 8 attempts and counts the others by their end."""
    paths = RunPaths(tmp_path / "run")
    for n in range(1, 13):
        append(paths.metrics, StepRecord(n, 1.0, max_steps=20, time=1e9 + n, attempt=n))
        append(paths.metrics, SaveRecord(n, 0.1, n))
        append(paths.attempts, Attempt(n, 1e9 + n, RunState.STOPPED_FOR_CHECKPOINT, 0))
    assert main(["status", str(paths.root)], environ={}) == 0
    out = capsys.readouterr().out
    assert "attempts 1–4" in out and "4 stopped-for-checkpoint" in out
    assert "attempt 5 " in out and "attempt 12 " in out and "attempt 4 " not in out
    assert main(["status", str(paths.root), "--json"], environ={}) == 0
    assert [a["attempt"] for a in json.loads(capsys.readouterr().out)["attempts"]] == list(range(1, 13))


def test_records_of_an_older_version_are_split_into_attempts_where_the_steps_go_back(tmp_path):
    """No attempt numbers (written before they were): a step that does not move past the last starts an attempt;
    attempts.jsonl numbered each invocation's attempts from 1, and is matched in order."""
    run = tmp_path / "run"
    paths = RunPaths(run)
    for step in (1, 2, 3, 2, 3, 4):
        append(paths.metrics, StepRecord(step, 1.0, max_steps=4, time=1e9 + step))
    for n, state in ((1, RunState.FAILED), (1, RunState.SUCCEEDED)):
        append(paths.attempts, Attempt(n, 1e9, state, 0 if state == RunState.SUCCEEDED else 1))
    view = RunView.load(run)
    assert [s.step for s in view.steps()] == [1, 2, 3, 4]
    assert [s.step for s in view.steps(warm=True)] == [3, 4]  # each attempt's first (1, then 2 again) left out
    assert [(c.number, c.first_step, c.last_step, c.end.state if c.end else None) for c in view.courses()] == [
        (1, 1, 3, RunState.FAILED), (2, 2, 4, RunState.SUCCEEDED)]  # fmt: skip
    assert view.next_attempt == 3


# --------------------------------------------------------------------------- the real thing: W&B, offline


def _wandb_records(run_dir: Path) -> dict[str, list[dict]]:
    """The records of one offline W&B run directory by type ("run", "history", "metric", "exit", …), each as its
    message, read with wandb's own reader of the .wandb transaction log (``wandb leet inspect --json``)."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
                         capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    records: dict[str, list[dict]] = {}
    for line in out.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            kind = record.get("type", "")
            records.setdefault(kind, []).append(record.get(kind, {}))
    return records


def _wandb_history(run_dir: Path) -> tuple[dict, list[dict]]:
    """(the run record: id, name, resume, …; its history rows) of one offline W&B run directory."""
    records = _wandb_records(run_dir)
    size = sum(f.stat().st_size for f in run_dir.glob("*.wandb"))
    assert records.get("run"), f"{run_dir.name}: no run record, its .wandb file holds {size} bytes"
    return records["run"][0], [r["item"] for r in records.get("history", [])]


SIGTERMED = """
import os, signal, sys, time
import wandb

wandb.init(project="p", id=sys.argv[1], resume="allow")
for step in (1, 2, 3):
    wandb.log({"train/global_step": step, "train/reward": step / 10})
time.sleep(1.0)  # ten times the trainers' flush interval
os.kill(os.getpid(), signal.SIGTERM)  # as torchrun and the teardown end a rank: no exit handler, no wandb.finish
"""


def test_the_trainers_have_wandb_write_its_file_often_unless_told_otherwise():
    environ: dict[str, str] = {}
    tracking_defaults(environ)
    assert environ == {FLUSH_ENV: f"{FLUSH_S:g}"} and FLUSH_S <= 0.25
    mine = {FLUSH_ENV: "30"}
    tracking_defaults(mine)
    assert mine == {FLUSH_ENV: "30"}


@pytest.mark.slow
def test_a_rank_ended_by_sigterm_keeps_its_wandb_history(tmp_path):
    """W&B's service process (wandb-core) holds an offline run's records in memory and dies with the rank that
    started it, without writing them; a rank ended by SIGTERM runs no wandb.finish. With W&B's own flush interval
    (15 s) the file of such a rank holds its 7-byte header alone (issue 50); with the trainers' it holds every row
    logged before the last tenth of a second."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    env.pop(FLUSH_ENV, None)
    tracking_defaults(env)  # as the training entry does (prepare_process)
    done = subprocess.run([sys.executable, "-c", SIGTERMED, "abc12345"], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*-abc12345")
    record, rows = _wandb_history(run_dir)
    assert record["run_id"] == "abc12345" and [r["train/global_step"] for r in rows] == [1, 2, 3]


@pytest.mark.slow
def test_a_restart_and_a_resume_keep_one_wandb_run_with_every_step_once(tmp_path):
    """report_to wandb, WANDB_MODE=offline: rank 0, the one holding the W&B run, is killed outright in step 3 (a
    restart from checkpoint-2), SIGUSR2 stops the run with a checkpoint later on, and the same command resumes it to
    the end. Three attempts, three offline run directories (W&B writes one per process start), one run id: the one in
    RUN_DIR/tracking.json, each directory marked as resuming it. Each attempt's training rows are there, the killed
    one's too (with W&B's own 15 s flush its file held its header alone, issue 50), and in order they have each
    step once by train/global_step, the axis transformers gives every metric; W&B's own _step starts at 0 in each
    directory. status lists the three attempts with their ends."""
    from .test_healing import argv, fault_env, wait_for_line

    run = tmp_path / "run"
    env = {**os.environ, **fault_env(tmp_path, "kill", at=3, rank=0), "WANDB_MODE": "offline",
           "WANDB_DIR": str(tmp_path / "wandb-dir"), "WANDB_SILENT": "true"}  # fmt: skip
    env.pop("WANDB_RUN_ID", None)
    command = argv(run, "max_steps=10", "save_steps=1", "reward_funcs=[faultmod:reward]", "report_to=[wandb]",
                   "launch.max_restarts=1", "launch.restart_backoff_s=0")  # fmt: skip
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    try:
        seen = wait_for_line(first, "resuming from", timeout=300)
        seen += wait_for_line(first, "step 5/10 done", timeout=300)
        first.send_signal(signal.SIGUSR2)  # checkpoint at the end of the step, and stop
        out, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, "".join(seen)[-3000:] + out[-3000:]
    stopped = int((run / "control" / "stopped-at-step").read_text())
    assert 5 <= stopped < 10
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]

    tracking = read_tracking(RunPaths(run))
    assert tracking is not None
    said = f"[grpo-launch] tracking: wandb, one run over every attempt: W&B id {tracking.run_id}, name run"
    assert said in "".join(seen) and said in again.stdout
    dirs = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
    assert len(dirs) == 3, dirs  # one per attempt, named by their start
    steps: list[list[int]] = []
    for d in dirs:
        record, rows = _wandb_history(d)
        assert record["run_id"] == tracking.run_id  # one W&B run
        assert record["resume"] is True and record["display_name"] == tracking.name == "run"  # the run dir's name
        axis = [m for m in _wandb_records(d).get("metric", []) if m.get("glob_name") == "*"]
        assert [m.get("step_metric") for m in axis] == ["train/global_step"], axis  # transformers' WandbCallback
        assert rows and rows[0]["_step"] == 0  # W&B's own row counter: not carried over offline
        steps.append([int(r["train/global_step"]) for r in rows if "train/reward" in r])
    assert steps == [[1, 2], list(range(3, stopped + 1)), list(range(stopped + 1, 11))], steps

    view = RunView.load(run)
    assert [s.step for s in view.steps()] == list(range(1, 11))
    from grpo_launch.analysis.report import embedded_series

    plotted = embedded_series((run / "report" / "report.html").read_text())  # the run writes it at its end
    assert plotted["reward"]["reward"]["steps"] == list(range(1, 11))
    ends = [(c.number, c.end.state if c.end else None, c.saved_step) for c in view.courses()]
    assert ends == [(1, RunState.FAILED, 2), (2, RunState.STOPPED_FOR_CHECKPOINT, stopped), (3, RunState.SUCCEEDED, 10)]
    status = subprocess.run([sys.executable, "-m", "grpo_launch", "status", str(run), "--json"], capture_output=True,
                            text=True, cwd=ROOT, env=env)  # fmt: skip
    attempts = json.loads(status.stdout)["attempts"]
    assert [(a["attempt"], a["first_step"], a["last_step"]) for a in attempts] == [
        (1, 1, 2), (2, 3, stopped), (3, stopped + 1, 10)]  # fmt: skip

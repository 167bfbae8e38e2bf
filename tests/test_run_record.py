"""A run directory that holds a run's record (metrics.jsonl, control/attempts.jsonl) keeps it: `plan`,
`plan --calibrate-from` and `run --dry-run` of the same recipe write their files to RUN_DIR/plans/TIME/ and say so;
`sbatch` writes only job.sbatch (the job resumes that run). `status` and `report` without an argument pick the newest
directory that holds a run, not the newest plan.

The run's plan.json is the real one `grpo-launch plan` writes for GPUs; its metrics and attempts lines are written by
the test (no GPU run can happen here; tests/test_run.py reads a real CPU run's records)."""

from __future__ import annotations

import json
import os

import pytest

from grpo_launch.cli import main

VALUES = {
    "model_name_or_path": "Qwen/Qwen2.5-7B-Instruct",
    "dataset_name": "AI-MO/NuminaMath-TIR",
    "num_generations": 8,
    "max_prompt_length": 512,
    "max_completion_length": 2048,
    "per_device_train_batch_size": 4,
    "max_steps": 100,
    "launch": {"vllm": "colocate"},
}
GPUS = ["--gpus", "8xH100-80GB"]
RECORD = ("plan.json", "metrics.jsonl", "control/attempts.jsonl")


@pytest.fixture
def finished(tmp_path, monkeypatch):
    """A finished run of r.yaml in grpo_runs/r (the default run directory), its record's bytes by file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(json.dumps(VALUES))
    assert main(["plan", "r.yaml", *GPUS], environ={}) == 0
    run = tmp_path / "grpo_runs" / "r"
    plan = json.loads((run / "plan.json").read_text())
    step = plan["estimate"]["time_s"]["step"] * 3  # the run was 3x slower than planned
    with open(run / "metrics.jsonl", "w") as f:
        for i in range(1, 5):
            line = {"step": i, "max_steps": 4, "time": 1e9 + i * step, "step_s": step, "generation_s": step * 0.7,
                    "training_s": step * 0.3, "peak_memory_bytes": [2**34]}  # fmt: skip
            f.write(json.dumps(line) + "\n")
    (run / "control").mkdir(exist_ok=True)
    (run / "control" / "attempts.jsonl").write_text(
        json.dumps({"attempt": 1, "ended": 1e9 + 5 * step, "state": "succeeded", "exit_code": 0}) + "\n"
    )
    return run, {name: (run / name).read_bytes() for name in RECORD}


def _unchanged(run, record):
    assert {name: (run / name).read_bytes() for name in RECORD} == record


def _plans(run):
    return sorted(p for p in (run / "plans").iterdir()) if (run / "plans").is_dir() else []


def test_plan_of_the_same_recipe_keeps_the_runs_record(finished, capsys):
    run, record = finished
    assert main(["plan", "r.yaml", *GPUS], environ={}) == 0
    out = capsys.readouterr().out
    _unchanged(run, record)
    (written,) = _plans(run)
    assert (written / "plan.json").is_file() and (written / "accelerate_config.yaml").is_file()
    assert "holds a run's record" in out and str(written) in out.replace("\n", "")
    assert main(["plan", "r.yaml", *GPUS, "--json"], environ={}) == 0
    data = json.loads(capsys.readouterr().out)
    assert "holds a run's record" in data["written_to"]["why"]
    assert len(_plans(run)) == 2  # a second plan never overwrites the first either
    _unchanged(run, record)


def test_dry_run_keeps_the_runs_record(finished, capsys):
    run, record = finished
    assert main(["run", "r.yaml", *GPUS, "--dry-run"], environ={}) == 0
    out = capsys.readouterr().out
    _unchanged(run, record)
    (written,) = _plans(run)
    assert f"# {run} holds a run's record" in out and str(written) in out


def test_calibrating_from_the_default_run_dir_is_the_same_every_time(finished, capsys):
    """The README's `plan RECIPE --calibrate-from grpo_runs/NAME` used to rewrite that run's plan.json, so each call
    compared against the previous calibration (13.13 -> 0.15 -> 2.26 s)."""
    run, record = finished
    steps = []
    for _ in range(3):
        assert main(["plan", "r.yaml", *GPUS, "--calibrate-from", str(run), "--json"], environ={}) == 0
        steps.append(json.loads(capsys.readouterr().out)["estimate"]["time_s"]["step"])
        _unchanged(run, record)
    assert steps[0] == pytest.approx(steps[1]) == pytest.approx(steps[2])
    planned = json.loads(record["plan.json"])["estimate"]["time_s"]["step"]
    assert steps[0] > 2 * planned  # the 3x slower run is carried into the new plan


def test_sbatch_dry_run_writes_nothing(finished, capsys):
    run, record = finished
    assert main(["sbatch", "r.yaml", "--nodes", "1", "--gpus-per-node", "8", "--gpu-type", "H100-80GB",
                 "--dry-run"], environ={}) == 0  # fmt: skip
    _unchanged(run, record)
    assert not _plans(run) and not (run / "job.sbatch").exists()


def test_status_and_report_without_an_argument_pick_the_newest_run_not_the_newest_plan(finished, capsys):
    run, _ = finished
    os.utime(run / "plan.json", (1e9, 1e9))
    os.utime(run / "metrics.jsonl", (1e9, 1e9))
    assert main(["plan", "r.yaml", *GPUS, "--run-dir", "grpo_runs/later"], environ={}) == 0
    capsys.readouterr()
    assert main(["status", "--json"], environ={}) == 0
    assert json.loads(capsys.readouterr().out)["run_dir"].endswith(os.path.join("grpo_runs", "r"))


def _status(capsys, run) -> tuple[dict, str]:
    assert main(["status", str(run), "--json"], environ={}) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(["status", str(run)], environ={}) == 0
    return data, capsys.readouterr().out


def test_status_of_an_interrupted_run_is_its_recorded_end_not_stepping(finished, capsys):
    """Ctrl-C: the last step was a moment ago, no launcher holds the run and attempts.jsonl says interrupted."""
    import time

    run, _ = finished
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    with open(run / "metrics.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps(line | {"max_steps": 100, "time": time.time() - 5 + line["step"]}) + "\n")
    (run / "control" / "attempts.jsonl").write_text(
        json.dumps({"attempt": 1, "ended": time.time(), "state": "interrupted", "exit_code": 130}) + "\n"
    )
    data, text = _status(capsys, run)
    assert (data["state"], data["eta_s"], data["launcher"]) == ("interrupted", None, None)
    assert "interrupted: exit code 130" in text and "stepping" not in text and "ETA" not in text
    assert "resume" in text and "not running" in text


def test_status_of_a_run_whose_launcher_vanished_does_not_say_stepping(finished, capsys):
    import time

    run, _ = finished
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps(x | {"max_steps": 100, "time": time.time()}) + "\n" for x in lines)
    )
    (run / "control" / "attempts.jsonl").unlink()
    data, text = _status(capsys, run)
    assert data["state"] == "ended" and "launcher was killed" in data["detail"] and "ETA" not in text


def test_status_before_the_first_step_says_starting(tmp_path, capsys):
    """The window between the launch and the first optimizer step (minutes on GPUs) is a state, not an error."""
    from grpo_launch.errors import ConfigError
    from grpo_launch.rundir.files import RunLock

    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"metrics\.jsonl"):
        _status_or_raise(run)
    with RunLock(run):
        data, text = _status(capsys, run)
    assert data["state"] == "starting" and data["launcher"] and "no optimizer step yet" in text
    (run / "control").mkdir(exist_ok=True)
    failed = {
        "attempt": 1,
        "ended": 1e9,
        "state": "failed",
        "exit_code": 1,
        "failure": "user",
        "cause": "ValueError: x",
    }
    (run / "control" / "attempts.jsonl").write_text(json.dumps(failed) + "\n")
    data, text = _status(capsys, run)
    assert data["state"] == "failed" and "ValueError" in text


def _status_or_raise(run):
    import argparse

    from grpo_launch.cli import status
    from grpo_launch.spec import RunContext

    status.command(argparse.Namespace(run_dir=str(run), json=True), RunContext.current({}, print))


@pytest.mark.slow
def test_a_fresh_run_over_a_finished_one_keeps_its_record(tmp_path):
    """`run --resume never` in a finished run's directory (the tiny CPU recipe, for real): the earlier plan.json,
    metrics and attempts move to RUN_DIR/superseded-TIME/ unchanged, and the new run's records start empty."""
    import subprocess
    import sys

    from .helpers import ROOT, TINY_RECIPE, tiny_overrides

    run = tmp_path / "run"
    argv = [sys.executable, "-m", "grpo_launch", TINY_RECIPE, *tiny_overrides(tmp_path), "max_steps=2", "--run-dir",
            str(run)]  # fmt: skip
    first = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    record = {name: (run / name).read_bytes() for name in RECORD}
    again = subprocess.run([*argv, "--resume", "never"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    (aside,) = run.glob("superseded-*")
    assert {name: (aside / name).read_bytes() for name in RECORD} == record
    assert f"kept in {aside}" in again.stdout
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"step_s"' in x]
    assert steps == [1, 2] and len((run / "control" / "attempts.jsonl").read_text().splitlines()) == 1


def _reads(monkeypatch) -> dict[str, int]:
    """Counts every read of a run file by its name, whichever way it is opened."""
    import builtins
    import pathlib

    counts: dict[str, int] = {}
    real_read, real_open, real_path_open = pathlib.Path.read_text, builtins.open, pathlib.Path.open
    inside = []  # Path.read_text opens through Path.open: one read

    def count(name: object) -> None:
        base = os.path.basename(str(name))
        counts[base] = counts.get(base, 0) + 1

    def read_text(self, *a, **k):
        count(self)
        inside.append(1)
        try:
            return real_read(self, *a, **k)
        finally:
            inside.pop()

    def path_open(self, mode="r", *a, **k):
        if "r" in mode and not inside:
            count(self)
        return real_path_open(self, mode, *a, **k)

    def open_(file, mode="r", *a, **k):
        if "r" in mode and not isinstance(file, int):
            count(file)
        return real_open(file, mode, *a, **k)

    real_os_open = os.open

    def os_open(path, flags, *a, **k):  # rundir.trusted_files.read_text opens run files as the lock is read
        if flags & os.O_ACCMODE == os.O_RDONLY and not inside:
            count(path)
        return real_os_open(path, flags, *a, **k)

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    monkeypatch.setattr(pathlib.Path, "open", path_open)
    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "open", os_open)
    return counts


@pytest.mark.parametrize("verb", [["status"], ["status", "--json"], ["report"]])
def test_status_and_report_read_each_run_file_once(finished, capsys, monkeypatch, verb):
    """status and report take one RunView: plan.json, metrics.jsonl and attempts.jsonl are each read once (status
    used to read plan.json up to 3 times and metrics.jsonl twice, the report metrics.jsonl 4 times)."""
    if verb[0] == "report":
        pytest.importorskip("matplotlib")
    run, _ = finished
    counts = _reads(monkeypatch)
    assert main([verb[0], str(run), *verb[1:]], environ={}) == 0
    capsys.readouterr()
    assert (counts.get("plan.json"), counts.get("metrics.jsonl"), counts.get("attempts.jsonl")) == (1, 1, 1), counts

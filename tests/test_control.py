"""The run's control directory (grpo_launch.rundir.control): stop requests and the trainers' answer."""

from __future__ import annotations

import pytest

from grpo_launch.rundir import control, layout
from grpo_launch.rundir.layout import RunPaths


def test_control_dir(tmp_path):
    assert RunPaths(tmp_path).control == tmp_path / "control"
    assert RunPaths(str(tmp_path)).control == tmp_path / "control"


def test_request_stop_creates_the_directory_and_request(tmp_path):
    run = tmp_path / "run"  # does not exist yet
    control.request_stop(run)
    request = run / "control" / RunPaths(".").stop_request.name
    assert request.read_text() == "checkpoint and stop\n"
    control.request_stop(run)  # again: still one request
    assert sorted(p.name for p in (run / "control").iterdir()) == [RunPaths(".").stop_request.name]


def test_reset_clears_request_and_answer(tmp_path):
    control.request_stop(tmp_path)
    (tmp_path / "control" / RunPaths(".").stopped_marker.name).write_text("7\n")
    other = tmp_path / "control" / "keep-me"
    other.write_text("x")
    control.reset(tmp_path)
    assert sorted(p.name for p in (tmp_path / "control").iterdir()) == ["keep-me"]
    assert control.stopped_at(tmp_path) is None


def test_reset_on_a_fresh_run_dir(tmp_path):
    run = tmp_path / "fresh"
    control.reset(run)
    assert (run / "control").is_dir()
    assert list((run / "control").iterdir()) == []
    control.reset(run)  # idempotent


def test_stopped_at_missing(tmp_path):
    assert control.stopped_at(tmp_path) is None  # no control dir at all
    control.reset(tmp_path)
    assert control.stopped_at(tmp_path) is None  # dir, no marker


@pytest.mark.parametrize("text", ["", "\n", "step 7", "7.5", "seven\n"])
def test_stopped_at_garbage(tmp_path, text):
    control.reset(tmp_path)
    (tmp_path / "control" / RunPaths(".").stopped_marker.name).write_text(text)
    assert control.stopped_at(tmp_path) is None


def test_stopped_at_marker_is_a_directory(tmp_path):
    (tmp_path / "control" / RunPaths(".").stopped_marker.name).mkdir(parents=True)
    assert control.stopped_at(tmp_path) is None


@pytest.mark.parametrize(("text", "step"), [("12\n", 12), ("0", 0), ("  40  \n", 40)])
def test_stopped_at_valid(tmp_path, text, step):
    control.reset(tmp_path)
    (tmp_path / "control" / RunPaths(".").stopped_marker.name).write_text(text)
    assert control.stopped_at(str(tmp_path)) == step


def test_trainer_side_names_match():
    # The trainer finds the directory through this environment variable and these file names.
    assert layout.RUN_DIR_ENV == "GRPO_LAUNCH_RUN_DIR"
    assert (RunPaths(".").stop_request.name, RunPaths(".").stopped_marker.name) == ("stop-requested", "stopped-at-step")

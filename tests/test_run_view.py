"""Run files read once, as typed records (analysis/view.py, rundir/plan_record.py, rundir/records.py).

- Every key :class:`PlanRecord` reads is in what ``plan_to_dict`` writes, for real plans of every kind (CPU, server,
  colocate, async, two nodes, a calibrated one); a key renamed on the writing side makes ``status`` and ``report``
  fail with an error naming plan.json and the key, never show a default.
- Malformed run files (a corrupt metrics line, a plan.json that is not an object, ``"step": 1e400``) are an error
  naming the file and the line, in ``status`` and ``report``, never a traceback.
- The job state a backend reports is typed (no Slurm keys reach ``status``); the completion marker and a host's
  check answer are records too.
"""

from __future__ import annotations

import json

import pytest

from grpo_launch.analysis.view import RunView
from grpo_launch.cli import main
from grpo_launch.enums import JobStatus
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.render import plan_json, render_files
from grpo_launch.render.plan_json import plan_to_dict
from grpo_launch.rundir.files import write_run_files
from grpo_launch.rundir.json_fields import Fields, RunFileError
from grpo_launch.rundir.plan_record import PlanRecord
from grpo_launch.rundir.records import CompletionRecord, HostCheck, JobState, StepRecord, append

from .helpers import ROOT, plan_recipe

RECIPES = ROOT / "recipes"
PLANS = {
    "cpu": (RECIPES / "tiny-cpu.yaml", "cpu", ()),
    "server": (RECIPES / "qwen1.5b.yaml", "8xH100-80GB", ("launch.vllm=server",)),
    "colocate": (RECIPES / "qwen1.5b.yaml", "8xH100-80GB", ("launch.vllm=colocate",)),
    "async": (RECIPES / "qwen1.5b.yaml", "8xH100-80GB", ("launch.mode=async",)),
    "two nodes, priced": (RECIPES / "qwen7b-math.yaml", "2x8xH100-80GB", ("launch.gpu_hour_price=2.5",)),
    "moe": (RECIPES / "qwen3-30b-a3b.yaml", "8xH100-80GB", ()),
}


def _written(name: str, calibration: Calibration | None = None) -> dict:
    plan = _plan(name, calibration)
    return json.loads(json.dumps(plan_to_dict(plan), indent=2, default=str))  # as render writes plan.json


def _plan(name: str, calibration: Calibration | None = None):
    recipe, gpus, overrides = PLANS[name]
    if gpus == "cpu":  # the tiny recipe's model is a local path: no shape from the table
        return plan_recipe(recipe, gpus, *overrides, model=None, calibration=calibration)
    return plan_recipe(recipe, gpus, *overrides, calibration=calibration)


def _has(data: object, path: list[str]) -> bool:
    """Whether ``data`` holds the key path (``topology.hosts[0].gpus``, list items by index)."""
    for part in path:
        key, _, index = part.partition("[")
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
        if index:
            data = data[int(index.rstrip("]"))]
    return True


@pytest.mark.parametrize("name", list(PLANS))
def test_every_key_the_plan_record_reads_is_written_by_plan_to_dict(name, monkeypatch):
    read: list[str] = []
    real = Fields._value

    def spy(self, key, kind, null):
        read.append(f"{self.at}.{key}" if self.at else key)
        return real(self, key, kind, null)

    monkeypatch.setattr(Fields, "_value", spy)
    data = _written(name)
    record = PlanRecord.from_json(data)
    assert len(read) >= 25, read  # the record reads the plan's fields, not a handful
    missing = [p for p in read if not _has(data, p.split("."))]
    assert missing == []
    assert record.gpus == sum(len(h["gpus"]) for h in data["topology"]["hosts"])
    assert record.vllm_mode == data["vllm"]["mode"]
    assert record.layout["num_generations"] == data["layout"]["num_generations"]
    if name == "cpu":
        assert record.prediction is None and record.train["device"] == "cpu"
    else:
        assert record.prediction is not None
        assert record.prediction.step_s == pytest.approx(data["estimate"]["time_s"]["step"])
        assert record.startup_s == data["estimate"]["startup_s"]
    assert (record.queue_maxsize is not None) == (name == "async")
    if name == "two nodes, priced":
        assert record.price_per_gpu_hour == pytest.approx(2.5)
    assert record.output_dir == data["trainer_values"].get("output_dir")
    assert PlanRecord.from_json(json.loads(json.dumps(record.to_json()))) == record  # its own shape reads back


def test_a_calibrated_plans_calibration_reads_back():
    scale = Calibration(1.5, 2.0, 1.2, 700.0, "grpo_runs/x (4 steps)")
    record = PlanRecord.from_json(_written("colocate", scale))
    assert record.calibration is not None
    got = record.calibration
    assert (got.generation, got.training, got.memory, got.mean_completion_len, got.source) == (
        1.5, 2.0, 1.2, 700.0, "grpo_runs/x (4 steps)")  # fmt: skip
    assert PlanRecord.from_json(record.to_json()) == record


def _run(tmp_path, name: str = "colocate", steps: int = 3):
    """A run directory as a run leaves it: its real plan.json, step records, one attempt."""
    run = tmp_path / "run"
    write_run_files(run, render_files(_plan(name)))
    for i in range(1, steps + 1):
        append(run / "metrics.jsonl", StepRecord(i, 2.0, 1.5, 0.5, max_steps=10, time=1e9 + 2 * i))
    return run


RENAMES = [
    ("estimate", "startup_s"),
    ("layout", "num_generations"),
    ("vllm", "mode"),
    ("train", "device"),
    ("topology", "description"),
    ("asynchronous", "queue_maxsize"),
    (None, "trainer_values"),
]


@pytest.mark.parametrize(("section", "key"), RENAMES)
def test_a_key_renamed_in_plan_to_dict_makes_status_and_report_fail_naming_it(tmp_path, monkeypatch, capsys,
                                                                            section, key):  # fmt: skip
    real = plan_json.plan_to_dict

    def renamed(plan):
        data = real(plan)
        where = data if section is None else data[section]
        where[key + "_renamed"] = where.pop(key)
        return data

    monkeypatch.setattr(plan_json, "plan_to_dict", renamed)
    run = _run(tmp_path, "async" if section == "asynchronous" else "colocate")
    assert key + "_renamed" in (run / "plan.json").read_text()
    dotted = key if section is None else f"{section}.{key}"
    for verb in (["status", str(run)], ["status", str(run), "--json"], ["report", str(run)]):
        if verb[0] == "report":
            pytest.importorskip("matplotlib")
        assert main(verb, environ={}) == 2, verb
        err = capsys.readouterr().err
        assert f"plan.json: key '{dotted}' is missing" in err and "Traceback" not in err, err


MALFORMED = {
    "a corrupt metrics line": ("metrics.jsonl", 2, lambda t: t.replace("\n", '\n{"step": 2, "step_s": oops}\n', 1)),
    "a step of 1e400": ("metrics.jsonl", 4, lambda t: t + '{"step": 1e400, "step_s": 1.0}\n'),
    "a step time that is text": ("metrics.jsonl", 1, lambda t: '{"step": 1, "step_s": "slow"}\n' + t),
    "a metrics line that is a list": ("metrics.jsonl", 3, lambda t: "\n".join([*t.splitlines()[:2], "[1, 2]", ""])),
    "a plan.json that is not an object": ("plan.json", None, lambda t: "[1, 2, 3]\n"),
    "a plan.json that is not JSON": ("plan.json", None, lambda t: t[: len(t) // 2]),
    "an attempt of 1e400": ("control/attempts.jsonl", 1, lambda t: '{"attempt": 1e400, "state": "failed"}\n'),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_run_files_are_an_error_naming_the_file_and_line(tmp_path, capsys, case):
    name, line, corrupt = MALFORMED[case]
    run = _run(tmp_path)
    path = run / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(corrupt(path.read_text() if path.is_file() else ""))
    verbs = [["status", str(run)], ["status", str(run), "--json"]]
    try:
        import matplotlib  # noqa: F401

        verbs.append(["report", str(run)])
    except ImportError:
        pass
    for verb in verbs:
        assert main(verb, environ={}) == 2, verb
        err = capsys.readouterr().err
        assert str(path) in err and "Traceback" not in err, err
        if line is not None:
            assert f"{path}, line {line}:" in err, err


def test_a_line_cut_short_by_a_crash_is_skipped_and_the_next_record_starts_its_own_line(tmp_path):
    run = _run(tmp_path, steps=2)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "step_s": 2.0, "generat')  # the trainer died mid-line
    append(run / "metrics.jsonl", StepRecord(3, 2.0, 1.5, 0.5, max_steps=10))  # the next attempt's first step
    view = RunView.load(run)
    assert [r.step for r in view.steps()] == [1, 2, 3]


def test_the_view_of_a_directory_without_a_run_has_nothing_and_says_so(tmp_path):
    view = RunView.load(tmp_path)
    assert (view.plan, view.records, view.metrics_found, view.attempts, view.holder, view.job) == (
        None, (), False, (), None, None)  # fmt: skip


def test_slurm_states_become_typed_job_states():
    from grpo_launch.backends.slurm.job_state import job_state_of

    line = "JobId=7 JobName=x JobState=COMPLETED Restarts=0 RunTime=00:03:10 TimeLimit=01:00:00 NodeList=n[1-2]"
    state = job_state_of(line)
    assert state == JobState(JobStatus.COMPLETED, "COMPLETED", 0, "00:03:10", "01:00:00", "n[1-2]")
    assert state.said == "COMPLETED" and JobState.from_json(state.to_json()) == state
    timeout = job_state_of("JobId=7 JobState=TIMEOUT Restarts=2")
    assert timeout is not None and timeout.state == JobStatus.FAILED and timeout.said == "TIMEOUT (FAILED)"
    assert job_state_of("JobId=7 JobState=SOMETHING_NEW").state == JobStatus.UNKNOWN  # type: ignore[union-attr]
    assert job_state_of("slurm_load_jobs error: Invalid job id specified") is None


def test_status_shows_the_typed_job_state_and_no_slurm_keys(tmp_path, capsys, monkeypatch):
    from grpo_launch.backends.slurm import SlurmBackend

    run = _run(tmp_path)
    (run / ".grpo-launch.lock").write_text(json.dumps({"pid": 1, "backend": "slurm", "job_id": "42"}) + "\n")
    said = JobState(JobStatus.COMPLETED, "COMPLETED", 0, "00:03:10", "01:00:00", "n1")
    monkeypatch.setattr(SlurmBackend, "job_state", classmethod(lambda cls, job: said if job == "42" else None))
    assert main(["status", str(run)], environ={}) == 0
    assert "42: COMPLETED, restarts 0" in capsys.readouterr().out
    assert main(["status", str(run), "--json"], environ={}) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["job"] == "42" and data["job_state"] == said.to_json()
    assert not {"JobState", "Restarts", "RunTime", "TimeLimit", "NodeList"} & set(data["job_state"])


def test_the_completion_marker_is_a_record(tmp_path):
    from grpo_launch.rundir.checkpoints import completed, mark_complete
    from grpo_launch.rundir.layout import COMPLETE_MARKER

    mark_complete(tmp_path, CompletionRecord(5, 5, 1e9))
    assert completed(tmp_path) == CompletionRecord(5, 5, 1e9)
    (tmp_path / COMPLETE_MARKER).write_text('{"step": 1e400}')
    assert completed(tmp_path) is None  # one that does not read: the run is resumed, never skipped on a guess


def test_a_hosts_check_answer_is_a_record_and_a_bad_one_a_problem_named():
    from grpo_launch.backends.ssh import check_problem
    from grpo_launch.node.host_check import host_check

    check = host_check(["/no/such/path"], [])
    assert HostCheck.from_json(json.loads(json.dumps(check.to_json())), "h1's check") == check
    assert check.missing == ("/no/such/path",)
    with pytest.raises(RunFileError, match="h1's check: key 'version' is missing"):
        HostCheck.from_json({"missing": []}, "h1's check")
    plan = plan_recipe(RECIPES / "tiny-cpu.yaml", "cpu", model=None)
    problem = check_problem("h1", 0, json.dumps({"missing": []}) + "\n", "", plan, "python3", {})
    assert problem is not None and problem.startswith("h1: ") and "'version' is missing" in problem


def test_a_line_being_written_is_not_an_error_while_the_run_goes(tmp_path):
    run = _run(tmp_path, steps=2)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "log": {"reward": 0.5}')  # ends with "}", and its writer has not finished it
    assert [r.step for r in RunView.load(run).steps()] == [1, 2]

"""What a run says, the smaller items of issue 50 §2: each test names its one-line reproduction, before → after."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from grpo_launch.analysis.split_verdict import split_verdict
from grpo_launch.cli import main
from grpo_launch.enums import FailureKind, RunState, VllmMode
from grpo_launch.execute.session import Stopping, _SignalStop
from grpo_launch.execute.supervisor import Supervisor
from grpo_launch.execute.watchdog import Watchdog
from grpo_launch.rundir import shown_text as text
from grpo_launch.spec import Failure, ProcessSpec, RunResult

from .helpers import ROOT, TINY_RECIPE, plan_recipe

QWEN15 = ROOT / "recipes" / "qwen1.5b.yaml"
QWEN7 = ROOT / "recipes" / "qwen7b-math.yaml"


def _finished_run(tmp_path, monkeypatch, *, step_s=0.19, generation_s=0.15):
    """A finished 4-step run (a real plan.json, the trainers' records written here), as test_run_record's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(json.dumps({"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct",
                                                 "dataset_name": "AI-MO/NuminaMath-TIR", "max_steps": 4}))  # fmt: skip
    assert main(["plan", "r.yaml", "--gpus", "8xH100-80GB"], environ={}) == 0
    run = tmp_path / "grpo_runs" / "r"
    with open(run / "metrics.jsonl", "w") as f:
        for i in range(1, 5):
            f.write(json.dumps({"step": i, "max_steps": 4, "time": 1e9 + i, "step_s": step_s,
                                "generation_s": generation_s, "training_s": step_s - generation_s}) + "\n")  # fmt: skip
            f.write(json.dumps({"step": i, "log": {"reward": 1.0, "reward_std": 0.0}}) + "\n")
    (run / "control").mkdir(exist_ok=True)
    (run / "control" / "attempts.jsonl").write_text(
        json.dumps({"attempt": 1, "ended": 1e9 + 5, "state": "succeeded", "exit_code": 0}) + "\n"
    )
    return run


def test_status_of_a_finished_run_shows_no_eta(tmp_path, monkeypatch, capsys):
    """`status RUN` of a finished run: "ETA 0 min at the measured step time; planned -" → no ETA row."""
    from grpo_launch.analysis.view import RunView
    from grpo_launch.cli.status import watch_rows

    run = _finished_run(tmp_path, monkeypatch)
    capsys.readouterr()
    assert main(["status", str(run)], environ={}) == 0
    text = capsys.readouterr().out
    assert "finished" in text and "ETA" not in text and "planned -" not in text, text
    assert "ETA" not in dict(watch_rows(RunView.load(run), str(tmp_path)))


def test_status_rounds_to_digits_that_show_the_value(tmp_path, monkeypatch, capsys):
    """`status RUN` of 0.19 s steps (0.04 s training) rewarded 1.0 ± 0.0: "training 0.0 s", "reward 1" and
    (--watch) "reward 1 ± 0" → "training 0.04 s", "reward 1.00", "reward 1.00 ± 0.00"."""
    from grpo_launch.analysis.view import RunView
    from grpo_launch.cli.status import watch_rows

    run = _finished_run(tmp_path, monkeypatch)
    capsys.readouterr()
    assert main(["status", str(run)], environ={}) == 0
    out = capsys.readouterr().out
    assert re.search(r"step time\s+0\.19 s \(generation 0\.15 s, training 0\.04 s\)", out), out
    assert re.search(r"\breward\s+1\.00\n", out) and re.search(r"reward_std\s+0\.00\n", out), out
    rows = dict(watch_rows(RunView.load(run), str(tmp_path)))
    assert rows["reward"] == "1.00 ± 0.00" and "training 0.04 s" in rows["step time"]
    assert [text.significant(v) for v in (0.0412, 1.0, 5.7912, 614.2, 12345.6)] == ["0.0412", "1.00", "5.79", "614",
                                                                                    "12,346"]  # fmt: skip


class _Asked:
    """A stop channel that only counts its requests (these tests look at what is said)."""

    asked = 0

    def request(self, *_args, **_kw) -> None:
        self.asked += 1

    def reason(self) -> None:
        return None


def _stop(lines, **kw):
    st = Stopping(grace_s=30, grace_why="a test", step_in_flight=lambda: 16, **kw)
    stop = _SignalStop(st, _Asked(), lines.append)
    stop.training = True
    return stop


def test_the_sigterm_notice_names_a_second_sigterm():
    """A SIGTERM's notice: "SIGTERM: checkpoint … requested; Ctrl-C again to stop now" → "SIGTERM again to stop
    now" (Ctrl-C for SIGINT), and what stopping now costs."""
    lines: list[str] = []
    _stop(lines, newest=lambda: 8).soft(signal.SIGTERM)
    assert lines == ["[grpo-launch] SIGTERM: checkpoint at the end of step 16 requested; SIGTERM again to stop now "
                     "(waiting up to 30 s: a test); stopping now loses steps 9–16 (back to checkpoint-8)"]  # fmt: skip
    lines.clear()
    _stop(lines, newest=lambda: 0).soft(signal.SIGINT)
    assert lines[0].endswith("Ctrl-C again to stop now (waiting up to 30 s: a test); stopping now loses steps 1–16 "
                             "(no complete checkpoint yet)")  # fmt: skip


def test_the_checkpoint_write_is_announced_with_its_time_left_and_its_cost_once():
    lines: list[str] = []
    writing = [None]
    stop = _stop(lines, newest=lambda: 8, saving=lambda: writing[0])
    stop.soft(signal.SIGTERM)
    stop.check()
    assert len(lines) == 1  # nothing written yet
    writing[0] = (16, 12.4)
    stop.check()
    stop.check()
    assert lines[1:] == ["[grpo-launch] writing checkpoint-16, about 12 s left; SIGTERM again abandons it and loses "
                         "steps 9–16 (back to checkpoint-8)"]  # fmt: skip
    writing[0] = (17, -3.0)
    stop.check()
    assert lines[-1].startswith("[grpo-launch] writing checkpoint-17, taking longer than the saves measured;")


def test_a_split_line_names_the_steps_its_means_are_over(tmp_path):
    """A split line said "step split at step 5: generation 2.60 s" (the mean of steps 1–5, printed after step 6's
    own line) → "step split, mean of steps 1–5: …", and "mean of steps 1–20" at the 20th."""
    metrics, seen = tmp_path / "metrics.jsonl", []
    dog = Watchdog(metrics)
    dog.on_split = lambda g, t: seen.append(split_verdict(g, t, VllmMode.OFF, step=dog.split_steps, cpu=True))
    with metrics.open("a") as f:
        for i in range(1, 31):
            f.write(json.dumps({"step": i, "max_steps": 40, "step_s": 3.0, "generation_s": 2.0 + (i == 1) * 3,
                                "training_s": 1.0}) + "\n")  # fmt: skip
    dog()
    assert seen[0].startswith("step split, mean of steps 1–5: generation 2.60 s, training 1.00 s"), seen
    assert seen[1].startswith("step split, mean of steps 1–20: generation 2.15 s"), seen
    assert split_verdict(1.0, 1.0, VllmMode.OFF, step=(7, 7)).startswith("step split of step 7:")


def test_generation_names_one_thing_in_a_plan():
    """`plan recipes/qwen1.5b.yaml --gpus 8xH100-80GB`: "generation 2.7 s" (the estimate: vLLM generating) beside the
    balance row's "generation 2.83 s vs training" (generating + old log-probs + sync) → the balance row names its
    terms: "generation 2.73 s + old log-probs 0.10 s = 2.83 s vs training 0.38 s"."""
    plan = plan_recipe(QWEN15, "8xH100-80GB")
    step = plan.estimate.step
    why = {d.what: d.why for d in plan.decisions}["balance"]
    said = re.match(r"generation (\S+) s \+ old log-probs (\S+) s = (\S+) s vs training (\S+) s per step", why)
    assert said, why
    assert float(said[1]) == pytest.approx(step.generation_s, abs=0.005)
    assert float(said[3]) == pytest.approx(step.trainer_generation_s, abs=0.005)


def test_no_why_row_names_a_vllm_share_the_plan_does_not_use():
    """`plan recipes/qwen1.5b.yaml --gpus 8xH100-80GB`: vllm_gpu_memory_utilization=0.3, and the vllm_max_num_seqs
    row "… → gpu_memory_utilization 0.08" → "… = 0.08 of each GPU, within the 0.30 vLLM is given"."""
    plan = plan_recipe(QWEN15, "8xH100-80GB")
    assert plan.vllm.mode == VllmMode.COLOCATE
    used = plan.vllm.gpu_memory_utilization
    for d in plan.decisions:
        for share in re.findall(r"gpu_memory_utilization (\d\.\d+)", d.why):
            assert float(share) == pytest.approx(used), (d.what, d.why)
    why = {d.what: d.why for d in plan.decisions}["vllm_max_num_seqs"]
    assert re.search(rf"= 0\.\d\d of each GPU, within the {used:.2f} vLLM is given", why), why


def test_the_trainer_recipes_header_says_the_split_that_runs():
    """`plan recipes/qwen7b-math.yaml --gpus 8xH100-80GB`: the recipe's comment says "vLLM server", the plan
    colocates, and trainer_recipe.yaml said neither → its header names the split and the training backend."""
    import yaml

    from grpo_launch.render.configs import render_trainer_recipe

    plan = plan_recipe(QWEN7, "8xH100-80GB")
    text = render_trainer_recipe(plan)
    assert text.splitlines()[1] == f"# Split: {plan.split}; training: {plan.train.backend}."
    assert plan.split.startswith("colocate") and yaml.safe_load(text)["vllm_mode"] == "colocate"
    cpu = render_trainer_recipe(plan_recipe(TINY_RECIPE, "cpu"))
    assert cpu.splitlines()[1] == "# Split: no vLLM (CPU); training: ddp."


def test_a_childs_colours_are_dropped_and_other_controls_still_escaped(tmp_path):
    """wandb's coloured "wandb: synced" showed as "\\x1b[34m\\x1b[1mwandb\\x1b[0m: synced" → "wandb: synced"; a bell
    or a title sequence is still escaped."""
    lines: list[str] = []
    sup = Supervisor(tmp_path / "logs", emit=lines.append, grace_s=2, environ=dict(os.environ))
    said = r"print('\x1b[34m\x1b[1mwandb\x1b[0m: synced \x07 \x1b]0;title\x07 \x1b[2J')"
    child = sup.start(ProcessSpec("train", (sys.executable, "-c", said)))
    child.proc.wait(timeout=30)
    child.pump.join(timeout=10)
    sup.stop_all()
    assert "[train] wandb: synced \\x07 \\x1b]0;title\\x07 \\x1b[2J" in lines, lines
    assert text.printable("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"  # the launcher's own text: escaped as before


def test_the_reports_series_is_json_as_it_stands(tmp_path):
    """`report RUN` embedded the series with html.escape ("&quot;" inside <script type="application/json">, which
    HTML does not decode: JSON.parse fails) → valid JSON, only < > & escaped (\\u003c …), read back equal."""
    pytest.importorskip("matplotlib")
    from grpo_launch.analysis.report import write_report

    name = 'a</script><!-- "x" & y'
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for i in range(1, 4):
            f.write(json.dumps({"step": i, "max_steps": 3, "step_s": 1.0, "generation_s": 0.5, "training_s": 0.5}))
            f.write("\n" + json.dumps({"step": i, "log": {"reward": 0.5 * i, f"rewards/{name}/mean": 0.25 * i}}) + "\n")
    page = write_report(tmp_path).read_text()
    opening = "<script type='application/json' id='series'>"
    body = page[page.index(opening) + len(opening) : page.index("</script>", page.index(opening))]
    assert "&quot;" not in body and "<" not in body and ">" not in body and "&" not in body
    data = json.loads(body)  # as JSON.parse reads the element's text: no HTML decoding
    assert data["reward"][name]["values"] == [0.25, 0.5, 0.75] and data["reward"][name]["steps"] == [1, 2, 3]


def test_the_grafana_tokens_panel_draws_a_rate():
    """monitoring/grafana-dashboard.json: "Tokens per second" drew grpo_launch_tokens_total (a counter) on its
    tokens/s axis → rate(grpo_launch_tokens_total[1m]); no panel of a per-second unit draws a raw counter."""
    from grpo_launch.analysis.live_metrics import METRICS

    counters = {m.name for m in METRICS if m.kind == "counter"}
    board = json.loads((ROOT / "monitoring" / "grafana-dashboard.json").read_text())
    (tokens,) = [p for p in board["panels"] if p["title"] == "Tokens per second"]
    assert {t["expr"] for t in tokens["targets"]} == {"grpo_launch_tokens_per_second",
                                                      "rate(grpo_launch_tokens_total[1m])"}  # fmt: skip
    for panel in board["panels"]:
        if panel["fieldConfig"]["defaults"]["unit"] == "ops":
            assert not {t["expr"] for t in panel["targets"]} & counters, panel["title"]


def test_plan_into_a_closed_pipe_exits_0_quietly(tmp_path):
    """`plan … | head -2` exited 1 when head closed the pipe first (BrokenPipeError) → 0, nothing on stderr."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-m", "grpo_launch", "plan", str(QWEN15), "--gpus", "8xH100-80GB",
                                 "--run-dir", str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=ROOT, env=env)  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the first line: every write meets a closed pipe
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 0 and err == "", err


def test_a_restart_note_has_the_right_article():
    """A restart's note said "restart 1/1 in 0 s after a infra failure" → "after an infra failure" (and "a hang
    failure")."""
    from grpo_launch.execute.policy import Action, Spent, next_action

    plan = plan_recipe(TINY_RECIPE, "cpu")
    for kind, said in ((FailureKind.INFRA, "after an infra failure"), (FailureKind.HANG, "after a hang failure")):
        lost = RunResult(RunState.FAILED, 1, message="lost", failure=Failure(kind, "lost"))
        step = next_action(plan, lost, Spent(), max_restarts=1)
        assert step.action == Action.RESTART and said in (step.note or ""), step.note
    assert [text.with_article(w) for w in ("oom", "user", "disk-full")] == ["an oom", "a user", "a disk-full"]

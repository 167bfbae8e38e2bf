"""scripts/gpu_acceptance.sh without a GPU: its syntax, its dry run (the phases, their caps within the 8-minute
budget, what this environment would run), the stack check and its verdict (vLLM and DeepSpeed optional, the rest
required), the phases the script runs by that verdict (stood in by scripts that play the GPU stack), its timer, the
recipes of each run kind, and the report: predicted ÷ measured per term in its band, over run directories written
the way a run writes them (fake numbers: the real measurement needs a GPU, which no test here has), and the other
tools' JSON files under the cache skipped without a traceback."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from grpo_launch.analysis.view import RunView
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.render import render_files
from grpo_launch.rundir.files import write_run_files
from grpo_launch.rundir.records import StartupRecord, StepRecord, append

from .helpers import ROOT, plan_recipe

SCRIPT = ROOT / "scripts" / "gpu_acceptance.sh"
_spec = importlib.util.spec_from_file_location("gpu_acceptance", ROOT / "scripts" / "gpu_acceptance.py")
assert _spec and _spec.loader
acceptance = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = acceptance  # before it runs, as importlib's recipe says: its dataclasses look it up
_spec.loader.exec_module(acceptance)

PHASES = ["check", "assets", "calibrate-0.5b", "run-server", "run-colocate", "run-ddp", "run-zero3", "run-cb", "report"]
GIB = 2**30


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src"), **extra}


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _stand_in(tmp_path: Path, prepared_ddp: Path | None = None) -> dict[str, str]:
    """The environment of a GPU machine without vLLM, played on CPU: a PYTHON whose stack check passes (vLLM
    missing: the vLLM runs skipped) and whose assets are a no-op, the real Python for the report; a GRPO_LAUNCH
    that logs each call with the cache variables, leaves HF's and matplotlib's JSON files in XDG_CACHE_HOME (as
    they did on the first GPU run), puts ``prepared_ddp`` in place of the DDP run, fails the ZeRO-3 run and
    leaves the continuous-batching run without a step."""
    python = _executable(tmp_path / "python", f"""#!/usr/bin/env bash
case "$2" in
  check) printf 'run-server\\t"vLLM is not installed"\\nrun-colocate\\t"vLLM is not installed"\\n' >"$4"
         echo "stack: a stand-in"; exit 0 ;;
  assets) exit 0 ;;
esac
exec {sys.executable} "$@"
""")  # fmt: skip
    launcher = _executable(tmp_path / "grpo-launch", f"""#!/usr/bin/env bash
echo "$* HF_HOME=$HF_HOME MPLCONFIGDIR=$MPLCONFIGDIR XDG_CACHE_HOME=$XDG_CACHE_HOME" >>{tmp_path}/calls.log
out=$(dirname "$2")
case "$2" in
  *recipe-ddp.yaml) if [[ $1 == run ]]; then cp -r {prepared_ddp} "$out/run-ddp"; else
      mkdir -p "$XDG_CACHE_HOME/huggingface/datasets/x" "$XDG_CACHE_HOME/matplotlib"
      echo '{{"description": "", "features": {{}}}}' >"$XDG_CACHE_HOME/huggingface/datasets/x/dataset_info.json"
      echo '{{"_version": 390, "ttflist": []}}' >"$XDG_CACHE_HOME/matplotlib/fontlist-v390.json"; fi ;;
  *recipe-zero3.yaml) echo "zero3: out of memory" >&2; exit 1 ;;
esac
""")  # fmt: skip
    return _env(PYTHON=str(python), GRPO_LAUNCH=str(launcher))


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def _dry_run(out: Path, env: Mapping[str, str]) -> tuple[subprocess.CompletedProcess[str], list[tuple[str, int, str]]]:
    done = subprocess.run([str(SCRIPT), "--dry-run", str(out)], capture_output=True, text=True, env=dict(env))
    rows = [(n, int(s), rest) for n, s, rest in re.findall(r"^  (\S+)\s+≤\s+(\d+) s  (.*)$", done.stdout, re.M)]
    return done, rows


def test_the_dry_run_lists_every_phase_within_the_eight_minute_budget(tmp_path):
    """Every phase with its cap, the caps within the budget, and here (a CPU build of torch) the stack check that
    stops the acceptance: said, without a traceback, and nothing started."""
    done, rows = _dry_run(tmp_path / "o", _env())
    assert done.returncode == 0, done.stderr
    assert [n for n, _, _ in rows] == PHASES
    assert sum(cap for _, cap, _ in rows) <= 480 == acceptance.BUDGET_S
    assert "--random-weights" in done.stdout and "budget 480 s" in done.stdout
    commands = {n: rest for n, _, rest in rows}
    for kind in acceptance.RUNS:  # each run its own recipe, fresh
        assert f"run $OUT/recipe-{kind}.yaml --resume never" in commands[f"run-{kind}"]
    assert "the stack check stops the acceptance" in done.stdout and "CPU build" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "o").exists()  # a dry run starts nothing


def test_the_dry_run_says_which_phases_this_stack_would_run(tmp_path):
    done, rows = _dry_run(tmp_path / "o", _stand_in(tmp_path))
    assert done.returncode == 0, done.stderr
    notes = {n: rest.rsplit("[here: ", 1)[-1] for n, _, rest in rows}
    assert notes["run-server"] == notes["run-colocate"] == 'skipped: "vLLM is not installed"]'
    assert all(notes[n] == "runs]" for n in PHASES if n not in ("run-server", "run-colocate"))
    assert "the stack check passes" in done.stdout and not (tmp_path / "o").exists()


def test_the_dry_run_refuses_caps_beyond_the_budget(tmp_path):
    out = subprocess.run([str(SCRIPT), "--dry-run", str(tmp_path)], capture_output=True, text=True,
                         env=_env(GPU_ACCEPTANCE_BUDGET_S="300"))  # fmt: skip
    assert out.returncode == 1 and "exceed the budget" in out.stderr


def test_the_check_says_what_this_cpu_environment_lacks(tmp_path):
    """The real check, here: a CPU build of torch (fatal), and vLLM missing from the main venv (its runs skipped,
    not fatal). Exit 3, no traceback."""
    out = subprocess.run([str(SCRIPT), "--check", str(tmp_path)], capture_output=True, text=True, env=_env())
    assert out.returncode == 3, out.stdout + out.stderr
    assert "cannot run the acceptance" in out.stdout and "Traceback" not in out.stdout + out.stderr
    assert "CPU build" in out.stdout
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        assert "run-colocate is skipped: vLLM is not installed" in out.stdout
        assert "run-server is skipped: vLLM is not installed" in out.stdout


def test_a_failed_check_stops_the_script(tmp_path):
    """Here the stack check fails: its exit is the script's, and no other phase runs (no assets, no report)."""
    out = subprocess.run([str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 3, out.stdout + out.stderr
    phases = [json.loads(x) for x in (tmp_path / "phases.jsonl").read_text().splitlines()]
    assert [(p["phase"], p["status"], p["exit"]) for p in phases] == [("check", "failed", 3)]
    assert not (tmp_path / "gpu_acceptance.json").exists() and not (tmp_path / "tiny").exists()


GPU_STACK = {"torch": "2.11.0+cu130", "transformers": "5.24.0", "trl": "1.16.0", "accelerate": "1.15.0",
             "datasets": "5.2.0", "vllm": "0.31.0", "deepspeed": "0.19.8"}  # fmt: skip
NO_VLLM = "vLLM is not installed"


@pytest.mark.parametrize(
    "changed, gpus, fatal, skipped",
    [
        ({}, 1, None, {"run-server": "2 GPUs needed"}),
        ({}, 2, None, {}),
        ({"vllm": None}, 1, None, {"run-server": NO_VLLM, "run-colocate": NO_VLLM}),
        ({"vllm": "0.32.1"}, 2, None, {"run-server": "newer than TRL 1.16", "run-colocate": "newer than TRL 1.16"}),
        ({"vllm": "0.21.0"}, 2, None, {"run-server": "older than TRL 1.16", "run-colocate": "older than TRL 1.16"}),
        ({"deepspeed": None}, 2, None, {"run-zero3": "DeepSpeed is not installed"}),
        ({"deepspeed": "0.16.9", "vllm": None}, 2, None,
         {"run-zero3": "older than 0.17", "run-server": NO_VLLM, "run-colocate": NO_VLLM}),
        ({"trl": None}, 1, "trl is not installed", {"run-server": "2 GPUs needed"}),
        ({"trl": "1.17.0"}, 1, "is not TRL 1.16", {"run-server": "2 GPUs needed"}),
        ({"trl": "1.15.2"}, 1, "trl 1.15.2 is older than 1.16", {"run-server": "2 GPUs needed"}),
        ({"accelerate": None}, 1, "accelerate is not installed", {"run-server": "2 GPUs needed"}),
        ({"transformers": "4.57.1"}, 1, "transformers 4.57.1 is older than 5.0", {"run-server": "2 GPUs needed"}),
        ({"torch": None}, 1, "torch is not installed", {"run-server": "2 GPUs needed"}),
        ({"torch": "2.11.0+cpu", "vllm": None}, 0, "CPU build", {"run-server": NO_VLLM, "run-colocate": NO_VLLM}),
        ({"torch": "2.11.0"}, 0, "no CUDA GPU", {"run-server": "2 GPUs needed"}),
    ],
)  # fmt: skip
def test_the_stack_verdict(changed, gpus, fatal, skipped):
    """Required packages missing or too old: fatal. vLLM or DeepSpeed missing or out of range: their runs skipped,
    each with the reason, and the rest run. The server run needs two GPUs."""
    verdict = acceptance.stack_verdict(GPU_STACK | changed, gpus)
    if fatal is None:
        assert verdict.fatal == ()
    else:
        assert any(fatal in f for f in verdict.fatal), verdict.fatal
    assert set(verdict.skipped) == set(skipped), verdict.skipped
    for phase, said in skipped.items():
        assert said in verdict.skipped[phase]
        assert "\t" not in verdict.skipped[phase] and "\n" not in verdict.skipped[phase]  # the skip file's format


def test_the_verdicts_phases_are_the_scripts(tmp_path):
    """Each run the verdict can skip is a phase of the shell script, and its recipe is the one assets writes."""
    _, rows = _dry_run(tmp_path / "o", _env())
    names = [n for n, _, _ in rows]
    assert {f"run-{kind}" for kind in acceptance.RUNS} <= set(names)
    everything_missing = acceptance.stack_verdict(dict.fromkeys(GPU_STACK), 1)
    assert set(everything_missing.skipped) <= set(names)


def test_the_timer_skips_what_the_budget_cannot_hold_and_still_writes_the_json(tmp_path):
    """A 12 s budget: after the report's reserve no phase has 5 s, so each is left out by the timer, and the report
    (its reserve) still writes the JSON: with no run measured, the acceptance fails (exit 1), saying why."""
    out = subprocess.run([str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env=_env(GPU_ACCEPTANCE_BUDGET_S="12"))  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    phases = [json.loads(x) for x in (tmp_path / "phases.jsonl").read_text().splitlines()]
    assert [p["phase"] for p in phases] == PHASES
    assert [p["status"] for p in phases[:-1]] == ["out-of-budget"] * 8
    assert phases[-1]["phase"] == "report" and phases[-1]["exit"] == 1 and phases[-1]["limit_s"] <= 12
    doc = json.loads((tmp_path / "gpu_acceptance.json").read_text())
    assert doc["schema"] == acceptance.SCHEMA == "grpo-launch/gpu-acceptance/2" and not doc["passed"]
    assert "no run measured anything" in doc["problems"]
    assert any(p.startswith("run-ddp: measured nothing (phase out-of-budget") for p in doc["problems"])
    assert "Traceback" not in out.stdout + out.stderr and "no run measured anything" in out.stdout  # the log


def test_the_script_runs_what_the_stack_allows_and_exits_with_the_report(tmp_path):
    """A GPU machine without vLLM, stood in: the vLLM runs are skipped with the reason (their time passes to the
    runs after them), a failed run does not stop the next one, HF's and matplotlib's files under the cache are no
    calibration (and no traceback), and the script's exit is the report's: 1, as the ZeRO-3 run failed and the
    continuous-batching run measured nothing, though the DDP run is in its bands."""
    prepared = tmp_path / "prepared" / "run-ddp"
    _fake_run(prepared, "ddp", IN_BAND)
    out_dir = tmp_path / "out"
    out = subprocess.run([str(SCRIPT), str(out_dir)], capture_output=True, text=True, timeout=120,
                         env=_stand_in(tmp_path, prepared))  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    phases = {p["phase"]: p for p in map(json.loads, (out_dir / "phases.jsonl").read_text().splitlines())}
    assert list(phases) == PHASES
    assert {n: p["status"] for n, p in phases.items()} == {
        "check": "ok", "assets": "ok", "calibrate-0.5b": "ok", "run-server": "skipped", "run-colocate": "skipped",
        "run-ddp": "ok", "run-zero3": "failed", "run-cb": "ok", "report": "failed"}  # fmt: skip
    assert phases["run-server"]["reason"] == "vLLM is not installed" and phases["run-zero3"]["exit"] == 1
    assert phases["run-ddp"]["limit_s"] > 65 + 70  # its own cap and the skipped vLLM runs' caps
    doc = json.loads((out_dir / "gpu_acceptance.json").read_text())
    assert all(t["in_band"] for t in doc["runs"]["run-ddp"]["terms"].values() if t["band"] is not None)
    assert doc["runs"]["run-server"]["skipped"] == "vLLM is not installed"
    assert [p.split(":")[0] for p in doc["problems"]] == ["run-zero3", "run-cb"]
    assert doc["calibrations"] == [] and doc["calibrations_skipped"] == []  # the foreign files: not even read
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["calibrate", "run", "run", "run"]
    for call in calls:  # HF and matplotlib have folders of their own, not under XDG_CACHE_HOME
        env = dict(kv.split("=", 1) for kv in call.split() if "=" in kv and kv.split("=")[0].isupper())
        assert env["XDG_CACHE_HOME"] == str(out_dir / "cache")
        for name in ("HF_HOME", "MPLCONFIGDIR"):
            assert env[name].startswith(str(out_dir)) and not env[name].startswith(env["XDG_CACHE_HOME"])


@pytest.mark.parametrize("kind", list(acceptance.RUNS))
def test_each_run_kinds_recipe_plans_as_that_kind(tmp_path, kind):
    """The recipe each run phase uses (its random model stood in by the same built-in shape): TRL accepts its
    values, it plans with the kind's vLLM mode and backend, a few steps, the completions' full length, and
    ``allowed_token_ids`` (a vLLM SamplingParams argument) only where vLLM generates."""
    run = acceptance.RUNS[kind]
    values = yaml.safe_load(acceptance._recipe(kind, tmp_path / "m", tmp_path / "d.jsonl", tmp_path / "run", [0, 1]))
    values["model_name_or_path"] = acceptance.RUN_MODEL
    plan = plan_recipe(values, "2xH100-80GB" if kind == "server" else "1xH100-80GB")
    assert plan.vllm.mode == {"server": "server", "colocate": "colocate"}.get(kind, "off")
    assert plan.train.backend == ("zero3" if kind == "zero3" else "ddp")
    assert ("generation_kwargs" in values) == (kind in ("server", "colocate"))
    assert values.get("use_transformers_continuous_batching", False) is (kind == "cb")
    assert 3 <= values["max_steps"] == run.steps <= 5
    assert plan.estimate.workload.mean_completion_len == acceptance.COMPLETION_LEN


@pytest.mark.parametrize("model, tied", [("Qwen/Qwen2.5-0.5B-Instruct", True), ("Qwen/Qwen2.5-1.5B-Instruct", True),
                                         ("Qwen/Qwen2.5-7B-Instruct", False)])  # fmt: skip
def test_the_random_weight_configs_come_from_the_built_in_shapes(model, tied):
    shape = find_model_shape(model)
    cfg = acceptance.hf_config(model)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["vocab_size"], cfg["intermediate_size"]) == (shape.hidden, shape.layers, shape.heads, shape.kv_heads,
                                                              shape.vocab, shape.intermediate)  # fmt: skip
    assert cfg["tie_word_embeddings"] is tied


@pytest.mark.parametrize(
    "measured, predicted, band, ratio, in_band",
    [
        (10.0, 10.0, (0.75, 1.25), 1.0, True),
        (10.0, 7.5, (0.75, 1.25), 0.75, True),
        (10.0, 7.4, (0.75, 1.25), 0.74, False),
        (10.0, 12.6, (0.75, 1.25), 1.26, False),
        (10.0, 9.9, (1.0, 1.5), 0.99, False),  # memory: an underestimate is out
        (10.0, 0.0, (0.75, 1.25), 0.0, False),  # predicted nothing of a measured term
        (None, 3.0, (0.75, 1.25), None, None),  # not measured: not compared
        (0.0, 3.0, (0.75, 1.25), None, None),  # a zero is a term the run did not time
        (3.0, None, (0.75, 1.25), None, None),  # no prediction
    ],
)  # fmt: skip
def test_a_term_is_predicted_over_measured_in_its_band(measured, predicted, band, ratio, in_band):
    row = acceptance.compare(measured, predicted, band)
    assert row["predicted_over_measured"] == (None if ratio is None else pytest.approx(ratio))
    assert row["in_band"] is in_band and row["band"] == list(band)
    assert (row["measured"], row["predicted"]) == (measured, predicted)


IN_BAND = {"step_s": 1.0, "generation_s": 1.2, "training_s": 0.8, "first_step_s": 1.4, "peak_memory_gib": 1.1}


def _fake_run(run: Path, kind: str, ratios: Mapping[str, float], gpus: str = "1xH100-80GB") -> dict[str, float]:
    """A run directory of ``kind`` as a run leaves it: the real plan.json of the acceptance's recipe (the random
    model stood in by its built-in shape), and metrics.jsonl with start-up records and four steps whose measured
    terms are the plan's prediction ÷ ``ratios``. The predicted values, by term."""
    values = yaml.safe_load(acceptance._recipe(kind, run.parent / "m", run.parent / "d.jsonl", run, [0, 1, 2]))
    values["model_name_or_path"] = acceptance.RUN_MODEL
    write_run_files(run, render_files(plan_recipe(values, gpus, run_dir=run)))
    record = RunView.load(run).plan
    assert record is not None and record.prediction is not None and record.startup_s
    pr = record.prediction
    estimate = json.loads((run / "plan.json").read_text())["estimate"]
    vllm_gib = (record.vllm_memory_share or 0.0) * estimate["gpu_memory_gib"] if kind == "colocate" else 0.0
    predicted = {"step_s": pr.step_s, "generation_s": pr.trainer_generation_s, "training_s": pr.training_s,
                 "first_step_s": record.startup_s,
                 "peak_memory_gib": (pr.train_memory_gib or 0.0) + vllm_gib}  # fmt: skip
    m = {term: predicted[term] / ratios[term] for term in predicted}
    append(run / "metrics.jsonl", StartupRecord("model_load", 0.4 * m["first_step_s"], 1e9))
    append(run / "metrics.jsonl", StartupRecord("first_generation", 0.6 * m["first_step_s"], 1e9 + 1))
    peak = (int(m["peak_memory_gib"] * GIB),)
    for step in range(1, 5):  # the first step warms up: three times the others, left out of the means
        slow = 3.0 if step == 1 else 1.0
        append(run / "metrics.jsonl", StepRecord(step, slow * m["step_s"], slow * m["generation_s"],
                                                 slow * m["training_s"], max_steps=4, time=1e9 + 10 * step,
                                                 peak_memory_bytes=peak, memory_kind="cuda_max_allocated"))  # fmt: skip
    return predicted


def _phases(out: Path, *records: tuple[str, str]) -> None:
    (out / "phases.jsonl").write_text("".join(json.dumps({"phase": n, "status": s, "seconds": 50, "reason": None})
                                              + "\n" for n, s in records))  # fmt: skip


def test_the_report_gives_each_terms_ratio_band_and_verdict(tmp_path, capsys):
    """Two runs read back by the launcher's readers: the DDP run in every band; the colocated run's generation 2×
    longer than predicted and its peak above the plan (both out), its peak compared with the trainer's memory and
    vLLM's share of the GPU (one process). Exit 1, the two terms named on stderr; the JSON written all the same."""
    ddp = _fake_run(tmp_path / "run-ddp", "ddp", IN_BAND)
    colocate = _fake_run(tmp_path / "run-colocate", "colocate",
                         IN_BAND | {"generation_s": 0.5, "peak_memory_gib": 0.9})  # fmt: skip
    _phases(tmp_path, ("run-colocate", "ok"), ("run-ddp", "ok"), ("run-zero3", "skipped"), ("run-cb", "ok"))
    assert acceptance.report(tmp_path, tmp_path / "out.json") == 1
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["schema"] == "grpo-launch/gpu-acceptance/2" and not doc["passed"]
    assert doc["bands"] == {"step_s": [0.75, 1.25], "generation_s": [0.75, 1.25], "training_s": [0.75, 1.25],
                            "first_step_s": [0.5, 1.5], "peak_memory_gib": [1.0, 1.5]}  # fmt: skip
    run = doc["runs"]["run-ddp"]
    assert (run["backend"], run["vllm"], run["steps"], run["warm_steps"], run["error"]) == ("ddp", "off", 4, 3, None)
    for term, ratio in IN_BAND.items():
        row = run["terms"][term]
        assert row["predicted"] == pytest.approx(ddp[term])
        assert row["measured"] == pytest.approx(ddp[term] / ratio, rel=1e-6)
        assert row["predicted_over_measured"] == pytest.approx(ratio, rel=1e-6) and row["in_band"] is True
        assert row["band"] == doc["bands"][term]
    first = ddp["first_step_s"] / 1.4
    assert run["terms"]["first_step_s"]["phases"] == pytest.approx({"model_load": 0.4 * first,
                                                                    "first_generation": 0.6 * first})  # fmt: skip
    co = doc["runs"]["run-colocate"]["terms"]
    assert co["generation_s"]["predicted_over_measured"] == pytest.approx(0.5)
    assert co["generation_s"]["in_band"] is False
    assert co["peak_memory_gib"]["in_band"] is False and co["peak_memory_gib"]["vllm_gib"] > 0
    assert co["peak_memory_gib"]["predicted"] == pytest.approx(colocate["peak_memory_gib"])
    assert co["peak_memory_gib"]["train_gib"] + co["peak_memory_gib"]["vllm_gib"] == pytest.approx(
        colocate["peak_memory_gib"])  # fmt: skip
    assert [t for t, row in co.items() if row["in_band"] is False] == ["generation_s", "peak_memory_gib"]
    # the skipped run is not a failure; the continuous-batching run that ran and measured nothing is
    assert doc["runs"]["run-zero3"]["error"].startswith("skipped")
    assert [p.split(":")[0] for p in doc["problems"]] == ["run-colocate generation_s", "run-colocate peak_memory_gib",
                                                          "run-cb"]  # fmt: skip
    err = capsys.readouterr().err
    assert "run-colocate generation_s: predicted ÷ measured 0.50" in err and "outside 0.75–1.25" in err
    assert "run-colocate peak_memory_gib: predicted ÷ measured 0.90" in err and "outside 1.0–1.5" in err
    assert "run-ddp" not in err


def test_the_report_passes_when_every_compared_term_is_in_its_band(tmp_path, capsys):
    _fake_run(tmp_path / "run-ddp", "ddp", IN_BAND)
    _fake_run(tmp_path / "run-zero3", "zero3", {t: 2 - r for t, r in IN_BAND.items()} | {"peak_memory_gib": 1.49})
    _phases(tmp_path, ("run-server", "skipped"), ("run-colocate", "skipped"), ("run-ddp", "ok"), ("run-zero3", "ok"))
    assert acceptance.report(tmp_path, tmp_path / "out.json") == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["passed"] and doc["problems"] == [] and doc["runs"]["run-zero3"]["backend"] == "zero3"
    assert capsys.readouterr().err == ""


def test_a_run_with_nothing_to_compare_or_no_run_at_all_does_not_pass():
    """A run whose plan predicted none of its terms (a model the planner has no shape for) passes no band; nor does
    an acceptance that measured no run: neither is a pass by default."""
    nothing = {name: acceptance.compare(1.0, None, band) for name, band in acceptance.BANDS.items()}
    doc = acceptance.build_report(device="x", versions={}, phases=[], budget_s=480,
                                  runs={"run-ddp": {"error": None, "terms": nothing}})  # fmt: skip
    assert doc["problems"] == ["run-ddp: no term compared (plan.json predicted none of what the run measured)"]
    empty = acceptance.build_report(device="x", versions={}, phases=[], budget_s=480,
                                    runs={"run-ddp": {"error": "no run directory"}})  # fmt: skip
    assert empty["problems"] == ["no run measured anything"] and not empty["passed"]
    late = acceptance.build_report(device="x", versions={}, phases=[{"phase": "run-ddp", "seconds": 481}],
                                   budget_s=480, runs={})  # fmt: skip
    assert not late["within_budget"] and late["elapsed_s"] == 481


def test_other_tools_json_under_the_cache_is_skipped_without_a_traceback(tmp_path, capsys):
    """HF datasets' dataset_info.json and matplotlib's font list under XDG_CACHE_HOME (where the first GPU run's
    report raised a traceback): outside grpo-launch's calibration folder they are not read; one inside it is listed
    as skipped, with why; the calibration beside it is read."""
    from grpo_launch.machines.calibrated_speed import MeasuredTerms
    from grpo_launch.probe.calibration_store import CalibrationKey, CalibrationRecord, save_calibration

    cache = tmp_path / "cache"
    hf = cache / "huggingface" / "datasets" / "x" / "0.0.0" / "abc"
    hf.mkdir(parents=True)
    (hf / "dataset_info.json").write_text(json.dumps({"description": "", "features": {"prompt": {}}}))
    (cache / "matplotlib").mkdir()
    (cache / "matplotlib" / "fontlist-v390.json").write_text(json.dumps({"_version": 390, "ttflist": []}))
    terms = MeasuredTerms(device="NVIDIA H200", step_peak_bytes=3 * GIB, step_peak_predicted_bytes=2 * GIB)
    key = CalibrationKey("NVIDIA H200", "abc", "bfloat16", (("trl", "1.16.0"),))
    (saved,) = save_calibration(CalibrationRecord(key, terms), {"XDG_CACHE_HOME": str(cache)})
    shutil.copy(cache / "matplotlib" / "fontlist-v390.json", saved.parent)
    (saved.parent / "list.json").write_text("[1, 2]")  # valid JSON, not an object
    assert acceptance.report(tmp_path, tmp_path / "out.json") == 1  # no run measured: the acceptance did not pass
    doc = json.loads((tmp_path / "out.json").read_text())
    assert [c["file"] for c in doc["calibrations"]] == [saved.name]
    assert [c["file"] for c in doc["calibrations_skipped"]] == ["fontlist-v390.json", "list.json"]
    assert all("not a calibration this grpo-launch reads" in c["why"] for c in doc["calibrations_skipped"])
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err and "dataset_info" not in said.out + said.err
    assert "fontlist-v390.json is not a calibration: skipped" in said.out


def test_the_report_names_each_calibrations_memory_and_sync_against_the_model(tmp_path):
    """The calibrations the acceptance made, read back: the training step's peak against the memory model's tensors
    (with and without checkpointing), predicted ÷ measured, and the weight sync with its path."""
    from grpo_launch.machines.calibrated_speed import MeasuredTerms
    from grpo_launch.probe.calibration_store import CalibrationKey, CalibrationRecord, save_calibration

    terms = MeasuredTerms(device="NVIDIA H100 80GB HBM3", step_peak_bytes=4 * GIB, step_peak_predicted_bytes=2 * GIB,
                          step_peak_bytes_ckpt=2 * GIB, step_peak_predicted_bytes_ckpt=2 * GIB, sync_s=0.25,
                          sync_path="nccl")  # fmt: skip
    key = CalibrationKey("NVIDIA H100 80GB HBM3", "abc", "bfloat16", (("trl", "1.16.0"),))
    save_calibration(CalibrationRecord(key, terms), {"GRPO_LAUNCH_CALIBRATIONS": str(tmp_path / "cal")})
    (one,), skipped = acceptance.read_calibrations(tmp_path / "cal")
    assert skipped == [] and (one["sync_s"], one["sync_path"]) == (0.25, "nccl")
    assert [(p["checkpointing"], p["predicted_over_measured"]) for p in one["step_peak"]] == [(False, 0.5), (True, 1.0)]
    assert acceptance.read_calibrations(tmp_path / "none") == ([], [])

"""What a newcomer tripped over (issue 28): `run --gpus` on GPUs that are not here, plan-time checks of what the run
or vLLM would reject later, console lines and flags. Each test runs the CLI in-process, as a user would."""

from __future__ import annotations

import pytest

from grpo_launch.cli import main
from grpo_launch.errors import ConfigError
from grpo_launch.machines.topology import parse_gpu_spec

from .helpers import TINY_RECIPE, tiny_overrides


def test_run_with_gpus_that_are_not_here_is_refused_before_anything_starts(tmp_path, capsys):
    """The trainers used to die 8 s later with "Your setup doesn't support bf16/gpu"."""
    run = tmp_path / "run"
    argv = ["run", TINY_RECIPE, *tiny_overrides(tmp_path), "use_cpu=false", "--run-dir", str(run)]
    assert main([*argv, "--gpus", "4xL20-48GB"], environ={}) == 2
    err = capsys.readouterr().err
    assert "--gpus 4xL20-48GB describes GPUs that are not here" in err and "--dry-run" in err
    assert not run.exists()
    assert main([*argv, "--gpus", "4xL20-48GB", "--dry-run"], environ={}) == 0  # a dry run is what --gpus is for


def test_a_spec_that_disagrees_with_this_machines_gpus_is_refused_and_one_that_agrees_runs():
    """A GPU machine: ``here`` is what the probe would return on 8 H100s (fake: no GPU on this machine)."""
    from grpo_launch.cli.common import _refuse_simulated

    here = parse_gpu_spec("8xH100-80GB")
    _refuse_simulated("8xH100", parse_gpu_spec("8xH100"), here)
    for spec in ("4xH100-80GB", "8xA100-80GB", "2x8xH100-80GB", "cpu"):
        with pytest.raises(ConfigError, match=r"not here \(this machine: 8 × H100"):
            _refuse_simulated(spec, parse_gpu_spec(spec), here)
    _refuse_simulated("cpu", parse_gpu_spec("cpu"), parse_gpu_spec("cpu"))  # CPU on a CPU machine is what is here


def test_a_use_cpu_recipe_is_not_warned_that_nvml_is_missing(tmp_path, capsys):
    """No NVML driver on this machine: news for a GPU recipe, noise on every run of the use_cpu demo recipe."""
    from grpo_launch.probe.local import probe_local

    if not any("NVML" in w for w in probe_local({}).warnings):
        pytest.skip("this machine has an NVML driver")
    base = ["run", TINY_RECIPE, *tiny_overrides(tmp_path), "max_steps=3", "--dry-run", "--run-dir", str(tmp_path)]
    assert main(base, environ={}) == 0
    assert "NVML" not in capsys.readouterr().out
    assert main([*base, "use_cpu=false"], environ={}) == 0
    assert "NVML" in capsys.readouterr().out  # a recipe that did not ask for CPU is told why it gets one


QWEN = "recipes/qwen1.5b.yaml"


@pytest.mark.parametrize(
    ("overrides", "gpus", "says"),
    [
        (["reward_funcs=[nosuch]", "reward_weights=[1.0]"], "8xH100", "unknown reward 'nosuch'"),
        (["max_completion_length=100000"], "8xH100", "exceeds Qwen2.5-1.5B's 32768 positions"),
        ([], "8xV100", "V100-32GB GPUs have no bf16 arithmetic"),
        ([], "8xT4", "T4 GPUs have no bf16 arithmetic"),
    ],
)
@pytest.mark.parametrize("verb", [["plan", "--no-write"], ["run", "--dry-run"]])
def test_plan_and_dry_run_refuse_what_the_run_or_vllm_would(verb, overrides, gpus, says, tmp_path, capsys, monkeypatch):
    """The issue's commands: each used to plan (or dry-run) and fail only once the job had started."""
    from .helpers import ROOT

    monkeypatch.chdir(ROOT)
    argv = [verb[0], QWEN, *overrides, "--gpus", gpus, verb[1], "--run-dir", str(tmp_path / "run")]
    assert main(argv, environ={}) == 2
    assert says in capsys.readouterr().err


def test_the_builtin_tables_context_lengths_follow_the_models_configs():
    """max_position_embeddings as each model's config.json on the Hub says: Qwen2.5 -Instruct 32768, a base model
    the family's largest (never a refusal its config would allow)."""
    from grpo_launch.models.builtin import find_model_shape

    found = {m: find_model_shape(m).max_positions for m in (
        "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-Math-7B", "Qwen/Qwen3-8B",
        "meta-llama/Llama-3.1-8B-Instruct", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B")}  # fmt: skip
    assert found == {
        "Qwen/Qwen2.5-1.5B-Instruct": 32768,
        "Qwen/Qwen2.5-7B": 131072,
        "Qwen/Qwen2.5-Math-7B": 4096,
        "Qwen/Qwen3-8B": 40960,
        "meta-llama/Llama-3.1-8B-Instruct": 131072,
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": 131072,
    }


def _refusal(argv, capsys, monkeypatch) -> str:
    from .helpers import ROOT

    monkeypatch.chdir(ROOT)
    assert main(argv, environ={}) == 2
    return capsys.readouterr().err


def test_a_length_fix_fixes_the_length_and_uses_the_key_the_user_set(capsys, monkeypatch):
    """512 + 1024 over launch.vllm_max_model_len=1000: max_completion_length=500 (still over) used to be offered, and
    vllm_max_model_length (which launch.vllm_max_model_len overrides) could never plan."""
    err = _refusal(
        ["plan", QWEN, "--gpus", "8xH100", "--no-write", "launch.vllm_max_model_len=1000"], capsys, monkeypatch
    )
    assert "1. set launch.vllm_max_model_len=1536 (room for both)" in err
    assert "2. set max_completion_length=488 (shorter completions)" in err
    assert "then:" not in err and "=500" not in err and "Each change listed was planned again and fits." in err
    for fix in ("launch.vllm_max_model_len=1536", "max_completion_length=488"):
        assert main(["plan", QWEN, "--gpus", "8xH100", "--no-write", "launch.vllm_max_model_len=1000", fix],
                    environ={}) == 0  # fmt: skip


def test_a_fix_that_meets_the_same_problem_again_is_not_offered():
    from grpo_launch.errors import PlanError
    from grpo_launch.planning.refusal.verify import _same_problem

    error = PlanError("max_prompt_length=512 + max_completion_length=1024 exceed the vLLM max length 1000: vLLM …")
    assert _same_problem("max_prompt_length=512 + max_completion_length=500 exceed the vLLM max length 1000: x", error)
    assert not _same_problem("vLLM (colocate) does not fit: 7.1 GiB of weights", error)


def test_more_gpus_says_how_many(capsys, monkeypatch):
    """Qwen2.5-Math-7B colocated on 2 × A10: 3 is the first count that plans, and that plan is run to check."""
    err = _refusal(["plan", "recipes/qwen7b-math.yaml", "--gpus", "2xA10-24GB", "--no-write"], capsys, monkeypatch)
    assert "3 GPUs is the first count that plans (grpo-launch plan RECIPE --gpus 3xA10)" in err
    assert main(["plan", "recipes/qwen7b-math.yaml", "--gpus", "3xA10", "--no-write"], environ={}) == 0
    err = _refusal(["plan", "recipes/qwen7b-math.yaml", "--gpus", "2xA10", "--no-write"], capsys, monkeypatch)
    assert "--gpus 3xA10)" in err


def test_a_hostfile_without_gpu_models_is_told_to_name_them_not_to_use_gpus(tmp_path, capsys, monkeypatch):
    """--gpus is refused beside --hostfile, so it cannot be the fix."""
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=8\nnode2 slots=8\n")
    err = _refusal(["plan", QWEN, "--hostfile", str(hosts), "--no-write", "--ssh-option", "ConnectTimeout=1"], capsys,
                   monkeypatch)  # fmt: skip
    assert "name the hosts' GPUs in the hostfile: node1 slots=8 gpu=H100-80GB" in err and "--gpus" not in err


def test_generation_is_charged_once_per_generation_round(plan_of):
    """TRL 1.16 generates once every steps_per_generation × num_iterations micro-steps (grpo_trainer.py,
    ``_prepare_inputs``: ``generate_every``): with num_iterations=4 one generation serves 4 optimizer steps, and so
    do its weight sync and old log-probs; training is paid every step."""
    rows = "launch.dataset_rows=7200"  # whole steps at 8 prompts per step (7200 ÷ 8), so 4× is exact
    one = plan_of(QWEN, "8xH100-80GB", rows)
    four = plan_of(QWEN, "8xH100-80GB", rows, "num_iterations=4")
    s1, s4 = one.estimate.step, four.estimate.step
    assert s4.generation_s == pytest.approx(s1.generation_s / 4) and s4.sync_s == pytest.approx(s1.sync_s / 4)
    assert s4.training_s == pytest.approx(s1.training_s)
    # the whole run: 4× the steps (TRL's sampler repeats every batch 4 times), each with a quarter of a generation
    assert four.estimate.total.steps == 4 * one.estimate.total.steps
    expected = (
        4 * one.estimate.total.steps * (s1.generation_s / 4 + s1.old_logprobs_s / 4 + s1.training_s + s1.sync_s / 4)
    )
    assert four.estimate.total.hours * 3600 == pytest.approx(expected + four.estimate.restart_s, rel=1e-6)
    assert "a generation of 64 (8 prompts × 8) every 4 optimizer steps" in four.estimate.explain[0]


def test_a_step_of_part_of_a_prompt_group_names_the_generation_it_comes_from(plan_of):
    """The README's off-policy fix (steps_per_generation=8, 3 completions per optimizer step): the workload line
    printed "3 completions (0 prompts × 8)"."""
    plan = plan_of(QWEN, "4xL20-48GB", "launch.vllm_gpus=1", "per_device_train_batch_size=1",
                   "gradient_accumulation_steps=1", "steps_per_generation=8")  # fmt: skip
    on = plan_of(QWEN, "4xL20-48GB", "launch.vllm_gpus=1", "per_device_train_batch_size=1",
                 "gradient_accumulation_steps=8", "steps_per_generation=8")  # fmt: skip
    assert "3 completions; a generation of 24 (3 prompts × 8) every 8 optimizer steps" in plan.estimate.explain[0]
    assert "0 prompts" not in plan.estimate.explain[0]
    # the same generation round, paid over 8 steps instead of one
    assert plan.estimate.step.generation_s == pytest.approx(on.estimate.step.generation_s / 8)


def test_split_verdicts_name_their_step_and_none_follows_the_last_step(tmp_path):
    """At the 5th and every 20th step; the run's last step is followed by "training done" and the report, so a
    verdict there came after them (the demo's 60th step)."""
    import json

    from grpo_launch.analysis.split_verdict import split_verdict
    from grpo_launch.enums import VllmMode
    from grpo_launch.execute.watchdog import Watchdog

    metrics, seen = tmp_path / "metrics.jsonl", []
    dog = Watchdog(metrics)
    dog.on_split = lambda g, t: seen.append((dog.last_step, split_verdict(g, t, VllmMode.OFF, step=dog.last_step)))
    with metrics.open("a") as f:
        for i in range(1, 41):
            f.write(json.dumps({"step": i, "max_steps": 40, "step_s": 3.0, "generation_s": 2.0, "training_s": 1.0}))
            f.write("\n")
    dog()
    assert [step for step, _ in seen] == [5, 20]  # not 40: the last step
    assert seen[0][1].startswith("step split at step 5: generation 2.00 s, training 1.00 s")


def test_a_resume_of_a_tied_embedding_model_does_not_warn_of_the_tied_head(caplog):
    """transformers' Trainer logs the missing lm_head.weight at every resume of a tied model (trainer.py,
    ``_issue_warnings_after_load``); any other missing key still reaches the log."""
    import logging

    from grpo_launch.train.__main__ import TiedHeadFilter

    logger = logging.getLogger("transformers.trainer")
    tied = TiedHeadFilter()
    logger.addFilter(tied)
    try:
        with caplog.at_level(logging.WARNING, logger="transformers.trainer"):
            logger.warning("There were missing keys in the checkpoint model loaded: ['lm_head.weight'].")
            logger.warning("There were missing keys in the checkpoint model loaded: ['model.norm.weight'].")
    finally:
        logger.removeFilter(tied)
    assert [r.getMessage() for r in caplog.records] == [
        "There were missing keys in the checkpoint model loaded: ['model.norm.weight']."
    ]


def test_a_stop_on_request_does_not_say_training_finished(tmp_path):
    """The trainers exit 0 after a checkpoint-and-stop (a time limit, SIGUSR2): the launcher then says "stopped after
    step N", and "training finished" before it contradicted that. Stand-in trainer: a real process that exits 0."""
    import sys

    from grpo_launch.execute.session import SessionSpec, supervise
    from grpo_launch.execute.stop_channel import StopChannel
    from grpo_launch.rundir.control import mark_stopped
    from grpo_launch.rundir.layout import RunPaths
    from grpo_launch.spec import ProcessSpec

    trainer = ProcessSpec("train", (sys.executable, "-c", "pass"))
    paths = RunPaths(tmp_path)
    for stopped in (False, True):
        if stopped:
            paths.control.mkdir(exist_ok=True)
            mark_stopped(tmp_path, 65)
        out: list[str] = []
        session = SessionSpec(None, [trainer], tmp_path / "logs", grace_s=2, paths=paths)
        channel = StopChannel(paths.root, out.append)  # where the trainers' answer is read
        assert supervise(session, environ={"PATH": "/usr/bin:/bin"}, emit=out.append, channel=channel).exit_code == 0
        assert any("training finished" in line for line in out) is not stopped


def test_sbatch_takes_the_flags_run_takes_and_passes_them_to_the_job(capsys, monkeypatch):
    from .helpers import ROOT

    monkeypatch.chdir(ROOT)
    argv = ["sbatch", "recipes/qwen7b-math.yaml", "--nodes", "2", "--gpus-per-node", "8", "--gpu-type", "H100-80GB",
            "--dry-run", "--network-interface", "eth0", "--max-restarts", "3", "--gpu-hour-price", "2"]  # fmt: skip
    assert main(argv, environ={}) == 0
    job = next(line for line in capsys.readouterr().out.splitlines() if " -m grpo_launch run --slurm " in line)
    assert "launch.network_interface=eth0" in job and "launch.max_restarts=3" in job
    assert "launch.gpu_hour_price=2.0" in job


def test_a_gpu_hour_price_without_a_whole_run_says_why_there_is_no_cost(capsys, monkeypatch):
    from .helpers import ROOT

    monkeypatch.chdir(ROOT)
    unknown = "dataset_name=someone/rows-unknown-offline"  # not in probe.dataset.KNOWN_ROWS, and no Hub here
    offline = {"HF_HUB_OFFLINE": "1"}
    args = ["plan", QWEN, unknown, "--gpus", "8xH100", "--no-write", "--gpu-hour-price", "2"]
    assert main(args, environ=offline) == 0
    out = capsys.readouterr().out
    assert "notice: launch.gpu_hour_price=2 (--gpu-hour-price) shows no cost: 1 epoch(s) of a training set" in out
    assert main(["plan", QWEN, "--gpus", "8xH100", "--no-write", "--gpu-hour-price", "2", "max_steps=10"],
                environ={}) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "shows no cost" not in out and "at the given GPU-hour price" in out


def test_debug_works_after_the_verb_and_a_mistyped_verb_is_named(tmp_path, capsys):
    with pytest.raises(ConfigError):  # --debug: the traceback, wherever the flag stands
        main(["status", str(tmp_path), "--debug"], environ={})
    assert main(["stauts"], environ={}) == 2
    assert "unknown command 'stauts' (did you mean 'status'?)" in capsys.readouterr().err


def test_launch_num_processes_on_gpus_is_said_to_be_ignored(plan_of):
    plan = plan_of(QWEN, "8xH100-80GB", "launch.num_processes=4")
    assert any(n.startswith("launch.num_processes=4 is ignored") for n in plan.notices)
    assert plan.train.num_processes == 8


def test_sbatch_on_an_unconfigured_slurm_blames_the_set_up_not_the_partition(tmp_path):
    """Real sbatch (Slurm's client is installed here) with an empty slurm.conf, as on a machine where the package is
    installed but never configured."""
    import os
    import shutil
    import subprocess

    from grpo_launch.backends.slurm.sbatch import sbatch_hint

    if shutil.which("sbatch") is None:
        pytest.skip("no sbatch here: scripts/install_system_packages.sh installs slurm-wlm")
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    done = subprocess.run(["sbatch", "--parsable", "/dev/null"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SLURM_CONF": str(conf)})  # fmt: skip
    assert done.returncode != 0
    hint = sbatch_hint(done.stderr, "run/job.sbatch")
    assert "not set up or not reachable" in hint and "partition" not in hint
    assert "partition" in sbatch_hint("sbatch: error: invalid partition specified: gpu", "run/job.sbatch")


def test_the_live_step_line_is_not_cut_to_20_characters_on_a_terminal_of_0_columns(monkeypatch):
    """`script` and some `srun --pty` give a terminal that reports 0 columns: a real pseudo-terminal here, whose size
    is never set, reports that too. The live line falls back to COLUMNS, else 80."""
    import os
    import pty

    from grpo_launch.cli.console import Console

    leader, follower = pty.openpty()
    try:
        assert os.get_terminal_size(follower).columns == 0
        line = "[train] step 1/3 done in 0.12 s (generation 0.09 s, training 0.04 s) | " + "reward 0.185 | " * 8
        for columns, width in ((None, 80), ("120", 120)):
            if columns is None:
                monkeypatch.delenv("COLUMNS", raising=False)
            else:
                monkeypatch.setenv("COLUMNS", columns)
            with os.fdopen(os.dup(follower), "w") as stream:
                Console(stream, live=True)(line)
            written = os.read(leader, 4096).decode()
            assert written == "\r\x1b[2K" + line[: width - 1]
    finally:
        os.close(leader)
        os.close(follower)


def test_each_fix_of_the_readmes_refusal_keeps_the_users_split(plan_of):
    """The README's refusal (4 × L20, launch.vllm_gpus=1, one completion per device and step): each fix, applied to the
    user's own overrides, plans a server on 1 GPU beside 3 trainers, never another split; the off-policy one says
    how many optimizer steps one generation serves."""
    user = ("launch.vllm_gpus=1", "per_device_train_batch_size=1", "gradient_accumulation_steps=1",
            "steps_per_generation=1")  # fmt: skip
    fixes = (
        ("steps_per_generation=8", "gradient_accumulation_steps=8"),
        ("per_device_train_batch_size=8",),
        ("num_generations=3",),
        ("steps_per_generation=8",),
    )
    for fix in fixes:
        keys = {f.split("=")[0] for f in fix}
        plan = plan_of(QWEN, "4xL20-48GB", *[u for u in user if u.split("=")[0] not in keys], *fix)
        assert (plan.vllm.mode, len(plan.vllm.gpus), plan.train.num_processes) == ("server", 1, 3), fix
    assert "a generation of 24 (3 prompts × 8) every 8 optimizer steps" in plan.estimate.explain[0]

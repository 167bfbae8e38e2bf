"""``grpo-launch resume RUN_DIR``: the run directory's record of the command that started the run
(rundir/invocation.py), running it again through the real CLI (``grpo_launch.cli.main``), what it refuses (the resume
path fuzzed: missing, corrupt, foreign run directories, a recipe changed since, a checkpoint of another model: each
exit 2, a message naming the file or key and the fix, and not one byte of the run directory changed), ``status``'s
hint, and the dry run in a run's directory.

The recorded run directories of the table are a real ``grpo-launch plan`` of the tiny CPU recipe, with the record,
attempt, metrics and checkpoint files a stopped run leaves written by the test (the checkpoint's config.json is the
tiny model's own). The last test is a real CPU run stopped by SIGUSR2 and continued by the printed hint."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_launch.cli import main, parse
from grpo_launch.cli.common import invocation_of, record_invocation
from grpo_launch.enums import RunState
from grpo_launch.rundir.invocation import REDACTED, Flag, Invocation, read_invocation, write_invocation
from grpo_launch.rundir.json_fields import RunFileError
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.records import Attempt, StepRecord, append
from grpo_launch.spec import RunContext

from .helpers import ROOT, TINY_RECIPE, ensure_tiny_assets, tiny_overrides


def ctx() -> RunContext:
    return RunContext.current(os.environ, print)


# ------------------------------------------------------------------------------------------------- the record


def test_the_record_holds_every_flag_as_given_and_its_argv_parses_back_to_the_same_command():
    argv = ["run", "recipes/tiny-cpu.yaml", "max_steps=5", "--gpus", "cpu", "--max-restarts", "2", "--hostfile", "h",
            "--ssh-option", "A=b", "--ssh-option", "C=d", "--slurm", "--adapt", "--run-dir", "R",
            "max_completion_length=300", "--dry-run", "--resume", "never"]  # fmt: skip
    args = parse(argv)
    record = invocation_of(args, "ssh", "R", ctx())
    assert record.overrides == ("max_steps=5", "max_completion_length=300")
    flags = {(f.flag, f.value) for f in record.flags}
    assert {("--gpus", "cpu"), ("--max-restarts", "2"), ("--hostfile", "h"), ("--slurm", None), ("--adapt", None),
            ("--ssh-option", "A=b"), ("--ssh-option", "C=d"), ("--run-dir", "R")} == flags  # fmt: skip
    # --dry-run and --resume are about this start, not the run: never recorded (resume never sets checkpoints aside)
    assert record.run_dir == os.path.abspath("R") and record.workdir == os.getcwd() and record.backend == "ssh"
    again = invocation_of(parse(record.argv), "ssh", "R", ctx())
    assert again == record
    assert Invocation.from_json(json.loads(json.dumps(record.to_json())), "f") == record
    assert shlex.split(record.command)[1:] == record.argv


@pytest.mark.parametrize(
    ("given", "kept", "redacted"),
    [
        (["hub_token=hf_abcdefghijklmnopqrstuvwxyz"], [f"hub_token={REDACTED}"], ["hub_token"]),
        (["launch.train_env.WANDB_API_KEY=x1"], [f"launch.train_env.WANDB_API_KEY={REDACTED}"],
         ["launch.train_env.WANDB_API_KEY"]),
        (["launch.train_env.HF_TOKEN=abc"], [f"launch.train_env.HF_TOKEN={REDACTED}"], ["launch.train_env.HF_TOKEN"]),
        (["system_prompt=sk-abcdefghijklmnopqrstuv"], [f"system_prompt={REDACTED}"], ["system_prompt"]),
        (["learning_rate=1e-3", "num_generations=8"], ["learning_rate=1e-3", "num_generations=8"], []),
    ],
)  # fmt: skip
def test_secrets_are_never_recorded(given, kept, redacted):
    record = Invocation.of("run", "r.yaml", given, [], backend="local", run_dir="/r", workdir="/", version="0")
    assert list(record.overrides) == kept and list(record.redacted) == redacted


def test_secret_looking_flag_and_batch_system_values_are_redacted_not_ssh_options():
    flags = [Flag("--ssh-option", "PasswordAuthentication=no"), Flag("--ssh-option", "ApiToken=ghp_" + "a" * 30),
             Flag("--ray", "hf_" + "b" * 30)]  # fmt: skip
    record = Invocation.of("sbatch", "r.yaml", [], flags, extra_args=("--comment=hf_" + "c" * 30, "--qos=high"),
                           backend="slurm", run_dir="/r", workdir="/", version="0")  # fmt: skip
    assert [f.value for f in record.flags] == ["PasswordAuthentication=no", f"ApiToken={REDACTED}", REDACTED]
    assert record.extra_args == (f"--comment={REDACTED}", "--qos=high")  # the flag kept, its value not
    assert "hf_" not in json.dumps(record.to_json()) and "ghp_" not in json.dumps(record.to_json())


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d.pop("workdir"), "key 'workdir' is missing"),
        (lambda d: d.update(overrides="max_steps=5"), "key 'overrides' must be a list"),
        (lambda d: d.update(overrides=[5]), "key 'overrides[0]' must be a string"),
        (lambda d: d.update(flags=[["--gpus"]]), "key 'flags[0]' must be a [flag, value or null] pair"),
        (lambda d: d.update(flags=[["gpus", "cpu"]]), "key 'flags[0]'"),
    ],
)
def test_a_record_that_does_not_read_names_its_key(tmp_path, edit, needle):
    data = Invocation.of("run", "r.yaml", [], [], backend="local", run_dir="/r", workdir="/", version="0").to_json()
    edit(data)
    (tmp_path / "invocation.json").write_text(json.dumps(data))
    with pytest.raises(RunFileError, match=None) as err:
        read_invocation(tmp_path / "invocation.json")
    assert needle in err.value.message and "invocation.json" in err.value.message


# ----------------------------------------------------------------------------------- a recorded run directory


def recorded_run(tmp_path: Path, recipe: str = TINY_RECIPE, *extra: str) -> Path:
    """A run of the tiny recipe (max_steps=6, 1 process) stopped after a checkpoint at step 2: the real plan files,
    the command's record, an attempt, two step records and checkpoint-2 with the tiny model's config.json."""
    run = tmp_path / "run dir's"  # a space and a quote: every printed command must be shell-quoted
    overrides = [*tiny_overrides(tmp_path), "max_steps=6", "launch.num_processes=1", *extra]
    with contextlib.redirect_stdout(io.StringIO()):  # the plan's table: not what the tests read
        assert main(["plan", recipe, *overrides, "--run-dir", str(run)]) == 0
    write_invocation(invocation_of(parse(["run", recipe, *overrides, "--run-dir", str(run)]), "local", str(run), ctx()))
    paths = RunPaths(run)
    for step in (1, 2):
        append(paths.metrics, StepRecord(step=step, step_s=0.5, max_steps=6, time=time.time()))
    append(paths.attempts, Attempt(1, time.time(), RunState.STOPPED_FOR_CHECKPOINT, 0))
    checkpoint = run / "output" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    shutil.copy(ensure_tiny_assets() / "model" / "config.json", checkpoint / "config.json")
    return run


def digest(root: Path) -> dict[str, str]:
    """Every file and directory under ``root``, with its content's hash."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def changed_recipe(tmp_path: Path, **values) -> str:
    """A copy of the tiny recipe with ``values`` changed."""
    import yaml

    recipe = yaml.safe_load(Path(TINY_RECIPE).read_text())
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe | values))
    return str(path)


def _missing(tmp_path):
    return tmp_path / "nowhere"


def _not_a_run_dir(tmp_path):
    (tmp_path / "somedir").mkdir()
    (tmp_path / "somedir" / "notes.txt").write_text("mine")
    return tmp_path / "somedir"


def _no_record(tmp_path):
    run = recorded_run(tmp_path)
    (run / "invocation.json").unlink()
    return run


def _corrupt_record(tmp_path):
    run = recorded_run(tmp_path)
    (run / "invocation.json").write_text('{"verb": "run", ')
    return run


def _record_without_a_key(tmp_path):
    run = recorded_run(tmp_path)
    edit_json(run / "invocation.json", lambda d: d.pop("recipe"))
    return run


def _corrupt_plan(tmp_path):
    run = recorded_run(tmp_path)
    (run / "plan.json").write_text("[1, 2")
    return run


def _plan_without_a_key(tmp_path):
    run = recorded_run(tmp_path)
    edit_json(run / "plan.json", lambda d: d.pop("layout"))
    return run


def _copied_run_dir(tmp_path):
    run = recorded_run(tmp_path)
    return Path(shutil.copytree(run, tmp_path / "copy"))


def _another_recipes_record(tmp_path):
    run = recorded_run(tmp_path)
    edit_json(run / "invocation.json", lambda d: d.update(recipe=str(ROOT / "recipes" / "qwen1.5b.yaml")))
    return run


def _not_a_run_verb(tmp_path):
    run = recorded_run(tmp_path)
    edit_json(run / "invocation.json", lambda d: d.update(verb="status"))
    return run


def _workdir_gone(tmp_path):
    run = recorded_run(tmp_path)
    edit_json(run / "invocation.json", lambda d: d.update(workdir=str(tmp_path / "gone")))
    return run


def _secret_on_the_command(tmp_path):
    run = recorded_run(tmp_path)
    record = read_invocation(run / "invocation.json")
    assert record is not None
    secret = ["launch.train_env.WANDB_API_KEY=0123456789abcdef"]
    write_invocation(Invocation.of(record.verb, record.recipe, [*record.overrides, *secret], list(record.flags),
                                   backend=record.backend, run_dir=record.run_dir, workdir=record.workdir,
                                   version=record.version))  # fmt: skip
    assert "0123456789abcdef" not in (run / "invocation.json").read_text()
    return run


def _recipe_changed(tmp_path):
    recipe = changed_recipe(tmp_path)
    run = recorded_run(tmp_path, recipe)
    changed_recipe(tmp_path, learning_rate=2e-3, num_generations=8, beta=0.04)
    return run


def _model_changed(tmp_path):
    recipe = changed_recipe(tmp_path)
    run = recorded_run(tmp_path, recipe)
    keep = [o for o in json.loads((run / "invocation.json").read_text())["overrides"] if "model_name" not in o]
    edit_json(run / "invocation.json", lambda d: d.update(overrides=keep))
    changed_recipe(tmp_path, model_name_or_path=str(ensure_tiny_assets() / "moe-model"))
    return run


def _checkpoint_of_another_model(tmp_path):
    run = recorded_run(tmp_path)
    edit_json(run / "output" / "checkpoint-2" / "config.json",
              lambda d: d.update(hidden_size=64, architectures=["LlamaForCausalLM"], model_type="llama"))  # fmt: skip
    return run


FUZZ = [
    (_missing, ["no run directory", "Give the directory a run was started in"]),
    (_not_a_run_dir, ["is not a run directory: it has no invocation.json and no plan.json"]),
    (_no_record, ["invocation.json is missing", "Run the command that started it again, with --run-dir"]),
    (_corrupt_record, ["invocation.json: not JSON", "Start the run again with its command"]),
    (_record_without_a_key, ["invocation.json: key 'recipe' is missing", "Start the run again"]),
    (_corrupt_plan, ["plan.json: not JSON", "move it aside"]),
    (_plan_without_a_key, ["plan.json: key 'layout' is missing", "move it aside"]),
    (_copied_run_dir, ["records a run in", "(a copied or moved run directory?)", "grpo-launch resume"]),
    (_another_recipes_record, ["names recipe", "qwen1.5b.yaml", "planned from", "not of the same run"]),
    (_not_a_run_verb, ["key 'verb' is 'status'", "start the run again"]),
    (_workdir_gone, ["key 'workdir' names", "which is not a directory", "Resume on the machine"]),
    (_secret_on_the_command, ["secrets on it (launch.train_env.WANDB_API_KEY)", "Give them through the environment"]),
    (_recipe_changed, ["would change its algorithm or model", "learning_rate: 0.001 → 0.002",
                       "num_generations: 4 → 8", "beta: null → 0.04", "--force"]),
    (_model_changed, ["would change its algorithm or model", "model_name_or_path:", "moe-model"]),
    (_checkpoint_of_another_model, ["checkpoint-2/config.json was saved from another model",
                                    "model_type: \"llama\" → \"qwen2\"", "hidden_size: 64 → 128",
                                    "--resume never"]),
]  # fmt: skip


@pytest.mark.parametrize(("make", "needles"), FUZZ, ids=[f.__name__.strip("_") for f, _ in FUZZ])
@pytest.mark.parametrize("dry_run", [False, True])
def test_resume_refuses_what_cannot_continue_the_run_and_writes_nothing(tmp_path, capsys, make, needles, dry_run):
    run = make(tmp_path)
    before = digest(run)
    code = main(["resume", str(run), *(["--dry-run"] if dry_run else [])])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("grpo-launch: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    assert digest(run) == before  # nothing in the run directory written, moved or overwritten


def test_force_continues_a_run_whose_recipe_changed_and_says_what_changed(tmp_path, capsys):
    run = _recipe_changed(tmp_path)
    assert main(["resume", str(run), "--force", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# --force: continuing the run with changed values (key: recorded → now):" in out
    assert "#   learning_rate: 0.001 → 0.002" in out


def test_a_checkpoint_of_another_model_is_refused_even_with_force(tmp_path, capsys):
    run = _checkpoint_of_another_model(tmp_path)
    assert main(["resume", str(run), "--force"]) == 2
    assert "was saved from another model" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ the dry run and status


def test_resume_dry_run_says_where_it_continues_and_its_commands_read_the_files_it_wrote(tmp_path, capsys):
    run = recorded_run(tmp_path)
    old_recipe = (run / "trainer_recipe.yaml").read_text()
    assert main(["resume", str(run), "--dry-run"]) == 0
    out = capsys.readouterr().out
    record = read_invocation(run / "invocation.json")
    assert record is not None and f"# resume {run}: {record.command}" in out
    assert "# resume: from checkpoint-2 (the next step is 3)" in out
    (plans,) = (run / "plans").iterdir()
    (train,) = [line for line in out.splitlines() if "accelerate.commands.launch" in line]
    argv = shlex.split(train)
    assert argv[argv.index("--recipe") + 1] == str(plans / "trainer_recipe.yaml")
    assert argv[argv.index("--config_file") + 1] == str(plans / "accelerate_config.yaml")
    assert f"GRPO_LAUNCH_RUN_DIR={run}" in argv  # the processes report to the run directory itself
    assert json.loads((plans / "plan.json").read_text())["run_dir"] == str(run)
    assert (run / "trainer_recipe.yaml").read_text() == old_recipe  # the run's files are kept


def test_run_dry_run_in_a_runs_directory_shows_the_resume_decision_and_the_change(tmp_path, capsys):
    recipe = changed_recipe(tmp_path)
    run = recorded_run(tmp_path, recipe)
    changed_recipe(tmp_path, max_completion_length=32)
    overrides = [*tiny_overrides(tmp_path), "max_steps=6", "launch.num_processes=1"]
    assert main(["run", recipe, *overrides, "--run-dir", str(run), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# resume: from checkpoint-2 (the next step is 3)" in out
    assert "# warning: the recipe differs from the run recorded in" in out
    assert "#   max_completion_length: 16 → 32" in out


@pytest.mark.parametrize(
    ("extra", "length", "said"),
    [
        ([], "max_steps=10", "max_steps 6 → 10 since the run's record, and lr_scheduler_type linear runs over the "
                             "training's length: from checkpoint-2 the learning rate follows a schedule over 10 steps, "
                             "not the one over 6"),  # TRL's default schedule
        (["lr_scheduler_type=cosine"], "max_steps=10", "and lr_scheduler_type cosine runs over the training's length"),
        (["lr_scheduler_type=constant_with_warmup", "warmup_steps=0.5"], "max_steps=10",
         "its warmup is a fraction of the training's length (warmup_steps 0.5: 3 → 5 steps)"),
        (["lr_scheduler_type=constant_with_warmup", "warmup_steps=0.1"], "max_steps=10", None),  # 1 step in both
        (["lr_scheduler_type=constant_with_warmup", "warmup_steps=3"], "max_steps=10", None),
        (["lr_scheduler_type=constant", "warmup_steps=0.5"], "max_steps=10", None),  # built without a warmup
        ([], "max_steps=3", None),  # one step more: at the rate the checkpoint saved
        ([], "max_steps=-1", "max_steps 6 → num_train_epochs 3 since the run's record, and lr_scheduler_type linear "
                             "runs over the training's length: from checkpoint-2 the learning rate follows the new "
                             "length's schedule"),  # epochs (TRL's default 3) in place of max_steps
    ],
)  # fmt: skip
def test_another_length_in_a_runs_directory_says_what_it_does_to_the_learning_rate(tmp_path, capsys, extra, length,
                                                                                   said):  # fmt: skip
    """max_steps 6 → another length over the recorded run's checkpoint-2: a schedule whose rates after the checkpoint
    depend on the length is said (a warning on run and resume, never a refusal); one whose rates do not is not."""
    run = recorded_run(tmp_path, TINY_RECIPE, *extra)
    overrides = [*tiny_overrides(tmp_path), length, "launch.num_processes=1", *extra]
    assert main(["run", TINY_RECIPE, *overrides, "--run-dir", str(run), "--dry-run"]) == 0
    out = capsys.readouterr().out
    warning = [line for line in out.splitlines() if "since the run's record" in line]
    if said is None:
        assert warning == [], out
        return
    (line,) = warning
    assert line.startswith("# warning: ") and said in line
    assert "keep max_steps=6" in line and "--resume never" in line


def test_nothing_saved_is_said(tmp_path, capsys):
    run = recorded_run(tmp_path)
    shutil.rmtree(run / "output" / "checkpoint-2")
    assert main(["resume", str(run), "--dry-run"]) == 0
    out = capsys.readouterr().out
    said = f"# resume: nothing was saved (no complete checkpoint in {run / 'output'}): it starts over from step 0"
    assert said in out


def test_status_after_a_stop_prints_the_resume_command_shell_quoted(tmp_path, capsys):
    run = recorded_run(tmp_path)
    assert main(["status", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["resume"] == shlex.join(["grpo-launch", "resume", str(run)])
    assert shlex.split(data["resume"]) == ["grpo-launch", "resume", str(run)]
    assert data["resume_from"] == "from checkpoint-2 (the next step is 3)"


def test_status_of_a_run_without_a_record_says_what_its_command_lacks(tmp_path, capsys):
    run = _no_record(tmp_path)
    assert main(["status", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["resume"] == shlex.join(["grpo-launch", TINY_RECIPE, "--run-dir", str(run)])
    assert "the run's command was not recorded" in data["resume_from"]


# ---------------------------------------------------------------------------------------- submitted runs


def test_sbatch_records_its_command_and_the_jobs_own_run_keeps_it(tmp_path, capsys):
    """What ``sbatch`` writes before it submits (the submission itself needs a Slurm cluster: tests/
    test_slurm_cluster.py), and the job's ``run --slurm`` inside the allocation, which keeps that record."""
    from grpo_launch.backends.submission import write_submission
    from grpo_launch.cli.submitting import plan_submission

    run = tmp_path / "run"
    overrides = [*tiny_overrides(tmp_path), "max_steps=6"]
    args = parse(["sbatch", TINY_RECIPE, *overrides, "--nodes", "1", "--time", "01:00:00", "--max-restarts", "2",
                  "--run-dir", str(run), "--", "--qos=high"])  # fmt: skip
    planned = plan_submission(args, ctx(), "sbatch")
    write_submission(planned, ctx())
    record = read_invocation(run / "invocation.json")
    assert record is not None
    assert (record.verb, record.backend, record.extra_args) == ("sbatch", "slurm", ("--qos=high",))
    flags = {(f.flag, f.value) for f in record.flags}
    assert {("--nodes", "1"), ("--time", "01:00:00"), ("--max-restarts", "2")} <= flags
    inside = parse(["run", "--slurm", TINY_RECIPE, *overrides, "launch.max_restarts=2", "--run-dir", str(run)])
    record_invocation(inside, "slurm", str(run), ctx())
    assert read_invocation(run / "invocation.json") == record  # resuming submits the job again
    assert main(["resume", str(run), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --time=01:00:00" in out and "#SBATCH --qos=high" in out
    assert "# resume: nothing was saved" in out


# ------------------------------------------------------------------------------------------ a real CPU run


@pytest.mark.slow
def test_a_stopped_run_continues_by_the_printed_hint_with_its_overrides(tmp_path):
    """A real CPU run with an override the recipe does not have (max_completion_length=24), stopped by SIGUSR2
    after step 2 (it checkpoints and stops); then the command `status` prints, run as printed (shlex.split) from
    another directory, continues the same run: the override kept, the checkpoint loaded, the steps after it."""
    run = tmp_path / "my run"
    argv = [*tiny_overrides(tmp_path), "max_steps=8", "save_steps=1000", "max_completion_length=24",
            "launch.num_processes=1", "--run-dir", str(run)]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "grpo_launch", TINY_RECIPE, *argv], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "] step 2/8 done" in line:
            proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=300) == 0, "".join(lines)[-3000:]
    stopped = int((run / "control" / "stopped-at-step").read_text())
    assert 2 <= stopped < 8 and (run / "output" / f"checkpoint-{stopped}").is_dir()

    status = subprocess.run([sys.executable, "-m", "grpo_launch", "status", str(run), "--json"], cwd=ROOT,
                            capture_output=True, text=True)  # fmt: skip
    hint = json.loads(status.stdout)["resume"]
    words = shlex.split(hint)
    assert words[:2] == ["grpo-launch", "resume"]
    resumed = subprocess.run([sys.executable, "-m", "grpo_launch", *words[1:]], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert f"resume: from checkpoint-{stopped} (the next step is {stopped + 1})" in out
    assert f"resuming from {run / 'output' / f'checkpoint-{stopped}'}" in out
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"step_s"' in x]
    assert steps == list(range(1, 9)), steps  # the steps after the checkpoint, each once
    values = json.loads((run / "plan.json").read_text())["trainer_values"]
    assert (values["max_completion_length"], values["max_steps"]) == (24, 8)  # the override kept
    assert (run / "output" / "model.safetensors").is_file()


@pytest.mark.extended
@pytest.mark.slow
def test_a_finished_run_run_longer_trains_as_the_warning_says(tmp_path):
    """A real CPU run of 2 steps (linear schedule, checkpoint at step 2), then the same command with max_steps=4:
    the warning is printed, step 3 trains at the rate the checkpoint saved (0: the 2-step schedule's end) and step 4
    at the 4-step schedule's rate for step 3 (a quarter of learning_rate), as the trainers log them."""
    run = tmp_path / "run"
    base = [*tiny_overrides(tmp_path), "save_steps=2", "launch.num_processes=1", "--run-dir", str(run)]

    def launch(steps: int) -> str:
        done = subprocess.run([sys.executable, "-m", "grpo_launch", TINY_RECIPE, *base, f"max_steps={steps}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        return done.stdout + done.stderr

    assert "warning: max_steps" not in launch(2)
    out = launch(4)
    assert "warning: max_steps 2 → 4 since the run's record, and lr_scheduler_type linear runs over the" in out
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: r["log"]["learning_rate"] for r in logged if "learning_rate" in r.get("log", {})}
    assert rates[1] == pytest.approx(1e-3) and rates[2] == pytest.approx(0.5e-3)  # the 2-step schedule
    assert rates[3] == 0.0 and rates[4] == pytest.approx(0.25e-3)  # the saved rate, then the 4-step schedule


def test_a_run_held_by_a_launcher_is_not_resumed_twice(tmp_path, capsys):
    from grpo_launch.rundir.files import RunLock

    run = recorded_run(tmp_path)
    with RunLock(run):
        before = digest(run)
        assert main(["resume", str(run)]) == 1
        assert "is in use by another grpo-launch run (pid" in capsys.readouterr().err
        assert digest(run) == before


def test_a_plain_run_over_a_corrupt_plan_json_warns_and_rewrites_it(tmp_path, capsys):
    """`run` (not `resume`) in a run's directory whose plan.json does not read: the run writes a new one; only
    `resume`, which needs it to compare, refuses."""
    run = _corrupt_plan(tmp_path)
    overrides = [*tiny_overrides(tmp_path), "max_steps=6", "launch.num_processes=1"]
    assert main(["run", TINY_RECIPE, *overrides, "--run-dir", str(run), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# warning: " in out and "plan.json: not JSON" in out
    assert "# resume: from checkpoint-2 (the next step is 3)" in out


def test_resume_never_says_it_starts_over(tmp_path, capsys):
    run = recorded_run(tmp_path)
    overrides = [*tiny_overrides(tmp_path), "max_steps=6", "launch.num_processes=1"]
    assert main(["run", TINY_RECIPE, *overrides, "--run-dir", str(run), "--dry-run", "--resume", "never"]) == 0
    assert "# resume: --resume never: it starts over from step 0" in capsys.readouterr().out

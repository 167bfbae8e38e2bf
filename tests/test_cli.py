"""The CLI's contract: exit 0 with a plan, 2 with one clear line on bad input, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_launch.cli import main

from .helpers import ROOT, ensure_tiny_assets

QWEN = str(ROOT / "recipes" / "qwen1.5b.yaml")


def run_cli(*args, env=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "grpo_launch", *args], capture_output=True, text=True, env=full_env, cwd=ROOT, timeout=60
    )


def test_plan_json_and_files(tmp_path, capsys):
    # Seed case 1: vLLM on one of 4 × L20 (the user's choice), 3 trainers.
    args = ["plan", QWEN, "launch.vllm_gpus=1", "--gpus", "4xL20-48GB", "--run-dir", str(tmp_path), "--json"]
    assert main(args, environ={}) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layout"]["num_generations"] == 8 and data["vllm"]["gpus"] == ["3"]
    assert {p.name for p in tmp_path.iterdir()} == {"plan.json", "accelerate_config.yaml", "trainer_recipe.yaml"}


def test_plan_table(tmp_path, capsys):
    args = ["plan", QWEN, "launch.vllm=server", "--gpus", "8xH100-80GB", "--run-dir", str(tmp_path)]
    assert main(args, environ={}) == 0
    out = capsys.readouterr().out
    assert "Batch layout" in out and "vllm serve Qwen/Qwen2.5-1.5B-Instruct" in out and "Why" in out


def test_overrides_reach_the_plan(tmp_path, capsys):
    rc = main(
        [
            "plan",
            QWEN,
            "num_generations=6",
            "per_device_train_batch_size=2",
            "--gpus",
            "4xL20-48GB",
            "--no-write",
            "--json",
        ],
        environ={},
    )
    assert rc == 0
    lay = json.loads(capsys.readouterr().out)["layout"]
    assert lay["num_generations"] == 6 and lay["generation_batch_size"] % 6 == 0


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["plan", "missing.yaml"], {}, "recipe 'missing.yaml' not found"),
        (["plan", QWEN, "num_generation=4"], {}, "did you mean 'num_generations'"),
        (["plan", QWEN, "per_device_train_batch_size=0"], {}, "must be a positive integer"),
        (["plan", QWEN, "max_steps"], {}, "key=value"),
        (["plan", QWEN, "--gpus", "lots"], {}, "cannot read --gpus 'lots'"),
        (["plan", QWEN], {"CUDA_VISIBLE_DEVICES": "zero"}, "CUDA_VISIBLE_DEVICES='zero'"),
        (["plan", QWEN, "steps_per_generation=1", "--gpus", "4xL20-48GB"], {}, "no valid batch layout"),
        (["plan", QWEN, "launch.vllm=server", "--gpus", "cpu"], {}, "needs CUDA GPUs"),
    ],
)
def test_bad_input_exits_2_without_traceback(args, env, needle):
    proc = run_cli(*args, "--no-write", env=env)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("grpo-launch: error: ")


def test_malformed_yaml_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_generations: [8\n")
    proc = run_cli("plan", str(bad), "--no-write")
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr and "line 2" in proc.stderr


def test_inspect(capsys):
    assert main(["inspect", "--gpus", "2x8xH100-80GB", "--json"], environ={}) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["hosts"]) == 2 and len(data["hosts"][1]["gpus"]) == 8


def test_help_lists_examples():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "grpo-launch plan recipes/qwen1.5b.yaml --gpus 4xL20-48GB" in proc.stdout


def test_each_verbs_help_is_its_own(capsys):
    """Issue 41: each verb's help shows its own examples only, flags' values are named plainly (not the namespaced
    dest SBATCHOPTIONS.NODES), an optional key=value is not called required, and the global run example says what
    tiny-cpu.yaml runs."""
    from grpo_launch.cli import VERBS, build_parser
    from grpo_launch.cli.common import EPILOG
    from grpo_launch.recipe import load_recipe

    for verb in VERBS:
        text = build_parser(verb)._subparsers._group_actions[0].choices[verb].format_help()  # type: ignore[union-attr]
        assert "OPTIONS." not in text, f"{verb} --help: {text}"
        shown = [line.split()[1] for line in text.splitlines() if line.startswith("  grpo-launch ")]
        assert all(w == verb or (verb == "run" and w.endswith(".yaml")) for w in shown), (verb, shown)
    proc = run_cli("plan")
    said = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and said.endswith("required: recipe"), said
    tiny = next(line for line in EPILOG.splitlines() if "tiny-cpu.yaml" in line)
    vllm = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml").launch.vllm.value
    assert ("vLLM off" in tiny) == (vllm == "off"), (tiny, vllm)


def test_plan_path_imports_no_heavy_module():
    """`grpo-launch plan` must not import torch/trl/transformers/deepspeed/accelerate (speed)."""
    code = (
        "import sys; from grpo_launch.cli import main; "
        f"rc = main(['plan', {QWEN!r}, '--gpus', '8xH100-80GB', '--no-write', '--json']); "
        "heavy = [m for m in ('torch', 'trl', 'transformers', 'deepspeed', 'accelerate') if m in sys.modules]; "
        "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stderr


def test_plan_without_a_stored_calibration_reads_no_library_versions(tmp_path):
    """With no calibration stored, `plan` does not build a calibration key: reading the installed libraries' versions
    (importlib.metadata, with email and zipfile) and hashing the model's shape cost about a fifth of its start-up
    (scripts/bench_plan.py: 4.0× `import yaml` with them, 3.0× without)."""
    code = (
        "import sys; from grpo_launch.cli import main; "
        f"rc = main(['plan', {QWEN!r}, '--gpus', '8xH100-80GB', '--no-write', '--json']); "
        "print('LOADED', [m for m in ('importlib.metadata', 'hashlib') if m in sys.modules], file=sys.stderr); "
        "sys.exit(rc)"
    )
    env = {**os.environ, "GRPO_LAUNCH_CALIBRATIONS": str(tmp_path / "none-here"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stderr, proc.stderr[-2000:]


def test_run_slurm_outside_an_allocation(capsys):
    assert main(["run", "--slurm", QWEN, "--dry-run"], environ={"CUDA_VISIBLE_DEVICES": ""}) == 2
    err = capsys.readouterr().err
    assert "not inside a Slurm allocation" in err and "grpo-launch sbatch" in err


def test_sbatch_needs_a_gpu_count_on_a_machine_without_gpus(capsys):
    assert main(["sbatch", QWEN, "--nodes", "2", "--dry-run"], environ={"CUDA_VISIBLE_DEVICES": ""}) == 2
    assert "--gpus-per-node" in capsys.readouterr().err


def test_sbatch_refuses_a_plan_that_cannot_run_before_submitting(capsys):
    args = [
        "sbatch",
        QWEN,
        "launch.vllm=server",
        "launch.vllm_gpus=4",
        "--nodes",
        "1",
        "--gpus-per-node",
        "4",
        "--gpu-type",
        "H100",
    ]
    assert main([*args, "--dry-run"], environ={"CUDA_VISIBLE_DEVICES": ""}) == 2
    assert "leaving none of the 4 for training" in capsys.readouterr().err


def test_sbatch_dry_run_prints_the_script_and_passes_extra_args(tmp_path, capsys):
    args = ["sbatch", QWEN, "--nodes", "2", "--gpus-per-node", "8", "--gpu-type", "H100-80GB", "max_steps=5"]
    rc = main([*args, "--run-dir", str(tmp_path / "r"), "--dry-run", "--", "--qos=high"], environ={})
    assert rc == 0
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=2\n" in out and "#SBATCH --gpus-per-node=8\n" in out and "#SBATCH --qos=high\n" in out
    # the planned batch pinned after the user's overrides: the job plans again at it, or stops (issue 36)
    pins = "gradient_accumulation_steps=8 num_generations=8 per_device_train_batch_size=1"  # the recipe's (issue 50)
    assert f"--slurm {QWEN} max_steps=5 {pins} --run-dir {tmp_path}/r" in out
    assert f"# batch pinned: {pins} (the job plans again in its allocation at this batch, or stops)" in out
    assert not (tmp_path / "r").exists(), "a dry run writes nothing"


def test_a_run_shows_the_plan_and_every_notice_before_anything_starts(tmp_path, capsys):
    """`grpo-launch RECIPE --dry-run` (and a real run) print the summary, the notices (a migrated key) and the
    warnings before the commands; a dry run prints them as comments, so its output stays a script."""
    args = ["run", QWEN, "--gpus", "8xH100-80GB", "--run-dir", str(tmp_path), "--dry-run", "overwrite_output_dir=true"]
    assert main(args, environ={}) == 0
    out = capsys.readouterr().out.splitlines()
    first_command = next(i for i, line in enumerate(out) if not line.startswith("#"))
    head = out[:first_command]
    assert head[0].startswith("# plan: ") and any(line.startswith("#   layout: ") for line in head)
    assert any(line.startswith("#   estimate: ") for line in head)
    assert any(line.startswith("# notice: overwrite_output_dir: dropped") for line in head)


def test_sbatch_of_a_cpu_recipe_needs_no_gpu_count(capsys):
    tiny = ensure_tiny_assets()
    args = ["sbatch", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--nodes", "1", "--dry-run",
            f"model_name_or_path={tiny / 'model'}", f"dataset_name={tiny / 'data' / 'train.jsonl'}"]  # fmt: skip
    assert main(args, environ={"CUDA_VISIBLE_DEVICES": ""}) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!") and "#SBATCH --nodes=1" in out and "# plan: " in out


def test_on_a_terminal_the_step_lines_are_one_live_line():
    import io

    from grpo_launch.cli.console import Console

    out = io.StringIO()
    live = Console(out, live=True)
    live("[train] step 1/3 done in 0.2 s | reward 0.1")
    live("[train] step 2/3 done in 0.2 s | reward 0.2")
    live("[grpo-launch] step split: balanced")
    live("[train] step 3/3 done in 0.2 s | reward 0.3")
    live.close()
    text = out.getvalue()
    assert text.count("\r\x1b[2K[train] step") == 3 and text.endswith("reward 0.3\n")
    assert "\r\x1b[2K[grpo-launch] step split: balanced\n" in text  # other lines print above the live one
    plain = io.StringIO()
    pipe = Console(plain, live=False)
    pipe("[train] step 1/3 done in 0.2 s")
    pipe("[train] step 2/3 done in 0.2 s")
    assert plain.getvalue() == "[train] step 1/3 done in 0.2 s\n[train] step 2/3 done in 0.2 s\n"


def test_sizes_print_in_a_unit_that_shows_them(tmp_path):
    """A disk refusal read "0.0 GiB free, but … need 0.0 GiB" for a tiny model: sizes pick their unit."""
    from grpo_launch.errors import LaunchError, size_text
    from grpo_launch.execute.preflight import check_output_dir
    from grpo_launch.models.config import shape_from_config

    from .helpers import plan_recipe, tiny_overrides

    assert [size_text(n) for n in (512, 3 * 2**20, 1.25 * 2**30, 150 * 2**30, 3.2 * 2**40)] == [
        "512 B", "3 MiB", "1.25 GiB", "150 GiB", "3.2 TiB"]  # fmt: skip
    overrides = tiny_overrides(tmp_path)
    model_dir = overrides[0].split("=", 1)[1]
    shape = shape_from_config("tiny", json.loads((Path(model_dir) / "config.json").read_text()))
    plan = plan_recipe(str(ROOT / "recipes" / "tiny-cpu.yaml"), "cpu", *overrides, f"output_dir={tmp_path / 'out'}",
                       model=shape)  # fmt: skip
    with pytest.raises(LaunchError) as exc:  # this machine's disk, not the recipe: exit 1, as a port in use
        check_output_dir(plan, str(tmp_path), free_bytes=lambda _: 200 * 2**10)
    message = exc.value.render()
    assert "200 KiB free" in message and "0.0 GiB" not in message and " MiB" in message


def test_inspect_counts_a_gpu_less_hosts_cpus_in_the_cpus_column():
    """Issue 41: ``inspect`` printed "GPUs none (2 CPUs)" beside "CPUs -"."""
    from grpo_launch.cli.tables import topology_sections
    from grpo_launch.machines.topology import Host, Topology

    section = topology_sections(Topology(hosts=(Host(name="vm", cpus=2),), source="cpu"))[0]
    row = dict(zip(section.header or (), section.rows[0], strict=True))
    assert row["GPUs"] == "none" and row["CPUs"] == "2", row


def test_a_replan_leaves_one_plans_files_and_json_says_it_wrote_them(tmp_path):
    """Issue 41: a re-plan in the same run directory left the earlier plan's deepspeed.json beside a DDP accelerate
    config, and ``plan --json`` wrote files without a word on stderr."""
    run = tmp_path / "run"
    zero = run_cli("plan", "recipes/qwen7b-math.yaml", "--gpus", "8xH100-80GB", "--run-dir", str(run), "--json")
    assert zero.returncode == 0 and (run / "deepspeed.json").is_file(), zero.stderr
    assert f"wrote 4 files to {run}" in zero.stderr and json.loads(zero.stdout)["train"]
    ddp = run_cli("plan", QWEN, "--gpus", "8xH100-80GB", "--run-dir", str(run), "--json")
    assert ddp.returncode == 0 and "wrote 3 files" in ddp.stderr, ddp.stderr
    assert "deepspeed_config_file" not in (run / "accelerate_config.yaml").read_text()
    assert not (run / "deepspeed.json").exists()
    quiet = run_cli("plan", QWEN, "--gpus", "8xH100-80GB", "--run-dir", str(tmp_path / "none"), "--json", "--no-write")
    assert quiet.returncode == 0 and "wrote" not in quiet.stderr and not (tmp_path / "none").exists()

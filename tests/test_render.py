"""Rendered files are judged by their owners' parsers: accelerate's config loader, DeepSpeed's config class."""

from __future__ import annotations

import json

import pytest
import yaml

from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.planning import make_plan
from grpo_launch.recipe import build_recipe
from grpo_launch.render import render_files
from grpo_launch.render.processes import vllm_server as render_vllm_command
from grpo_launch.rundir.files import write_run_files
from grpo_launch.rundir.layout import RunPaths

from .helpers import ROOT, plan_recipe

QWEN = "Qwen/Qwen2.5-1.5B-Instruct"


def _plan(spec: str, run_dir: str = "/RUN", **launch):
    return plan_recipe({"model_name_or_path": QWEN, "num_generations": 8, "launch": launch}, spec, run_dir=run_dir)


@pytest.mark.parametrize(
    ("spec", "launch", "distributed_type"),
    [
        ("8xH100-80GB", {"backend": "ddp"}, "MULTI_GPU"),
        ("8xH100-80GB", {"backend": "zero2"}, "DEEPSPEED"),
        ("8xH100-80GB", {"backend": "zero3", "offload": "optimizer+params"}, "DEEPSPEED"),
        ("2x8xH100-80GB", {"backend": "fsdp"}, "FSDP"),
        ("1xH100-80GB", {"backend": "ddp"}, "NO"),
        ("cpu", {"num_processes": 2, "vllm": "off"}, "MULTI_GPU"),
    ],
)
def test_accelerate_config_loads_with_accelerate(tmp_path, spec, launch, distributed_type):
    from accelerate.commands.config.config_args import load_config_from_file

    plan = _plan(spec, tmp_path, **launch)
    files = render_files(plan)
    write_run_files(tmp_path, files)
    cfg = load_config_from_file(str(RunPaths(tmp_path).accelerate_config))
    assert cfg.distributed_type.value == distributed_type
    assert cfg.num_processes == plan.train.num_processes
    assert cfg.num_machines == plan.train.num_machines
    assert cfg.use_cpu is False  # CPU plans switch with ACCELERATE_USE_CPU, which keeps N processes
    if distributed_type == "DEEPSPEED":
        assert cfg.deepspeed_config["deepspeed_config_file"] == str(RunPaths(tmp_path).deepspeed_config)


def test_vllm_server_command_for_trl_116():
    plan = _plan("4xL20-48GB", vllm="server", vllm_gpus=1)  # 1 GPU serves (the default batch: 3 trainers × 8)
    spec = render_vllm_command(plan)
    argv = list(spec.argv)
    assert argv[:3] == ["vllm", "serve", QWEN]
    assert spec.launch_env["CUDA_VISIBLE_DEVICES"] == "3" and spec.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert argv[argv.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'
    assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert argv[argv.index("--max-logprobs") + 1] == "-1"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert "--data-parallel-size" not in argv


def test_api_server_command_gets_model_flag():
    plan = _plan("4xL20-48GB", vllm="server", vllm_command=["python", "-m", "vllm.entrypoints.openai.api_server"])
    argv = list(render_vllm_command(plan).argv)
    assert argv[argv.index("--model") + 1] == QWEN


def test_trainer_recipe_and_plan_json(tmp_path):
    plan = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "4xL20-48GB", "launch.vllm_gpus=1", run_dir=str(tmp_path))
    files = render_files(plan)
    trainer = yaml.safe_load(files["trainer_recipe.yaml"])
    assert trainer["gradient_accumulation_steps"] == 8 and trainer["steps_per_generation"] == 8
    assert trainer["vllm_server_base_url"] == "http://127.0.0.1:8000"
    data = json.loads(files["plan.json"])
    assert data["vllm"]["command"][0:2] == ["vllm", "serve"]
    assert data["layout"]["generation_batch_size"] == 24
    assert any(d["what"] == "prompts_per_step" for d in data["decisions"])  # the recipe's batch, and why
    assert data["train"]["commands"][0]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2"


def test_golden_accelerate_config_4xL20(tmp_path):
    """Golden file: the accelerate config for the seed case (update tests/golden/ deliberately)."""
    plan = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "4xL20-48GB", "launch.vllm_gpus=1", run_dir="/RUN")
    text = render_files(plan)["accelerate_config.yaml"]
    golden = ROOT / "tests" / "golden" / "qwen1.5b-4xL20.accelerate_config.yaml"
    assert text == golden.read_text()


def test_every_path_follows_the_plans_run_dir(tmp_path):
    """One source of truth: a plan moved to another run dir writes its configs, the trainers' control dir and the
    default output_dir there (the SIGUSR2 checkpoint-and-stop reads the control dir)."""
    import dataclasses

    from grpo_launch.render.processes import trainers
    from grpo_launch.rundir.layout import RUN_DIR_ENV

    plan = make_plan(parse_gpu_spec("cpu"), build_recipe({"model_name_or_path": QWEN, "launch": {"vllm": "off"}}))
    moved = dataclasses.replace(plan, run_dir=str(tmp_path / "elsewhere"))
    spec = trainers(moved)[0]
    assert RunPaths(spec.env[RUN_DIR_ENV]).control == tmp_path / "elsewhere" / "control"
    assert f"{tmp_path}/elsewhere/trainer_recipe.yaml" in spec.argv
    assert yaml.safe_load(render_files(moved)["trainer_recipe.yaml"])["output_dir"] == f"{tmp_path}/elsewhere/output"
    assert json.loads(render_files(moved)["plan.json"])["run_dir"] == f"{tmp_path}/elsewhere"


@pytest.mark.parametrize(("backend", "dtype"), [("ddp", "float32"), ("zero2", "bfloat16")])
def test_a_migrated_dtypes_notice_says_what_the_rendered_trainer_recipe_gets(backend, dtype):
    """``torch_dtype: bfloat16`` under DDP: the notice said the dtype "migrated to dtype='bfloat16'", and the trainer
    recipe got float32 (no fp32 master copy under DDP). The notice and the rendered recipe agree."""
    values = {"model_name_or_path": QWEN, "num_generations": 8, "torch_dtype": "bfloat16",
              "launch": {"backend": backend}}  # fmt: skip
    plan = plan_recipe(values, "8xH100-80GB")
    rendered = yaml.safe_load(next(t for p, t in render_files(plan).items() if p.endswith("trainer_recipe.yaml")))
    assert rendered["dtype"] == dtype
    said = [n for n in plan.notices if n.startswith("torch_dtype: migrated to dtype")]
    assert len(said) == 1, plan.notices
    assert f"dtype={dtype!r}" in said[0]
    assert ("'float32'" in said[0]) == (dtype == "float32")

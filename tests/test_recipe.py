from __future__ import annotations

import pytest

from grpo_launch.errors import ConfigError
from grpo_launch.recipe import build_recipe, load_recipe
from grpo_launch.recipe.parse import parse_override

OPEN_R1_DEMO = """
model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct
model_revision: main
torch_dtype: bfloat16
attn_implementation: flash_attention_2
dataset_name: AI-MO/NuminaMath-TIR
dataset_configs:
- all
num_processes: 7
bf16: true
use_vllm: true
vllm_device: auto
vllm_gpu_memory_utilization: 0.7
do_eval: true
eval_strategy: steps
eval_steps: 100
gradient_accumulation_steps: 16
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
hub_model_id: Qwen2.5-1.5B-Open-R1-GRPO
hub_strategy: every_save
learning_rate: 2.0e-05
log_completions: true
log_level: info
logging_first_step: true
logging_steps: 1
logging_strategy: steps
lr_scheduler_type: cosine
max_prompt_length: 512
max_completion_length: 1024
max_steps: -1
num_generations: 7
num_train_epochs: 1
output_dir: data/Qwen2.5-1.5B-Open-R1-GRPO
overwrite_output_dir: true
per_device_eval_batch_size: 32
per_device_train_batch_size: 16
push_to_hub: true
report_to:
- wandb
save_strategy: "epoch"
save_total_limit: 1
seed: 42
warmup_ratio: 0.1
"""


def test_open_r1_recipe_loads_unmodified_with_notices(tmp_path):
    p = tmp_path / "config_demo.yaml"
    p.write_text(OPEN_R1_DEMO)
    r = load_recipe(p)
    assert r.values["dtype"] == "bfloat16" and "torch_dtype" not in r.values
    assert r.values["dataset_config"] == "all"
    assert r.values["warmup_steps"] == 0.1 and "warmup_ratio" not in r.values
    assert "vllm_device" not in r.values and "overwrite_output_dir" not in r.values
    assert r.values["max_prompt_length"] == 512  # kept: the train entry applies it
    joined = "\n".join(r.notices)
    for key in (
        "torch_dtype",
        "dataset_configs",
        "warmup_ratio",
        "vllm_device",
        "overwrite_output_dir",
        "num_processes",
    ):
        assert key in joined, f"no notice for {key}"
    assert r.launch.num_processes == 7


def test_overrides_are_yaml_typed():
    assert parse_override("max_steps=3") == ("max_steps", 3)
    assert parse_override("reward_funcs=[a,b]") == ("reward_funcs", ["a", "b"])
    assert parse_override("launch.vllm=colocate") == ("launch.vllm", "colocate")
    assert parse_override("learning_rate=1e-5") == ("learning_rate", 1e-5)
    r = build_recipe({"num_generations": 8}, [parse_override("num_generations=4"), parse_override("launch.vllm=off")])
    assert r.values["num_generations"] == 4 and r.launch.vllm == "off"


@pytest.mark.parametrize("text", ["max_steps", "=3", "max steps=3", ""])
def test_bad_override_form(text):
    with pytest.raises(ConfigError, match="key=value"):
        parse_override(text)


def test_unknown_key_did_you_mean():
    with pytest.raises(ConfigError) as e:
        build_recipe({"num_generation": 8, "per_device_train_batchsize": 2})
    text = e.value.render()
    assert "did you mean 'num_generations'" in text
    assert "did you mean 'per_device_train_batch_size'" in text
    assert "2 problems" in text


def test_unknown_launch_key_did_you_mean():
    with pytest.raises(ConfigError, match="did you mean 'vllm_port'"):
        build_recipe({"launch": {"vllm_prot": 8001}})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"per_device_train_batch_size": 0}, "must be a positive integer, got 0"),
        ({"num_generations": -2}, "must be a positive integer"),
        ({"num_generations": 1}, "at least 2"),
        ({"max_completion_length": "long"}, "must be an integer"),
        ({"learning_rate": "fast"}, "must be a number"),
        ({"bf16": "yes"}, "must be true or false"),
        ({"per_device_train_batch_size": True}, "must be an integer"),
        ({"vllm_mode": "remote"}, "is not one of colocate, server"),
        ({"launch": {"vllm": "sometimes"}}, "launch.vllm must be one of"),
        ({"launch": {"vllm_port": 70000}}, "between 1 and 65535"),
        ({"launch": {"num_processes": 0}}, "between 1 and 4096"),
        ({"launch": "server"}, "must be a mapping"),
    ],
)
def test_bad_values(values, message):
    with pytest.raises(ConfigError, match=message):
        build_recipe(values)


def test_auto_is_accepted_for_planned_keys_only():
    r = build_recipe({"per_device_train_batch_size": "auto", "gradient_accumulation_steps": "auto"})
    assert not r.is_set("per_device_train_batch_size")
    with pytest.raises(ConfigError, match="learning_rate must be a number"):
        build_recipe({"learning_rate": "auto"})


def test_migration_conflict_is_reported():
    with pytest.raises(ConfigError, match="torch_dtype and dtype are both set"):
        build_recipe({"torch_dtype": "bfloat16", "dtype": "float16"})


def test_yaml_off_means_off():
    assert build_recipe({"launch": {"vllm": False}}).launch.vllm == "off"


def test_yaml_12_scalars(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("save_strategy: no\neval_strategy: no\nlearning_rate: 1e-5\nbf16: false\nlaunch:\n  vllm: off\n")
    r = load_recipe(p, ["logging_strategy=no"])
    assert r.values["save_strategy"] == "no" and r.values["eval_strategy"] == "no"
    assert r.values["logging_strategy"] == "no"
    assert r.values["learning_rate"] == 1e-5 and r.values["bf16"] is False
    assert r.launch.vllm == "off"
    with pytest.raises(ConfigError, match="use_vllm must be true or false, got 'yes'"):
        build_recipe({}, [parse_override("use_vllm=yes")])


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("num_generations: [8\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(p)
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_recipe(p)
    with pytest.raises(ConfigError, match="not found"):
        load_recipe(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"learning_rate": -1e-5}, "learning_rate must be > 0"),
        ({"learning_rate": 0}, "learning_rate must be > 0"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"temperature": -1}, "temperature must be > 0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"max_steps": -5}, "max_steps must be a positive number of steps, or -1"),
        ({"save_steps": 0}, "save_steps must be > 0"),
        ({"lr_scheduler_type": "no_such_scheduler"}, "lr_scheduler_type: 'no_such_scheduler' is not one of"),
        ({"lr_scheduler_type": "cosin"}, "did you mean 'cosine'"),
        ({"dtype": "int8"}, "dtype: 'int8' is not one of auto, bfloat16, float16, float32"),
        ({"report_to": ["wandbb"]}, "did you mean 'wandb'"),
        ({"save_strategy": "sometimes"}, "save_strategy: 'sometimes' is not one of"),
        ({"loss_type": "nope"}, "loss_type: 'nope' is not one of bnpo, cispo, dapo, dr_grpo, grpo"),
        ({"bf16": True, "fp16": True}, "bf16 and fp16 are both true"),
        ({"reward_funcs": ["accuracy", "format"], "reward_weights": [1.0]}, "1 weight(s) for 2 reward function(s)"),
        ({"reward_funcs": ["accuracy", 3]}, "reward_funcs must be names or import paths"),
        ({"vllm_gpu_memory_utilization": 1.7}, "vllm_gpu_memory_utilization must be in (0, 1]"),
        ({"num_generations": 10**12}, "num_generations=1000000000000 is beyond"),
        ({"max_completion_length": 10**12}, "beyond any model's context"),
        ({"per_device_train_batch_size": 10**400}, "per_device_train_batch_size is too large"),
        ({"learning_rate": 10**400}, "learning_rate must be a number"),
    ],
)
def test_nonsense_the_libraries_would_fail_on_later_is_refused_now(values, named):
    """Values TRL's GRPOConfig accepts, but that fail only after a job has queued and loaded a model (in vLLM's
    SamplingParams, torch's optimizer, the trainer's loss, transformers' integrations), or are nonsense."""
    with pytest.raises(ConfigError) as e:
        build_recipe({"model_name_or_path": "m", **values})
    text = e.value.render()
    assert named in text and len(text) < 2000


def test_choices_come_from_the_libraries():
    """The accepted values are generated from TRL's and transformers' own enums and code (trl_schema.CHOICES)."""
    from transformers.trainer_utils import SchedulerType

    from grpo_launch.recipe.trl_schema import CHOICES

    assert set(CHOICES["lr_scheduler_type"]) == {s.value for s in SchedulerType}
    assert {"grpo", "dapo", "dr_grpo"} <= set(CHOICES["loss_type"]) and "wandb" in CHOICES["report_to"]
    ok = build_recipe({"model_name_or_path": "m", "loss_type": "dr_grpo", "report_to": ["wandb", "tensorboard"]})
    assert ok.values["loss_type"] == "dr_grpo"


def test_a_secret_in_a_recipe_is_refused_with_the_environment_variable_to_use(tmp_path):
    """The resolved recipe and plan.json are files in the run directory: a token must never be written there."""
    from grpo_launch.errors import ConfigError
    from grpo_launch.recipe import load_recipe

    path = tmp_path / "r.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\ndataset_name: x/y\nhub_token: hf_abc\n")
    with pytest.raises(ConfigError) as e:
        load_recipe(path, [])
    assert "hub_token in a recipe would be written" in e.value.render() and "set HF_TOKEN" in e.value.render()
    assert "hf_abc" not in e.value.render()


def test_vllm_settings_with_vllm_off_are_named_in_a_notice(tmp_path):
    """Issue 41: settings that cannot take effect are named (the key ledger's notice), not accepted without a word."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\ndataset_name: trl-lib/tldr\n")

    def unused(r):
        return [n for n in r.notices if n.startswith("not used by this run")]

    off = load_recipe(recipe, ["launch.vllm=off", "launch.vllm_extra_args=[--enforce-eager]", "vllm_mode=server"])
    assert unused(off) and "launch.vllm_extra_args, vllm_mode (vLLM is off)" in unused(off)[0], off.notices
    untrl = load_recipe(recipe, ["use_vllm=false", "vllm_gpu_memory_utilization=0.5"])
    assert "vllm_gpu_memory_utilization (vLLM is off)" in unused(untrl)[0], untrl.notices
    assert not unused(load_recipe(recipe, ["launch.vllm=server", "launch.vllm_extra_args=[--enforce-eager]"]))
    assert not unused(load_recipe(recipe, ["launch.vllm=off"]))

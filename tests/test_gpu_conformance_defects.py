"""One test per defect the audit against the libraries' own code found (the GPU path has never run here; the
libraries' code is the oracle). Each of these failed on the plans grpo-launch made before the fix."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import yaml

from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.models.shape import padded_vocab
from grpo_launch.planning import make_plan
from grpo_launch.recipe import load_recipe
from grpo_launch.render import render_files
from grpo_launch.render.configs import render_accelerate_config
from grpo_launch.render.processes import trainers, vllm_server

from .helpers import ROOT, VLLM_PY, plan_recipe, require_vllm

QWEN15 = "Qwen/Qwen2.5-1.5B-Instruct"
LLAMA8 = "meta-llama/Llama-3.1-8B-Instruct"


def plan(values: dict, spec: str, **kw):
    return plan_recipe({"model_name_or_path": QWEN15, **values}, spec, **kw)


def argv_value(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_colocate_passes_the_vllm_max_length():
    """1. Unset, vLLM reserves Llama-3.1's whole 131072-token context: 16 GiB of KV cache on 1 × H100."""
    p = plan({"model_name_or_path": LLAMA8, "max_prompt_length": 512, "max_completion_length": 1024}, "1xH100-80GB")
    assert p.vllm.mode == "colocate"
    assert p.trainer_values["vllm_max_model_length"] == 1536


def test_without_max_prompt_length_prompts_are_bounded_and_filtered():
    """2. vLLM rejects a prompt longer than max_model_len − max_tokens with HTTP 400 and TRL ends the run: the
    server's length and the trainers' prompt filter always agree."""
    p = plan({"max_completion_length": 1024, "launch": {"vllm": "server", "vllm_gpus": 1}}, "4xL20-48GB")
    argv = list(vllm_server(p).argv)
    assert int(argv_value(argv, "--max-model-len")) == p.trainer_values["max_prompt_length"] + 1024
    assert any("max_prompt_length=512" in n and "dropped" in n for n in p.notices)
    explicit = plan({"vllm_max_model_length": 4096, "max_completion_length": 1024}, "1xH100-80GB")
    assert explicit.trainer_values["max_prompt_length"] == 3072
    with pytest.raises(PlanError, match="leaves no room for a prompt"):
        plan({"vllm_max_model_length": 1000, "max_completion_length": 1024}, "1xH100-80GB")


# A template that reads chat_template_kwargs and tools as Qwen3's does (its enable_thinking switch, its tool list).
THINKING_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
    "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_prompt_filter_uses_the_chat_template_kwargs():
    """2. TRL tokenizes prompts with chat_template_kwargs; the filter must count the same tokens. The tiny model's
    real tokenizer, with a template that reads enable_thinking and tools, against the call TRL 1.16 makes
    (trl/trainer/grpo_trainer.py, _tokenize_prompts: apply_chat_template(conversation=..., tools=...,
    add_generation_prompt=True, tokenize=True, return_dict=True, **chat_template_kwargs))."""
    from transformers import AutoTokenizer

    from grpo_launch.train.data import prompt_token_count

    from .helpers import ensure_tiny_assets

    tok = AutoTokenizer.from_pretrained(ensure_tiny_assets() / "model")
    tok.chat_template = THINKING_TEMPLATE
    tool = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {"type": "object"}}}

    def trl(prompt, tools, kwargs):
        out = tok.apply_chat_template(conversation=[prompt], tools=tools or None, add_generation_prompt=True,
                                      tokenize=True, return_dict=True, **kwargs)  # fmt: skip
        return len(out["input_ids"][0])

    row = {"prompt": [{"role": "user", "content": "What is 2 + 2?"}]}
    counts = {}
    for name, r, kwargs in (("plain", row, {}), ("no thinking", row, {"enable_thinking": False}),
                            ("tools", {**row, "tools": [tool]}, {})):  # fmt: skip
        counts[name] = prompt_token_count(tok, r, kwargs)
        assert counts[name] == trl(r["prompt"], r.get("tools"), kwargs), name
    assert counts["no thinking"] > counts["plain"] and counts["tools"] > counts["plain"]  # each kwarg is used


@pytest.mark.parametrize("tp", [3, 6])
def test_tp_shards_the_whole_model(tp):
    """3. vLLM divides the MLP intermediate size and the padded vocabulary too: TP 6 for Qwen2.5-1.5B (8960, 151936)
    asserts while the model is built."""
    m = find_model_shape(QWEN15)
    assert tp not in m.valid_tp_sizes(8)
    with pytest.raises(PlanError, match=f"cannot shard Qwen2.5-1.5B over {tp} GPUs"):
        plan({"launch": {"vllm": "server", "vllm_tensor_parallel_size": tp}}, "8xH100-80GB")
    assert padded_vocab(151936) % 4 == 0 and 8960 % 4 == 0 and 4 in m.valid_tp_sizes(8)
    for spec in ("3x8xH100-80GB", "8xH100-80GB", "2x8xA100-40GB"):
        p = plan({"launch": {"vllm": "server"}}, spec)
        assert not m.tp_problems(p.vllm.tensor_parallel_size)


def test_trust_remote_code_reaches_the_server_and_the_trainers(tmp_path):
    """4. Neither side honoured trust_remote_code (a GRPOConfig key in TRL 1.16, read by its model loading)."""
    p = plan(
        {"trust_remote_code": True, "launch": {"vllm": "server", "vllm_gpus": 1}}, "4xL20-48GB", run_dir=str(tmp_path)
    )
    assert "--trust-remote-code" in vllm_server(p).argv
    assert yaml.safe_load(render_files(p)["trainer_recipe.yaml"])["trust_remote_code"] is True


def test_main_recipe_trains_fp32_master_weights_under_ddp():
    """5. recipes/qwen1.5b.yaml loads bfloat16 (as open-r1's ZeRO recipes do); on 8 × H100 the planner picks DDP,
    which keeps no fp32 master copy: pure-bf16 AdamW at lr 3e-6 rounds the updates away. Under DDP the weights load
    in float32 with bf16 autocast; under ZeRO the recipe's bf16 stays (DeepSpeed keeps fp32 master weights)."""
    recipe = load_recipe(ROOT / "recipes" / "qwen1.5b.yaml")
    p = make_plan(parse_gpu_spec("8xH100-80GB"), recipe, find_model_shape(QWEN15))
    assert p.train.backend == "ddp"
    assert p.trainer_values["dtype"] == "float32" and p.train.mixed_precision == "bf16"
    assert any(d.what == "dtype" and "master" in d.why for d in p.decisions)
    z = make_plan(
        parse_gpu_spec("8xH100-80GB"),
        dataclasses.replace(recipe, launch=dataclasses.replace(recipe.launch, backend="zero2")),
        find_model_shape(QWEN15),
    )
    assert z.trainer_values["dtype"] == "bfloat16"


def test_fp16_recipe_gets_fp16_mixed_precision():
    """9. fp16 recipes got mixed_precision bf16 in the accelerate file."""
    p = plan({"fp16": True, "bf16": False, "launch": {"backend": "ddp"}}, "4xL20-48GB")
    assert p.train.mixed_precision == "fp16" and render_accelerate_config(p)["mixed_precision"] == "fp16"


def test_fsdp_saves_a_full_state_dict():
    """8. With SHARDED_STATE_DICT, Trainer.save_model writes nothing loadable; TRL's own FSDP2 config uses
    FULL_STATE_DICT."""
    p = plan({"launch": {"backend": "fsdp"}}, "2x8xH100-80GB")
    assert render_accelerate_config(p)["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"


def test_server_flags_as_trl_builds_them():
    """9. --model-impl (GRPOConfig.vllm_model_impl, TRL's default "vllm"), --enable-scale-out on vLLM >= 0.30."""
    p = plan({"vllm_model_impl": "transformers", "launch": {"vllm": "server", "vllm_gpus": 1}}, "4xL20-48GB")
    argv = list(vllm_server(p).argv)
    assert argv_value(argv, "--model-impl") == "transformers" and "--enable-scale-out" in argv
    old = dataclasses.replace(p, vllm_version="0.28.1")
    assert "--enable-scale-out" not in vllm_server(old).argv
    assert argv_value(
        list(vllm_server(plan({"launch": {"vllm": "server", "vllm_gpus": 1}}, "4xL20-48GB")).argv), "--model-impl"
    ) == ("vllm")


def test_max_num_seqs_covers_the_whole_generation_batch():
    """9. TRL sends a whole generation batch (steps_per_generation optimizer steps) in one request."""
    p = plan(
        {"per_device_train_batch_size": 2, "steps_per_generation": 4, "launch": {"vllm": "server", "vllm_gpus": 1}},
        "4xL20-48GB",
    )
    assert p.layout.generation_batch_size == 24
    assert p.vllm.max_num_seqs == 24 > p.layout.completions_per_optimizer_step


def test_replaced_server_settings_are_announced():
    """9. A recipe's vllm_server_timeout / host / port were replaced without a notice."""
    p = plan(
        {"vllm_server_timeout": 60, "vllm_server_port": 9000, "launch": {"vllm": "server", "vllm_gpus": 1}},
        "4xL20-48GB",
    )
    assert any("vllm_server_port" in n and "replaced by the planned server" in n for n in p.notices)
    # The timeout is not replaced: it becomes the launcher's wait for the server it starts, and TRL's.
    assert any(n.startswith("vllm_server_timeout=60:") for n in p.notices)
    assert p.trainer_values["vllm_server_timeout"] == 60 and p.recipe.launch.vllm_health_timeout_s == 60


def test_colocate_decides_sleep_mode_and_writes_it():
    """9. The colocate estimate assumed sleep mode, which was never set: now it is decided, written, and its
    sleep/wake time is charged only when it is on."""
    off = plan({}, "1xH100-80GB")
    on = plan({"vllm_enable_sleep_mode": True}, "1xH100-80GB")
    assert off.trainer_values["vllm_enable_sleep_mode"] is False and on.trainer_values["vllm_enable_sleep_mode"]
    assert on.estimate.step.sync_s > off.estimate.step.sync_s == 0.0


def test_trainer_processes_get_their_gpus_as_data():
    p = plan({"launch": {"vllm": "server", "vllm_gpus": 1}}, "4xL20-48GB")
    assert trainers(p)[0].gpus == ("0", "1", "2") and vllm_server(p).gpus == ("3",)


def _python_with_vllm(root, version: str) -> str:
    """A real interpreter (a venv of this Python) whose path holds a ``vllm`` package with that ``_version.py``,
    as vLLM's wheels ship it; "missing": none."""
    import venv

    if not (root / "bin" / "python").exists():
        venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    site = next((root / "lib").glob("python3*/site-packages"))
    package = site / "vllm"
    if version != "missing":
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text("")
        (package / "_version.py").write_text(f"__version__ = version = {version!r}\n")
    return str(root / "bin" / "python")


def test_vllm_must_be_importable_in_the_trainers_at_the_servers_version(tmp_path):
    """6. TRL imports vLLM in the trainers in both modes (client, NCCL weight transfer): it must be there, in TRL's
    range, and the server's version. The check reads each environment's vllm/_version.py (probe/pythons.py); here
    each is a real interpreter with a vllm package of that version on its path."""
    from grpo_launch.errors import LaunchError
    from grpo_launch.execute.preflight import check_vllm

    def server_plan(trainer: str, server: str, mode: str = "server"):
        launch = {
            "vllm": mode,
            "vllm_command": [_python_with_vllm(tmp_path / f"server-{server}", server), "-m", "vllm"],
        }
        return dataclasses.replace(
            plan({"launch": launch}, "4xL20-48GB"), python=_python_with_vllm(tmp_path / f"trainer-{trainer}", trainer)
        )

    assert check_vllm(server_plan("0.31.0", "0.31.0")) == "0.31.0"
    with pytest.raises(LaunchError, match="vLLM is not installed in the trainers' Python"):
        check_vllm(server_plan("missing", "0.31.0"))
    with pytest.raises(LaunchError, match="different vLLM versions"):
        check_vllm(server_plan("0.30.1", "0.31.0"))
    with pytest.raises(LaunchError, match=r"outside TRL 1\.16's range"):
        check_vllm(server_plan("0.21.0", "0.21.0"))
    assert check_vllm(server_plan("0.31.0", "missing", mode="colocate")) == "0.31.0"  # no server to compare


def test_vllm_version_is_read_from_a_real_environment():
    """The same check against the real environments: .venv has no vLLM, .venv-vllm has 0.31."""
    import importlib.metadata
    import importlib.util

    from grpo_launch.probe.pythons import vllm_version_of

    # this interpreter's answer, from importlib's own records (the [train] .venv has no vLLM; [train,vllm] has one)
    expected = importlib.metadata.version("vllm") if importlib.util.find_spec("vllm") else "missing"
    assert vllm_version_of(sys.executable) == expected
    require_vllm()
    assert vllm_version_of(str(VLLM_PY)).startswith("0.31")


def test_review_fsdp_keeps_checkpointing_and_refuses_optimizer_only_offload():
    """FSDP's own candidates: checkpointing when the recipe leaves it unset (TRL's default is on), and no
    optimizer-only offload (fsdp_offload_params moves both)."""
    big = {"model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "max_completion_length": 2048}
    p = plan({**big, "per_device_train_batch_size": 8, "launch": {"backend": "fsdp"}}, "8xH100-80GB")
    assert p.train.backend == "fsdp" and p.trainer_values.get("gradient_checkpointing") is True
    with pytest.raises(PlanError, match="no optimizer-only offload"):
        plan({"launch": {"backend": "fsdp", "offload": "optimizer"}}, "8xH100-80GB")


def test_review_lengths_must_fit_an_explicit_vllm_max_length():
    with pytest.raises(PlanError, match="exceed the vLLM max length 2048") as e:
        plan({"max_prompt_length": 1024, "max_completion_length": 3000, "vllm_max_model_length": 2048}, "1xH100-80GB")
    assert e.value.fixes[0].assignments() == (("vllm_max_model_length", 4024),)


def test_review_server_is_sized_to_its_own_memory_share():
    """launch.vllm_gpu_memory_utilization below what the weights need is refused (vLLM would not start)."""
    values = {"model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "launch": {"vllm": "server", "vllm_gpus": 1}}
    with pytest.raises(PlanError, match="vLLM \\(server\\) does not fit") as e:
        plan({**values, "launch": {**values["launch"], "vllm_gpu_memory_utilization": 0.2}}, "4xL20-48GB")
    assert any(f.setting == "launch.vllm_gpu_memory_utilization" for f in e.value.fixes)
    ok = plan({**values, "launch": {**values["launch"], "vllm_gpu_memory_utilization": 0.6}}, "4xL20-48GB")
    assert ok.vllm.gpu_memory_utilization == 0.6
    assert ok.vllm.max_num_seqs * ok.model.kv_bytes_per_token_per_gpu(1) * ok.vllm.max_model_len < 0.6 * 48 * 2**30


def test_review_auto_stays_for_keys_the_planner_does_not_choose():
    p = plan({"dtype": "auto", "vllm_model_impl": "auto", "launch": {"backend": "zero2"}}, "4xL20-48GB")
    assert p.trainer_values["dtype"] == "auto" and p.trainer_values["vllm_model_impl"] == "auto"


def test_review_interpreter_behind_a_long_path_launcher(tmp_path):
    """pip writes `#!/bin/sh` + `'''exec' /path/python "$0" "$@"` when the interpreter's path is too long."""
    from grpo_launch.probe.pythons import interpreter_of

    script = tmp_path / "vllm"
    deep = "/very" + "/deep" * 30 + "/venv/bin/python"
    script.write_text(f"#!/bin/sh\n'''exec' {deep} \"$0\" \"$@\"\n' '''\nimport sys\n")
    assert interpreter_of(str(script)) == deep

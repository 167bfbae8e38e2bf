"""The conformance grid: recipes × topologies that together cover dense models of several sizes, bf16 and fp16,
DDP, ZeRO-2/3, offload, FSDP, colocate and server, one to five nodes, trust_remote_code, LoRA, another model
implementation and evaluation. Every entry is planned and rendered the way `grpo-launch plan` does; the tests push
what is rendered through the libraries that consume it."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from grpo_launch.models.builtin import MOE_CONFIGS
from grpo_launch.planning.plan_types import Plan
from grpo_launch.render import render_files
from grpo_launch.rundir.files import write_run_files

from ..helpers import VLLM_PY, plan_recipe

ROOT = Path(__file__).resolve().parents[2]
QWEN15, QWEN7, LLAMA70 = ("recipes/qwen1.5b.yaml", "recipes/qwen7b-math.yaml", "recipes/llama70b.yaml")
MOE = "recipes/qwen3-30b-a3b.yaml"


@dataclass(frozen=True)
class Case:
    id: str
    recipe: str
    gpus: str
    overrides: tuple[str, ...] = ()


GRID: tuple[Case, ...] = (
    # The shipped recipes on the topologies people have.
    Case("qwen1.5b-1xH100", QWEN15, "1xH100-80GB"),
    Case("qwen1.5b-2xH100", QWEN15, "2xH100-80GB"),
    Case("qwen1.5b-4xL20", QWEN15, "4xL20-48GB"),
    Case("qwen1.5b-8xH100", QWEN15, "8xH100-80GB"),
    Case("qwen1.5b-8xA100-40", QWEN15, "8xA100-40GB"),
    Case("qwen1.5b-2x8xH100", QWEN15, "2x8xH100-80GB"),
    Case("qwen1.5b-3x8xH100", QWEN15, "3x8xH100-80GB"),
    Case("qwen7b-4xH100", QWEN7, "4xH100-80GB"),
    Case("qwen7b-8xH100", QWEN7, "8xH100-80GB"),
    Case("qwen7b-2x8xH100", QWEN7, "2x8xH100-80GB"),
    Case("qwen7b-4xA100-40", QWEN7, "4xA100-40GB"),
    Case("llama70b-4x8xH100", LLAMA70, "4x8xH100-80GB"),
    Case("llama70b-5x8xH100", LLAMA70, "5x8xH100-80GB"),
    Case("llama70b-8xH200", LLAMA70, "8xH200"),
    # Backends and offload, forced.
    Case("ddp-server", QWEN15, "4xH100-80GB", ("launch.backend=ddp", "launch.vllm=server")),
    Case("zero2-server", QWEN15, "8xH100-80GB", ("launch.backend=zero2", "launch.vllm=server")),
    Case("zero3-server", QWEN7, "8xH100-80GB", ("launch.backend=zero3", "launch.vllm=server")),
    Case("zero2-offload", QWEN7, "4xL20-48GB", ("launch.backend=zero2", "launch.offload=optimizer")),
    Case("zero3-offload-all", QWEN7, "4xL20-48GB", ("launch.backend=zero3", "launch.offload=optimizer+params")),
    Case("fsdp-1node", QWEN7, "8xH100-80GB", ("launch.backend=fsdp", "launch.vllm=server")),
    Case("fsdp-2nodes", QWEN7, "2x8xH100-80GB", ("launch.backend=fsdp",)),
    Case("zero3-3nodes", QWEN7, "3x8xH100-80GB", ("launch.backend=zero3",)),
    # Generation modes.
    Case("colocate-4xH100", QWEN15, "4xH100-80GB", ("launch.vllm=colocate",)),
    Case("colocate-tp2", QWEN7, "4xH100-80GB", ("launch.vllm=colocate", "vllm_tensor_parallel_size=2")),
    Case("colocate-sleep", QWEN15, "2xH100-80GB", ("launch.vllm=colocate", "vllm_enable_sleep_mode=true")),
    Case("server-tp4", QWEN7, "8xH100-80GB", ("launch.vllm=server", "launch.vllm_tensor_parallel_size=4")),
    # vLLM's multi-node data parallel: two whole hosts serve (API server + headless), one trains; and a server
    # spread over every host beside its trainers.
    Case("dense-dp-2nodes", QWEN7, "3x8xH100-80GB", ("launch.vllm=server", "launch.vllm_gpus=16")),
    Case(
        "dense-dp-spread",
        QWEN7,
        "4x8xH100-80GB",
        (
            "launch.vllm=server",
            "launch.vllm_gpus=4",
            "launch.vllm_tensor_parallel_size=1",
            "launch.prompts_per_step=56",
        ),
    ),
    # A dense model no host can serve: a server whose replicas are pipelines over whole hosts (vLLM's --nnodes),
    # one replica over 4 hosts, and two replicas of 3 hosts each.
    Case("dense-pp-4nodes", LLAMA70, "8x8xH100-80GB", ("model_name_or_path=meta-llama/Llama-3.1-405B-Instruct",)),
    Case(
        "dense-pp-dp",
        LLAMA70,
        "8x8xH100-80GB",
        ("model_name_or_path=meta-llama/Llama-3.1-405B-Instruct", "launch.vllm_gpus=48"),
    ),
    Case("no-vllm", QWEN15, "4xH100-80GB", ("launch.vllm=off",)),
    # Precision, remote code, LoRA, model implementation, evaluation, lengths.
    Case("fp16-ddp", QWEN15, "4xL20-48GB", ("bf16=false", "fp16=true", "dtype=float16", "launch.backend=ddp")),
    Case("fp16-zero2", QWEN15, "4xL20-48GB", ("bf16=false", "fp16=true", "dtype=float16", "launch.backend=zero2")),
    Case("trust-remote-code", QWEN15, "4xL20-48GB", ("trust_remote_code=true",)),
    Case("lora", QWEN7, "2xH100-80GB", ("use_peft=true", "lora_r=16", "lora_target_modules=[q_proj,v_proj]")),
    Case("model-impl-transformers", QWEN15, "4xH100-80GB", ("vllm_model_impl=transformers",)),
    Case("eval-on", QWEN15, "4xL20-48GB", ("do_eval=true", "eval_strategy=steps", "eval_steps=50")),
    Case("no-prompt-length", QWEN15, "4xL20-48GB", ("max_prompt_length=null",)),
    Case("explicit-max-len", QWEN15, "1xH100-80GB", ("max_prompt_length=null", "vllm_max_model_length=4096")),
    # Qwen2.5-Math-7B has 4096 positions: the 7B -Instruct (same shape, 32768 positions) takes 4096-token completions
    Case(
        "long-completions",
        QWEN7,
        "8xH100-80GB",
        ("model_name_or_path=Qwen/Qwen2.5-7B-Instruct", "max_completion_length=4096", "num_generations=16"),
    ),
    # Mixtures of experts on 1–4 nodes: colocate, servers as TP × DP with expert parallelism, ZeRO-3.
    Case("moe-8xH100", MOE, "8xH100-80GB"),
    Case("moe-2x8xH100", MOE, "2x8xH100-80GB"),
    Case("moe-4x8xH100", MOE, "4x8xH100-80GB"),
    Case("moe-server-dp4", MOE, "8xH100-80GB", ("launch.vllm=server", "launch.vllm_gpus=4")),
    Case(
        "moe-server-tp2-dp2",
        MOE,
        "8xH100-80GB",
        ("launch.vllm=server", "launch.vllm_gpus=4", "launch.vllm_tensor_parallel_size=2"),
    ),
    Case("gpt-oss-20b-2x8xH100", MOE, "2x8xH100-80GB", ("model_name_or_path=openai/gpt-oss-20b",)),
    Case("moe-zero3-3x8xH100", MOE, "3x8xH100-80GB", ("launch.backend=zero3",)),
    # Mixed GPU types (issue 38): a server on one type and trainers on another, one type alone, uneven counts.
    Case("mixed-h100-h20-server", QWEN7, "8xH100-80GB+8xH20-96GB", ("launch.vllm=server",)),
    Case("mixed-h100-h20", QWEN7, "8xH100-80GB+8xH20-96GB"),
    Case("mixed-h100-l40s", QWEN15, "8xH100-80GB+8xL40S-48GB"),
    Case("mixed-a100-a10g", QWEN15, "4xA100-80GB+4xA10G-24GB", ("launch.vllm=server",)),
    Case("mixed-uneven-h100", QWEN15, "4xH100-80GB+2xH100-80GB"),
    Case("mixed-three-types", QWEN7, "8xH100-80GB+8xH20-96GB+8xL40S-48GB", ("launch.vllm=server",)),
)


def plan_case(case: Case, run_dir: Path) -> Plan:
    """Plan and render ``case`` into ``run_dir`` (its files are what the libraries read)."""
    plan = plan_recipe(ROOT / case.recipe, case.gpus, *case.overrides, run_dir=run_dir)
    write_run_files(plan.run_dir, render_files(plan))
    return plan


def hf_config(shape) -> dict:
    """A Hugging Face config.json for a built-in model shape (its family's model_type and architecture), so the
    libraries can build the model's layout themselves: vLLM its KV cache, transformers a meta-device model."""
    if shape.name in MOE_CONFIGS:  # built from its published config.json values
        cfg = dict(MOE_CONFIGS[shape.name])
        arch = {"qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
                "deepseek_v3": "DeepseekV3ForCausalLM", "mixtral": "MixtralForCausalLM"}[cfg["model_type"]]  # fmt: skip
        return cfg | {"architectures": [arch], "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
    name = shape.name.lower()
    if name.startswith("qwen3"):
        family, arch = "qwen3", "Qwen3ForCausalLM"
    elif "llama" in name:
        family, arch = "llama", "LlamaForCausalLM"
    elif name.startswith("mistral"):
        family, arch = "mistral", "MistralForCausalLM"
    else:
        family, arch = "qwen2", "Qwen2ForCausalLM"
    # Published configs: the small Qwen2.5 / Qwen3 / Llama-3.2 models tie their embeddings.
    tied = shape.params < 5e9 and not name.startswith(("mistral", "deepseek"))
    config = {
        "model_type": family,
        "architectures": [arch],
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "intermediate_size": shape.intermediate,
        "vocab_size": shape.vocab,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
    }
    if shape.head_dim:
        config["head_dim"] = shape.head_dim
    return config


def vllm_oracle(cases: list[dict]) -> dict[str, dict]:
    """One run of tests/conformance/vllm_oracle.py (vLLM's and TRL's code, in .venv-vllm): verdicts by case id."""
    done = subprocess.run(
        [str(VLLM_PY), str(ROOT / "tests" / "conformance" / "vllm_oracle.py")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["id"]: r for r in json.loads(done.stdout)}

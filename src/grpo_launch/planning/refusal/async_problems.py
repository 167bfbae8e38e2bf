"""What TRL 1.16's AsyncGRPOTrainer refuses or cannot do, checked before launch with the fixes (launch.mode async;
launch.mode auto reads the same list to say why it stays sync). Pure. Every check cites TRL's code:
``trl/experimental/async_grpo/`` of TRL 1.16.0 (the installed package) and its docs.
"""

from __future__ import annotations

from grpo_launch.enums import DistBackend
from grpo_launch.errors import Fix
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.recipe import Recipe
from grpo_launch.recipe.async_schema import ALGORITHM_KEYS
from grpo_launch.recipe.rewards import reward_names

SYNC = Fix("launch.mode", "sync", "TRL's GRPOTrainer, which supports it", rank=2)

# packing.py:160-165 loads the tree-attention kernel from the Hub: kernels-community/flash-attn3 on CUDA (its model
# card lists compute capability 8.0 and 9.0 only: huggingface.co/kernels-community/flash-attn3), and
# kernels-community/aiter-flash-attn on ROCm. Compute capabilities: developer.nvidia.com/cuda-gpus.
FA3_CAPABILITIES = ((8, 0), (9, 0))
COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "H100-80GB": (9, 0), "H100-PCIe": (9, 0), "H100-NVL": (9, 0), "H800": (9, 0), "GH200": (9, 0), "H200": (9, 0),
    "H20": (9, 0), "B200": (10, 0), "GB200": (10, 0), "A100-80GB": (8, 0), "A100-40GB": (8, 0), "A800": (8, 0),
    "A40": (8, 6), "L20": (8, 9), "L40S": (8, 9), "L40": (8, 9), "L4": (8, 9), "A6000": (8, 6),
    "RTX6000-Ada": (8, 9), "A10G": (8, 6), "A10": (8, 6), "RTX4090": (8, 9), "RTX5090": (12, 0), "RTX3090": (8, 6),
    "V100-32GB": (7, 0), "V100-16GB": (7, 0), "T4": (7, 5),
}  # fmt: skip
FA3_KERNEL = "kernels-community/flash-attn3"


def async_problems(topology: Topology, recipe: Recipe, model: ModelShape | None) -> list[tuple[str, list[Fix]]]:
    """(why AsyncGRPOTrainer cannot run this plan, the fixes), for each thing it refuses."""
    out: list[tuple[str, list[Fix]]] = []
    values, launch = recipe.values, recipe.launch
    if topology.is_cpu:
        out.append(
            (
                "AsyncGRPOTrainer needs a vLLM server on GPUs and NCCL weight transfer (weight_transfer.py:26-37); "
                "there is no GPU here",
                [SYNC],
            )
        )
    if launch.backend is not None and launch.backend.is_deepspeed:
        out.append(
            (
                f"launch.backend={launch.backend}: AsyncGRPOTrainer supports FSDP2 only, not DeepSpeed ZeRO (TRL docs "
                "async_grpo_trainer.md:4; async_grpo_trainer.py:1174-1175 'AsyncGRPO is FSDP2-only')",
                [Fix("launch.backend", "fsdp", "FSDP2, which AsyncGRPOTrainer supports", rank=0), SYNC],
            )
        )
    if launch.backend == DistBackend.DDP:
        why = "launch.backend=ddp: the async trainer's weight gather is written for FSDP2"
        why += " (async_grpo_trainer.py:1724-1783)"
        out.append((why, [Fix("launch.backend", "fsdp", "FSDP2", rank=0), SYNC]))
    spec = topology.planning_gpu_spec
    if spec is not None and spec.vendor == "nvidia":
        cc = COMPUTE_CAPABILITY.get(spec.name)
        if cc is not None and cc not in FA3_CAPABILITIES:
            out.append(
                (
                    f"{spec.name} GPUs have compute capability {cc[0]}.{cc[1]}: the async trainer's tree attention "
                    f"runs {FA3_KERNEL} (packing.py:160-165, forced by attn_implementation=tree_fa3 at "
                    "async_grpo_trainer.py:1083-1088), whose kernel is built for 8.0 and 9.0 only",
                    [
                        Fix(
                            "gpus",
                            None,
                            "A100 / A800 (8.0) or H100 / H200 / H800 (9.0) trainer GPUs",
                            1,
                            in_recipe=False,
                        ),
                        SYNC,
                    ],
                )
            )
    if values.get("use_liger_kernel") is True:
        why = "use_liger_kernel: true: AsyncGRPOTrainer raises NotImplementedError (async_grpo_trainer.py:1090-1091)"
        out.append((why, [Fix("use_liger_kernel", False, "the async trainer's own fused LM head", rank=0), SYNC]))
    if model is not None and model.other_layer_types:
        out.append(
            (
                f"{model.name} has {', '.join(model.other_layer_types)} layers: tree packing routes attention "
                "only, and a recurrent or convolutional layer would scan across samples "
                "(async_grpo_trainer.py:1093-1100)",
                [SYNC],
            )
        )
    if model is not None and model.attention_sinks:
        out.append(
            (
                f"{model.name} uses attention sinks, which the FA3 kernel of tree packing does not support "
                "(async_grpo_trainer.py:1101-1105)",
                [SYNC],
            )
        )
    if values.get("reward_model_name_or_path"):
        out.append(
            (
                "reward_model_name_or_path: the async trainer scores in a spawned child with CUDA_VISIBLE_DEVICES='' "
                "(async_rollout_worker.py:250; docs: a GPU reward model silently runs on CPU)",
                [
                    Fix(
                        "reward_model_name_or_path",
                        None,
                        "serve the reward model on GPUs of its own and call it from a "
                        "module-level reward function (TRL's docs' advice)",
                        rank=1,
                    ),
                    SYNC,
                ],
            )
        )
    for name in reward_names(values):
        if ":" not in name and "." not in name and name in UNPICKLABLE_OPEN_R1:
            out.append(
                (
                    f"reward {name!r} is built by open-r1's get_reward_funcs as a nested function, which cannot be "
                    "pickled into the async trainer's spawned rollout process (async_grpo_trainer.py:959-961)",
                    [Fix("reward_funcs", None, f"a module-level reward instead of {name!r}", rank=1), SYNC],
                )
            )
    for key, default in ALGORITHM_KEYS.items():
        if key in values and values[key] != default:
            out.append(
                (
                    f"{key}={values[key]!r}: AsyncGRPOConfig has no {key} (its loss has no reference model, one update "
                    "per sample; async_grpo_trainer.py:1174-1175)",
                    [Fix(key, default, "AsyncGRPOTrainer's algorithm", rank=1), SYNC],
                )
            )
    return out


# open-r1 (src/open_r1/rewards.py, get_reward_funcs at the pinned commit) builds these with factories returning
# nested functions (get_cosine_scaled_reward, get_repetition_penalty_reward, get_code_format_reward,
# get_soft_overlong_punishment); its code rewards are functools.partial objects, which pickle.
UNPICKLABLE_OPEN_R1 = frozenset({"cosine", "repetition_penalty", "code_format", "soft_overlong_punishment"})


def async_warnings(topology: Topology, recipe: Recipe) -> list[str]:
    """What cannot be checked at plan time and can still stop an async run."""
    out = [
        f"the trainers load {FA3_KERNEL} from the Hugging Face Hub at the first forward (trl packing.py:160-165): on "
        "an offline cluster (HF_HUB_OFFLINE=1) it must already be in the HF cache of every trainer host"
    ]
    if topology.is_rocm:
        out[0] = out[0].replace(FA3_KERNEL, "kernels-community/aiter-flash-attn (ROCm)")
    out.append(
        "the rollout worker needs a chat template TRL recognizes (trl chat_template_utils.add_response_schema, "
        "called at async_rollout_worker.py:364-369: Qwen2.5/3, Llama 3.1/3.2, gpt-oss, DeepSeek-R1-Distill, Gemma 4, "
        "...); another model's tokenizer stops the run at start: give one with the recipe's chat_template"
    )
    return out

"""Plan → the configuration files (pure): the accelerate config, DeepSpeed's JSON and the trainer's resolved
recipe."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from grpo_launch import __version__
from grpo_launch.enums import DistBackend, Offload
from grpo_launch.planning.plan_types import Plan
from grpo_launch.rundir.shown_text import one_line


@functools.cache
def _template(name: str) -> dict[str, Any]:
    """A template from accelerate_configs/: packaged in the wheel beside the modules (pyproject's force-include puts
    it at grpo_launch/accelerate_configs), else the source tree's (an editable install). Read by path: importlib's
    resource readers would cost plan's start-up a few milliseconds."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "accelerate_configs" / name
    text = (packaged if packaged.is_file() else package.parents[1] / "accelerate_configs" / name).read_text()
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def render_accelerate_config(plan: Plan) -> dict[str, Any]:
    """The accelerate config for the training processes (machine_rank 0; each host overrides it on the CLI)."""
    train = plan.train
    if train.backend.is_deepspeed:
        cfg = copy.deepcopy(_template("deepspeed.yaml"))
        cfg["deepspeed_config"]["deepspeed_config_file"] = str(plan.paths.deepspeed_config)
        cfg["deepspeed_config"]["zero3_init_flag"] = train.backend == DistBackend.ZERO3
        if train.num_machines == 1:
            cfg["deepspeed_config"].pop("deepspeed_multinode_launcher")
    elif train.backend == DistBackend.FSDP:
        cfg = copy.deepcopy(_template("fsdp.yaml"))
        cfg["fsdp_config"]["fsdp_offload_params"] = train.offload.params
        # TRL's trainer does its own gradient checkpointing; FSDP's would apply it twice.
        cfg["fsdp_config"]["fsdp_activation_checkpointing"] = False
    else:
        cfg = copy.deepcopy(_template("ddp.yaml"))
        if train.num_processes == 1:
            cfg["distributed_type"] = "NO"
    cfg["num_processes"] = train.num_processes
    cfg["num_machines"] = train.num_machines
    cfg["machine_rank"] = 0
    if cfg["distributed_type"] == "DEEPSPEED":
        # With deepspeed_config_file accelerate rejects a mixed_precision here: precision comes from the JSON
        # ("bf16": {"enabled": "auto"}, filled from the trainer's bf16).
        cfg.pop("mixed_precision", None)
    else:
        cfg["mixed_precision"] = train.mixed_precision
    if train.num_machines > 1:
        cfg["main_process_ip"] = train.main_process_ip
        cfg["main_process_port"] = train.main_process_port
    # Not `use_cpu: true` here: like --cpu it quietly runs one process whatever num_processes says. CPU runs of
    # several processes get ACCELERATE_USE_CPU=true (kept by accelerate's multi-GPU launcher); a single process goes
    # through accelerate's simple launcher, which overwrites that variable from this file, and is kept on the CPU
    # by the trainer's own use_cpu: true.
    cfg["use_cpu"] = False
    return cfg


def render_deepspeed_config(plan: Plan) -> dict[str, Any] | None:
    """The DeepSpeed JSON for ZeRO-2/3 ("auto" values are filled by transformers), or None for other backends."""
    train = plan.train
    if not train.backend.is_deepspeed:
        return None
    zero: dict[str, Any] = {
        "stage": train.backend.zero_stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if train.offload.optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if train.backend == DistBackend.ZERO3:
        zero.update(
            stage3_prefetch_bucket_size="auto",
            stage3_param_persistence_threshold="auto",
            stage3_gather_16bit_weights_on_model_save=True,
        )
        if train.offload == Offload.OPTIMIZER_PARAMS:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": zero,
    }


def render_trainer_recipe(plan: Plan) -> str:
    """The resolved recipe the training entry reads: every planned TRL value written out."""
    header = (  # the recipe's path is the user's text: one_line keeps a line break in it from starting a key
        f"# Resolved by grpo-launch {__version__} from {one_line(plan.recipe.source or 'a recipe')}.\n"
        # what runs, whatever a comment of the recipe says (one may describe a vLLM server the plan colocates)
        f"# Split: {one_line(plan.split or plan.vllm.mode)}; training: {plan.train.backend}.\n"
        f"# Every value the planner chose is written out; plan.json says why.\n"
    )
    return header + yaml.safe_dump(plan.resolved_trainer_values, sort_keys=False, default_flow_style=False)

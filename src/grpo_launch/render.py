"""Plan → the run directory's files (pure): accelerate config, DeepSpeed JSON, the trainer's resolved recipe and
``plan.json``. Every path comes from ``plan.run_dir``. :mod:`grpo_launch.rundir` writes them."""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from grpo_launch import __version__
from grpo_launch.commands import (
    ACCELERATE_CONFIG,
    DEEPSPEED_CONFIG,
    PLAN_JSON,
    TRAINER_RECIPE,
    trainers,
    vllm_server,
)
from grpo_launch.enums import DistBackend, Offload
from grpo_launch.planning.costmodel import Workload
from grpo_launch.planning.steptime import padded_tokens
from grpo_launch.planning.types import Plan

__all__ = [
    "ACCELERATE_CONFIG",
    "DEEPSPEED_CONFIG",
    "PLAN_JSON",
    "TRAINER_RECIPE",
    "plan_to_dict",
    "render_accelerate_config",
    "render_deepspeed_config",
    "render_files",
    "render_trainer_recipe",
]


@functools.cache
def _template(name: str) -> dict[str, Any]:
    """A template from accelerate_configs/ (packaged in the wheel; read from the source tree when editable)."""
    from importlib import resources

    packaged = resources.files("grpo_launch") / "accelerate_configs" / name
    if packaged.is_file():
        text = packaged.read_text()
    else:
        text = (Path(__file__).resolve().parents[2] / "accelerate_configs" / name).read_text()
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def render_accelerate_config(plan: Plan) -> dict[str, Any]:
    """The accelerate config for the training processes (machine_rank 0; each host overrides it on the CLI)."""
    train = plan.train
    if train.backend.is_deepspeed:
        cfg = copy.deepcopy(_template("deepspeed.yaml"))
        cfg["deepspeed_config"]["deepspeed_config_file"] = f"{plan.run_dir}/{DEEPSPEED_CONFIG}"
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
    header = (
        f"# Resolved by grpo-launch {__version__} from {plan.recipe.source or 'a recipe'}.\n"
        f"# Every value the planner chose is written out; plan.json says why.\n"
    )
    return header + yaml.safe_dump(plan.resolved_trainer_values, sort_keys=False, default_flow_style=False)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Everything decided, with reasons, as plain JSON-able data."""
    vllm_spec = vllm_server(plan)
    return {
        "grpo_launch_version": __version__,
        "recipe": plan.recipe.source,
        "run_dir": plan.run_dir,
        "topology": {
            "source": plan.topology.source,
            "description": plan.topology.describe(),
            "hosts": [
                {
                    "name": h.name,
                    "address": h.addr,
                    "gpus": [asdict(g) for g in h.gpus],
                    "cpus": h.cpus,
                    "memory_bytes": h.memory_bytes,
                }
                for h in plan.topology.hosts
            ],
        },
        "model": asdict(plan.model) if plan.model else None,
        "roles": [asdict(r) for r in plan.roles],
        "vllm": {
            **asdict(plan.vllm),
            "base_url": plan.vllm.base_url,
            "command": list(vllm_spec.argv) if vllm_spec else None,
            "env": vllm_spec.launch_env if vllm_spec else None,
            "shell": vllm_spec.shell() if vllm_spec else None,
        },
        "train": {
            "device": plan.train.device,
            "backend": plan.train.backend,
            "offload": plan.train.offload,
            "mixed_precision": plan.train.mixed_precision,
            "num_processes": plan.train.num_processes,
            "num_machines": plan.train.num_machines,
            "main_process_ip": plan.train.main_process_ip,
            "main_process_port": plan.train.main_process_port,
            "hosts": [asdict(h) for h in plan.train.hosts],
            "commands": [
                {"name": s.name, "host": s.host, "argv": list(s.argv), "env": s.launch_env, "shell": s.shell()}
                for s in trainers(plan)
            ],
        },
        "layout": {
            **asdict(plan.layout),
            "prompts_per_generation": plan.layout.prompts_per_generation,
            "completions_per_optimizer_step": plan.layout.completions_per_optimizer_step,
        },
        "estimate": estimate_to_dict(plan),
        "candidates": [
            {
                "label": c.label,
                "mode": c.mode,
                "tensor_parallel_size": c.tensor_parallel_size,
                "step": asdict(c.step) if c.step else None,
                "per_prompt_s": c.per_prompt_s,
                "chosen": c.chosen,
                "rejected": c.rejected,
            }
            for c in plan.candidates
        ],
        "decisions": [asdict(d) for d in plan.decisions],
        "notices": list(plan.notices),
        "warnings": list(plan.warnings),
        "trainer_values": plan.resolved_trainer_values,
    }


def _workload_dict(work: Workload) -> dict[str, Any]:
    """What the estimate assumed one optimizer step processes (read back by plan --calibrate-from)."""
    return {
        "completions": work.completions,
        "prompt_len": work.prompt_len,
        "max_completion_len": work.completion_len,
        "mean_completion_len": work.mean_completion_len,
        "per_device": work.per_device,
        "training_tokens": padded_tokens(work),
    }


def estimate_to_dict(plan: Plan) -> dict[str, Any] | None:
    """The estimate as data: memory terms per training GPU, per vLLM GPU and per node, and the step's times."""
    est = plan.estimate
    if est is None:
        return None
    gib = 1024**3
    out: dict[str, Any] = {
        "time_s": {
            "generation": est.step.generation_s,
            "old_logprobs": est.step.old_logprobs_s,
            "training": est.step.training_s,
            "sync": est.step.sync_s,
            "step": est.step.total_s,
        },
        "bottleneck": est.step.bottleneck,
        "gpu_memory_gib": est.gpu_memory_gib,
        "host_memory_per_node_gib": est.host_memory_per_node_gib,
        "memory_per_training_gpu_gib": None,
        "vllm_memory_per_gpu_gib": None,
        "explain": list(est.explain),
        "total": asdict(est.total) if est.total else None,
        "workload": _workload_dict(est.workload) if est.workload else None,
        "calibration": asdict(est.workload.scale) if est.workload and est.workload.scale.source else None,
    }
    if est.train_memory is not None:
        m = est.train_memory
        terms = (
            "weights",
            "gradients",
            "optimizer",
            "reference",
            "activations",
            "lm_head",
            "autocast_weights",
            "overhead",
        )
        out["memory_per_training_gpu_gib"] = {t: getattr(m, t) / gib for t in terms} | {"total": m.total / gib}
    if est.vllm_memory is not None:
        v = est.vllm_memory
        kv = v.max_num_seqs * v.kv_per_seq
        out["vllm_memory_per_gpu_gib"] = {
            "weights": v.weights_per_gpu / gib,
            "kv_cache": kv / gib,
            # the rest of the share: activations, CUDA graphs and KV blocks beyond the planned sequences
            "overhead_and_spare": (v.gpu_memory_utilization * est.gpu_memory_gib * gib - v.weights_per_gpu - kv) / gib,
            "total": v.gpu_memory_utilization * est.gpu_memory_gib,
            "kv_bytes_per_token_per_gpu": plan.model.kv_bytes_per_token_per_gpu(plan.vllm.tensor_parallel_size)
            if plan.model
            else None,
        }
    return out


def render_files(plan: Plan) -> dict[str, str]:
    """Relative path (under ``plan.run_dir``) → text for every file of a run directory."""
    files = {
        ACCELERATE_CONFIG: yaml.safe_dump(render_accelerate_config(plan), sort_keys=True),
        TRAINER_RECIPE: render_trainer_recipe(plan),
        PLAN_JSON: json.dumps(plan_to_dict(plan), indent=2, default=str) + "\n",
    }
    ds = render_deepspeed_config(plan)
    if ds is not None:
        files[DEEPSPEED_CONFIG] = json.dumps(ds, indent=2) + "\n"
    return files

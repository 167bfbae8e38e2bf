"""Plan → ``plan.json`` (pure): everything decided, with its reasons, the estimate and the commands, as plain
JSON-able data. The commands are recorded as :func:`grpo_launch.spec.redact_argv` and ``redact_env`` show them:
no secret in the run directory."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from grpo_launch import __version__
from grpo_launch.machines.gpus import GIB
from grpo_launch.planning.cost.startup import Startup
from grpo_launch.planning.cost.steptime import TimeTerm
from grpo_launch.planning.plan_types import Candidate, Plan
from grpo_launch.render.processes import trainers, vllm_server, vllm_servers
from grpo_launch.rundir.records import Prediction
from grpo_launch.spec import redact_argv, redact_env


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Everything decided, with reasons, as plain JSON-able data. Its readers read it through
    :class:`grpo_launch.rundir.plan_record.PlanRecord`: a key renamed here must be renamed there."""
    return {
        "grpo_launch_version": __version__,
        "recipe": plan.recipe.source,
        "run_dir": plan.run_dir,
        "topology": _topology(plan),
        "model": asdict(plan.model) if plan.model else None,
        "roles": [asdict(r) for r in plan.roles],
        "vllm": _vllm(plan),
        "train": _train(plan),
        "layout": {
            **asdict(plan.layout),
            "prompts_per_generation": plan.layout.prompts_per_generation,
            "completions_per_optimizer_step": plan.layout.completions_per_optimizer_step,
        },
        "estimate": estimate_to_dict(plan),
        "split": plan.split,
        "candidates": [_candidate(c) for c in plan.candidates],
        "asynchronous": plan.asynchronous.to_dict() if plan.asynchronous else None,
        "decisions": [asdict(d) for d in plan.decisions],
        "notices": list(plan.notices),
        "warnings": list(plan.warnings),
        "trainer_values": plan.resolved_trainer_values,
    }


def _topology(plan: Plan) -> dict[str, Any]:
    return {
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
    }


def _vllm(plan: Plan) -> dict[str, Any]:
    """The vLLM plan and, in server mode, the server's command on its first host and on the others."""
    vllm_spec = vllm_server(plan)
    return {
        **asdict(plan.vllm),
        "base_url": plan.vllm.base_url,
        "metrics_urls": list(plan.vllm.metrics_urls),  # vLLM's own /metrics, scraped beside the run's endpoint
        "command": redact_argv(vllm_spec.argv) if vllm_spec else None,
        "env": redact_env(vllm_spec.launch_env) if vllm_spec else None,
        "shell": vllm_spec.shell() if vllm_spec else None,
        "headless": [  # the server's other hosts (multi-node data parallel, or a replica's later stages)
            {"name": w.name, "host": w.host, "argv": redact_argv(w.argv), "shell": w.shell()}
            for w in vllm_servers(plan)[1:]
        ],
    }


def _train(plan: Plan) -> dict[str, Any]:
    """The training side and each trainer host's command."""
    return {
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
            {
                "name": s.name,
                "host": s.host,
                "argv": redact_argv(s.argv),
                "env": redact_env(s.launch_env),
                "shell": s.shell(),
            }
            for s in trainers(plan)
        ],
    }


def _candidate(c: Candidate) -> dict[str, Any]:
    """One split the search compared, with its predicted step and why it was chosen or not."""
    return {
        "label": c.label,
        "mode": c.mode,
        "tensor_parallel_size": c.tensor_parallel_size,
        "pipeline_parallel_size": c.pipeline_parallel_size,
        "data_parallel_size": c.data_parallel_size,
        "server_gpus": c.server_gpus,
        "trainers": c.trainers,
        "idle_gpus": c.idle,
        "status": c.status,
        "prompts_per_step": c.prompts_per_step or None,
        "step": asdict(c.step) if c.step else None,
        "step_lower_bound_s": c.bound_s,
        "per_prompt_s": c.per_prompt_s,
        "chosen": c.chosen,
        "rejected": c.rejected,
        "outscored": c.outscored,
    }


def _startup(startup: Startup) -> dict[str, Any]:
    """The time to first step as its phases (each measured or from the table) and their critical path."""
    phases = [{"name": p.name, "seconds": p.seconds, "why": p.why, "measured": p.measured} for p in startup.phases]
    return {"phases": phases, "first_step_s": startup.first_step_s}


def _term(t: TimeTerm) -> dict[str, Any]:
    """One step term's table and measured values, and which the plan used."""
    return {"name": t.name, "table_s": t.table_s, "measured_s": t.measured_s, "used": t.used}


def estimate_to_dict(plan: Plan) -> dict[str, Any] | None:
    """The estimate as data: memory terms per training GPU, per vLLM GPU and per node, and the step's times."""
    est = plan.estimate
    if est is None:
        return None
    step = est.step
    workload = est.workload.to_dict() if est.workload else None
    times: dict[str, Any] = {"time_s": None, "workload": workload, "time_missing": est.time_missing}
    if step is not None:
        times = Prediction(
            step.generation_s,
            step.old_logprobs_s,
            step.training_s,
            step.sync_s,
            step.total_s,
            step.overlapped,
            workload=workload,
        ).to_json()
    out: dict[str, Any] = {
        **times,
        "bottleneck": step.bottleneck if step else None,
        "startup_s": est.startup_s,
        "startup": _startup(est.startup) if est.startup else None,
        "terms": [_term(t) for t in est.terms],
        "gpu_memory_gib": est.gpu_memory_gib,
        "host_memory_per_node_gib": est.host_memory_per_node_gib,
        "memory_per_training_gpu_gib": None,
        "vllm_memory_per_gpu_gib": None,
        "explain": list(est.explain),
        "total": asdict(est.total) if est.total else None,
        "calibration": asdict(est.workload.scale)
        if est.workload and (est.workload.scale.source or est.workload.scale.measured_source)
        else None,
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
        out["memory_per_training_gpu_gib"] = {t: getattr(m, t) / GIB for t in terms} | {"total": m.total / GIB}
    if est.vllm_memory is not None:
        v = est.vllm_memory
        kv = v.max_num_seqs * v.kv_per_seq
        out["vllm_memory_per_gpu_gib"] = {
            "weights": v.weights_per_gpu / GIB,
            "kv_cache": kv / GIB,
            # the rest of the share: activations, CUDA graphs and KV blocks beyond the planned sequences
            "overhead_and_spare": (v.gpu_memory_utilization * est.gpu_memory_gib * GIB - v.weights_per_gpu - kv) / GIB,
            "total": v.gpu_memory_utilization * est.gpu_memory_gib,
            "kv_bytes_per_token_per_gpu": plan.model.kv_bytes_per_token_per_gpu(
                plan.vllm.tensor_parallel_size, plan.vllm.pipeline_parallel_size
            )
            if plan.model
            else None,
        }
    return out

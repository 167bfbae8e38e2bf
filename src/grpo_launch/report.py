"""Human-readable plan and topology reports (rich renderables). Imported only when printing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import groupby

from rich.console import Group
from rich.table import Table
from rich.text import Text

from grpo_launch.plan import Plan
from grpo_launch.render import render_train_commands, render_vllm_command
from grpo_launch.topology import Topology


def _ranges(ids: Sequence[str]) -> str:
    """["0","1","2","5"] → "0-2,5"; non-numeric ids (UUIDs) are listed as they are."""
    if not all(i.isdigit() for i in ids):
        return ",".join(ids)
    nums = sorted(int(i) for i in ids)
    parts = []
    start = prev = nums[0]
    for n in [*nums[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)


def topology_table(topology: Topology) -> Table:
    t = Table(title=f"Topology ({topology.source}): {topology.describe()}", title_justify="left")
    for col in ("host", "address", "GPUs", "model", "memory"):
        t.add_column(col)
    for h in topology.hosts:
        mem = {f"{g.memory_gib:.0f} GiB" if g.memory_gib else "?" for g in h.gpus}
        t.add_row(
            h.name,
            h.addr,
            _ranges([g.visible_id for g in h.gpus]) if h.gpus else f"none ({h.cpus or '?'} CPUs)",
            ", ".join(sorted({g.name for g in h.gpus})) or "-",
            ", ".join(sorted(mem)) or "-",
        )
    return t


def plan_report(plan: Plan, run_dir: str, written: Iterable[str] = (), *, python: str = "python3") -> Group:
    parts: list = []
    title = f"grpo-launch plan: {plan.recipe.source or 'recipe'} on {plan.topology.describe()}"
    parts.append(Text(title, style="bold"))

    roles = Table(title="GPUs and roles", title_justify="left")
    for col in ("host", "GPUs", "model", "role"):
        roles.add_column(col)
    if plan.train.device == "cpu":
        for h in plan.train.hosts:
            roles.add_row(h.name, "-", "CPU", f"train × {h.processes} processes (rank {h.machine_rank})")
    else:
        for (host, role), items in groupby(plan.roles, key=lambda r: (r.host, r.role)):
            rs = list(items)
            mem = f" {rs[0].memory_gib:.0f} GiB" if rs[0].memory_gib else ""
            roles.add_row(host, _ranges([r.gpu for r in rs]), f"{rs[0].name}{mem}", role)
    parts.append(roles)

    lay = plan.layout
    t = Table(title="Batch layout (TRL 1.16)", title_justify="left", show_header=False)
    t.add_column("key")
    t.add_column("value")
    rows = [
        ("training processes", lay.num_processes),
        ("per_device_train_batch_size", lay.per_device_train_batch_size),
        ("gradient_accumulation_steps", lay.gradient_accumulation_steps),
        ("steps_per_generation", lay.steps_per_generation),
        (
            "generation_batch_size",
            f"{lay.generation_batch_size} = {lay.prompts_per_generation} prompts × {lay.num_generations}",
        ),
        ("num_generations", lay.num_generations),
        ("completions per optimizer step", lay.completions_per_optimizer_step),
    ]
    if lay.per_device_eval_batch_size is not None:
        rows.append(("per_device_eval_batch_size", lay.per_device_eval_batch_size))
    for k, v in rows:
        t.add_row(k, str(v))
    parts.append(t)

    s = Table(title="Generation and training", title_justify="left", show_header=False)
    s.add_column("key")
    s.add_column("value")
    v = plan.vllm
    s.add_row("vLLM", v.mode)
    if v.mode == "server":
        s.add_row("vLLM server", f"{v.host} GPUs {_ranges(list(v.gpus))}, TP {v.tensor_parallel_size}, {v.base_url}")
    elif v.mode == "colocate":
        s.add_row("vLLM colocated", f"TP {v.tensor_parallel_size}, gpu_memory_utilization {v.gpu_memory_utilization}")
    off = "" if plan.train.offload == "none" else f" + offload {plan.train.offload}"
    s.add_row(
        "backend", f"{plan.train.backend}{off} on {plan.train.device}, mixed precision {plan.train.mixed_precision}"
    )
    s.add_row(
        "machines", f"{plan.train.num_machines} (main {plan.train.main_process_ip}:{plan.train.main_process_port})"
    )
    s.add_row("output_dir", str(plan.trainer_values.get("output_dir")))
    parts.append(s)

    est = plan.estimate
    if est is not None:
        e = Table(
            title="Estimate per optimizer step (grpo-launch plan --explain shows the arithmetic)",
            title_justify="left",
            show_header=False,
        )
        e.add_column("key")
        e.add_column("value")
        step = est.step
        e.add_row("generation", f"{step.generation_s:.1f} s")
        e.add_row("training", f"{step.training_s:.1f} s")
        if step.sync_s:
            e.add_row("weight sync / vLLM switch", f"{step.sync_s:.1f} s")
        e.add_row("step", f"{step.total_s:.1f} s (bottleneck: {step.bottleneck})")
        if est.train_memory_gib is not None:
            e.add_row("memory per training GPU", f"{est.train_memory_gib:.1f} of {est.gpu_memory_gib:.0f} GiB")
        if est.vllm_memory_gib is not None:
            e.add_row("vLLM memory per GPU", f"{est.vllm_memory_gib:.1f} GiB")
        parts.append(e)

    if plan.decisions:
        d = Table(title="Why", title_justify="left", show_header=False)
        d.add_column("what")
        d.add_column("why")
        for dec in plan.decisions:
            label = dec.what if dec.value is None else f"{dec.what}={dec.value}"
            d.add_row(label, dec.why)
        parts.append(d)
    for n in plan.notices:
        parts.append(Text(f"notice: {n}", style="cyan"))
    for w in plan.warnings:
        parts.append(Text(f"warning: {w}", style="yellow"))

    cmds = Text("Commands:\n", style="bold")
    spec = render_vllm_command(plan)
    if spec:
        cmds.append(f"  [vllm]  {spec.shell()}\n", style="")
    for ts in render_train_commands(plan, run_dir, python=python):
        cmds.append(f"  [{ts.name}] {ts.shell()}\n", style="")
    parts.append(cmds)
    files = list(written)
    if files:
        parts.append(Text("Wrote: " + ", ".join(files)))
    return Group(*parts)

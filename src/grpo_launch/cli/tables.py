"""Human-readable plan and topology reports. Each report is plain data (a list of sections); on a terminal rich
draws them as tables, elsewhere (a pipe, a CI or Slurm log) they print as aligned plain text, so rich is imported
only for a terminal and ``plan --json`` never imports it."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import TYPE_CHECKING

from grpo_launch.machines.gpus import GIB
from grpo_launch.machines.topology import Topology
from grpo_launch.planning.plan_types import Plan, Total
from grpo_launch.render.processes import trainers, vllm_servers
from grpo_launch.rundir.shown_text import printable
from grpo_launch.spec import frozen

if TYPE_CHECKING:
    pass


@frozen
class Section:
    """A titled table (``header`` None: key/value rows), or with no rows just a line of text."""

    title: str
    rows: Sequence[tuple[str, ...]] = ()
    header: tuple[str, ...] | None = None
    style: str = ""  # rich style of a text line: bold, cyan (notice), yellow (warning)
    table: bool = True  # False: rows are printed as plain lines (commands stay copyable)


def _ranges(ids: Sequence[str]) -> str:
    """["0","1","2","5"] → "0-2,5"; non-numeric ids (UUIDs) are listed as they are."""
    if not all(i.isascii() and i.isdigit() for i in ids):
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


def topology_sections(topology: Topology) -> list[Section]:
    rows = []
    for h in topology.hosts:
        mem = {f"{g.memory_gib:.0f} GiB" if g.memory_gib else "?" for g in h.gpus}
        rows.append(
            (
                h.name,
                h.addr,
                _ranges([g.visible_id for g in h.gpus]) if h.gpus else "none",
                ", ".join(sorted({g.name for g in h.gpus})) or "-",
                ", ".join(sorted(mem)) or "-",
                str(h.cpus) if h.cpus else "-",
                f"{h.memory_bytes / GIB:.0f} GiB" if h.memory_bytes else "-",
            )
        )
    title = f"Topology ({topology.source}): {topology.describe()}"
    return [
        Section(title, rows, ("host", "address", "GPUs", "model", "GPU memory", "CPUs", "RAM")),
        *(Section(f"warning: {w}", style="yellow") for w in topology.warnings),
    ]


def plan_sections(plan: Plan, written: Iterable[str] = ()) -> list[Section]:
    out = [Section(f"grpo-launch plan: {plan.recipe.source or 'recipe'} on {plan.topology.describe()}", style="bold")]
    out += [_roles_section(plan), _layout_section(plan), _generation_section(plan)]
    if plan.estimate is not None:
        out.append(_estimate_section(plan))
    if plan.decisions:
        why = [(d.what if d.value is None else f"{d.what}={d.value}", d.why) for d in plan.decisions]
        out.append(Section("Why", why))
    out += [Section(f"notice: {n}", style="cyan") for n in [*plan.notices, *_unpriced(plan)]]
    out += [Section(f"warning: {w}", style="yellow") for w in plan.warnings]
    commands = [(f"[{p.name}]", p.shell()) for p in (*vllm_servers(plan), *trainers(plan))]
    out.append(Section("Commands", commands, table=False))
    files = list(written)
    if files:
        out.append(Section("Wrote: " + ", ".join(files)))
    return out


def _roles_section(plan: Plan) -> Section:
    """Which GPUs of which host train and which generate (a CPU run: its processes per host)."""
    roles: list[tuple[str, ...]] = []
    if plan.train.device == "cpu":
        for h in plan.train.hosts:
            roles.append((h.name, "-", "CPU", f"train × {h.processes} processes (rank {h.machine_rank})"))
    else:
        for (host, role), items in groupby(plan.roles, key=lambda r: (r.host, r.role)):
            rs = list(items)
            mem = f" {rs[0].memory_gib:.0f} GiB" if rs[0].memory_gib else ""
            roles.append((host, _ranges([r.gpu for r in rs]), f"{rs[0].name}{mem}", role))
    return Section("GPUs and roles", roles, ("host", "GPUs", "model", "role"))


# The batch keys a recipe may set, as the layout section lists them beside the planned values.
_BATCH_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
               "generation_batch_size", "num_generations")  # fmt: skip


def _layout_section(plan: Plan) -> Section:
    """The planned batch beside the recipe's values ("-": unset, TRL's default or the planner's choice), so any
    value the plan changed shows (and a notice says why: the batch is the user's algorithm)."""
    lay = plan.layout
    asked = {k: plan.recipe.values.get(k) for k in _BATCH_KEYS}
    pinned = plan.recipe.launch.prompts_per_step

    def recipe(key: str) -> str:
        value = asked.get(key)
        return "-" if value in (None, "auto") else str(value)

    prompts = lay.completions_per_optimizer_step / lay.num_generations
    layout = [
        ("training processes", str(lay.num_processes), "-"),
        ("per_device_train_batch_size", str(lay.per_device_train_batch_size), recipe("per_device_train_batch_size")),
        ("gradient_accumulation_steps", str(lay.gradient_accumulation_steps), recipe("gradient_accumulation_steps")),
        ("steps_per_generation", str(lay.steps_per_generation), recipe("steps_per_generation")),
        (
            "generation_batch_size",
            f"{lay.generation_batch_size} = {lay.prompts_per_generation} prompts × {lay.num_generations}",
            recipe("generation_batch_size"),
        ),
        ("num_generations", str(lay.num_generations), recipe("num_generations")),
        ("prompts per optimizer step", f"{prompts:g}", f"launch.prompts_per_step={pinned}" if pinned else "-"),
        ("completions per optimizer step", str(lay.completions_per_optimizer_step), "-"),
    ]
    if lay.per_device_eval_batch_size is not None:
        layout.append(("per_device_eval_batch_size", str(lay.per_device_eval_batch_size), "-"))
    return Section("Batch layout (TRL 1.16)", layout, ("", "planned", "the recipe"))


def _generation_section(plan: Plan) -> Section:
    """How vLLM generates (a server's hosts and shape, or colocated) and how the trainers train."""
    v, train = plan.vllm, plan.train
    gen = [("vLLM", str(v.mode))]
    if v.mode == "server":
        shape = v.parallelism.label + (", expert parallel" if v.expert_parallel else "")
        where = "; ".join(
            f"{name} GPUs {_ranges(list(ids))}"
            for name, ids in ((v.host, v.gpus), *((n.name, n.gpus) for n in v.nodes))
        )
        gen.append(("vLLM server", f"{where}, {shape}, {v.base_url}"))
    elif v.mode == "colocate":
        gen.append(
            ("vLLM colocated", f"TP {v.tensor_parallel_size}, gpu_memory_utilization {v.gpu_memory_utilization}")
        )
    off = "" if train.offload == "none" else f" + offload {train.offload}"
    gen += [
        ("backend", f"{train.backend}{off} on {train.device}, mixed precision {train.mixed_precision}"),
        ("machines", f"{train.num_machines} (main {train.main_process_ip}:{train.main_process_port})"),
        ("output_dir", plan.output_dir),
    ]
    return Section("Generation and training", gen)


def _estimate_section(plan: Plan) -> Section:
    """The step's times, the memory per GPU and per node, the time to the first step and the whole run."""
    est = plan.estimate
    assert est is not None
    step = est.step
    rows = []
    if step is None:
        rows.append(("step", est.time_missing or "no step time"))
    else:
        rows.append(("generation", f"{step.generation_s:.1f} s"))
        if step.old_logprobs_s:
            rows.append(("old log-probs forward", f"{step.old_logprobs_s:.1f} s"))
        rows.append(("training", f"{step.training_s:.1f} s"))
        if step.sync_s:
            rows.append(("weight sync / vLLM switch", f"{step.sync_s:.1f} s"))
        rows.append(("step", f"{step.total_s:.1f} s (bottleneck: {step.bottleneck})"))
    if est.train_memory_gib is not None:
        rows.append(("memory per training GPU", f"{est.train_memory_gib:.1f} of {est.gpu_memory_gib:.0f} GiB"))
    if est.vllm_memory_gib is not None:
        rows.append(("vLLM memory per GPU", f"{est.vllm_memory_gib:.1f} GiB"))
    if est.host_memory_per_node_gib:
        rows.append(("host RAM per node (offload)", f"{est.host_memory_per_node_gib:.0f} GiB"))
    if est.startup_s is not None:
        rows.append(
            ("time to first step", f"≈ {est.startup_s:.0f} s (load, vLLM ready, first sync; again on every restart)")
        )
    if est.total is not None:
        rows += whole_run_rows(est.total)
    elif est.total_missing:
        rows.append(("whole run", est.total_missing))
    return Section("Estimate per optimizer step (grpo-launch plan --explain shows the arithmetic)", rows)


def _hours_range(t: Total) -> str:
    low = t.hours_expected
    return f"{low:.1f}–{t.hours:.1f} h" if low is not None and low < t.hours * 0.995 else f"{t.hours:.1f} h"


def whole_run_rows(t: Total) -> list[tuple[str, str]]:
    """The whole run as a range, from the expected mean completion length to every completion at the maximum."""
    scale = t.hours_expected / t.hours if t.hours_expected is not None and t.hours else 1.0
    gpu_h = f"{t.gpu_hours * scale:.0f}–{t.gpu_hours:.0f}" if scale < 0.995 else f"{t.gpu_hours:.0f}"
    cost = ""
    if t.price is not None:
        cost = f", {t.price * scale:,.2f}–{t.price:,.2f}" if scale < 0.995 else f", {t.price:,.2f}"
        cost += " at the given GPU-hour price"
    rows = [("whole run", f"{t.steps} steps ({t.source}): {_hours_range(t)}, {gpu_h} GPU-h{cost}")]
    if t.expected_source:
        rows.append(("  range", f"low end at the {t.expected_source}; high end: every completion at the maximum"))
    return rows


def summary_lines(plan: Plan) -> list[str]:
    """The plan in a few lines, and every notice and warning: what a run prints before it starts anything."""
    lay, v, train = plan.layout, plan.vllm, plan.train
    lines = [f"plan: {plan.recipe.source or 'recipe'} on {plan.topology.describe()}"]
    if train.device == "cpu":
        lines.append("  roles: " + ", ".join(f"{h.name} train × {h.processes} (CPU)" for h in train.hosts))
    else:
        groups = groupby(plan.roles, key=lambda r: (r.host, r.role))
        lines.append(
            "  roles: "
            + ", ".join(
                f"{host} GPUs {_ranges([r.gpu for r in rs])} {role}"
                for (host, role), rs in ((k, list(g)) for k, g in groups)
            )
        )
    lines.append(
        f"  layout: {lay.per_device_train_batch_size} per device × {lay.num_processes} process(es) × "
        f"{lay.gradient_accumulation_steps} accumulation = {lay.completions_per_optimizer_step} completions per step "
        f"({lay.num_generations} per prompt)"
    )
    vllm = str(v.mode)
    if v.mode == "server":
        vllm += f" on {v.host} GPUs {_ranges(list(v.gpus))}, {v.parallelism.label}"
        vllm += f" (+ {len(v.nodes)} more host(s))" if v.nodes else ""
    elif v.mode == "colocate":
        vllm += f", TP {v.tensor_parallel_size}, gpu_memory_utilization {v.gpu_memory_utilization}"
    off = "" if train.offload == "none" else f" + offload {train.offload}"
    lines.append(f"  vLLM: {vllm}; training: {train.backend}{off} on {train.device}")
    est = plan.estimate
    if est is not None:
        mem = (
            f", {est.train_memory_gib:.1f} of {est.gpu_memory_gib:.0f} GiB per training GPU"
            if (est.train_memory_gib)
            else ""
        )
        total = f", {_hours_range(est.total)} for {est.total.steps} steps" if est.total else ""
        step = f"{est.step.total_s:.1f} s per step ({est.step.bottleneck})" if est.step else est.time_missing
        lines.append(f"  estimate: {step}{mem}{total}")
    lines += [f"notice: {n}" for n in [*plan.notices, *_unpriced(plan)]]
    lines += [f"warning: {w}" for w in plan.warnings]
    return lines


def _unpriced(plan: Plan) -> list[str]:
    """Why a GPU-hour price the user gave shows no cost: there is no whole-run total to price."""
    price = plan.recipe.launch.gpu_hour_price
    est = plan.estimate
    if price is None or (est is not None and est.total is not None):
        return []
    if est is None:
        why = "a CPU plan has no step time" if plan.topology.is_cpu else "this plan has no estimate"
    else:
        why = (est.total_missing or est.time_missing or "the whole run's length is unknown").removeprefix("unknown: ")
    return [f"launch.gpu_hour_price={price:g} (--gpu-hour-price) shows no cost: {why}"]


def _printable(sec: Section) -> Section:
    """The section with control characters escaped in every cell (a reward's name, a failure's cause and a log
    line come from the run directory: none may reach the terminal raw); a cell is one line."""
    return dataclasses.replace(
        sec,
        title=printable(sec.title),
        rows=[tuple(printable(c, newlines=False) for c in row) for row in sec.rows],
        header=tuple(printable(c, newlines=False) for c in sec.header) if sec.header else sec.header,
    )


def plain_text(sections: Iterable[Section]) -> str:
    """Aligned plain text: a title line, then the rows indented with padded columns."""
    lines: list[str] = []
    for sec in map(_printable, sections):
        lines.append(sec.title)
        rows = [sec.header, *sec.rows] if sec.header else list(sec.rows)
        if not rows:
            continue
        widths = [max(len(r[i]) for r in rows if len(r) > i) for i in range(max(len(r) for r in rows))]
        for row in rows:
            cells = [cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)]
            lines.append("  " + "  ".join(cells))
    return "\n".join(lines)


def _print_rich(sections: Iterable[Section]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(soft_wrap=True)
    for sec in map(_printable, sections):
        if not sec.rows or not sec.table:
            console.print(Text(sec.title, style=sec.style or ("bold" if sec.rows else "")))
            for row in sec.rows:  # plain lines: no markup ([vllm] is text), no box around a command
                console.print(Text("  " + "  ".join(row)), soft_wrap=True)
            continue
        table = Table(title=sec.title, title_justify="left", show_header=bool(sec.header))
        for col in sec.header or ("",) * max(len(r) for r in sec.rows):
            table.add_column(col)
        for row in sec.rows:
            table.add_row(*(Text(cell) for cell in row))  # values are text, never rich markup
        console.print(table)


def print_sections(sections: list[Section]) -> None:
    """Tables on a terminal, plain text elsewhere."""
    if sys.stdout.isatty():
        _print_rich(sections)
    else:
        print(plain_text(sections), flush=True)

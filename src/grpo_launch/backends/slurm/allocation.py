"""The inside of a Slurm job, pure parts plus the probe: the allocation's nodes, addresses and GPUs (from the
variables and ``scontrol``), and the srun step that places one process on one node."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import hostlist

from grpo_launch.backends.slurm.env import SLURM_VARIABLES, run_scontrol, slurm_values
from grpo_launch.errors import ProbeError, is_decimal
from grpo_launch.machines.topology import Gpu, Host, Topology
from grpo_launch.probe.hosts import (
    collect_reports,
    local_gpu_model,
    mixed_models_warning,
    report_command,
    reported_gpus,
)
from grpo_launch.spec import ProcessSpec


def expand_nodelist(nodelist: str) -> list[str]:
    """``"n[1-3],gpu07"`` → ``["n1", "n2", "n3", "gpu07"]``; quotes the bad input on error."""
    try:
        hosts = list(hostlist.expand_hostlist(nodelist))
    except hostlist.BadHostlist as exc:
        raise ProbeError(f"cannot expand Slurm node list {nodelist!r}: {exc}") from None
    if not hosts:
        raise ProbeError(f"Slurm node list {nodelist!r} is empty")
    return hosts


def _gpus_per_node(values: Mapping[str, str]) -> int:
    for key in ("gpus_on_node", "gpus_per_node"):
        if key in values:
            # SLURM_GPUS_PER_NODE may carry a type ("h100:8") or per-node counts ("8(x2)").
            m = re.match(r"^(?:[\w-]+:)?(\d+)", values[key], re.ASCII)
            if not m:
                raise ProbeError(f"cannot read {SLURM_VARIABLES[key]}={values[key]!r}")
            return int(m.group(1))
    if "job_gpus" in values:
        return len([g for g in values["job_gpus"].split(",") if g])
    return 0


def expand_counts(value: str) -> list[int]:
    """Slurm's per-node counts: ``"72(x2),36"`` → ``[72, 72, 36]``."""
    out: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part, re.ASCII)
        if not m:
            raise ProbeError(f"cannot read Slurm's per-node count {value!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def parse_job_gres(text: str, expand: Callable[[str], list[str]]) -> dict[str, int]:
    """GPUs per node from ``scontrol show job -d``'s ``Nodes=n[1-2] CPU_IDs=… GRES=gpu:4(IDX:0-3)`` lines."""
    out: dict[str, int] = {}
    for m in re.finditer(r"^\s*Nodes=(\S+)\s.*?(?:GRES=(\S*))?\s*$", text, re.MULTILINE):
        count = 0
        for item in (m.group(2) or "").split(","):
            g = re.match(r"^gpu(?::[\w.-]+)*?:(\d+)", item, re.ASCII)
            if g:
                count += int(g.group(1))
        for node in expand(m.group(1)):
            out[node] = count
    return out


def _node_fields(text: str, key: str) -> dict[str, str]:
    """NodeName → the value of ``key`` in ``scontrol show node -o`` (one node per line), where present."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        value = re.search(rf"(?:^|\s){key}=(\S+)", line)
        if name and value:
            out[name.group(1)] = value.group(1)
    return out


def parse_node_memory(text: str) -> dict[str, int]:
    """NodeName → RealMemory in bytes (Slurm counts megabytes)."""
    return {n: int(v) * 1024 * 1024 for n, v in _node_fields(text, "RealMemory").items() if v.isascii() and v.isdigit()}


def parse_node_addresses(text: str) -> dict[str, str]:
    """NodeName → NodeAddr (the node's name where Slurm lists no address)."""
    names = {n: n for n in _node_fields(text, "NodeName")}
    return {**names, **_node_fields(text, "NodeAddr")}


def het_groups(environ: Mapping[str, str]) -> dict[str, int]:
    """Node → its component in a heterogeneous job (``sbatch A : B``: SLURM_HET_SIZE components, each with its own
    SLURM_JOB_NODELIST_HET_GROUP_<k>), in the components' order; empty for an ordinary job. A step on a node of
    component k must name it (``srun --het-group=k``): the batch script's own steps run in component 0."""
    size = environ.get("SLURM_HET_SIZE", "")
    if not is_decimal(size):
        return {}
    out: dict[str, int] = {}
    for k in range(int(size)):
        nodes = environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{k}")
        if not nodes:
            raise ProbeError(f"a heterogeneous job of {size} components without SLURM_JOB_NODELIST_HET_GROUP_{k}")
        for node in expand_nodelist(nodes):
            out.setdefault(node, k)
    return out


def het_group_args(groups: Mapping[str, int], node: str) -> list[str]:
    """The srun option that puts a step on ``node`` in a heterogeneous job (none in component 0 or a plain job)."""
    return [f"--het-group={groups[node]}"] if groups.get(node) else []


def het_gpus_per_node(environ: Mapping[str, str], groups: Mapping[str, int], this_node: int) -> dict[str, int]:
    """Each node's GPUs in a heterogeneous job when ``scontrol show job -d`` does not answer: component k's
    SLURM_GPUS_PER_NODE_HET_GROUP_k (set by ``--gpus-per-node``; ``--gres=gpu:N`` sets no such variable), component 0
    else this node's own count. A component whose count no variable gives is refused rather than guessed."""
    out: dict[str, int] = {}
    for node, k in groups.items():
        value = environ.get(f"SLURM_GPUS_PER_NODE_HET_GROUP_{k}")
        if value:
            out[node] = _gpus_per_node({"gpus_per_node": value})
        elif k == 0:
            out[node] = this_node
        else:
            raise ProbeError(
                f"cannot tell how many GPUs component {k} of this heterogeneous job has on {node}: "
                f"`scontrol show job -d` did not answer and SLURM_GPUS_PER_NODE_HET_GROUP_{k} is not set",
                hint="Make scontrol reachable from the job, or request each component's GPUs with "
                "--gpus-per-node=G (sbatch -w n1 --gpus-per-node=4 : -w n2 --gpus-per-node=8 job.sh).",
            )
    return out


PER_COMPONENT = ("cpus_per_node", "mem_per_node", "mem_per_cpu")  # a heterogeneous job sets these per component


def component_values(environ: Mapping[str, str], values: Mapping[str, str], k: int) -> dict[str, str]:
    """``values`` as component k of a heterogeneous job sees them: its CPUs and ``--mem`` / ``--mem-per-cpu`` from
    the ``<variable>_HET_GROUP_<k>`` variables (the plain ones are component 0's)."""
    out = {key: v for key, v in values.items() if key not in PER_COMPONENT}
    for key in PER_COMPONENT:
        v = environ.get(f"{SLURM_VARIABLES[key]}_HET_GROUP_{k}")
        out |= {key: v} if v else {}
    return out


NodeReports = tuple[dict[str, dict], list[str]]  # node → its host report; what failed, per node
PROBE_STEP_TIMEOUT_S = 60.0  # a step starts in seconds on a healthy allocation


def probe_nodes(
    gpus: Mapping[str, int],
    *,
    python: str | None = None,
    timeout_s: float = PROBE_STEP_TIMEOUT_S,
    groups: Mapping[str, int] | None = None,
) -> NodeReports:
    """Each node's own report, from one ``srun`` step per node (in parallel): the step asks for the node's GPUs of
    the job, so the report lists what a trainer there will see (NVML model and memory, count), its CPUs and RAM.
    ``groups``: each node's component of a heterogeneous job."""

    def argv(node: str) -> list[str]:
        gres = [f"--gres=gpu:{gpus[node]}"] if gpus[node] else []
        return [
            "srun",
            *het_group_args(groups or {}, node),
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            "--overlap",
            "--quiet",
            "--job-name=grpo-launch-probe",
            *gres,
            *report_command(python or sys.executable),
        ]

    return collect_reports(list(gpus), argv, timeout_s=timeout_s)


def job_memory_limit(values: Mapping[str, str], cpus: int | None) -> int | None:
    """The job's memory on a node in bytes (``--mem``, or ``--mem-per-cpu`` × its CPUs there); None when the job
    set neither, or asked for all of it (``--mem=0``)."""
    mb = None
    if is_decimal(values.get("mem_per_node", "")):
        mb = int(values["mem_per_node"])
    elif is_decimal(values.get("mem_per_cpu", "")) and cpus:
        mb = int(values["mem_per_cpu"]) * cpus
    return mb * 1024 * 1024 if mb else None


def _smallest(*values: int | None) -> int | None:
    known = [v for v in values if v]
    return min(known) if known else None


def probe_slurm(
    environ: Mapping[str, str],
    *,
    local: Topology | None = None,
    scontrol: Callable[[Sequence[str]], str | None] = run_scontrol,
    steps: Callable[..., NodeReports] = probe_nodes,
) -> Topology:
    """The current Slurm allocation: its nodes, their addresses (NodeAddr), CPUs, RAM and GPUs.

    GPU counts per node come from ``scontrol show job -d`` (every node, every component of a heterogeneous job) or
    else the variables of this node. In an ordinary job nodes with different GPU counts are an error; the
    components of a heterogeneous job (``sbatch -w n1 --gres=gpu:4 : -w n2 --gres=gpu:8``) may differ, each alike
    within (the planner gives whole components roles). Each node then reports its own GPU model and memory, CPUs
    and RAM from an srun step in its component (:func:`probe_nodes`); a node that does not answer is assumed like
    this one, with a warning. Host RAM is the smallest of the node's RAM, Slurm's RealMemory and the job's ``--mem``.
    """
    values = slurm_values(environ)
    if "job_id" not in values or "nodelist" not in values:
        raise ProbeError(
            "not inside a Slurm allocation (SLURM_JOB_ID / SLURM_JOB_NODELIST are not set)",
            hint="Submit with `grpo-launch sbatch RECIPE --nodes N`, or run inside `salloc`/`sbatch`.",
        )
    groups = het_groups(environ)
    hosts = list(groups) or expand_nodelist(values["nodelist"])
    per_node = _gpus_per_node(values)
    counts = {h: per_node for h in hosts}
    job = scontrol(["show", "job", "-d", values["job_id"]])
    gres = parse_job_gres(job, expand_nodelist) if job else {}
    if gres and set(gres) >= set(hosts):
        counts = {h: gres[h] for h in hosts}
    elif groups:
        counts = het_gpus_per_node(environ, groups, per_node)
    uneven = [k for k in set(groups.values()) if len({n for h, n in counts.items() if groups[h] == k}) > 1]
    if (not groups and len(set(counts.values())) > 1) or uneven:
        raise ProbeError(
            "the allocation's nodes have different GPU counts: " + ", ".join(f"{h}={n}" for h, n in counts.items()),
            hint="accelerate runs the same number of processes on every node: request whole, alike nodes "
            "(grpo-launch sbatch --gpus-per-node G, or sbatch --gpus-per-node=G --exclusive).",
        )
    own = {h: component_values(environ, values, groups[h]) if groups else values for h in hosts}
    cpus: dict[str, int | None] = dict.fromkeys(hosts)
    for part in [[h for h in hosts if groups[h] == k] for k in sorted(set(groups.values()))] or [hosts]:
        per_node_cpus = own[part[0]].get("cpus_per_node")  # SLURM_JOB_CPUS_PER_NODE: "72(x2),36"
        expanded = expand_counts(per_node_cpus) if per_node_cpus else []
        if len(expanded) == len(part):
            cpus.update(zip(part, expanded, strict=True))
    nodes = scontrol(["show", "node", "-o", ",".join(hosts)])
    addresses = parse_node_addresses(nodes) if nodes else {}
    real_memory = parse_node_memory(nodes) if nodes else {}
    reports, failed = steps(counts, groups=groups)
    name, mem = local_gpu_model(local)
    out, models, warnings = [], {}, []
    for h, c in cpus.items():
        report = reports.get(h)
        if report is None:
            gpus = tuple(Gpu(visible_id=str(i), name=name, memory_bytes=mem) for i in range(counts[h]))
        else:
            gpus = reported_gpus(report, counts[h])
            if len(gpus) < counts[h]:
                raise ProbeError(
                    f"Slurm gives this job {counts[h]} GPU(s) on {h}, but a step there sees {len(gpus)}",
                    hint="Check the node's driver (nvidia-smi in an srun step on it) or exclude it (sbatch --exclude).",
                )
            c = c or (report["cpus"] if isinstance(report.get("cpus"), int) else None)
            models.update({h: gpus[0].name} if gpus else {})
        ram = report.get("memory_bytes") if report else None
        memory = _smallest(ram if isinstance(ram, int) else None, real_memory.get(h), job_memory_limit(own[h], c))
        out.append(Host(name=h, gpus=gpus, address=addresses.get(h), memory_bytes=memory, cpus=c))
    if failed:
        why = "; ".join(failed[:4]) + (f"; and {len(failed) - 4} more" if len(failed) > 4 else "")
        warnings.append(f"could not probe every node with srun ({why}): assumed like this node")
    if any(g.memory_bytes is None for host in out for g in host.gpus):
        warnings.append("GPU model unknown on some node (no NVML); memory not checked")
    return Topology(tuple(out), "slurm", (*warnings, *mixed_models_warning(models)), trainers_share_this_cache=True)


def parse_end_time(text: str) -> float | None:
    """``EndTime=2026-11-22T10:00:00`` of ``scontrol show job -o`` (the cluster's local time) as epoch seconds;
    None for Unknown / no limit."""
    m = re.search(r"(?:^|\s)EndTime=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", text)
    if not m:
        return None
    try:
        return time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def job_end_time(job_id: str, scontrol: Callable[[Sequence[str]], str | None] = run_scontrol) -> float | None:
    """When the job reaches its time limit (epoch seconds), or None."""
    text = scontrol(["show", "job", "-o", job_id])
    return parse_end_time(text) if text else None


def srun_spec(
    spec: ProcessSpec, *, python: str, gpus_on_node: int, cpus_on_node: int | None, het_group: int = 0
) -> ProcessSpec:
    """``spec`` as one Slurm step on its node.

    The step asks for all of the node's GPUs and CPUs and overlaps with the node's other step (vLLM next to the
    trainers); :mod:`grpo_launch.node.shim` then narrows CUDA_VISIBLE_DEVICES to the planned positions of the list Slurm
    gives the step (Slurm numbers job GPUs its own way: with device cgroups 0..k-1, without them the node's
    indices). In a heterogeneous job a node of component k takes ``--het-group=k``. ``--kill-on-bad-exit`` ends the
    step when its task fails. ``--hold-term``: Slurm signals the step's
    tasks itself (a preemption's GraceTime sends SIGTERM to them, not to grpo-launch): the task holds it, so the
    trainers checkpoint at the end of the step in flight and the vLLM server serves that step (see the shim).
    """
    assert spec.host, "srun_spec needs a host"
    argv = [
        "srun",
        *([f"--het-group={het_group}"] if het_group else []),
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={spec.host}",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        f"--job-name={spec.name}",
    ]
    if cpus_on_node:
        argv.append(f"--cpus-per-task={cpus_on_node}")
    if gpus_on_node:
        argv.append(f"--gres=gpu:{gpus_on_node}")
    task = [python, "-m", "grpo_launch.node.shim", "--hold-term"]
    if spec.gpus is not None:
        task += ["--gpus", ",".join(spec.gpus)]
    return ProcessSpec(
        name=spec.name, argv=(*argv, *task, "--", *spec.argv), env=dict(spec.env), host=spec.host, role=spec.role
    )

"""What the job runs on: hosts and their GPUs. Frozen data plus the pure parser for ``--gpus`` spec strings."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import field

from grpo_launch.errors import ProbeError, short
from grpo_launch.machines.gpus import GIB, GPU_SPECS, GpuSpec, find_gpu_spec, find_sold_as, sold_sizes
from grpo_launch.spec import frozen


@frozen
class Gpu:
    """One GPU as the processes on its host address it.

    ``visible_id`` is the token to put in ``CUDA_VISIBLE_DEVICES`` for a child (an index, a ``GPU-`` UUID or a MIG
    id, exactly as the user's own ``CUDA_VISIBLE_DEVICES`` named it), so a child's view is a subset of the parent's.
    """

    visible_id: str
    name: str = "unknown"
    memory_bytes: int | None = None
    uuid: str | None = None

    @property
    def memory_gib(self) -> float | None:
        return None if self.memory_bytes is None else self.memory_bytes / GIB


@frozen
class Host:
    """One machine: its name, its GPUs, the address the others reach it at, its CPUs and memory when known."""

    name: str
    gpus: tuple[Gpu, ...] = ()
    address: str | None = None  # reachable address (IP or resolvable name); None → the name
    cpus: int | None = None  # its CPUs, when known
    memory_bytes: int | None = None  # host RAM, when known (offload needs it)
    slots: int | None = None  # training processes on a GPU-less host (hostfile slots=N, one per Ray CPU node)

    @property
    def addr(self) -> str:
        return self.address or self.name


@frozen
class Topology:
    """Hosts in launch order. ``source`` says where it was read from (nvml, cuda_visible_devices, slurm, …): a label
    for people (the plan's table, plan.json). What planning and the checks before a start need to know of where the
    machines came from, the backend that read them says in the fields after it; no code outside backends/ reads a
    backend's name."""

    hosts: tuple[Host, ...]
    source: str
    warnings: tuple[str, ...] = field(default=(), compare=False)
    # The machines --gpus names: nothing probed and nothing started on them (``--gpus cpu`` asks for a CPU plan).
    named_by_user: bool = field(default=False, compare=False)
    # How to name these machines' GPUs with the flags they came from: the fix offered when no GPU was found.
    naming_gpus: str = field(
        default="plan for GPUs: --gpus 8xH100-80GB, or fix the NVIDIA driver / NVML", compare=False
    )
    # The trainers start with this process's environment and Hugging Face cache (this machine; a Slurm allocation,
    # whose launcher runs on its first node): a Hub model they cannot load is refused before anything starts.
    trainers_share_this_cache: bool = field(default=False, compare=False)
    # A batch job plans its split again on the machines it is given when it starts (an sbatch request).
    planned_again_at_start: bool = field(default=False, compare=False)
    # A GPU the table does not know, with the peak and bandwidth the user gave (--gpus 4xFOO-48GB@150TF@0.9TBs).
    given_spec: GpuSpec | None = None
    # Every such GPU of a mixed spec (--gpus 8xH100-80GB+8xFOO-48GB@150TF@0.9TBs), one per group that gave one.
    given_specs: tuple[GpuSpec, ...] = ()

    def spec_of(self, name: str) -> GpuSpec | None:
        """The GPU table's entry for a model name, else the one the user described for it; None when neither."""
        known = find_gpu_spec(name)
        if known is not None:
            return known
        given = (*self.given_specs, *((self.given_spec,) if self.given_spec else ()))
        return next((g for g in given if g.name == name), None)

    @functools.cached_property
    def gpu_types(self) -> tuple[str, ...]:
        """The GPU models of the hosts, in the order their first host comes (one for a uniform cluster)."""
        return tuple(dict.fromkeys(g.name for h in self.hosts for g in h.gpus))

    def only(self, names: tuple[str, ...] | list[str]) -> Topology:
        """The same topology restricted to the hosts named (in its order): what one role's GPUs are priced on. All
        of it when ``names`` is empty or names every host."""
        wanted = set(names)
        kept = tuple(h for h in self.hosts if h.name in wanted)
        if not kept or len(kept) == len(self.hosts):
            return self
        return dataclasses.replace(self, hosts=kept)

    def hosts_of(self, name: str) -> tuple[Host, ...]:
        """The hosts whose GPUs are all of model ``name``."""
        return tuple(h for h in self.hosts if h.gpus and all(g.name == name for g in h.gpus))

    @property
    def is_rocm(self) -> bool:
        """AMD GPUs (a table entry of AMD's, or a name that says AMD / Instinct): ROCm's visibility variables."""
        names = {g.name for h in self.hosts for g in h.gpus}
        specs = [find_gpu_spec(n) for n in names]
        return any(s is not None and s.vendor == "amd" for s in specs) or any(
            "amd" in n.lower() or "instinct" in n.lower() for n in names
        )

    @property
    def planning_gpu_spec(self) -> GpuSpec | None:
        """The GPU step times are planned for: the table's entry for :attr:`planning_gpu_name`, else the one the
        user described; None when neither (time is then not estimated, memory still is)."""
        if self.is_cpu:
            return None
        return self.spec_of(self.planning_gpu_name) or self.given_spec

    @property
    def time_missing(self) -> str | None:
        """Why step times cannot be estimated on these GPUs, in one line (None when they can, or on CPU)."""
        if self.is_cpu or self.planning_gpu_spec is not None:
            return None
        name = self.planning_gpu_name
        if name == "mixed":
            return "no step time: one of the mixed GPU models is not in the GPU table"
        per = self.gpus_per_host[0] if self.hosts else 1
        mem = self.min_gpu_memory_bytes
        size = f"-{mem / 1e9:.0f}GB" if mem else ""
        return (
            f"no step time: {name} is not in the GPU table; give its dense bf16 peak and memory bandwidth, "
            f"e.g. --gpus {per}x{name}{size}@150TF@0.9TBs"
        )

    @functools.cached_property
    def num_gpus(self) -> int:
        return sum(len(h.gpus) for h in self.hosts)

    @property
    def is_cpu(self) -> bool:
        return self.num_gpus == 0

    @functools.cached_property
    def gpus_per_host(self) -> tuple[int, ...]:
        return tuple(len(h.gpus) for h in self.hosts)

    @functools.cached_property
    def gpu_name(self) -> str:
        names = {g.name for h in self.hosts for g in h.gpus}
        return names.pop() if len(names) == 1 else ("mixed" if names else "cpu")

    @functools.cached_property
    def planning_gpu_name(self) -> str:
        """The GPU model step times are planned for: the only one, or of mixed models the slowest the table knows
        (every GPU steps together); "mixed" when one of them is not in the table."""
        names = {g.name for h in self.hosts for g in h.gpus}
        if len(names) < 2:
            return self.gpu_name
        specs = {n: self.spec_of(n) for n in names}
        if any(s is None for s in specs.values()):
            return "mixed"
        return min(names, key=lambda n: (specs[n].bf16_tflops, specs[n].bandwidth_tbs, n))  # type: ignore[union-attr]

    @property
    def min_host_memory_bytes(self) -> int | None:
        """The smallest host RAM of the hosts, when every host's is known."""
        mems = [h.memory_bytes for h in self.hosts]
        return None if not mems or None in mems else min(m for m in mems if m is not None)

    @functools.cached_property
    def min_gpu_memory_bytes(self) -> int | None:
        mems = [g.memory_bytes for h in self.hosts for g in h.gpus]
        return None if not mems or None in mems else min(m for m in mems if m is not None)

    def describe(self) -> str:
        if self.is_cpu:
            return f"{len(self.hosts)} host(s), no GPU (CPU)"
        if len(self.gpu_types) > 1:  # mixed: each type's share, in host order
            return " + ".join(self._describe_hosts(self.hosts_of(t)) or t for t in self.gpu_types) or "mixed"
        return self._describe_hosts(self.hosts)

    @staticmethod
    def _describe_hosts(hosts: tuple[Host, ...]) -> str:
        if not hosts:
            return ""
        names = {g.name for h in hosts for g in h.gpus}
        name = names.pop() if len(names) == 1 else "mixed"
        per_host = tuple(len(h.gpus) for h in hosts)
        counts = set(per_host)
        per = f"{counts.pop()}" if len(counts) == 1 else "/".join(map(str, per_host))
        mems = [g.memory_bytes for h in hosts for g in h.gpus]
        mem = None if None in mems else min(m for m in mems if m is not None)
        mem_s = f" {mem / GIB:.0f} GiB" if mem else ""
        prefix = f"{len(hosts)} × " if len(hosts) > 1 else ""
        return f"{prefix}{per} × {name}{mem_s}"


# The model: a table name (hyphens included: H100-PCIe, RTX6000-Ada), or any name without hyphens plus its memory.
_TABLE_NAMES = "|".join(re.escape(g.name) for g in sorted(GPU_SPECS, key=lambda g: -len(g.name)))
SPEC_PATTERN = re.compile(
    rf"^(?:(?P<nodes>\d+)x)?(?P<count>\d+)x(?P<model>{_TABLE_NAMES}|[A-Za-z0-9][A-Za-z0-9_.]*?)"
    r"(?:-(?P<mem>\d+(?:\.\d+)?)(?P<unit>GB|G|GiB))?"
    r"(?:@(?P<tflops>\d+(?:\.\d+)?)TF)?(?:@(?P<tbs>\d+(?:\.\d+)?)TB/?s)?$",
    re.IGNORECASE | re.ASCII,
)
MAX_GPU_GB = 4096  # no GPU comes near this
MIN_GPU_GB = 1  # below this not even a model's embedding fits: a typo (8xFOO-0.001GB), refused naming the spec
# No cluster has more: the largest Slurm systems have some thousands of GPU nodes of 4–8 GPUs (an HGX B200 has 8).
MAX_NODES, MAX_GPUS_PER_NODE = 4096, 64
MAX_TFLOPS, MAX_TBS = 20_000, 100  # a B200 is 2,250 dense bf16 TF and 8 TB/s
SPEC_HELP = (
    "Examples: --gpus 4xL20-48GB, --gpus 8xH100-80GB, --gpus 2x8xH100-80GB (nodes × GPUs), --gpus cpu; a GPU the "
    "table lacks: --gpus 4xFOO-48GB@150TF@0.9TBs (dense bf16 TFLOP/s, memory TB/s); mixed GPU types, one group "
    "each joined by +: --gpus 8xH100-80GB+8xH20-96GB, --gpus 2x8xH100-80GB+1x8xL40S-48GB."
)


def parse_gpu_spec(spec: str, *, cpu_processes: int | None = None) -> Topology:
    """``"2x8xH100-80GB"`` → a simulated topology of 2 hosts with 8 H100s each.

    The memory suffix may be left out for GPUs in the built-in table (``8xH100``). ``cpu`` (or ``0``) is a host
    without GPUs.
    """
    text = spec.strip()
    if not text:
        raise ProbeError("--gpus is empty", hint=SPEC_HELP)
    if text.lower() in ("cpu", "0", "none"):
        return Topology(hosts=(Host(name="localhost", cpus=cpu_processes),), source="spec", named_by_user=True)
    if "+" in text:
        return _parse_groups(text)
    return _parse_group(text, spec)


def _parse_groups(text: str) -> Topology:
    """``8xH100-80GB+8xH20-96GB``: the hosts of each group in order, named node0, node1, … across the groups."""
    groups = [g.strip() for g in text.split("+")]
    parts: list[Topology] = []
    for i, group in enumerate(groups, 1):
        where = f"--gpus {short(text)}: group {i} ({short(group) if group else 'empty'})"
        if not group or group.lower() in ("cpu", "0", "none"):
            raise ProbeError(f"{where} names no GPUs; every group of a mixed spec is NxMODEL", hint=SPEC_HELP)
        try:
            parts.append(_parse_group(group, group))
        except ProbeError as err:
            raise ProbeError(f"{where}: {err.message}", hint=err.hint) from None
    named = [Host(name=f"node{n}", gpus=h.gpus) for n, h in enumerate(h for part in parts for h in part.hosts)]
    given: dict[str, GpuSpec] = {}
    for part in parts:
        if part.given_spec is not None:
            earlier = given.get(part.given_spec.name)
            if earlier is not None and earlier != part.given_spec:
                raise ProbeError(
                    f"--gpus {short(text)}: {part.given_spec.name} is described twice, differently",
                    hint="Give one model's peak and bandwidth once, or name the two models apart.",
                )
            given[part.given_spec.name] = part.given_spec
    specs = tuple(given.values())
    return Topology(
        hosts=tuple(named),
        source="spec",
        named_by_user=True,
        warnings=tuple(w for part in parts for w in part.warnings),
        given_spec=specs[0] if specs else None,
        given_specs=specs,
    )


def _parse_group(text: str, spec: str) -> Topology:
    """One group: ``[NODESx]COUNTxMODEL[-MEM][@TF][@TBs]``."""
    m = SPEC_PATTERN.match(text)
    if not m:
        raise ProbeError(f"cannot read --gpus {short(spec)}", hint=SPEC_HELP)
    nodes = int(m["nodes"] or 1)
    count = int(m["count"])
    if nodes < 1 or count < 1:
        raise ProbeError(f"--gpus {short(spec)}: node and GPU counts must be at least 1", hint=SPEC_HELP)
    if nodes > MAX_NODES or count > MAX_GPUS_PER_NODE:
        raise ProbeError(
            f"--gpus {short(spec)}: at most {MAX_NODES} nodes and {MAX_GPUS_PER_NODE} GPUs per node", hint=SPEC_HELP
        )
    model = m["model"].strip()
    if re.match(r"\d+x", model, re.IGNORECASE):
        raise ProbeError(f"--gpus {short(spec)}: at most two factors, nodes x GPUs per node", hint=SPEC_HELP)
    # "8xA100-40GB" names the 40 GB part; the size a table entry is sold as ("80GB" for an A800, "96GB" for an H20)
    # means that entry and its real memory (NVML's); any other size is read as written: GB = 10^9 bytes, GiB = 2^30.
    in_gb = bool(m["mem"]) and m["unit"].lower() != "gib"
    if in_gb:
        known = find_sold_as(model, float(m["mem"]))
    else:
        known = (find_gpu_spec(f"{model}-{m['mem']}GB") if m["mem"] else None) or find_gpu_spec(model)
    name = known.name if known else model
    if m["mem"]:
        size = float(m["mem"])
        if not MIN_GPU_GB <= size <= MAX_GPU_GB:
            raise ProbeError(
                f"--gpus {short(spec)}: GPU memory must be between {MIN_GPU_GB} and {MAX_GPU_GB} GB", hint=SPEC_HELP
            )
        if known is not None:
            _check_known_size(spec, m, known, size, in_gb=in_gb)
        if known is not None and in_gb and size == known.nominal_gb:
            memory = int(known.memory_gib * GIB)
        else:
            memory = int(size * (GIB if m["unit"].lower() == "gib" else 1e9))
    elif known:
        memory = int(known.memory_gib * GIB)
    else:
        raise ProbeError(
            f"--gpus {spec!r}: unknown GPU model {model!r}; add its memory, e.g. {count}x{model}-48GB",
            hint=SPEC_HELP,
        )
    given = None
    warnings: tuple[str, ...] = ()
    if m["tflops"] or m["tbs"]:
        if known is not None:
            raise ProbeError(
                f"--gpus {short(spec)}: {known.name} is in the GPU table; its peak and bandwidth are "
                "known (drop the @… part)",
                hint=SPEC_HELP,
            )
        if not m["tflops"]:
            raise ProbeError(
                f"--gpus {short(spec)}: give the dense bf16 peak first, e.g. "
                f"{count}x{model}-{m['mem'] or 48}GB@150TF@0.9TBs",
                hint=SPEC_HELP,
            )
        tflops = float(m["tflops"])
        # Decoding is bound by memory bandwidth: without it, the table's GPU nearest in peak lends its own, said.
        nearest = min(GPU_SPECS, key=lambda g: abs(math.log(g.bf16_tflops / tflops)) if tflops > 0 else 0.0)
        tbs = float(m["tbs"]) if m["tbs"] else nearest.bandwidth_tbs
        if not (0 < tflops <= MAX_TFLOPS and 0 < tbs <= MAX_TBS):
            raise ProbeError(
                f"--gpus {short(spec)}: peak must be in (0, {MAX_TFLOPS}] TF and bandwidth in (0, {MAX_TBS}] TB/s",
                hint=SPEC_HELP,
            )
        source = "given with --gpus"
        if not m["tbs"]:
            source += f"; memory bandwidth assumed: {nearest.name}'s {tbs:g} TB/s, the table's GPU nearest in peak"
            warnings += (
                f"{model}: {source.split('; ')[1]} (give yours: --gpus {count}x{model}-"
                f"{m['mem'] or 48}GB@{tflops:g}TF@<TB/s>TBs)",
            )
        given = GpuSpec(name, memory / GIB, tflops, tbs, source=source, nvlink=False)
    hosts = tuple(
        Host(
            name=f"node{n}" if nodes > 1 else "localhost",
            gpus=tuple(Gpu(visible_id=str(i), name=name, memory_bytes=memory) for i in range(count)),
        )
        for n in range(nodes)
    )
    return Topology(hosts=hosts, source="spec", warnings=warnings, given_spec=given, named_by_user=True)


def _check_known_size(spec: str, m: re.Match[str], known: GpuSpec, size: float, *, in_gb: bool) -> None:
    """Refuse a size no GPU of a table model's name has. In GB a size is the one the product is sold as
    (``8xH100-800GB`` and ``8xA100-48GB`` are typos: read as written they planned an "H100-80GB" of 745 GiB and an
    "A100-80GB" of 45 GiB); in GiB it is a measurement (what nvidia-smi reports, a MIG slice), which may be less
    than the product has but not more."""
    model = m["model"]
    sizes = sold_sizes(model)
    prefix = f"{m['nodes'] + 'x' if m['nodes'] else ''}{m['count']}x{model}"
    hint = (
        f"Write the size it is sold as ({', '.join(f'{prefix}-{s}GB' for s in sizes)}), or a measured memory in GiB "
        f"up to the product's (what nvidia-smi reports: {prefix}-{known.memory_gib:g}GiB for the {known.name})."
    )
    sold = " or ".join(f"{s} GB" for s in sizes)
    if in_gb and size != known.nominal_gb:
        raise ProbeError(
            f"--gpus {short(spec)}: no {model} is sold with {size:g} GB; {model} GPUs have {sold}", hint=hint
        )
    if not in_gb and size > known.nominal_gb:
        raise ProbeError(
            f"--gpus {short(spec)}: no {known.name} has {size:g} GiB (it has {known.memory_gib:g} GiB; "
            f"{model} GPUs are sold with {sold})",
            hint=hint,
        )

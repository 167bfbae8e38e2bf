"""Read the machine: NVML, ``CUDA_VISIBLE_DEVICES``, the Slurm allocation or a hostfile → :class:`Topology`.

This is the I/O edge of planning. Parsers are pure functions; the environment is passed in as a mapping.
NVML missing or failing is a warning and a fallback, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from grpo_launch.errors import ProbeError
from grpo_launch.hardware import ModelShape, find_model_shape, shape_from_config
from grpo_launch.topology import Gpu, Host, Topology

_UUID = re.compile(r"^GPU-[0-9a-fA-F]{2,}(-[0-9a-fA-F]+)*$")
_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+/\d+/\d+|[0-9a-fA-F]{2,}(-[0-9a-fA-F]+)*)$")
CVD_HELP = (
    "CUDA_VISIBLE_DEVICES takes comma-separated GPU indices (0,1,2), GPU-UUIDs or MIG ids, each once; "
    "unset it to use every GPU, or set it to '' for none."
)


def parse_cuda_visible_devices(value: str | None) -> tuple[str, ...] | None:
    """The tokens of ``CUDA_VISIBLE_DEVICES``; None when unset (all GPUs), () when it hides every GPU."""
    if value is None:
        return None
    text = value.strip()
    if text in ("", "-1", "NoDevFiles", "none"):
        return ()
    tokens = tuple(t.strip() for t in text.split(","))
    seen: set[str] = set()
    for t in tokens:
        ok = (t.isdigit() and len(t) < 6) or _UUID.match(t) or _MIG.match(t)
        if not ok:
            raise ProbeError(f"CUDA_VISIBLE_DEVICES={value!r}: cannot read {t!r}", hint=CVD_HELP)
        if t in seen:
            raise ProbeError(f"CUDA_VISIBLE_DEVICES={value!r}: {t!r} appears twice", hint=CVD_HELP)
        seen.add(t)
    return tokens


@dataclass(frozen=True)
class NvmlDevice:
    index: int
    name: str
    memory_bytes: int
    uuid: str
    mig: tuple[tuple[str, int], ...] = ()  # (MIG uuid, memory bytes) when MIG mode is on


def read_nvml() -> list[NvmlDevice]:
    """Every GPU NVML sees, in NVML (PCI bus) order. Raises whatever pynvml raises; callers fall back."""
    import pynvml

    pynvml.nvmlInit()
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            migs: list[tuple[str, int]] = []
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(h)
            except pynvml.NVMLError:
                current = 0
            if current:
                for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except pynvml.NVMLError:
                        continue
                    muuid = pynvml.nvmlDeviceGetUUID(mh)
                    muuid = muuid.decode() if isinstance(muuid, bytes) else muuid
                    migs.append((muuid, int(pynvml.nvmlDeviceGetMemoryInfo(mh).total)))
            devices.append(NvmlDevice(i, name, mem, uuid, tuple(migs)))
        return devices
    finally:
        pynvml.nvmlShutdown()


def _nvml_or_warning(read: Callable[[], list[NvmlDevice]]) -> tuple[list[NvmlDevice] | None, str | None]:
    try:
        return read(), None
    except ImportError:
        return None, "nvidia-ml-py is not installed: cannot read GPU names and memory"
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, …: a machine without an NVIDIA driver
        return None, f"NVML unavailable ({type(exc).__name__}: {exc})"


def _local_gpus(devices: Sequence[NvmlDevice], tokens: Sequence[str] | None, raw: str | None) -> tuple[Gpu, ...]:
    def as_gpus(d: NvmlDevice, token: str) -> list[Gpu]:
        if d.mig:
            # A MIG-enabled GPU is addressed through its instances; list each as its own device.
            return [Gpu(visible_id=u, name=f"{d.name} MIG", memory_bytes=m, uuid=u) for u, m in d.mig]
        return [Gpu(visible_id=token, name=d.name, memory_bytes=d.memory_bytes, uuid=d.uuid)]

    if tokens is None:
        return tuple(g for d in devices for g in as_gpus(d, str(d.index)))
    out: list[Gpu] = []
    for t in tokens:
        if t.isdigit():
            idx = int(t)
            if idx >= len(devices):
                raise ProbeError(
                    f"CUDA_VISIBLE_DEVICES={raw!r} names GPU {idx}, but this machine has {len(devices)} GPU(s)",
                    hint=CVD_HELP,
                )
            out += as_gpus(devices[idx], t)
        elif t.startswith("GPU-"):
            match = [d for d in devices if d.uuid.startswith(t)]
            if len(match) != 1:
                raise ProbeError(f"CUDA_VISIBLE_DEVICES={raw!r}: no single GPU has UUID {t!r}", hint=CVD_HELP)
            out += as_gpus(match[0], t)
        else:
            migs = [(d, u, m) for d in devices for u, m in d.mig if u == t or u.startswith(t)]
            if len(migs) != 1:
                raise ProbeError(f"CUDA_VISIBLE_DEVICES={raw!r}: no MIG device {t!r}", hint=CVD_HELP)
            d, u, m = migs[0]
            out.append(Gpu(visible_id=t, name=f"{d.name} MIG", memory_bytes=m, uuid=u))
    return tuple(out)


def probe_local(
    environ: Mapping[str, str], *, read: Callable[[], list[NvmlDevice]] = read_nvml, hostname: str | None = None
) -> Topology:
    """This machine's GPUs as the processes started from here would see them."""
    name = hostname or socket.gethostname()
    cpus = os.cpu_count()
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    tokens = parse_cuda_visible_devices(raw)
    if tokens == ():
        return Topology(hosts=(Host(name=name, cpus=cpus),), source="cuda_visible_devices")
    devices, warning = _nvml_or_warning(read)
    if devices is None:
        if tokens:
            gpus = tuple(Gpu(visible_id=t) for t in tokens)
            warn = f"{warning}; using CUDA_VISIBLE_DEVICES={raw} with unknown GPU model and memory"
            return Topology((Host(name=name, gpus=gpus, cpus=cpus),), "cuda_visible_devices", (warn,))
        warn = f"{warning}; planning for CPU (use --gpus to plan for GPUs, e.g. --gpus 8xH100-80GB)"
        return Topology((Host(name=name, cpus=cpus),), "cpu", (warn,))
    gpus = _local_gpus(devices, tokens, raw)
    source = "nvml" if tokens is None else "nvml+cuda_visible_devices"
    return Topology((Host(name=name, gpus=gpus, cpus=cpus),), source if gpus else "cpu")


# ------------------------------------------------------------------------------------------------ Slurm

# Every Slurm variable grpo-launch reads, in one place.
SLURM_VARIABLES = {
    "job_id": "SLURM_JOB_ID",
    "nodelist": "SLURM_JOB_NODELIST",
    "num_nodes": "SLURM_JOB_NUM_NODES",
    "gpus_on_node": "SLURM_GPUS_ON_NODE",
    "gpus_per_node": "SLURM_GPUS_PER_NODE",
    "job_gpus": "SLURM_JOB_GPUS",
    "node_name": "SLURMD_NODENAME",
    "cpus_per_node": "SLURM_JOB_CPUS_PER_NODE",
}


def slurm_values(environ: Mapping[str, str]) -> dict[str, str]:
    """The Slurm variables that are set, by their short names."""
    return {k: environ[v] for k, v in SLURM_VARIABLES.items() if environ.get(v)}


def expand_nodelist(nodelist: str) -> list[str]:
    """``"n[1-3],gpu07"`` → ``["n1", "n2", "n3", "gpu07"]``; quotes the bad input on error."""
    import hostlist  # python-hostlist: pure Python, cheap to import

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
            m = re.match(r"^(?:[\w-]+:)?(\d+)", values[key])
            if not m:
                raise ProbeError(f"cannot read {SLURM_VARIABLES[key]}={values[key]!r}")
            return int(m.group(1))
    if "job_gpus" in values:
        return len([g for g in values["job_gpus"].split(",") if g])
    return 0


def _local_gpu_model(local: Topology | None) -> tuple[str, int | None]:
    """This node's GPU name and memory, assumed for every node of a Slurm job or hostfile."""
    gpus = local.hosts[0].gpus if local and local.hosts else ()
    return (gpus[0].name, gpus[0].memory_bytes) if gpus else ("unknown", None)


def run_scontrol(args: Sequence[str]) -> str | None:
    """``scontrol ARGS`` output, or None when scontrol is missing or fails (callers fall back to the variables)."""
    import subprocess

    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def probe_slurm(
    environ: Mapping[str, str],
    *,
    local: Topology | None = None,
    scontrol: Callable[[Sequence[str]], str | None] = run_scontrol,
) -> Topology:
    """The current Slurm allocation: its nodes, their addresses (NodeAddr), CPUs and GPUs per node.

    GPUs per node come from ``scontrol show job -d`` (every node) or else the variables of this node; nodes with
    different GPU counts are an error. GPU model and memory come from this node's NVML (nodes assumed alike).
    """
    from grpo_launch.slurm import expand_counts, parse_job_gres, parse_node_addresses

    values = slurm_values(environ)
    if "job_id" not in values or "nodelist" not in values:
        raise ProbeError(
            "not inside a Slurm allocation (SLURM_JOB_ID / SLURM_JOB_NODELIST are not set)",
            hint="Submit with `grpo-launch sbatch RECIPE --nodes N`, or run inside `salloc`/`sbatch`.",
        )
    hosts = expand_nodelist(values["nodelist"])
    per_node = _gpus_per_node(values)
    counts = {h: per_node for h in hosts}
    job = scontrol(["show", "job", "-d", values["job_id"]])
    if job:
        gres = parse_job_gres(job, expand_nodelist)
        if gres and set(gres) >= set(hosts):
            counts = {h: gres[h] for h in hosts}
    if len(set(counts.values())) > 1:
        raise ProbeError(
            "the allocation's nodes have different GPU counts: " + ", ".join(f"{h}={n}" for h, n in counts.items()),
            hint="accelerate runs the same number of processes on every node: request whole, alike nodes "
            "(grpo-launch sbatch --gpus-per-node G, or sbatch --gpus-per-node=G --exclusive).",
        )
    cpus: list[int | None] = [None] * len(hosts)
    if "cpus_per_node" in values:
        expanded = expand_counts(values["cpus_per_node"])
        if len(expanded) == len(hosts):
            cpus = list(expanded)
    nodes = scontrol(["show", "node", "-o", ",".join(hosts)])
    addresses = parse_node_addresses(nodes) if nodes else {}
    name, mem = _local_gpu_model(local)
    warnings = []
    if counts[hosts[0]] and mem is None:
        warnings.append("GPU model unknown on this node (no NVML); memory not checked")
    return Topology(
        tuple(
            Host(
                name=h,
                gpus=tuple(Gpu(visible_id=str(i), name=name, memory_bytes=mem) for i in range(counts[h])),
                address=addresses.get(h),
                cpus=c,
            )
            for h, c in zip(hosts, cpus, strict=True)
        ),
        "slurm",
        tuple(warnings),
    )


# ------------------------------------------------------------------------------------------------ hostfile

_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")


def parse_hostfile(text: str, *, source: str = "hostfile") -> list[tuple[str, int]]:
    """DeepSpeed's hostfile format: ``host slots=N`` per line; ``#`` comments and blank lines ignored."""
    out: list[tuple[str, int]] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        where = f"{source}:{lineno}"
        parts = body.split()
        host = parts[0]
        if not (_HOSTNAME.match(host) or _IPV4.match(host)):
            raise ProbeError(f"{where}: {host!r} is not a valid host name", hint="Each line: HOST slots=N")
        slots = None
        for p in parts[1:]:
            key, sep, val = p.partition("=")
            if key != "slots" or not sep:
                raise ProbeError(f"{where}: cannot read {p!r}", hint="Each line: HOST slots=N (e.g. node1 slots=8)")
            if not val.isdigit() or int(val) < 1:
                raise ProbeError(f"{where}: slots must be a positive integer, got {val!r}")
            slots = int(val)
        if slots is None:
            raise ProbeError(f"{where}: {host!r} has no slots=N", hint="Each line: HOST slots=N (e.g. node1 slots=8)")
        if host in seen:
            raise ProbeError(f"{where}: host {host!r} is listed twice (first on line {seen[host]})")
        seen[host] = lineno
        out.append((host, slots))
    if not out:
        raise ProbeError(f"{source} lists no hosts", hint="Each line: HOST slots=N")
    return out


def probe_hostfile(path: str | Path, *, local: Topology | None = None, cpu: bool = False) -> Topology:
    """Hosts from a hostfile; slots are GPUs (or, with ``cpu``, training processes on CPU hosts)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ProbeError(f"cannot read hostfile {str(p)!r}: {exc.strerror}") from None
    entries = parse_hostfile(text, source=str(p))
    name, mem = _local_gpu_model(local)
    if cpu:
        return Topology(tuple(Host(name=h, cpus=n) for h, n in entries), "hostfile")
    hosts = tuple(
        Host(name=h, gpus=tuple(Gpu(visible_id=str(i), name=name, memory_bytes=mem) for i in range(n)))
        for h, n in entries
    )
    return Topology(hosts, "hostfile")


# ------------------------------------------------------------------------------------------------ model shape


def resolve_model_shape(model: str | None) -> tuple[ModelShape | None, str | None]:
    """The model's shape from a local ``config.json`` or the built-in table; (None, warning) if unknown."""
    if not model:
        return None, "no model_name_or_path in the recipe"
    config = Path(model) / "config.json"
    if config.is_file():
        try:
            return shape_from_config(model, json.loads(config.read_text())), None
        except (ValueError, KeyError, TypeError) as exc:
            return None, f"cannot read model shape from {config}: {exc!r}"
    shape = find_model_shape(model)
    if shape:
        return shape, None
    return None, (
        f"model {model!r} is not in the built-in table and has no local config.json: "
        "tensor-parallel size and memory are not checked"
    )

"""Hostfiles: DeepSpeed's ``host slots=N`` lines (plus grpo-launch's ``gpu=MODEL``) read into a Topology.
Every malformed line is one ProbeError naming the line."""

from __future__ import annotations

import re
from pathlib import Path

from grpo_launch.errors import ProbeError, is_decimal, short
from grpo_launch.machines.gpus import GIB, find_gpu_spec
from grpo_launch.machines.topology import Gpu, Host, Topology
from grpo_launch.probe.hosts import local_gpu_model, mixed_models_warning, reported_gpus

__all__ = ["parse_hostfile", "parse_hostfile_gpus", "probe_hostfile"]


_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$", re.ASCII)
MAX_SLOTS = 1024  # GPUs, or CPU training processes, per host
MAX_HOSTS = 4096  # as --gpus
HOSTFILE_HINT = "Each line: HOST slots=N [gpu=MODEL] (e.g. node1 slots=8 gpu=H100-80GB)"


def naming_gpus(first: str) -> str:
    """How a hostfile names its hosts' GPUs (the fix when no GPU was found on them)."""
    return f"name the hosts' GPUs in the hostfile: {first} slots=8 gpu=H100-80GB"


def parse_hostfile(text: str, *, source: str = "hostfile") -> list[tuple[str, int]]:
    """DeepSpeed's hostfile format: ``host slots=N`` per line; ``#`` comments and blank lines ignored."""
    return [(host, slots) for host, slots, _ in parse_hostfile_gpus(text, source=source)]


def parse_hostfile_gpus(text: str, *, source: str = "hostfile") -> list[tuple[str, int, str | None]]:
    """The hostfile's hosts with their slots and, when a line says ``gpu=MODEL`` (grpo-launch's addition, for
    planning from a machine without those GPUs), the GPU model: ``node1 slots=8 gpu=H100-80GB``."""
    out: list[tuple[str, int, str | None]] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        where = f"{source}:{lineno}"
        parts = body.split()
        host = parts[0]
        if not (_HOSTNAME.match(host) or _IPV4.match(host)):
            raise ProbeError(f"{where}: {short(host)} is not a valid host name", hint=HOSTFILE_HINT)
        slots, gpu = None, None
        for p in parts[1:]:
            key, sep, val = p.partition("=")
            if key == "gpu" and sep and gpu is None:
                if find_gpu_spec(val) is None:
                    raise ProbeError(f"{where}: unknown GPU model {short(val)}", hint="e.g. gpu=H100-80GB, gpu=L20")
                gpu = val
                continue
            if key != "slots" or not sep:
                raise ProbeError(f"{where}: cannot read {short(p)}", hint=HOSTFILE_HINT)
            if slots is not None:
                raise ProbeError(f"{where}: slots= is given twice for {short(host)}")
            if not is_decimal(val) or not 1 <= int(val) <= MAX_SLOTS:
                raise ProbeError(f"{where}: slots must be an integer from 1 to {MAX_SLOTS}, got {short(val)}")
            slots = int(val)
        if slots is None:
            raise ProbeError(f"{where}: {short(host)} has no slots=N", hint=HOSTFILE_HINT)
        if host.lower() in seen:  # host names are case-insensitive
            raise ProbeError(f"{where}: host {short(host)} is listed twice (first on line {seen[host.lower()]})")
        seen[host.lower()] = lineno
        out.append((host, slots, gpu))
        if len(out) > MAX_HOSTS:
            raise ProbeError(f"{source} lists more than {MAX_HOSTS} hosts")
    if not out:
        raise ProbeError(f"{source} lists no hosts", hint="Each line: HOST slots=N")
    return out


def read_hostfile(path: str | Path) -> list[tuple[str, int, str | None]]:
    """The hostfile's lines (host, slots, gpu model or None), each malformed one a ProbeError."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ProbeError(f"cannot read hostfile {short(str(p))}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ProbeError(f"hostfile {short(str(p))} is not a UTF-8 text file") from None
    return parse_hostfile_gpus(text, source=str(p))


def probe_hostfile(
    path: str | Path,
    *,
    local: Topology | None = None,
    cpu: bool = False,
    entries: list[tuple[str, int, str | None]] | None = None,
) -> Topology:
    """Hosts from a hostfile (or its lines already read); slots are GPUs of the model a line names (gpu=MODEL) or
    of this machine's model; with ``cpu`` (this machine has none) and no model named, training processes on CPU
    hosts, with a warning. Lines naming different models are planned by role (each role on its own hosts' GPUs),
    with a warning; some lines naming a model and others none (on a machine without GPUs) is an error."""
    p = Path(path)
    entries = read_hostfile(p) if entries is None else entries
    local_name, local_mem = local_gpu_model(local)
    if not any(g for _, _, g in entries) and cpu:
        warn = (
            "this machine has no GPU and the hostfile names no GPU model: its slots are planned as CPU processes "
            "(add gpu=MODEL to each line, e.g. node1 slots=8 gpu=H100-80GB, to plan the hosts' GPUs)"
        )
        slots = tuple(Host(name=h, slots=n) for h, n, _ in entries)
        return Topology(slots, "hostfile", (warn,), naming_gpus=naming_gpus(slots[0].name))
    unnamed = [h for h, _, g in entries if g is None]
    if unnamed and cpu:
        raise ProbeError(
            f"hostfile {short(str(p))}: {', '.join(unnamed[:4])} name no GPU model and this machine has none "
            "to assume for them",
            hint="Give every line gpu=MODEL (e.g. node1 slots=8 gpu=H100-80GB), or none (probed over ssh).",
        )
    hosts, models = [], {}
    for h, n, named in entries:
        spec = find_gpu_spec(named) if named else None
        name, mem = (spec.name, int(spec.memory_gib * GIB)) if spec else (local_name, local_mem)
        hosts.append(Host(name=h, gpus=tuple(Gpu(visible_id=str(i), name=name, memory_bytes=mem) for i in range(n))))
        models[h] = name
    return Topology(tuple(hosts), "hostfile", mixed_models_warning(models), naming_gpus=naming_gpus(hosts[0].name))


def topology_from_probes(entries: list[tuple[str, int, str | None]], probes: dict[str, dict], source: str) -> Topology:
    """The hostfile's hosts as each one reported itself: its GPUs (``slots`` of them are used), CPUs and RAM."""
    hosts, kinds, models = [], set(), {}
    for name, slots, _ in entries:
        info = probes[name]
        gpus, ram = info.get("gpus") or [], info.get("memory_bytes")
        kinds.add(bool(gpus))
        if gpus and slots > len(gpus):
            raise ProbeError(f"{source}: {name} has {len(gpus)} GPU(s) but slots={slots}", hint="slots = GPUs to use")
        if gpus:
            models[name] = gpus[0][0]
            used = reported_gpus(info, slots)
            hosts.append(Host(name=name, gpus=used, cpus=info.get("cpus"), memory_bytes=ram))
        else:
            hosts.append(Host(name=name, cpus=info.get("cpus"), memory_bytes=ram, slots=slots))
    if len(kinds) > 1:
        raise ProbeError(f"{source}: some hosts have GPUs and some have none", hint="Use hosts of one kind.")
    return Topology(tuple(hosts), "hostfile", mixed_models_warning(models), naming_gpus=naming_gpus(hosts[0].name))

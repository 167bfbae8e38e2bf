"""The Ray cluster as the Ray backend sees it: connecting (with the version and address checked first), the nodes
that can run the plan's processes, each node's own report from a task pinned to it, a shell line run on chosen
nodes, and the placement groups that reserve each host's GPUs for one attempt.

Only the Ray backend's modules import this, and only when a run uses Ray: ``import ray`` costs seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import socket
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from grpo_launch.errors import LaunchError, ProbeError, install_hint
from grpo_launch.machines.gpus import GIB, find_gpu_spec
from grpo_launch.machines.topology import Gpu, Host, Topology
from grpo_launch.probe.hosts import mixed_models_warning, report_command, reported_gpus
from grpo_launch.recipe.versions import version_tuple

# Ray versions the backend runs with (pyproject.toml's `ray` extra says the same: tests/test_ray_render.py checks).
# The floor is security's: Ray before 2.52 has no token authentication, and its dashboard's job API runs any command
# for anyone who can reach it, a browser on the cluster's network included (CVE-2025-62593, fixed in 2.52.0, which
# also brought RAY_AUTH_MODE=token). The placement-group, node-affinity and job-submission APIs the backend uses are
# stable within Ray 2 (https://docs.ray.io/en/latest/ray-core/api/doc/
# ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy.html); tested with 2.60.0 (tests/test_ray_cluster.py).
RAY_SUPPORTED = ((2, 52), (3, 0))  # [low, high)
RAY_REQUIREMENT = f"ray[default]>={RAY_SUPPORTED[0][0]}.{RAY_SUPPORTED[0][1]},<{RAY_SUPPORTED[1][0]}"
RAY_CVE = "CVE-2025-62593"
NAMESPACE = "grpo-launch"
INSTALL_HINT = f"Install the Ray extra in this environment and on every node: {install_hint('ray')}."
REPORT_TIMEOUT_S = 60.0
RESERVE_TIMEOUT_S = 60.0


def import_ray() -> Any:
    """``ray``, when installed here in a supported version."""
    try:
        import ray
    except ImportError:
        raise LaunchError("the Ray backend needs Ray, which is not installed here", hint=INSTALL_HINT) from None
    check_version(getattr(ray, "__version__", "unknown"))
    return ray


def check_version(version: str) -> None:
    """Refuse a Ray outside :data:`RAY_SUPPORTED`; below its floor, name the vulnerability the floor is for."""
    have, (low, high) = version_tuple(version), RAY_SUPPORTED
    if have is None or not low <= have < high:
        why = ""
        if have is not None and have < low:
            why = (
                f": Ray before {low[0]}.{low[1]} lets anyone who reaches its dashboard run commands on the "
                f"cluster ({RAY_CVE}) and has no token authentication"
            )
        raise LaunchError(
            f"Ray {version} is installed; grpo-launch's Ray backend supports Ray >={low[0]}.{low[1]},<{high[0]}{why}",
            hint=f"pip install '{RAY_REQUIREMENT}' here and on the cluster (the same version everywhere).",
        )


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a GCS address ``HOST:PORT`` (``ray://`` and ``http://`` are other services)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "//" in host:
        return None
    return host.strip("[]"), int(port)


def check_answers(address: str, timeout_s: float = 5.0) -> None:
    """The Ray head's GCS port accepts a connection (``ray.init`` retries a dead address for a minute)."""
    if address == "auto":
        return
    parts = split_address(address)
    if parts is None:
        raise LaunchError(
            f"--ray {address!r} is not a Ray head's address (HOST:PORT of its GCS, e.g. 10.0.0.1:6379)",
            hint="Give the address `ray start --head` printed, or 'auto' on a node of the cluster. For a job "
            "through the dashboard (http://HOST:8265) use `grpo-launch ray-submit`.",
        )
    try:
        with socket.create_connection(parts, timeout=timeout_s):
            pass
    except OSError as exc:
        raise LaunchError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); nothing was started",
            hint="Start one with `ray start --head --port PORT` (then `ray start --address HEAD:PORT` on the other "
            "nodes), or fix --ray / RAY_ADDRESS.",
        ) from None


def connect(address: str) -> Any:
    """``ray`` connected to the cluster at ``address`` (once per process)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    check_answers(address)
    try:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            log_to_driver=False,
            logging_level=logging.ERROR,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise LaunchError(
            f"cannot attach to the Ray cluster at {address}: {str(exc).strip().splitlines()[0][:300]}",
            hint="The cluster must run the same Ray and Python versions as this environment.",
        ) from None
    return ray


def gcs_address(ray: Any) -> str:
    return ray.get_runtime_context().gcs_address


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def usable(nodes: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], bool]:
    """The nodes that can host the plan's processes, and whether they are GPU nodes: those with GPUs when any has,
    else those with at least one CPU to give (a head started with ``--num-gpus 0`` / ``--num-cpus 0`` hosts none)."""
    gpu = [n for n in nodes if n["Resources"].get("GPU", 0) >= 1]
    if gpu:
        return gpu, True
    return [n for n in nodes if n["Resources"].get("CPU", 0) >= 1], False


# ------------------------------------------------------------------------------------------------ tasks on nodes


def _pin(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def run_on_nodes(
    ray: Any,
    argv_by_node: Mapping[str, Sequence[str]],
    *,
    timeout_s: float,
    gpus: Mapping[str, float] | None = None,
    cwd: str | None = None,
) -> dict[str, tuple[int, str, str] | str]:
    """Run a command on each node (node id → argv) in a task pinned there; node id → (exit code, stdout, stderr),
    or why it did not run. ``gpus``: GPUs the task holds on a node (Ray sets CUDA_VISIBLE_DEVICES to them)."""
    from grpo_launch.backends.ray.tasks import shell

    refs = {}
    for node, argv in argv_by_node.items():
        held = (gpus or {}).get(node, 0)
        refs[node] = shell.options(num_cpus=0, num_gpus=held, scheduling_strategy=_pin(node)).remote(
            list(argv), cwd, timeout_s
        )
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s + 15)
    out: dict[str, tuple[int, str, str] | str] = {}
    for node, ref in refs.items():
        if ref not in ready:
            ray.cancel(ref, force=True)
            out[node] = f"no answer within {timeout_s + 15:.0f} s (is the node busy or its GPUs held?)"
            continue
        try:
            out[node] = tuple(ray.get(ref))
        except Exception as exc:  # a task's failure on a node is that node's problem, reported with it
            out[node] = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
    return out


def _address_key(address: str) -> tuple:
    parts = address.split(".")
    return (0, *map(int, parts)) if len(parts) == 4 and all(p.isdigit() for p in parts) else (1, address)


def node_name(node: Mapping[str, Any]) -> str:
    return str(node.get("NodeManagerHostname") or node["NodeManagerAddress"])


def probe_cluster(ray: Any, python: str, environ: Mapping[str, str], skip: Collection[str] = ()) -> Topology:
    """Every usable node as its own report says (GPUs by NVML, CPUs, RAM), from a task pinned to it that holds all
    of the node's GPUs (so it sees the ones Ray will hand out); Ray's resources (GPU count, accelerator_type) where
    a node gives no report. ``skip``: node ids left out (draining: Ray schedules nothing there)."""
    nodes, with_gpus = usable([n for n in alive_nodes(ray) if n["NodeID"] not in skip])
    here = ray.get_runtime_context().get_node_id()
    # In a stable order, this node first when it takes part: the first training host is the main process's
    # (machine rank 0) and the first serving host runs the API server.
    nodes.sort(key=lambda n: (n["NodeID"] != here, _address_key(str(n["NodeManagerAddress"]))))
    if not nodes:
        raise ProbeError(
            "the Ray cluster has no node with a GPU or a CPU to give",
            hint="Start the nodes with their GPUs (`ray start --num-gpus N`) or CPUs.",
        )
    ids = {n["NodeID"]: n for n in nodes}
    held = {i: float(n["Resources"].get("GPU", 0)) for i, n in ids.items()}
    answers = run_on_nodes(ray, {i: report_command(python) for i in ids}, timeout_s=REPORT_TIMEOUT_S, gpus=held)
    hosts, warnings, models = [], [], {}
    for node_id, node in ids.items():
        answer, report = answers[node_id], None
        if isinstance(answer, tuple) and answer[0] == 0:
            try:
                report = json.loads(answer[1].strip().splitlines()[-1])
            except (ValueError, IndexError):
                report = None
        if report is None:
            why = answer if isinstance(answer, str) else (answer[2].strip().splitlines() or ["no output"])[-1]
            warnings.append(f"node {node_name(node)} gave no report ({why[:160]}): planned from Ray's resources")
        hosts.append(_host(node, report, with_gpus))
        if hosts[-1].gpus:
            models[hosts[-1].name] = hosts[-1].gpus[0].name
    names = [h.name for h in hosts]
    if len(set(names)) < len(names):  # nodes sharing a host name (containers): name them by address
        hosts = [dataclasses.replace(h, name=h.address or h.name) for h in hosts]
    return Topology(tuple(hosts), "ray", (*warnings, *mixed_models_warning(models)))


def _host(node: Mapping[str, Any], report: Mapping[str, Any] | None, with_gpus: bool) -> Host:
    resources, address = node["Resources"], str(node["NodeManagerAddress"])
    name = str((report or {}).get("node") or node_name(node))
    memory = (report or {}).get("memory_bytes")
    cpus = int(resources.get("CPU", 0)) or None  # what the node was started with (ray start --num-cpus)
    if not with_gpus:  # CPU nodes: one training process each (CPU runs are for tests and demos)
        return Host(name=name, address=address, cpus=cpus, memory_bytes=memory, slots=1)
    count = int(resources.get("GPU", 0))
    gpus = reported_gpus(report, count) if report else ()
    if len(gpus) < count:  # no report, or NVML sees fewer than Ray hands out: Ray's accelerator type
        kind = next((k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")), None)
        spec = find_gpu_spec(kind) if kind else None
        name_, mem = (spec.name, int(spec.memory_gib * GIB)) if spec else (kind or "unknown", None)
        gpus = tuple(Gpu(visible_id=str(i), name=name_, memory_bytes=mem) for i in range(count))
    return Host(name=name, gpus=gpus, address=address, cpus=cpus, memory_bytes=memory)


def node_ids(ray: Any) -> dict[str, str]:
    """Node address → node id, alive nodes only."""
    return {str(n["NodeManagerAddress"]): n["NodeID"] for n in alive_nodes(ray)}


def draining_nodes(ray: Any) -> dict[str, float | None]:
    """Node id → the drain's deadline (epoch seconds; None: no deadline) of every node being drained (``ray
    drain-node``, the autoscaler's DrainNode for an idle or preempted node). Ray 2.x tells the driver only through
    its GCS state (``ray._private.state``: no public API; Ray Serve reads the same), so an older or changed Ray
    answers nothing here."""
    try:
        draining = ray._private.state.state.get_draining_nodes()
    except Exception:  # private API: without it there is no notice, and a drained node is a lost one
        return {}
    return {
        node if isinstance(node, str) else node.hex(): (ms / 1000 if ms else None)
        for node, ms in dict(draining).items()
    }


# ------------------------------------------------------------------------------------------------ placement


def reserve(ray: Any, name: str, address: str, bundles: Sequence[Mapping[str, float]], *, timeout_s: float) -> Any:
    """A STRICT_PACK placement group named ``name`` whose bundles are pinned to the node at ``address`` (its
    ``node:ADDRESS`` resource), ready; a LaunchError naming what the node lacks when Ray cannot place it."""
    from ray.util.placement_group import placement_group, remove_placement_group

    pinned = [{**{k: v for k, v in b.items() if v}, f"node:{address}": 0.001} for b in bundles]
    pg = placement_group(pinned, strategy="STRICT_PACK", name=name)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if ready:
        return pg
    remove_placement_group(pg)
    need = sum(b.get("GPU", 0) for b in bundles)
    free = _free_on(ray, address)
    raise LaunchError(
        f"Ray could not reserve {need:g} GPU(s) for the plan's processes on node {address} within {timeout_s:.0f} s "
        f"(free there now: {free}); nothing was started",
        hint="Another job holds them, or the node left the cluster: free them (`ray status`), or plan again.",
    )


def _free_on(ray: Any, address: str) -> str:
    try:
        per_node = ray._private.state.available_resources_per_node()  # no public per-node view of free resources
        node = node_ids(ray).get(address)
        have = per_node.get(node, {}) if node else {}
        return ", ".join(f"{k} {v:g}" for k, v in sorted(have.items()) if k in ("GPU", "CPU")) or "nothing"
    except Exception:  # only a detail of the message
        return "unknown"


def release(pgs: Sequence[Any]) -> None:
    from ray.util.placement_group import remove_placement_group

    for pg in pgs:
        with contextlib.suppress(Exception):  # already gone with its node
            remove_placement_group(pg)

"""Other hosts (ssh hostfile hosts, Slurm nodes): each runs :mod:`grpo_launch.node.host_report` and prints what it
has; these gather the reports in parallel and read them into GPUs."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_launch.machines.topology import Gpu, Topology


def local_gpu_model(local: Topology | None) -> tuple[str, int | None]:
    """This node's GPU name and memory, assumed for every node of a Slurm job or hostfile."""
    gpus = local.hosts[0].gpus if local and local.hosts else ()
    return (gpus[0].name, gpus[0].memory_bytes) if gpus else ("unknown", None)


def report_command(python: str) -> list[str]:
    """The command that prints a host's report (:mod:`grpo_launch.node.host_report`) with that host's Python."""
    return [python, "-m", "grpo_launch.node.host_report"]


def collect_reports(
    names: Sequence[str],
    argv_of: Callable[[str], list[str]],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> tuple[dict[str, dict], list[str]]:
    """Run ``argv_of(name)`` (a command printing :mod:`grpo_launch.node.host_report`'s JSON last) for every name in
    parallel:
    ({name: report}, [why each other name gave none]). A command past ``timeout_s`` gets SIGTERM (srun passes it to
    its step), then SIGKILL."""
    import concurrent.futures

    def one(name: str) -> tuple[str, dict | str]:
        try:
            proc = subprocess.Popen(
                argv_of(name),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
            )
        except OSError as exc:
            return name, f"{name}: cannot start {argv_of(name)[0]} ({exc.strerror or exc})"
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            return name, f"{name}: no report within {timeout_s:.0f} s"
        try:
            report = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return name, f"{name}: {(err.strip().splitlines() or ['no answer'])[-1][:160]}"
        return name, report if isinstance(report, dict) else f"{name}: no report"

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(names) or 1)) as pool:
        results = dict(pool.map(one, list(names)))
    return {n: r for n, r in results.items() if isinstance(r, dict)}, [
        r for r in results.values() if isinstance(r, str)
    ]


def reported_gpus(report: Mapping[str, Any], count: int) -> tuple[Gpu, ...]:
    """The first ``count`` GPUs of a host's report (its ``gpus``: [name, memory bytes] pairs)."""
    return tuple(
        Gpu(visible_id=str(i), name=str(g[0]), memory_bytes=g[1] if isinstance(g[1], int) else None)
        for i, g in enumerate((report.get("gpus") or [])[:count])
    )


def mixed_models_warning(models: Mapping[str, str]) -> tuple[str, ...]:
    """A warning when hosts (name → GPU model) differ: the planner prices each role on its own hosts' GPUs, and a
    role over several models at the smallest memory and the slowest GPU among them."""
    if len(set(models.values())) < 2:
        return ()
    listed = ", ".join(f"{h}: {m}" for h, m in list(models.items())[:6])
    return (
        f"the hosts' GPU models differ ({listed}): each role is planned on its own hosts' GPUs (the plan's gpu_types "
        "row), a role over several models for the smallest GPU memory and the slowest GPU among them",
    )

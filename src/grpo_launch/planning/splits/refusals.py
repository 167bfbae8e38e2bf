"""Why the recipe's vLLM settings allow no split (pure): each refusal the split filter
(:func:`grpo_launch.planning.splits.allowed.allowed_splits`) raises, with its numbers and its fixes, built apart
from the filter itself; and, for ``--explain`` of a refusal, which servers were left out for their weights."""

from __future__ import annotations

from grpo_launch.enums import VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.machines.gpus import GIB
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import VLLM_SERVER_UTILIZATION, VLLM_WEIGHTS_SHARE
from grpo_launch.planning.cost.memory import weights_fit
from grpo_launch.planning.splits.split import Split, SplitKind, enumerate_splits, server_weights


class NoGpuLeftForTraining(PlanError):
    """The vLLM server the recipe asks for would take every GPU."""


def check_tp(model: ModelShape | None, tp: int, per_host: int) -> None:
    """The tensor-parallel size the recipe sets stays within a host and shards the model."""
    problems = []
    if tp > per_host:
        problems.append(f"tensor-parallel size {tp} exceeds the {per_host} GPUs of one host (TP stays in a node)")
    if model and model.tp_problems(tp):
        problems.append(
            f"vLLM cannot shard {model.name} over {tp} GPUs: {tp} does not divide its "
            + ", ".join(model.tp_problems(tp))
        )
    if problems:
        valid = model.valid_tp_sizes(per_host) if model else tuple(range(1, per_host + 1))
        raise PlanError(
            "the vLLM tensor-parallel size is not possible:",
            problems=problems,
            hint=f"Valid sizes here: {', '.join(map(str, valid))} (or leave it unset to choose).",
        )


def refuse_no_trainer(model: ModelShape | None, gpus: int, per_host: int, mem: int | None) -> None:
    # launch.vllm_gpus goes with it: a server size asks for a server (requested_mode), and colocate has none.
    fixes = [
        Fix("launch.vllm", "colocate", "vLLM shares the training GPUs", rank=1, also=(("launch.vllm_gpus", None),))
    ]
    smaller = [
        t
        for t in (model.valid_tp_sizes(per_host - 1) if model else range(1, per_host))
        if model is None or weights_fit(model.weight_bytes_bf16 / t, mem)
    ]
    if smaller:
        fixes.insert(0, Fix("launch.vllm_gpus", max(smaller), "a smaller server leaves GPUs to train", 0))
    fixes.append(Fix("gpus", None, f"more GPUs: at least {gpus + 1}", rank=3, in_recipe=False))
    raise NoGpuLeftForTraining(
        f"the vLLM server needs {gpus} GPU(s), leaving none of the {per_host} for training", fixes=fixes
    )


def refuse_server_size(topology: Topology, model: ModelShape | None, gpus: int | None, tp: int | None) -> None:
    """launch.vllm_gpus that no server of the tensor-parallel size makes, or that takes every GPU."""
    n, g, mem = len(topology.hosts), min(topology.gpus_per_host), topology.min_gpu_memory_bytes
    if gpus is not None and tp is not None and gpus % tp:
        raise PlanError(
            f"launch.vllm_gpus={gpus} is not a multiple of the tensor-parallel size {tp}",
            hint="A server of TP × DP GPUs: set launch.vllm_gpus to a multiple of the TP size, or leave one unset.",
        )
    if gpus is not None and n == 1 and gpus >= g:
        refuse_no_trainer(model, gpus, g, mem)
    total = sum(topology.gpus_per_host)
    if gpus is not None and gpus >= total:
        raise PlanError(
            f"launch.vllm_gpus={gpus}: the {n} hosts have {total} GPUs in all "
            f"({' + '.join(map(str, topology.gpus_per_host))}), leaving none to train",
            hint=f"Set launch.vllm_gpus below {total} (or leave it unset to choose), or use more hosts.",
        )


def refuse_no_server(
    topology: Topology,
    model: ModelShape | None,
    served: list[Split],
    gpus: int | None,
    pp: int | None,
    headless: bool,
) -> None:
    """launch.vllm=server, and no server split is left: none of the asked size or stages (``served`` empty), or
    none whose weights fit."""
    n, g, mem = len(topology.hosts), min(topology.gpus_per_host), topology.min_gpu_memory_bytes
    uneven = len(set(topology.gpus_per_host)) > 1
    if not served and pp:
        raise PlanError(
            f"no vLLM server of {pp} pipeline stages fits {n} host(s) of {g} GPUs"
            + (f" as {gpus} GPU(s)" if gpus else ""),
            hint="Each replica is TP × PP GPUs, within a host or over whole hosts, and leaves GPUs to train: "
            "change launch.vllm_pipeline_parallel_size (or launch.vllm_gpus), or leave it unset to choose.",
        )
    if not served and n * g == 1:
        raise PlanError(
            "launch.vllm=server on a single GPU: the server would take it, leaving none to train",
            hint="Use launch.vllm=colocate (vLLM shares the GPU with the trainer), or more GPUs.",
        )
    if not served:
        raise PlanError(
            f"no vLLM server{f' of {gpus} GPU(s) (launch.vllm_gpus)' if gpus else ''} leaves whole hosts or equal "
            f"trainers on {n} host(s) of {' + '.join(map(str, topology.gpus_per_host)) if uneven else g} GPUs"
            + ("" if headless else " with a launch.vllm_command that does not end in `serve`"),
            hint="On several hosts the server takes whole hosts (launch.vllm_gpus a multiple of the GPUs per "
            "host, fewer than all of them), the same number of GPUs on every host (a multiple of the hosts), or "
            "fewer GPUs than a host has on one of them"
            + (
                "."
                if headless
                else "; a server over several hosts needs `vllm serve` (it starts the others "
                "headless): end launch.vllm_command in `serve`, or keep the server on one host."
            ),
        )
    need = model.weight_bytes_bf16 / GIB if model else 0
    raise PlanError(
        f"{model.name if model else 'the model'} ({need:.0f} GiB of bf16 weights) does not fit a vLLM server "
        f"{_reach(served, g, mem, model)}",
        hint=_BIGGER,
    )


def refuse_unfit(topology: Topology, model: ModelShape, served: list[Split]) -> None:
    """No server and no colocated engine holds the model's weights."""
    g, mem = min(topology.gpus_per_host), topology.min_gpu_memory_bytes
    assert mem is not None
    raise PlanError(
        f"{model.name} ({model.weight_bytes_bf16 / GIB:.0f} GiB of bf16 weights) does not fit vLLM "
        f"{_reach(served, g, mem, model)}: not as a server (the weights take over half of each GPU) "
        f"nor colocated (they take over {VLLM_SERVER_UTILIZATION:.0%} of each GPU)",
        hint=_BIGGER,
    )


_BIGGER = (
    "Use GPUs with more memory, more GPUs per node, or more nodes (a dense model's server spans whole nodes as "
    "pipeline stages; a mixture of experts spreads its experts over a data-parallel server's GPUs), or a smaller "
    "model."
)


def _reach(served: list[Split], per_host: int, mem: int | None, model: ModelShape | None) -> str:
    """How far the servers that were tried reach: "on up to 24 GPUs of 80 GiB (tensor parallel within a node of 8,
    pipeline stages over nodes)"."""
    most = max((s.server_gpus for s in served), default=per_host)
    size = f" of {mem / GIB:.0f} GiB" if mem else ""
    how = "experts spread over a data-parallel server" if model and model.is_moe else "pipeline stages over nodes"
    return f"on up to {most} GPUs{size} (tensor parallel within a node of {per_host}, {how})"


def unfit_servers(topology: Topology, model: ModelShape | None) -> list[str]:
    """Each server split left out because its weights take over the allowed share of a GPU, with its numbers
    (``--explain`` of a refusal)."""
    mem = topology.min_gpu_memory_bytes
    if model is None or mem is None or topology.is_cpu or len(set(topology.gpus_per_host)) > 1:
        return []
    out = []
    for s in enumerate_splits(len(topology.hosts), topology.gpus_per_host[0], model):
        w = server_weights(model, s)
        if s.kind != SplitKind.COLOCATE and not weights_fit(w, mem):
            out.append(
                f"split {s.label}: {w / GIB:.1f} GiB of weights per GPU is over {VLLM_WEIGHTS_SHARE:.0%} of "
                f"{mem / GIB:.1f} GiB"
            )
    return out


def refuse_uneven_mode(topology: Topology, mode: VllmMode | None) -> None:
    """Hosts with different GPU counts cannot all train (colocate, no vLLM, CPU)."""
    if mode in (VllmMode.OFF, VllmMode.COLOCATE) or topology.is_cpu:
        raise PlanError(
            f"hosts have different GPU counts ({_counts(topology)}) and launch.vllm={mode}: every GPU would train, "
            "and accelerate runs the same number of processes on every machine",
            hint="Let the search choose (launch.vllm unset or server: whole hosts or the larger hosts' extra GPUs "
            "serve), or give every host the same number of GPUs (hostfile slots / --gpus-per-node).",
        )


def refuse_uneven_counts(topology: Topology) -> None:
    """No split of these counts leaves equal training hosts (:func:`enumerate_uneven_splits` found none)."""
    raise PlanError(
        f"no split of hosts with GPU counts {_counts(topology)} leaves training hosts with equal counts (accelerate "
        "runs the same number of processes on every machine)",
        hint="Use hosts whose counts allow it: whole hosts of one count serve and the others (all of one count) "
        "train, or the larger hosts have the same number of GPUs more than the smallest; or set hostfile slots / "
        "--gpus-per-node to equal counts.",
    )


def _counts(topology: Topology) -> str:
    return ", ".join(f"{h.name}={len(h.gpus)}" for h in topology.hosts)

"""make_plan(topology, recipe, model) → Plan. Pure: no torch/trl import, no environment reads, no files.

Decides the vLLM mode (server / colocate / off), which GPUs of which hosts generate and which train (disjoint),
the vLLM tensor-parallel size, the batch layout (:mod:`grpo_launch.layout`), the distributed backend, and the
resolved trainer values. Every choice is recorded with its reason.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_launch.errors import PlanError
from grpo_launch.estimate import (
    HEADROOM,
    VLLM_OVERHEAD_BYTES,
    StepTime,
    TrainMemory,
    Workload,
    colocate_switch_time,
    generation_time,
    sync_time,
    train_memory,
    training_time,
    vllm_memory,
)
from grpo_launch.hardware import GIB, ModelShape, find_gpu_spec
from grpo_launch.layout import Layout, LayoutRequest, solve_layout
from grpo_launch.recipe import Recipe
from grpo_launch.topology import Topology

DEFAULT_RUN_ROOT = "grpo_runs"
SERVER_MEMORY_UTILIZATION = 0.9  # vLLM's own default: the server GPU does nothing else
WEIGHTS_SHARE_OF_SERVER_GPU = 0.5  # leave at least half of a server GPU for the KV cache
DEFAULT_PROMPT_LEN = 512  # assumed when the recipe has no max_prompt_length
TRL_DEFAULT_COMPLETION_LEN = 512  # TRL 1.16's max_completion_length default


@dataclass(frozen=True)
class Decision:
    what: str
    value: Any
    why: str


@dataclass(frozen=True)
class VllmPlan:
    mode: str  # server | colocate | off
    host: str | None = None
    address: str | None = None
    gpus: tuple[str, ...] = ()  # visible ids on ``host`` (server mode)
    tensor_parallel_size: int = 1
    port: int = 8000
    bind_host: str = "127.0.0.1"
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None

    @property
    def base_url(self) -> str | None:
        return f"http://{self.address}:{self.port}" if self.mode == "server" else None


@dataclass(frozen=True)
class TrainHost:
    name: str
    address: str
    machine_rank: int
    gpus: tuple[str, ...]  # visible ids; () on CPU
    processes: int


@dataclass(frozen=True)
class TrainPlan:
    device: str  # cuda | cpu
    hosts: tuple[TrainHost, ...]
    backend: str  # ddp | zero2 | zero3 | fsdp
    offload: str  # none | optimizer | optimizer+params
    main_process_port: int
    mixed_precision: str  # bf16 | no
    gradient_checkpointing: bool | None = None  # None: as the recipe says (TRL's default is on)

    @property
    def num_processes(self) -> int:
        return sum(h.processes for h in self.hosts)

    @property
    def num_machines(self) -> int:
        return len(self.hosts)

    @property
    def main_process_ip(self) -> str:
        return self.hosts[0].address


@dataclass(frozen=True)
class GpuRole:
    host: str
    gpu: str
    name: str
    memory_gib: float | None
    role: str  # train | vllm | idle


@dataclass(frozen=True)
class Plan:
    recipe: Recipe
    topology: Topology
    model: ModelShape | None
    vllm: VllmPlan
    train: TrainPlan
    layout: Layout
    run_dir: str
    trainer_values: Mapping[str, Any]
    roles: tuple[GpuRole, ...]
    decisions: tuple[Decision, ...] = ()
    notices: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    estimate: Estimate | None = None


@dataclass(frozen=True)
class Estimate:
    """Predicted memory and step time (see :mod:`grpo_launch.estimate`), with the arithmetic behind them."""

    step: StepTime
    train_memory_gib: float | None
    vllm_memory_gib: float | None
    gpu_memory_gib: float
    explain: tuple[str, ...]


def default_run_dir(recipe: Recipe) -> str:
    return recipe.launch.run_dir or f"{DEFAULT_RUN_ROOT}/{recipe.name}"


def make_plan(topology: Topology, recipe: Recipe, model: ModelShape | None = None) -> Plan:
    """Plan a GRPO run of ``recipe`` on ``topology``. Raises :class:`PlanError` listing every problem.

    When the split is free (one host, launch.vllm auto, no TP or GPU count set) and the model and GPUs are known,
    every server size (TP 1, 2, 4, …) and colocate are planned and the shortest predicted step wins.
    """
    if not _split_is_free(topology, recipe, model):
        return _make_plan(topology, recipe, model, None)
    scored: list[tuple[float, str, Plan]] = []
    valid = model.valid_tp_sizes(len(topology.hosts[0].gpus) - 1) if model else ()
    choices = [("colocate", 1), *(("server", t) for t in valid)]
    for mode, tp in choices:
        try:
            candidate = _make_plan(topology, recipe, model, (mode, tp if mode == "server" else None))
        except PlanError:
            continue
        if candidate.estimate is None:
            return _make_plan(topology, recipe, model, None)
        label = f"server TP {tp}" if mode == "server" else "colocate"
        # Splits give different optimizer steps (more trainers, more completions per step): compare time per prompt.
        prompts = candidate.layout.completions_per_optimizer_step / candidate.layout.num_generations
        scored.append((candidate.estimate.step.total_s / prompts, label, candidate))
    if not scored:
        # No candidate fits by the estimate: plan as without the search, for its plain error (or warnings).
        return _make_plan(topology, recipe, model, None)
    scored.sort(key=lambda x: x[0])
    best_s, best_label, best = scored[0]
    others = ", ".join(f"{label} {t:.2f} s" for t, label, _ in scored[1:])
    why = f"shortest predicted time per prompt group: {best_label} {best_s:.2f} s" + (
        f" (vs {others})" if others else ""
    )
    return dataclasses.replace(best, decisions=(Decision("split", best_label, why), *best.decisions))


def _split_is_free(topology: Topology, recipe: Recipe, model: ModelShape | None) -> bool:
    launch = recipe.launch
    return (
        len(topology.hosts) == 1
        and not topology.is_cpu
        and topology.num_gpus > 1
        and model is not None
        and find_gpu_spec(topology.gpu_name) is not None
        and topology.min_gpu_memory_bytes is not None
        and _auto_mode(recipe)
        and launch.vllm_gpus is None
        and launch.vllm_tensor_parallel_size is None
        and not recipe.is_set("vllm_tensor_parallel_size")
    )


def _make_plan(
    topology: Topology, recipe: Recipe, model: ModelShape | None, forced: tuple[str, int | None] | None
) -> Plan:
    decisions: list[Decision] = []
    notices = list(recipe.notices)
    warnings = list(topology.warnings)
    values = recipe.values
    launch = recipe.launch

    if values.get("use_cpu") is True and not topology.is_cpu:
        topology = dataclasses.replace(topology, hosts=tuple(dataclasses.replace(h, gpus=()) for h in topology.hosts))
        decisions.append(Decision("device", "cpu", "use_cpu: true in the recipe: the GPUs are left unused"))
    mode = forced[0] if forced else _choose_mode(topology, recipe, decisions)
    if topology.is_cpu:
        vllm, train_hosts = VllmPlan("off"), _cpu_train_hosts(topology, recipe, decisions)
    else:
        counts = set(topology.gpus_per_host)
        if len(counts) > 1:
            raise PlanError(
                "hosts have different GPU counts: " + ", ".join(f"{h.name}={len(h.gpus)}" for h in topology.hosts),
                hint="accelerate runs the same number of processes on every machine: give every host the same "
                "number of GPUs (hostfile slots / --gpus-per-node).",
            )
        if mode == "server":
            try:
                vllm, train_hosts = _plan_server(
                    topology, recipe, model, decisions, notices, forced_tp=forced[1] if forced else None
                )
            except PlanError as exc:
                if forced or not _auto_mode(recipe) or "leaving none" not in exc.message:
                    raise
                decisions.append(
                    Decision("vllm", "colocate", f"a server would not leave a GPU to train: {exc.message}")
                )
                mode = "colocate"
        if mode != "server":
            train_hosts = tuple(
                TrainHost(h.name, h.addr, r, tuple(g.visible_id for g in h.gpus), len(h.gpus))
                for r, h in enumerate(topology.hosts)
            )
            vllm = (
                _plan_colocate(topology, recipe, model, train_hosts, decisions, warnings)
                if mode == "colocate"
                else VllmPlan("off")
            )

    n = sum(h.processes for h in train_hosts)
    colocate_n = topology.num_gpus if mode == "server" else None
    layout, layout_why = solve_layout(n, LayoutRequest.from_values(values), colocate_n=colocate_n)
    decisions += [Decision("layout", None, w) for w in layout_why]
    if vllm.mode == "colocate" and n % vllm.tensor_parallel_size:
        raise PlanError(
            f"colocated vLLM with tensor_parallel_size={vllm.tensor_parallel_size} needs the "
            f"{n} training processes to be a multiple of it",
            hint=f"Set vllm_tensor_parallel_size to a divisor of {n}.",
        )

    work = workload(recipe, layout)
    backend, offload, ckpt, train_mem = _choose_backend(topology, recipe, model, n, vllm, work, decisions, warnings)
    vllm = _size_vllm(topology, model, vllm, work, decisions, warnings)
    device = "cpu" if topology.is_cpu else "cuda"
    train = TrainPlan(
        device=device,
        hosts=train_hosts,
        backend=backend,
        offload=offload,
        main_process_port=launch.main_process_port,
        mixed_precision="no" if device == "cpu" else ("no" if values.get("bf16") is False else "bf16"),
        gradient_checkpointing=ckpt,
    )
    if ckpt is not None:
        work = dataclasses.replace(work, gradient_checkpointing=ckpt)
    estimate = _estimate(topology, model, vllm, train, work, train_mem)
    run_dir = default_run_dir(recipe)
    trainer_values = _trainer_values(recipe, layout, vllm, train, run_dir, notices)
    roles = _roles(topology, vllm, train_hosts)
    return Plan(
        recipe=recipe,
        topology=topology,
        model=model,
        vllm=vllm,
        train=train,
        layout=layout,
        run_dir=run_dir,
        trainer_values=trainer_values,
        roles=roles,
        decisions=tuple(decisions),
        notices=tuple(notices),
        warnings=tuple(warnings),
        estimate=estimate,
    )


# --------------------------------------------------------------------------------------------- vLLM mode


def _choose_mode(topology: Topology, recipe: Recipe, decisions: list[Decision]) -> str:
    wanted = recipe.launch.vllm
    use_vllm = recipe.values.get("use_vllm", "auto")
    trl_mode = recipe.get("vllm_mode")
    if use_vllm is False:
        if wanted not in ("auto", "off"):
            raise PlanError(
                f"the recipe sets use_vllm: false but launch.vllm={wanted}",
                hint="Remove one of them: use_vllm: true with launch.vllm, or launch.vllm=off.",
            )
        wanted = "off"
    if trl_mode and wanted == "auto":
        wanted = trl_mode
    elif trl_mode and wanted not in ("auto", trl_mode):
        raise PlanError(
            f"the recipe sets vllm_mode: {trl_mode} but launch.vllm={wanted}",
            hint="Keep one: grpo-launch writes vllm_mode for the trainer from launch.vllm.",
        )
    if topology.is_cpu:
        if wanted in ("server", "colocate"):
            raise PlanError(
                f"vLLM {wanted} mode needs CUDA GPUs, and this topology has none",
                hint="On CPU, generate with transformers: launch.vllm=off (or use_vllm: false). "
                "To plan for GPUs from here, pass --gpus, e.g. --gpus 4xL20-48GB.",
            )
        decisions.append(Decision("vllm", "off", "no GPU: generation runs in the trainers with transformers"))
        return "off"
    if wanted != "auto":
        decisions.append(Decision("vllm", wanted, "set in the recipe"))
        return wanted
    if topology.num_gpus == 1:
        decisions.append(
            Decision("vllm", "colocate", "one GPU: vLLM shares it with the trainer (sleep between phases)")
        )
        return "colocate"
    decisions.append(
        Decision(
            "vllm", "server", f"{topology.num_gpus} GPUs: a dedicated vLLM server keeps generation off the trainers"
        )
    )
    return "server"


def _fits_tp(model: ModelShape | None, mem: int | None, tp: int) -> bool:
    if model is None or mem is None:
        return True
    return model.weight_bytes_bf16 / tp <= WEIGHTS_SHARE_OF_SERVER_GPU * mem


def _requested_tp(recipe: Recipe, notices: list[str]) -> int | None:
    launch = recipe.launch
    tp = launch.vllm_tensor_parallel_size
    if launch.vllm_gpus is not None:
        if tp is not None and tp != launch.vllm_gpus:
            raise PlanError(
                f"launch.vllm_gpus={launch.vllm_gpus} and launch.vllm_tensor_parallel_size={tp} differ",
                hint="The server runs one tensor-parallel group (data-parallel size 1 for dense models): "
                "set only one of them.",
            )
        tp = launch.vllm_gpus
    if tp is None and recipe.is_set("vllm_tensor_parallel_size"):
        tp = int(recipe.values["vllm_tensor_parallel_size"])
        notices.append(f"vllm_tensor_parallel_size={tp}: used as the vLLM server's --tensor-parallel-size")
    return tp


def _plan_server(
    topology: Topology,
    recipe: Recipe,
    model: ModelShape | None,
    decisions: list[Decision],
    notices: list[str],
    *,
    forced_tp: int | None = None,
) -> tuple[VllmPlan, tuple[TrainHost, ...]]:
    hosts = topology.hosts
    per_host = len(hosts[0].gpus)
    mem = topology.min_gpu_memory_bytes
    if forced_tp and not _fits_tp(model, mem, forced_tp):
        raise PlanError(f"split candidate TP {forced_tp}: the weights take over half of each server GPU")
    tp_fixed = forced_tp or _requested_tp(recipe, notices)
    valid = model.valid_tp_sizes(per_host) if model else tuple(range(1, per_host + 1))
    if tp_fixed is not None:
        problems = []
        if tp_fixed > per_host:
            problems.append(
                f"tensor-parallel size {tp_fixed} exceeds the {per_host} GPUs of one host (TP stays in a node)"
            )
        if model and tp_fixed not in model.valid_tp_sizes(tp_fixed):
            problems.append(
                f"tensor-parallel size {tp_fixed} does not fit {model.name}'s {model.heads} attention heads / "
                f"{model.kv_heads} KV heads (it must divide the heads, and divide or be a multiple of the KV heads)"
            )
        if problems:
            raise PlanError(
                "the vLLM tensor-parallel size is not possible:",
                problems=problems,
                hint=f"Valid sizes here: {', '.join(map(str, valid))} (or leave it unset to choose).",
            )
        tp_min = tp_fixed
    else:
        fitting = [t for t in valid if _fits_tp(model, mem, t)]
        if not fitting:
            need = model.weight_bytes_bf16 / GIB if model else 0
            raise PlanError(
                f"{model.name if model else 'the model'} ({need:.0f} GiB of bf16 weights) does not fit a vLLM server "
                f"on up to {per_host} GPUs of {mem / GIB if mem else 0:.0f} GiB",
                hint="Use GPUs with more memory or more GPUs per node, or a smaller model.",
            )
        tp_min = fitting[0]

    # Which GPUs serve. One host: the last tp GPUs; the rest train. Several hosts: accelerate needs the same number
    # of processes per machine, so either a whole host serves (its spare GPUs idle) or every host gives up tp GPUs
    # (all but one set idle). Pick whichever idles fewer GPUs.
    if len(hosts) == 1:
        tp, dedicated = tp_min, False
        if per_host - tp < 1:
            raise PlanError(
                f"the vLLM server needs {tp} GPU(s), leaving none of the {per_host} for training",
                hint="Use launch.vllm=colocate, a smaller tensor-parallel size, or more GPUs.",
            )
    else:
        tp_dedicated = tp_fixed or max(t for t in valid if t >= tp_min)
        idle_dedicated = per_host - tp_dedicated
        idle_shared = (len(hosts) - 1) * tp_min
        dedicated = idle_dedicated <= idle_shared or per_host - tp_min < 1
        tp = tp_dedicated if dedicated else tp_min
    server_host = hosts[-1]
    server_gpus = tuple(g.visible_id for g in server_host.gpus[per_host - tp :])
    if dedicated:
        trainers = hosts[:-1]
        train_hosts = tuple(
            TrainHost(h.name, h.addr, r, tuple(g.visible_id for g in h.gpus), per_host) for r, h in enumerate(trainers)
        )
        where = f"all of {server_host.name} serves (TP {tp}); {per_host - tp} GPU(s) there idle"
    else:
        keep = per_host - tp
        train_hosts = tuple(
            TrainHost(h.name, h.addr, r, tuple(g.visible_id for g in h.gpus[:keep]), keep) for r, h in enumerate(hosts)
        )
        idle = (len(hosts) - 1) * tp
        where = f"last {tp} GPU(s) of {server_host.name}" + (
            f"; {idle} GPU(s) idle elsewhere so every machine runs {keep} trainers" if idle else ""
        )
    why_tp = (
        ("the split search's candidate" if forced_tp else "set in the recipe")
        if tp_fixed
        else (
            f"smallest size whose bf16 weights ({model.weight_bytes_bf16 / GIB:.1f} GiB) take ≤ "
            f"{WEIGHTS_SHARE_OF_SERVER_GPU:.0%} of a GPU, dividing {model.heads} heads"
            if model and tp == tp_min
            else (
                f"a whole host serves: the largest size dividing {model.heads} heads"
                if model
                else "model shape unknown"
            )
        )
    )
    decisions.append(Decision("vllm_tensor_parallel_size", tp, why_tp))
    decisions.append(Decision("vllm_gpus", ",".join(server_gpus), where))

    launch = recipe.launch
    util = launch.vllm_gpu_memory_utilization
    if util is None and recipe.is_set("vllm_gpu_memory_utilization"):
        util = float(recipe.values["vllm_gpu_memory_utilization"])
        notices.append(
            f"vllm_gpu_memory_utilization={util}: moved to the vLLM server's --gpu-memory-utilization "
            "(TRL only reads it in colocate mode)"
        )
    multi = len(hosts) > 1
    vllm = VllmPlan(
        mode="server",
        host=server_host.name,
        address=server_host.addr if multi else "127.0.0.1",
        gpus=server_gpus,
        tensor_parallel_size=tp,
        port=launch.vllm_port,
        bind_host=launch.vllm_host or ("0.0.0.0" if multi else "127.0.0.1"),
        gpu_memory_utilization=util or SERVER_MEMORY_UTILIZATION,
        max_model_len=_max_model_len(recipe),
    )
    return vllm, train_hosts


def _max_model_len(recipe: Recipe) -> int | None:
    if recipe.launch.vllm_max_model_len:
        return recipe.launch.vllm_max_model_len
    if recipe.is_set("vllm_max_model_length"):
        return int(recipe.values["vllm_max_model_length"])
    prompt = recipe.get("max_prompt_length")
    if prompt:
        return int(prompt) + int(recipe.get("max_completion_length", 512))
    return None


def _auto_mode(recipe: Recipe) -> bool:
    return recipe.launch.vllm == "auto" and not recipe.get("vllm_mode") and recipe.values.get("use_vllm") is not False


def _plan_colocate(
    topology: Topology,
    recipe: Recipe,
    model: ModelShape | None,
    train_hosts: tuple[TrainHost, ...],
    decisions: list[Decision],
    warnings: list[str],
) -> VllmPlan:
    per_host = train_hosts[0].processes
    n = sum(h.processes for h in train_hosts)
    util = float(recipe.launch.vllm_gpu_memory_utilization or recipe.get("vllm_gpu_memory_utilization") or 0.3)
    fixed = recipe.launch.vllm_tensor_parallel_size or recipe.get("vllm_tensor_parallel_size")
    if fixed:
        tp = int(fixed)
        if tp > per_host:
            raise PlanError(
                f"colocated vLLM tensor_parallel_size={tp} exceeds the {per_host} GPUs of a host",
                hint="Use a smaller vllm_tensor_parallel_size.",
            )
        why = "set in the recipe"
    else:
        # Each colocated engine gets `util` of a GPU; its weights should take at most half of that.
        valid = [t for t in (model.valid_tp_sizes(per_host) if model else (1,)) if n % t == 0]
        mem = topology.min_gpu_memory_bytes
        fits = [t for t in valid if model is None or mem is None or model.weight_bytes_bf16 / t <= 0.5 * util * mem]
        tp = fits[0] if fits else valid[-1]
        why = "smallest size whose weights fit the vLLM share of a GPU" if fits else "largest size possible"
        if not fits and model is not None and mem is not None:
            warnings.append(
                f"colocated vLLM: {model.weight_bytes_bf16 / tp / GIB:.1f} GiB of weights per GPU at TP {tp} is over "
                f"half of the {util:.0%} vLLM share ({util * mem / GIB:.1f} GiB): expect a small KV cache"
            )
    decisions.append(Decision("vllm_tensor_parallel_size", tp, f"colocate: {why}"))
    decisions.append(Decision("vllm_gpu_memory_utilization", util, "vLLM shares each training GPU (colocate)"))
    return VllmPlan(
        mode="colocate", tensor_parallel_size=tp, gpu_memory_utilization=util, max_model_len=_max_model_len(recipe)
    )


def _cpu_train_hosts(topology: Topology, recipe: Recipe, decisions: list[Decision]) -> tuple[TrainHost, ...]:
    if len(topology.hosts) == 1:
        n = recipe.launch.num_processes or 1
        decisions.append(
            Decision(
                "num_processes", n, "set in launch.num_processes" if recipe.launch.num_processes else "CPU default"
            )
        )
        h = topology.hosts[0]
        return (TrainHost(h.name, h.addr, 0, (), n),)
    hosts = topology.hosts
    if recipe.launch.num_processes:
        total = recipe.launch.num_processes
        if total % len(hosts):
            raise PlanError(
                f"launch.num_processes={total} cannot be split evenly over {len(hosts)} CPU hosts",
                hint=f"Use a multiple of {len(hosts)} (accelerate runs the same number of processes on every host).",
            )
        per = total // len(hosts)
        why = f"launch.num_processes={total} over {len(hosts)} hosts"
    else:
        counts = {h.cpus or 1 for h in hosts}
        if len(counts) > 1:
            raise PlanError(
                "CPU hosts have different slot counts: " + ", ".join(f"{h.name}={h.cpus}" for h in hosts),
                hint="Give every host the same slots=N, or set launch.num_processes.",
            )
        per = counts.pop()
        why = "one process per slot / CPU of each host"
    decisions.append(Decision("num_processes", per * len(hosts), why))
    return tuple(TrainHost(h.name, h.addr, r, (), per) for r, h in enumerate(hosts))


# --------------------------------------------------------------------------------------------- backend


def workload(recipe: Recipe, layout: Layout) -> Workload:
    """One optimizer step's work, from the recipe (TRL's defaults where unset) and the layout."""
    ckpt = recipe.get("gradient_checkpointing")
    return Workload(
        prompt_len=int(recipe.get("max_prompt_length") or DEFAULT_PROMPT_LEN),
        completion_len=int(recipe.get("max_completion_length") or TRL_DEFAULT_COMPLETION_LEN),
        completions=layout.completions_per_optimizer_step,
        num_generations=layout.num_generations,
        per_device=layout.per_device_train_batch_size,
        gradient_checkpointing=True if ckpt is None else bool(ckpt),
        lora=bool(recipe.get("use_peft")),
        reference_model=float(recipe.get("beta") or 0.0) > 0.0,
    )


# (backend, offload, gradient checkpointing), cheapest first: no offload before offload, ZeRO-2 before ZeRO-3,
# checkpointing (a third more compute) only when needed.
TRAINING_SETTINGS: tuple[tuple[str, str, bool], ...] = (
    ("ddp", "none", False),
    ("zero2", "none", False),
    ("ddp", "none", True),
    ("zero2", "none", True),
    ("zero3", "none", False),
    ("zero3", "none", True),
    ("zero2", "optimizer", True),
    ("zero3", "optimizer", True),
    ("zero3", "optimizer+params", True),
)


def _choose_backend(
    topology: Topology,
    recipe: Recipe,
    model: ModelShape | None,
    n: int,
    vllm: VllmPlan,
    work: Workload,
    decisions: list[Decision],
    warnings: list[str],
) -> tuple[str, str, bool | None, TrainMemory | None]:
    """(backend, offload, gradient checkpointing or None to leave it to the recipe, memory per GPU)."""
    backend, offload = recipe.launch.backend, recipe.launch.offload
    if topology.is_cpu:
        if backend == "fsdp":
            raise PlanError("FSDP is not supported on CPU here", hint="Use launch.backend=ddp, zero2 or zero3.")
        chosen = "ddp" if backend == "auto" else backend
        decisions.append(
            Decision("backend", chosen, "set in the recipe" if backend != "auto" else "CPU: plain DDP (gloo)")
        )
        return chosen, "none" if offload == "auto" else offload, None, None
    mem = topology.min_gpu_memory_bytes
    if model is None or mem is None:
        chosen = "zero2" if backend == "auto" else backend
        why = "set in the recipe" if backend != "auto" else "model size or GPU memory unknown: ZeRO-2 is a safe default"
        decisions.append(Decision("backend", chosen, why))
        return chosen, "none" if offload == "auto" else offload, None, None
    share = (vllm.gpu_memory_utilization or 0.0) if vllm.mode == "colocate" else 0.0
    budget = HEADROOM * mem - share * mem
    ckpt_set = recipe.get("gradient_checkpointing")
    candidates = [
        (b, o, c)
        for b, o, c in TRAINING_SETTINGS
        if (backend == "auto" or b == backend)
        and (offload == "auto" or o == offload)
        and (ckpt_set is None or c == bool(ckpt_set))
        and not (n == 1 and b == "zero2" and o == "none")
    ]
    if not candidates:  # e.g. fsdp, or a combination the table lacks: the recipe's own choice
        candidates = [
            (backend if backend != "auto" else "zero3", offload if offload != "auto" else "none", bool(ckpt_set))
        ]
    for b, o, c in candidates:
        need = train_memory(model, n, b, o, dataclasses.replace(work, gradient_checkpointing=c))
        if need.total <= budget:
            label = b + ("" if o == "none" else f" + offload {o}") + (" + gradient checkpointing" if c else "")
            set_by = [x for x, v in (("backend", backend), ("offload", offload)) if v != "auto"]
            decisions.append(
                Decision(
                    "backend",
                    label,
                    (f"{', '.join(set_by)} set in the recipe; " if set_by else "cheapest that fits: ")
                    + f"{need.total / GIB:.1f} GiB per training GPU ≤ {budget / GIB:.1f} GiB "
                    f"({HEADROOM:.0%} of {mem / GIB:.0f} GiB"
                    + (f" minus the colocated vLLM's {share:.0%}" if share else "")
                    + ")",
                )
            )
            return b, o, c, need
    b, o, c = candidates[-1]
    need = train_memory(model, n, b, o, dataclasses.replace(work, gradient_checkpointing=c))
    raise PlanError(
        f"{model.name} does not fit on {n} training GPU(s) of {mem / GIB:.0f} GiB: even "
        f"{b} + offload {o}{' + gradient checkpointing' if c else ''} needs {need.total / GIB:.1f} GiB per GPU "
        f"(budget {budget / GIB:.1f} GiB)",
        problems=_memory_fixes(model, n, mem, budget, (b, o, c), work, recipe),
        hint="The nearest fixes are listed; each one alone would fit by the estimate (grpo-launch plan --explain).",
    )


def _memory_fixes(
    model: ModelShape, n: int, mem: int, budget: float, setting: tuple[str, str, bool], work: Workload, recipe: Recipe
) -> list[str]:
    """Single changes that would make the training side fit, nearest first."""
    b, o, _ = setting
    fixes: list[str] = []

    def total(nn: int, bb: str, oo: str, w: Workload) -> float:
        return train_memory(model, nn, bb, oo, w).total

    w_ck = dataclasses.replace(work, gradient_checkpointing=True)
    if recipe.launch.offload != "auto" and total(n, "zero3", "optimizer+params", w_ck) <= budget:
        fixes.append("offload: launch.offload=optimizer+params with launch.backend=zero3")
    for more in (2, 4, 8, 16, 32, 64):
        if total(n * more, "zero3", "optimizer", w_ck) <= budget:
            fixes.append(f"more GPUs: {n * more} training GPUs (ZeRO-3 + optimizer offload)")
            break
    if not work.lora and total(n, b, o, dataclasses.replace(w_ck, lora=True)) <= budget:
        fixes.append("LoRA: use_peft: true (only the frozen bf16 base stays on the GPU)")
    for length in (work.completion_len // 2, work.completion_len // 4, work.completion_len // 8):
        if length >= 16 and total(n, b, o, dataclasses.replace(w_ck, completion_len=length)) <= budget:
            fixes.append(f"shorter completions: max_completion_length={length}")
            break
    if work.per_device > 1 and total(n, b, o, dataclasses.replace(w_ck, per_device=1)) <= budget:
        fixes.append("fewer completions per forward pass: per_device_train_batch_size=1")
    if not fixes:
        fixes.append(f"GPUs with more memory than {mem / GIB:.0f} GiB, or a smaller model")
    return fixes


def _size_vllm(
    topology: Topology,
    model: ModelShape | None,
    vllm: VllmPlan,
    work: Workload,
    decisions: list[Decision],
    warnings: list[str],
) -> VllmPlan:
    """max_num_seqs (and the colocated memory share) from the KV cache the concurrent sequences need."""
    mem = topology.min_gpu_memory_bytes
    if vllm.mode == "off" or model is None or mem is None:
        return vllm
    share = vllm.gpu_memory_utilization if vllm.mode == "colocate" else None
    sized = vllm_memory(model, vllm.tensor_parallel_size, mem, work, share=share)
    if sized is None:
        weights = model.weight_bytes_bf16 / vllm.tensor_parallel_size
        need = (weights + VLLM_OVERHEAD_BYTES + model.kv_bytes_per_token_bf16 * work.seq_len) / mem + 0.02
        fixes = [
            "more GPUs (a larger tensor-parallel size spreads the weights)",
            "launch.vllm=off (generate with transformers in the trainers; slow)",
        ]
        if vllm.mode == "colocate" and need < 0.9:
            fixes.insert(0, f"launch.vllm_gpu_memory_utilization={need:.2f} (leaves less for training)")
        raise PlanError(
            f"vLLM ({vllm.mode}) does not fit: {weights / GIB:.1f} GiB of weights per GPU leave no room for the KV "
            f"cache of one {work.seq_len}-token sequence at gpu_memory_utilization {share or 0.9:.2f}",
            problems=fixes,
        )
    decisions.append(Decision("vllm_max_num_seqs", sized.max_num_seqs, sized.lines()[0]))
    return dataclasses.replace(
        vllm,
        max_num_seqs=sized.max_num_seqs,
        max_model_len=vllm.max_model_len or sized.max_model_len,
    )


def _estimate(
    topology: Topology,
    model: ModelShape | None,
    vllm: VllmPlan,
    train: TrainPlan,
    work: Workload,
    train_mem: TrainMemory | None,
) -> Estimate | None:
    """Predicted step time and memory, when the model and the GPU model are known."""
    gpu = find_gpu_spec(topology.gpu_name) if not topology.is_cpu else None
    mem = topology.min_gpu_memory_bytes
    if model is None or gpu is None or mem is None:
        return None
    n = train.num_processes
    explain: list[str] = [
        f"workload per optimizer step: {work.completions} completions ({work.completions // work.num_generations} "
        f"prompts × {work.num_generations}), {work.prompt_len} prompt + {work.completion_len} completion tokens",
    ]
    if train_mem is not None:
        explain.append("memory per training GPU: " + train_mem.lines()[0])
    vllm_gib = None
    if vllm.mode == "server":
        tp = vllm.tensor_parallel_size
        replicas = 1
        seqs = vllm.max_num_seqs or work.completions
        gen, gen_why = generation_time(model, gpu, tp, replicas, seqs, work)
        sync = sync_time(model, across_nodes=vllm.host not in {h.name for h in train.hosts})
        util = vllm.gpu_memory_utilization or 0.9
        vllm_gib = util * mem / GIB
        explain.append(f"generation on the server ({tp} GPU): {gen_why}")
        explain.append(f"weight sync: {model.weight_bytes_bf16 / 1e9:.1f} GB broadcast = {sync:.2f} s")
    elif vllm.mode == "colocate":
        tp = vllm.tensor_parallel_size
        replicas = max(1, n // tp)
        seqs = vllm.max_num_seqs or work.completions
        gen, gen_why = generation_time(model, gpu, tp, replicas, seqs, work)
        sync = colocate_switch_time(model, n)
        vllm_gib = (vllm.gpu_memory_utilization or 0.3) * mem / GIB
        explain.append(f"generation colocated ({replicas} engine(s) × TP {tp}): {gen_why}")
        explain.append(f"vLLM sleep/wake and weight load per step: {sync:.2f} s")
    else:
        gen_s_per_tok = 2 * model.weight_bytes_bf16 / (gpu.bandwidth_tbs * 1e12 * 0.5)
        gen = work.completion_len * gen_s_per_tok * math.ceil(work.completions / max(1, n * work.per_device))
        sync = 0.0
        explain.append(f"generation with transformers in the trainers (no vLLM): ≈ {gen:.1f} s")
    train_s, train_why = training_time(model, gpu, n, train.backend, train.offload, work)
    explain.append(f"training: {train_why}")
    step = StepTime(gen, train_s, sync)
    explain.append(
        f"step ≈ {step.generation_s:.1f} s generation + {step.training_s:.1f} s training + {step.sync_s:.1f} s "
        f"sync = {step.total_s:.1f} s; bottleneck: {step.bottleneck}"
    )
    return Estimate(
        step=step,
        train_memory_gib=train_mem.total / GIB if train_mem else None,
        vllm_memory_gib=vllm_gib,
        gpu_memory_gib=mem / GIB,
        explain=tuple(explain),
    )


# --------------------------------------------------------------------------------------------- trainer values


def _trainer_values(
    recipe: Recipe, layout: Layout, vllm: VllmPlan, train: TrainPlan, run_dir: str, notices: list[str]
) -> dict[str, Any]:
    out = {k: v for k, v in recipe.values.items() if v != "auto"}
    for key in ("generation_batch_size", "steps_per_generation"):
        out.pop(key, None)
    out.update(layout.trl_values())
    if vllm.mode == "off":
        out["use_vllm"] = False
        for key in ("vllm_mode", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size"):
            out.pop(key, None)
    elif vllm.mode == "server":
        out.update(
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=vllm.base_url,
            vllm_server_timeout=float(recipe.launch.vllm_health_timeout_s),
        )
        out.pop("vllm_gpu_memory_utilization", None)
        out.pop("vllm_tensor_parallel_size", None)
        out.pop("vllm_server_host", None)
        out.pop("vllm_server_port", None)
    else:
        out.update(
            use_vllm=True,
            vllm_mode="colocate",
            vllm_tensor_parallel_size=vllm.tensor_parallel_size,
            vllm_gpu_memory_utilization=vllm.gpu_memory_utilization,
        )
    if train.device == "cpu":
        if out.get("bf16") or out.get("fp16"):
            notices.append("bf16/fp16 turned off: CPU training runs in fp32")
        out.update(bf16=False, fp16=False)
        if train.backend in ("zero2", "zero3"):
            # DeepSpeed on CPU: its CPU accelerator owns the device, and accelerate must be told the process-group
            # backend, or it finds none and quietly runs every rank as a world of one. use_cpu would bypass
            # DeepSpeed altogether (MULTI_CPU).
            out.update(use_cpu=False, ddp_backend="gloo")
        else:
            out["use_cpu"] = True
    if train.gradient_checkpointing is not None and train.device == "cuda":
        out["gradient_checkpointing"] = train.gradient_checkpointing
    if "output_dir" not in out or out["output_dir"] is None:
        out["output_dir"] = f"{run_dir}/output"
    return out


def _roles(topology: Topology, vllm: VllmPlan, train_hosts: tuple[TrainHost, ...]) -> tuple[GpuRole, ...]:
    training = {(h.name, g) for h in train_hosts for g in h.gpus}
    serving = {(vllm.host, g) for g in vllm.gpus} if vllm.mode == "server" else set()
    roles = []
    for h in topology.hosts:
        for g in h.gpus:
            key = (h.name, g.visible_id)
            role = "vllm" if key in serving else "train" if key in training else "idle"
            if vllm.mode == "colocate" and role == "train":
                role = "train+vllm"
            roles.append(GpuRole(h.name, g.visible_id, g.name, g.memory_gib, role))
    return tuple(roles)

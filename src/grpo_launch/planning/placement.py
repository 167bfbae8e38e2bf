"""Placement: the vLLM mode, the server's tensor-parallel size and GPUs, which GPUs of which hosts train, and
colocation. Pure; every choice goes into the Trace."""

from __future__ import annotations

from grpo_launch.enums import GpuUse, VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.machines.gpus import GIB
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import TRL_COLOCATE_UTILIZATION, VLLM_SERVER_UTILIZATION, VLLM_WEIGHTS_SHARE
from grpo_launch.planning.cost.memory import fits_server_gpu
from grpo_launch.planning.lengths import max_model_len, prompt_bound
from grpo_launch.planning.types import GpuRole, Trace, TrainHost, VllmPlan
from grpo_launch.recipe import Recipe


class NoGpuLeftForTraining(PlanError):
    """A vLLM server would take every GPU; in auto mode the planner then colocates."""


def auto_mode(recipe: Recipe) -> bool:
    """The recipe leaves the vLLM mode to the planner (server GPUs or a server TP size ask for a server)."""
    launch = recipe.launch
    return (
        launch.vllm is None
        and not recipe.get("vllm_mode")
        and recipe.values.get("use_vllm") is not False
        and launch.vllm_gpus is None
        and launch.vllm_tensor_parallel_size is None
    )


def choose_mode(topology: Topology, recipe: Recipe, trace: Trace) -> VllmMode:
    wanted = recipe.launch.vllm  # None: auto
    trl_mode = VllmMode(recipe.get("vllm_mode")) if recipe.get("vllm_mode") else None
    if recipe.values.get("use_vllm") is False:
        if wanted not in (None, VllmMode.OFF):
            raise PlanError(
                f"the recipe sets use_vllm: false but launch.vllm={wanted}",
                hint="Remove one of them: use_vllm: true with launch.vllm, or launch.vllm=off.",
            )
        wanted = VllmMode.OFF
    if trl_mode and wanted is None:
        wanted = trl_mode
    elif trl_mode and wanted not in (None, trl_mode):
        raise PlanError(
            f"the recipe sets vllm_mode: {trl_mode} but launch.vllm={wanted}",
            hint="Keep one: grpo-launch writes vllm_mode for the trainer from launch.vllm.",
        )
    if topology.is_cpu:
        if wanted in (VllmMode.SERVER, VllmMode.COLOCATE):
            raise PlanError(
                f"vLLM {wanted} mode needs CUDA GPUs, and this topology has none",
                hint="On CPU, generate with transformers: launch.vllm=off (or use_vllm: false). "
                "To plan for GPUs from here, pass --gpus, e.g. --gpus 4xL20-48GB.",
            )
        trace.decide("vllm", VllmMode.OFF, "no GPU: generation runs in the trainers with transformers")
        return VllmMode.OFF
    if wanted is not None:
        trace.decide("vllm", wanted, "set in the recipe")
        return wanted
    if recipe.launch.vllm_gpus is not None or recipe.launch.vllm_tensor_parallel_size is not None:
        trace.decide("vllm", VllmMode.SERVER, "launch.vllm_gpus / launch.vllm_tensor_parallel_size ask for a server")
        return VllmMode.SERVER
    if topology.num_gpus == 1:
        trace.decide("vllm", VllmMode.COLOCATE, "one GPU: vLLM shares it with the trainer (sleep between phases)")
        return VllmMode.COLOCATE
    trace.decide(
        "vllm",
        VllmMode.SERVER,
        f"{topology.num_gpus} GPUs: a dedicated vLLM server keeps generation off the trainers",
    )
    return VllmMode.SERVER


def _requested_tp(recipe: Recipe, trace: Trace, *, moe: bool = False) -> int | None:
    """The server's GPU count the recipe asks for (launch.vllm_gpus, else its tensor-parallel size)."""
    launch = recipe.launch
    tp = launch.vllm_tensor_parallel_size
    if launch.vllm_gpus is not None:
        if tp is not None and tp != launch.vllm_gpus and not (moe and launch.vllm_gpus % tp == 0):
            raise PlanError(
                f"launch.vllm_gpus={launch.vllm_gpus} and launch.vllm_tensor_parallel_size={tp} differ",
                hint="A dense model's server runs one tensor-parallel group: set only one of them (a "
                "mixture-of-experts model may run data parallel: vllm_gpus a multiple of the TP size).",
            )
        tp = launch.vllm_gpus
    if tp is None and recipe.is_set("vllm_tensor_parallel_size"):
        tp = int(recipe.values["vllm_tensor_parallel_size"])
        trace.notice(f"vllm_tensor_parallel_size={tp}: used as the vLLM server's --tensor-parallel-size")
    return tp


def whole_gpu_train_hosts(topology: Topology) -> tuple[TrainHost, ...]:
    """Every GPU of every host trains (colocate, or no vLLM)."""
    return tuple(
        TrainHost(h.name, h.addr, r, tuple(g.visible_id for g in h.gpus), len(h.gpus))
        for r, h in enumerate(topology.hosts)
    )


def plan_server(
    topology: Topology, recipe: Recipe, model: ModelShape | None, trace: Trace, *, forced_tp: int | None = None
) -> tuple[VllmPlan, tuple[TrainHost, ...]]:
    """The vLLM server's TP size and GPUs, and the training hosts left.

    Raises :class:`NoGpuLeftForTraining` when the server would take every GPU of a single host.
    """
    hosts = topology.hosts
    per_host = len(hosts[0].gpus)
    mem = topology.min_gpu_memory_bytes
    if forced_tp and not fits_server_gpu(model, mem, forced_tp):
        raise PlanError(f"split candidate TP {forced_tp}: the weights take over half of each server GPU")
    tp_fixed = forced_tp or _requested_tp(recipe, trace, moe=bool(model and model.is_moe))
    valid = model.valid_tp_sizes(per_host) if model else tuple(range(1, per_host + 1))
    tp_asked = recipe.launch.vllm_tensor_parallel_size if recipe.launch.vllm_gpus else None
    if tp_fixed is not None:
        problems = []
        if tp_fixed > per_host:
            problems.append(
                f"tensor-parallel size {tp_fixed} exceeds the {per_host} GPUs of one host (TP stays in a node)"
            )
        if model and model.tp_problems(tp_fixed) and moe_split(model, tp_fixed, mem, tp_asked) is None:
            problems.append(
                f"vLLM cannot shard {model.name} over {tp_fixed} GPUs: {tp_fixed} does not divide its "
                + ", ".join(model.tp_problems(tp_fixed))
            )
        if problems:
            raise PlanError(
                "the vLLM tensor-parallel size is not possible:",
                problems=problems,
                hint=f"Valid sizes here: {', '.join(map(str, valid))} (or leave it unset to choose).",
            )
        tp_min = tp_fixed
    else:
        fitting = [t for t in valid if fits_server_gpu(model, mem, t)]
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
            fixes = [Fix("launch.vllm", "colocate", "vLLM shares the training GPUs", rank=1)]
            smaller = [t for t in valid if t < per_host and fits_server_gpu(model, mem, t)]
            if smaller:
                fixes.insert(0, Fix("launch.vllm_gpus", max(smaller), "a smaller server leaves GPUs to train", 0))
            fixes.append(Fix("gpus", None, "more GPUs", rank=3, in_recipe=False))
            raise NoGpuLeftForTraining(
                f"the vLLM server needs {tp} GPU(s), leaving none of the {per_host} for training", fixes=fixes
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
        train_hosts = tuple(
            TrainHost(h.name, h.addr, r, tuple(g.visible_id for g in h.gpus), per_host)
            for r, h in enumerate(hosts[:-1])
        )
        where = f"all of {server_host.name} serves ({tp} GPU(s)); {per_host - tp} GPU(s) there idle"
    else:
        keep = per_host - tp
        train_hosts = tuple(
            TrainHost(h.name, h.addr, r, tuple(g.visible_id for g in h.gpus[:keep]), keep) for r, h in enumerate(hosts)
        )
        idle = (len(hosts) - 1) * tp
        where = f"last {tp} GPU(s) of {server_host.name}" + (
            f"; {idle} GPU(s) idle elsewhere so every machine runs {keep} trainers" if idle else ""
        )
    split = moe_split(model, tp, mem, tp_asked)
    dp, gpus_why = 1, ""
    if split is not None and model is not None:
        tp, dp = split
        gpus_why = f"TP {tp} within each of the {dp} data-parallel ranks (see vllm_data_parallel_size)"
        trace.decide(
            "vllm_data_parallel_size",
            dp,
            f"{model.name} is a mixture of experts: {tp * dp} server GPUs as {dp} data-parallel rank(s) of TP {tp} "
            f"with expert parallelism (the {model.experts} experts spread over all of them: "
            f"{model.weight_bytes_per_gpu(tp, dp, ep=True) / GIB:.1f} GiB of weights per GPU), fewer TP all-reduces "
            "per token and a KV cache per rank",
        )
    if gpus_why:
        why_tp = gpus_why
    elif tp_fixed:
        why_tp = "the split search's candidate" if forced_tp else "set in the recipe"
    elif model and tp == tp_min:
        why_tp = (
            f"smallest size whose bf16 weights ({model.weight_bytes_bf16 / GIB:.1f} GiB) take ≤ "
            f"{VLLM_WEIGHTS_SHARE:.0%} of a GPU, sharding heads, MLP and vocabulary evenly"
        )
    else:
        why_tp = f"a whole host serves: the largest size that shards {model.name}" if model else "model unknown"
    trace.decide("vllm_tensor_parallel_size", tp, why_tp)
    trace.decide("server_gpus", f"{server_host.name}:{','.join(server_gpus)}", where)

    launch = recipe.launch
    util = launch.vllm_gpu_memory_utilization
    if util is None and recipe.is_set("vllm_gpu_memory_utilization"):
        util = float(recipe.values["vllm_gpu_memory_utilization"])
        trace.notice(
            f"vllm_gpu_memory_utilization={util}: moved to the vLLM server's --gpu-memory-utilization "
            "(TRL only reads it in colocate mode)"
        )
    multi = len(hosts) > 1
    vllm = VllmPlan(
        mode=VllmMode.SERVER,
        host=server_host.name,
        address=server_host.addr if multi else "127.0.0.1",
        gpus=server_gpus,
        tensor_parallel_size=tp,
        data_parallel_size=dp,
        expert_parallel=dp > 1,
        port=launch.vllm_port,
        bind_host=launch.vllm_host or ("0.0.0.0" if multi else "127.0.0.1"),
        gpu_memory_utilization=util or VLLM_SERVER_UTILIZATION,
        max_model_len=max_model_len(recipe),
        max_prompt_length=prompt_bound(recipe),
    )
    return vllm, train_hosts


def moe_split(model: ModelShape | None, gpus: int, mem: int | None, tp: int | None = None) -> tuple[int, int] | None:
    """(TP, DP) for a mixture-of-experts server on ``gpus`` GPUs with the experts spread over all of them (vLLM's
    --data-parallel-size with --enable-expert-parallel, as TRL's docs advise for MoE models): the smallest TP (or
    the recipe's ``tp``) that shards the model and divides ``gpus``, whose weights per GPU fit the server's share.
    None for a dense model, one GPU, or no such split."""
    if model is None or not model.is_moe or gpus < 2:
        return None
    sizes = [tp] if tp else [t for t in range(1, gpus + 1) if gpus % t == 0]
    for t in sizes:
        if gpus % t or model.tp_problems(t):
            continue
        if mem is None or model.weight_bytes_per_gpu(t, gpus // t, ep=True) <= VLLM_WEIGHTS_SHARE * mem:
            return t, gpus // t
    return None


def plan_colocate(
    topology: Topology, recipe: Recipe, model: ModelShape | None, train_hosts: tuple[TrainHost, ...], trace: Trace
) -> VllmPlan:
    per_host = train_hosts[0].processes
    n = sum(h.processes for h in train_hosts)
    util = float(
        recipe.launch.vllm_gpu_memory_utilization
        or recipe.get("vllm_gpu_memory_utilization")
        or TRL_COLOCATE_UTILIZATION
    )
    fixed = recipe.launch.vllm_tensor_parallel_size or recipe.get("vllm_tensor_parallel_size")
    if fixed:
        tp = int(fixed)
        if tp > per_host:
            raise PlanError(
                f"colocated vLLM tensor_parallel_size={tp} exceeds the {per_host} GPUs of a host",
                hint="Use a smaller vllm_tensor_parallel_size.",
            )
        if model and model.tp_problems(tp):
            raise PlanError(
                f"vLLM cannot shard {model.name} over {tp} GPUs: {tp} does not divide its "
                + ", ".join(model.tp_problems(tp)),
                hint=f"Valid sizes here: {', '.join(map(str, model.valid_tp_sizes(per_host)))}.",
            )
        why = "set in the recipe"
    else:
        # Each colocated engine gets `util` of a GPU; its weights should take at most the allowed share of that.
        valid = [t for t in (model.valid_tp_sizes(per_host) if model else (1,)) if n % t == 0]
        mem = topology.min_gpu_memory_bytes
        share = VLLM_WEIGHTS_SHARE * util * mem if mem else None
        fits = [t for t in valid if model is None or share is None or model.weight_bytes_bf16 / t <= share]
        tp = fits[0] if fits else valid[-1]
        why = "smallest size whose weights fit the vLLM share of a GPU" if fits else "largest size possible"
        if not fits and model is not None and mem is not None:
            trace.warn(
                f"colocated vLLM: {model.weight_bytes_bf16 / tp / GIB:.1f} GiB of weights per GPU at TP {tp} is over "
                f"half of the {util:.0%} vLLM share ({util * mem / GIB:.1f} GiB): expect a small KV cache"
            )
    trace.decide("vllm_tensor_parallel_size", tp, f"colocate: {why}")
    trace.decide("vllm_gpu_memory_utilization", util, "vLLM shares each training GPU (colocate)")
    sleep = bool(recipe.get("vllm_enable_sleep_mode"))
    trace.decide(
        "vllm_enable_sleep_mode",
        sleep,
        "set in the recipe: vLLM frees its memory while the trainers train (a wake-up each step)"
        if sleep
        else "TRL's default: vLLM keeps its share while the trainers train, and the training budget leaves it",
    )
    return VllmPlan(
        mode=VllmMode.COLOCATE,
        tensor_parallel_size=tp,
        gpu_memory_utilization=util,
        max_model_len=max_model_len(recipe),
        max_prompt_length=prompt_bound(recipe),
        sleep_mode=sleep,
    )


def cpu_train_hosts(topology: Topology, recipe: Recipe, trace: Trace) -> tuple[TrainHost, ...]:
    hosts = topology.hosts
    if len(hosts) == 1:
        n = recipe.launch.num_processes or 1
        trace.decide(
            "num_processes", n, "set in launch.num_processes" if recipe.launch.num_processes else "CPU default"
        )
        h = hosts[0]
        return (TrainHost(h.name, h.addr, 0, (), n),)
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
    trace.decide("num_processes", per * len(hosts), why)
    return tuple(TrainHost(h.name, h.addr, r, (), per) for r, h in enumerate(hosts))


def gpu_roles(topology: Topology, vllm: VllmPlan, train_hosts: tuple[TrainHost, ...]) -> tuple[GpuRole, ...]:
    training = {(h.name, g) for h in train_hosts for g in h.gpus}
    serving = {(vllm.host, g) for g in vllm.gpus} if vllm.mode == VllmMode.SERVER else set()
    roles = []
    for h in topology.hosts:
        for g in h.gpus:
            key = (h.name, g.visible_id)
            use = GpuUse.VLLM if key in serving else GpuUse.TRAIN if key in training else GpuUse.IDLE
            if vllm.mode == VllmMode.COLOCATE and use == GpuUse.TRAIN:
                use = GpuUse.SHARED
            roles.append(GpuRole(h.name, g.visible_id, g.name, g.memory_gib, use))
    return tuple(roles)

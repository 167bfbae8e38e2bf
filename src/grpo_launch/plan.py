"""make_plan(topology, recipe, model) → Plan. Pure: no torch/trl import, no environment reads, no files.

Decides the vLLM mode (server / colocate / off), which GPUs of which hosts generate and which train (disjoint),
the vLLM tensor-parallel size, the batch layout (:mod:`grpo_launch.layout`), the distributed backend, and the
resolved trainer values. Every choice is recorded with its reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_launch.errors import PlanError
from grpo_launch.hardware import GIB, ModelShape
from grpo_launch.layout import Layout, LayoutRequest, solve_layout
from grpo_launch.recipe import Recipe
from grpo_launch.topology import Topology

DEFAULT_RUN_ROOT = "grpo_runs"
SERVER_MEMORY_UTILIZATION = 0.9  # vLLM's own default: the server GPU does nothing else
WEIGHTS_SHARE_OF_SERVER_GPU = 0.5  # leave at least half of a server GPU for the KV cache
TRAIN_MEMORY_BUDGET = 0.7  # share of a training GPU the weights + optimizer state may take (rest: activations)


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


def default_run_dir(recipe: Recipe) -> str:
    return recipe.launch.run_dir or f"{DEFAULT_RUN_ROOT}/{recipe.name}"


def make_plan(topology: Topology, recipe: Recipe, model: ModelShape | None = None) -> Plan:
    """Plan a GRPO run of ``recipe`` on ``topology``. Raises :class:`PlanError` listing every problem."""
    decisions: list[Decision] = []
    notices = list(recipe.notices)
    warnings = list(topology.warnings)
    values = recipe.values
    launch = recipe.launch

    if values.get("use_cpu") is True and not topology.is_cpu:
        topology = dataclasses.replace(topology, hosts=tuple(dataclasses.replace(h, gpus=()) for h in topology.hosts))
        decisions.append(Decision("device", "cpu", "use_cpu: true in the recipe: the GPUs are left unused"))
    mode = _choose_mode(topology, recipe, decisions)
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
                vllm, train_hosts = _plan_server(topology, recipe, model, decisions, notices)
            except PlanError as exc:
                if not _auto_mode(recipe) or "leaving none" not in exc.message:
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

    backend, offload = _choose_backend(topology, recipe, model, n, vllm, decisions, warnings)
    device = "cpu" if topology.is_cpu else "cuda"
    train = TrainPlan(
        device=device,
        hosts=train_hosts,
        backend=backend,
        offload=offload,
        main_process_port=launch.main_process_port,
        mixed_precision="no" if device == "cpu" else ("no" if values.get("bf16") is False else "bf16"),
    )
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
    topology: Topology, recipe: Recipe, model: ModelShape | None, decisions: list[Decision], notices: list[str]
) -> tuple[VllmPlan, tuple[TrainHost, ...]]:
    hosts = topology.hosts
    per_host = len(hosts[0].gpus)
    mem = topology.min_gpu_memory_bytes
    tp_fixed = _requested_tp(recipe, notices)
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
        "set in the recipe"
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


def training_bytes_per_gpu(params: float, n: int, backend: str, offload: str, *, lora: bool = False) -> float:
    """Weights + gradients + Adam state per training GPU (bf16 weights/grads, fp32 master + moments)."""
    if lora:
        return 2.0 * params / (n if backend == "zero3" else 1)
    weights, grads, optim = 2.0 * params, 2.0 * params, 12.0 * params
    if backend == "zero2":
        grads, optim = grads / n, optim / n
    elif backend in ("zero3", "fsdp"):
        weights, grads, optim = weights / n, grads / n, optim / n
    if offload in ("optimizer", "optimizer+params"):
        optim = 0.0
    if offload == "optimizer+params":
        weights = 0.0
    return weights + grads + optim


def _choose_backend(
    topology: Topology,
    recipe: Recipe,
    model: ModelShape | None,
    n: int,
    vllm: VllmPlan,
    decisions: list[Decision],
    warnings: list[str],
) -> tuple[str, str]:
    backend, offload = recipe.launch.backend, recipe.launch.offload
    if topology.is_cpu:
        if backend == "fsdp":
            raise PlanError("FSDP is not supported on CPU here", hint="Use launch.backend=ddp, zero2 or zero3.")
        chosen = "ddp" if backend == "auto" else backend
        decisions.append(
            Decision("backend", chosen, "set in the recipe" if backend != "auto" else "CPU: plain DDP (gloo)")
        )
        return chosen, "none" if offload == "auto" else offload
    mem = topology.min_gpu_memory_bytes
    lora = bool(recipe.get("use_peft"))
    if backend != "auto" and offload != "auto":
        decisions.append(Decision("backend", f"{backend}/{offload}", "set in the recipe"))
        return backend, offload
    if model is None or mem is None:
        chosen = "zero2" if backend == "auto" else backend
        decisions.append(Decision("backend", chosen, "model size or GPU memory unknown: ZeRO-2 is a safe default"))
        return chosen, "none" if offload == "auto" else offload
    budget = TRAIN_MEMORY_BUDGET * mem * (1.0 - (vllm.gpu_memory_utilization or 0) if vllm.mode == "colocate" else 1.0)
    candidates = [
        ("ddp", "none"),
        ("zero2", "none"),
        ("zero3", "none"),
        ("zero3", "optimizer"),
        ("zero3", "optimizer+params"),
    ]
    if backend != "auto":
        candidates = [c for c in candidates if c[0] == backend] or [(backend, "none")]
    if offload != "auto":
        candidates = [(b, offload) for b, _ in candidates]
    if n == 1:
        candidates = [c for c in candidates if c[0] in ("ddp", "zero3")] or candidates
    for b, o in candidates:
        need = training_bytes_per_gpu(model.params, n, b, o, lora=lora)
        if need <= budget:
            decisions.append(
                Decision(
                    "backend",
                    b if o == "none" else f"{b} + offload {o}",
                    f"cheapest that fits: {need / GIB:.1f} GiB of weights/grads/optimizer per GPU ≤ "
                    f"{budget / GIB:.1f} GiB budget",
                )
            )
            return b, o
    b, o = candidates[-1]
    need = training_bytes_per_gpu(model.params, n, b, o, lora=lora)
    raise PlanError(
        f"{model.name} does not fit on {n} training GPU(s) of {mem / GIB:.0f} GiB: even {b} with offload {o} "
        f"needs {need / GIB:.1f} GiB per GPU (budget {budget / GIB:.1f} GiB)",
        hint="Use more GPUs, LoRA (use_peft: true), or GPUs with more memory.",
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

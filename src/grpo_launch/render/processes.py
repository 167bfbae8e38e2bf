"""Plan → the processes to start (pure): the vLLM server for TRL's server mode and one ``accelerate launch`` per
training host. Backends place them on their hosts (:mod:`grpo_launch.backends`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from grpo_launch.enums import Device, DistBackend, Role, VllmMode
from grpo_launch.planning.plan_types import Plan, TrainHost, VllmPlan
from grpo_launch.recipe.trl_schema import DEFAULTS as TRL_DEFAULTS
from grpo_launch.recipe.versions import TRL_VLLM_RANGE, version_tuple
from grpo_launch.rundir.layout import ATTEMPT_ENV, RUN_DIR_ENV, RUN_NAME_ENV
from grpo_launch.spec import ProcessSpec

if TYPE_CHECKING:  # the record is only read here; its module is not needed at plan's start-up
    from grpo_launch.rundir.tracking import TrackingRecord

NCCL_WEIGHT_TRANSFER = '{"backend": "nccl"}'
# vLLM's --middleware hook (an import path; a class is added with app.add_middleware): every route but /health needs
# the attempt's token and only TRL's endpoints pass (grpo_launch.node.vllm_guard, which says why and which).
GUARD_MIDDLEWARE = "grpo_launch.node.vllm_guard.VllmGuard"


SCALE_OUT_SINCE = (0, 30)  # TRL adds --enable-scale-out for vLLM >= 0.30 (trl/scripts/vllm_serve.py)


def weight_sync_port(plan: Plan) -> int:
    """The port TRL's trainer rank 0 hosts the NCCL weight-sync group on (vllm_group_port, TRL's default 51216)."""
    return int(plan.trainer_values.get("vllm_group_port") or TRL_DEFAULTS["vllm_group_port"])


# vLLM's own API key, emptied in the server's environment: a VLLM_API_KEY the user exported (for another vLLM) would
# reach the server through the inherited environment and turn on vLLM's key check, and TRL's clients, which send no
# key, would get 401 on every request. An empty key is none: vLLM keeps only non-empty keys (0.31,
# vllm/entrypoints/serve/middleware/register.py: ``[key for key in (args.api_key or [envs.VLLM_API_KEY]) if key]``;
# earlier versions test ``args.api_key or envs.VLLM_API_KEY``). The server is guarded by grpo-launch's own per-attempt
# token instead (grpo_launch.node.vllm_guard); the recipe refuses --api-key and VLLM_API_KEY for the same reason.
NO_VLLM_API_KEY = {"VLLM_API_KEY": ""}


def vllm_server(plan: Plan) -> ProcessSpec | None:
    """The vLLM server for TRL 1.16's server mode, or None when the plan has no server.

    TRL's weight sync needs vLLM's dev endpoints (VLLM_SERVER_DEV_MODE=1), NCCL weight transfer, processed
    logprobs and unlimited logprobs; the guard (``--middleware``, :data:`GUARD_MIDDLEWARE`) closes them, and every
    other route but /health, to anyone without the attempt's token, which reaches the server through its
    environment, never its argv. ``vllm serve`` takes the model as its first argument; any other server
    command (e.g. ``python -m vllm.entrypoints.openai.api_server``) gets ``--model``.
    """
    v = plan.vllm
    if v.mode != VllmMode.SERVER:
        return None
    launch = plan.recipe.launch
    model = str(plan.trainer_values["model_name_or_path"])
    cmd = list(launch.vllm_command)
    argv = [*cmd, model] if cmd[-1] == "serve" else [*cmd, "--model", model]
    revision = plan.trainer_values.get("model_revision")
    if revision and revision != "main":
        argv += ["--revision", str(revision)]
    argv += [
        "--host",
        v.bind_host,
        "--port",
        str(v.port),
        "--tensor-parallel-size",
        str(v.tensor_parallel_size),
        "--gpu-memory-utilization",
        f"{v.gpu_memory_utilization}",
    ]
    argv += _parallel_args(v)
    if v.expert_parallel:
        argv.append("--enable-expert-parallel")
    if v.max_model_len:
        argv += ["--max-model-len", str(v.max_model_len)]
    if v.max_num_seqs:
        argv += ["--max-num-seqs", str(v.max_num_seqs)]
    lora_env = {}
    a = plan.asynchronous
    if a is not None and a.lora_rank:
        # AsyncGRPOTrainer's adapter-only sync (select_adapter_sync, trl async_grpo_trainer.py:861-908): LoRA on,
        # the adapter's rank, max_staleness + 2 adapters resident, and runtime adapter loading.
        argv += ["--enable-lora", "--max-lora-rank", str(a.lora_rank), "--max-loras", str(a.max_loras)]
        lora_env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    # As TRL's own build_command: its model implementation (GRPOConfig.vllm_model_impl), remote code when the
    # recipe trusts it, and the scale-out endpoints on vLLM >= 0.30 (an unknown version is taken as the newest TRL
    # supports; the run's preflight reads the real one).
    argv += ["--model-impl", str(plan.trainer_values.get("vllm_model_impl") or "vllm")]
    if plan.trainer_values.get("trust_remote_code"):
        argv.append("--trust-remote-code")
    if (version_tuple(plan.vllm_version) or TRL_VLLM_RANGE[1]) >= SCALE_OUT_SINCE:
        argv.append("--enable-scale-out")
    argv += [
        "--weight-transfer-config",
        NCCL_WEIGHT_TRANSFER,
        "--logprobs-mode",
        "processed_logprobs",
        "--max-logprobs",
        "-1",
        "--middleware",
        GUARD_MIDDLEWARE,
        *launch.vllm_extra_args,
    ]
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        **NO_VLLM_API_KEY,
        **lora_env,
        **network_env(plan),
        **_host_ip(v, v.address),
        **launch.vllm_env,
    }
    return ProcessSpec(
        name="vllm",
        argv=tuple(argv),
        env=env,
        host=_host(plan, v.host),
        role=Role.VLLM,
        gpus=tuple(v.gpus),
        rocm=plan.topology.is_rocm,
    )


def _parallel_args(v: VllmPlan) -> list[str]:
    """The server's parallelism: pipeline stages, data-parallel ranks, and how they span hosts (vLLM's multi-node
    serving for a replica's stages over hosts; its multi-node data parallel for ranks on several hosts)."""
    args: list[str] = []
    if v.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(v.pipeline_parallel_size)]
    if v.data_parallel_size > 1:  # replicas (a dense model), or DP ranks with the experts spread over them
        args += ["--data-parallel-size", str(v.data_parallel_size)]
    if v.spans_hosts:  # a replica's stages over hosts: vLLM's multi-node serving, this host first (--node-rank 0)
        args += [
            "--nnodes",
            str(len(v.nodes) + 1),
            "--node-rank",
            "0",
            "--master-addr",
            str(v.address),
            "--master-port",
            str(v.master_port),
        ]
        if v.data_parallel_size > 1:
            args += ["--data-parallel-rpc-port", str(v.rpc_port)]
    elif v.nodes:  # vLLM's multi-node data parallel: the ranks of each host, and where the API server's host is
        args += [
            "--data-parallel-size-local",
            str(v.local_data_parallel_size),
            "--data-parallel-address",
            str(v.address),
            "--data-parallel-rpc-port",
            str(v.rpc_port),
        ]
    return args


def vllm_servers(plan: Plan) -> tuple[ProcessSpec, ...]:
    """The vLLM server's processes: the API server, then one headless process per other host of a server over
    several: its first data-parallel rank (vLLM's multi-node data parallel), or its node rank when a replica's
    pipeline stages span hosts (``--nnodes``: vLLM infers the ranks; a host that starts a replica runs its engine,
    the others its workers)."""
    head = vllm_server(plan)
    if head is None:
        return ()
    v = plan.vllm
    others = []
    for i, node in enumerate(v.nodes, start=1):
        if v.spans_hosts:
            at = head.argv.index("--node-rank")
            argv = [*head.argv[: at + 1], str(i), *head.argv[at + 2 :], "--headless"]
        else:
            argv = [*head.argv, "--data-parallel-start-rank", str(i * v.local_data_parallel_size), "--headless"]
        env = {**head.env, **_host_ip(v, node.address), **plan.recipe.launch.vllm_env}
        others.append(
            replace(
                head,
                name=f"vllm@{node.name}",
                argv=tuple(argv),
                env=env,
                host=node.name,
                gpus=node.gpus,
                rocm=plan.topology.is_rocm,
            )
        )
    return (head, *others)


def _host_ip(v: VllmPlan, address: str | None) -> dict[str, str]:
    """A server over several hosts: each host's own address for vLLM's get_ip(), which otherwise takes the
    default-route address (or 0.0.0.0 without one, seen on the test hosts), and the other hosts then cannot reach
    the head's message queue (vllm/v1/executor/multiproc_executor.py, ``mq_connect_ip``)."""
    return {"VLLM_HOST_IP": address} if v.nodes and address else {}


def _host(plan: Plan, name: str | None) -> str | None:
    """Hosts are named only when the plan spans several (a one-host plan runs here)."""
    return name if len(plan.topology.hosts) > 1 else None


def train_env(plan: Plan, host: TrainHost) -> dict[str, str]:
    """The environment a host's `accelerate launch` adds (its GPUs travel as ProcessSpec.gpus)."""
    env: dict[str, str] = {}
    if plan.train.device == Device.CPU and not plan.train.backend.is_deepspeed:
        # Not `--cpu`/`use_cpu: true` in the config: those quietly run one process. (DeepSpeed on CPU needs
        # neither: its CPU accelerator takes over; see planning.trainer_values.)
        env["ACCELERATE_USE_CPU"] = "true"
    if plan.train.device == Device.CPU:
        env["DS_ACCELERATOR"] = "cpu"  # said, not detected: DeepSpeed (imported by transformers) warns when it guesses
        cpus = next((h.slots or h.cpus for h in plan.topology.hosts if h.name == host.name), None)
        if cpus:
            env["OMP_NUM_THREADS"] = str(max(1, cpus // host.processes))
    # The trainers write their records there and watch it for a checkpoint-and-stop request (SIGUSR2 to
    # grpo-launch; Slurm preemption).
    env[RUN_DIR_ENV] = str(plan.run_dir)
    one_host = len(plan.topology.hosts) == 1
    if host.machine_rank == 0 and plan.vllm.mode == VllmMode.SERVER:
        # TRL's rank 0 hosts the weight-sync group's store on vLLM's get_ip() and vllm_group_port (vLLM's
        # StatelessProcessGroup.create binds that address): VLLM_HOST_IP, else the default-route address, which on a
        # multi-homed node need not be the network the server reaches, and on one host is reachable from outside
        # while the server, on the same host, reaches 127.0.0.1.
        env["VLLM_HOST_IP"] = "127.0.0.1" if one_host else host.address
    if plan.train.num_machines == 1:
        # The ranks' gloo pairs listen on the address of the host's name unless told an interface (a name that
        # resolves to the LAN address opens them to it); on one machine every peer is local.
        # launch.network_interface (below) wins.
        env["GLOO_SOCKET_IFNAME"] = "lo"
    env.update(network_env(plan))
    env.update(plan.recipe.launch.train_env)
    return env


def network_env(plan: Plan) -> dict[str, str]:
    """The interface torch (gloo) and NCCL bind to, when the hosts have several (launch.network_interface)."""
    iface = plan.recipe.launch.network_interface
    return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface} if iface else {}


def attempt_env(attempt: int, tracking: TrackingRecord, given: Mapping[str, str]) -> dict[str, str]:
    """What one attempt adds to its processes' environment: its number (every metrics record carries it) and the
    run's one tracking run, so that a restart, a requeue, a launch.adapt move or a resume reports to the same run:
    W&B's run id with ``WANDB_RESUME=allow`` (wandb.init: resume the run of that id if it exists, else start it)
    and the run's name (the trainers make it run_name when the recipe sets none: W&B and trackio name their run
    from it, and trackio resumes by name). TensorBoard's directory (TENSORBOARD_LOGGING_DIR) and W&B's (WANDB_DIR)
    are the run directory's already. A variable the user set (``given``: the launcher's environment and
    launch.train_env) is left to them."""
    env = {
        ATTEMPT_ENV: str(attempt),
        RUN_NAME_ENV: tracking.name,
        "WANDB_RUN_ID": tracking.run_id,
        "WANDB_RESUME": "allow",
    }
    return {k: v for k, v in env.items() if k not in given or k == ATTEMPT_ENV}


def trainers(plan: Plan) -> tuple[ProcessSpec, ...]:
    """One `accelerate launch` per training host, each with its own machine_rank."""
    train, paths = plan.train, plan.paths
    specs = []
    for h in train.hosts:
        argv = [
            plan.python,
            *loopback_store(plan),
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(paths.accelerate_config),
            "--num_processes",
            str(train.num_processes),
            "--num_machines",
            str(train.num_machines),
            "--machine_rank",
            str(h.machine_rank),
        ]
        if train.num_machines > 1:
            argv += ["--main_process_ip", train.main_process_ip]
        argv += ["--main_process_port", str(train.main_process_port)]
        argv += ["--module", plan.recipe.launch.train_module, "--recipe", str(paths.trainer_recipe)]
        name = "train" if train.num_machines == 1 else f"train@{h.name}"
        specs.append(
            ProcessSpec(
                name=name,
                argv=tuple(argv),
                env=train_env(plan, h),
                host=_host(plan, h.name),
                role=Role.TRAIN,
                gpus=tuple(h.gpus),  # () on CPU: never let a CPU plan touch a GPU
                rocm=plan.topology.is_rocm,
            )
        )
    return tuple(specs)


def loopback_store(plan: Plan) -> tuple[str, ...]:
    """What goes before ``-m accelerate.commands.launch`` so that a one-host run's torch.distributed stores listen on
    127.0.0.1 only (:mod:`grpo_launch.node.loopback_store`, which says why torch needs it), when the run has such
    stores: torchrun hosts one for every launch but accelerate's simple launcher (DDP with one process, no store).
    A run over several hosts keeps torch's every-interface store: the other hosts must reach it (README, "Ports")."""
    train = plan.train
    if train.num_machines > 1 or (train.num_processes == 1 and train.backend == DistBackend.DDP):
        return ()
    return ("-m", "grpo_launch.node.loopback_store", str(train.main_process_port))


def all_processes(plan: Plan) -> tuple[ProcessSpec, ...]:
    """The server's processes (if any) first, then the trainers."""
    return (*vllm_servers(plan), *trainers(plan))

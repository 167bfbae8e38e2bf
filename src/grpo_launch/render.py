"""Plan → files and process specs (pure): accelerate config, DeepSpeed JSON, the trainer's resolved recipe,
the vLLM server command and ``plan.json``. :mod:`grpo_launch.rundir` writes them; the supervisor runs them."""

from __future__ import annotations

import copy
import functools
import json
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from grpo_launch import __version__
from grpo_launch.control import CONTROL_DIR_ENV, control_dir
from grpo_launch.plan import Plan, TrainHost

ACCELERATE_CONFIG = "accelerate_config.yaml"
DEEPSPEED_CONFIG = "deepspeed.json"
TRAINER_RECIPE = "trainer_recipe.yaml"
PLAN_JSON = "plan.json"
# Not a TRL key, so TRL's parser would reject it: the train entry reads it and removes it.
NCCL_WEIGHT_TRANSFER = '{"backend": "nccl"}'


@dataclass(frozen=True)
class ProcessSpec:
    """One process to start: argv, the environment it adds to the parent's, and where it logs."""

    name: str  # vllm | train | train@host
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    host: str | None = None  # None: this machine
    log_file: str | None = None
    # Names of variables sent on stdin as KEY=JSON lines (secrets: never on a command line or in a file).
    stdin_env: tuple[str, ...] = ()
    # How to signal the process tree on its host: a command with {sig} and {pgid} (the group the process
    # announces with grpo_launch.task --announce-pgid). None: a local process group.
    signal_argv: tuple[str, ...] | None = None

    def shell(self) -> str:
        """The command as one shell line (env assignments first), for --dry-run and docs."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        line = (env + " " if env else "") + shlex.join(self.argv)
        if self.stdin_env:
            line += f"  # on stdin: {', '.join(self.stdin_env)}"
        return line


@functools.cache
def _template(name: str) -> dict[str, Any]:
    """A template from accelerate_configs/ (packaged in the wheel; read from the source tree when editable)."""
    packaged = resources.files("grpo_launch") / "accelerate_configs" / name
    if packaged.is_file():
        text = packaged.read_text()
    else:
        text = (Path(__file__).resolve().parents[2] / "accelerate_configs" / name).read_text()
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def render_accelerate_config(plan: Plan, *, deepspeed_file: str = DEEPSPEED_CONFIG) -> dict[str, Any]:
    """The accelerate config for the training processes (machine_rank 0; each host overrides it on the CLI)."""
    train = plan.train
    if train.backend in ("zero2", "zero3"):
        cfg = copy.deepcopy(_template("deepspeed.yaml"))
        cfg["deepspeed_config"]["deepspeed_config_file"] = deepspeed_file
        cfg["deepspeed_config"]["zero3_init_flag"] = train.backend == "zero3"
        if train.num_machines == 1:
            cfg["deepspeed_config"].pop("deepspeed_multinode_launcher")
    elif train.backend == "fsdp":
        cfg = copy.deepcopy(_template("fsdp.yaml"))
        cfg["fsdp_config"]["fsdp_offload_params"] = train.offload == "optimizer+params"
        # TRL's trainer does its own gradient checkpointing; FSDP's would apply it twice.
        cfg["fsdp_config"]["fsdp_activation_checkpointing"] = False
    else:
        cfg = copy.deepcopy(_template("ddp.yaml"))
        if train.num_processes == 1:
            cfg["distributed_type"] = "NO"
    cfg["num_processes"] = train.num_processes
    cfg["num_machines"] = train.num_machines
    cfg["machine_rank"] = 0
    if cfg["distributed_type"] == "DEEPSPEED":
        # With deepspeed_config_file accelerate rejects a mixed_precision here: precision comes from the JSON
        # ("bf16": {"enabled": "auto"}, filled from the trainer's bf16).
        cfg.pop("mixed_precision", None)
    else:
        cfg["mixed_precision"] = train.mixed_precision
    if train.num_machines > 1:
        cfg["main_process_ip"] = train.main_process_ip
        cfg["main_process_port"] = train.main_process_port
    # On CPU the processes get ACCELERATE_USE_CPU=true instead: `use_cpu: true` (like --cpu) would quietly run
    # one process whatever num_processes says.
    cfg["use_cpu"] = False
    return cfg


def render_deepspeed_config(plan: Plan) -> dict[str, Any] | None:
    """The DeepSpeed JSON for ZeRO-2/3 ("auto" values are filled by transformers), or None for other backends."""
    train = plan.train
    if train.backend not in ("zero2", "zero3"):
        return None
    zero: dict[str, Any] = {
        "stage": 2 if train.backend == "zero2" else 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if train.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if train.backend == "zero3":
        zero.update(
            stage3_prefetch_bucket_size="auto",
            stage3_param_persistence_threshold="auto",
            stage3_gather_16bit_weights_on_model_save=True,
        )
        if train.offload == "optimizer+params":
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": zero,
    }


def render_trainer_recipe(plan: Plan) -> str:
    """The resolved recipe the training entry reads: every planned TRL value written out."""
    header = (
        f"# Resolved by grpo-launch {__version__} from {plan.recipe.source or 'a recipe'}.\n"
        f"# Every value the planner chose is written out; plan.json says why.\n"
    )
    return header + yaml.safe_dump(dict(plan.trainer_values), sort_keys=False, default_flow_style=False)


def render_vllm_command(plan: Plan) -> ProcessSpec | None:
    """The vLLM server for TRL 1.16's server mode, or None when the plan has no server.

    TRL's weight sync needs vLLM's dev endpoints (VLLM_SERVER_DEV_MODE=1), NCCL weight transfer, processed
    logprobs and unlimited logprobs. ``vllm serve`` takes the model as its first argument; any other server
    command (e.g. ``python -m vllm.entrypoints.openai.api_server``) gets ``--model``.
    """
    v = plan.vllm
    if v.mode != "server":
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
    if v.max_model_len:
        argv += ["--max-model-len", str(v.max_model_len)]
    if v.max_num_seqs:
        argv += ["--max-num-seqs", str(v.max_num_seqs)]
    argv += [
        "--weight-transfer-config",
        NCCL_WEIGHT_TRANSFER,
        "--logprobs-mode",
        "processed_logprobs",
        "--max-logprobs",
        "-1",
        *launch.vllm_extra_args,
    ]
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(v.gpus),
        "VLLM_SERVER_DEV_MODE": "1",
        **network_env(plan),
        **launch.vllm_env,
    }
    return ProcessSpec(name="vllm", argv=tuple(argv), env=env, host=v.host if _multi(plan) else None)


def _multi(plan: Plan) -> bool:
    return len(plan.topology.hosts) > 1


def train_env(plan: Plan, host: TrainHost) -> dict[str, str]:
    """The environment a host's `accelerate launch` adds: its GPUs, or the CPU switch."""
    env: dict[str, str] = {}
    if plan.train.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # never let a CPU plan touch a GPU
        if plan.train.backend not in ("zero2", "zero3"):
            # Not `--cpu`/`use_cpu: true` in the config: those quietly run one process. (DeepSpeed on CPU needs
            # neither: its CPU accelerator takes over; see plan._trainer_values.)
            env["ACCELERATE_USE_CPU"] = "true"
        cpus = next((h.cpus for h in plan.topology.hosts if h.name == host.name), None)
        if cpus:
            env["OMP_NUM_THREADS"] = str(max(1, cpus // host.processes))
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(host.gpus)
    # The trainers watch this directory for a checkpoint-and-stop request (SIGUSR2 to grpo-launch; Slurm preemption).
    env[CONTROL_DIR_ENV] = str(control_dir(plan.run_dir))
    env.update(network_env(plan))
    env.update(plan.recipe.launch.train_env)
    return env


def network_env(plan: Plan) -> dict[str, str]:
    """The interface torch (gloo) and NCCL bind to, when the hosts have several (launch.network_interface)."""
    iface = plan.recipe.launch.network_interface
    return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface} if iface else {}


def render_train_commands(plan: Plan, run_dir: str, *, python: str = "python3") -> tuple[ProcessSpec, ...]:
    """One `accelerate launch` per training host, each with its own machine_rank."""
    specs = []
    for h in plan.train.hosts:
        argv = [
            python,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            f"{run_dir}/{ACCELERATE_CONFIG}",
            "--num_processes",
            str(plan.train.num_processes),
            "--num_machines",
            str(plan.train.num_machines),
            "--machine_rank",
            str(h.machine_rank),
        ]
        if plan.train.num_machines > 1:
            argv += [
                "--main_process_ip",
                plan.train.main_process_ip,
                "--main_process_port",
                str(plan.train.main_process_port),
            ]
        else:
            argv += ["--main_process_port", str(plan.train.main_process_port)]
        argv += ["--module", "grpo_launch.train", "--recipe", f"{run_dir}/{TRAINER_RECIPE}"]
        name = "train" if plan.train.num_machines == 1 else f"train@{h.name}"
        specs.append(
            ProcessSpec(name=name, argv=tuple(argv), env=train_env(plan, h), host=h.name if _multi(plan) else None)
        )
    return tuple(specs)


def plan_to_dict(plan: Plan, run_dir: str, *, python: str = "python3") -> dict[str, Any]:
    """Everything decided, with reasons, as plain JSON-able data."""
    vllm_spec = render_vllm_command(plan)
    return {
        "grpo_launch_version": __version__,
        "recipe": plan.recipe.source,
        "run_dir": run_dir,
        "topology": {
            "source": plan.topology.source,
            "description": plan.topology.describe(),
            "hosts": [
                {"name": h.name, "address": h.addr, "gpus": [asdict(g) for g in h.gpus], "cpus": h.cpus}
                for h in plan.topology.hosts
            ],
        },
        "model": asdict(plan.model) if plan.model else None,
        "roles": [asdict(r) for r in plan.roles],
        "vllm": {
            **asdict(plan.vllm),
            "base_url": plan.vllm.base_url,
            "command": list(vllm_spec.argv) if vllm_spec else None,
            "env": dict(vllm_spec.env) if vllm_spec else None,
            "shell": vllm_spec.shell() if vllm_spec else None,
        },
        "train": {
            "device": plan.train.device,
            "backend": plan.train.backend,
            "offload": plan.train.offload,
            "mixed_precision": plan.train.mixed_precision,
            "num_processes": plan.train.num_processes,
            "num_machines": plan.train.num_machines,
            "main_process_ip": plan.train.main_process_ip,
            "main_process_port": plan.train.main_process_port,
            "hosts": [asdict(h) for h in plan.train.hosts],
            "commands": [
                {"name": s.name, "host": s.host, "argv": list(s.argv), "env": dict(s.env), "shell": s.shell()}
                for s in render_train_commands(plan, run_dir, python=python)
            ],
        },
        "layout": {
            **asdict(plan.layout),
            "prompts_per_generation": plan.layout.prompts_per_generation,
            "completions_per_optimizer_step": plan.layout.completions_per_optimizer_step,
        },
        "estimate": (
            {
                "generation_s": plan.estimate.step.generation_s,
                "training_s": plan.estimate.step.training_s,
                "sync_s": plan.estimate.step.sync_s,
                "step_s": plan.estimate.step.total_s,
                "bottleneck": plan.estimate.step.bottleneck,
                "train_memory_gib": plan.estimate.train_memory_gib,
                "vllm_memory_gib": plan.estimate.vllm_memory_gib,
                "gpu_memory_gib": plan.estimate.gpu_memory_gib,
                "explain": list(plan.estimate.explain),
            }
            if plan.estimate
            else None
        ),
        "decisions": [asdict(d) for d in plan.decisions],
        "notices": list(plan.notices),
        "warnings": list(plan.warnings),
        "trainer_values": dict(plan.trainer_values),
    }


def render_files(plan: Plan, run_dir: str, *, python: str = "python3") -> dict[str, str]:
    """Relative path → text for every file of a run directory."""
    files = {
        ACCELERATE_CONFIG: yaml.safe_dump(
            render_accelerate_config(plan, deepspeed_file=f"{run_dir}/{DEEPSPEED_CONFIG}"), sort_keys=True
        ),
        TRAINER_RECIPE: render_trainer_recipe(plan),
        PLAN_JSON: json.dumps(plan_to_dict(plan, run_dir, python=python), indent=2, default=str) + "\n",
    }
    ds = render_deepspeed_config(plan)
    if ds is not None:
        files[DEEPSPEED_CONFIG] = json.dumps(ds, indent=2) + "\n"
    return files

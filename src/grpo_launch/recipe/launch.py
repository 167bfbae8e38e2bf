"""grpo-launch's own settings, the recipe's ``launch:`` block: the fields with their ranges and choices, and their
conversion from YAML values (every problem collected, none raised alone)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from grpo_launch.enums import DistBackend, LaunchMode, Offload, OnOom, VllmMode
from grpo_launch.errors import did_you_mean, short
from grpo_launch.recipe.values import AUTO, ENV_NAME, finite
from grpo_launch.spec import frozen, is_secret_name

# A DNS name (RFC 1123 labels), an IPv4 address or an IPv6 address.
HOST_PATTERN = (
    r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*|[0-9A-Fa-f:.]+"
)


DEFAULT_NODE_WAIT_S = 300.0  # a rejoining raylet, or an autoscaler's replacement node, joins within minutes
DEFAULT_STOP_GRACE_S = 300.0  # launch.stop_grace_s unset outside Slurm: a GPU step and its save fit in most runs


@frozen
class LaunchSettings:
    """grpo-launch's own settings: the recipe's optional ``launch:`` block."""

    # sync: TRL's GRPOTrainer; async: its AsyncGRPOTrainer (trl/experimental/async_grpo), generation and training
    # overlapped on disjoint GPUs; auto: the planner chooses by the model and the predicted step. Sync by default
    # until async has run on a GPU somewhere.
    mode: LaunchMode = field(default=LaunchMode.SYNC, metadata={"enum": LaunchMode})
    vllm: VllmMode | None = field(default=None, metadata={"enum": VllmMode})  # None: auto (the planner chooses)
    vllm_gpus: int | None = field(default=None, metadata={"min": 1, "max": 4096})
    vllm_tensor_parallel_size: int | None = field(default=None, metadata={"min": 1, "max": 4096})
    # Pipeline stages of each server replica (TP × PP GPUs). Unset: only where no server of TP alone fits the model.
    vllm_pipeline_parallel_size: int | None = field(default=None, metadata={"min": 1, "max": 1024})
    vllm_port: int = field(default=8000, metadata={"min": 1, "max": 65535})
    vllm_host: str | None = field(
        default=None, metadata={"kind": "str", "pattern": HOST_PATTERN, "what": "a host name or IP address"}
    )
    vllm_gpu_memory_utilization: float | None = field(
        default=None, metadata={"min": 0.05, "max": 0.99, "kind": "float"}
    )
    vllm_max_model_len: int | None = field(default=None, metadata={"min": 1, "max": 10_000_000})
    vllm_command: tuple[str, ...] = field(default=("vllm", "serve"), metadata={"nonempty": True})
    vllm_extra_args: tuple[str, ...] = ()
    vllm_env: Mapping[str, str] = field(default_factory=dict)
    vllm_health_timeout_s: float = field(default=900.0, metadata={"min": 1, "max": 7 * 86400})
    # Prompts per optimizer step (× num_generations completions): the algorithm's batch, the same whatever split the
    # planner picks. Unset: the recipe's own batch values, or the default batch (planning/splits/batch_target.py).
    prompts_per_step: int | None = field(default=None, metadata={"min": 1, "max": 1_000_000})
    backend: DistBackend | None = field(default=None, metadata={"enum": DistBackend})  # None: auto
    offload: Offload | None = field(default=None, metadata={"enum": Offload})  # None: auto
    num_processes: int | None = field(default=None, metadata={"min": 1, "max": 4096})
    main_process_port: int = field(default=29500, metadata={"min": 1, "max": 65535})
    run_dir: str | None = field(default=None, metadata={"kind": "str", "pattern": r".*\S.*", "what": "a directory"})
    grace_period_s: float = field(default=30.0, metadata={"min": 0, "max": 3600})
    # The first Ctrl-C or SIGTERM asks the trainers to save a checkpoint at the end of the step in flight; this is how
    # long grpo-launch waits for it before it stops everything. Unset: under Slurm what the cluster leaves (the
    # partition's GraceTime, else KillWait), elsewhere DEFAULT_STOP_GRACE_S.
    stop_grace_s: float | None = field(default=None, metadata={"min": 1, "max": 7 * 86400, "kind": "float"})
    train_env: Mapping[str, str] = field(default_factory=dict)
    # Names of variables passed from the launcher's environment to every training and vLLM process, on every backend,
    # the way HF_TOKEN travels (ssh/Ray: stdin; SkyPilot: `secrets:`; Slurm and local: the environment): a secret
    # (a judge reward's API key, storage keys) by name, never its value in a file or on a command line.
    pass_env: tuple[str, ...] = field(default=(), metadata={"names": True})
    # The module `accelerate launch --module` runs in every training process, given `--recipe trainer_recipe.yaml`
    # (the planned TRL values, vLLM URL included): grpo_launch.train, or your own GRPO script.
    train_module: str = field(
        default="grpo_launch.train",
        metadata={"kind": "str", "pattern": r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", "what": "a module"},
    )
    # → GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for every process
    network_interface: str | None = field(
        default=None, metadata={"kind": "str", "pattern": r"[A-Za-z0-9_.:@-]{1,15}", "what": "an interface name"}
    )
    # Rows of the training set, for the time and cost to train (counted from a local file when unset).
    dataset_rows: int | None = field(default=None, metadata={"min": 1, "max": 10**12})
    gpu_hour_price: float | None = field(
        default=None, metadata={"min": 0, "kind": "float"}
    )  # price of one GPU-hour, any currency
    # Mean completion length in tokens, for the step time (default: every completion runs to max_completion_length).
    expected_completion_length: int | None = field(default=None, metadata={"min": 1, "max": 10_000_000})
    # The run's mean time between failures, for the checkpoint interval (planning/save_steps.py; unset: the GPUs'
    # published failure rate over the GPUs the run holds).
    mtbf_hours: float | None = field(default=None, metadata={"min": 0.01, "max": 10**6, "kind": "float"})
    # A vLLM server lost mid-run is started again while the trainers wait (execute/server_keeper.py): at most this
    # many times an attempt (0: a lost server ends the attempt).
    server_restarts: int = field(default=3, metadata={"min": 0, "max": 100})
    # Supervision: restarts after failures that are not the user's code, from the newest complete checkpoint.
    max_restarts: int = field(default=0, metadata={"min": 0, "max": 1000})
    restart_backoff_s: float = field(default=10.0, metadata={"min": 0, "max": 3600})  # doubles per restart
    # Ray: a restart after a planned node left the cluster waits this long for it or a node with the same GPUs.
    node_wait_s: float = field(default=DEFAULT_NODE_WAIT_S, metadata={"min": 0, "max": 7 * 86400})
    on_oom: OnOom = field(default=OnOom.STOP, metadata={"enum": OnOom})
    # The progress watchdog: no optimizer step within these bounds stops the run with every rank's stack.
    first_step_timeout_s: float = field(default=3600.0, metadata={"min": 1, "max": 7 * 86400})
    hang_timeout_s: float | None = field(default=None, metadata={"min": 1, "max": 7 * 86400, "kind": "float"})
    # Wall-clock limit of a run in seconds: save a checkpoint and stop before it (a Slurm job's own limit applies too).
    time_limit_s: float | None = field(default=None, metadata={"min": 1, "max": 365 * 86400, "kind": "float"})
    # Closed-loop re-splitting (planning/after_run/): after a warm-up, re-plan with the run's own measurements and move
    # to a split predicted at least 15 % faster per prompt (checkpoint, stop, resume on the new layout).
    adapt: bool = False
    adapt_max_resplits: int = field(default=2, metadata={"min": 0, "max": 20})
    adapt_warmup_steps: int | None = field(default=None, metadata={"min": 2, "max": 10_000})  # None: from step time
    # Watching a run (execute/live.py): the run's Prometheus endpoint on the launcher's host (off unless set),
    # bound to metrics_host (loopback unless the recipe says otherwise); the run report rewritten every N steps.
    metrics_port: int | None = field(default=None, metadata={"min": 1, "max": 65535})
    metrics_host: str = field(
        default="127.0.0.1", metadata={"kind": "str", "pattern": HOST_PATTERN, "what": "a host name or IP address"}
    )
    report_every_steps: int | None = field(default=None, metadata={"min": 1, "max": 10**9})


LAUNCH_FIELDS = {f.name: f for f in dataclasses.fields(LaunchSettings)}


def build_launch(raw: Mapping[str, Any], problems: list[str]) -> LaunchSettings:
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        f = LAUNCH_FIELDS.get(key)
        if f is None:
            problems.append(f"unknown launch setting {short(key)}{did_you_mean(str(key), LAUNCH_FIELDS)}")
            continue
        problem, converted = convert_launch(key, value)
        if problem:
            problems.append(problem)
        else:
            kwargs[key] = converted
    return LaunchSettings(**kwargs)


def convert_launch(key: str, value: Any) -> tuple[str | None, Any]:
    """(the problem, None) or (None, the value as the launch setting ``key`` holds it: a YAML value converted and
    checked against the field's kind, range or choices)."""
    f = LAUNCH_FIELDS[key]
    factory = f.default_factory
    default = f.default if f.default is not dataclasses.MISSING else (factory() if callable(factory) else None)
    meta = f.metadata
    name = f"launch.{key}"
    if value is None or (value == AUTO and default in (None, AUTO)):
        return None, default
    if "enum" in meta:
        choices = [str(c) for c in meta["enum"]]
        if value is False and "off" in choices:
            value = "off"  # YAML 1.1 reads a bare `off` as false
        if value not in choices:
            shown = ([AUTO] if default is None else []) + choices
            return f"{name} must be one of {', '.join(shown)}; got {short(value)}", None
        return None, meta["enum"](value)
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = value.split()
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            return f"{name} must be a list of strings, got {short(value)}", None
        if meta.get("nonempty") and not value:
            return f"{name} must not be empty (e.g. [vllm, serve])", None
        bad = [v for v in value if meta.get("names") and not (isinstance(v, str) and ENV_NAME.match(v))]
        if bad:
            return f"{name}: {short(bad[0])} is not an environment variable name (letters, digits, _)", None
        return None, tuple(str(v) for v in value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            return f"{name} must be true or false, got {short(value)}", None
        return None, value
    if isinstance(default, Mapping):
        if not isinstance(value, dict):
            return f"{name} must be a mapping of NAME: value, got {short(value)}", None
        bad = [k for k in value if not (isinstance(k, str) and ENV_NAME.match(k))]
        if bad:
            return f"{name}: {short(bad[0])} is not an environment variable name (letters, digits, _)", None
        if not all(isinstance(v, (str, int, float, bool)) for v in value.values()):
            return f"{name} values must be strings, got {short(value)}", None
        return None, {str(k): str(v) for k, v in value.items()}
    if meta.get("kind") == "str":
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            return f"{name} must be a string, got {short(value)}", None
        pattern = meta.get("pattern")
        if pattern and not re.fullmatch(pattern, str(value)):
            return f"{name}: {short(value)} is not {meta.get('what', 'valid')}", None
        return None, str(value)
    if isinstance(default, float) or meta.get("kind") == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{name} must be a number, got {short(value)}", None
        if not finite(value):
            return f"{name} must be a finite number, got {short(value, 40)}", None
    elif isinstance(value, bool) or not isinstance(value, int):
        return f"{name} must be an integer, got {short(value)}", None
    lo, hi = meta.get("min"), meta.get("max")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        return f"{name} must be {bounds}, got {short(value, 40)}", None
    return None, value


def check_launch(launch: LaunchSettings) -> list[str]:
    """Problems between launch settings."""
    problems = []
    if launch.mode is LaunchMode.ASYNC and launch.vllm in (VllmMode.COLOCATE, VllmMode.OFF):
        problems.append(
            f"launch.mode=async needs a vLLM server on GPUs of its own (AsyncGRPOTrainer talks to "
            f"vllm_server_base_url only), but launch.vllm is {launch.vllm}: set launch.vllm=server, or launch.mode=sync"
        )
    if launch.vllm is not VllmMode.OFF and launch.vllm_port == launch.main_process_port:
        problems.append(
            f"launch.vllm_port and launch.main_process_port are both {launch.vllm_port}: the vLLM server and the "
            "trainers' rendezvous need different ports"
        )
    return problems + _metrics_port_problems(launch) + _server_auth_problems(launch) + _secret_problems(launch)


PRIVILEGED_PORTS = 1024  # below this, binding needs root (or CAP_NET_BIND_SERVICE): never the run's endpoint


def _metrics_port_problems(launch: LaunchSettings) -> list[str]:
    """launch.metrics_port: not a privileged port, not one of the run's other ports."""
    port = launch.metrics_port
    if port is None:
        return []
    if port < PRIVILEGED_PORTS:
        return [
            f"launch.metrics_port {port} is a privileged port (below {PRIVILEGED_PORTS}: binding it needs root): "
            "pick one from 1024 to 65535, e.g. launch.metrics_port=9464"
        ]
    taken = {"launch.main_process_port": launch.main_process_port}
    if launch.vllm is not VllmMode.OFF:
        taken["launch.vllm_port"] = launch.vllm_port
    return [
        f"launch.metrics_port and {key} are both {port}: the run's metrics endpoint needs a port of its own"
        for key, value in taken.items()
        if value == port
    ]


# Set per process from the plan: the launcher's own value, passed on, would be wrong on every host.
_NOT_PASSED = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _secret_problems(launch: LaunchSettings) -> list[str]:
    """A secret is passed by name (launch.pass_env), never given as a value: train_env and vllm_env are written to
    plan.json, printed by --dry-run and put on the remote command lines (``env K=V``, in every host's ``ps``). One
    rule says what is a secret (:func:`grpo_launch.spec.is_secret_name`); VLLM_API_KEY and --api-key are refused
    with their own reason (:func:`_server_auth_problems`)."""
    problems = []
    for block, env in (("train_env", launch.train_env), ("vllm_env", launch.vllm_env)):
        for key in env:
            if is_secret_name(key) and not (block == "vllm_env" and key == "VLLM_API_KEY"):
                problems.append(
                    f"launch.{block} sets {key}, a secret by its name: its value would be written to plan.json, "
                    f"printed by --dry-run and shown in every host's process list. Remove it; export it and name it "
                    f"in `launch.pass_env` (launch.pass_env=[{key}])"
                )
    args = launch.vllm_extra_args
    for i, arg in enumerate(args):
        flag = arg.partition("=")[0]
        if flag.startswith("-") and flag != "--api-key" and is_secret_name(flag):
            given = "=" in arg or (i + 1 < len(args) and not args[i + 1].startswith("-"))
            if given:
                problems.append(
                    f"launch.vllm_extra_args gives {flag} a value: it would be on the server's command line (every "
                    "host's process list) and in plan.json. Remove it; export the variable vLLM reads instead "
                    "(HF_TOKEN for --hf-token) and name it in `launch.pass_env`"
                )
    for key in launch.pass_env:
        if key in _NOT_PASSED:
            problems.append(
                f"launch.pass_env names {key}, which grpo-launch sets for each process from the plan: remove it"
            )
        elif key in launch.train_env or key in launch.vllm_env:
            problems.append(
                f"launch.pass_env names {key}, which launch.train_env or launch.vllm_env also sets: keep one"
            )
    return problems


def _server_auth_problems(launch: LaunchSettings) -> list[str]:
    """vLLM's own API key, refused: it guards only /v1, /v2, /inference and /cohere (vLLM 0.31,
    vllm/entrypoints/serve/middleware/authenticate.py), not the dev endpoints TRL's weight sync opens, TRL 1.16's
    clients send no key (the run would fail with 401), and the key would be written to plan.json. Every grpo-launch
    server already needs a fresh per-attempt token on every route but /health (grpo_launch.node.vllm_guard)."""
    why = (
        "vLLM's key guards only /v1, /v2, /inference and /cohere, TRL's clients do not send it, and it would be "
        "written to plan.json; grpo-launch already guards every endpoint of its server with a fresh token per "
        "attempt"
    )
    args = launch.vllm_extra_args
    problems = []
    if any(a == "--api-key" or a.startswith("--api-key=") for a in args):
        problems.append(f"launch.vllm_extra_args sets --api-key: {why}. Remove it")
    if "VLLM_API_KEY" in launch.vllm_env:
        problems.append(f"launch.vllm_env sets VLLM_API_KEY: {why}. Remove it")
    if "VLLM_API_KEY" in launch.pass_env:  # the server's environment empties it (render/processes.py)
        problems.append(f"launch.pass_env names VLLM_API_KEY: {why}. Remove it")
    for arg in args:
        flag = vllm_flag(arg)
        refused = next((f for f in SERVER_OWN_FLAGS if flag == f or (len(flag) > 3 and f.startswith(flag))), None)
        if refused is not None:
            named = arg.partition("=")[0] + ("" if flag == refused else f" (vLLM reads it as {refused})")
            problems.append(f"launch.vllm_extra_args sets {named}: {SERVER_OWN_FLAGS[refused]}")
    return problems


# The server's flags the launcher sets itself or that would open what its guard closes: vLLM's parser keeps the last
# of a repeated flag (argparse), so one in launch.vllm_extra_args, which come last, would replace the planned one.
SERVER_OWN_FLAGS = {
    "--host": "the server's bind address is launch.vllm_host (a second --host replaces it, and 0.0.0.0 would open "
    "the server on every interface). Remove it; set launch.vllm_host",
    "--port": "the server's port is launch.vllm_port, which the trainers' URL and the health check use. Remove it; "
    "set launch.vllm_port",
    "--uds": "the server would listen on a Unix socket instead of launch.vllm_host:launch.vllm_port, where the "
    "trainers and the health check reach it. Remove it",
    "--grpc": "it starts vLLM's gRPC server in place of the HTTP one: TRL's clients speak HTTP only, and the guard "
    "(grpo_launch.node.vllm_guard, an ASGI middleware) does not cover gRPC. Remove it",
    "--middleware": "grpo-launch installs its guard (grpo_launch.node.vllm_guard) as the server's middleware; another "
    "one runs around or after it, and could answer or rewrite requests before the guard checks the token. Remove it",
    "--root-path": "it moves the server's routes under a prefix behind a proxy, so the paths the guard and TRL's "
    "clients use no longer match what vLLM serves. Remove it",
}


def vllm_flag(arg: str) -> str:
    """An argument's flag as vLLM's parser reads it: before any ``=``, underscores as dashes up to the first dot
    (vllm/utils/argparse_utils.py, ``FlexibleArgumentParser.parse_args``); "" for a value."""
    if not arg.startswith("--"):
        return ""
    key = arg.partition("=")[0]
    head, dot, rest = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest

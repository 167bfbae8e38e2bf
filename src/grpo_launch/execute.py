"""Execute a plan on this machine: check inputs, write the run directory, start the vLLM server (server mode) and
`accelerate launch`, supervise both, tear everything down. Returns the exit code (0, or 128+N after signal N);
failures raise :class:`LaunchError` naming the root cause and its log."""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from grpo_launch.errors import ConfigError, LaunchError
from grpo_launch.plan import Plan
from grpo_launch.recipe import LOCAL_DATA_SUFFIXES
from grpo_launch.render import ProcessSpec, render_files, render_train_commands, render_vllm_command
from grpo_launch.rewards import check_reward_names
from grpo_launch.rundir import write_run_files
from grpo_launch.supervisor import FORWARDED_SIGNALS, Interrupted, Supervisor, signal_guard

VLLM_GROUP_PORT_DEFAULT = 51216


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~", ".")) or Path(path).exists()


def preflight(plan: Plan) -> None:
    """Everything that can be checked before a process starts, reported together."""
    values = plan.trainer_values
    problems: list[str] = []
    model = str(values.get("model_name_or_path") or "")
    if not model:
        problems.append("model_name_or_path is not set")
    elif _looks_local(model) and not (Path(model).expanduser() / "config.json").is_file():
        problems.append(
            f"model path {model!r} has no config.json (is the path right? relative paths start from {Path.cwd()})"
        )
    data = str(values.get("dataset_name") or "")
    if not data:
        problems.append("dataset_name is not set")
    elif Path(data).suffix in LOCAL_DATA_SUFFIXES and not Path(data).expanduser().is_file():
        problems.append(f"dataset file {data!r} not found")
    elif _looks_local(data) and not Path(data).expanduser().exists():
        problems.append(f"dataset path {data!r} not found")
    rewards = values.get("reward_funcs") or []
    problems += check_reward_names([rewards] if isinstance(rewards, str) else list(rewards))
    if problems:
        raise ConfigError("cannot start the run:", problems=problems)


def _port_free(port: int, host: str = "0.0.0.0") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(plan: Plan) -> None:
    busy = []
    if plan.vllm.mode == "server":
        if not _port_free(plan.vllm.port):
            busy.append(f"vLLM server port {plan.vllm.port} is in use: set launch.vllm_port to a free port")
        group = int(plan.trainer_values.get("vllm_group_port") or VLLM_GROUP_PORT_DEFAULT)
        if not _port_free(group):
            busy.append(
                f"weight-sync port {group} (vllm_group_port) is in use on the trainer head: set vllm_group_port"
            )
    if plan.train.num_processes > 1 and not _port_free(plan.train.main_process_port):
        busy.append(f"trainer rendezvous port {plan.train.main_process_port} is in use: set launch.main_process_port")
    if busy:
        raise LaunchError(
            "ports needed by the run are taken:",
            problems=busy,
            hint="Another run may still be going: check with `ss -ltnp`.",
        )


def run_plan(
    plan: Plan,
    run_dir: str,
    *,
    environ: Mapping[str, str],
    dry_run: bool = False,
    emit: Callable[[str], None] | None = None,
) -> int:
    """Run ``plan`` here. ``emit`` prints a line (the CLI passes print)."""
    out = emit or (lambda line: print(line, flush=True))
    if plan.train.num_machines > 1:
        raise LaunchError(
            f"this plan spans {plan.train.num_machines} machines; `grpo-launch RECIPE` starts processes on this "
            "machine only",
            hint="Plan for one machine (omit --gpus/--hostfile), or inspect the per-host commands with "
            "`grpo-launch plan`.",
        )
    preflight(plan)
    files = render_files(plan, run_dir, python=sys.executable)
    write_run_files(run_dir, files)
    server = render_vllm_command(plan)
    trainers = render_train_commands(plan, run_dir, python=sys.executable)
    if dry_run:
        out(f"# run directory: {run_dir}")
        if server:
            out(server.shell())
        for t in trainers:
            out(t.shell())
        return 0
    check_ports(plan)

    health = f"http://{plan.vllm.address}:{plan.vllm.port}/health" if server else None
    return run_processes(
        server,
        trainers,
        health_url=health,
        health_timeout_s=plan.recipe.launch.vllm_health_timeout_s,
        log_dir=Path(run_dir) / "logs",
        grace_s=plan.recipe.launch.grace_period_s,
        environ=environ,
        emit=out,
    )


def run_processes(
    server: ProcessSpec | None,
    trainers: Sequence[ProcessSpec],
    *,
    health_url: str | None,
    health_timeout_s: float,
    log_dir: Path,
    grace_s: float,
    environ: Mapping[str, str],
    emit: Callable[[str], None],
) -> int:
    """Start the server (if any) and the trainers, supervise until the trainers finish, tear everything down.

    0 when every trainer exits 0; 128+N after signal N; a LaunchError naming the first failure otherwise.
    """
    sup = Supervisor(log_dir, emit=emit, grace_s=grace_s, environ=environ)
    code = 1
    saved = _current_handlers()
    try:
        with signal_guard():
            try:
                srv = sup.start(server) if server else None
                # The trainers load their model while the server starts; TRL's client waits for /health before
                # the first generation, and we watch the same deadline here to fail early with the server's log.
                train_children = [sup.start(t) for t in trainers]
                if srv is not None and health_url:
                    took = sup.wait_healthy(srv, health_url, health_timeout_s, train_children)
                    emit(f"[grpo-launch] vLLM server healthy after {took:.1f} s")
                code = sup.wait_all(train_children)
                emit(f"[grpo-launch] training finished; logs in {log_dir}")
            except Interrupted as sig:
                emit(f"[grpo-launch] {sig}: stopping every process (grace {sup.grace_s:.0f} s)")
                _ignore_signals()
                sup.stop_all(sig.signum)
                return 128 + sig.signum
    finally:
        _ignore_signals()
        sup.stop_all()
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    return code


def _current_handlers() -> dict:
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in FORWARDED_SIGNALS}


def _ignore_signals() -> None:
    # Teardown must finish: a second Ctrl-C must not leave children running.
    for sig in FORWARDED_SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(sig, signal.SIG_IGN)

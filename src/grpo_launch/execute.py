"""Execute a plan on this machine: check inputs, write the run directory, start the vLLM server (server mode) and
`accelerate launch`, supervise both, tear everything down. Returns the exit code (0, or 128+N after signal N);
failures raise :class:`LaunchError` naming the root cause and its log."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from grpo_launch import control
from grpo_launch.errors import ConfigError, LaunchError
from grpo_launch.plan import Plan
from grpo_launch.recipe import LOCAL_DATA_SUFFIXES
from grpo_launch.render import ProcessSpec, render_files, render_train_commands, render_vllm_command
from grpo_launch.rewards import check_reward_names
from grpo_launch.rundir import write_run_files
from grpo_launch.ssh import SshOptions
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


def check_addresses(plan: Plan) -> None:
    """Every host the processes must reach (trainer head, vLLM server) resolves to an address."""
    targets = {h.address: f"training host {h.name}" for h in plan.train.hosts}
    if plan.vllm.mode == "server" and plan.vllm.address:
        targets.setdefault(plan.vllm.address, f"vLLM host {plan.vllm.host}")
    problems = []
    for address, what in targets.items():
        try:
            socket.getaddrinfo(address, None)
        except (socket.gaierror, UnicodeError) as exc:
            problems.append(f"{what}: address {address!r} does not resolve ({exc})")
    if problems:
        raise LaunchError(
            "hosts of the plan cannot be reached:",
            problems=problems,
            hint="Fix name resolution (DNS or /etc/hosts) on this node, or give the hosts by IP address.",
        )


def place(
    plan: Plan,
    specs: Sequence[ProcessSpec],
    *,
    python: str,
    ssh: SshOptions | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[ProcessSpec]:
    """Put each process on its host: inside a Slurm job one ``srun`` step per process on its node; from a hostfile
    one ``ssh`` per process; otherwise here."""
    source = plan.topology.source
    hosts = {h.name: h for h in plan.topology.hosts}
    if source == "slurm":
        from grpo_launch.slurm import srun_spec

        placed = []
        for spec in specs:
            host = hosts[spec.host or plan.topology.hosts[0].name]
            placed.append(
                srun_spec(
                    replace(spec, host=host.name),
                    python=python,
                    gpus_on_node=len(host.gpus),
                    cpus_on_node=host.cpus,
                    gpu_positions=_positions(spec),
                )
            )
        return placed
    if source == "hostfile":
        from grpo_launch.ssh import passed_env_names, ssh_spec

        names = passed_env_names(environ or {})
        specs = [_absolute_command(s) for s in specs]
        return [
            ssh_spec(
                replace(spec, host=spec.host or plan.topology.hosts[0].name),
                ssh or SshOptions(),
                python=python,
                workdir=os.getcwd(),
                stdin_env=names,
                gpu_positions=_positions(spec),
            )
            for spec in specs
        ]
    if plan.train.num_machines > 1 or any(s.host for s in specs):
        raise LaunchError(
            f"this plan spans {len(plan.topology.hosts)} machines (from --gpus); grpo-launch starts processes on "
            "other machines from a hostfile (--hostfile) or inside a Slurm job",
            hint="Use --hostfile FILE, submit with `grpo-launch sbatch RECIPE --nodes N`, or plan for this machine "
            "only (omit --gpus).",
        )
    return list(specs)


def _absolute_command(spec: ProcessSpec) -> ProcessSpec:
    """A bare command name (``vllm``) as the absolute path found here: a remote non-interactive shell has a minimal
    PATH, and the hosts share this environment's paths."""
    import shutil

    first = spec.argv[0]
    found = shutil.which(first) if "/" not in first else None
    return replace(spec, argv=(found, *spec.argv[1:])) if found else spec


def _positions(spec: ProcessSpec) -> list[str]:
    return [p for p in spec.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if p]


def check_hosts(plan: Plan, ssh: SshOptions, *, python: str, environ: Mapping[str, str]) -> None:
    """Before anything starts: every host answers ssh in batch mode and has this grpo-launch, Python, working
    directory and the recipe's local paths. One error naming every host and what is wrong."""
    import concurrent.futures
    import json
    import subprocess

    from grpo_launch import __version__
    from grpo_launch.ssh import check_command

    values = plan.trainer_values
    paths = [
        str(Path(str(values[k])).expanduser().absolute())
        for k in ("model_name_or_path", "dataset_name")
        if values.get(k) and _looks_local(str(values[k]))
    ]
    line = check_command(python, os.getcwd(), paths)
    hosts = [h.name for h in plan.topology.hosts]

    def probe(host: str) -> str | None:
        argv = [*ssh.argv(host), "--", line]
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=ssh.connect_timeout_s + 30,
                stdin=subprocess.DEVNULL,
                env=dict(environ),
            )
        except subprocess.TimeoutExpired:
            return f"{host}: no answer within {ssh.connect_timeout_s + 30} s"
        except FileNotFoundError:
            return "ssh is not installed on this machine"
        if done.returncode == 255:
            return f"{host}: unreachable over ssh ({(done.stderr.strip().splitlines() or ['no message'])[-1]})"
        if done.returncode in (3, 4):
            return f"{host}: {done.stdout.strip()}"
        try:
            info = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"{host}: the environment check failed: {(done.stderr or done.stdout).strip()[-300:]}"
        if info["version"] is None:
            return f"{host}: {python} cannot import grpo_launch (install grpo-launch in that environment)"
        if info["version"] != __version__:
            return f"{host}: grpo-launch {info['version']} there, {__version__} here"
        if info["missing"]:
            return f"{host}: missing {', '.join(info['missing'])}"
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        problems = [p for p in pool.map(probe, hosts) if p]
    if problems:
        raise LaunchError(
            "the hosts are not ready; nothing was started:",
            problems=problems,
            hint="Every host needs passwordless ssh (batch mode) and the same paths as this one: the Python "
            f"environment ({python}), the working directory and the model/data (a shared file system). ssh options: "
            "--ssh-port, --ssh-identity, --ssh-config, --ssh-option.",
        )


def run_plan(
    plan: Plan,
    run_dir: str,
    *,
    environ: Mapping[str, str],
    dry_run: bool = False,
    emit: Callable[[str], None] | None = None,
    ssh: SshOptions | None = None,
) -> int:
    """Run ``plan`` here, across the nodes of the current Slurm job, or across a hostfile's hosts over ``ssh``.
    ``emit`` prints a line.

    SIGUSR2 asks the trainers to save a checkpoint and stop; inside a Slurm job the job is then requeued and the
    requeued run resumes from that checkpoint.
    """
    out = emit or (lambda line: print(line, flush=True))
    python = sys.executable
    server = render_vllm_command(plan)
    trainers = render_train_commands(plan, run_dir, python=python)
    ssh = ssh or SshOptions()
    placed = place(plan, [*([server] if server else []), *trainers], python=python, ssh=ssh, environ=environ)
    server, trainers = (placed[0], tuple(placed[1:])) if server else (None, tuple(placed))
    preflight(plan)
    write_run_files(run_dir, render_files(plan, run_dir, python=python))
    if dry_run:
        out(f"# run directory: {run_dir}")
        for spec in placed:
            if spec.host:
                out(f"# on {spec.host}: {spec.name}")
            out(spec.shell())
        return 0
    if plan.topology.source == "slurm":
        check_addresses(plan)
    elif plan.topology.source == "hostfile":
        check_addresses(plan)
        check_hosts(plan, ssh, python=python, environ=environ)
    else:
        check_ports(plan)
    control.reset(run_dir)
    if plan.train.backend in ("zero2", "zero3"):
        for lock in stale_build_locks(environ):
            out(
                f"[grpo-launch] warning: {lock} exists. Another run is building that torch extension, or a killed "
                "build left the lock, and DeepSpeed then waits for it forever: if no other run is building, "
                "delete it."
            )

    health = f"http://{plan.vllm.address}:{plan.vllm.port}/health" if server else None
    code = run_processes(
        server,
        trainers,
        health_url=health,
        health_timeout_s=plan.recipe.launch.vllm_health_timeout_s,
        log_dir=Path(run_dir) / "logs",
        grace_s=plan.recipe.launch.grace_period_s,
        environ=environ,
        emit=out,
        on_checkpoint_request=lambda: control.request_stop(run_dir),
    )
    step = control.stopped_at(run_dir)
    if code == 0 and step is not None:
        out(f"[grpo-launch] stopped after step {step} with a checkpoint; the next run resumes from it")
        job = environ.get("SLURM_JOB_ID") if plan.topology.source == "slurm" else None
        if job:
            requeue_slurm_job(job)
            out(f"[grpo-launch] requeued Slurm job {job}")
    return code


def stale_build_locks(environ: Mapping[str, str]) -> list[Path]:
    """Lock files of torch's JIT extension builds (DeepSpeed compiles its ops on first use)."""
    root = Path(
        environ.get("TORCH_EXTENSIONS_DIR") or Path(environ.get("HOME", "~")).expanduser() / ".cache/torch_extensions"
    )
    return sorted({*root.glob("*/lock"), *root.glob("*/*/lock")})


def requeue_slurm_job(job_id: str) -> None:
    import subprocess

    try:
        done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"cannot requeue Slurm job {job_id}: {exc}") from None
    if done.returncode != 0:
        raise LaunchError(
            f"cannot requeue Slurm job {job_id}: {done.stderr.strip() or done.stdout.strip()}",
            hint="The checkpoint is saved: resubmit the same script (sbatch RUN_DIR/job.sbatch) to resume. "
            "Jobs must be submitted with --requeue (grpo-launch sbatch does) and JobRequeue allowed.",
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
    on_checkpoint_request: Callable[[], None] | None = None,
) -> int:
    """Start the server (if any) and the trainers, supervise until the trainers finish, tear everything down.

    0 when every trainer exits 0; 128+N after signal N; a LaunchError naming the first failure otherwise.
    SIGUSR2 calls ``on_checkpoint_request`` (and is otherwise like SIGTERM).
    """
    sup = Supervisor(log_dir, emit=emit, grace_s=grace_s, environ=environ)
    code = 1
    saved = _current_handlers()

    def checkpoint(signum: int) -> None:
        if on_checkpoint_request is None:
            raise Interrupted(signum)
        on_checkpoint_request()
        emit("[grpo-launch] SIGUSR2: the trainers save a checkpoint at the end of this step and stop")

    try:
        with signal_guard(soft={signal.SIGUSR2: checkpoint}):
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


def submit_batch_script(path: str, *, cwd: str) -> str:
    """``sbatch --parsable PATH`` → the job id."""
    import subprocess

    from grpo_launch.slurm import parse_job_id

    try:
        done = subprocess.run(["sbatch", "--parsable", path], capture_output=True, text=True, cwd=cwd, timeout=120)
    except FileNotFoundError:
        raise LaunchError(
            "sbatch not found: this machine is not a Slurm submit host",
            hint=f"Run on a login node, or submit the written script there: sbatch {path}",
        ) from None
    except subprocess.TimeoutExpired:
        raise LaunchError("sbatch did not answer within 120 s", hint="Is slurmctld reachable? Try `sinfo`.") from None
    if done.returncode != 0:
        raise LaunchError(
            f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}",
            hint=f"The script is {path}; fix the option sbatch names (partition, account, time, GPUs per node).",
        )
    return parse_job_id(done.stdout)

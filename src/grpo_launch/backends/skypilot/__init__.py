"""The SkyPilot backend (``grpo-launch sky``): plan for the cluster ``--accelerators`` × ``--nodes`` asks for, render
the task YAML (:mod:`.task`) into the run directory and, with ``--launch``, hand it to ``sky launch``. SkyPilot is
never imported: ``--launch`` runs its CLI."""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from grpo_launch.backends.base import BackendOptions, option
from grpo_launch.backends.skypilot.accelerators import parse_accelerators
from grpo_launch.backends.skypilot.task import (
    RAY_TOKEN_SECRET,
    RUN_MOUNT,
    SECRET_NAMES,
    RunStorage,
    SkyTaskRequest,
    declared_secrets,
    render_task,
)
from grpo_launch.backends.submission import BaseSubmitter, Planned, Submission, SubmitJob
from grpo_launch.enums import VllmMode
from grpo_launch.errors import ConfigError, LaunchError, install_hint
from grpo_launch.machines.gpus import GIB
from grpo_launch.machines.topology import MAX_NODES, Gpu, Host, Topology
from grpo_launch.rundir.files import write_run_files
from grpo_launch.rundir.invocation import write_invocation
from grpo_launch.rundir.shown_text import command_line
from grpo_launch.spec import frozen

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan
    from grpo_launch.recipe import Recipe
    from grpo_launch.spec import RunContext

INSTALL_HINT = install_hint("sky") + "; and configure a cloud (sky check)"


@frozen
class SkyOptions(BackendOptions):
    """What ``grpo-launch sky`` asks SkyPilot for."""

    accelerators: str | None = option(
        "--accelerators",
        "GPUs per node as SkyPilot names them, NAME:COUNT (H100:8, A100-80GB:8, L4:1); leave out for CPU nodes "
        "(a use_cpu recipe)",
        metavar="NAME:COUNT",
    )
    nodes: int = option(
        "--nodes", "number of nodes (SkyPilot's num_nodes; default 1)", default=1, type=int, metavar="N"
    )
    cluster: str | None = option("--cluster", "SkyPilot cluster name (default: grpo-RECIPE)", metavar="NAME")
    # SkyPilot's default disk: DEFAULT_DISK_SIZE_GB = 256 in sky/resources.py (0.14.1).
    disk_size: int | None = option(
        "--disk-size", "disk per node in GB (default: SkyPilot's, 256)", type=int, metavar="GB"
    )
    launch: bool = option(
        "--launch", "write the task and run sky launch -c CLUSTER on it", default=False, action="store_true"
    )
    down: bool = option(
        "--down",
        "with --launch: tear the cluster down when the job ends (its disks go too: keep checkpoints elsewhere)",
        default=False,
        action="store_true",
    )
    managed: bool = option(
        "--managed",
        "a managed job (sky jobs launch): SkyPilot relaunches it after a preemption and it resumes from the run "
        "directory, which must be on --bucket or --volume",
        default=False,
        action="store_true",
    )
    bucket: str | None = option(
        "--bucket",
        "keep the run directory on this bucket (s3://BUCKET/PATH, gs://…, r2://…), mounted at /grpo-runs on every "
        "node: the run dir there is /grpo-runs/NAME (NAME: --run-dir's last part)",
        metavar="URI",
    )
    volume: str | None = option(
        "--volume",
        "keep the run directory on this SkyPilot volume (sky volumes apply), mounted as --bucket is",
        metavar="NAME",
    )
    spot: bool = option(
        "--spot", "spot instances (use_spot; with --managed they are recovered)", default=False, action="store_true"
    )
    install: str | None = option(
        "--install",
        "what every node installs grpo-launch from (it is not on the package index): a wheel or a source directory "
        "inside the working directory, or a URL pip takes (git+https://…@REV, https://…/grpo_launch-….whl); "
        "default: the working directory, when it is grpo-launch's checkout",
        metavar="SOURCE",
    )


def default_cluster_name(recipe_path: str) -> str:
    """``grpo-RECIPE`` in SkyPilot's cluster-name alphabet (lower-case letters, digits, '-')."""
    stem = os.path.splitext(os.path.basename(recipe_path))[0].lower()
    stem = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")
    return f"grpo-{stem or 'run'}"[:60].rstrip("-")


class SkyPilotSubmitter(BaseSubmitter[SkyOptions]):
    """``grpo-launch sky``: plan for --nodes × --accelerators, write RUN_DIR/sky-task.yaml, ``sky launch`` it."""

    Options: ClassVar[type[BackendOptions]] = SkyOptions
    description: ClassVar[str] = (
        "Plan for N nodes × the GPUs --accelerators names and write a SkyPilot task (RUN_DIR/sky-task.yaml); "
        "--launch runs `sky launch` on it, --dry-run prints it. SkyPilot copies this directory (the workdir) to every "
        "node; setup installs grpo-launch with its extras; the run section starts a Ray cluster of its own on port "
        "6379 (SkyPilot's is 6380): node 0 is the head and, once every node has joined, runs `grpo-launch run --ray`, "
        "whose exit code is the task's. Secrets are declared by name only and passed from this environment with sky "
        "launch --secret: HF_TOKEN, HUGGING_FACE_HUB_TOKEN and WANDB_API_KEY where set here (WANDB_API_KEY always "
        "when report_to names wandb), the recipe's launch.pass_env names, and RAY_AUTH_TOKEN, the task's Ray "
        "cluster's token (--launch draws one when it is not exported). Needs the sky extra (pip install '.[sky]' in "
        "grpo-launch's checkout) and a cloud SkyPilot can use (sky check). --managed writes a managed job (sky jobs "
        "launch): SkyPilot relaunches it after a preemption and it resumes from its run directory, which --bucket or "
        "--volume keeps off the nodes."
    )
    run_dir_help: ClassVar[str] = "run directory on the nodes; a relative one is in the copy of this directory"
    passes_args: ClassVar[bool] = False  # SkyPilot's own options are the task's, written by this backend

    def __init__(self) -> None:
        # what request() decided, for submit()
        self.cluster, self.down, self.managed = "", False, False
        self.secrets: tuple[str, ...] = ()

    @classmethod
    def adjusted(cls, options: SkyOptions, recipe: Recipe, ctx: RunContext, *, dry_run: bool) -> SkyOptions:
        """CPU nodes for a use_cpu recipe; else the GPUs must be named."""
        if options.launch and dry_run:
            raise ConfigError("--launch and --dry-run together: a dry run launches nothing", hint="Choose one.")
        if options.accelerators is None and recipe.values.get("use_cpu") is not True:
            raise ConfigError(
                "which GPUs? --accelerators is missing, and the recipe does not ask for CPU (use_cpu: true)",
                hint="e.g. grpo-launch sky RECIPE --accelerators H100:8 --nodes 2 (`sky show-gpus` lists the names)",
            )
        if options.accelerators is not None and recipe.values.get("use_cpu") is True:
            ctx.emit("notice: the recipe sets use_cpu: true, so the task asks for CPU nodes (--accelerators ignored)")
            return dataclasses.replace(options, accelerators=None)
        return options

    @classmethod
    def requested_topology(cls, options: SkyOptions, local: Topology) -> Topology:
        """--nodes nodes of --accelerators GPUs each (the GPU from our table, to check memory); CPU nodes without
        --accelerators."""
        if not 1 <= options.nodes <= MAX_NODES:
            raise ConfigError(
                f"--nodes must be between 1 and {MAX_NODES}, got {options.nodes}",
                hint="e.g. --nodes 2 --accelerators H100:8",
            )
        gpus: tuple[Gpu, ...] = ()
        if options.accelerators is not None:
            _, spec, count = parse_accelerators(options.accelerators)
            memory = int(spec.memory_gib * GIB)
            gpus = tuple(Gpu(visible_id=str(i), name=spec.name, memory_bytes=memory) for i in range(count))
        hosts = tuple(Host(name=f"node{i + 1}", gpus=gpus) for i in range(options.nodes))
        return Topology(hosts, "skypilot")

    def request(self, job: SubmitJob, plan: Plan, options: SkyOptions, ctx: RunContext) -> Submission:
        workdir = os.path.abspath(ctx.workdir)
        recipe = _inside(job.recipe, workdir, "the recipe")
        run_dir = os.path.relpath(plan.run_dir, workdir) if _within(plan.run_dir, workdir) else plan.run_dir
        storage = _run_storage(options, plan)
        if storage is not None:  # the nodes' run directory: on the bucket or volume, named as the local one
            run_dir = f"{RUN_MOUNT}/{os.path.basename(os.path.normpath(plan.run_dir))}"
        accelerators = None
        if options.accelerators is not None:
            name, _, count = parse_accelerators(options.accelerators)
            accelerators = f"{name}:{count}"
        extras = ("train", *(("vllm",) if plan.vllm.mode != VllmMode.OFF else ()), "ray")
        request = SkyTaskRequest(
            name=options.cluster or default_cluster_name(job.recipe),
            recipe=recipe,
            workdir=workdir,
            run_dir=run_dir,
            num_nodes=options.nodes,
            accelerators=accelerators,
            overrides=job.overrides,
            install=install_args(options.install, workdir, extras),
            secrets=secrets_needed(plan, ctx.environ),
            disk_size=options.disk_size,
            storage=storage,
            managed=options.managed,
            use_spot=options.spot,
        )
        self.cluster, self.down, self.secrets = request.name, options.down, request.secrets
        self.managed = options.managed
        where = accelerators or "CPU"
        return Submission(
            render_task(request),
            str(plan.paths.sky_task),
            summary=f"{options.nodes} node(s) × {where}, plan {plan.topology.describe()}",
        )

    def launch_argv(self, submission: Submission, ctx: RunContext) -> list[str]:
        """``sky launch -c CLUSTER TASK --yes`` (and ``--secret NAME`` for each secret: SkyPilot reads its value
        from this environment); refused, before anything is written, without the sky command or a secret."""

        sky = shutil.which("sky", path=ctx.environ.get("PATH"))
        if sky is None:
            raise LaunchError(
                "the sky command is not installed here: --launch runs `sky launch`",
                hint=f"{INSTALL_HINT}; or leave --launch out and launch the written task: "
                f"{command_line(['sky', 'launch', submission.path])}",
            )
        missing = [s for s in self.secrets if not ctx.environ.get(s)]
        if missing:
            raise LaunchError(
                f"the task needs {', '.join(missing)}, which is not set here",
                hint="export it before --launch (sky launch --secret passes it; it is never written into the task)",
            )
        if self.managed:  # SkyPilot tears a managed job's clusters down itself
            argv = [sky, "jobs", "launch", "-n", self.cluster, submission.path, "--yes"]
        else:
            argv = [sky, "launch", "-c", self.cluster, submission.path, "--yes"]
        argv += [a for s in declared_secrets(self.secrets) for a in ("--secret", s)]
        return [*argv, "--down"] if self.down else argv

    def finish(self, planned: Planned, ctx: RunContext) -> None:
        """Write the task; with --launch, launch it (and record the command: ``grpo-launch resume`` launches it
        again), else say how to. SkyPilot copies the working directory: the job plans and writes its run's files
        there."""
        submission, plan, launching = planned.submission, planned.plan, planned.options.launch
        if launching:
            self.launch_argv(submission, ctx)  # refuse before writing: no sky command, or a secret not set
        for line in planned.summary:
            ctx.emit(line)
        write_run_files(plan.run_dir, {os.path.basename(submission.path): submission.text})
        ctx.emit(f"wrote {submission.path}: {submission.summary}")
        if not launching:
            verb = ["sky", "jobs", "launch", "-n"] if self.managed else ["sky", "launch", "-c"]
            secrets = (a for s in self.secrets for a in ("--secret", s))
            launch = command_line([*verb, self.cluster, submission.path, *secrets])
            ctx.emit(f"  launch:  {launch}   (or grpo-launch sky … --launch)")
            return
        write_invocation(planned.invocation)
        cluster = self.submit(submission, ctx)
        for line in self.submitted(cluster, planned):
            ctx.emit(line)

    def submitted(self, job_id: str, planned: Planned) -> list[str]:
        if self.managed:
            follow, stop = (command_line(["sky", "jobs", verb, "-n", job_id]) for verb in ("logs", "cancel"))
            return [
                f"launched the SkyPilot managed job {job_id}: after a preemption SkyPilot relaunches it and it "
                "resumes from its run directory",
                f"  follow:  {follow}   status: sky jobs queue   stop: {stop}",
            ]
        follow, status, down = (command_line(["sky", verb, job_id]) for verb in ("logs", "status", "down"))
        return [
            f"launched on SkyPilot cluster {job_id}",
            f"  follow:  {follow}   status: {status}   stop paying: {down}",
        ]

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        """Run ``sky launch`` (its output goes to this terminal); returns the cluster name."""
        done = subprocess.run(self.launch_argv(submission, ctx), cwd=ctx.workdir, env=launch_env(ctx.environ))
        if done.returncode != 0:
            raise LaunchError(
                f"sky launch exited with {done.returncode}",
                hint=f"See its output above; the task is {submission.path} "
                f"({command_line(['sky', 'logs', self.cluster])}).",
            )
        return self.cluster


def _run_storage(options: SkyOptions, plan: Plan) -> RunStorage | None:
    """The run directory's bucket or volume; refused where the checkpoints would not land on it (--managed without
    one, both given, --down with --managed, an output_dir of the recipe's own elsewhere)."""
    if options.bucket and options.volume:
        raise ConfigError("--bucket and --volume both given: the run directory lives on one of them")
    if options.managed and options.down:
        raise ConfigError("--down is for sky launch: a managed job's clusters are torn down by SkyPilot itself")
    if not (options.bucket or options.volume):
        if options.managed:
            raise ConfigError(
                "--managed needs the run directory on a bucket or a volume: SkyPilot recovers a managed job on new "
                "nodes, whose disks hold nothing of the old ones",
                hint="add --bucket s3://BUCKET/PATH (or gs://, r2://), or --volume NAME (sky volumes apply)",
            )
        return None
    out = plan.trainer_values.get("output_dir")
    if isinstance(out, str) and not out.startswith(RUN_MOUNT + "/"):
        raise ConfigError(
            f"the recipe's output_dir {out} is not on the bucket or volume ({RUN_MOUNT}): the checkpoints a relaunched "
            "job resumes from would be lost with the nodes",
            hint=f"leave output_dir unset (it is then RUN_DIR/output, on {RUN_MOUNT}), or set it under {RUN_MOUNT}",
        )
    return RunStorage(bucket=options.bucket, volume=options.volume)


def launch_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``sky launch``'s environment: this one, with a Ray token drawn for the cluster when none is exported
    (``--secret RAY_AUTH_TOKEN`` reads it from there: never a command line or a file)."""
    env = dict(environ)
    if not env.get(RAY_TOKEN_SECRET, "").strip():
        env[RAY_TOKEN_SECRET] = secrets.token_hex(32)  # as Ray draws its own (authentication_token_generator)
    return env


def secrets_needed(plan: Plan, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The secrets the task declares (by name only): those set here, WANDB_API_KEY when the recipe reports to
    Weights & Biases, and every name in the recipe's launch.pass_env (the head's `grpo-launch run` passes them on to
    every process, as the Ray backend passes HF_TOKEN)."""
    report_to = plan.recipe.values.get("report_to") or ()
    report_to = [report_to] if isinstance(report_to, str) else list(report_to)
    wanted = {n for n in SECRET_NAMES if environ.get(n)} | set(plan.recipe.launch.pass_env)
    if "wandb" in report_to or "all" in report_to:
        wanted.add("WANDB_API_KEY")
    named = tuple(n for n in plan.recipe.launch.pass_env if n not in SECRET_NAMES)
    return (*(n for n in SECRET_NAMES if n in wanted), *named)


def _within(path: str, root: str) -> bool:
    path, root = os.path.abspath(path), os.path.abspath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _inside(path: str, workdir: str, what: str) -> str:
    """``path`` relative to the workdir SkyPilot copies to every node; refused when outside it."""
    if not _within(path, workdir):
        raise ConfigError(
            f"{what} {path} is outside the working directory {workdir}, which is what SkyPilot copies to the nodes",
            hint="Run grpo-launch sky from a directory that holds the recipe (and its local files).",
        )
    return os.path.relpath(path, workdir)


def install_args(source: str | None, workdir: str, extras: tuple[str, ...]) -> tuple[str, ...]:
    """``pip install``'s arguments on every node (in the workdir's copy): grpo-launch with ``extras`` from
    ``source`` (--install), or from the workdir when it is grpo-launch's checkout. grpo-launch is not on the package
    index, so a node cannot install it by name: without either, the task is refused before it is written."""
    with_extras = f"[{','.join(extras)}]"
    if source is None:
        if _is_grpo_launch_source(workdir):
            return ("-e", "." + with_extras)
        raise ConfigError(
            f"the nodes cannot install grpo-launch: it is not on the package index, and the working directory "
            f"{workdir} (what SkyPilot copies to them) is not its checkout",
            hint="Build a wheel into the working directory (pip wheel --no-deps PATH/TO/grpo-launch -w wheels) and "
            "pass --install wheels/grpo_launch-VERSION-py3-none-any.whl, or pass a URL (--install "
            "git+https://HOST/grpo-launch@REV), or run grpo-launch sky from its checkout.",
        )
    if "://" in source:
        return (f"grpo-launch{with_extras} @ {source}",)
    path = os.path.join(workdir, source)
    if not (os.path.isfile(path) and path.endswith(".whl")) and not _is_grpo_launch_source(path):
        raise ConfigError(
            f"--install {source}: neither a wheel (.whl) nor a grpo-launch source directory (its pyproject.toml)",
            hint="A path is read from the working directory; a URL needs its scheme (git+https://…, https://…).",
        )
    return ("./" + _inside(path, workdir, "--install") + with_extras,)


def _is_grpo_launch_source(workdir: str) -> bool:
    """The workdir is a checkout of grpo-launch (its pyproject names the project): the nodes install that."""
    try:
        with open(os.path.join(workdir, "pyproject.toml"), encoding="utf-8") as f:
            return re.search(r'^name\s*=\s*"grpo-launch"', f.read(), re.MULTILINE) is not None
    except OSError:
        return False

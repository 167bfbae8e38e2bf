"""``grpo-launch ray-submit``: the whole run as one Ray job, the way ``grpo-launch sbatch`` hands it to Slurm. The
plan is made first from the live cluster (the Ray backend's probe); the job runs RUN_DIR/ray-job.sh on the head
node, which runs ``grpo-launch run`` there; that attaches through the RAY_ADDRESS a Ray job's driver has.

One shell level, checked against Ray 2.60's code. The job server runs a job's entrypoint string with
``subprocess.Popen(entrypoint, shell=True)`` (dashboard/modules/job/job_supervisor.py, ``_exec_entrypoint``): one
``/bin/sh -c``. ``ray job submit -- ARGS`` built that string from its arguments with ``subprocess.list2cmdline`` on
every system until ray-project/ray#63797 (2026; Ray 2.60 uses ``shlex.join`` except on Windows): Windows quoting,
in which ``$``, backticks and ``\\`` reach ``sh`` unquoted, so the old ``-- bash -c LINE`` ran a value's ``$(…)``
on the head with the Ray releases before it, and its quoting depended on the CLI's version. Here the job is
submitted through Ray's SDK (``JobSubmissionClient.submit_job``) with an entrypoint that is only ``bash PATH``
(PATH quoted once, by :func:`shlex.quote`, for the server's ``sh -c``); the command line is in that file, read once
by ``bash``. Recipe paths, overrides and the run directory arrive in ``grpo-launch run``'s argv byte for byte.

A cluster started with token authentication (``RAY_AUTH_MODE=token``, Ray ≥ 2.52) needs the token on every request
to the job server: it is read from this environment (``RAY_AUTH_TOKEN``) and sent as Ray's SDK sends it
(``Authorization: Bearer``), never put on a command line or in a file. Without RAY_AUTH_TOKEN, Ray's SDK sends what
Ray itself finds (RAY_AUTH_MODE=token with RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from grpo_launch import __version__
from grpo_launch.backends.base import BackendOptions, option
from grpo_launch.backends.ray.cluster import connect, probe_cluster, split_address
from grpo_launch.backends.submission import BaseSubmitter, Planned, Submission, SubmitJob
from grpo_launch.errors import ConfigError, LaunchError, install_hint
from grpo_launch.machines.topology import Topology, parse_gpu_spec
from grpo_launch.spec import frozen

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan
    from grpo_launch.recipe import Recipe
    from grpo_launch.spec import RunContext

# Ray's dashboard port, where the job server listens (`ray start --head --dashboard-port`, default 8265:
# https://docs.ray.io/en/latest/cluster/running-applications/job-submission/quickstart.html).
DASHBOARD_PORT = 8265
TOKEN_ENV = "RAY_AUTH_TOKEN"  # Ray's own name for the cluster's token (ray/_private/authentication)
# Options of `ray job submit` that grpo-launch sets itself: after `--` they would contradict the submission.
OWN_OPTIONS = ("address", "job_id", "submission_id")
# A head just started (`ray start --head` returns before its dashboard agent registers) waits 10 s for the agent
# (WAIT_AVAILABLE_AGENT_TIMEOUT, dashboard/consts.py), then refuses the job with HTTP 500 "No available agent to
# submit job, please try again later." (JobHead.submit_job, dashboard/modules/job/job_head.py; the traceback of "Failed
# to get head node agent" where asyncio's TimeoutError is not the builtin one) and creates none. The same submission
# is sent again, for this long in all.
AGENT_NOT_READY = ("No available agent to submit job", "Failed to get head node agent")
AGENT_WAIT_S = 120.0


@frozen
class RaySubmitOptions(BackendOptions):
    """Where ``grpo-launch ray-submit`` plans and submits."""

    address: str | None = option(
        "--ray", "the Ray head's GCS address HOST:PORT, probed to plan (default: RAY_ADDRESS)", metavar="ADDRESS"
    )
    dashboard: str | None = option(
        "--ray-dashboard", f"the job server's address (default: http://HEAD:{DASHBOARD_PORT})", metavar="URL"
    )
    submission_id: str | None = option("--submission-id", "the Ray job's id (default: grpo-NAME-TIME)")
    gpus: str | None = option(
        "--gpus", "with --dry-run: plan for these GPUs (2x8xH100-80GB), not a live cluster's", metavar="SPEC"
    )


@frozen
class RayJob:
    """What is sent to the job server: the entrypoint (``bash PATH``), the job's id, and the keyword arguments of
    ``JobSubmissionClient`` and ``submit_job`` read from the arguments after ``--``."""

    dashboard: str
    submission_id: str
    entrypoint: str
    client: Mapping[str, Any]
    submit: Mapping[str, Any]


def dashboard_of(options: RaySubmitOptions, address: str) -> str:
    if options.dashboard:
        return options.dashboard
    parts = split_address(address)
    if parts is None:
        raise LaunchError(
            f"cannot tell the job server's address from --ray {address!r}",
            hint=f"Pass --ray-dashboard http://HEAD:{DASHBOARD_PORT}.",
        )
    return f"http://{parts[0]}:{DASHBOARD_PORT}"


def entrypoint_of(script: str) -> str:
    """The job's entrypoint: ``bash SCRIPT``, the one string the job server's ``sh -c`` parses."""
    return shlex.join(["bash", script])


def render_job_script(job: SubmitJob, plan: Plan, ctx: RunContext, *, address: str, dashboard: str, name: str) -> str:
    """RUN_DIR/ray-job.sh: run on the head by the job server (``bash PATH``); every value quoted once."""
    run = [ctx.python, "-m", "grpo_launch", "run", job.recipe, *job.overrides, "--run-dir", plan.run_dir]
    extra = f" with: {shlex.join(job.extra_args)}" if job.extra_args else ""
    return (
        "#!/usr/bin/env bash\n"
        + _comment(f"grpo-launch {__version__} ray-submit: the Ray job {name} on the cluster at {address}")
        + _comment(f"(job server {dashboard}, Ray's job SDK{extra}). Plan: {plan.topology.describe()}.")
        + "# The job server runs this file on the head node by its path (entrypoint: bash PATH).\n"
        + "# `grpo-launch run` attaches through RAY_ADDRESS (set by Ray for a job). Secrets (HF_TOKEN, …) are not\n"
        "# written here: they come from the environment of the head's `ray start`.\n"
        f"cd {shlex.quote(ctx.workdir)} || exit 1\n"
        f"exec {shlex.join(run)}\n"
    )


def job_arguments(extra: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The arguments after ``--`` read by ``ray job submit``'s own parser (ray.dashboard.modules.job.cli), as the
    keyword arguments of ``JobSubmissionClient`` and ``submit_job`` that command would pass."""
    if not extra:
        return {}, {}
    import click
    from ray.dashboard.modules.dashboard_sdk import parse_runtime_env_args
    from ray.dashboard.modules.job.cli import submit

    said = "arguments after -- (for ray job submit)"
    try:
        p = submit.make_context("ray job submit", [*extra, "--", "true"]).params
    except click.ClickException as exc:
        raise LaunchError(f"{said}: {exc.format_message()}", hint="See `ray job submit --help`.") from None
    problems = [f"--{k.replace('_', '-')}" for k in OWN_OPTIONS if p.get(k)]
    if problems or tuple(p.get("entrypoint", ())) != ("true",):
        raise LaunchError(
            f"{said}: {', '.join(problems) or 'a command'} cannot be given there: grpo-launch sets the job server "
            "(--ray-dashboard), the job's id (--submission-id) and its entrypoint",
            hint="Use ray-submit's own --ray-dashboard and --submission-id.",
        )

    def parsed(key: str) -> Any:
        try:
            return json.loads(p[key]) if p.get(key) is not None else None
        except ValueError as exc:
            raise LaunchError(f"{said}: --{key.replace('_', '-')} is not JSON: {exc}") from None

    runtime_env = parse_runtime_env_args(
        runtime_env=p.get("runtime_env"), runtime_env_json=p.get("runtime_env_json"), working_dir=p.get("working_dir")
    )
    submit_kwargs = {
        "runtime_env": runtime_env,
        "metadata": parsed("metadata_json"),
        "entrypoint_num_cpus": p.get("entrypoint_num_cpus"),
        "entrypoint_num_gpus": p.get("entrypoint_num_gpus"),
        "entrypoint_memory": p.get("entrypoint_memory"),
        "entrypoint_resources": parsed("entrypoint_resources"),
        "entrypoint_label_selector": parsed("entrypoint_label_selector"),
    }
    client = {"headers": parsed("headers"), "verify": p.get("verify", True)}
    return {k: v for k, v in client.items() if v is not None}, {k: v for k, v in submit_kwargs.items() if v}


def auth_headers(environ: Mapping[str, str], headers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers of every request to the job server: RAY_AUTH_TOKEN from the environment, sent as Ray's SDK
    sends a token (``Authorization: Bearer``), unless --headers already hold an Authorization."""
    out = dict(headers or {})
    token = environ.get(TOKEN_ENV, "").strip()
    if token and not any(k.lower() == "authorization" for k in out):
        out["Authorization"] = f"Bearer {token}"
    return out


class RaySubmitter(BaseSubmitter[RaySubmitOptions]):
    """``grpo-launch ray-submit``: plan on the live cluster, write RUN_DIR/ray-job.sh, submit it as the job."""

    Options: ClassVar[type[BackendOptions]] = RaySubmitOptions
    description: ClassVar[str] = (
        "Plan on the Ray cluster at --ray (each node probed in a task pinned to it), write RUN_DIR/ray-job.sh and "
        "submit it as a Ray job through Ray's job SDK: the job runs that file by path (its command line is parsed "
        "once), and RAY_AUTH_TOKEN, when set here, is sent to a cluster with token authentication. The job's driver "
        "runs `grpo-launch run` on the head node: it reserves each host's GPUs in a placement group, runs the "
        "processes in actors on their planned nodes, supervises and tears down as `run --ray` does. The run "
        "directory, the Python environment and the recipe's paths must be the same on every node (a shared file "
        "system). Arguments after `--` are `ray job submit`'s options (--runtime-env-json, --entrypoint-num-cpus, …), "
        "read by Ray's own parser."
    )
    run_dir_help: ClassVar[str] = "run directory on a file system all nodes share"

    def __init__(self) -> None:
        self.job: RayJob | None = None  # set by request(), sent by submit()

    @classmethod
    def adjusted(cls, options: RaySubmitOptions, recipe: Recipe, ctx: RunContext, *, dry_run: bool) -> RaySubmitOptions:
        if options.gpus and not dry_run:
            raise ConfigError(
                "ray-submit --gpus plans without a cluster: it is for --dry-run",
                hint="Submit with --ray HOST:PORT (the live cluster is probed and planned on).",
            )
        if not options.address and ctx.environ.get("RAY_ADDRESS"):
            return dataclasses.replace(options, address=ctx.environ["RAY_ADDRESS"])
        return options

    @classmethod
    def requested_topology(cls, options: RaySubmitOptions, local: Topology) -> Topology:
        if options.gpus:  # a dry run from anywhere, as sbatch and sky plan from a GPU spec
            return parse_gpu_spec(options.gpus)
        if not options.address:
            raise LaunchError(
                "which Ray cluster? Pass --ray HOST:PORT (the head's GCS address) or set RAY_ADDRESS",
                hint="A dry run plans from a GPU spec instead: --gpus 2x8xH100-80GB --dry-run.",
            )
        return probe_cluster(connect(options.address), sys.executable, {})

    def request(self, job: SubmitJob, plan: Plan, options: RaySubmitOptions, ctx: RunContext) -> Submission:
        address = options.address or "HEAD:6379"  # a dry run planned from --gpus: the cluster is named at submission
        dashboard = dashboard_of(options, address)
        # the default id: the run directory's name in letters, digits and ._- (it names Ray's log files)
        name = options.submission_id or re.sub(r"[^A-Za-z0-9._-]+", "-", f"grpo-{Path(plan.run_dir).name}-{_stamp()}")
        path = str(Path(ctx.workdir, plan.paths.ray_job_script))  # the job server's cwd is not the workdir
        client, submit = job_arguments(job.extra_args)
        self.job = RayJob(dashboard, name, entrypoint_of(path), client, submit)
        text = render_job_script(job, plan, ctx, address=address, dashboard=dashboard, name=name)
        return Submission(text, path, summary=name)

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        """The job to the job server through Ray's SDK (its entrypoint: ``bash RUN_DIR/ray-job.sh``)."""
        assert self.job is not None, "request() first"
        job = self.job
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError:
            raise LaunchError("Ray's job SDK is not installed here", hint=install_hint("ray")) from None
        client = dict(job.client)
        client["headers"] = auth_headers(ctx.environ, client.get("headers"))
        deadline = time.monotonic() + AGENT_WAIT_S
        while True:
            try:
                sdk = JobSubmissionClient(job.dashboard, **client)
                return sdk.submit_job(entrypoint=job.entrypoint, submission_id=job.submission_id, **job.submit)
            except Exception as exc:  # requests', Ray's and the server's errors: one message for all
                full = str(exc)  # a traceback, where the head's Python is older than 3.11: its cause comes last
                said = f"{type(exc).__name__}: {' '.join(full.split())[:600]}"
            if not any(text in full for text in AGENT_NOT_READY) or time.monotonic() >= deadline:
                break
            ctx.emit("[grpo-launch] the head's job agent is not up yet (a head just started): submitting again")
            time.sleep(1.0)
        auth = "auth" in said.lower() or " 401" in said or " 403" in said
        raise LaunchError(
            f"submitting the Ray job to {job.dashboard} failed: {said}",
            hint=f"The cluster wants its token: export {TOKEN_ENV} (the value the cluster's `ray start` had)."
            if auth
            else "Is the dashboard (job server) reachable? See --ray-dashboard.",
        )

    def submitted(self, job_id: str, planned: Planned) -> list[str]:
        plan = planned.plan
        dashboard = dashboard_of(planned.options, planned.options.address)
        follow = shlex.join(["ray", "job", "logs", "-f", job_id, "--address", dashboard])
        status = shlex.join(["grpo-launch", "status", plan.run_dir])
        return [
            f"submitted Ray job {job_id} (plan {plan.topology.describe()})",
            f"  follow:  {follow}",
            f"  logs:    {shlex.quote(str(plan.paths.logs))}/ per process   status: {status}",
            f"  stop:    {shlex.join(['ray', 'job', 'stop', job_id, '--address', dashboard])}",
        ]


def _comment(text: str) -> str:
    """A comment line: control characters (a line break would end the comment) shown as ``?``."""
    return "# " + "".join("?" if ord(c) < 32 or ord(c) == 127 else c for c in text) + "\n"


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")

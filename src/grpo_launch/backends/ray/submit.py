"""``grpo-launch ray-submit``: the whole run as one Ray job (``ray job submit``), the way ``grpo-launch sbatch``
hands it to Slurm. The plan is made first from the live cluster (the Ray backend's probe); the job's entrypoint is
``grpo-launch run`` on the head node, which attaches through the RAY_ADDRESS a Ray job's driver has."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from grpo_launch.backends.base import BackendOptions, option
from grpo_launch.backends.submission import Submission, SubmitJob, Submitter
from grpo_launch.errors import LaunchError
from grpo_launch.machines.topology import Topology
from grpo_launch.spec import frozen

if TYPE_CHECKING:
    from grpo_launch.planning.types import Plan
    from grpo_launch.spec import RunContext

# Ray's dashboard port, where the job server listens (`ray start --head --dashboard-port`, default 8265:
# https://docs.ray.io/en/latest/cluster/running-applications/job-submission/quickstart.html).
DASHBOARD_PORT = 8265


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


def dashboard_of(options: RaySubmitOptions, address: str) -> str:
    if options.dashboard:
        return options.dashboard
    from grpo_launch.backends.ray.cluster import split_address

    parts = split_address(address)
    if parts is None:
        raise LaunchError(
            f"cannot tell the job server's address from --ray {address!r}",
            hint=f"Pass --ray-dashboard http://HEAD:{DASHBOARD_PORT}.",
        )
    return f"http://{parts[0]}:{DASHBOARD_PORT}"


def ray_cli(python: str) -> str:
    """The ``ray`` command beside this Python, else the one on PATH."""
    import shutil

    here = Path(python).parent / "ray"
    found = str(here) if here.exists() else shutil.which("ray")
    if not found:
        raise LaunchError("the `ray` command is not installed here", hint="pip install 'grpo-launch[ray]'")
    return found


class RaySubmitter(Submitter[RaySubmitOptions]):
    """``grpo-launch ray-submit``: plan on the live cluster, write RUN_DIR/ray-job.sh, submit it."""

    Options: ClassVar[type[BackendOptions]] = RaySubmitOptions

    @classmethod
    def requested_topology(cls, options: RaySubmitOptions, local: Topology) -> Topology:
        import sys

        from grpo_launch.backends.ray.cluster import connect, probe_cluster

        if not options.address:
            raise LaunchError("which Ray cluster? Pass --ray HOST:PORT (the head's GCS address) or set RAY_ADDRESS")
        return probe_cluster(connect(options.address), sys.executable, {})

    def request(self, job: SubmitJob, plan: Plan, options: RaySubmitOptions, ctx: RunContext) -> Submission:
        assert options.address
        from grpo_launch import __version__

        dashboard = dashboard_of(options, options.address)
        name = options.submission_id or f"grpo-{Path(plan.run_dir).name}-{_stamp()}"
        run = [ctx.python, "-m", "grpo_launch", "run", job.recipe, *job.overrides, "--run-dir", plan.run_dir]
        entry = f"cd {shlex.quote(ctx.workdir)} && exec {shlex.join(run)}"
        submit = [ray_cli(ctx.python), "job", "submit", "--address", dashboard, "--submission-id", name,
                  "--no-wait", *job.extra_args, "--", "bash", "-c", entry]  # fmt: skip
        text = (
            "#!/usr/bin/env bash\n"
            f"# grpo-launch {__version__} ray-submit: {job.recipe} as one Ray job on {options.address}\n"
            f"# plan: {plan.topology.describe()}; the job's driver runs `grpo-launch run` on the head node and\n"
            "# attaches through RAY_ADDRESS (set by Ray for a job). Secrets (HF_TOKEN, …) are not written here:\n"
            "# they come from the environment of the head's `ray start`.\n"
            f"exec {shlex.join(submit)}\n"
        )
        return Submission(text, str(plan.paths.ray_job_script), summary=name)

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        import subprocess

        done = subprocess.run(["bash", submission.path], capture_output=True, text=True, cwd=ctx.workdir,
                              env=dict(ctx.environ), timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
            raise LaunchError("ray job submit failed: " + " | ".join(said)[:600],
                              hint="Is the dashboard (job server) reachable? See --ray-dashboard.")  # fmt: skip
        return submission.summary


def _stamp() -> str:
    import time

    return time.strftime("%Y%m%d-%H%M%S")

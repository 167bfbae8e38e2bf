"""The Ray backend: runs on a Ray cluster it attaches to (``--ray ADDRESS``, or ``RAY_ADDRESS``, which a Ray job's
driver has). Beside local, ssh and Slurm, on the same protocol:

- probe: a task pinned to each node that holds all of its GPUs reports the node (NVML, CPUs, RAM); Ray's resources
  where a node gives no report (:mod:`.cluster`);
- place: each process becomes a local runner (:mod:`.runner`) that starts it in an actor on its planned node,
  inside that host's placement group; CUDA_VISIBLE_DEVICES is what Ray assigns, and the runner prints it beside the
  plan's positions;
- per attempt: one STRICT_PACK placement group per host pinned to the node (as verl and NeMo-RL place their
  workers), released at the end, after the run-id marker sweep on every node of the run;
- signal: a task on the node signals the process group and every marked process there;
- a planned node being drained asks the trainers for a checkpoint at the end of the step (:mod:`.drain`: Ray 2.x
  tells the driver through its GCS state only), and a restart after a lost or drained node runs on the nodes there
  are then: the node back, or one with the same GPUs in its place, within launch.node_wait_s (:mod:`.recover`).

``ray`` is an optional extra (the ``ray`` extra): nothing here imports it until a run uses Ray, and the planner
never does.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from grpo_launch.backends.base import BackendOptions, BaseBackend, check_addresses
from grpo_launch.backends.options import RayOptions
from grpo_launch.backends.ray.cluster import (
    RESERVE_TIMEOUT_S,
    alive_nodes,
    connect,
    draining_nodes,
    gcs_address,
    node_ids,
    probe_cluster,
    release,
    reserve,
    run_on_nodes,
    usable,
)
from grpo_launch.backends.ray.drain import DrainWatch
from grpo_launch.backends.ray.recover import Cluster, wait_for_nodes
from grpo_launch.backends.remote import (
    check_command,
    check_problem,
    host_ports,
    kill_line,
    local_paths,
    off_the_command_line,
    passed_env_names,
)
from grpo_launch.backends.ssh import marked_per_start
from grpo_launch.enums import Role
from grpo_launch.errors import LaunchError
from grpo_launch.machines.topology import Topology
from grpo_launch.render.processes import all_processes
from grpo_launch.rundir.layout import GRACE_ENV, RUN_ID_ENV
from grpo_launch.spec import ProcessSpec, RunContext, RunResult

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan

SIGNAL_TIMEOUT_S = 20.0
CHECK_TIMEOUT_S = 60.0


def host_bundles(plan: Plan) -> dict[str, list[tuple[str, int, float]]]:
    """Host → its processes as (name, GPUs, CPUs), in the order of the plan: one placement-group bundle each. A GPU
    process asks for its GPUs only; a CPU process for one CPU."""

    first = plan.topology.hosts[0].name
    out: dict[str, list[tuple[str, int, float]]] = {}
    for spec in all_processes(plan):
        gpus = len(spec.gpus or ())
        out.setdefault(spec.host or first, []).append((spec.name, gpus, 0.0 if gpus else 1.0))
    return out


def pg_name(run_id: str, host: str) -> str:
    return f"grpo-launch-{run_id}-{host}"


class RayBackend(BaseBackend[RayOptions]):
    name: ClassVar[str] = "ray"
    Options: ClassVar[type[BackendOptions]] = RayOptions

    def __init__(self, address: str) -> None:
        self.address = address
        self.addresses: dict[str, str] = {}  # host → node address, as placed (signal_remote finds the node)
        self.drained: str | None = None  # the last attempt stopped for a planned node's drain: what was said

    @classmethod
    def detect(cls, options: RayOptions, environ: Mapping[str, str]) -> bool:
        return options.chooses_backend() or bool(environ.get("RAY_ADDRESS"))

    @classmethod
    def create(cls, options: RayOptions, environ: Mapping[str, str]) -> RayBackend:
        address = options.address or environ.get("RAY_ADDRESS", "")
        if address.startswith(("http://", "https://", "ray://")):
            raise LaunchError(
                f"{'--ray' if options.address else 'RAY_ADDRESS'}={address}: the Ray backend attaches to the head's "
                "GCS address (HOST:PORT, e.g. 10.0.0.1:6379), not the dashboard or a Ray Client address",
                hint="Give --ray HOST:6379 (or 'auto' on a node of the cluster); to submit a job through the dashboard "
                "use `grpo-launch ray-submit RECIPE --ray HOST:6379`.",
            )
        return cls(address)

    def _ray(self) -> Any:
        ray = connect(self.address)
        self.address = gcs_address(ray)  # 'auto' resolved: the runners attach to the same head
        return ray

    def probe(self, environ: Mapping[str, str], local: Topology) -> Topology:
        return probe_cluster(self._ray(), sys.executable, environ)

    def place(self, spec: ProcessSpec, plan: Plan, ctx: RunContext) -> ProcessSpec:
        host = spec.host or plan.topology.hosts[0].name
        self.addresses.update((h.name, h.addr) for h in plan.topology.hosts)
        run_id = spec.env.get(RUN_ID_ENV) or "RUN_ID"
        marker = f"{run_id}@{host}"
        bundles = host_bundles(plan)[host]
        names = [name for name, _, _ in bundles]
        _, gpus, cpus = bundles[names.index(spec.name)]
        # each host's processes carry their own mark, as over ssh; a secret-looking value goes on stdin, as over ssh
        env, hidden = off_the_command_line({**spec.env, RUN_ID_ENV: marker})
        grace = ["--grace", env[GRACE_ENV]] if env.get(GRACE_ENV) else []  # the run's grace, as the launcher's guard
        remote = [
            ctx.python,
            "-m",
            "grpo_launch.node.shim",
            "--announce-pgid",
            "--guard",
            marker,
            *grace,
            "--",
            "env",
            *(f"{k}={v}" for k, v in env.items()),
            *spec.argv,
        ]
        if spec.role == Role.VLLM:  # a server's processes carry a mark of their start alone, as over ssh
            remote = ["sh", "-c", marked_per_start(remote, marker)]
        stdin_env = tuple(sorted({*passed_env_names(ctx.environ, plan.recipe.launch.pass_env), *hidden}))
        argv = [
            ctx.python,
            "-m",
            "grpo_launch.backends.ray.runner",
            "--address",
            self.address,
            "--pg",
            pg_name(run_id, host),
            "--bundle",
            str(names.index(spec.name)),
            "--gpus",
            str(gpus),
            "--cpus",
            f"{cpus:g}",
            "--name",
            spec.name,
            "--host",
            host,
            "--planned",
            ",".join(spec.gpus or ()),
            "--cwd",
            ctx.workdir,
            *(["--env-stdin"] if stdin_env else []),
            "--",
            *remote,
        ]
        return ProcessSpec(
            name=spec.name,
            argv=tuple(argv),
            host=host,
            role=spec.role,
            stdin_env=stdin_env,
            remote_group=True,
            env={RUN_ID_ENV: marker, **hidden},
        )

    def preflight(self, plan: Plan, ctx: RunContext) -> None:
        """Every planned node is in the cluster and ready: this grpo-launch and Python, the working directory,
        the recipe's local paths, free ports (the remote hosts' checks, :mod:`grpo_launch.backends.remote`, run in a
        task on each node)."""

        check_addresses(plan)
        ray = self._ray()
        nodes = node_ids(ray)
        missing = [h.name for h in plan.topology.hosts if h.addr not in nodes]
        if missing:
            raise LaunchError(
                f"planned node(s) {', '.join(missing)} are no longer in the Ray cluster; nothing was started",
                hint="Plan again (the cluster changed), or bring the node back.",
            )
        ports = host_ports(plan)
        line = {
            h.name: check_command(ctx.python, ctx.workdir, local_paths(plan), sorted(ports.get(h.name, {})))
            for h in plan.topology.hosts
        }
        by_node = {nodes[h.addr]: h.name for h in plan.topology.hosts}
        answers = run_on_nodes(ray, {n: ["bash", "-c", line[h]] for n, h in by_node.items()}, timeout_s=CHECK_TIMEOUT_S)
        problems = []
        for node, host in by_node.items():
            answer = answers[node]
            if isinstance(answer, str):
                problems.append(f"{host}: {answer}")
            elif p := check_problem(host, *answer, plan, ctx.python, ports.get(host, {})):
                problems.append(p)
        if problems:
            raise LaunchError(
                "the Ray nodes are not ready; nothing was started:",
                problems=problems,
                hint="Every node needs the same paths as this one: the Python environment "
                f"({ctx.python}) with grpo-launch's ray extra, the working directory and the model/data (a shared file "
                "system).",
            )

    @contextlib.contextmanager
    def attempt(
        self, processes: Sequence[ProcessSpec], plan: Plan, ctx: RunContext, ask_stop: Callable[[str], None]
    ) -> Iterator[None]:
        """Each host's placement group for this attempt; afterwards, the marker sweep on every node of the run
        and the groups released."""

        ray, self.drained = self._ray(), None
        run_id = next(iter(processes)).env[RUN_ID_ENV].rsplit("@", 1)[0]
        address = {h.name: h.addr for h in plan.topology.hosts}
        gone = [h for h, a in address.items() if a not in node_ids(ray)]
        if gone:  # a restart after a node was lost: its GPUs cannot be reserved again
            raise LaunchError(
                f"node(s) {', '.join(gone)} of the plan left the Ray cluster; nothing more was started",
                hint="Bring the node back, or run again: the plan is made for the nodes the cluster has then.",
            )
        pgs: list[Any] = []
        try:
            for host, bundles in host_bundles(plan).items():
                wanted = [{"GPU": float(g), "CPU": c} for _, g, c in bundles]
                pgs.append(reserve(ray, pg_name(run_id, host), address[host], wanted, timeout_s=RESERVE_TIMEOUT_S))
            with self._drain_watch(ray, plan, ctx, ask_stop):
                yield
        finally:
            try:
                self._sweep(ray, run_id, plan, ctx)
            finally:
                release(pgs)

    @contextlib.contextmanager
    def _drain_watch(self, ray: Any, plan: Plan, ctx: RunContext, ask_stop: Callable[[str], None]) -> Iterator[None]:
        """While the attempt runs: a planned node being drained asks the trainers for a checkpoint (:mod:`.drain`)."""

        def on_drain(text: str) -> None:
            self.drained = text
            ctx.emit(
                f"[grpo-launch] ray: {text}: asking the trainers to save a checkpoint at the end of the step "
                "and stop; the run then restarts without it"
            )
            ask_stop(f"Ray: {text}")

        nodes = node_ids(ray)
        hosts = {nodes[h.addr]: h.name for h in plan.topology.hosts if h.addr in nodes}
        watch = DrainWatch(hosts, lambda: draining_nodes(ray), on_drain).start()
        try:
            yield
        finally:
            watch.stop()

    def machines_leaving(self, ctx: RunContext) -> str | None:
        return self.drained

    def before_restart(self, plan: Plan, result: RunResult, ctx: RunContext) -> Plan | RunResult:
        """A restart after a planned node left the cluster (or is being drained) runs on the nodes there now: the
        node back, or one with the same GPUs in its place, waiting up to launch.node_wait_s for either
        (:mod:`.recover`). A draining node counts as gone: Ray places nothing new on it."""

        ray = self._ray()

        def alive() -> set[str]:  # the nodes that could run a process (the head without CPUs or GPUs cannot)
            draining = draining_nodes(ray)
            nodes, _ = usable([n for n in alive_nodes(ray) if n["NodeID"] not in draining])
            return {str(n["NodeManagerAddress"]) for n in nodes}

        def probe() -> Topology:
            return probe_cluster(ray, ctx.python, ctx.environ, skip=set(draining_nodes(ray)))

        cluster = Cluster(alive=alive, probe=probe)
        return wait_for_nodes(plan, result, cluster, ctx.emit, wait_s=plan.recipe.launch.node_wait_s)

    def _sweep(self, ray: Any, run_id: str, plan: Plan, ctx: RunContext) -> None:
        nodes = node_ids(ray)
        argv = {
            nodes[h.addr]: [ctx.python, "-m", "grpo_launch.node.reaper", "signal", f"{run_id}@{h.name}", "9"]
            for h in plan.topology.hosts
            if h.addr in nodes
        }
        names = {nodes[h.addr]: h.name for h in plan.topology.hosts if h.addr in nodes}
        for node, answer in run_on_nodes(ray, argv, timeout_s=SIGNAL_TIMEOUT_S).items():
            count = answer[1].strip() if isinstance(answer, tuple) else ""
            if isinstance(answer, str):
                ctx.emit(f"[grpo-launch] ray: could not sweep {names[node]} for the run's processes: {answer}")
            elif count.isdigit() and int(count):
                ctx.emit(f"[grpo-launch] ray: {count} process(es) of the run were still on {names[node]}: SIGKILL")
        lost = [h.name for h in plan.topology.hosts if h.addr not in nodes]
        if lost:
            ctx.emit(f"[grpo-launch] ray: node(s) {', '.join(lost)} left the cluster: their processes went with them")

    def signal_remote(self, spec: ProcessSpec, pgid: int, sig: int, ctx: RunContext) -> None:
        assert spec.host
        ray = self._ray()
        address = self.addresses.get(spec.host, spec.host)
        node = node_ids(ray).get(address)
        if node is None:
            raise LaunchError(f"node {spec.host} ({address}) is no longer in the Ray cluster")
        line = kill_line(pgid, sig, run_id=spec.env.get(RUN_ID_ENV), python=ctx.python)
        answer = run_on_nodes(ray, {node: ["bash", "-c", line]}, timeout_s=SIGNAL_TIMEOUT_S)[node]
        if isinstance(answer, str):
            raise LaunchError(answer)

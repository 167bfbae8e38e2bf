"""``grpo-launch sky``: the SkyPilot task YAML (a pure renderer) and its run section, a shell script that runs on
every node of the cluster.

Why Ray and not an ssh hostfile (checked against SkyPilot 0.14.1's own code):

- SkyPilot ships a user Ray cluster template, ``~/sky_templates/ray/start_cluster`` (the ``sky_templates`` package):
  a user's Ray on every node, on Ray's default port 6379 because SkyPilot's own Ray listens on 6380
  (``SKY_REMOTE_RAY_PORT`` in sky/skylet/constants.py), and its ``stop_cluster`` warns not to use ``ray stop``,
  which would also stop SkyPilot's Ray and the job with it. The run section here starts that kind of Ray.
- SkyPilot gives each node its rank and every node's IP (``SKYPILOT_NODE_RANK``, ``SKYPILOT_NODE_IPS``, one IP per
  line, rank order: sky/backends/task_codegen.py) but documents no passwordless ssh between nodes for user
  processes: its DeepSpeed example (examples/deepspeed-multinode/sky.yaml) builds the hostfile by hand, installs
  pdsh and copies the local SkyPilot private key onto every node (``file_mounts: ~/.ssh/id_rsa: ~/.ssh/sky-key``).
  Ray needs no ssh and no key on the nodes: workers dial the head's port.

How the run section behaves (``render_run_script``): every node starts its own Ray with ``ray start --block``, a child
of the script in a session (and process group) of its own, so the script stops exactly that Ray and nothing else:
SIGTERM to ``ray start`` (which stops what it started), then SIGKILL to the group, which also reaches Ray's dashboard
and runtime-env agents, which outlive a raylet killed hard. Draining is off (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0):
the run is over when the script stops Ray, and a worker's drain would wait 30 s for a head that is gone. Ray's metrics
collection is off (:data:`RAY_NODE_ENV`): Ray 2.60's dashboard agent serves every node's Prometheus metrics on
``--metrics-export-port`` (a random port unless given) on every interface, without authentication, whenever the
node's address is not loopback (``ray/dashboard/modules/reporter/reporter_agent.py``: the exporter's address is
loopback only for a loopback node), and no ``ray start`` option binds it elsewhere; ``RAY_enable_metrics_collection=0``
starts the agent with ``--disable-metrics-collection``, and no exporter (ray-project/ray#24333). grpo-launch reads none
of Ray's metrics: its own endpoint is ``launch.metrics_port``.

Every node's Ray runs with token authentication (``RAY_AUTH_MODE=token``, Ray ≥ 2.52, the floor the Ray extra
sets: before it, Ray's dashboard runs commands for anyone who reaches it, CVE-2025-62593). The token is the
``RAY_AUTH_TOKEN`` secret, declared by name in ``secrets:`` and resolved by ``sky launch --secret RAY_AUTH_TOKEN``
from the launching environment (``--launch`` draws one when none is exported): every node's Ray, the launcher on the
head and its actors read it from their environment; a node without it stops before starting Ray. With it, Ray 2.60
checks the token on its gRPC servers (the Ray Client server included: ``create_grpc_server_with_interceptors``) and
on its dashboard's HTTP API. Ray 2.60's client server listens on the node's own address and loopback
(``ray.util.client.server``: ``--host`` is the node IP; older releases bound 0.0.0.0 unless the node IP was
127.0.0.1, and ``ray start --head`` cannot leave it out), its dashboard on loopback (Ray's default). Each node's
Ray temp dir is private: inside a ``mktemp -d`` directory (mode 0700, a random name) in /tmp, never a name another
user can predict and create first (Ray makes its temp dir itself writable by all: the parent keeps others out).

Rank 0 starts the head on the first IP of ``SKYPILOT_NODE_IPS``, waits until ``SKYPILOT_NUM_NODES`` nodes have
joined (within :data:`~grpo_launch.rundir.layout.RAY_JOIN_TIMEOUT_ENV` seconds), runs ``grpo-launch run --ray
HEAD:PORT`` and exits with its code (the task's code). The other ranks join, then watch the head's port: when the
head's Ray stops (the run ended there, whatever its outcome) they stop their own Ray and exit 0. A worker exits
non-zero only when its own Ray dies while the head's is up (a lost node): SkyPilot then cancels the other nodes'
runs (``get_or_fail`` in task_codegen.py). The variables the sections read are named in rundir/layout.py.

A managed job (``sky jobs launch``, :attr:`SkyTaskRequest.managed`): SkyPilot relaunches the task on new nodes after
a preemption (``resources.job_recovery``), setup and run again. The run directory then lives on a bucket
(``file_mounts``, MOUNT_CACHED: written locally, uploaded behind, the mode SkyPilot advises for checkpoints) or a
SkyPilot volume (``volumes``) mounted at :data:`RUN_MOUNT` on every node, and ``grpo-launch run`` resumes from the
newest complete checkpoint there (its automatic resume), repeating at most the steps since it. A managed task whose
run directory would be on the nodes' own disks is refused: a relaunch would start over.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import field

from grpo_launch import __version__
from grpo_launch.errors import ConfigError
from grpo_launch.rundir.layout import (
    NODE_PYTHON_ENV,
    RAY_CLIENT_PORT_ENV,
    RAY_JOIN_TIMEOUT_ENV,
    RAY_PORT_ENV,
    STOP_NOTICE_ENV,
)
from grpo_launch.spec import frozen

# SkyPilot's own Ray uses 6380, its dashboard 8266 and its dashboard agent 52365 (sky/skylet/constants.py,
# sky/provision/instance_setup.py); the user Ray template uses Ray's defaults 6379 / 8265 and agent port 52366
# (sky_templates/ray/start_cluster). The Ray client server (Ray's default 10001, taken by SkyPilot's head) moves to
# 6381, outside Ray's default worker-port range 10002-19999, which Ray refuses to overlap.
RAY_PORT = 6379
RAY_CLIENT_PORT = 6381
RAY_DASHBOARD_AGENT_PORT = 52366
# The environment every node's `ray start` runs with: no per-node Prometheus exporter on every interface (above).
RAY_NODE_ENV = ("RAY_enable_metrics_collection=0",)
RUN_MOUNT = "/grpo-runs"  # where the task mounts the bucket or volume that holds its run directory
# A spot VM's notice before it is reclaimed: GCP's preemption notice is 30 s (cloud.google.com/compute/docs/instances/
# preemptible, "Preemption process"), Azure's Spot eviction notice at least 30 s (Scheduled Events, learn.microsoft.com
# virtual-machines/linux/scheduled-events), AWS's Spot interruption notice 2 minutes (docs.aws.amazon.com AWSEC2
# spot-instance-termination-notices). SkyPilot may pick any of them: the shortest.
SPOT_NOTICE_S = 30.0
JOIN_TIMEOUT_S = 600  # nodes of one cluster come up together; SkyPilot's template waits 300 s for its own Ray
# Secrets never written into the task: declared by name with a null value (SkyPilot 0.14.1 task.py: a null-valued
# key of `secrets:` is resolved at launch from `sky launch --secret NAME`, or refused).
SECRET_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")
RAY_TOKEN_SECRET = "RAY_AUTH_TOKEN"  # Ray's own name for its token: every task declares it (the nodes' Ray needs it)
# What YAML 1.1/1.2 files may not hold (their "printable" set: tab, line breaks and the printable Unicode ranges).
_NOT_YAML = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# What ends a line in YAML 1.1 (as PyYAML reads it: NEL and the Unicode line and paragraph separators too), and NUL.
_YAML_BREAK = re.compile("[\n\r\x85\u2028\u2029\0]")


@frozen
class RunStorage:
    """Where a run directory outlives the cluster: a bucket URI (``s3://``, ``gs://``, ``r2://``, …) or the name of
    a SkyPilot volume (``sky volumes apply``), mounted at :data:`RUN_MOUNT`."""

    bucket: str | None = None
    volume: str | None = None


@frozen
class SkyTaskRequest:
    """What the task runs. ``workdir`` is the local directory SkyPilot copies to every node (~/sky_workdir, where
    setup and run start); ``recipe`` and ``run_dir`` are as the nodes see them (relative: inside that copy)."""

    name: str
    recipe: str
    workdir: str
    run_dir: str
    num_nodes: int = 1
    accelerators: str | None = None  # "H100:8"; None: CPU nodes
    overrides: tuple[str, ...] = ()
    # pip install's arguments on every node (backends.skypilot.install_args): the workdir's checkout, or --install
    install: tuple[str, ...] = ("-e", ".[train,ray]")
    secrets: tuple[str, ...] = ()
    disk_size: int | None = None
    envs: Mapping[str, str] = field(default_factory=dict)
    storage: RunStorage | None = None  # the run directory's bucket or volume (run_dir is then under RUN_MOUNT)
    managed: bool = False  # a managed job (sky jobs launch): recovered after a preemption, resumed from run_dir
    use_spot: bool = False


def check_request(req: SkyTaskRequest) -> None:
    """Refuse values the task cannot carry, all at once."""
    problems: list[str] = []
    named = [
        ("recipe path", req.recipe),
        ("--run-dir", req.run_dir),
        ("workdir", req.workdir),
        ("name", req.name),
        *((f"override {o.split('=', 1)[0]!r}", o) for o in req.overrides),
    ]
    for what, value in named:
        if _YAML_BREAK.search(value):
            problems.append(f"{what} contains a line break or NUL byte: {value!r}")
        elif _NOT_YAML.search(value):
            problems.append(f"{what} contains a control character, which a YAML file cannot hold: {value!r}")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", req.name):
        problems.append(f"--cluster {req.name!r}: SkyPilot cluster names are lower-case letters, digits and '-'")
    if req.num_nodes < 1:
        problems.append(f"--nodes must be at least 1, got {req.num_nodes}")
    problems += _storage_problems(req)
    if req.disk_size is not None and req.disk_size < 1:
        problems.append(f"--disk-size must be a positive number of GB, got {req.disk_size}")
    for k in (*req.envs, *req.secrets):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            problems.append(f"environment variable name {k!r} is not valid")
    if problems:
        raise ConfigError("cannot write the SkyPilot task:", problems=problems)


def _storage_problems(req: SkyTaskRequest) -> list[str]:
    """A managed job's run directory must outlive its nodes; a bucket is a URI, a volume a name."""
    problems = []
    store = req.storage
    if req.managed and (store is None or not (store.bucket or store.volume)):
        problems.append(
            "--managed needs the run directory on a bucket or a volume (--bucket s3://BUCKET/PATH, or --volume "
            "NAME): SkyPilot recovers a managed job on new nodes, whose disks hold nothing of the old ones"
        )
    if store is not None and store.bucket and not re.fullmatch(r"[a-z][a-z0-9]*://[^\s]+", store.bucket):
        problems.append(f"--bucket {store.bucket!r} is not a bucket URI (s3://BUCKET/PATH, gs://…, r2://…)")
    if store is not None and store.volume and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", store.volume):
        problems.append(f"--volume {store.volume!r} is not a SkyPilot volume name (lower-case letters, digits, -)")
    if store is not None and not req.run_dir.startswith(RUN_MOUNT + "/"):
        problems.append(f"the run directory {req.run_dir} is not under {RUN_MOUNT}, where the bucket or volume is")
    return problems


def _storage_lines(req: SkyTaskRequest) -> list[str]:
    """The task's bucket (``file_mounts``) or volume (``volumes``) at :data:`RUN_MOUNT`."""
    store = req.storage
    if store is None:
        return []
    if store.volume:
        return ["volumes:", f"  {RUN_MOUNT}: {_q(store.volume)}"]
    assert store.bucket is not None
    return ["file_mounts:", f"  {RUN_MOUNT}:", f"    source: {_q(store.bucket)}", "    mode: MOUNT_CACHED"]


def _q(value: str) -> str:
    """A YAML scalar: JSON's double-quoted strings are YAML's."""
    return json.dumps(value, ensure_ascii=False)


def _block(text: str) -> list[str]:
    """A literal block scalar (``|``), every line indented two spaces."""
    return ["  " + line if line else "" for line in text.rstrip("\n").split("\n")]


def render_setup(req: SkyTaskRequest) -> str:
    """Installs grpo-launch with its extras on every node (SkyPilot runs it once per node, in the workdir)."""
    return "\n".join(
        [
            "set -euo pipefail",
            f'"${{{NODE_PYTHON_ENV}:-python3}}" -m pip install ' + shlex.join(req.install),
            f'"${{{NODE_PYTHON_ENV}:-python3}}" -m grpo_launch --version',
            "",
        ]
    )


def declared_secrets(names: tuple[str, ...]) -> tuple[str, ...]:
    """The secrets a task declares by name (``--secret`` for each at launch): ``names``, then the Ray token every
    node needs."""
    return (*(s for s in names if s != RAY_TOKEN_SECRET), RAY_TOKEN_SECRET)


def render_task(req: SkyTaskRequest) -> str:
    """The task YAML, readable and launchable with plain ``sky launch``."""
    check_request(req)
    secrets = declared_secrets(req.secrets)
    envs = {
        NODE_PYTHON_ENV: "python3",
        RAY_PORT_ENV: str(RAY_PORT),
        RAY_JOIN_TIMEOUT_ENV: str(JOIN_TIMEOUT_S),
        # a spot instance is reclaimed after a notice (30 s on GCP and Azure, 2 min on AWS, whichever cloud
        # SkyPilot picks): the first stop waits for a checkpoint within the shortest of them
        **({STOP_NOTICE_ENV: f"{SPOT_NOTICE_S:g} a spot instance's reclaim"} if req.use_spot else {}),
        **req.envs,
    }
    lines = [
        f"# SkyPilot task written by grpo-launch {__version__} for {req.recipe}.",
        f"# Every node installs grpo-launch (setup), starts its own Ray (port {RAY_PORT_ENV}, not SkyPilot's",
        "# 6380); node 0 runs `grpo-launch run --ray` once all nodes have joined, and its exit code is the task's.",
        "# Launch: sky launch -c CLUSTER THIS_FILE"
        + "".join(f" --secret {s}" for s in secrets)
        + " (secrets are read from your environment, never written here;",
        f"# {RAY_TOKEN_SECRET}: the nodes' Ray token, any long random string, e.g. python3 -c 'import secrets;",
        "# print(secrets.token_hex(32))')",
        f"name: {_q(req.name)}",
        f"num_nodes: {req.num_nodes}",
    ]
    if req.managed:  # instead of the Launch line
        named = "".join(f" --secret {s}" for s in secrets)
        lines[3:4] = [
            f"# Managed job: sky jobs launch -n {req.name} THIS_FILE{named}. After a preemption SkyPilot",
            f"# relaunches it and grpo-launch resumes from the run directory {req.run_dir} on the bucket or volume.",
        ]
    resources = []
    if req.accelerators:
        resources.append(f"  accelerators: {_q(req.accelerators)}")
    if req.disk_size:
        resources.append(f"  disk_size: {req.disk_size}")
    if req.use_spot:
        resources.append("  use_spot: true")
    if req.managed:  # SkyPilot's default strategy; a failed run is grpo-launch's to restart (launch.max_restarts)
        resources += ["  job_recovery:", "    strategy: EAGER_NEXT_REGION", "    max_restarts_on_errors: 0"]
    lines += ["resources:", *resources] if resources else []
    lines += [f"workdir: {_q(req.workdir)}", *_storage_lines(req)]
    lines += ["envs:", *(f"  {k}: {_q(v)}" for k, v in envs.items())]
    lines += ["secrets:", *(f"  {s}: null" for s in secrets)]
    lines += ["setup: |", *_block(render_setup(req)), "run: |", *_block(render_run_script(req)), ""]
    return "\n".join(lines)


def render_run_script(req: SkyTaskRequest) -> str:
    """The run section: the same script on every node, its role from ``SKYPILOT_NODE_RANK``."""
    q = shlex.quote
    run = " ".join(["run", q(req.recipe), *(q(o) for o in req.overrides), "--run-dir", q(req.run_dir)])
    values = {
        "@RUN@": run,
        "@VERSION@": __version__,
        "@CLIENT_PORT@": str(RAY_CLIENT_PORT),
        "@AGENT_PORT@": str(RAY_DASHBOARD_AGENT_PORT),
        "@RAY_NODE_ENV@": " ".join(RAY_NODE_ENV),
        "@RAY_PORT@": str(RAY_PORT),
        "@JOIN_TIMEOUT@": str(JOIN_TIMEOUT_S),
        # the variables' names are the run directory contract's (rundir/layout.py), never spelled here
        "@PYTHON_ENV@": NODE_PYTHON_ENV,
        "@PORT_ENV@": RAY_PORT_ENV,
        "@JOIN_TIMEOUT_ENV@": RAY_JOIN_TIMEOUT_ENV,
        "@CLIENT_PORT_ENV@": RAY_CLIENT_PORT_ENV,
        "@TOKEN_ENV@": RAY_TOKEN_SECRET,
    }
    return re.sub(r"@[A-Z_]+@", lambda m: values[m.group()], _RUN_SCRIPT.lstrip("\n"))


_RUN_SCRIPT = r"""
# grpo-launch @VERSION@: runs on every node with SkyPilot's variables (SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS,
# SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE). Each node runs its own Ray (`ray start --block`, a child of this
# script) and stops only that one at the end: never `ray stop`, which would stop SkyPilot's Ray too.
set -uo pipefail
py=${@PYTHON_ENV@:-python3}
port=${@PORT_ENV@:-@RAY_PORT@}
join_timeout=${@JOIN_TIMEOUT_ENV@:-@JOIN_TIMEOUT@}
rank=${SKYPILOT_NODE_RANK:?not set: run this under sky launch, or set the SKYPILOT_* variables}
nodes=${SKYPILOT_NUM_NODES:?not set: run this under sky launch, or set the SKYPILOT_* variables}
gpus=${SKYPILOT_NUM_GPUS_PER_NODE:-0}
head_ip=$(printf '%s\n' "${SKYPILOT_NODE_IPS:?not set}" | sed -n 1p)
node_ip=$(printf '%s\n' "$SKYPILOT_NODE_IPS" | sed -n "$((rank + 1))p")
say() { echo "[grpo-launch sky] node $rank ($node_ip): $*"; }
fail() { say "error: $*" >&2; exit 1; }
# Token authentication for this node's Ray and everything that talks to it (the token: the task's secret).
[ -n "${@TOKEN_ENV@:-}" ] || fail "@TOKEN_ENV@ is not set: launch with --secret @TOKEN_ENV@ (the nodes' Ray token)"
export @TOKEN_ENV@ RAY_AUTH_MODE=token
unset RAY_AUTH_TOKEN_PATH
# Ray's socket paths must stay under 107 bytes: a short, private directory (0700, a random name) of this node's own;
# Ray's temp dir is inside it, as Ray makes its own temp dir writable by all.
private=$(mktemp -d /tmp/grpo-ray.XXXXXXXX) || fail "cannot create a temp dir in /tmp for Ray"
temp_dir=$private/r
say "Ray's temp dir (its logs): $temp_dir"
ray_pid=
stop_ray() {  # this node's Ray only: the session `ray start --block` leads (its agents outlive a killed raylet)
  [ -n "$ray_pid" ] || return 0
  kill -TERM "$ray_pid" 2>/dev/null
  for _ in $(seq 1 40); do  # up to 20 s for ray start to stop what it started (then a zombie, or gone)
    case $(sed 's/.*) //' "/proc/$ray_pid/stat" 2>/dev/null | cut -c1) in Z | "") break ;; esac
    sleep 0.5
  done
  kill -KILL -- "-$ray_pid" 2>/dev/null
  wait "$ray_pid" 2>/dev/null
  ray_pid=
}
trap stop_ray EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
start_ray() {  # in a session of its own, so that stop_ray can reach every process it starts and nothing else
  RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0 @RAY_NODE_ENV@ \
    "$py" -c 'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' \
    "$py" -m ray.scripts.scripts start --block --disable-usage-stats --temp-dir "$temp_dir" \
    --node-ip-address "$node_ip" --num-gpus "$gpus" --dashboard-agent-listen-port @AGENT_PORT@ "$@" &
  ray_pid=$!
}
[ -n "$head_ip" ] && [ -n "$node_ip" ] || fail "SKYPILOT_NODE_IPS has no line $((rank + 1)) for rank $rank"
"$py" -c "import ray, grpo_launch" 2>/dev/null ||
  fail "$py cannot import ray and grpo_launch: the setup installs grpo-launch with its ray extra"

if [ "$rank" = 0 ]; then
  say "starting the Ray head on $head_ip:$port"
  start_ray --head --port "$port" --ray-client-server-port "${@CLIENT_PORT_ENV@:-@CLIENT_PORT@}"
  "$py" - "$head_ip:$port" "$nodes" "$join_timeout" "$ray_pid" <<'PY' || exit 1
import os, sys, time
address, want, timeout, ray_pid = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
deadline, joined, said = time.monotonic() + timeout, 0, 0.0
import ray
while True:
    try:
        os.kill(ray_pid, 0)
    except OSError:
        sys.exit(f"[grpo-launch sky] error: the Ray head on {address} stopped while starting (see its log above)")
    try:
        if not ray.is_initialized():
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        joined = sum(1 for n in ray.nodes() if n["Alive"])
    except Exception:  # noqa: BLE001 - the head is still starting
        pass
    if joined >= want:
        print(f"[grpo-launch sky] all {want} node(s) joined the Ray head {address}", flush=True)
        break
    if time.monotonic() > deadline:
        sys.exit(f"[grpo-launch sky] error: {joined} of {want} node(s) joined the Ray head {address} in "
                 f"{timeout:.0f} s: see the other nodes' logs (sky logs CLUSTER), or raise "
                 "@JOIN_TIMEOUT_ENV@")
    if time.monotonic() - said > 15:
        print(f"[grpo-launch sky] waiting for nodes: {joined} of {want} joined", flush=True)
        said = time.monotonic()
    time.sleep(1)
ray.shutdown()
PY
  "$py" -m grpo_launch @RUN@ --ray "$head_ip:$port"
  code=$?
  say "grpo-launch exited with $code; stopping this node's Ray"
  stop_ray
  exit "$code"
fi

say "waiting for the Ray head on $head_ip:$port"
waited=0
until port_open "$head_ip" "$port"; do
  [ "$waited" -lt "$join_timeout" ] || fail "the Ray head $head_ip:$port did not answer within $join_timeout s"
  sleep 1; waited=$((waited + 1))
done
start_ray --address "$head_ip:$port"
say "joined; staying until the head's Ray stops"
while sleep 2; do
  if ! port_open "$head_ip" "$port"; then
    sleep 2
    port_open "$head_ip" "$port" && continue
    say "the head's Ray stopped (the run ended there); stopping this node's Ray"
    stop_ray
    exit 0
  fi
  kill -0 "$ray_pid" 2>/dev/null || { ray_pid=; fail "this node's Ray stopped while the head's is up"; }
done
"""

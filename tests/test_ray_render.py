"""The Ray backend without a cluster: what it refuses before anything starts (an address that does not answer, a
dashboard address, a Ray outside the supported range or none), how it places the plan's processes (pure), how a
lost actor is classified, and that planning never imports Ray."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_launch.backends.ray import RayBackend, host_bundles, pg_name
from grpo_launch.enums import FailureKind
from grpo_launch.errors import LaunchError
from grpo_launch.execute.faults import Event, diagnose
from grpo_launch.render.processes import all_processes
from grpo_launch.rundir.layout import RUN_ID_ENV
from grpo_launch.spec import RunContext

from .helpers import ROOT, free_port, plan_recipe


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_launch", *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, **(env or {})})  # fmt: skip


def test_an_address_that_does_not_answer_is_refused_before_anything_starts(tmp_path):
    port = free_port()  # nothing listens there
    run = tmp_path / "run"
    done = cli(str(ROOT / "recipes" / "tiny-cpu.yaml"), "--ray", f"127.0.0.1:{port}", "--run-dir", str(run))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in done.stderr and "ray start --head" in done.stderr
    assert not run.exists()


@pytest.mark.parametrize("address", ["http://10.0.0.1:8265", "ray://10.0.0.1:10001"])
def test_a_dashboard_or_client_address_is_refused_with_the_address_to_give(address):
    done = cli("plan", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--ray", address)
    assert done.returncode == 1 and "GCS address (HOST:PORT, e.g. 10.0.0.1:6379)" in done.stderr, done.stderr
    assert "ray-submit" in done.stderr


def test_ray_from_the_environment_is_used_when_set_and_refused_when_it_is_a_dashboard():
    done = cli("plan", str(ROOT / "recipes" / "tiny-cpu.yaml"), env={"RAY_ADDRESS": "http://127.0.0.1:8265"})
    assert done.returncode == 1 and "RAY_ADDRESS=http://127.0.0.1:8265" in done.stderr, done.stderr


def fake_ray(tmp_path: Path, body: str) -> dict[str, str]:
    """A `ray` package that is not Ray, first on the path: one environment holds one Ray, and an old or missing
    one cannot be installed beside it for a test."""
    pkg = tmp_path / "fake" / "ray"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return {"PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{ROOT / 'src'}"}  # this checkout's grpo-launch


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("__version__ = '2.9.3'\n", "Ray 2.9.3 is installed; grpo-launch's Ray backend supports Ray >=2.52,<3"),
        (
            "__version__ = '2.51.1'\n",
            "supports Ray >=2.52,<3: Ray before 2.52 lets anyone who reaches its dashboard "
            "run commands on the cluster (CVE-2025-62593)",
        ),
        ("__version__ = '3.1.0'\n", "Ray 3.1.0 is installed"),
        ("raise ImportError('No module named ray')\n", "pip install '.[ray]'"),
    ],
)
def test_a_ray_outside_the_supported_range_or_none_is_refused(tmp_path, body, said):
    done = cli("plan", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--ray", "127.0.0.1:1", env=fake_ray(tmp_path, body))
    assert done.returncode == 1 and said in done.stderr, done.stderr


def test_the_ray_floor_is_one_rule_that_pyproject_states_too(tmp_path):
    """Ray below 2.52 is refused (CVE-2025-62593, no token authentication) by the one check every Ray path runs
    (cluster.check_version); the `ray` extra in pyproject.toml asks for the same range; 2.52.0 passes the check."""
    import tomllib

    from grpo_launch.backends.ray.cluster import RAY_REQUIREMENT, check_version

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["ray"] == [RAY_REQUIREMENT] == ["ray[default]>=2.52,<3"]
    check_version("2.52.0")
    with pytest.raises(LaunchError, match="CVE-2025-62593"):
        check_version("2.51.9")


def test_each_process_is_placed_as_a_runner_in_its_hosts_bundle_with_secrets_on_stdin():
    """qwen7b-math on 2 × 8 H100: every process becomes a local runner of the Ray backend; bundles number each
    host's processes in plan order with the process's own GPUs; the remote command is the shim with the host's run
    marker; HF_TOKEN is named for stdin and its value is nowhere in the command."""
    plan = plan_recipe(ROOT / "recipes" / "qwen7b-math.yaml", "2x8xH100")
    backend = RayBackend("10.0.0.1:6379")
    ctx = RunContext(sys.executable, str(ROOT), {"HF_TOKEN": "hf_value_not_in_argv"}, print)
    bundles = host_bundles(plan)
    assert sum(len(b) for b in bundles.values()) == len(all_processes(plan))
    seen: dict[str, list[int]] = {}
    for spec in all_processes(plan):
        spec = spec.__class__(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__},
                                 "env": {**spec.env, RUN_ID_ENV: "rid"}})  # fmt: skip
        placed = backend.place(spec, plan, ctx)
        argv = list(placed.argv)
        cut = argv.index("--")
        opts = dict(zip(argv[3:cut:2], argv[4:cut:2], strict=False))
        host = spec.host or plan.topology.hosts[0].name
        assert argv[1:3] == ["-m", "grpo_launch.backends.ray.runner"] and opts["--pg"] == pg_name("rid", host)
        assert opts["--gpus"] == str(len(spec.gpus)) and opts["--planned"] == ",".join(spec.gpus)
        assert bundles[host][int(opts["--bundle"])][:2] == (spec.name, len(spec.gpus))
        seen.setdefault(host, []).append(int(opts["--bundle"]))
        assert argv[cut + 1 : cut + 7] == [sys.executable, "-m", "grpo_launch.node.shim", "--announce-pgid", "--guard",
                                           f"rid@{host}"]  # fmt: skip
        assert f"{RUN_ID_ENV}=rid@{host}" in argv and placed.remote_group and placed.env[RUN_ID_ENV] == f"rid@{host}"
        assert placed.stdin_env == ("HF_TOKEN",) and "--env-stdin" in argv[:cut]
        assert not any("hf_value_not_in_argv" in a for a in argv)
    assert {h: sorted(b) for h, b in seen.items()} == {h: list(range(len(b))) for h, b in bundles.items()}


def test_a_lost_actor_is_an_infrastructure_failure():
    line = ("ray.exceptions.ActorDiedError: the Ray actor running train@h2 on h2 died, or its node was lost: The "
            "actor died unexpectedly before finishing this task.")  # fmt: skip
    failure = diagnose([Event(1.0, "train@h2", line)], exits=[("train@h2", 255, None)])
    assert failure.kind == FailureKind.INFRA and failure.cause.startswith("ray.exceptions.ActorDiedError")


def test_planning_never_imports_ray():
    code = (
        "import sys; from grpo_launch.cli import main; "
        "rc = main(['plan', 'recipes/qwen7b-math.yaml', '--gpus', '2x8xH100']); "
        "assert rc == 0, rc; assert 'ray' not in sys.modules, 'ray imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_node_without_a_report_is_planned_from_rays_resources():
    """Ray's own view is the fallback: the node's GPU count and accelerator_type (H100, read in the GPU table)."""
    from grpo_launch.backends.ray.cluster import _host

    node = {"NodeManagerAddress": "10.0.0.7", "NodeManagerHostname": "gpu7",
            "Resources": {"GPU": 8.0, "CPU": 96.0, "accelerator_type:H100": 1.0, "node:10.0.0.7": 1.0}}  # fmt: skip
    host = _host(node, None, with_gpus=True)
    assert (host.name, host.address, host.cpus, len(host.gpus)) == ("gpu7", "10.0.0.7", 96, 8)
    from grpo_launch.machines.gpus import GIB, find_gpu_spec

    h100 = find_gpu_spec("H100")
    assert host.gpus[0].name == h100.name and host.gpus[0].memory_bytes == int(h100.memory_gib * GIB)
    reported = _host(node, {"node": "gpu7", "gpus": [["NVIDIA H100 80GB HBM3", 85_000_000_000]] * 4}, with_gpus=True)
    assert len(reported.gpus) == 8 and reported.gpus[0].name.startswith("H100")  # NVML saw fewer than Ray gives


def test_the_shim_gives_the_command_sigint_unblocked_and_default_whatever_its_parent_did():
    """A Ray worker's thread (the actor that starts each process) blocks SIGINT, and a blocked or ignored signal
    stays so across exec: without the shim's reset, the SIGINT that teardown forwards would not reach the command.
    The command reports whether SIGINT is blocked or ignored for it (/proc's masks)."""
    probe = (
        "import signal; st = dict(l.split(':', 1) for l in open('/proc/self/status')); "
        "bit = 1 << (signal.SIGINT - 1); "
        "print(bool(int(st['SigBlk'], 16) & bit), signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    )
    code = (
        "import signal, subprocess, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); "
        f"print(subprocess.run([sys.executable, '-m', 'grpo_launch.node.shim', '--', sys.executable, '-c', {probe!r}], "
        "capture_output=True, text=True).stdout.strip()); "
        f"print(subprocess.run([sys.executable, '-c', {probe!r}], capture_output=True, text=True).stdout.strip())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    # through the shim: neither blocked nor ignored; a bare child keeps both
    assert done.stdout.splitlines() == ["False False", "True True"], done.stdout + done.stderr


def test_ray_submit_reads_the_arguments_after_the_dashes_with_rays_own_parser():
    """``ray-submit … -- ARGS``: `ray job submit`'s options, read by its own click command, become the SDK's
    arguments; the ones ray-submit sets itself, a command, or an unknown option are refused by name."""
    from grpo_launch.backends.ray.submit import job_arguments

    client, submit = job_arguments(["--runtime-env-json", '{"env_vars": {"A": "1"}}', "--entrypoint-num-cpus", "1",
                                    "--metadata-json", '{"who": "me"}', "--headers", '{"X-A": "b"}'])  # fmt: skip
    assert submit == {"runtime_env": {"env_vars": {"A": "1"}}, "entrypoint_num_cpus": 1.0, "metadata": {"who": "me"}}
    assert client == {"headers": {"X-A": "b"}, "verify": True}
    for extra, said in ((["--address", "http://x:1"], "--address cannot be given there"),
                        (["--submission-id", "a"], "--submission-id cannot be given there"),
                        (["--no-such-option"], "No such option"),
                        (["echo", "hi"], "a command cannot be given there")):  # fmt: skip
        with pytest.raises(LaunchError, match=said):
            job_arguments(extra)


def test_ray_submit_dry_runs_from_a_gpu_spec_without_a_cluster(tmp_path, capsys, monkeypatch):
    """Issue 41: ``ray-submit --dry-run`` needed a live cluster (exit 1, "which Ray cluster?"), where sbatch and sky
    take a GPU spec. --gpus plans from the spec for a dry run; submitting with it is refused (the job needs the
    live cluster's plan)."""
    from grpo_launch.cli import main

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    argv = ["ray-submit", "recipes/qwen7b-math.yaml", "--gpus", "2x8xH100-80GB", "--run-dir", str(run)]
    assert main([*argv, "--dry-run"], environ={"HF_HUB_OFFLINE": "1"}) == 0
    out = capsys.readouterr().out
    assert "Plan: 2 × 8 × H100-80GB" in out and "exec " in out and "# batch pinned:" in out
    assert main(argv, environ={"HF_HUB_OFFLINE": "1"}) == 2
    assert "it is for --dry-run" in capsys.readouterr().err


def test_a_ray_cpu_node_shows_the_cpus_it_was_started_with():
    """Issue 41: ``inspect`` on a Ray cluster counted 1 CPU for a node started with 2 (the one training process a
    CPU node runs was stored as its CPUs). The node's CPUs are Ray's resource; its one process is its slots. Ray's
    node record as ray.nodes() gives it (data, not a cluster: tests/test_ray_placement.py probes a real one)."""
    from grpo_launch.backends.ray.cluster import _host
    from grpo_launch.cli.tables import topology_sections
    from grpo_launch.machines.topology import Topology
    from grpo_launch.planning.plan_types import Trace
    from grpo_launch.planning.roles import cpu_train_hosts
    from grpo_launch.recipe import build_recipe

    node = {"Resources": {"CPU": 2.0, "memory": 8e9, "node:10.0.0.2": 1.0}, "NodeManagerAddress": "10.0.0.2",
            "NodeManagerHostname": "h2", "NodeID": "ab" * 28, "Alive": True}  # fmt: skip
    host = _host(node, {"node": "h2", "memory_bytes": 8 * 2**30}, with_gpus=False)
    assert (host.cpus, host.slots) == (2, 1)
    topology = Topology((host, dataclasses.replace(host, name="h3", address="10.0.0.3")), "ray")
    row = dict(zip(topology_sections(topology)[0].header or (), topology_sections(topology)[0].rows[0], strict=True))
    assert row["CPUs"] == "2"
    recipe = build_recipe({"model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "use_cpu": True}, [])
    assert [h.processes for h in cpu_train_hosts(topology, recipe, Trace())] == [1, 1]  # one process per node


def test_a_submission_refused_for_a_head_agent_not_yet_up_is_sent_again(tmp_path):
    """Ray's own job SDK submits to a stand-in for a head's job server: a real head refuses jobs only in the seconds
    between ``ray start --head`` returning and its dashboard agent registering, which a test cannot hold open. The
    stand-in answers its version as a head does and refuses the first two submissions as JobHead.submit_job does then
    (HTTP 500, Ray 2.60's text; on a head's Python before 3.11, whose asyncio.TimeoutError is not the builtin one,
    the handler's traceback, with the cause in its last line): the third is accepted, once. A refusal of another kind
    is not sent again."""
    pytest.importorskip("ray.job_submission")
    import http.server
    import json
    import threading

    from grpo_launch.backends.ray.submit import RayJob, RaySubmitter, entrypoint_of
    from grpo_launch.backends.submission import Submission

    posts: list[dict] = []

    class JobServer(http.server.BaseHTTPRequestHandler):
        refuse_with = "No available agent to submit job, please try again later."

        def do_GET(self):
            self._answer(200, json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x"}))

        def do_POST(self):
            posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            if len(posts) == 1:
                self._answer(500, self.refuse_with)
            elif len(posts) == 2:
                frames = "".join(
                    f'  File "/opt/ray/lib/python3.10/site-packages/ray/dashboard/modules/job/job_head.py", line {n}, '
                    "in submit_job\n    job_agent_client = await self.get_target_agent()\n"
                    for n in (411, 292, 301, 308, 319)
                )
                self._answer(
                    500,
                    f"Traceback (most recent call last):\n{frames}TimeoutError: Failed to get head node agent within "
                    "30 seconds. The last exception is None",
                )
            else:
                self._answer(200, json.dumps({"job_id": "raysubmit_1", "submission_id": posts[-1]["submission_id"]}))

        def _answer(self, code: int, text: str) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), JobServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    said: list[str] = []
    try:
        submitter = RaySubmitter()
        submitter.job = RayJob(
            f"http://127.0.0.1:{server.server_port}", "grpo-x", entrypoint_of("/r/ray-job.sh"), {}, {}
        )
        ctx = RunContext(sys.executable, str(tmp_path), {}, said.append)
        assert submitter.submit(Submission("", "/r/ray-job.sh"), ctx) == "grpo-x"
        assert len(posts) == 3 and {p["submission_id"] for p in posts} == {"grpo-x"}
        assert len([line for line in said if "job agent is not up yet" in line]) == 2
        posts.clear()
        JobServer.refuse_with = "Traceback: ValueError: bad runtime_env"
        with pytest.raises(LaunchError, match="bad runtime_env"):
            submitter.submit(Submission("", "/r/ray-job.sh"), ctx)
        assert len(posts) == 1
    finally:
        server.shutdown()

"""The real vLLM CPU server (0.31, .venv-vllm) behind grpo-launch's guard (grpo_launch.node.vllm_guard, installed
with vLLM's ``--middleware``):

* bound to a veth address of this machine, with a second host made of a network namespace of this test's own
  (``grpo-guard-<pid>``, a private /30 in 10.231.0.0/16 that is routed nowhere, deleted at the end): without the
  token, from localhost and from the other host, every route vLLM registers (read from vLLM's own source, dev routes
  included) is refused but /health and GET /metrics (vLLM's Prometheus counters, for a scraper), which answer;
  with it, TRL's client generates from the other host and the routes TRL does not call stay refused;
* a real GRPO run (``grpo-launch run``, tests/cpu_server_trainer.py: the real training entry with TRL's NCCL
  transfer made a no-op, since NCCL needs CUDA) trains through the guarded server (the weights change), while its
  control plane refuses a client without the token; the attempt's token is in no file of the run directory, no
  process's argv and not in the launcher's output.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from grpo_launch.render.processes import vllm_server as render_vllm_command
from grpo_launch.rundir.layout import RUN_DIR_ENV, VLLM_TOKEN_ENV
from grpo_launch.spec import ProcessSpec

from .helpers import ROOT, VLLM_PY, free_port, require_vllm
from .test_adapt_run import fake_nvml, records, server_recipe
from .test_vllm_server import _server_plan, _supervise

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# The endpoints issue 37 names: refused without the token.
NAMED = [("POST", "/collective_rpc"), ("POST", "/init_weight_transfer_engine"), ("POST", "/update_weights"),
         ("POST", "/pause"), ("POST", "/sleep"), ("POST", "/v1/completions"), ("GET", "/server_info")]  # fmt: skip

PROBE = textwrap.dedent(
    """
    import json, os, sys, urllib.error, urllib.request
    base, asked = sys.argv[1], json.loads(sys.argv[2])
    token = os.environ.get("GRPO_LAUNCH_VLLM_TOKEN") if "--token" in sys.argv else None
    out = {}
    for method, path in asked:
        headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + token} if token else {})}
        data = b"{}" if method == "POST" else None
        try:
            asking = urllib.request.Request(base + path, data, headers, method=method)
            with urllib.request.urlopen(asking, timeout=60) as r:
                out[method + " " + path] = r.status
        except urllib.error.HTTPError as e:
            out[method + " " + path] = e.code
    print(json.dumps(out))
    """
)

CLIENT = textwrap.dedent(
    """
    import json, os, sys
    from trl.generation.vllm_client import VLLMClient
    from grpo_launch.train.server_auth import guard_clients
    guard_clients(sys.argv[1], os.environ["GRPO_LAUNCH_VLLM_TOKEN"])
    client = VLLMClient(base_url=sys.argv[1], connection_timeout=60)
    out = client.generate(["What is 1 + 1?"], n=2, max_tokens=4, temperature=1.0)
    print(json.dumps({"completions": out["completion_ids"], "world_size": client.get_world_size()}))
    """
)

# Run as the supervised "trainer": the probes from here and from the namespace host, then TRL's client there.
DRIVER = textwrap.dedent(
    """
    import json, subprocess, sys, time, urllib.request
    probe, client, base, ns, asked, allowed, out = sys.argv[1:8]
    def run(*argv):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{argv} failed: {done.stderr[-3000:]}")
        return json.loads(done.stdout)
    for _ in range(400):  # the supervisor starts the trainers beside the server: wait for it as TRL does
        try:
            urllib.request.urlopen(base + "/health", timeout=5)
            break
        except OSError:
            time.sleep(1)
    there = ["ip", "netns", "exec", ns, sys.executable]
    json.dump({
        "local": run(sys.executable, probe, base, asked),
        "remote": run(*there, probe, base, asked),
        "remote_token": run(*there, probe, base, allowed, "--token"),
        "client": run(*there, client, base),
    }, open(out, "w"))
    """
)


def vllm_routes() -> list[tuple[str, str]]:
    """Every route vLLM 0.31's API server can register, read from its source (routers and the app): the paths of
    ``@router.get("/…")``-style decorators and ``add_api_route``/``api_route`` calls, placeholders filled."""
    found = subprocess.run([str(VLLM_PY), "-c", "import vllm, os; print(os.path.dirname(vllm.__file__))"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    pattern = re.compile(r"""\.(get|post|put|delete|api_route|add_api_route)\(\s*["'](/[^"']*)["']""")
    routes = set()
    for source in Path(found, "entrypoints").rglob("*.py"):
        for verb, path in pattern.findall(source.read_text(errors="replace")):
            method = "POST" if verb in ("post", "api_route", "add_api_route") else verb.upper()
            routes.add((method, re.sub(r"\{[^}]*\}", "x", path)))
    assert {("POST", "/collective_rpc"), ("POST", "/sleep"), ("POST", "/update_weights")} <= routes
    return sorted(routes)


@contextlib.contextmanager
def namespace_host() -> Iterator[tuple[str, str, str]]:
    """(namespace, this machine's address, the namespace's address): a second host on a veth pair, a /30 of this
    test's own (10.231.N.0/30), removed at the end whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("a network namespace needs root")
    pid = os.getpid()
    ns, here, there = f"grpo-guard-{pid}", f"ggh{pid}"[:15], f"ggn{pid}"[:15]
    net = f"10.231.{pid % 250 + 1}"
    local, remote = f"{net}.{(pid // 250) % 60 * 4 + 1}", f"{net}.{(pid // 250) % 60 * 4 + 2}"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    try:
        ip("netns", "add", ns)
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", ns)
        ip("addr", "add", f"{local}/30", "dev", here)
        ip("link", "set", here, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{remote}/30", "dev", there)
        ip("netns", "exec", ns, "ip", "link", "set", there, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, local, remote
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_guarded_server_answers_only_its_token_from_any_host(tmp_path):
    require_vllm()
    routes = vllm_routes()
    opened = [("GET", "/health"), ("GET", "/metrics")]
    asked = [r for r in routes if r not in opened] + NAMED + opened
    with_token = [("GET", "/server_info"), ("GET", "/v1/models"), ("POST", "/collective_rpc"), ("POST", "/sleep"),
                  ("POST", "/abort_requests"), ("POST", "/wake_up"), ("GET", "/openapi.json")]  # fmt: skip
    with namespace_host() as (ns, local, _remote):
        port = free_port()
        plan = _server_plan(tmp_path, port, vllm_host=local)
        server = render_vllm_command(plan)
        assert server is not None and list(server.argv)[list(server.argv).index("--host") + 1] == local
        for name, text in (("probe.py", PROBE), ("client.py", CLIENT), ("driver.py", DRIVER)):
            (tmp_path / name).write_text(text)
        result = tmp_path / "result.json"
        base = f"http://{local}:{port}"
        driver = ProcessSpec("train", (str(VLLM_PY), str(tmp_path / "driver.py"), str(tmp_path / "probe.py"),
                                       str(tmp_path / "client.py"), base, ns, json.dumps(asked),
                                       json.dumps(with_token), str(result)))  # fmt: skip
        lines: list[str] = []
        outcome = _supervise(tmp_path, server, driver, port, lines.append, health_url=f"{base}/health")
    assert outcome.exit_code == 0, "\n".join(lines[-40:]) + f"\n{outcome}"
    data = json.loads(result.read_text())
    for where in ("local", "remote"):
        got = data[where]
        assert got.pop("GET /health") == 200
        assert got.pop("GET /metrics") == 200  # vLLM's Prometheus counters: a scraper holds no token (issue 40)
        assert {k: v for k, v in got.items() if v != 401} == {}, where  # every other route: no token, no answer
        assert all(f"{m} {p}" in got for m, p in NAMED)
    token = data["remote_token"]
    assert token["GET /server_info"] == 200 and token["GET /v1/models"] == 200
    for refused in ("POST /collective_rpc", "POST /sleep", "POST /abort_requests", "POST /wake_up",
                    "GET /openapi.json"):  # fmt: skip
        assert token[refused] == 403, (refused, token)
    assert len(data["client"]["completions"]) == 2 and data["client"]["world_size"] == 1


def _token_of(run: Path, deadline: float) -> str:
    """The attempt's token, read where it lives: the environment of the run's trainer processes."""
    marker = f"{RUN_DIR_ENV}={run}".encode()
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                env = (proc / "environ").read_bytes().split(b"\0")
                if marker in env:
                    for entry in env:
                        if entry.startswith(f"{VLLM_TOKEN_ENV}=".encode()):
                            return entry.split(b"=", 1)[1].decode()
        time.sleep(1)
    raise AssertionError("no trainer process of the run carried the token")


def _in_argv(token: str) -> list[str]:
    hits = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if token.encode() in (proc / "cmdline").read_bytes():
                hits.append(proc.name)
    return hits


def _wait_healthy(base: str, deadline: float) -> None:
    import urllib.request

    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(f"{base}/health", timeout=5).status == 200:
                return
        time.sleep(2)
    raise AssertionError("the run's vLLM server never became healthy")


@pytest.mark.extended
def test_a_real_grpo_run_trains_through_the_guard_and_the_token_stays_secret(tmp_path):
    """The real launcher, server and trainers (3 simulated L4s: the server on one, two trainer ranks). While it
    runs, a client without the token is refused by its control plane; after it, the weights have moved."""
    require_vllm()
    recipe = server_recipe(tmp_path / "guard.yaml", learning_rate=1e-5, max_steps=4, adapt=False)
    values = yaml.safe_load(recipe.read_text())
    values |= {"num_generations": 4, "per_device_train_batch_size": 4}
    recipe.write_text(yaml.safe_dump(values))
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": f"{fake_nvml(tmp_path)}:{ROOT / 'src'}"}
    env.pop(VLLM_TOKEN_ENV, None)
    argv = [str(VLLM_PY), "-m", "grpo_launch", "run", str(recipe), "--run-dir", str(run)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        token = _token_of(run, deadline)
        base = f"http://127.0.0.1:{values['launch']['vllm_port']}"
        _wait_healthy(base, deadline)
        (tmp_path / "probe.py").write_text(PROBE)
        probe = [str(VLLM_PY), str(tmp_path / "probe.py"), base]
        without = json.loads(subprocess.run([*probe, json.dumps(NAMED)], capture_output=True, text=True,
                                            check=True, env={"PATH": os.environ["PATH"]}).stdout)  # fmt: skip
        assert set(without.values()) == {401}, without
        assert _in_argv(token) == []
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-5000:]
    steps = [r["step"] for r in records(run / "metrics.jsonl") if "step_s" in r]
    assert steps == [1, 2, 3, 4], steps
    assert token not in out
    for path in run.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
    from safetensors.torch import load_file

    before = load_file(str(Path(values["model_name_or_path"]) / "model.safetensors"))
    after = load_file(str(run / "output" / "model.safetensors"))
    moved = [k for k in before if k in after and not (before[k].float() == after[k].float()).all()]
    assert moved, "no weight changed: the run did not train"

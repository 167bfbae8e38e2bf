"""The vLLM server's guard (grpo_launch.node.vllm_guard) as an ASGI app in front of a tiny ASGI app, the token on
TRL's clients (grpo_launch.train.server_auth against a real local HTTP server), the server's argv and bind address,
and the refusal of vLLM's own --api-key. The real server behind the guard: tests/test_vllm_guard_server.py."""

from __future__ import annotations

import asyncio
import hmac
import http.server
import subprocess
import sys
import threading

import pytest

from grpo_launch.models.builtin import find_model_shape
from grpo_launch.node import vllm_guard
from grpo_launch.node.vllm_guard import ALLOWED, OPEN, VllmGuard
from grpo_launch.render.processes import GUARD_MIDDLEWARE, all_processes
from grpo_launch.render.processes import vllm_server as render_vllm_command
from grpo_launch.rundir.layout import RUN_ID_ENV, VLLM_TOKEN_ENV
from grpo_launch.train.server_auth import guard_clients, origin

from .helpers import ROOT, plan_recipe

TOKEN = "t0k-en_for-tests"
QWEN = "Qwen/Qwen2.5-1.5B-Instruct"
# The dev and control routes of vLLM 0.31 that TRL never calls, and inference TRL does not use.
REFUSED = [("POST", "/collective_rpc"), ("POST", "/sleep"), ("POST", "/wake_up"), ("POST", "/abort_requests"),
           ("POST", "/metrics"), ("POST", "/tokenize"), ("GET", "/docs"), ("POST", "/v1/responses"),
           ("GET", "/is_sleeping"), ("POST", "/scale_elastic_ep"), ("GET", "/health/"),
           ("POST", "/health")]  # fmt: skip


async def _inner(scope, receive, send):
    """The app behind the guard: 200 with the path, so a passed request is told from a refused one."""
    if scope["type"] == "lifespan":
        await send({"type": "lifespan.startup.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": scope["path"].encode()})


def _call(method: str, path: str, headers: list[tuple[bytes, bytes]] = (), kind: str = "http") -> list[dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    guard = VllmGuard(_inner, token=TOKEN)
    scope = {"type": kind, "method": method, "path": path, "headers": list(headers)}
    asyncio.run(guard(scope, receive, send))
    return sent


def _status(method: str, path: str, token: str | None = TOKEN, scheme: bytes = b"Bearer") -> int:
    headers = [(b"authorization", scheme + b" " + token.encode())] if token is not None else []
    return _call(method, path, headers)[0]["status"]


@pytest.mark.parametrize(("method", "path"), sorted(ALLOWED))
def test_trl_endpoints_pass_with_the_token_only(method, path):
    assert _status(method, path) == 200
    assert _status(method, path, token=None) == 401
    assert _status(method, path, token=TOKEN + "x") == 401
    assert _status(method, path, token=TOKEN[:-1]) == 401
    assert _status(method, path, scheme=b"Basic") == 401


@pytest.mark.parametrize(("method", "path"), REFUSED)
def test_other_routes_are_refused_even_with_the_token(method, path):
    assert _status(method, path, token=None) == 401
    assert _status(method, path) == 403


def test_health_answers_without_the_token():
    assert {("GET", "/health"), ("GET", "/metrics")} == OPEN
    assert _status("GET", "/health", token=None) == 200
    # vLLM's Prometheus counters: read-only and open, so a scraper needs no per-attempt token (issue 40)
    assert _status("GET", "/metrics", token=None) == 200


def test_websocket_is_closed_and_lifespan_passes():
    assert _call("GET", "/v1/realtime", [(b"authorization", b"Bearer " + TOKEN.encode())], kind="websocket") == [
        {"type": "websocket.close", "code": 1008}
    ]
    assert _call("", "", kind="lifespan") == [{"type": "lifespan.startup.complete"}]


def test_the_token_is_compared_in_constant_time(monkeypatch):
    compared = []
    real = hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(vllm_guard.hmac, "compare_digest", spy)
    assert _status("POST", "/update_weights", token="wrong") == 401
    assert compared == [(b"wrong", TOKEN.encode())]


def test_no_token_no_server(monkeypatch):
    """Fail closed: the guard is built (on the server's start) only with a token in the environment."""
    monkeypatch.delenv(VLLM_TOKEN_ENV, raising=False)
    with pytest.raises(RuntimeError, match=VLLM_TOKEN_ENV):
        VllmGuard(_inner)
    monkeypatch.setenv(VLLM_TOKEN_ENV, TOKEN)
    assert VllmGuard(_inner).token == TOKEN.encode()


def test_guard_imports_with_the_standard_library_only():
    """It runs inside the vLLM server's Python: importing it loads neither a web framework nor torch."""
    code = (
        "import sys, grpo_launch.node.vllm_guard as g; "
        "bad = [m for m in ('starlette', 'fastapi', 'torch', 'yaml', 'requests') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src")})


def test_server_argv_has_the_guard_and_no_token():
    plan = plan_recipe({"model_name_or_path": QWEN, "num_generations": 8, "launch": {"vllm": "server"}}, "4xL20-48GB")
    spec = render_vllm_command(plan)
    argv = list(spec.argv)
    assert argv[argv.index("--middleware") + 1] == GUARD_MIDDLEWARE == "grpo_launch.node.vllm_guard.VllmGuard"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    for p in all_processes(plan):  # the token is the attempt's, added to the environment at run time only
        assert VLLM_TOKEN_ENV not in p.env and not any(VLLM_TOKEN_ENV in a for a in p.argv)


def test_across_hosts_the_server_binds_its_own_cluster_address():
    """Hosts known by IP: the server host's, where the trainers reach it. Hosts known by name: every interface (a
    name may resolve to loopback on its own host), the guard then the only lock."""
    from dataclasses import replace

    from grpo_launch.machines.topology import parse_gpu_spec
    from grpo_launch.planning import make_plan
    from grpo_launch.recipe import build_recipe

    recipe = build_recipe({"model_name_or_path": QWEN, "num_generations": 8, "launch": {"vllm": "server"}})
    named = parse_gpu_spec("2x8xH100-80GB")
    by_ip = replace(named, hosts=tuple(replace(h, address=f"10.1.0.{i + 1}") for i, h in enumerate(named.hosts)))
    for topology, bound in ((by_ip, None), (named, "0.0.0.0")):
        plan = make_plan(topology, recipe, find_model_shape(QWEN))
        host = next(h for h in plan.topology.hosts if h.name == plan.vllm.host)
        assert plan.vllm.address == host.addr
        assert plan.vllm.bind_host == (bound or host.addr)
        argv = list(render_vllm_command(plan).argv)
        assert argv[argv.index("--host") + 1] == plan.vllm.bind_host
    assert plan_recipe(
        {"model_name_or_path": QWEN, "launch": {"vllm": "server", "vllm_host": "10.9.9.9"}}, "8xH100-80GB"
    ).vllm.bind_host == ("10.9.9.9")


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("launch.vllm_extra_args=[--api-key, sk-abc]", "launch.vllm_extra_args sets --api-key"),
        ("launch.vllm_extra_args=[--api-key=sk-abc]", "launch.vllm_extra_args sets --api-key"),
        ("launch.vllm_env={VLLM_API_KEY: sk-abc}", "launch.vllm_env sets VLLM_API_KEY"),
    ],
)
def test_vllm_api_key_is_refused_at_plan_time(override, named):
    done = subprocess.run(
        [sys.executable, "-m", "grpo_launch", "plan", str(ROOT / "recipes" / "qwen1.5b.yaml"), "--gpus",
         "8xH100-80GB", override],
        capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and "TRL's clients do not send it" in done.stderr
    assert "sk-abc" not in done.stdout


class _Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.headers.get("Authorization") or "-").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_trl_clients_carry_the_token_to_the_server_only():
    """guard_clients on a real requests stack against two real local servers: the server's origin gets the token
    (Session and requests.get alike, as TRL's sync and async clients call), the other none."""
    import requests

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    base, other = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
    original = requests.Session.request
    try:
        guard_clients(base, TOKEN)
        guard_clients(base, TOKEN)  # a second call replaces the wrapper, never stacks it
        assert requests.Session().get(f"{base}/v1/models").text == f"Bearer {TOKEN}"
        assert requests.get(f"{base}/server_info", timeout=5).text == f"Bearer {TOKEN}"
        assert requests.get(f"{other}/v1/models", timeout=5).text == "-"
    finally:
        requests.Session.request = original
        for s in servers:
            s.shutdown()
    assert origin("http://Host:80/x") == origin("http://host") == ("http", "host", 80)


def test_the_async_rollout_session_carries_the_token(monkeypatch):
    """TRL's rollout loop sets ``self.session`` in ``_run_loops``; the guarded loop puts the token on it."""
    pytest.importorskip("aiohttp")
    import aiohttp

    from grpo_launch.train import async_auth

    monkeypatch.setenv(VLLM_TOKEN_ENV, TOKEN)
    loop = object.__new__(async_auth.GuardedRolloutLoop)

    async def opened():
        async with aiohttp.ClientSession() as session:
            loop.session = session
            return dict(loop.session.headers)

    assert asyncio.run(opened())["Authorization"] == f"Bearer {TOKEN}"
    monkeypatch.setattr(async_auth.worker.AsyncRolloutWorker, "_loop_cls", async_auth.worker._AsyncRolloutLoop)
    async_auth.use_guarded_loop()
    assert async_auth.worker.AsyncRolloutWorker._loop_cls is async_auth.GuardedRolloutLoop


def test_the_token_travels_to_remote_hosts_on_stdin_like_hf_token(tmp_path):
    """ssh and Ray name it for stdin (backends.remote.PASSED_ENV), and the real shim (node/shim.py --env-stdin)
    hands it to the process; it is in no argv, command line or printed command."""
    import json
    from dataclasses import replace

    from grpo_launch.backends.ray import RayBackend
    from grpo_launch.backends.remote import passed_env_names
    from grpo_launch.backends.ssh import SshOptions, remote_command, ssh_spec
    from grpo_launch.spec import ProcessSpec, RunContext

    secret = "tok_value_not_in_argv"
    assert passed_env_names({VLLM_TOKEN_ENV: secret, "PATH": "/b"}) == (VLLM_TOKEN_ENV,)
    show = f"import os, json; print(json.dumps(os.environ[{VLLM_TOKEN_ENV!r}]))"
    spec = ProcessSpec(name="vllm@h1", argv=(sys.executable, "-c", show), host="h1")
    line = remote_command(spec, python=sys.executable, workdir=str(tmp_path), gpu_positions=None, stdin_env=True)
    stdin = f"{VLLM_TOKEN_ENV}={json.dumps(secret)}\n\n"
    env = {"PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(["sh", "-c", line], input=stdin, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == secret and secret not in line
    wrapped = ssh_spec(spec, SshOptions(port=22), python="/v/python", workdir="/w", stdin_env=(VLLM_TOKEN_ENV,))
    assert wrapped.stdin_env == (VLLM_TOKEN_ENV,) and secret not in wrapped.shell()
    plan = plan_recipe({"model_name_or_path": QWEN, "num_generations": 8, "launch": {"vllm": "server"}}, "2x8xH100")
    ctx = RunContext(sys.executable, str(ROOT), {VLLM_TOKEN_ENV: secret}, print)
    server = render_vllm_command(plan)
    assert server is not None
    server = replace(server, env={**server.env, RUN_ID_ENV: "rid"})
    placed = RayBackend("10.0.0.1:6379").place(server, plan, ctx)
    assert placed.stdin_env == (VLLM_TOKEN_ENV,) and not any(secret in a for a in placed.argv)


SERVER_OWN = [
    (["--host", "0.0.0.0"], "--host", "host"),
    (["--host=0.0.0.0"], "--host", "host"),
    (["--port", "9000"], "--port", "port"),
    (["--uds", "/tmp/vllm.sock"], "--uds", "uds"),
    (["--grpc"], "--grpc", "grpc"),
    (["--grp"], "--grp (vLLM reads it as --grpc)", "grpc"),
    (["--middleware", "my.Mw"], "--middleware", "middleware"),
    (["--middleware=my.Mw"], "--middleware", "middleware"),
    (["--root-path", "/x"], "--root-path", "root_path"),
    (["--root_path=/x"], "--root_path", "root_path"),
]


@pytest.mark.parametrize(("args", "named", "dest"), SERVER_OWN, ids=lambda v: str(v))
def test_server_flags_that_bypass_the_guard_or_the_planned_address_are_refused(args, named, dest):
    """--host, --grpc (a gRPC server the HTTP guard does not cover), --middleware and --root-path were accepted in
    launch.vllm_extra_args, which come last on the server's command line, where argparse keeps the last value."""
    from grpo_launch.errors import ConfigError
    from grpo_launch.recipe import build_recipe

    with pytest.raises(ConfigError) as err:
        build_recipe({"model_name_or_path": QWEN, "launch": {"vllm": "server", "vllm_extra_args": args}})
    said = "\n".join(err.value.problems)
    assert f"launch.vllm_extra_args sets {named}:" in said and "Remove it" in said, said
    plan_recipe({"model_name_or_path": QWEN, "launch": {"vllm": "server", "vllm_extra_args": ["--enforce-eager"]}},
                "8xH100-80GB")  # fmt: skip


def test_vllms_own_parser_reads_each_refused_form_as_the_flag_it_names():
    """vLLM 0.31's serve parser (the oracle): each refused form, abbreviations and underscores included, sets the
    option the refusal names (argparse expands unique prefixes; vLLM turns underscores into dashes)."""
    import json

    from .helpers import VLLM_PY, require_vllm

    require_vllm()
    code = (
        "import json, sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "parser = make_arg_parser(FlexibleArgumentParser())\n"
        "base = vars(parser.parse_args([]))\n"
        "out = []\n"
        "for args, dest in json.loads(sys.argv[1]):\n"
        "    out.append(vars(parser.parse_args(args))[dest] != base[dest])\n"
        "print(json.dumps(out))\n"
    )
    cases = [[args, dest] for args, _, dest in SERVER_OWN]
    done = subprocess.run([str(VLLM_PY), "-c", code, json.dumps(cases)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True] * len(cases)


def test_a_vllm_api_key_in_the_users_environment_does_not_reach_the_server():
    """A VLLM_API_KEY exported in the launcher's environment reached vLLM's server (processes inherit the parent's
    environment), which then answered every TRL request with 401. The server's environment empties it, and vLLM's
    own middleware registration (the oracle) then installs no key check; pass_env cannot bring it back."""
    import json

    from grpo_launch.errors import ConfigError
    from grpo_launch.recipe import build_recipe

    from .helpers import VLLM_PY, require_vllm

    plan = plan_recipe({"model_name_or_path": QWEN, "launch": {"vllm": "server"}}, "8xH100-80GB")
    servers = [p for p in all_processes(plan) if p.role == "vllm"]
    assert servers and all(p.launch_env["VLLM_API_KEY"] == "" for p in servers)
    assert all(p.role == "vllm" or "VLLM_API_KEY" not in p.env for p in all_processes(plan))
    assert "VLLM_API_KEY=''" in servers[0].shell()  # shown as it is: an empty value is no secret
    with pytest.raises(ConfigError, match=r"launch\.pass_env names VLLM_API_KEY"):
        build_recipe({"model_name_or_path": QWEN, "launch": {"pass_env": ["VLLM_API_KEY"]}})

    require_vllm()
    argv = list(servers[0].argv)
    code = (
        "import json, os, sys\n"
        "from fastapi import FastAPI\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.entrypoints.serve.middleware.register import init_entrypoints_middleware\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "args = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))\n"
        "app = FastAPI()\n"
        "init_entrypoints_middleware(args, app, ())\n"
        "print(json.dumps([m.cls.__name__ for m in app.user_middleware]))\n"
    )
    flags = argv[argv.index("--host") :]
    user = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "VLLM_API_KEY": "sk-users-own-key"}
    middleware = {}
    for name, env in (("inherited", user), ("planned", {**user, **servers[0].launch_env})):
        done = subprocess.run([str(VLLM_PY), "-c", code, json.dumps(flags)], capture_output=True, text=True,
                              timeout=300, cwd=ROOT, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        middleware[name] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "AuthenticationMiddleware" in middleware["inherited"]  # the user's key alone turns vLLM's check on
    assert "AuthenticationMiddleware" not in middleware["planned"], middleware

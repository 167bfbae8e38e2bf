"""Supervision with real processes: small Python programs stand in for the vLLM server and the trainers (a real
server-mode run needs CUDA for TRL's NCCL weight sync), each spawning a grandchild as vLLM and torchrun do."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grpo_launch.enums import RunState
from grpo_launch.execute.faults import root_cause
from grpo_launch.execute.session import SessionSpec, supervise
from grpo_launch.execute.supervisor import POLL_S
from grpo_launch.spec import ProcessSpec

from .helpers import ROOT, SLACK_S, alive, free_port, pids_in, write_scripts


def _specs(tmp_path, server_mode: str, trainer_mode: str):
    server, trainer = write_scripts(tmp_path)
    port = free_port()
    pids = tmp_path / "pids"
    srv = ProcessSpec("vllm", (sys.executable, str(server), str(port), str(pids), server_mode))
    url = f"http://127.0.0.1:{port}/health"
    trn = ProcessSpec("train", (sys.executable, str(trainer), str(pids), trainer_mode, url))
    return srv, trn, url, pids


def _run(tmp_path, srv, trn, url, *, timeout=20.0, grace=5.0, lines=None):
    out = lines if lines is not None else []
    session = SessionSpec(srv, [trn], tmp_path / "logs", health_url=url, health_timeout_s=timeout, grace_s=grace)
    return supervise(session, environ={"PATH": "/usr/bin:/bin"}, emit=out.append)


def _all_gone(pids, within=5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_trainer_success_stops_server(tmp_path):
    srv, trn, url, pids = _specs(tmp_path, "ok", "ok")
    lines: list[str] = []
    result = _run(tmp_path, srv, trn, url, lines=lines)
    assert result.state == RunState.SUCCEEDED and result.exit_code == 0
    assert any("vLLM server healthy" in line for line in lines)
    assert any(line.startswith("[train] trainer started") for line in lines)
    assert len(pids_in(pids)) == 4 and _all_gone(pids_in(pids))
    logs = {p.name.split("-")[0] for p in (tmp_path / "logs").iterdir()}
    assert logs == {"vllm", "train"}


def test_trainer_failure_stops_server_and_names_root_cause(tmp_path):
    srv, trn, url, pids = _specs(tmp_path, "ok", "fail")
    result = _run(tmp_path, srv, trn, url)
    assert result.state == RunState.FAILED and result.exit_code == 1 and result.failed_process == "train"
    assert "train failed (exit code 3)" in result.message
    assert "root cause: [train] ValueError: boom in the trainer" in result.detail
    assert result.failure.kind == "user" and result.cause == "[train] ValueError: boom in the trainer"
    assert _all_gone(pids_in(pids))


def test_server_death_stops_the_trainer_at_the_next_poll(tmp_path):
    """The server exits 1.5 s after its start (helpers.SERVER's die-after-1s): the trainer (which exits on SIGTERM)
    is stopped at the next poll, without waiting out the grace period."""
    srv, trn, url, pids = _specs(tmp_path, "die-after-1s", "sleep")
    lines: list[str] = []
    t0 = time.monotonic()
    result = _run(tmp_path, srv, trn, url, lines=lines, grace=30.0)
    took = time.monotonic() - t0
    assert result.state == RunState.FAILED and result.failed_process == "vllm"
    assert not [line for line in lines if "grace: SIGKILL" in line], lines
    assert took < 1.5 + POLL_S + SLACK_S < 30.0  # a wait for the 30 s grace period would fail it
    assert _all_gone(pids_in(pids))


def test_server_never_healthy_times_out(tmp_path):
    srv, trn, url, pids = _specs(tmp_path, "never-healthy", "sleep")
    result = _run(tmp_path, srv, trn, url, timeout=2)
    assert result.state == RunState.FAILED and re.search(r"not healthy .* within 2 s", result.message)
    assert _all_gone(pids_in(pids))


def test_child_ignoring_sigterm_is_killed_after_grace(tmp_path):
    srv, trn, url, pids = _specs(tmp_path, "ok", "ignore-term")
    lines: list[str] = []
    driver = textwrap.dedent(
        f"""
        import sys, threading, os, signal, time
        sys.path.insert(0, {str(ROOT / "src")!r})
        from pathlib import Path
        from grpo_launch.execute.session import SessionSpec, supervise
        from grpo_launch.spec import ProcessSpec
        srv = ProcessSpec("vllm", {tuple(srv.argv)!r})
        trn = ProcessSpec("train", {tuple(trn.argv)!r})
        logs, sent = Path({str(tmp_path / "logs")!r}), []
        def term():  # 2 s in, once the trainer said it started (it ignores SIGTERM from then on)
            time.sleep(2.0)
            while not any("trainer started" in f.read_text() for f in logs.glob("train-*.log")):
                time.sleep(0.05)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=term, daemon=True).start()
        session = SessionSpec(srv, [trn], logs, health_url={url!r}, health_timeout_s=60, grace_s=1.5)
        code = supervise(session, environ=dict(os.environ), emit=print).exit_code
        print("EXIT", code, "TOOK", round(time.monotonic() - sent[0], 1), flush=True)
        sys.exit(code)
        """
    )
    proc = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stdout + proc.stderr
    # the trainer ignored SIGTERM and was killed after the grace period (1.5 s, printed rounded)
    assert "[grpo-launch] train still running after 2 s grace: SIGKILL" in proc.stdout, proc.stdout
    took = float(re.search(r"TOOK ([\d.]+)", proc.stdout).group(1))
    assert 1.5 <= took < 1.5 + SLACK_S  # from the signal: the whole grace period, then SIGKILL
    # gone when the launcher returns, the grandchild in its own session too (not the launcher's child to wait for)
    assert len(pids_in(pids)) == 4 and not [p for p in pids_in(pids) if alive(p)]
    del lines


def test_sigterm_to_grpo_launch_leaves_no_descendant(tmp_path):
    """The real CLI, a real 2-process GRPO run (torchrun + ranks), SIGTERM twice mid-run (stop now): every
    descendant is gone."""
    pytest.importorskip("trl")
    from .helpers import tiny_overrides

    args = [
        sys.executable,
        "-m",
        "grpo_launch",
        str(ROOT / "recipes" / "tiny-cpu.yaml"),
        *tiny_overrides(tmp_path),
        "max_steps=500",
        "launch.grace_period_s=10",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    seen = []
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "step 2/500 done" in line or time.monotonic() > deadline:
            break
    descendants = _descendants(proc.pid)
    assert len(descendants) >= 3, f"expected torchrun and 2 ranks, saw {descendants}"
    # The first SIGTERM asks for a checkpoint at the end of the step (tests/test_stop.py); the second stops now.
    proc.send_signal(signal.SIGTERM)
    for line in proc.stdout:
        seen.append(line)
        if "SIGTERM again to stop now" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + rest
    assert _all_gone(descendants, within=10), [p for p in descendants if alive(p)]
    # The console: one line per process after the signal, not every rank's traceback (those are in the logs).
    after = rest.split("SIGTERM: stopping every process", 1)[1]
    assert "Traceback" not in after and re.search(r"\[grpo-launch\] train: .*; log: .*train-.*\.log", after), after


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for row in out.split("\n"):
        if row.strip():
            p, pp = map(int, row.split())
            children.setdefault(pp, []).append(p)
    found, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            found.append(c)
            stack.append(c)
    return found


def test_root_cause_skips_torchrun_wrapper():
    lines = [
        "Traceback (most recent call last):",
        "[rank1]: ValueError: bad reward",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "  error_file: <N/A>",
    ]
    assert root_cause(lines) == "ValueError: bad reward"


def test_a_server_that_stops_answering_stops_the_run(tmp_path):
    """The vLLM server's /health is polled while training runs: a server still up but no longer answering fails
    the run after the grace period (instead of trainers waiting on it for TRL's timeouts)."""
    from grpo_launch.enums import FailureKind

    srv, trn, url, pids = _specs(tmp_path, "stop-answering", "sleep")
    poll, health_grace, grace = 0.5, 3.0, 2.0
    t0 = time.monotonic()
    session = SessionSpec(srv, [trn], tmp_path / "logs", health_url=url, health_timeout_s=20, grace_s=grace,
                          health_poll_s=poll, health_grace_s=health_grace)  # fmt: skip
    result = supervise(session, environ={"PATH": "/usr/bin:/bin"}, emit=lambda line: None)
    took = time.monotonic() - t0
    assert result.state == RunState.FAILED and "the vLLM server stopped answering" in result.message
    assert result.failure.kind == FailureKind.HANG
    # It answers for 2 s from its first answer (helpers.SERVER's stop-answering), then not: the run stops once
    # health_grace has passed since the last answer, at a poll (each unanswered one waits out healthy()'s 2 s
    # timeout), not before.
    assert 2.0 + health_grace <= took < 2.0 + health_grace + 2 * (poll + 2.0) + grace + SLACK_S
    assert _all_gone(pids_in(pids))


def test_sigkill_of_the_supervisor_leaves_no_process(tmp_path):
    """The launcher killed with SIGKILL while a server (with a grandchild, like vLLM's EngineCore) and a trainer
    (whose grandchild starts its own session, like torchrun's ranks) run: the guard stops them all."""
    srv, trn, url, pids = _specs(tmp_path, "ok", "sleep")
    driver = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(ROOT / "src")!r})
        from pathlib import Path
        from grpo_launch.execute.session import SessionSpec, supervise
        from grpo_launch.spec import ProcessSpec
        session = SessionSpec(ProcessSpec("vllm", {tuple(srv.argv)!r}), [ProcessSpec("train", {tuple(trn.argv)!r})],
                              Path({str(tmp_path / "logs")!r}), health_url={url!r}, health_timeout_s=20, grace_s=2)
        supervise(session, environ=dict(os.environ), emit=print)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    # The trainers start beside the server, not after its health check: wait for both to say so (a loaded machine
    # may start the trainer's Python after the server answers), each having written its PIDs before its line.
    waiting = {"vLLM server healthy", "[train] trainer started"}
    for line in proc.stdout:
        waiting = {needle for needle in waiting if needle not in line}
        if not waiting:
            break
    assert not waiting, waiting
    assert len(pids_in(pids)) == 4 and all(alive(p) for p in pids_in(pids))
    proc.kill()
    proc.wait()
    assert _all_gone(pids_in(pids), within=8)


def test_a_headless_server_host_dying_stops_the_run(tmp_path):
    """A data-parallel server over several hosts: its headless engines are supervised like the API server. One
    that dies while training runs stops the run, names itself, and nothing is left."""
    srv, trn, url, pids = _specs(tmp_path, "ok", "sleep")
    port2 = free_port()
    worker = ProcessSpec("vllm@node2", (srv.argv[0], srv.argv[1], str(port2), str(pids), "die-after-1s"))
    session = SessionSpec(srv, [trn], tmp_path / "logs", health_url=url, health_timeout_s=20, grace_s=5,
                          server_workers=[worker])  # fmt: skip
    lines: list[str] = []
    result = supervise(session, environ={"PATH": "/usr/bin:/bin"}, emit=lines.append)
    assert result.state == RunState.FAILED and result.failed_process == "vllm@node2"
    assert "vllm@node2" in result.message
    assert _all_gone(pids_in(pids))
    assert {p.name.rsplit("-", 2)[0] for p in (tmp_path / "logs").iterdir()} == {"vllm", "vllm-node2", "train"}


def test_the_sweep_waits_until_the_runs_processes_are_gone():
    """reaper.wait_gone, which stop_all calls last: it returns once every process seen with the run's mark has exited
    (one killed half a second in), and names those still there when its bound runs out."""
    import threading
    import uuid

    from grpo_launch.node import reaper
    from grpo_launch.rundir.layout import RUN_ID_ENV

    run_id = uuid.uuid4().hex
    env = {**os.environ, RUN_ID_ENV: run_id}

    def marked_sleeper() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
        deadline = time.monotonic() + 30
        while proc.pid not in reaper.marked(run_id) and time.monotonic() < deadline:
            time.sleep(0.02)
        return proc

    first = marked_sleeper()
    threading.Timer(0.5, first.kill).start()
    t0 = time.monotonic()
    assert reaper.wait_gone(run_id, 30) == []
    assert time.monotonic() - t0 >= 0.4
    second = marked_sleeper()
    try:
        assert reaper.wait_gone(run_id, 0.2) == [second.pid]
    finally:
        second.kill()
        first.wait()
        second.wait()


def test_a_followed_process_is_waited_for_until_it_has_exited_not_until_its_mark_is_gone():
    """A process's environment (the run's mark) is empty from early in its exit, before the kernel closes its files,
    where a GPU driver frees its memory: wait_gone follows a process from when it was seen marked (reaper.follow)
    until it is a zombie or gone, by PID and start, so a PID taken again by another process is not waited for."""
    import threading
    import uuid

    from grpo_launch.node import reaper

    assert reaper.started(os.getpid()) is not None
    unmarked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        start = reaper.started(unmarked.pid)
        assert start is not None
        # No mark on it (marked() never lists it): followed since earlier, it is waited for until killed.
        threading.Timer(0.5, unmarked.kill).start()
        t0 = time.monotonic()
        assert reaper.wait_gone(uuid.uuid4().hex, 30, followed={unmarked.pid: start}) == []
        assert time.monotonic() - t0 >= 0.4
        # not reaped yet (poll() would reap it): a zombie, which has released what it held
        state = Path(f"/proc/{unmarked.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state == "Z" and reaper.started(unmarked.pid) is None
    finally:
        unmarked.kill()
        unmarked.wait()
    # A live process under a followed PID but with another start is another process: not waited for.
    assert reaper.wait_gone(uuid.uuid4().hex, 5, followed={os.getpid(): reaper.started(os.getpid()) + 1}) == []
    assert reaper.started(unmarked.pid) is None  # reaped: gone

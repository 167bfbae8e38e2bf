"""``ray-submit`` against a real Ray head started with token authentication (``RAY_AUTH_MODE=token``, Ray 2.60 here:
the installed .venv's). The job server refuses a submission without the token (a clear error naming
RAY_AUTH_TOKEN), takes it with RAY_AUTH_TOKEN from the launcher's environment, and runs the entrypoint script by
path; the token is on no process's command line. A one-node head on 127.0.0.1 (no namespace hosts): its ports are
free ones, its temp dir a private mkdtemp, every process it starts carries a mark in its environment, by which the
test stops exactly those.

The SkyPilot task's token auth (every node's Ray started with the token from the task's secret) runs for real in
tests/test_sky_run.py; SkyPilot itself (sky launch resolving ``--secret``) needs a cloud and is not run here.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from grpo_launch.backends.ray.submit import RayJob, RaySubmitter, entrypoint_of
from grpo_launch.backends.submission import Submission
from grpo_launch.errors import LaunchError
from grpo_launch.spec import RunContext

from .helpers import ROOT, free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow]
RAY = ROOT / ".venv" / "bin" / "ray"


def marked(mark: str) -> list[int]:
    """The processes whose environment holds ``mark`` (every one the head started inherits it)."""
    pids = []
    for p in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if mark.encode() in p.joinpath("environ").read_bytes().split(b"\0"):
                pids.append(int(p.name))
    return pids


@pytest.fixture(scope="module")
def auth_head():
    """(dashboard URL, token) of a Ray head that requires the token."""
    if not RAY.exists():
        pytest.skip("Ray is not installed in .venv")
    temp = tempfile.mkdtemp(prefix="rayauth.", dir="/tmp")  # short: Ray's socket paths stay under 107 bytes
    token, dashboard = secrets.token_hex(32), free_port()
    mark = f"GRPO_RAY_AUTH_TEST={temp}"
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0",
           mark.split("=", 1)[0]: temp}  # fmt: skip
    argv = [str(RAY), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(free_port()),
            "--num-cpus", "1", "--num-gpus", "0", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
            "--ray-client-server-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
            "--metrics-export-port", str(free_port()), "--temp-dir", f"{temp}/t", "--disable-usage-stats"]  # fmt: skip
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        yield f"http://127.0.0.1:{dashboard}", token
    finally:
        for pid in marked(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_submit_sends_the_token_from_the_environment_and_only_there(auth_head, tmp_path):
    dashboard, token = auth_head
    ran = tmp_path / "ran"
    script = tmp_path / "ray-job $(touch M).sh"
    script.write_text(f"echo ran > '{ran}'\n")
    submitter = RaySubmitter()
    submitter.job = RayJob(dashboard, f"grpo-auth-{os.getpid()}", entrypoint_of(str(script)), {}, {})
    submission = Submission(script.read_text(), str(script))
    with pytest.raises(LaunchError) as refused:
        submitter.submit(submission, RunContext(sys.executable, str(tmp_path), {}, print))
    assert "export RAY_AUTH_TOKEN" in (refused.value.hint or ""), refused.value
    assert submitter.submit(submission, RunContext(sys.executable, str(tmp_path), {"RAY_AUTH_TOKEN": token}, print))
    deadline = time.monotonic() + 120
    while not ran.exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert ran.read_text() == "ran\n"  # the job server ran the script by its path, once parsed
    assert not list(tmp_path.rglob("M")) and not list(Path.home().glob("M"))
    assert not command_lines_holding(token), "the token is on no command line"


def command_lines_holding(text: str) -> list[str]:
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            line = p.joinpath("cmdline").read_bytes()
            if text.encode() in line:
                found.append(line.decode(errors="replace"))
    return found

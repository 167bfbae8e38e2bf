"""A measurement in a process of its own (``grpo-launch calibrate``'s vLLM decode and its distributed engines): the
child prints its report as a JSON line last, in a session of its own so that a timeout stops its own children too
(vLLM's engine core and workers, a DeepSpeed rank's helpers). Standard library only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any


def json_child(
    argv: Sequence[str], env: Mapping[str, str], seconds: float, cwd: str | None = None
) -> tuple[dict[str, Any] | None, str]:
    """(the child's last JSON line, or None with why) of ``argv`` run within ``seconds``."""
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=max(1.0, seconds))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, f"not done within its {seconds:.0f} s (raise --minutes)"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return None, f"failed here ({(err.strip().splitlines() or ['no output'])[-1][:200]})"
    return json.loads(lines[-1]), ""

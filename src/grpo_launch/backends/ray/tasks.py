"""The Ray tasks and the actor the Ray backend starts on the cluster's nodes. Ray imports this module by name in
its workers, so every node needs grpo-launch in the Python its Ray runs (the same environment as the launcher)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections import deque
from collections.abc import Mapping, Sequence

import ray


@ray.remote(max_retries=0)
def shell(argv: Sequence[str], cwd: str | None, timeout_s: float) -> tuple[int, str, str]:
    """``argv`` on this node: (exit code, stdout, stderr); 124 past ``timeout_s``."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, cwd=cwd, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout_s:.0f} s"
    except OSError as exc:
        return 127, "", f"cannot run {argv[0]}: {exc.strerror or exc}"
    return done.returncode, done.stdout, done.stderr


@ray.remote(max_restarts=0, max_concurrency=4)  # type: ignore[call-overload]  # (ray types functions only)
class NodeProcess:
    """One of the plan's processes on the node Ray placed this actor on, with the GPUs Ray gave it: the command
    runs as this actor's child (through :mod:`grpo_launch.node.shim`, whose guard stops the run's processes here
    when this actor dies), its output is read by the runner that created the actor."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lines: deque[str] = deque()
        self.done = threading.Event()
        self.cond = threading.Condition()

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> dict[str, object]:
        """Start ``argv`` with ``env`` added; what Ray gave this process (node, GPU ids, CUDA_VISIBLE_DEVICES)."""
        given = [str(g) for g in ray.get_gpu_ids()]
        child_env = {**os.environ, **env}
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(given)  # exactly Ray's assignment, never the plan's numbering
        self.proc = subprocess.Popen(
            list(argv),
            env=child_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        return {
            "node": os.uname().nodename,
            "pid": self.proc.pid,
            "gpu_ids": given,
            "address": ray.util.get_node_ip_address(),
        }

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            with self.cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.cond.notify_all()
        self.proc.wait()
        with self.cond:
            self.done.set()
            self.cond.notify_all()

    def read(self, wait_s: float = 1.0, most: int = 2000) -> tuple[list[str], int | None]:
        """The lines printed since the last read (waiting up to ``wait_s`` for one), and the exit code once the
        process has ended and every line was read."""
        with self.cond:
            if not self.lines and not self.done.is_set():
                self.cond.wait(wait_s)
            out = [self.lines.popleft() for _ in range(min(most, len(self.lines)))]
            finished = self.done.is_set() and not self.lines
        assert self.proc is not None
        return out, (self.proc.returncode if finished else None)

    def signal(self, sig: int) -> None:
        """``sig`` to the command's process group (the shim made it a group leader)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)


__all__ = ["NodeProcess", "shell"]

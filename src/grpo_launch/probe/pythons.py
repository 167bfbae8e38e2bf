"""The Pythons a run will use: which vLLM each would import (read from its ``_version.py``, without importing
vLLM), and the interpreter behind a console script.

Standard library only, and no import of grpo_launch: another interpreter on this host (a vLLM server's own
environment) runs this file as a script, ``python pythons.py``, and it prints the vLLM version found there."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path


def vllm_version() -> str:
    """The vLLM version this interpreter would import, without importing vLLM (seconds): its ``_version.py``, read.
    A version, "unknown" (installed, unreadable) or "missing"."""
    spec = importlib.util.find_spec("vllm")
    text = ""
    if spec and spec.origin:
        f = Path(spec.origin).with_name("_version.py")
        text = f.read_text() if f.is_file() else ""
    for line in text.splitlines():
        if line.startswith("__version__") and "=" in line:
            return line.split("=")[-1].strip().strip("\"'")
    return "unknown" if spec else "missing"


def vllm_version_here() -> str | None:
    """The vLLM version this interpreter would import, or None (not installed or unreadable)."""
    found = vllm_version()
    return None if found in ("missing", "unknown") else found


def vllm_version_of(python: str) -> str:
    """The vLLM version ``python`` would import: a version, "missing", "unknown", or "error: …"."""
    import subprocess

    try:
        # This file run as a script: the other Python (a server's own environment) need not have grpo-launch.
        done = subprocess.run([python, __file__], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return f"error: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
    return lines[-1]


def interpreter_of(command: str) -> str | None:
    """The Python that runs ``command`` (a python itself, or a console script's shebang), or None."""
    import shutil

    path = command if "/" in command else shutil.which(command)
    if not path:
        return None
    if Path(path).name.startswith("python"):
        return path
    try:
        head = Path(path).read_bytes()[:1024].decode(errors="replace").splitlines()
    except OSError:
        return None
    first = head[0] if head else ""
    launcher = "'''exec' "
    if first == "#!/bin/sh" and len(head) > 1 and head[1].startswith(launcher):
        # pip's launcher when the interpreter's path is too long for a shebang: '''exec' /path/python "$0" "$@"
        words = shlex.split(head[1][len(launcher) :])
        return words[0] if words else None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if parts and Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0] if parts and "python" in Path(parts[0]).name else None


if __name__ == "__main__":
    print(vllm_version())

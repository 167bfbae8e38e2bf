"""Small real programs the supervision tests start (stand-ins for the vLLM server and the trainers)."""

from __future__ import annotations

import os
import socket
import textwrap
from pathlib import Path

# A health server on a port: answers GET /health; optionally spawns a grandchild (like vLLM's EngineCore) and
# records the PIDs of both in a file.
SERVER = textwrap.dedent(
    """
    import http.server, os, subprocess, sys, time
    port, pidfile, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(pidfile, "a") as f:
        f.write(f"{os.getpid()}\\n{grandchild.pid}\\n")
    if mode == "never-healthy":
        time.sleep(600)
    if mode == "die-after-1s":
        time.sleep(1.5)
        sys.exit(7)
    started = time.monotonic()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if mode == "stop-answering" and time.monotonic() - started > 2:
                time.sleep(60)  # up, but no longer answering (a wedged server)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)

# A trainer: records its PID (and a grandchild's, in a session of its own as torchrun starts each rank), then sleeps,
# fails, or ignores SIGTERM.
TRAINER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    pidfile, mode = sys.argv[1], sys.argv[2]
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    with open(pidfile, "a") as f:
        f.write(f"{os.getpid()}\\n{grandchild.pid}\\n")
    print("trainer started", flush=True)
    if mode == "fail":
        time.sleep(0.5)
        print("ValueError: boom in the trainer", flush=True)
        sys.exit(3)
    if mode == "ok":
        time.sleep(0.5)
        sys.exit(0)
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
    """
)


def write_scripts(tmp: Path) -> tuple[Path, Path]:
    server, trainer = tmp / "fake_server.py", tmp / "fake_trainer.py"
    server.write_text(SERVER)
    trainer.write_text(TRAINER)
    return server, trainer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_in(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False

"""Process shim run on a node before the real command: ``python -m grpo_launch.node.shim [options] -- COMMAND…``.

- ``--gpus P``: CUDA_VISIBLE_DEVICES becomes the entries at positions P (e.g. ``2,3``) of the inherited list, or P
  itself when nothing is inherited; ``--gpus ''`` hides every GPU. Slurm and ssh hosts number GPUs their own way;
  the plan only knows positions.
- ``--env-stdin``: read ``KEY=VALUE`` lines (values JSON-encoded) from stdin up to a blank line and add them to the
  environment, so secrets such as HF_TOKEN never appear on a command line.
- ``--announce-pgid``: lead a process group and print ``[grpo-launch-task] pgid=N`` first, so the launcher can
  stop the whole remote process tree (a killed ssh client does not stop it).
- ``--guard RUN_ID``: fork a guard (:mod:`grpo_launch.node.reaper`) that watches this process's parent (the ssh
  session's sshd); when the session ends (the launcher or its ssh client died, or the command finished) it stops
  every process marked with RUN_ID on this host: SIGTERM, then SIGKILL after ``--grace S`` seconds (the run's
  launch.grace_period_s; 10 without it).
- ``--hold-term``: start COMMAND with SIGTERM blocked, and say so in its environment
  (:data:`~grpo_launch.rundir.layout.HOLD_SIGTERM_ENV`). Slurm signals every task of every step itself (a
  preemption's GraceTime sends SIGTERM to the tasks, not to the batch shell): a blocked SIGTERM stays pending in
  torchrun's agent and the vLLM server (both would stop at once), and the trainer ranks, which inherit the mask,
  unblock it and turn it into a checkpoint request (:func:`grpo_launch.rundir.control.request_stop_on_sigterm`).
  The launcher stops them with SIGINT or SIGKILL. (Blocked, not ignored: torchrun's agent and uvicorn install their
  own SIGTERM handlers, which replace an ignored disposition but not a blocked mask.)

Then it ``exec``s COMMAND under the run's umask (:data:`~grpo_launch.rundir.layout.PRIVATE_UMASK`: a remote
process does not inherit the launcher's, and what it creates, checkpoints and vLLM's sockets among them, is its
user's alone), with SIGINT and SIGTERM at their defaults and unblocked (a parent that ignores or blocks
them, as a Ray worker's thread blocks SIGINT, would leave the command deaf to teardown), SIGTERM blocked under
``--hold-term``. Standard library only: it must start fast.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from grpo_launch.rundir.layout import HOLD_SIGTERM_ENV, PGID_ANNOUNCE, PRIVATE_UMASK


def select_gpus(inherited: str | None, positions: str) -> str:
    """The CUDA_VISIBLE_DEVICES value for ``positions`` of the ``inherited`` list."""
    wanted = [p.strip() for p in positions.split(",") if p.strip()]
    if not wanted:
        return ""
    have = [t.strip() for t in (inherited or "").split(",") if t.strip()]
    if not have:
        return ",".join(wanted)
    out = []
    for p in wanted:
        if not (p.isascii() and p.isdigit()) or int(p) >= len(have):
            raise SystemExit(
                f"grpo_launch.node.shim: GPU position {p!r} is not in CUDA_VISIBLE_DEVICES={inherited!r}; "
                "the allocation has fewer GPUs than planned"
            )
        out.append(have[int(p)])
    return ",".join(out)


def read_env(stream) -> dict[str, str]:
    env: dict[str, str] = {}
    for raw in stream:
        line = raw.rstrip("\n")
        if not line:
            break
        key, sep, value = line.partition("=")
        if not sep:
            raise SystemExit(f"grpo_launch.node.shim: bad environment line for {key!r}")
        env[key] = json.loads(value)
    return env


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit(
            "usage: python -m grpo_launch.node.shim [--gpus P] [--env-stdin] [--announce-pgid] [--guard RUN_ID "
            "[--grace S]] [--hold-term] -- COMMAND…"
        )
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1 :]
    if not command:
        raise SystemExit("grpo_launch.node.shim: no command after --")
    i = 0
    guard_id = None
    grace_s = GUARD_GRACE_S
    hold_term = False
    while i < len(opts):
        opt = opts[i]
        if opt == "--gpus":
            # On ROCm torch reads HIP_VISIBLE_DEVICES before CUDA_VISIBLE_DEVICES, and vLLM refuses the two when they
            # differ: pick from the one in force, set both where ROCm's variables are present.
            rocm = "HIP_VISIBLE_DEVICES" in os.environ or "ROCR_VISIBLE_DEVICES" in os.environ
            inherited = os.environ.get("HIP_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES")
            os.environ["CUDA_VISIBLE_DEVICES"] = select_gpus(inherited, opts[i + 1])
            if rocm:
                os.environ["HIP_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
            i += 2
        elif opt == "--env-stdin":
            os.environ.update(read_env(sys.stdin))
            i += 1
        elif opt == "--guard":
            guard_id = opts[i + 1]
            i += 2
        elif opt == "--grace":
            grace_s = float(opts[i + 1])
            i += 2
        elif opt == "--hold-term":
            hold_term = True
            i += 1
        elif opt == "--announce-pgid":
            if os.getpid() != os.getpgid(0):
                os.setsid()
            print(f"{PGID_ANNOUNCE}{os.getpgid(0)}", flush=True)
            i += 1
        else:
            raise SystemExit(f"grpo_launch.node.shim: unknown option {opt!r}")
    if guard_id:
        _fork_guard(guard_id, grace_s)
    # Ignored and blocked signals stay so across exec: the thread of a Ray worker (the Ray backend's actor) that
    # starts the command blocks SIGINT, which would leave the command deaf to the SIGINT teardown forwards. The
    # command starts with the defaults, unblocked.
    stop = {signal.SIGINT, signal.SIGTERM}
    for sig in stop:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)
    if hold_term:
        os.environ[HOLD_SIGTERM_ENV] = "1"
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    os.umask(PRIVATE_UMASK)
    try:
        os.execvp(command[0], command)
    except FileNotFoundError:
        raise SystemExit(f"grpo_launch.node.shim: command {command[0]!r} not found on {os.uname().nodename}") from None


GUARD_GRACE_S = 10.0


def _fork_guard(run_id: str, grace_s: float) -> None:
    """A child in its own session watches the ssh session (this process's parent) and stops the run's processes
    here when it ends; this process goes on to exec the command."""
    session = os.getppid()
    sys.stdout.flush()
    if os.fork() == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # hold none of the session's pipes: the ssh client must end with the command
            os.dup2(null, fd)
        guard = [sys.executable, "-m", "grpo_launch.node.reaper", "watch", str(session), run_id, str(grace_s)]
        try:
            os.execv(sys.executable, guard)
        finally:
            os._exit(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

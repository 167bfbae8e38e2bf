"""A failed run tells its cause once (issue 50 §2): the console gets the root cause (the exception, the user's frame
that raised it, the rank that raised *first*, the traceback's file), and every traceback, torchrun's own and its
"Root Cause" report stay in the logs.

Reproduction: a reward raising at step 3 on both ranks of the tiny recipe (``test_a_failing_reward_...`` below).
Before: 129 console lines for 2 steps, rank 0's whole traceback, torchrun's traceback and banner ("root cause: rank
0"), then grpo-launch's summary naming rank 1 (rank 1 states its error when it catches it; rank 0's traceback is
formatted first and arrives later, though rank 0 raised first). After: 16 lines, one root cause, the first raiser."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_launch.execute import faults
from grpo_launch.execute.faults import Event
from grpo_launch.rundir import shown_text as text

from .helpers import ROOT, tiny_run_with_module

# How late a rank on a loaded 2-core machine may stamp its catch: a runnable task can wait one scheduling period
# (Linux CFS: sched_latency_ns, 6 ms × (1 + log2(CPUs)) = 12 ms on 2 cores) per preemption; 50 ms allows a few.
SCHEDULING_NOISE_S = 0.05
T0 = 1_795_855_543.0  # an epoch time: the rank's stated times and the lines' arrival are on one clock


def stated(rank: int, at: float, frame: str = "reward at /home/me/rewards.py:5") -> str:
    said = text.Raised("ValueError: the reward broke", at, frame, f"/run/logs/train-rank{rank}-h-1.log").text()
    return f"[rank{rank}]: {said}"


def test_the_rank_that_raised_first_is_the_root_cause_whichever_line_arrived_first():
    """Rank 1's line arrives 5 ms before rank 0's, though rank 0 raised 3 ms before rank 1 (its traceback was being
    formatted): the root cause is rank 0's, with its frame and traceback file."""
    events = [
        Event(T0 + 0.008, "train", stated(1, T0 + 0.003)),
        Event(T0 + 0.013, "train", stated(0, T0)),
        Event(T0 + 0.100, "train", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "),
    ]
    d = faults.explain(events)
    assert d.failure.headline() == "[train rank 0] ValueError: the reward broke"
    assert d.stated and d.raised is not None
    assert (d.raised.frame, d.raised.traceback) == ("reward at /home/me/rewards.py:5", "/run/logs/train-rank0-h-1.log")
    # a line that states no time counts from its arrival
    late = faults.explain([Event(T0 + 0.002, "vllm", "(EngineCore_DP0 pid=7) ERROR 11-28 08:00:00 [core.py:1] died"),
                    *events])  # fmt: skip
    assert late.failure.where == "train rank 0"
    first = Event(T0 - 1.0, "vllm", "(EngineCore_DP0 pid=7) ERROR 11-28 08:00:00 [core.py:1] died")
    early = faults.explain([first, *events])
    assert early.failure.where == "vllm EngineCore_DP0" and early.raised is None


def test_a_custom_exception_stated_by_a_rank_is_a_cause():
    """A class not named …Error still states its error (the rank's line is one by its form)."""
    line = "[rank1]: " + text.Raised("mymod.Boom: no", T0).text()
    assert faults.explain([Event(T0 + 1, "train", line)]).failure.headline() == "[train rank 1] mymod.Boom: no"


# What the train process printed for a reward raising on both ranks (a real run before the fix, trimmed).
RUN = [
    "[grpo-launch] step 2/6 done in 0.34 s (generation 0.21 s, training 0.13 s)",
    "[rank1]: ValueError: the reward broke (traceback: /tmp/run/logs/train-rank1-vm-1.log)",
    "[rank0]: Traceback (most recent call last):",
    '[rank0]:   File "/work/main/src/grpo_launch/train/__main__.py", line 230, in <module>',
    "[rank0]:     _exit(_entry())",
    "[rank0]:           ^^^^^^^^",
    '[rank0]:   File "/tmp/faultall.py", line 5, in reward',
    '[rank0]:     raise ValueError("the reward broke")',
    "[rank0]: ValueError: the reward broke",
    "W1128 08:44:28.215000 19811 .venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/"
    "api.py:1028] Sending process 19818 closing signal SIGTERM",
    "E1128 08:44:28.281000 19811 .venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/"
    "api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 19817) of binary: /work/main/.venv/bin/python",
    "Traceback (most recent call last):",
    '  File "<frozen runpy>", line 198, in _run_module_as_main',
    '  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch',
    "    raise ChildFailedError(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "grpo_launch.train FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "[1]:",
    "  rank      : 1 (local_rank: 1)",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : 1 (pid: 19817) ",
    "============================================================",
    "[grpo-launch] this line is shown again",
]


def test_the_console_keeps_tracebacks_and_torchruns_report_in_the_logs():
    shown = faults.ConsoleFilter()
    out = [x for line in RUN if (x := shown.show(line)) is not None]
    # rank 0's traceback ends in a real error: its last line stays (a library may print one and go on); torchrun's
    # ChildFailedError, its report and its lines about the failed rank are consequences
    assert out == [RUN[0], RUN[1], "[rank0]: ValueError: the reward broke (traceback in the log)", RUN[-1]]
    now = faults.ConsoleFilter()
    assert now.show(stated(0, T0)) is None  # a rank's stated error: the summary names the root cause once


def test_rank_zero_states_its_error_and_keeps_its_traceback_in_a_file(tmp_path):
    """Rank 0 in a run directory: one line on stderr (the console), the traceback in RUN_DIR/logs, and Python's
    excepthook prints it no more."""
    program = (
        "import sys\n"
        "from grpo_launch.train import console\n"
        "def reward():\n"
        "    raise KeyError('answer')\n"
        "try:\n"
        "    reward()\n"
        "except BaseException as exc:\n"
        "    console.report_error(exc, None, 0)\n"
        "    raise\n"
    )
    (tmp_path / "prog.py").write_text(program)
    env = {**os.environ, "GRPO_LAUNCH_RUN_DIR": str(tmp_path / "run"), "RANK": "0"}
    done = subprocess.run([sys.executable, str(tmp_path / "prog.py")], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    said = text.Raised.parse(line.removeprefix("[rank0]: "))
    assert said is not None and said.error == "KeyError: 'answer'", line
    assert said.frame == f"reward at {tmp_path / 'prog.py'}:4" and abs(said.at - time.time()) < 60
    assert said.traceback is not None and Path(said.traceback).parent == tmp_path / "run" / "logs"
    written = Path(said.traceback).read_text()
    assert "Traceback (most recent call last)" in written and "raise KeyError('answer')" in written


FAULT = """
import os, time
def reward(completions, trainer_state=None, **kw):
    if trainer_state.global_step + 1 == 3:
        with open(os.environ["FAULT_TIMES"], "a") as f:
            f.write(f"{os.environ['RANK']} {time.time()}\\n")
        raise ValueError("the reward broke")
    return [float(len(c) % 3) for c in completions]
"""


@pytest.mark.slow
def test_a_failing_reward_says_one_cause_once_with_the_rank_that_raised_first(tmp_path):
    """A real 2-rank run whose reward raises at step 3 on both ranks (about 35 s on 2 cores)."""
    cmd, env, run = tiny_run_with_module(
        tmp_path, "faultall", FAULT, "max_steps=6", FAULT_TIMES=str(tmp_path / "raised.txt")
    )
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    console = done.stdout + done.stderr
    assert done.returncode == 1, console[-3000:]
    assert len(console.splitlines()) <= 20, console
    for noise in ("Traceback", "ChildFailedError", "Root Cause", "=====", "closing signal", "last lines of"):
        assert noise not in console, (noise, console)
    cause = re.search(r"root cause: \[train rank (\d)\] ValueError: the reward broke\n  raised in reward at (.+)\n"
                      r"  traceback: (.+)\n", done.stderr)  # fmt: skip
    assert cause, console
    assert cause[2] == f"{tmp_path / 'faultall.py'}:7"  # the raise
    assert "Traceback (most recent call last)" in Path(cause[3]).read_text()  # the full traceback: in the logs
    assert Path(cause[3]).name.startswith(f"train-rank{cause[1]}-")
    # The rank named raised first, by the times both stated (each in the launcher's log of the train process).
    (log,) = (run / "logs").glob("train-2*.log")
    times = {}
    for line in log.read_text().splitlines():
        m = re.search(r"\[rank(\d)\]: (.*)$", line)
        if m and (said := text.Raised.parse(m[2])) is not None:
            times[int(m[1])] = said.at
    assert set(times) == {0, 1} and min(times, key=lambda r: times[r]) == int(cause[1]), (times, console)
    # Each rank's stated time is its raise (the reward recorded it just before raising), stamped where the error is
    # caught: not when its line arrived, nor after rank 0 wrote its traceback file (the bug).
    recorded = {
        int(r): float(t) for r, t in (line.split() for line in (tmp_path / "raised.txt").read_text().splitlines())
    }
    assert all(0 <= times[r] - recorded[r] < 1.0 for r in (0, 1)), (recorded, times)
    # … so the rank named is the one the reward saw raise first, unless both raised within the scheduling noise of a
    # loaded 2-core machine (the ranks raise at the same step, often within 1 ms; a rank descheduled between its
    # raise and its catch stamps a few ms late: CI saw 1.2 ms apart raises stated 3.1 ms apart the other way).
    if abs(recorded[0] - recorded[1]) > SCHEDULING_NOISE_S:
        assert min(recorded, key=lambda r: recorded[r]) == int(cause[1]), (recorded, times)

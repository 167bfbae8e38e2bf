"""A second Ctrl-C during the checkpoint write (issue 50 §2): what it costs is said before it is pressed, and what it
cost is said after.

Reproduction (``test_a_second_ctrl_c_during_the_write_...`` below): save_steps=1000, Ctrl-C at step 3, Ctrl-C again
while checkpoint-N is written (a reward module slows the Trainer's save, as a slow disk would). Before: the console
said only "train: exit code 1"; the next start set the half-written checkpoint aside and trained from step 0. After:
"writing checkpoint-N …; Ctrl-C again abandons it and loses steps 1–N (no complete checkpoint yet)", then
"checkpoint-N abandoned half-written (set aside as …); no complete checkpoint: steps 1–N will be trained again"."""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest

from .helpers import ROOT, processes_of, tiny_run_with_module, wait_for_line

# The Trainer writes a checkpoint's model, optimizer and RNG state, then trainer_state.json: here it waits after the
# RNG state, so the checkpoint is half-written for SLOW_SAVE_S seconds.
SLOW_SAVE = """
import os, time
import transformers

_save_rng_state = transformers.Trainer._save_rng_state

def _slowly(self, output_dir):
    _save_rng_state(self, output_dir)
    time.sleep(float(os.environ["SLOW_SAVE_S"]))

transformers.Trainer._save_rng_state = _slowly

def reward(completions, **kw):
    return [float(len(c) % 3) for c in completions]
"""


@pytest.mark.slow
def test_a_second_ctrl_c_during_the_write_says_what_it_costs_before_and_after(tmp_path):
    """A real 2-rank CPU run (about 40 s on 2 cores)."""
    cmd, env, run = tiny_run_with_module(
        tmp_path, "slowsave", SLOW_SAVE, "max_steps=50", "save_steps=1000", "launch.grace_period_s=3", SLOW_SAVE_S="120"
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    seen = wait_for_line(proc, "step 3/50 done")
    proc.send_signal(signal.SIGINT)
    seen += wait_for_line(proc, "Ctrl-C again to stop now", timeout=60)
    asked = re.search(r"checkpoint at the end of step (\d+) requested; .*; stopping now loses steps 1–(\d+) \(no "
                      r"complete checkpoint yet\)", seen[-1])  # fmt: skip
    assert asked and asked[1] == asked[2], seen[-1]
    seen += wait_for_line(proc, "writing checkpoint-", timeout=60)
    writing = re.search(r"\[grpo-launch\] writing checkpoint-(\d+) \(no save measured yet\); Ctrl-C again abandons it "
                        r"and loses steps 1–(\d+) \(no complete checkpoint yet\)", seen[-1])  # fmt: skip
    assert writing and writing[1] == writing[2] == asked[1], seen[-1]
    step = int(writing[1])
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    out = "".join(seen) + rest
    assert proc.returncode == 130, out[-3000:]
    aside = re.search(rf"\[grpo-launch\] checkpoint-{step} abandoned half-written \(set aside as "
                      rf"(abandoned-checkpoint-{step}-\d+-\d+)\); no complete checkpoint: steps 1–{step} will be "
                      r"trained again", rest)  # fmt: skip
    assert aside, out[-3000:]
    output = run / "output"
    # set aside, whatever of it was written when the second Ctrl-C came (on a loaded machine: before the weights)
    assert not (output / f"checkpoint-{step}").exists() and (output / aside[1]).is_dir()
    (attempt,) = [json.loads(x) for x in (run / "control" / "attempts.jsonl").read_text().splitlines()]
    assert attempt["state"] == "interrupted" and f"steps 1–{step} will be trained again" in attempt["message"]
    assert not (run / "control" / "saving-checkpoint").exists()
    assert processes_of(run) == []

"""What a run prints says what it measures (issue 41): the step line's token rate names the tokens counted, metrics
keep their digits (``entropy 5.80`` beside ``entropy 5.79``, not ``5.8``), and the first start-up term is named for
what it times (imports, model and data load: 9.88 s for a 1.3 MB model is mostly imports)."""

from __future__ import annotations

import time

from grpo_launch.analysis.timeline import startup_row
from grpo_launch.rundir.records import StartupRecord
from grpo_launch.train.callbacks import metrics_text, step_line


def test_the_token_rate_names_what_it_counts():
    head, tail = step_line(2, 3, 0.07, 0.04, 7923.4, [0.07, 0.07])
    assert head.endswith("done in 0.07 s (generation 0.04 s, training 0.03 s)")
    assert "7,923 tok/s prompt+completion" in tail


def test_metrics_keep_three_significant_digits():
    assert metrics_text({"entropy": 5.8}) == " | entropy 5.80"
    assert metrics_text({"entropy": 5.794}) == " | entropy 5.79"
    assert metrics_text({"kl": 0.000123}) == " | kl 0.000123"


def test_the_trainers_start_up_term_is_named_for_what_it_times():
    now = time.time()
    records = [StartupRecord("model_load", 9.88, now), StartupRecord("first_sync", 0.5, now)]
    row = startup_row(records, None)
    assert row is not None and "trainer start-up (imports, model and data load) 9.88 s" in row[1], row
    assert "model load" not in row[1]


def test_make_tiny_assets_says_only_what_it_built(tmp_path):
    """Issue 41: it printed DeepSpeed's accelerator warning, two progress bars and three empty lines, and took
    ``--help`` for the directory to build into."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_assets.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "t")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (done.stdout + done.stderr).splitlines() == [
        f"tiny model: {tmp_path / 't' / 'model'}",
        f"tiny MoE model: {tmp_path / 't' / 'moe-model'}",
        f"tiny dataset: {tmp_path / 't' / 'data' / 'train.jsonl'}",
    ]
    helped = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert helped.returncode == 0 and helped.stdout.startswith("usage:") and not (tmp_path / "--help").exists()

"""What a run prints says what it measures (issue 41): the step line's token rate names the tokens counted, metrics
keep their digits (``entropy 5.80`` beside ``entropy 5.79``, not ``5.8``), and the first start-up term is named for
what it times (imports, model and data load: 9.88 s for a 1.3 MB model is mostly imports)."""

from __future__ import annotations

import time

from grpo_launch.rundir.records import StartupRecord
from grpo_launch.rundir.timeline import startup_row
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

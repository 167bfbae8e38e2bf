"""The run report: its plots hold the run's data (read back from the series the HTML embeds and from the figure
files), not a picture of nothing. A real run's report is checked in test_run.py; here a metrics.jsonl as the
trainers write it."""

from __future__ import annotations

import json

import pytest

from grpo_launch.rundir.report import embedded_series, read_series, write_report

pytest.importorskip("matplotlib")


def metrics(tmp_path, steps: int = 6):
    lines = []
    for i in range(1, steps + 1):
        step = {"step": i, "max_steps": steps, "step_s": 1.0 + i / 10, "generation_s": 0.7, "training_s": 0.3 + i / 10}
        lines.append(step | {"peak_memory_bytes": [2 * 2**30, 3 * 2**30], "memory_kind": "rss_max",
                             "gpu_utilization": [90, 60 + i]})  # fmt: skip
        log = {"reward": 0.1 * i, "rewards/digits/mean": 0.05 * i, "rewards/format/mean": 0.0}
        log |= {"completions/mean_length": 10.0 + i, "completions/min_length": 4, "completions/max_length": 16}
        lines.append({"step": i, "log": log})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 7, "step_s"')
    plan = {"recipe": "recipes/x.yaml", "estimate": {"time_s": {"generation": 0.5, "old_logprobs": 0.1, "sync": 0.0,
            "training": 0.4}, "memory_per_training_gpu_gib": {"total": 5.0}}}  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan))


def test_the_report_embeds_and_plots_the_runs_series(tmp_path):
    metrics(tmp_path)
    page = write_report(tmp_path)
    assert page == tmp_path / "report" / "report.html"
    data = embedded_series(page.read_text())
    assert data["reward"]["reward"]["values"] == pytest.approx([0.1 * i for i in range(1, 7)])
    assert data["reward"]["digits"]["steps"] == [1, 2, 3, 4, 5, 6] and "format" in data["reward"]
    assert data["length"]["mean length"]["values"] == [11.0, 12.0, 13.0, 14.0, 15.0, 16.0]
    assert data["time"]["training"]["values"] == pytest.approx([0.3 + i / 10 for i in range(1, 7)])
    assert data["memory"]["rank 1"]["values"] == [3.0] * 6
    assert data["gpu"]["rank 1"]["values"] == [61.0, 62.0, 63.0, 64.0, 65.0, 66.0]
    for plot in ("reward", "length", "time", "memory", "gpu"):
        png = tmp_path / "report" / f"{plot}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert page.read_text().count("data:image/png;base64,") == 5


def test_series_skip_what_was_not_logged(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "step_s": 1.0, "generation_s": 0.5}) + "\n")
    series = read_series(tmp_path)
    assert series["reward"] == {} and list(series["time"]) == ["generation"]  # no training time was logged

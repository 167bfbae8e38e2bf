"""The run report: its plots hold the run's data (read back from the series the HTML embeds and from the figure
files), not a picture of nothing. A real run's report is checked in test_run.py; here a metrics.jsonl as the
trainers write it."""

from __future__ import annotations

import json

import pytest

from grpo_launch.analysis.report import embedded_series, read_series, write_report
from grpo_launch.render.plan_json import plan_to_dict

from .helpers import ROOT, plan_recipe

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
    # plan.json as the planner writes it (every key its readers use), with this test's prediction
    plan = plan_to_dict(plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB"))
    plan["recipe"] = "recipes/x.yaml"
    plan["estimate"] |= {"time_s": {"generation": 0.5, "old_logprobs": 0.1, "sync": 0.0, "training": 0.4,
                                     "step": 1.0},
                         "memory_per_training_gpu_gib": {"total": 5.0}}  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan, default=str))


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


def _browser() -> str:
    import os
    import shutil

    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found:
        return found
    if os.environ.get("GRPO_LAUNCH_REQUIRE_BROWSER") == "1":
        pytest.fail("chromium is required (GRPO_LAUNCH_REQUIRE_BROWSER=1): scripts/install_system_packages.sh")
    pytest.skip("no headless browser: scripts/install_system_packages.sh installs chromium")


class _Dom:
    """What a reader sees of the report, from the DOM the browser built: the tables' rows by id, the error, links."""

    def __init__(self, dom: str) -> None:
        from html.parser import HTMLParser

        self.tables: dict[str, dict[str, str]] = {}
        self.error = ""
        self.links: list[str] = []
        outer = self

        class Parser(HTMLParser):
            table = cell = None
            key = ""
            in_error = False

            def handle_starttag(self, tag, attrs):
                a = dict(attrs)
                if tag == "table":
                    self.table = outer.tables.setdefault(a.get("id") or "", {})
                elif tag in ("th", "td"):
                    self.cell = tag
                elif tag == "pre" and a.get("id") == "error":
                    self.in_error = True
                elif tag == "a":
                    outer.links.append(a.get("href") or "")

            def handle_endtag(self, tag):
                if tag in ("th", "td"):
                    self.cell = None
                elif tag == "pre":
                    self.in_error = False

            def handle_data(self, data):
                if self.cell == "th":
                    self.key = data
                elif self.cell == "td" and self.table is not None:
                    self.table[self.key] = self.table.get(self.key, "") + data
                elif self.in_error:
                    outer.error += data

        Parser().feed(dom)


def test_the_report_reads_as_a_summary_first_in_a_real_browser(tmp_path):
    """The report of a failed 8 × H100 run (its plan.json as the planner writes it, the trainers' records, the
    launcher's attempt record), opened in headless Chromium: the DOM it builds has the summary, the last error,
    the plan and working log links; the screenshot is a page, not a blank."""
    import subprocess

    from grpo_launch.render.plan_json import plan_to_dict

    from .helpers import ROOT, plan_recipe

    browser = _browser()
    plan = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB", "launch.dataset_rows=3000",
                       "launch.gpu_hour_price=2.5")  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan_to_dict(plan)))
    lines = []
    for i in range(1, 7):
        lines.append({"step": i, "max_steps": 10, "step_s": 30.0, "generation_s": 20.0, "training_s": 10.0,
                      "time": 1000.0 + 30 * i, "peak_memory_bytes": [40 * 2**30] * 8,
                      "memory_kind": "cuda_max_allocated"})  # fmt: skip
        lines.append({"step": i, "log": {"reward": 0.1 * i, "completions/mean_length": 500.0}})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "control").mkdir()
    attempt = {"attempt": 1, "ended": 1200.0, "state": "failed", "exit_code": 1, "failure": "oom", "side": "train",
               "cause": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
               "message": "train rank 3"}  # fmt: skip
    (tmp_path / "control" / "attempts.jsonl").write_text(json.dumps(attempt) + "\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train-rank3-node1-20261125.log").write_text("OOM\n")
    page = write_report(tmp_path)
    shot = tmp_path / "shot.png"
    base = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1000,1800"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    subprocess.run([*base, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
    seen = _Dom(dom)
    summary = seen.tables["summary"]
    assert list(summary)[:3] == ["state", "steps", "wall time (steps)"]  # the summary comes first, in this order
    assert summary["state"].startswith("failed (oom): torch.OutOfMemoryError") and summary["steps"] == "6/10"
    assert summary["wall time (steps)"] == "3.0 min; 0.40 GPU-hours on 8 GPU(s), 1.00 at 2.50 per GPU-hour"
    assert summary["reward"] == "first 0.100, last 0.600, best 0.600"
    assert "30.00 s (generation 20.00 s, training 10.00 s); predicted" in summary["step time"]
    assert summary["memory"].startswith("40 GiB peak") and "estimated" in summary["memory"]
    assert summary["split"].startswith("generation 20.00 s, training 10.00 s")
    assert "CUDA out of memory" in seen.error and "train rank 3" in seen.error
    assert "layout" in seen.tables["plan"] and any(k == "role" for k in seen.tables["plan"])
    (log,) = [h for h in seen.links if h.endswith(".log")]
    assert (page.parent / log).resolve() == (tmp_path / "logs" / "train-rank3-node1-20261125.log").resolve()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 30_000


def test_plots_of_quantities_start_at_zero_and_steps_are_whole():
    """Issue 41: a flat 0.62 GiB memory line looked like a climb (no zero on the axis), and step axes had ticks at
    1.5 and 2.5."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from grpo_launch.analysis.report import Series, draw

    flat = Series("rank 0", [1, 2, 3], [0.62, 0.62, 0.621])
    fig = draw("memory", {"rank 0": flat}, None)
    ax = fig.axes[0]
    fig.canvas.draw()
    assert ax.get_ylim()[0] == 0
    assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_xticks()
    plt.close(fig)
    reward = draw("reward", {"reward": Series("reward", [1, 2, 3], [-0.5, 0.1, 0.4])}, None)
    assert reward.axes[0].get_ylim()[0] < -0.5  # a reward may be negative: not clipped at zero
    plt.close(reward)

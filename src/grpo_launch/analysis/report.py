"""The run report: RUN_DIR/report/report.html (self-contained: the plots are embedded) and the PNGs beside it,
written at the end of a run and by ``grpo-launch report RUN_DIR``. A summary comes first (state, steps, wall time,
GPU-hours and cost, reward, measured against predicted step time and memory, the split verdict:
:mod:`.report_summary`), then the last error, the plan, the plots, the logs and the recipe.

Plots, from the trainers' ``metrics.jsonl`` and the plan's ``plan.json``: the reward and each reward function over
steps; completion lengths; the step time split into generation and training against the plan's prediction; the
peak memory of every rank against the estimate; each rank's GPU utilisation when NVML was there. The series
themselves are embedded in the HTML as JSON (``<script id="series">``, valid JSON as it stands: :func:`script_json`),
so what was plotted can be read back.
matplotlib is an optional extra (the ``report`` extra): the planner never imports it.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_launch.analysis.report_summary import log_links, plan_rows, summary_rows
from grpo_launch.analysis.view import RunView
from grpo_launch.errors import ConfigError, install_hint
from grpo_launch.machines.gpus import GIB
from grpo_launch.rundir.plan_record import PlanRecord
from grpo_launch.rundir.records import LogRecord, MetricRecord, StartupRecord, StepRecord
from grpo_launch.rundir.shown_text import printable
from grpo_launch.rundir.trusted_files import nofollow_fd, open_own_dir


@dataclass
class Series:
    """One plotted line: its name and (step, value) points."""

    name: str
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, step: int, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            self.steps.append(int(step))
            self.values.append(float(value))


def read_series(run_dir: str | Path) -> dict[str, dict[str, Series]]:
    """{plot: {line: Series}} from a run directory's curve (each step once; for checks and tools)."""
    return series_of(RunView.load(run_dir).curve())


def series_of(records: Sequence[MetricRecord]) -> dict[str, dict[str, Series]]:
    """{plot: {line: Series}} from the run's metrics records (steps and TRL's logged metrics)."""
    plots: dict[str, dict[str, Series]] = {"reward": {}, "length": {}, "time": {}, "memory": {}, "gpu": {}}

    def line(plot: str, name: str) -> Series:
        return plots[plot].setdefault(name, Series(name))

    for record in records:
        if isinstance(record, StartupRecord):
            continue  # the time to the first step is a row of the summary, not a series
        step = record.step
        if isinstance(record, LogRecord):
            log = record.log
            line("reward", "reward").add(step, log.get("reward"))
            for key, value in log.items():
                if key.startswith("rewards/") and key.endswith("/mean"):
                    name = key.removeprefix("rewards/").removesuffix("/mean")
                    # A reward function named "reward" is not the mean reward's line (it would plot each step twice).
                    line("reward", f"{name} (function)" if name == "reward" else name).add(step, value)
            for key in ("mean_length", "min_length", "max_length"):
                line("length", key.replace("_", " ")).add(step, log.get(f"completions/{key}"))
        elif isinstance(record, StepRecord):
            line("time", "generation").add(step, record.generation_s)
            line("time", "training").add(step, record.training_s)
            for rank, peak in enumerate(record.peak_memory_bytes):
                line("memory", f"rank {rank}").add(step, peak / GIB)
            for rank, busy in enumerate(record.gpu_utilization):
                line("gpu", f"rank {rank}").add(step, busy)
    return {p: {k: s for k, s in lines.items() if s.steps} for p, lines in plots.items()}


# A quantity that cannot be negative is drawn from zero: a flat 0.62 GiB must not look like a climb.
FROM_ZERO = frozenset({"length", "time", "memory", "gpu"})
TITLES = {
    "reward": ("Reward (mean) and each reward function", "reward"),
    "length": ("Completion length", "tokens"),
    "time": ("Step time: generation and training", "seconds"),
    "memory": ("Peak memory per rank", "GiB"),
    "gpu": ("GPU utilisation per rank (NVML, sampled at each step's end)", "%"),
}


def _predicted(plan: PlanRecord | None, plot: str) -> dict[str, float]:
    """The plan's predicted values for a plot, drawn as dashed lines."""
    pred = plan.prediction if plan is not None else None
    if pred is None:
        return {}
    if plot == "time":
        return {"planned generation": pred.trainer_generation_s, "planned training": pred.training_s}
    if plot == "memory" and pred.train_memory_gib is not None:
        return {"estimate per training GPU": pred.train_memory_gib}
    return {}


def write_report(run_dir: str | Path | RunView) -> Path:
    """Write RUN_DIR/report/{report.html, *.png} from the run directory read once; returns the HTML's path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # a missing matplotlib is said before any file is read
    except ImportError:
        raise ConfigError(
            "the run report needs matplotlib", hint=install_hint("report") + ", or pip install matplotlib."
        ) from None
    view = run_dir if isinstance(run_dir, RunView) else RunView.load(run_dir)
    series = series_of(view.curve())  # each step once: a resumed attempt's records win
    out = view.paths.report
    # The report may be written in another user's run directory: never through a link planted there (the report
    # directory itself, or a file in it), only in a directory of this user's that no one else may write in.
    folder = open_own_dir(out, "report directory")
    try:
        path = out / "report.html"
        _write(path, folder, _page(view, series, _plot_sections(series, view.plan, out, folder)).encode())
    finally:
        os.close(folder)
    return path


def _write(path: Path, folder: int, data: bytes) -> None:
    """One of the report's files, by its name in the report directory open at ``folder``: 0600, never through a
    link, never a file with another name (a hard link)."""
    fd = nofollow_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, dir_fd=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _label(name: str) -> str:
    """A series' name (a reward function's, from metrics.jsonl) as a legend shows it: control characters escaped,
    and ``$`` kept literal (matplotlib reads ``$…$`` as mathematics, and a malformed formula fails the drawing)."""
    return printable(name, newlines=False).replace("$", r"\$")


def _plot_sections(series: dict[str, dict[str, Series]], plan: PlanRecord | None, out: Path, folder: int) -> list[str]:
    """Each plot drawn into OUT/PLOT.png (``folder``: OUT, open), with the plan's prediction dashed, and embedded as
    an HTML section."""
    import matplotlib.pyplot as plt

    sections = []
    for plot, lines in series.items():
        if not lines:
            continue
        fig = draw(plot, lines, plan)
        png = io.BytesIO()
        fig.savefig(png, format="png")  # drawn in memory: matplotlib would open a path through a link
        plt.close(fig)
        _write(out / f"{plot}.png", folder, png.getvalue())
        data = base64.b64encode(png.getvalue()).decode()
        title = TITLES[plot][0]
        sections.append(f"<h2>{html.escape(title)}</h2><img alt='{plot}' src='data:image/png;base64,{data}'>")
    return sections


def draw(plot: str, lines: dict[str, Series], plan: PlanRecord | None) -> Any:
    """One plot's figure: its measured lines, the plan's prediction dashed in the same colour."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    unit = TITLES[plot][1]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    colors = {}
    for s in lines.values():
        (drawn,) = ax.plot(
            s.steps, s.values, marker="o" if len(s.steps) < 30 else None, markersize=3, label=_label(s.name)
        )
        colors[s.name] = drawn.get_color()
    for name, value in _predicted(plan, plot).items():  # a prediction in its measured line's colour
        color = colors.get(name.removeprefix("planned "), "gray")
        ax.axhline(value, linestyle="--", linewidth=1.2, color=color, label=name)
    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no tick at 1.5
    if plot in FROM_ZERO:
        ax.set_ylim(bottom=0)
    ax.set_ylabel(unit)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _page(view: RunView, series: dict[str, dict[str, Series]], sections: list[str]) -> str:
    plan, root = view.plan, view.root
    name = html.escape(str((plan.recipe if plan else None) or root.name))
    rewards = {k: s.values for k, s in series.get("reward", {}).items()}
    summary, error = summary_rows(view, rewards)
    recipe = sorted((str(k), json.dumps(v)) for k, v in (plan.trainer_values if plan else {}).items())
    logs = log_links(view, view.paths.report)
    return (
        "<!doctype html><meta charset='utf-8'><title>grpo-launch report: "
        + name
        + "</title>"
        + STYLE
        + f"<h1>grpo-launch run report</h1><p class='where'>{name}: {html.escape(str(root))}</p>"
        + _table("summary", "Summary", summary)
        + (f"<h2>Last error</h2><pre id='error'>{html.escape(error)}</pre>" if error else "")
        + _table("plan", "Plan", plan_rows(plan))
        + "".join(sections)
        + "<h2>Logs</h2><ul id='logs'>"
        + "".join(f"<li><a href='{html.escape(href)}'>{html.escape(n)}</a></li>" for n, href in logs)
        + "</ul>"
        + f"<details id='recipe'><summary>Recipe as the trainers read it ({len(recipe)} keys)</summary>"
        + "".join(f"<div><code>{html.escape(k)}</code>: {html.escape(v)}</div>" for k, v in recipe)
        + "</details>"
        + "<script type='application/json' id='series'>"
        + script_json({p: {k: vars(s) for k, s in lines.items()} for p, lines in series.items()})
        + "</script>"
    )


def script_json(value: Any) -> str:
    """``value`` as JSON to embed in a ``<script type="application/json">``: a script's text is not HTML (no entity
    is decoded there, so ``&quot;`` would stay), and only ``<``, ``>`` and ``&`` are escaped, as JSON's own
    ``\\u003c``-style escapes, so that no ``</script>`` or ``<!--`` in a name ends or changes the element; NaN and
    infinities, which JSON lacks, are null."""
    text = json.dumps(_finite(value), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


STYLE = (
    "<style>body{font-family:system-ui,sans-serif;max-width:900px;margin:2em auto;color:#222}img{max-width:100%}"
    "table{border-collapse:collapse;width:100%}th{text-align:left;width:9em;vertical-align:top;padding:.25em .6em}"
    "td{padding:.25em .6em;border-top:1px solid #eee}pre{background:#fff4f4;padding:.8em;white-space:pre-wrap}"
    ".where{color:#666}details div{font-size:90%;padding:.1em 0}</style>"
)


def _table(table_id: str, title: str, rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<h2>{html.escape(title)}</h2><table id='{table_id}'>{body}</table>"


def embedded_series(report_html: str) -> dict[str, Any]:
    """The series a report embeds (for checks and tools)."""
    start = report_html.index("<script type='application/json' id='series'>") + len(
        "<script type='application/json' id='series'>"
    )
    return json.loads(report_html[start : report_html.index("</script>", start)])

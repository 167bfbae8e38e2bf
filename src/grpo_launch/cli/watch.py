"""``grpo-launch status --watch [--interval S]``: a live terminal view of a run (rich Live), redrawn from the run
directory every S seconds: the step and its progress, the ETA (measured and planned), the step's split between
generation and training, the last reward, and each attempt's end as it happens (restarts and their causes). It
draws what ``status`` reads (the rows :func:`grpo_launch.cli.status.watch_rows` makes of a fresh :class:`RunView`
each time) and ends, after a last drawing, when no launcher holds the run any more."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.live import Live
from rich.table import Table

from grpo_launch.analysis.view import RunView
from grpo_launch.errors import GrpoLaunchError
from grpo_launch.rundir.json_fields import RunFileError

DEFAULT_INTERVAL_S = 2.0


def _table(title: str, rows: list[tuple[str, str]]) -> Any:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


def watch(run_dir: Path, interval: float, rows_of: Callable[[RunView], list[tuple[str, str]]]) -> int:
    """Redraw ``rows_of`` a fresh view every ``interval`` seconds until no launcher holds the run (it ended), then
    leave the last drawing on the terminal."""
    title = f"grpo-launch status --watch: {run_dir}"
    seen_running = False
    with Live(_table(title, [("state", "reading the run directory")]), auto_refresh=False) as live:
        while True:
            try:
                view = RunView.load(run_dir, strict=False)
                rows = rows_of(view)
            except RunFileError as exc:  # a file being replaced: the next drawing reads it again
                view, rows = None, [("state", f"reading the run directory: {exc.message}")]
            except OSError as exc:
                view, rows = None, [("state", f"reading the run directory: {exc}")]
            except GrpoLaunchError:  # no launcher yet, no step, no attempt: the run has not started
                view, rows = None, [("state", "waiting for the run to start")]
            if view is not None and view.holder is not None:
                seen_running = True
            ended = view is not None and view.holder is None and (seen_running or view.attempts or view.records)
            live.update(_table(title + ("  (ended)" if ended else ""), rows), refresh=True)
            if ended:
                return 0
            time.sleep(interval)

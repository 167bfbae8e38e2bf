"""The console grpo-launch prints to. On a terminal the trainers' step lines are one live line, rewritten in place
(the latest step, its metrics and ETA) with every other line printed above it; anywhere else (a pipe, CI, a Slurm
log) every line is printed as it comes. A console that went away (a closed pipe: ``| head``, a lost ``tee``; a
hung-up terminal) stops the printing, never the run: stdout then goes to /dev/null."""

from __future__ import annotations

import os
import re
import sys
from typing import TextIO

from grpo_launch.rundir.shown_text import printable

STEP_LINE = re.compile(r"^\[train[^\]]*\] step \d+/\d+ done")


def terminal_columns(stream: TextIO | None = None) -> int:
    """The console's width: COLUMNS when set, else the terminal's, else 80 (a terminal that reports 0 columns, as
    `script` and some `srun --pty` do, counts as none). os's, not shutil's: importing shutil (bz2, lzma) costs
    the plan path a few ms."""
    value = os.environ.get("COLUMNS", "")
    if value.isascii() and value.isdigit() and int(value) > 0:
        return int(value)
    try:
        columns = os.get_terminal_size((stream or sys.stdout).fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = 0
    return columns if columns > 0 else 80


def drop(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at /dev/null (its reader is gone)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, stream.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(null)


class Console:
    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        if live is None:
            try:
                live = self.stream.isatty() and os.environ.get("TERM") != "dumb"
            except (OSError, ValueError):
                live = False
        self.live = live
        self._open = False  # a live line is on screen, without its newline

    def __call__(self, line: str) -> None:
        line = printable(line)  # a log line or a record's text never steers the terminal (this console's own do)
        try:
            if self.live and STEP_LINE.match(line):
                width = terminal_columns(self.stream)
                self.stream.write("\r\x1b[2K" + line[: max(20, width - 1)])
                self._open = True
            else:
                if self._open:
                    self.stream.write("\r\x1b[2K")  # the other line goes above; the live line comes back next step
                    self._open = False
                self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            drop(self.stream)

    def close(self) -> None:
        """End a live line with its newline (the last step stays on screen)."""
        if self._open:
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self._open = False

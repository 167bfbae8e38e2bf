"""Text grpo-launch shows from a run directory, and commands it prints (standard library only).

- :func:`printable`: what a log line, a record's string (a failure's cause, a reward's name) or a child's output may
  carry never reaches the terminal raw: control characters (escape sequences that move the cursor, retitle the
  window, clear the screen, or a carriage return that hides what came before) are shown as ``\\x1b``-style escapes.
- :func:`one_line`: user text (a recipe path) written into a comment of a generated file (``trainer_recipe.yaml``'s
  header) or printed as a comment a user may paste (``--dry-run``) stays on the comment's line: every line break a
  shell or YAML reads (``\n``, ``\r``, and YAML's ``\x85``, ``\u2028``, ``\u2029``) is escaped, so it cannot end the
  comment and start a key (``push_to_hub: true``) or a command.
- :func:`command_line`: every command printed for copy-paste is one POSIX shell level, each word quoted
  (``shlex.join``): a run directory named ``a b``, ``$(…)`` or with a quote or newline in it pastes back as itself.
- :func:`without_colours`, :func:`with_article`, :func:`significant`, :func:`seconds`: a child's colours dropped, "an
  infra failure", numbers with the digits that show them (``training 0.041 s``, ``reward 1.00 ± 0.00``).
- :class:`Raised`: a trainer rank's one-line error (when, where, its traceback's file), written by the training
  entry and read by the launcher's diagnosis.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable
from datetime import datetime

from grpo_launch.spec import frozen

# C0 and C1 controls and DEL, except tab and newline (a newline ends a line: the callers split lines themselves).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: object, *, newlines: bool = True) -> str:
    """``text`` with every control character escaped (``\\x1b``, ``\\r``; newlines too unless ``newlines``)."""
    s = str(text)
    out = _CONTROL.sub(_escape, s)
    return out if newlines else out.replace("\n", "\\n")


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return {"\r": "\\r", "\x0b": "\\v", "\x0c": "\\f"}.get(c) or f"\\x{ord(c):02x}"


def one_line(text: object) -> str:
    """``text`` as one line, for a comment: control characters and every line break escaped (YAML also ends a line
    at U+2028 and U+2029, which are no control characters)."""
    return printable(text, newlines=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def command_line(words: Iterable[object]) -> str:
    """A command to copy and paste: each word quoted for a POSIX shell (the one quoting helper of printed
    commands)."""
    return shlex.join(str(w) for w in words)


def without_colours(text: str) -> str:
    """``text`` without ANSI SGR sequences (``ESC[…m``: colours, bold), which libraries such as wandb put in their
    output: a child's line is shown as its words, and every other control character is still escaped by
    :func:`printable`."""
    return _SGR.sub("", text)


_SGR = re.compile(r"\x1b\[[0-9;:]*m")


def with_article(word: str) -> str:
    """``word`` after its indefinite article, by the sound it starts with (``an infra``, ``an oom``, ``a hang``, ``a
    user``: a "u" said "you", as in user, unit, usual, takes "a")."""
    low = word.lower()
    vowel = low[:1] in "aeiou" and not low.startswith(("us", "uni", "uti", "eu"))
    return f"{'an' if vowel else 'a'} {word}"


def significant(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits, trailing zeros kept (``0.0412``, ``1.00``, ``5.79``), and
    without exponent or digits beyond the point for large values (``12,346``)."""
    if not math.isfinite(value):
        return str(value)
    if value and abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    return f"{value:#.{digits}g}".rstrip(".")


def seconds(value: float) -> str:
    """A duration with the digits that show it: ``0.041 s``, ``0.3 s``, ``3.2 s``, ``1,234 s`` (never ``0.0 s`` for a
    step that took 40 ms)."""
    if not math.isfinite(value) or value >= 100:
        return f"{value:,.0f} s" if math.isfinite(value) else f"{value} s"
    return f"{value:.1f} s" if value >= 1 else f"{value:.2g} s"


@frozen
class Raised:
    """A trainer rank's error as its one console line states it: the exception, when the rank caught it (epoch
    seconds, the rank's clock), the frame of the user's code that raised it, and the file holding its traceback.

    The training entry writes it (:func:`grpo_launch.train.console.report_error`) and the launcher reads it
    (:mod:`grpo_launch.execute.faults`): the root cause is the error raised first, which is not the one whose line
    arrived first (a rank prints its traceback after formatting it, lines from other hosts arrive later)."""

    error: str  # "ValueError: the reward broke"
    at: float
    frame: str | None = None  # "reward at /home/me/rewards.py:12"
    traceback: str | None = None

    def text(self) -> str:
        when = datetime.fromtimestamp(self.at).astimezone().isoformat(timespec="microseconds")
        said = f"raised {when}" + (f" in {self.frame}" if self.frame else "")
        return f"{self.error} ({said}{f'; traceback: {self.traceback}' if self.traceback else ''})"

    @classmethod
    def parse(cls, text: str) -> Raised | None:
        """The error a line states (without a rank's prefix), or None: the line is not one."""
        m = _RAISED.match(text)
        if m is None:
            return None
        try:
            at = datetime.fromisoformat(m["at"]).timestamp()
        except ValueError:
            return None
        return cls(m["error"], at, m["frame"], m["traceback"])


_RAISED = re.compile(
    r"^(?P<error>\S.*?) \(raised (?P<at>\S+)(?: in (?P<frame>.+?))?(?:; traceback: (?P<traceback>.+))?\)$"
)

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
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

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

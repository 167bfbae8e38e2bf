"""``RUN_DIR/invocation.json``: the command that started the run, as a typed record (standard library only), so that
``grpo-launch resume RUN_DIR`` can run exactly that command again: the verb, the recipe path and its overrides as
given, every flag that was set (the backend's among them: ``--hostfile``, ``--slurm``, ``--ray``, ``--gpus``,
``--max-restarts`` …), the arguments passed on to the batch system, the working directory the relative paths are
relative to, the run directory and the grpo-launch version.

Written by ``grpo-launch run`` once the run holds its run directory (a run refused before that writes nothing), and
by ``sbatch``, ``ray-submit`` and ``sky --launch`` when they submit. Inside a submitted job, the job's own ``run``
keeps the submitter's record: resuming such a run submits it again (grpo_launch.backends.job_backend).

Never a secret: a value that looks like one (by :func:`grpo_launch.spec.redact_arg`'s rule: an override or
``--flag=`` whose name says token, secret, password or key, a mapping holding such a name, a value shaped like a
Hugging Face, OpenAI, GitHub, AWS or Slack token, a URL with a password in it) is written as ``<redacted>`` and its
name kept in ``redacted``. Tokens travel by environment variable name only (launch.pass_env). ``from_json`` is strict:
a missing or mistyped key is a RunFileError naming the file and the key.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

from grpo_launch.rundir.json_fields import Fields, file_error, loads
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.trusted_files import private_dir, read_own_text, read_text
from grpo_launch.spec import REDACTED, frozen, is_secret_name, redact_arg, redact_argv


@frozen
class Flag:
    """One flag as it was given: ``--hostfile hosts.txt`` (value) or ``--slurm`` (None)."""

    flag: str
    value: str | None = None

    @property
    def argv(self) -> list[str]:
        return [self.flag] if self.value is None else [self.flag, self.value]


@frozen
class Invocation:
    """The command that started a run (see the module's docstring). ``argv`` is it again, without the program
    name; ``redacted`` names the values that were secrets and are not recorded."""

    verb: str
    recipe: str
    overrides: tuple[str, ...]
    flags: tuple[Flag, ...]
    extra_args: tuple[str, ...]
    backend: str
    run_dir: str
    workdir: str
    version: str
    redacted: tuple[str, ...] = ()
    job_id: str | None = None  # the batch job a submitter's record submitted

    @classmethod
    def of(cls, verb: str, recipe: str, overrides: list[str], flags: list[Flag], **rest: Any) -> Invocation:
        """A record of the command, each secret-looking value redacted (its name kept in ``redacted``)."""
        names: list[str] = []
        kept = [redact_arg(o, names) for o in overrides]
        kept_flags = [Flag(f.flag, _redact_value(f.flag, f.value, names)) for f in flags]  # --ssh-option K=V too
        extra = redact_argv(rest.pop("extra_args", ()), names)  # --comment=…, --export=…
        return cls(verb, recipe, tuple(kept), tuple(kept_flags), tuple(extra), redacted=tuple(names), **rest)

    def flag(self, name: str) -> str | None:
        """The last value given for ``name`` (None: not given, or a flag without a value)."""
        return next((f.value for f in reversed(self.flags) if f.flag == name), None)

    @property
    def argv(self) -> list[str]:
        flags = [a for f in self.flags for a in f.argv]
        extra = ["--", *self.extra_args] if self.extra_args else []
        return [self.verb, self.recipe, *self.overrides, *flags, *extra]

    @property
    def command(self) -> str:
        """The command as a shell line (shell-quoted)."""
        return shlex.join(["grpo-launch", *self.argv])

    def to_json(self) -> dict[str, Any]:
        return {
            "verb": self.verb,
            "recipe": self.recipe,
            "overrides": list(self.overrides),
            "flags": [[f.flag, f.value] for f in self.flags],
            "extra_args": list(self.extra_args),
            "backend": self.backend,
            "run_dir": self.run_dir,
            "workdir": self.workdir,
            "grpo_launch_version": self.version,
            "redacted": list(self.redacted),
            "job_id": self.job_id,
        }

    @classmethod
    def from_json(cls, data: Any, file: str | Path = "invocation.json") -> Invocation:
        """Strict: raises RunFileError naming ``file`` and the key missing or mistyped."""
        f = Fields(data, file)
        flags = []
        for i, pair in enumerate(f.sequence("flags")):
            ok = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and pair[0].startswith("-")
            if not ok or not isinstance(pair[1], (str, type(None))):
                raise file_error(file, "", f"key 'flags[{i}]' must be a [flag, value or null] pair, got {pair!r}")
            flags.append(Flag(pair[0], pair[1]))
        return cls(
            verb=f.text("verb"),
            recipe=f.text("recipe"),
            overrides=_strings(f, "overrides"),
            flags=tuple(flags),
            extra_args=_strings(f, "extra_args"),
            backend=f.text("backend"),
            run_dir=f.text("run_dir"),
            workdir=f.text("workdir"),
            version=f.text("grpo_launch_version"),
            redacted=_strings(f, "redacted"),
            job_id=f.text_or_none("job_id"),
        )


def _strings(f: Fields, key: str) -> tuple[str, ...]:
    values = f.sequence(key)
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise file_error(f.file, "", f"key '{key}[{i}]' must be a string, got {v!r}")
    return tuple(values)


def _redact_value(name: str, value: str | None, names: list[str]) -> str | None:
    """A flag's value: all of it when the flag names a secret, else as :func:`redact_arg` reads a word."""
    if value is None:
        return None
    if is_secret_name(name) and name.startswith("-") and not value.startswith("-"):
        names.append(name)
        return REDACTED
    found: list[str] = []
    kept = redact_arg(value, found)
    names += [name if n == "a positional argument" else n for n in found]
    return kept


__all__ = ["REDACTED", "Flag", "Invocation", "read_invocation", "redact_argv", "write_invocation"]


def read_invocation(path: str | Path, *, to_run: bool = False) -> Invocation | None:
    """The record at ``path``, None when there is none; one that does not read is a RunFileError naming it.
    ``to_run``: the command will be run again (``resume``), so a record another user could have rewritten (not
    yours, group- or world-writable, or in a directory they may write in) is refused: a LaunchError naming it."""
    try:
        text = read_own_text(path) if to_run else read_text(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise file_error(path, "", f"cannot be read ({exc.strerror or exc})") from None
    try:
        data = loads(text)
    except ValueError as exc:
        raise file_error(path, "", f"not JSON ({exc})") from None
    return Invocation.from_json(data, path)


def write_invocation(record: Invocation) -> None:
    """Into ``record.run_dir``, atomically (a temporary file renamed: a crash leaves the old record or the new one).
    The callers hold the run directory, or have checked that no run holds it (:func:`.files.write_run_files`)."""
    path = RunPaths(record.run_dir).invocation
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600: resume runs what it holds
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

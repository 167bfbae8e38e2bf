"""Data, below every stage: :func:`frozen`, how every value type of the package is declared; the ProcessSpec a plan's
processes become (render makes them, backends place them on their hosts, the supervisor starts them), the
RunContext a run gets from the process that starts it, and the RunResult a run ends with, with its Failure (the CLI
turns it into an exit code).

And the one rule for secrets: :func:`is_secret_name` (the recipe refuses such names in its env blocks) and
:func:`redact_argv` / :func:`redact_env`, which every command line and environment that is printed or written down
goes through (plan.json, ``--dry-run``, the run lock, invocation.json, launcher.log)."""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import FrozenInstanceError, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from grpo_launch.enums import FailureKind, Role, RunState

T = TypeVar("T")

REDACTED = "<redacted>"
# A name whose last word says it holds a secret: hub_token, WANDB_API_KEY, OPENAI_KEY, PGPASSWORD, launch.train_env.
# HF_TOKEN, --hf-token; GITHUB_PAT (a personal access token: GitHub's, GitLab's, Azure DevOps' name), MYSQL_PWD and
# SMTP_PASS (PWD and PASS after a word: PWD alone is the shell's working directory, BYPASS no password). Not a name
# with it inside (PasswordAuth, TOKENIZERS_PARALLELISM, max_new_tokens), nor one that says where a secret is
# (KEY_PATH, PASSWORD_FILE: the value is a path, and the secret never reaches a command line).
_SECRET_NAME = re.compile(
    r"(token|secret|passw(or)?d|passphrase|(^|[_-])key|api[_-]?key|access[_-]?key|private[_-]?key|credentials?"
    r"|[_-](pat|pwd|pass))$",
    re.I,
)
# A numbered secret is one too (API_KEY_2, HF_TOKEN2): the number is dropped before the name is read.
_NUMBERED = re.compile(r"[_-]?[0-9]+$")
# A value shaped like a Hugging Face, OpenAI, GitHub, AWS or Slack token, whatever its name.
_SECRET_VALUE = re.compile(
    r"^(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|AKIA[0-9A-Z]{16}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,})$"
)
# A password in a URL's user part, anywhere in a value (postgres://user:pw@host/db, redis://:pw@host:6379).
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@:]*:[^/\s@]+@")
# A secret name as a key inside a value: {WANDB_API_KEY: x} (a YAML mapping override), ALL,HF_TOKEN=x (--export=);
# not an import path's colon ([rewards.judge_key:score]).
_NAME_INSIDE = re.compile(r"(?:^|[{,])\s*[\"']?([A-Za-z_][A-Za-z0-9_.-]*)[\"']?\s*(?:=|:(?=[\s\"'{\[]|$))")
# A secret assigned inside a connection string: libpq's "host=h password=pw", ODBC's "Server=h;Pwd=pw".
_ASSIGNED_INSIDE = re.compile(r"(?:^|[\s;])([A-Za-z_][A-Za-z0-9_.-]*)\s*=")


def is_secret_name(name: str) -> bool:
    """Whether a variable, key or flag name says it holds a secret: the last part of a dotted key, without a flag's
    dashes and a trailing number, ends in token, secret, password, key, api_key, credentials, _pat, _pwd …"""
    return bool(_SECRET_NAME.search(_NUMBERED.sub("", name.rsplit(".", 1)[-1].lstrip("-"))))


def looks_secret(value: str) -> bool:
    """Whether a value is one, whatever its name: token-shaped (hf_…, sk-…, ghp_…, AKIA…), or a URL with a
    password in it."""
    return bool(_SECRET_VALUE.match(value) or _URL_PASSWORD.search(value))


def holds_secret(name: str, value: str) -> bool:
    """Whether ``name=value`` is redacted when printed or written down (:func:`redact_env`), and so must never
    travel on a command line either (the remote backends send it on stdin): the name says so, the value looks like
    a secret, or the value assigns one (``{JUDGE_KEY: x}``, ``host=h password=pw``). An empty value holds none (the
    vLLM server's emptied VLLM_API_KEY, render/processes.py, is shown as it is)."""
    if not value:
        return False
    if is_secret_name(name) or looks_secret(value):
        return True
    if any(is_secret_name(m.group(1)) for m in _NAME_INSIDE.finditer(value)):
        return True
    # In a connection string a bare PWD or PASS is the password (ODBC's "UID=u;PWD=pw").
    return any(is_secret_name(k) or k.lower() in ("pwd", "pass") for k in _ASSIGNED_INSIDE.findall(value))


def redact_arg(arg: str, names: list[str] | None = None) -> str:
    """One word of a command line with its secret redacted: ``KEY=VALUE`` (an override, an env assignment,
    ``--flag=VALUE``) when the key names a secret or the value holds one, a bare token-shaped word, or each word
    of a shell line given as one argument (``ssh HOST -- 'cd … && exec …'``). ``names`` collects what was redacted."""
    seen = names if names is not None else []
    key, sep, value = arg.partition("=")
    if sep and " " not in key and holds_secret(key, value):
        seen.append(key)
        return f"{key}={REDACTED}"
    if looks_secret(arg):
        seen.append("a positional argument")
        return REDACTED
    if " " in arg:
        try:
            words = shlex.split(arg)
        except ValueError:
            return arg
        kept = redact_argv(words, seen)
        return arg if kept == words else shlex.join(kept)
    return arg


def redact_argv(argv: Sequence[str], names: list[str] | None = None) -> list[str]:
    """A command line as it may be printed or written down: each word through :func:`redact_arg`, and the value
    after a flag that names a secret (``--hf-token VALUE``)."""
    out: list[str] = []
    after_secret_flag = False
    for arg in argv:
        if after_secret_flag and not arg.startswith("-"):
            if names is not None:
                names.append(out[-1])
            out.append(REDACTED)
        else:
            out.append(redact_arg(arg, names))
        after_secret_flag = arg.startswith("-") and "=" not in arg and is_secret_name(arg)
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment as it may be printed or written down: a secret's value redacted, its name kept."""
    return {k: REDACTED if holds_secret(k, v) else v for k, v in env.items()}


def _compared(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in fields(obj) if f.compare)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _compared(self) == _compared(other)


def _hash(self: Any) -> int:
    hashed = (f for f in fields(self) if (f.compare if f.hash is None else f.hash))
    return hash(tuple(getattr(self, f.name) for f in hashed))


def _repr(self: Any) -> str:
    shown = (f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
    return f"{type(self).__qualname__}({', '.join(shown)})"


if TYPE_CHECKING or sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # Python 3.10: the decorator only informs type checkers

    def dataclass_transform(**_: Any) -> Any:
        return lambda f: f


def _setattr(self: Any, name: str, value: Any) -> None:
    # dataclasses' __init__ sets each field once (``self.name = value``); after it, every field is set. Only fields:
    # a ClassVar or an InitVar is in __dataclass_fields__ too, and not in fields().
    values = self.__dict__
    if name in values or name not in type(self)._field_names:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")
    values[name] = value


def _delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def frozen(cls: type[T]) -> type[T]:
    """A frozen dataclass whose equality, hashing, repr and immutability are shared by every value type instead of
    generated and compiled for each: ``dataclass(frozen=True)`` compiles an __init__, a __setattr__ and a __delattr__
    per class, 1.7 ms a class against 0.4 ms for the __init__ alone (Python 3.11, 200 six-field classes timed), and
    about 75 value types are on ``grpo-launch plan``'s path (scripts/bench_plan.py times the command). The shared
    methods read the fields as the generated ones would, and raise dataclasses' FrozenInstanceError as theirs do; only
    __init__ is dataclasses' own. As every value type is declared with this decorator, a subclass must be too
    (dataclasses refuses a ``frozen=True`` subclass of it)."""
    cls = dataclass(eq=False, repr=False)(cls)
    cls.__eq__ = _eq  # type: ignore[method-assign]
    cls.__hash__ = _hash  # type: ignore[method-assign]
    cls.__repr__ = _repr  # type: ignore[method-assign]
    cls._field_names = frozenset(f.name for f in fields(cls))  # type: ignore[attr-defined, arg-type]
    cls.__setattr__ = _setattr  # type: ignore[method-assign]
    cls.__delattr__ = _delattr  # type: ignore[method-assign]
    return cls


@frozen
class ProcessSpec:
    """One process: argv, the environment it adds to the parent's, where it runs and which GPUs it may use.

    ``gpus`` are the planned GPU ids on ``host`` (visible ids: indices or UUIDs as the host names them); None
    leaves CUDA_VISIBLE_DEVICES as inherited, () hides every GPU. A local backend turns them into
    CUDA_VISIBLE_DEVICES; a remote one hands them to :mod:`grpo_launch.node.shim` as positions.
    """

    name: str  # vllm | train | train@host
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    host: str | None = None  # None: this machine
    role: Role = Role.TRAIN
    gpus: tuple[str, ...] | None = None
    # Names of variables sent on stdin as KEY=JSON lines (secrets: never on a command line or in a file).
    stdin_env: tuple[str, ...] = ()
    # The process announces the id of a process group on a remote host (grpo_launch.node.shim --announce-pgid),
    # and teardown must signal that group there: killing the local client (ssh) does not stop it.
    remote_group: bool = False
    # AMD GPUs (ROCm): HIP_VISIBLE_DEVICES is set to the same list. torch prefers it to CUDA_VISIBLE_DEVICES, and
    # vLLM refuses to start when the two differ (vllm/platforms/rocm.py: _sync_hip_cuda_env_vars).
    rocm: bool = False

    @property
    def launch_env(self) -> dict[str, str]:
        """The variables added to the parent's environment, CUDA_VISIBLE_DEVICES from ``gpus`` included."""
        env = dict(self.env)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
            if self.rocm:
                env["HIP_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
        return env

    def shell(self) -> str:
        """The command as one shell line (env assignments first), for --dry-run and docs: secrets redacted (a
        line to read, never to run)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(self.launch_env).items())
        line = (env + " " if env else "") + shlex.join(redact_argv(self.argv))
        if self.stdin_env:
            line += f"  # on stdin: {', '.join(self.stdin_env)}"
        return line


@frozen
class RunContext:
    """What a run needs from the process that starts it, read once (instead of sys.executable, os.getcwd() and
    os.environ here and there). ``emit`` prints one line; the CLI owns it."""

    python: str
    workdir: str
    environ: Mapping[str, str]
    emit: Callable[[str], None]

    @classmethod
    def current(cls, environ: Mapping[str, str], emit: Callable[[str], None]) -> RunContext:
        """This process's interpreter and working directory."""
        return cls(sys.executable, os.getcwd(), dict(environ), emit)


@frozen
class Failure:
    """Why a run failed, as :func:`grpo_launch.execute.faults.diagnose` found it across every process: its kind,
    the root cause line (prefixes removed), where it happened ("train rank 1", "vllm EngineCore_DP0") and which
    side of the run that was."""

    kind: FailureKind
    cause: str | None = None
    where: str | None = None
    side: Role | None = None  # the vLLM server or the trainers; None when no process is to blame

    @property
    def retryable(self) -> bool:
        """A restart from the newest checkpoint may get past it (a lost process, host or network; a hang)."""
        return self.kind.retryable

    def headline(self) -> str | None:
        if not self.cause:
            return None
        return f"[{self.where}] {self.cause}" if self.where else self.cause


@frozen
class RunResult:
    """How a run ended. ``exit_code`` is what the CLI returns: 0, 1 for a failure, 128+N after signal N.

    For a failure ``message`` names the failing process and its log, ``detail`` holds the root cause and the log's
    last lines, ``failure`` what kind of failure it was and where."""

    state: RunState
    exit_code: int
    message: str = ""
    detail: str | None = None
    failed_process: str | None = None
    log: str | None = None
    stopped_at_step: int | None = None
    failure: Failure | None = None
    restarts: int = 0

    @property
    def ok(self) -> bool:
        return self.state in (RunState.SUCCEEDED, RunState.STOPPED_FOR_CHECKPOINT)

    @property
    def cause(self) -> str | None:
        """The root cause line, with where it happened."""
        return self.failure.headline() if self.failure else None

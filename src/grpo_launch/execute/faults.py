"""What went wrong in a run, read from its processes' output. Pure: lines in, a Failure out.

The supervisor notes every line that looks like an error as an :class:`Event` (when it arrived, from which process).
:func:`diagnose` picks the root cause: the *first* real error across every process and host, not the last line of
the process that happened to exit first. A survivor's "Connection closed by peer" or torchrun's ChildFailedError are
consequences (``SECONDARY``), chosen only when nothing else was seen. It also sorts the failure into a kind that says
whether a restart can help: the user's code or configuration (never retried), a lost process or network error
(retried with ``launch.max_restarts``), an out-of-memory error (replanned with ``launch.on_oom: replan``), a full
disk, a hang.

A trainer rank states its error in one line (:class:`~grpo_launch.rundir.shown_text.Raised`: when it was raised, the
user's frame, the file holding the traceback), and the root cause is the error *raised* first by those times; a line
that states no time counts from its arrival. :class:`ConsoleFilter` keeps tracebacks, torchrun's failure report and the
ranks' stated errors off the console (they stay in the logs): the run's summary names the root cause once.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence

from grpo_launch.enums import FailureKind, Role
from grpo_launch.rundir.shown_text import Raised
from grpo_launch.spec import Failure, frozen


@frozen
class Event:
    """An error-looking line as the supervisor saw it."""

    time: float  # when it arrived (the supervisor's clock)
    process: str  # vllm | train | train@host
    line: str
    role: Role | None = None  # the side of the run the process is on


# torchrun's "[rank1]: " on a rank's lines; vLLM's "(EngineCore_DP0 pid=123) " on its processes' lines.
_PREFIX = re.compile(r"^\s*(?:\[(?P<rank>rank\d+)\]: ?|\((?P<proc>[\w.-]+) pid=\d+\) ?)")
_EXCEPTION = re.compile(r"^((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Exit)\b:?.*)$")
_VLLM_ERROR = re.compile(r"^ERROR \d\d-\d\d [\d:]+(?:\.\d+)? \[[^\]]*\] (.+)$")
_TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: \d+\)")
_TORCHRUN_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+) \(pid: \d+\)")
# Consequences of a failure elsewhere, never its cause (while anything else was seen).
SECONDARY = re.compile(
    r"ChildFailedError|error_file|Connection closed by peer|Connection reset by peer|Broken pipe|BrokenPipeError|"
    r"DistBackendError|SignalException|KeyboardInterrupt|Signal \d+ \(SIG\w+\) received|ProcessGroup\w*.*(?:abort|"
    r"timed out)|See root cause above|EngineDeadError|EngineCore encountered an issue|"
    r"APIServer.*(?:shutting down|terminated)|Stopped by grpo-launch|SystemExit",
    re.IGNORECASE,
)
_OOM = re.compile(
    r"out of memory|OutOfMemoryError|No available memory for the cache blocks|larger than the available KV cache|"
    r"Cannot allocate memory|MemoryError",
    re.IGNORECASE,
)
# torch's writer hides ENOSPC: a save into a full disk fails with "unexpected pos …" or "failed writing file".
_DISK_FULL = re.compile(
    r"No space left on device|Errno 28|Disk quota exceeded|PytorchStreamWriter failed writing|unexpected pos \d+"
)
_INFRA = re.compile(
    r"NCCL (?:error|WARN)|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|Connection refused|"
    r"ECC error|Xid|uncorrectable|device-side assert|cudaErrorLaunchFailure|unspecified launch failure|"
    r"Socket Timeout|Timed out waiting|ssh: connect to host|Connection timed out|Host is unreachable|"
    r"ActorDiedError|ActorUnavailableError|NodeDiedError|RayActorError",  # the Ray backend's runner: a lost actor
    re.IGNORECASE,
)
_MARKERS = ("Error", "Exception", "error", "ERROR", "Killed", "exitcode", "local_rank:", "out of memory",
            "No space left", "Timeout", " (raised ")  # fmt: skip


def looks_like_error(line: str) -> bool:
    """A cheap filter for the supervisor's pump: might this line matter to :func:`diagnose`?"""
    return any(m in line for m in _MARKERS)


def _strip(line: str) -> tuple[str, str | None]:
    """The line without torchrun's / vLLM's prefix (and a progress bar before it), and the rank or process it
    names."""
    text = line.rsplit("\r", 1)[-1]
    for marker in ("[rank", "(EngineCore", "(APIServer", "(Worker", "(VllmWorker"):
        cut = text.find(marker)
        if cut > 0:
            text = text[cut:]
    m = _PREFIX.match(text)
    if not m:
        return text.rstrip(), None
    who = m.group("rank") or m.group("proc")
    return text[m.end() :].rstrip(), who.replace("rank", "rank ") if who and who.startswith("rank") else who


def _candidate(text: str) -> str | None:
    """The error a line states, if it states one: an exception line, or a vLLM ERROR record (never an indented line
    of a traceback: its source lines quote the code that raised)."""
    if text[:1].isspace():
        return None
    m = _EXCEPTION.match(text)
    if m and "error_file" not in text:
        return m.group(1).strip()
    v = _VLLM_ERROR.match(text)
    if v:
        return v.group(1).strip()
    if _OOM.search(text) or _DISK_FULL.search(text):
        return text
    return None


def root_cause(lines: Sequence[str]) -> str | None:
    """The root cause in one process's lines (no arrival times: their order)."""
    failure = diagnose([Event(float(i), "", line) for i, line in enumerate(lines)])
    return failure.cause


def torchrun_root(events: Sequence[Event]) -> tuple[str, int, int] | None:
    """(process, rank, exit code) of torchrun's "Root Cause (first observed failure)" summary: its last rank /
    exitcode pair."""
    out, rank = None, None
    for e in events:
        if (r := _TORCHRUN_RANK.match(e.line)) is not None:
            rank = int(r.group(1))
        elif (x := _TORCHRUN_EXIT.match(e.line)) is not None and rank is not None:
            out = (e.process, rank, int(x.group(1)))
    return out


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name if code < 0 else f"exit code {code}"
    except ValueError:
        return f"exit code {code}"


@frozen
class Diagnosis:
    """:func:`explain`'s answer: the Failure, and for an error a rank stated, what it said besides (``raised``: its
    frame and traceback file); ``stated`` is False when no real error was seen (only consequences, or nothing)."""

    failure: Failure
    raised: Raised | None = None
    stated: bool = False


def diagnose(events: Iterable[Event], *, exits: Sequence[tuple[str, int | None, Role | None]] = ()) -> Failure:
    """The root cause of a failed run: the earliest real error across processes (secondary ones only if nothing
    else), its kind, where it happened and on which side. ``exits`` are (process, exit code, role) of the processes
    that ended."""
    return explain(events, exits=exits).failure


def explain(events: Iterable[Event], *, exits: Sequence[tuple[str, int | None, Role | None]] = ()) -> Diagnosis:
    """:func:`diagnose`, with what the root cause's own line said besides (a rank's frame and traceback file)."""
    ordered = sorted(events, key=lambda e: e.time)
    found: list[tuple[float, str, str | None, bool, Role | None, Raised | None]] = []
    for e in ordered:
        text, who = _strip(e.line)
        raised = Raised.parse(text)
        said = raised.error if raised is not None else _candidate(text)
        if said is not None:
            at = " ".join(x for x in (e.process, who) if x) or None
            when = min(raised.at, e.time) if raised is not None else e.time  # raised, not arrived (nor after it)
            found.append((when, said, at, bool(SECONDARY.search(said)), e.role, raised))
    found.sort(key=lambda f: f[0])  # stable: lines of one time keep their order of arrival
    primary = [f for f in found if not f[3]]
    cause: str | None = None
    where: str | None = None
    side: Role | None = None
    first: Raised | None = None
    if primary or found:
        _, cause, where, _, side, first = (primary or found)[0]
    if any(_DISK_FULL.search(c) for _, c, *_ in found):
        kind = FailureKind.DISK_FULL
    elif any(_OOM.search(c) for _, c, *_ in primary):
        kind = FailureKind.OOM
    elif not primary or (cause and _INFRA.search(cause)):
        kind = FailureKind.INFRA  # only consequences were seen: a process was killed or a peer was lost
    else:
        kind = FailureKind.USER
    if not primary:
        root = torchrun_root(ordered)
        signalled = [(p, c, r) for p, c, r in exits if c is not None and (c < 0 or c in (137, 139, 255))]
        if root is not None and root[2] < 0:
            cause, where, side = f"killed by {_signal_name(root[2])}", f"{root[0]} rank {root[1]}".strip(), Role.TRAIN
        elif signalled:
            process, code, side = signalled[0]
            cause, where = f"ended by {_signal_name(code)} (killed, or its host was lost)", process
    return Diagnosis(Failure(kind, cause, where, side), first if primary else None, bool(primary))


# torch.distributed.elastic's own log lines of a failure: what it does about a failed rank (the summary says why).
_TORCHRUN_LOG = re.compile(
    r"^[IWE]\d{4} [\d:.]+ +\d+ \S*torch/distributed/elastic/\S+\] (?:Sending process \d+ closing signal|failed \()"
)
_RULE = re.compile(r"^={20,}$")  # torchrun's failure report opens and closes with one
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


class ConsoleFilter:
    """Which of one process's output lines the console shows (every line goes to its log first): a traceback
    (from ``Traceback (most recent call last):`` to its exception line, chained ones too), torchrun's failure report
    after its ChildFailedError, torch.distributed.elastic's lines about the failed rank, and a rank's stated error
    (:class:`Raised`) stay in the logs; the run's summary names the root cause once, with its log. A traceback's
    exception line is still shown unless it is a consequence (:data:`SECONDARY`): a library may print one and go on.

    Pure: one instance per process, fed its lines in order (each rank's lines, told apart by their prefix, on their
    own)."""

    def __init__(self) -> None:
        self._state: dict[str, str] = {}  # per rank or vLLM process: "", "traceback", "after" (its end), "report"

    def show(self, line: str) -> str | None:
        """``line`` as the console shows it, or None: the logs alone keep it."""
        text, who = _strip(line)
        key, body = who or "", text.strip()
        state = self._state.get(key, "")
        if state == "report":
            if _RULE.match(body):
                self._state[key] = ""
            return None
        if body.startswith("Traceback (most recent call last):"):
            self._state[key] = "traceback"
            return None
        if state == "traceback":
            if not body or text[:1].isspace():  # its frames, source lines and carets
                return None
            self._state[key] = "after"  # the exception line ends it
            return None if SECONDARY.search(body) else f"{line} (traceback in the log)"
        if state == "after":
            if not body or body.startswith(_CHAINED):
                return None
            if _RULE.match(body):
                self._state[key] = "report"
                return None
            self._state[key] = ""
        if _TORCHRUN_LOG.match(body) or Raised.parse(body) is not None:
            return None
        return line


_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def stuck_frames(text: str) -> dict[str, str]:
    """From faulthandler dumps (``[rankN]: ``-prefixed under torchrun): each rank's innermost frame of the thread
    that took the signal (its main thread), as ``func (file:line)``."""
    current: dict[str, bool] = {}
    out: dict[str, str] = {}
    for raw in text.splitlines():
        body, who = _strip(raw)
        key = who or ""
        header = _THREAD.match(body)
        if header:
            current[key] = header.group(1) == "Current thread"
            continue
        frame = _FRAME.match(body)
        if frame and current.get(key) and key not in out:
            out[key] = f"{frame['func']} ({frame['file']}:{frame['line']})"
    return out

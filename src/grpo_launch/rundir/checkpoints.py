"""The checkpoints in a run's ``output_dir``: which are complete, which one a run resumes from, whether the run is
already complete, and setting aside what must not be resumed. The launcher decides; the trainers get the decision
(GRPO_LAUNCH_RESUME) so every rank resumes from the same checkpoint.

A checkpoint is complete when every file the Trainer and DeepSpeed wrote in it is whole: ``trainer_state.json``
(written last, by rank 0) parses, safetensors files are as long as their header says, torch files (``.pt``,
``.pth``, ``.bin``: zip archives) have their central directory, and DeepSpeed's ``latest`` names a tag directory that
exists. A disk that filled up mid-save leaves a file that fails one of these. Nothing here imports torch.
"""

from __future__ import annotations

import json
import re
import struct
import time
import zipfile
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from grpo_launch.enums import ResumeMode
from grpo_launch.errors import ConfigError
from grpo_launch.rundir.json_fields import loads
from grpo_launch.rundir.layout import COMPLETE_MARKER, NO_RESUME
from grpo_launch.rundir.records import CompletionRecord
from grpo_launch.rundir.trusted_files import check_trusted, open_nofollow
from grpo_launch.spec import frozen

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _safetensors_problem(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                return "header cut short"
            header = loads(f.read(n))
    except (OSError, struct.error, ValueError) as exc:
        return f"unreadable ({exc.__class__.__name__})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    if ends and 8 + n + max(ends) > size:
        return f"{size} bytes, its header describes {8 + n + max(ends)}"
    return None


def file_problem(path: Path) -> str | None:
    """Why a checkpoint file is not whole, or None."""
    suffix = path.suffix
    if suffix == ".safetensors":
        return _safetensors_problem(path)
    if suffix in (".pt", ".pth", ".bin"):
        try:
            with zipfile.ZipFile(path) as z:
                z.infolist()
        except (OSError, zipfile.BadZipFile, EOFError, ValueError):
            return "not a whole torch archive"
        return None
    if suffix == ".json":
        try:
            loads(path.read_text())
        except (OSError, ValueError):
            return "not whole JSON"
    return None


def checkpoint_problems(directory: Path) -> list[str]:
    """What is missing or broken in a checkpoint directory (empty: complete)."""
    problems = []
    state = directory / "trainer_state.json"
    if not state.is_file():
        problems.append("no trainer_state.json (the save did not finish)")
    latest = directory / "latest"
    if latest.is_file():
        tag = latest.read_text(errors="replace").strip()
        if not (directory / tag).is_dir():
            problems.append(f"DeepSpeed's latest names {tag!r}, which is missing")
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            why = file_problem(path)
            if why:
                problems.append(f"{path.relative_to(directory)}: {why}")
    return problems


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """The ``checkpoint-N`` directories, by step."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return sorted(found)


def completed(output_dir: Path) -> CompletionRecord | None:
    """The training entry's record of a finished run (step, max_steps, when), or None (none, or one that does not
    read: the run is then resumed, never skipped on a guess)."""
    try:
        data = loads((output_dir / COMPLETE_MARKER).read_text())
        return CompletionRecord.from_json(data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError, OverflowError):
        return None


def mark_complete(output_dir: str | Path, record: CompletionRecord) -> None:
    """The training entry's one way to write the completion marker (rank 0, after the final save)."""
    with open_nofollow(Path(output_dir, COMPLETE_MARKER), "w") as f:
        f.write(json.dumps(record.to_json()) + "\n")


def set_aside(path: Path, label: str) -> Path:
    """Rename ``path`` within its directory so neither the Trainer's resume nor its checkpoint rotation sees it
    (their pattern is ``checkpoint-*``); nothing is deleted."""
    target = path.with_name(f"{label}-{path.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    path.rename(target)
    return target


@frozen
class Resume:
    """What a run starts from: a checkpoint (None: fresh), whether it is already complete, what was set aside."""

    checkpoint: Path | None
    already_complete: CompletionRecord | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def env_value(self) -> str:
        return str(self.checkpoint) if self.checkpoint else NO_RESUME


def max_steps_of(values: Mapping[str, Any]) -> int | None:
    """The recipe's max_steps when it sets the training's length (a positive count); None: the epochs do."""
    value = values.get("max_steps")
    return int(value) if isinstance(value, int) and value > 0 else None


def decide_resume(output_dir: Path, mode: ResumeMode, max_steps: int | None) -> Resume:
    """``auto``: the newest complete checkpoint (damaged newer ones are set aside, and said so), or fresh; a run
    whose final model was saved at ``max_steps`` or beyond is complete. ``never``: fresh; earlier checkpoints and
    the completion record are set aside. ``must``: the newest complete checkpoint, else an error."""
    if mode not in tuple(ResumeMode):
        raise ConfigError(f"--resume must be one of {', '.join(ResumeMode)}, got {mode!r}")
    check_trusted(output_dir, "output_dir", flag="output_dir=DIR")  # before anything in it is read, moved or loaded
    notes: list[str] = []
    done = completed(output_dir)
    if mode == ResumeMode.NEVER:
        moved = [set_aside(p, "superseded") for _, p in checkpoints(output_dir)]
        if done is not None:
            set_aside(output_dir / COMPLETE_MARKER, "superseded")
        if moved:
            notes.append(f"--resume never: set aside {len(moved)} earlier checkpoint(s) as {moved[0].name}, …")
        return Resume(None, None, tuple(notes))
    if mode == ResumeMode.AUTO and done is not None and (not max_steps or max_steps <= 0 or done.step >= max_steps):
        return Resume(None, done, ())
    chosen = None
    for step, path in reversed(checkpoints(output_dir)):
        problems = checkpoint_problems(path)
        if not problems:
            chosen = path
            break
        aside = set_aside(path, "damaged")
        notes.append(f"skipped damaged checkpoint-{step} ({problems[0]}); set aside as {aside.name}")
    if chosen is not None:
        check_trusted(chosen, "checkpoint", flag="--resume never, or output_dir=DIR")  # the trainers unpickle it
    if mode == ResumeMode.MUST and chosen is None:
        raise ConfigError(
            f"--resume must: no complete checkpoint in {output_dir}",
            hint="Resume with --resume auto (starts fresh when there is none), or check output_dir.",
        )
    return Resume(chosen, None, tuple(notes))

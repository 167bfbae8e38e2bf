"""One tracking run per run (standard library only): ``RUN_DIR/tracking.json`` holds the W&B run id and the run
name that every attempt of the run reports under, made once by the run's first attempt and kept over restarts,
requeues, launch.adapt moves and resumes (``--resume never`` sets it aside with the rest of the run's record).

The id is no secret: W&B's own id of a run (``wandb.init(id=…)``, the ``WANDB_RUN_ID`` variable), 8 characters of
``[a-z0-9]`` as ``wandb.util.generate_id`` makes them. The launcher gives both to the trainers' environment
(:func:`grpo_launch.render.processes.tracking_env`)."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from grpo_launch.rundir.files import write_run_files
from grpo_launch.rundir.json_fields import Fields, file_error, float_or_none, loads
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.trusted_files import read_text
from grpo_launch.spec import frozen

ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"  # W&B's (wandb/sdk/lib/runid.py): lowercase letters, digits


@frozen
class TrackingRecord:
    """The run's tracking identity: ``run_id`` (W&B's run id), ``name`` (the run name W&B and trackio show; the run
    directory's name unless the recipe sets run_name) and when it was made."""

    run_id: str
    name: str
    created: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "name": self.name, "created": self.created}

    @classmethod
    def from_json(cls, row: Any, source: str) -> TrackingRecord:
        f = Fields(row, source)
        return cls(f.text("run_id"), f.text("name"), float_or_none(row.get("created")))

    @classmethod
    def new(cls, name: str) -> TrackingRecord:
        return cls("".join(secrets.choice(ID_ALPHABET) for _ in range(8)), name, time.time())


def read_tracking(paths: RunPaths) -> TrackingRecord | None:
    """The run's record, None when it has none yet; one that does not read is an error naming the file."""
    try:
        text = read_text(paths.tracking)
    except FileNotFoundError:
        return None
    try:
        return TrackingRecord.from_json(loads(text), str(paths.tracking))
    except ValueError as exc:
        raise file_error(paths.tracking, "", f"not JSON ({exc})") from None


def keep_tracking(paths: RunPaths) -> TrackingRecord:
    """The run's record, made and written (atomically) the first time. The caller holds the run's lock."""
    record = read_tracking(paths)
    if record is None:
        record = TrackingRecord.new(paths.root.resolve().name or "grpo-launch")
        write_run_files(paths.root, {paths.relative(paths.tracking): json.dumps(record.to_json()) + "\n"}, locked=True)
    return record

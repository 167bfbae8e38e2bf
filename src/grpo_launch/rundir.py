"""Write a run directory's files. The one place planning output touches the disk."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from grpo_launch.errors import ConfigError


def write_run_files(run_dir: str | Path, files: Mapping[str, str]) -> list[Path]:
    """Write each file atomically (temp file + rename), so a crash never leaves a half-written config."""
    root = Path(run_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create run directory {str(root)!r}: {exc.strerror}", hint="Choose another with --run-dir DIR."
        ) from None
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        written.append(path)
    return written

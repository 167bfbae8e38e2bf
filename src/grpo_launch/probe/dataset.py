"""The recipe's local inputs: whether a value names a local path, and a local training file's row count (for the
time to train)."""

from __future__ import annotations

from pathlib import Path


def count_rows(dataset: str, workdir: str) -> int | None:
    """Rows of a local JSON Lines or CSV training file (for the time to train), without loading it; None for
    anything else (a hub dataset: set launch.dataset_rows)."""
    path = Path(workdir) / Path(dataset).expanduser() if dataset else None
    if path is None or path.suffix not in (".jsonl", ".csv") or not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            lines = sum(1 for line in f if line.strip())
    except OSError:
        return None
    return max(0, lines - (1 if path.suffix == ".csv" else 0)) or None


def looks_local(path: str) -> bool:
    """A model or dataset value that names a local path rather than a hub id."""
    return path.startswith(("/", "./", "../", "~", ".")) or Path(path).exists()

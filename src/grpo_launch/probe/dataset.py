"""The recipe's inputs: whether a value names a local path, and the training set's row count (for the time to
train): counted in a local file, read from the datasets cache or the Hub's metadata, never downloaded."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


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


# The training splits of well-known datasets (id, config, split) → (rows, source), so the shipped recipes and
# open-r1's forecast a whole run offline; a dataset not here is read from the cache or the Hub's metadata.
KNOWN_ROWS: dict[tuple[str, str | None, str], tuple[int, str]] = {
    ("AI-MO/NuminaMath-TIR", None, "train"): (
        72_441, "the dataset card's split sizes (train 72,441; test 99; the Hub lists 72.5k rows in all)"),
    ("DigitalLearningGmbH/MATH-lighteval", None, "train"): (
        7_500, "MATH (Hendrycks et al. 2021): 7,500 train and 5,000 test problems"),
    ("DigitalLearningGmbH/MATH-lighteval", "default", "train"): (
        7_500, "MATH (Hendrycks et al. 2021): 7,500 train and 5,000 test problems"),
    ("openai/gsm8k", "main", "train"): (
        7_473, "GSM8K (Cobbe et al. 2021): 7,473 train and 1,319 test problems (the card's split sizes)"),
}  # fmt: skip

HUB_TIMEOUT_S = 3.0  # one small metadata request; plan must stay fast offline
UNREACHABLE_S = 3600  # an unreachable Hub is not asked again for an hour


def dataset_rows(
    values: Mapping[str, Any],
    workdir: str,
    environ: Mapping[str, str],
    fetch: Callable[[str, float], bytes] | None = None,
    *,
    hub: bool = True,
) -> tuple[int | None, str]:
    """The training split's rows and where they came from, or (None, why not): a local JSON Lines / CSV file
    (counted), the datasets cache (``dataset_info.json``, offline), else the Hub's dataset metadata (one small
    request to ``HF_ENDPOINT``/api/datasets/ID, cached; skipped with HF_HUB_OFFLINE or HF_DATASETS_OFFLINE, or
    ``hub=False``: a run whose max_steps sets its length needs the rows only to refuse a batch larger than the
    training set, not worth a request). Never downloads the data."""
    name = str(values.get("dataset_name") or "")
    config = values.get("dataset_config")
    split = str(values.get("dataset_train_split") or "train")
    if not name:
        return None, "no dataset_name"
    rows = count_rows(name, workdir)
    if rows:
        return rows, f"counted in {name}"
    if looks_local(name):
        return None, f"{name} is not a JSON Lines or CSV file"
    if name.count("/") > 1:
        return None, f"{name} is not a Hub dataset id"
    rows = _cached_rows(name, config, split, environ)
    if rows:
        return rows, "the datasets cache"
    if known := KNOWN_ROWS.get((name, config, split)):
        return known
    if not hub:
        return None, "not asked of the Hub (max_steps sets the run's length)"
    if environ.get("HF_HUB_OFFLINE", "0") not in ("0", "") or environ.get("HF_DATASETS_OFFLINE", "0") not in ("0", ""):
        return None, "not in the datasets cache, and offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)"
    return _hub_rows(name, config, split, environ, fetch or _http_get)


def _home(environ: Mapping[str, str]) -> Path:
    cache = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(environ.get("HF_HOME") or Path(cache) / "huggingface")


def _cached_rows(name: str, config: Any, split: str, environ: Mapping[str, str]) -> int | None:
    """From the datasets library's cache: ``NAMESPACE___NAME/CONFIG/VERSION/HASH/dataset_info.json``."""
    base = Path(environ.get("HF_DATASETS_CACHE") or _home(environ) / "datasets")
    folder = base / name.replace("/", "___")
    wanted = str(config) if config else "*"
    for info in sorted(folder.glob(f"{wanted}/*/*/dataset_info.json"), key=_mtime, reverse=True):
        rows = _split_rows(_read_json(info).get("splits"), split)
        if rows:
            return rows
    return None


def _split_rows(splits: Any, split: str) -> int | None:
    """``num_examples`` of ``split`` in a splits record: a mapping (dataset_info.json) or a list (the Hub card)."""
    if isinstance(splits, dict):
        splits = [{"name": k, **v} for k, v in splits.items() if isinstance(v, dict)]
    if not isinstance(splits, list):
        return None
    for s in splits:
        if isinstance(s, dict) and s.get("name") == split and isinstance(s.get("num_examples"), int):
            return s["num_examples"] or None
    return None


def _hub_rows(
    name: str, config: Any, split: str, environ: Mapping[str, str], fetch: Callable[[str, float], bytes]
) -> tuple[int | None, str]:
    """The Hub's card metadata (``cardData.dataset_info``), cached in ~/.cache/grpo-launch/dataset-rows.json."""
    key = f"{name}|{config or ''}|{split}"
    cache = Path(environ.get("XDG_CACHE_HOME") or Path(environ.get("HOME") or Path.home()) / ".cache")
    store = cache / "grpo-launch" / "dataset-rows.json"
    known = _read_json(store)
    if isinstance(known.get(key), int):
        return known[key], "the Hub's dataset metadata (cached)"
    endpoint = (environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/api/datasets/{name}"
    down = f"unreachable:{endpoint}"
    if isinstance(known.get(down), (int, float)) and time.time() < known[down]:
        return None, f"the Hub could not be asked (unreachable within the last {UNREACHABLE_S // 60} min)"
    try:
        data = json.loads(fetch(url, HUB_TIMEOUT_S))
    except LookupError as exc:  # the Hub answered: no such (public) dataset
        return None, f"the Hub has no metadata for {name} ({exc})"
    except Exception as exc:  # any network or format problem: say it, plan on (and do not ask again for a while)
        _store(store, {**known, down: time.time() + UNREACHABLE_S})
        return None, f"the Hub could not be asked ({type(exc).__name__})"
    infos = (data.get("cardData") or {}).get("dataset_info") if isinstance(data, dict) else None
    infos = infos if isinstance(infos, list) else [infos]
    for info in infos:
        if isinstance(info, dict) and (not config or info.get("config_name") in (config, None)):
            rows = _split_rows(info.get("splits"), split)
            if rows:
                _store(store, {**known, key: rows})
                return rows, "the Hub's dataset metadata"
    return None, f"the Hub's metadata of {name} gives no row count for split {split!r}"


def _store(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    except OSError:
        pass


def _http_get(url: str, timeout: float) -> bytes:
    """One GET with http.client (urllib.request would import the email package and more: plan stays fast)."""
    import http.client

    parts = urlsplit(url)
    conn_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_type(parts.netloc, timeout=timeout)
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
        response = conn.getresponse()
        if response.status != 200:
            raise LookupError(f"HTTP {response.status}")
        return response.read(1_000_000)
    finally:
        conn.close()


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0

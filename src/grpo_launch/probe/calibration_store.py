"""This machine's measurements (``grpo-launch calibrate``), stored and found again. One JSON per GPU model (or
"cpu"), model shape, dtype and library versions (torch, vLLM, TRL, transformers) in the user's cache directory
($GRPO_LAUNCH_CALIBRATIONS, else $XDG_CACHE_HOME/grpo-launch/calibrations, else ~/.cache/grpo-launch/calibrations),
and a copy in the run directory when there is one.

A calibration counts only for the machine and software it measured: :func:`find_calibration` returns the one whose
key matches, and says of every other one for the same model why it was not used (another GPU model, another
library version); nothing is used silently."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_launch.errors import ConfigError
from grpo_launch.machines.calibrated_speed import MeasuredTerms
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.recipe import Recipe
from grpo_launch.rundir.layout import CALIBRATIONS_ENV as DIR_ENV
from grpo_launch.spec import frozen

FORMAT = 2  # 2: training rates through TRL's fused LM head, the decode curve at the plan's batches, the first step
READS = (1, 2)
LIBRARIES = ("torch", "vllm", "trl", "transformers")


@frozen
class CalibrationKey:
    """What a calibration is valid for: the device ("cpu" or the GPU model), the model's shape, the dtype and the
    library versions ({"torch": "2.9.0", "vllm": "none", …})."""

    device: str
    model_shape: str
    dtype: str
    versions: tuple[tuple[str, str], ...]

    @property
    def file_name(self) -> str:
        import hashlib  # here and in shape_id: a plan on a machine with no calibration hashes nothing

        digest = hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:12]
        device = "".join(c if c.isalnum() else "-" for c in self.device.lower())
        return f"{device}-{self.model_shape}-{self.dtype}-{digest}.json"

    def differences(self, other: CalibrationKey) -> list[str]:
        """What differs from ``other`` (empty: the same key), in words."""
        out = []
        if self.device != other.device:
            out.append(f"measured on {other.device}, this plan is for {self.device}")
        if self.dtype != other.dtype:
            out.append(f"measured in {other.dtype}, this plan trains in {self.dtype}")
        mine, theirs = dict(self.versions), dict(other.versions)
        for lib in sorted(set(mine) | set(theirs)):
            if mine.get(lib) != theirs.get(lib):
                out.append(f"{lib} {theirs.get(lib, 'absent')} when measured, {mine.get(lib, 'absent')} here")
        return out


@frozen
class CalibrationRecord:
    """One ``grpo-launch calibrate`` measurement: its key, the measured terms, what was not measured and why, the
    recipe's values it measured at, and the table's values beside them (for ``plan --explain``)."""

    key: CalibrationKey
    terms: MeasuredTerms
    not_measured: tuple[str, ...] = ()
    at: tuple[tuple[str, float], ...] = ()  # micro-batch, prompt and completion length, processes, …
    recipe: str = ""
    created: str = ""
    seconds: float = 0.0  # how long calibrate took

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "key": dataclasses.asdict(self.key) | {"versions": dict(self.key.versions)},
            "terms": dataclasses.asdict(self.terms),
            "not_measured": list(self.not_measured),
            "at": dict(self.at),
            "recipe": self.recipe,
            "created": self.created,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], file: str) -> CalibrationRecord:
        try:
            if data.get("format") not in READS:
                raise ValueError(f"format {data.get('format')!r}, this grpo-launch reads {', '.join(map(str, READS))}")
            k = data["key"]
            key = CalibrationKey(
                str(k["device"]),
                str(k["model_shape"]),
                str(k["dtype"]),
                tuple(sorted((str(a), str(b)) for a, b in k["versions"].items())),
            )
            t = dict(data["terms"])
            for name in ("decode", "vllm_decode", "cb_decode"):
                t[name] = tuple((int(b), float(s)) for b, s in t.get(name, ()))
            t["backend_train"] = tuple((str(b), bool(c), float(r)) for b, c, r in t.get("backend_train", ()))
            terms = MeasuredTerms(**t)
            at = tuple((str(a), float(b)) for a, b in dict(data.get("at", {})).items())
            return cls(
                key,
                terms,
                tuple(data.get("not_measured", ())),
                at,
                str(data.get("recipe", "")),
                str(data.get("created", "")),
                float(data.get("seconds", 0.0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"{file}: not a calibration this grpo-launch reads ({exc})",
                hint="Run `grpo-launch calibrate RECIPE` again to replace it.",
            ) from exc

    def measured_terms(self) -> list[str]:
        """The terms measured, in words (what ``plan`` says it took from this file)."""
        t = self.terms
        names = [
            f"decode ({label}, batches {', '.join(str(b) for b, _ in curve)})"
            for label, curve in (
                ("transformers", t.decode),
                ("continuous batching", t.cb_decode),
                ("vLLM", t.vllm_decode),
            )
            if curve
        ]
        names += ["prefill"] if t.prefill_s else []
        names += ["training step"] if t.train_tokens_per_s else []
        names += ["training step with activation checkpointing"] if t.train_tokens_per_s_ckpt else []
        names += [
            f"training step through {b}" + (" with activation checkpointing" if c else "")
            for b, c, _ in t.backend_train
        ]
        names += ["forward (old log-probs)"] if t.forward_tokens_per_s else []
        names += [
            n
            for n, v in (
                ("weight sync", t.sync_s),
                ("model load from disk", t.load_bytes),
                ("vLLM start-up", t.engine_start_s),
                ("imports", t.imports_s),
                ("first generation's warm-up", t.warmup_decode_s_per_step),
                ("first training step's warm-up", t.warmup_training_s),
                ("TRL's own time per step", t.overhead_steps),
            )
            if v
        ]
        # Memory only on a GPU: a CPU figure is a resident set, and the timed step's peak (torch's log-softmax over
        # the whole logits) matches no term of the model. calibrate shows them all; a plan uses these.
        if t.device != "cpu":
            names += ["activation memory"] if t.activation_peak_bytes else []
            names += ["training step's peak memory"] if t.step_peak_bytes else []
        return names


def calibration_dir(environ: Mapping[str, str]) -> Path:
    """Where calibrations are stored: $GRPO_LAUNCH_CALIBRATIONS, else the XDG cache directory's."""
    if environ.get(DIR_ENV):
        return Path(environ[DIR_ENV])
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(cache) / "grpo-launch" / "calibrations"


def any_stored(environ: Mapping[str, str]) -> bool:
    """Whether the calibration folder holds any calibration. Most machines have none, and a plan then skips building
    its key: reading the library versions (importlib.metadata) costs about a fifth of ``plan``'s start-up."""
    return any(calibration_dir(environ).glob("*.json"))


def shape_id(model: ModelShape) -> str:
    """A short name for a model's shape (two checkpoints of one architecture share it: weights do not matter)."""
    import hashlib

    fields = dataclasses.asdict(model)
    fields.pop("name", None)
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:10]


def library_versions(vllm: str | None) -> tuple[tuple[str, str], ...]:
    """torch, vLLM, TRL and transformers as this interpreter has them (vLLM: the version given, from the Python
    that runs the servers; "none" when there is none). Read from the installed metadata, no import."""
    from importlib import metadata  # here: a plan on a machine with no calibration reads no versions

    out = {}
    for lib in LIBRARIES:
        if lib == "vllm":
            out[lib] = vllm or "none"
            continue
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = "none"
    return tuple(sorted(out.items()))


def save_calibration(record: CalibrationRecord, environ: Mapping[str, str], run_dir: str | None = None) -> list[Path]:
    """Write the record to the cache directory (and ``run_dir``/calibration.json); the paths written."""
    text = json.dumps(record.to_dict(), indent=2) + "\n"
    paths = [calibration_dir(environ) / record.key.file_name]
    if run_dir:
        paths.append(Path(run_dir) / "calibration.json")
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return paths


def read_calibration(path: Path) -> CalibrationRecord:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        hint = "Delete it or run `grpo-launch calibrate` again."
        raise ConfigError(f"{path}: cannot read ({exc})", hint=hint) from exc
    return CalibrationRecord.from_dict(data, str(path))


@frozen
class Found:
    """The calibration that matches (None: none), its file, and why each other one for this model was not used."""

    record: CalibrationRecord | None = None
    path: str = ""
    ignored: tuple[str, ...] = ()


def find_calibration(key: CalibrationKey, environ: Mapping[str, str]) -> Found:
    """The stored calibration for exactly ``key``; the others for the same model shape, each with why not."""
    folder = calibration_dir(environ)
    exact = folder / key.file_name
    ignored = []
    for path in sorted(folder.glob(f"*-{key.model_shape}-*.json")) if folder.is_dir() else []:
        if path == exact:
            continue
        try:
            other = read_calibration(path)
        except ConfigError as exc:
            ignored.append(f"{path.name}: {exc.message if hasattr(exc, 'message') else exc}")
            continue
        why = key.differences(other.key)
        if why:
            ignored.append(f"{path}: " + "; ".join(why))
    if exact.is_file():
        record = read_calibration(exact)
        if not key.differences(record.key):
            return Found(record, str(exact), tuple(ignored))
    return Found(None, "", tuple(ignored))


def recipe_dtype(recipe: Recipe) -> str:
    """The dtype the trainers run in: float32 where the recipe turns bf16 off (the CPU recipes), else bfloat16
    (TRL's default on GPUs)."""
    return "float32" if recipe.get("bf16") is False else "bfloat16"


def calibration_key(topology: Topology, model: ModelShape, recipe: Recipe, vllm_version: str | None) -> CalibrationKey:
    """The key a plan of ``recipe`` on ``topology`` looks its calibration up by."""
    device = "cpu" if topology.is_cpu else topology.planning_gpu_name
    return CalibrationKey(device, shape_id(model), recipe_dtype(recipe), library_versions(vllm_version))

"""Backends: the ways grpo-launch runs a plan's processes, as plugins. The built-in ones are a registry of names here,
imported lazily; another package adds one by registering its class under the entry-point group
:data:`ENTRY_POINT_GROUP` (README, "Writing a backend"). :func:`select` picks the one the options and environment ask
for.

Reading the installed packages' entry points costs about as much as planning itself (importlib.metadata, email,
zipfile), so it is done only where a backend from another package could be the answer: a backend chosen from the
environment on real machines (:func:`select` without ``--gpus``), a flag or a verb the built-in ones do not know
(grpo_launch.cli), a recorded backend name that is not built in (:func:`load`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from grpo_launch.backends.base import Backend, BackendOptions
from grpo_launch.backends.options import OPTIONS
from grpo_launch.errors import ConfigError

if TYPE_CHECKING:
    from grpo_launch.backends.submission import Submitter

__all__ = [
    "Backend",
    "discover",
    "job_backend",
    "known",
    "load",
    "load_submitter",
    "names",
    "option_classes",
    "select",
    "submitters",
]

# name → "module:class". Detection order: the first whose detect() answers yes wins (the built-in ones, then those of
# other packages); local is the fallback.
REGISTRY: dict[str, str] = {
    "ssh": "grpo_launch.backends.ssh:SshBackend",
    "ray": "grpo_launch.backends.ray:RayBackend",
    "slurm": "grpo_launch.backends.slurm:SlurmBackend",
    "local": "grpo_launch.backends.local:LocalBackend",
}
# The built-in submitters, by the name their verb passes (grpo_launch.cli.sbatch, ray_submit, sky).
SUBMITTERS: dict[str, str] = {
    "slurm": "grpo_launch.backends.slurm.submit:SlurmSubmitter",
    "ray": "grpo_launch.backends.ray.submit:RaySubmitter",
    "skypilot": "grpo_launch.backends.skypilot:SkyPilotSubmitter",
}
# Other packages' backends: ``[project.entry-points."grpo_launch.backends"] NAME = "module:Class"``.
ENTRY_POINT_GROUP = "grpo_launch.backends"
_found: dict[str, type[Backend[Any]]] | None = None  # theirs, once looked for (:func:`discover`)


def discover() -> dict[str, type[Backend[Any]]]:
    """The backends other packages register, by name, loaded once: each is checked as the built-in ones are (a
    name, an options class derived from BackendOptions, detect/create/probe/place)."""
    global _found
    if _found is None:
        from importlib.metadata import entry_points

        found: dict[str, type[Backend[Any]]] = {}
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            where = f"the backend {entry.name!r} ({entry.value}, entry point group {ENTRY_POINT_GROUP})"
            if entry.name in REGISTRY or entry.name in found:
                raise ConfigError(f"{where}: grpo-launch already has a backend of that name", hint=_RENAME)
            try:
                cls = entry.load()
            except Exception as err:  # any error of another package's import: named, not a traceback
                raise ConfigError(f"{where} cannot be loaded: {type(err).__name__}: {err}", hint=_REINSTALL) from err
            problems = _not_a_backend(cls, entry.name)
            if problems:
                raise ConfigError(f"{where} is not a backend:", problems=problems, hint=_REINSTALL)
            found[entry.name] = cls
        _found = found
    return _found


_RENAME = "Register it under another name in its package's entry points, or uninstall that package."
_REINSTALL = "Fix or uninstall the package that registers it (pip show -f PACKAGE names its files)."


def _not_a_backend(cls: object, name: str) -> list[str]:
    """What a registered object lacks to be a backend (README, "Writing a backend")."""
    if not isinstance(cls, type):
        return [f"it is {type(cls).__name__}, not a class"]
    out = []
    if getattr(cls, "name", None) != name:
        out.append(f"its class attribute name is {getattr(cls, 'name', None)!r}, not {name!r} (the entry point's)")
    options = getattr(cls, "Options", None)
    if not (isinstance(options, type) and issubclass(options, BackendOptions)):
        out.append("its Options is not a class derived from grpo_launch.backends.base.BackendOptions")
    missing = [m for m in ("detect", "create", "probe", "place", "preflight") if not callable(getattr(cls, m, None))]
    if missing:
        out.append(f"it has no {', '.join(missing)} (derive it from grpo_launch.backends.base.BaseBackend)")
    return out


def names(*, theirs: bool = False) -> list[str]:
    """The backends by name in detection order (local last); ``theirs``: other packages' too (looked for now)."""
    built_in = [n for n in REGISTRY if n != "local"]
    return [*built_in, *(discover() if theirs else ()), "local"]


def known(name: str) -> bool:
    """Whether a backend of that name is installed (a built-in one, else another package's, looked for then)."""
    return name in REGISTRY or name in discover()


def load(name: str) -> type[Backend[Any]]:
    """The backend class of ``name``: a built-in one, else another package's (looked for then)."""
    if name in REGISTRY:
        return _import(REGISTRY[name])
    found = discover()
    if name not in found:
        raise ConfigError(
            f"no backend named {name!r}: grpo-launch has {', '.join(REGISTRY)}"
            + (f" and the installed packages add {', '.join(found)}" if found else ""),
            hint="Install the package that provides it (it registers under the entry-point group "
            f"{ENTRY_POINT_GROUP}).",
        )
    return found[name]


def load_submitter(name: str) -> type[Submitter[Any]]:
    """A submitter by the name its verb passes: a built-in one, else the one another package's backend of that
    name declares (its ``Submitter``)."""
    if name in SUBMITTERS:
        return _import(SUBMITTERS[name])
    submitter = getattr(load(name), "Submitter", None)
    if submitter is None:
        raise ConfigError(f"the backend {name!r} submits nothing (its class names no Submitter)")
    return submitter


def submitters() -> dict[str, str]:
    """Other packages' submit verbs: verb → the backend whose Submitter it runs (looked for now)."""
    verbs = {name: getattr(cls, "submit_verb", None) for name, cls in discover().items()}
    return {verb: name for name, verb in verbs.items() if isinstance(verb, str)}


# The built-in submit verbs → the backend their job's own `grpo-launch run` uses (that run keeps the verb's record, so
# resuming the run submits it again).
_JOB_BACKENDS = {"sbatch": "slurm", "ray-submit": "ray", "sky": "ray"}


def job_backend(verb: str) -> str | None:
    """The backend a job submitted by ``verb`` runs on, or None when ``verb`` submits nothing (another package's
    verb is looked for only when it is not a built-in one)."""
    if verb in _JOB_BACKENDS or verb == "run":
        return _JOB_BACKENDS.get(verb)
    return submitters().get(verb)


def option_classes() -> dict[str, type[BackendOptions]]:
    """Every backend's options dataclass, by backend name: the built-in ones from :mod:`.options` (no backend module
    is loaded), then those of other packages' backends once they have been looked for."""
    return {**OPTIONS, **{name: cls.Options for name, cls in (_found or {}).items()}}


def select(
    options: Mapping[str, BackendOptions], environ: Mapping[str, str], *, simulated: bool = False
) -> Backend[Any]:
    """The backend the options (by backend name) and the environment ask for. A simulated topology (``--gpus``)
    plans for this machine's backend whatever else is set."""
    for name in ["local"] if simulated else names(theirs=True):
        cls = load(name)
        opts = options.get(name) or cls.Options()
        if cls.detect(opts, environ):
            return cls.create(opts, environ)
    raise AssertionError("the local backend always applies")


def _import(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


if TYPE_CHECKING:  # mypy checks every registered class against its protocol, typed by the class's own options
    from grpo_launch.backends.base import NoOptions
    from grpo_launch.backends.local import LocalBackend
    from grpo_launch.backends.options import RayOptions, SlurmOptions, SshOptions
    from grpo_launch.backends.ray import RayBackend
    from grpo_launch.backends.ray.submit import RaySubmitOptions, RaySubmitter
    from grpo_launch.backends.skypilot import SkyOptions, SkyPilotSubmitter
    from grpo_launch.backends.slurm import SlurmBackend
    from grpo_launch.backends.slurm.submit import SbatchOptions, SlurmSubmitter
    from grpo_launch.backends.ssh import SshBackend

    _ssh: type[Backend[SshOptions]] = SshBackend
    _ray: type[Backend[RayOptions]] = RayBackend
    _slurm: type[Backend[SlurmOptions]] = SlurmBackend
    _local: type[Backend[NoOptions]] = LocalBackend
    _sbatch: type[Submitter[SbatchOptions]] = SlurmSubmitter
    _ray_submit: type[Submitter[RaySubmitOptions]] = RaySubmitter
    _sky: type[Submitter[SkyOptions]] = SkyPilotSubmitter

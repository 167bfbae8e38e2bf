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
from grpo_launch.spec import frozen

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
    "submit_verb",
    "submit_verbs",
]

# name → "module:class". Detection order: the first whose detect() answers yes wins (the built-in ones, then those of
# other packages); local is the fallback.
REGISTRY: dict[str, str] = {
    "ssh": "grpo_launch.backends.ssh:SshBackend",
    "ray": "grpo_launch.backends.ray:RayBackend",
    "slurm": "grpo_launch.backends.slurm:SlurmBackend",
    "local": "grpo_launch.backends.local:LocalBackend",
}


@frozen
class SubmitVerb:
    """A verb that hands runs to a batch system (``grpo-launch sbatch``): its Submitter, the name the run's record
    gives it, the backend its job's own ``grpo-launch run`` uses (that run keeps the verb's record, so resuming the
    run submits it again) and its line in ``grpo-launch --help``."""

    submitter: str  # "module:Class"; another package's: the backend whose Submitter it is
    recorded_as: str
    job_backend: str
    help: str


# The built-in submit verbs, in `grpo-launch --help`'s order.
SUBMIT_VERBS: dict[str, SubmitVerb] = {
    "sbatch": SubmitVerb(
        "grpo_launch.backends.slurm.submit:SlurmSubmitter",
        "slurm",
        "slurm",
        "plan for a Slurm allocation, write the batch script into the run dir and submit it",
    ),
    "ray-submit": SubmitVerb(
        "grpo_launch.backends.ray.submit:RaySubmitter",
        "ray",
        "ray",
        "plan on a Ray cluster and submit the run as a Ray job (ray job submit)",
    ),
    "sky": SubmitVerb(
        "grpo_launch.backends.skypilot:SkyPilotSubmitter",
        "skypilot",
        "ray",  # the task's run section starts a Ray cluster and runs `grpo-launch run --ray` on it
        "plan for a SkyPilot cluster, write the task YAML into the run dir; --launch runs sky launch",
    ),
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
                frozen = isinstance(err, TypeError) and "frozen dataclass" in str(err)
                raise ConfigError(
                    f"{where} cannot be loaded: {type(err).__name__}: {err}", hint=_FROZEN if frozen else _REINSTALL
                ) from err
            problems = _not_a_backend(cls, entry.name)
            if problems:
                raise ConfigError(f"{where} is not a backend:", problems=problems, hint=_REINSTALL)
            found[entry.name] = cls
        _found = found
    return _found


_RENAME = "Register it under another name in its package's entry points, or uninstall that package."
_REINSTALL = "Fix or uninstall the package that registers it (pip show -f PACKAGE names its files)."
# dataclasses refuses @dataclass(frozen=True) on a subclass of a dataclass that is not frozen by its own flag, as
# BackendOptions is (spec.frozen shares one immutability for every value type instead of compiling one per class).
_FROZEN = (
    "Declare the backend's Options (and its Submitter's) with @grpo_launch.spec.frozen, as every options class "
    "derived from grpo_launch.backends.base.BackendOptions must be, not @dataclass(frozen=True)."
)


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
    verb = getattr(cls, "submit_verb", None)
    if verb in SUBMIT_VERBS:
        out.append(f"its submit_verb {verb!r} is a verb of grpo-launch's own")
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


def load_submitter(verb: str) -> type[Submitter[Any]]:
    """The submitter of a submit verb: a built-in one, else the ``Submitter`` of the backend from another package
    whose ``submit_verb`` it is."""
    entry = submit_verb(verb)
    if entry is None:
        raise ConfigError(f"no submit verb {verb!r}: grpo-launch has {', '.join(SUBMIT_VERBS)}")
    if verb in SUBMIT_VERBS:
        return _import(entry.submitter)
    submitter = getattr(load(entry.submitter), "Submitter", None)
    members = ("Options", "description", "run_dir_help", "passes_args", "adjusted", "requested_topology", "request")
    lacks = [m for m in (*members, "finish", "submit", "submitted") if not hasattr(submitter, m)]
    if not isinstance(submitter, type) or lacks:
        raise ConfigError(
            f"the backend {entry.submitter!r} has the verb {verb!r}, but its Submitter is not a class derived from "
            f"grpo_launch.backends.submission.BaseSubmitter (it has no {', '.join(lacks) or 'class'})",
            hint=_REINSTALL,
        )
    return submitter


def submit_verbs(*, theirs: bool = False) -> dict[str, SubmitVerb]:
    """The submit verbs by name: the built-in ones; ``theirs``: other packages' too (looked for now)."""
    found = {name: getattr(cls, "submit_verb", None) for name, cls in discover().items()} if theirs else {}
    return SUBMIT_VERBS | {
        verb: SubmitVerb(name, name, name, f"plan for the {name} backend's machines and submit the run to them")
        for name, verb in found.items()
        if isinstance(verb, str)
    }


def submit_verb(verb: str) -> SubmitVerb | None:
    """The submit verb of that name: a built-in one, else another package's (looked for only then); None when no
    verb of that name submits."""
    if verb in SUBMIT_VERBS:
        return SUBMIT_VERBS[verb]
    return None if verb == "run" else submit_verbs(theirs=True).get(verb)


def job_backend(verb: str) -> str | None:
    """The backend a job submitted by ``verb`` runs on, or None when ``verb`` submits nothing."""
    entry = submit_verb(verb)
    return entry.job_backend if entry else None


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

"""Backends: the ways grpo-launch runs a plan's processes, as plugins. A registry of names, imported lazily;
:func:`select` picks the one the options and environment ask for. Adding a backend means adding one module and one
line here."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from grpo_launch.backends.base import Backend, BackendOptions
from grpo_launch.backends.options import OPTIONS

if TYPE_CHECKING:
    from grpo_launch.backends.submission import Submitter

__all__ = ["Backend", "load", "load_submitter", "option_classes", "select"]

# name → "module:class". Detection order: the first whose detect() answers yes wins; local is the fallback.
REGISTRY: dict[str, str] = {
    "ssh": "grpo_launch.backends.ssh:SshBackend",
    "ray": "grpo_launch.backends.ray:RayBackend",
    "slurm": "grpo_launch.backends.slurm:SlurmBackend",
    "local": "grpo_launch.backends.local:LocalBackend",
}
SUBMITTERS: dict[str, str] = {
    "slurm": "grpo_launch.backends.slurm.submit:SlurmSubmitter",
    "ray": "grpo_launch.backends.ray.submit:RaySubmitter",
    "skypilot": "grpo_launch.backends.skypilot:SkyPilotSubmitter",
}


def _import(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def load(name: str) -> type[Backend[Any]]:
    return _import(REGISTRY[name])


def load_submitter(name: str) -> type[Submitter[Any]]:
    return _import(SUBMITTERS[name])


def option_classes() -> dict[str, type[BackendOptions]]:
    """Every backend's options dataclass, by backend name (from :mod:`.options`: no backend module is loaded)."""
    return dict(OPTIONS)


def select(
    options: Mapping[str, BackendOptions], environ: Mapping[str, str], *, simulated: bool = False
) -> Backend[Any]:
    """The backend the options (by backend name) and the environment ask for. A simulated topology (``--gpus``)
    plans for this machine's backend whatever else is set."""
    names = ["local"] if simulated else list(REGISTRY)
    for name in names:
        cls = load(name)
        opts = options.get(name) or cls.Options()
        if cls.detect(opts, environ):
            return cls.create(opts, environ)
    raise AssertionError("the local backend always applies")


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

"""Backends: the ways grpo-launch runs a plan's processes, as plugins. A registry of names, imported lazily;
:func:`select` picks the one the command line and environment ask for. Adding a backend means adding one module
and one line here."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping

from grpo_launch.backends.base import Backend, Capability, RunContext, Submission, Submitter

__all__ = [
    "Backend",
    "Capability",
    "RunContext",
    "Submission",
    "Submitter",
    "add_arguments",
    "load",
    "load_submitter",
    "select",
]

# name → "module:class". Detection order: the first whose detect() answers yes wins; local is the fallback.
REGISTRY: dict[str, str] = {
    "ssh": "grpo_launch.backends.ssh:SshBackend",
    "slurm": "grpo_launch.backends.slurm:SlurmBackend",
    "local": "grpo_launch.backends.local:LocalBackend",
}
SUBMITTERS: dict[str, str] = {"slurm": "grpo_launch.backends.slurm:SlurmSubmitter"}


def _import(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def load(name: str) -> type[Backend]:
    return _import(REGISTRY[name])


def load_submitter(name: str) -> type[Submitter]:
    return _import(SUBMITTERS[name])


def add_arguments(parser: argparse.ArgumentParser, *, run: bool) -> None:
    """Every backend's options on ``parser``."""
    for name in REGISTRY:
        load(name).add_arguments(parser, run=run)


def select(args: argparse.Namespace, environ: Mapping[str, str]) -> Backend:
    """The backend for this command line and environment. A simulated topology (``--gpus``) plans for this
    machine's backend whatever else is set."""
    names = ["local"] if getattr(args, "gpus", None) else list(REGISTRY)
    for name in names:
        cls = load(name)
        if cls.detect(args, environ):
            return cls.from_args(args, environ)
    raise AssertionError("the local backend always applies")

"""The "toy" backend: machines described by --toy-cluster (or TOY_CLUSTER), each process started through a
``toyrun --host HOST --`` wrapper, and a ``toy-submit`` verb that writes a job script. It exists to show that a
backend needs no edit to grpo-launch: its options, detection, probe, placement and submit verb are all here."""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping
from typing import ClassVar

from grpo_launch.backends.base import BackendOptions, BaseBackend, option
from grpo_launch.backends.submission import BaseSubmitter, Submission, SubmitJob
from grpo_launch.errors import ConfigError
from grpo_launch.machines.topology import Topology, parse_gpu_spec
from grpo_launch.spec import ProcessSpec, RunContext, frozen

NAMING = "name the toy cluster's GPUs: --toy-cluster 2x8xH100-80GB"


def toy_topology(spec: str) -> Topology:
    """The machines a toy cluster spec names (--gpus' syntax), as this backend's own hosts."""
    given = parse_gpu_spec(spec)
    hosts = tuple(dataclasses.replace(h, name=f"toy{i}") for i, h in enumerate(given.hosts))
    return Topology(hosts, "toy", given.warnings, given_spec=given.given_spec, naming_gpus=NAMING)


@frozen
class ToyOptions(BackendOptions):
    cluster: str | None = option("--toy-cluster", "the toy cluster's machines (as --gpus names them)", group="toy")

    def chooses_backend(self) -> bool:
        return bool(self.cluster)

    def problems(self) -> list[str]:
        if self.cluster is not None and "x" not in self.cluster:
            return [f"--toy-cluster {self.cluster!r}: name machines as --gpus does (2x8xH100-80GB)"]
        return []


@frozen
class ToySubmitOptions(BackendOptions):
    nodes: int = option("--toy-nodes", "machines to ask the toy scheduler for", default=1, type=int, group="toy")


class ToySubmitter(BaseSubmitter[ToySubmitOptions]):
    Options: ClassVar[type[BackendOptions]] = ToySubmitOptions

    @classmethod
    def requested_topology(cls, options: ToySubmitOptions, local: Topology) -> Topology:
        return toy_topology(f"{options.nodes}x8xH100-80GB")

    def request(self, job: SubmitJob, plan, options: ToySubmitOptions, ctx: RunContext) -> Submission:
        line = shlex.join(["grpo-launch", "run", job.recipe, *job.overrides, "--run-dir", plan.run_dir])
        text = f"#!/bin/sh\n# toy job: {options.nodes} machines\nexec {line}\n"
        return Submission(text, os.path.join(plan.paths.root, "toy-job.sh"), f"{options.nodes} toy machines")

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        raise ConfigError("the toy scheduler takes no jobs (use --dry-run)")


class ToyBackend(BaseBackend[ToyOptions]):
    name: ClassVar[str] = "toy"
    Options: ClassVar[type[BackendOptions]] = ToyOptions
    submit_verb: ClassVar[str | None] = "toy-submit"
    Submitter: ClassVar[type | None] = ToySubmitter

    def __init__(self, spec: str) -> None:
        self.spec = spec

    @classmethod
    def detect(cls, options: ToyOptions, environ: Mapping[str, str]) -> bool:
        return bool(options.cluster or environ.get("TOY_CLUSTER"))

    @classmethod
    def create(cls, options: ToyOptions, environ: Mapping[str, str]) -> ToyBackend:
        return cls(options.cluster or environ["TOY_CLUSTER"])

    def probe(self, environ: Mapping[str, str], local: Topology) -> Topology:
        return toy_topology(self.spec)

    def place(self, spec: ProcessSpec, plan, ctx: RunContext) -> ProcessSpec:
        host = spec.host or plan.topology.hosts[0].name
        return dataclasses.replace(spec, argv=("toyrun", "--host", host, "--", *spec.argv), host=host)

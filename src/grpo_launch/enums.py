"""The core choices as str-valued enums. They compare equal to their strings (``backend == "zero3"``) and print
as their value, so plan.json, the rendered files and the CLI show plain words."""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A str-valued enum that formats as its value (Python 3.10's str mix-in would print ``Class.MEMBER``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class VllmMode(StrEnum):
    SERVER = "server"
    COLOCATE = "colocate"
    OFF = "off"


class DistBackend(StrEnum):
    DDP = "ddp"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    FSDP = "fsdp"

    @property
    def is_deepspeed(self) -> bool:
        return self in (DistBackend.ZERO2, DistBackend.ZERO3)

    @property
    def zero_stage(self) -> int | None:
        return {DistBackend.ZERO2: 2, DistBackend.ZERO3: 3}.get(self)


class Offload(StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"
    OPTIMIZER_PARAMS = "optimizer+params"

    @property
    def optimizer(self) -> bool:
        return self is not Offload.NONE

    @property
    def params(self) -> bool:
        return self is Offload.OPTIMIZER_PARAMS


class Device(StrEnum):
    CUDA = "cuda"
    CPU = "cpu"


class Role(StrEnum):
    """What a process (or a GPU) does in a run."""

    VLLM = "vllm"
    TRAIN = "train"

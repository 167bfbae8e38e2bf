"""Every closed choice as a str-valued enum. They compare equal to their strings (``backend == "zero3"``) and
print as their value, so plan.json, the rendered files and the CLI show plain words; the CLI's and the recipe's
choice lists are read from them."""

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


class LaunchMode(StrEnum):
    """launch.mode: TRL's GRPOTrainer (generation, then training), its AsyncGRPOTrainer (the two overlapped on
    disjoint GPUs), or the planner's choice by the model and the predicted step."""

    SYNC = "sync"
    ASYNC = "async"
    AUTO = "auto"


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
    """What a process does in a run: serve generation, or train."""

    VLLM = "vllm"
    TRAIN = "train"


class GpuUse(StrEnum):
    """What a GPU does in a plan."""

    TRAIN = "train"
    VLLM = "vllm"
    SHARED = "train+vllm"  # colocated vLLM on a training GPU
    IDLE = "idle"


class OnOom(StrEnum):
    """launch.on_oom: what a run does after an out-of-memory failure."""

    STOP = "stop"
    REPLAN = "replan"  # the plan's next memory fix, applied, and a restart


class ResumeMode(StrEnum):
    """--resume: where a run starts."""

    AUTO = "auto"  # from the newest complete checkpoint, or fresh; a completed run is not trained again
    NEVER = "never"  # fresh: earlier checkpoints are set aside
    MUST = "must"  # from a checkpoint, or fail


class RunState(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    STOPPED_FOR_CHECKPOINT = "stopped-for-checkpoint"


class JobStatus(StrEnum):
    """What a batch system says of the job a run belongs to, in grpo-launch's words (torchx's AppState, SkyPilot's
    JobStatus); each backend maps its own states onto these (``Backend.job_state``). Upper case, as batch systems
    print them."""

    PENDING = "PENDING"  # queued, held, suspended or requeued: not running now, may run later
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"  # ended badly: failed, timed out, out of memory, its node failed, preempted
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"  # a state this version does not know


class FailureKind(StrEnum):
    """What a failure was, which says whether a restart can help."""

    USER = "user"  # an exception in the user's code or configuration: a restart would fail the same way
    INFRA = "infra"  # a process killed, a network or NCCL/gloo error, a dead server, a lost host: restartable
    OOM = "oom"  # GPU (or host) memory ran out: replannable
    DISK_FULL = "disk-full"
    HANG = "hang"  # no progress within the watchdog's bound: restartable
    STALE_WEIGHTS = (
        "stale-weights"  # vLLM generates with weights the trainers no longer hold (analysis/stale_weights.py)
    )

    @property
    def retryable(self) -> bool:
        return self in (FailureKind.INFRA, FailureKind.HANG)


class AdaptAction(StrEnum):
    """launch.adapt's decision after a layout's warm-up (planning/after_run/adapt.py)."""

    KEEP = "keep"  # stay on the running split
    RESPLIT = "resplit"  # move to the split the measurements re-plan to
    REVERT = "revert"  # back to the split the last re-split replaced, which measured faster

    @property
    def moves(self) -> bool:
        """Whether the run stops with a checkpoint and resumes on another layout."""
        return self is not AdaptAction.KEEP

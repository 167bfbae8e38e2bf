"""plan.json as its readers use it (standard library only): :class:`PlanRecord` holds the fields ``status``, the run
report, the timeline rows, the measured-against-predicted reading, ``plan --calibrate-from`` and the resume hint read,
not the whole plan. render/plan_json.py writes plan.json; this is its one reading.

Every key read here is required (a null where the plan has nothing to say): a missing or mistyped key is an error
naming the file and the key (:class:`.json_fields.RunFileError`), so renaming a key in ``plan_to_dict`` fails loudly
instead of showing a default. Keys plan.json has and no reader uses are not read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from grpo_launch.rundir.json_fields import Fields, file_error, number
from grpo_launch.spec import frozen


@frozen
class Prediction:
    """What the plan predicted for one optimizer step, as plan.json's estimate records it (render writes it;
    calibration, ``status`` and the report read it). ``step_s`` is the planner's own step
    (:class:`grpo_launch.planning.cost.steptime.StepTime`'s total: the terms one after the other, or overlapped in
    an asynchronous run): readers take it as written and never add the terms up again. ``workload`` is planning's
    Workload.to_dict()."""

    generation_s: float
    old_logprobs_s: float
    training_s: float
    sync_s: float
    step_s: float
    overlapped: bool = False
    train_memory_gib: float | None = None
    workload: dict[str, Any] | None = None

    @property
    def trainer_generation_s(self) -> float:
        """What the trainer's own "generation" time includes: generation, the old log-probs, the weight sync."""
        return self.generation_s + self.old_logprobs_s + self.sync_s

    def to_json(self) -> dict[str, Any]:
        """The keys of plan.json's estimate this record owns."""
        times = {"generation": self.generation_s, "old_logprobs": self.old_logprobs_s, "training": self.training_s}
        times |= {"sync": self.sync_s, "step": self.step_s, "overlapped": self.overlapped}
        return {"time_s": times, "workload": self.workload}

    @classmethod
    def read(cls, estimate: Fields) -> Prediction | None:
        """From plan.json's estimate (None when it predicted no time: a model or GPU the planner does not know)."""
        times = estimate.obj_or_none("time_s")
        if times is None:
            return None
        memory = estimate.obj_or_none("memory_per_training_gpu_gib")
        workload = estimate.obj_or_none("workload")
        return cls(
            generation_s=times.real("generation"),
            old_logprobs_s=times.real("old_logprobs"),
            training_s=times.real("training"),
            sync_s=times.real("sync"),
            step_s=times.real("step"),
            overlapped=times.data.get("overlapped") is True,
            train_memory_gib=memory.real("total") if memory is not None else None,
            workload=_workload(workload) if workload is not None else None,
        )

    @classmethod
    def from_json(cls, estimate: dict[str, Any] | None, file: str | Path = "plan.json") -> Prediction | None:
        return None if estimate is None else cls.read(Fields(estimate, file, "estimate"))


# The keys planning's Workload cannot do without (planning/cost/workload.py): calibration rebuilds it from these.
WORKLOAD_KEYS = ("prompt_len", "completion_len", "completions", "num_generations", "per_device",
                 "gradient_checkpointing")  # fmt: skip


def _workload(fields: Fields) -> dict[str, Any]:
    """plan.json's estimate.workload: its required keys, and every value a finite number or a bool."""
    for key in WORKLOAD_KEYS:
        if key not in fields.data:
            raise file_error(fields.file, "", f"key {fields.at + '.' + key!r} is missing")
    for key, value in fields.data.items():
        if not (number(value) or isinstance(value, bool)):
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise file_error(fields.file, "", f"key {fields.at + '.' + key!r} must be a number, got {shown}")
    return dict(fields.data)


@frozen
class RecordedCalibration:
    """The calibration a plan was made with (planning's Calibration, as plan.json's estimate records it)."""

    generation: float
    training: float
    memory: float
    mean_completion_len: float | None
    source: str
    # the part of generation and training that a stored ``grpo-launch calibrate`` file gave (its measured terms
    # over the table's): a run's own scales are the rest (absent in plan.json before calibrate existed)
    measured_generation: float = 1.0
    measured_training: float = 1.0

    @classmethod
    def read(cls, f: Fields) -> RecordedCalibration:
        def ratio(key: str) -> float:
            value = f.real_or_none(key) if key in f.data else None
            return value if value and value > 0 else 1.0

        return cls(
            f.real("generation"),
            f.real("training"),
            f.real("memory"),
            f.real_or_none("mean_completion_len"),
            f.text("source"),
            ratio("measured_generation"),
            ratio("measured_training"),
        )


@frozen
class RoleRecord:
    """One host's role in the plan (plan.json's roles): the host, what it does, its GPU model."""

    host: str
    role: str
    gpu: str


@frozen
class PlanRecord:
    """plan.json, the fields its readers use. ``gpus_per_host``: the topology's GPUs on each host; ``total``: the
    whole run's price and GPU-hours (``price_per_gpu_hour`` when it was priced); ``queue_maxsize``: AsyncGRPO's
    rollout queue (None: a synchronous run). ``file`` says where it was read, for messages."""

    file: str
    recipe: str | None
    gpus_per_host: tuple[int, ...]
    topology: str
    roles: tuple[RoleRecord, ...]
    vllm_mode: str
    vllm_parallel: tuple[int, ...]  # tensor, pipeline, data parallel sizes
    vllm_memory_share: float | None
    layout: dict[str, int]  # LAYOUT_KEYS
    train: dict[str, str]  # TRAIN_KEYS
    prediction: Prediction | None
    startup_s: float | None
    total: tuple[float | None, float] | None  # the whole run's price (None: not priced) and GPU-hours
    calibration: RecordedCalibration | None
    queue_maxsize: int | None
    trainer_values: dict[str, Any]
    # the time to first step's phases as forecast: (name, seconds, measured by calibrate) (empty: none recorded)
    startup_phases: tuple[tuple[str, float, bool], ...] = ()

    @property
    def gpus(self) -> int:
        return sum(self.gpus_per_host)

    @property
    def price_per_gpu_hour(self) -> float | None:
        price, hours = self.total or (None, 0.0)
        return price / hours if price and hours else None

    @property
    def output_dir(self) -> str | None:
        out = self.trainer_values.get("output_dir")
        return out if isinstance(out, str) else None

    @classmethod
    def from_json(cls, data: Any, file: str | Path = "plan.json") -> PlanRecord:
        """Strict: raises RunFileError naming ``file`` and the key missing or mistyped."""
        f = Fields(data, file)
        topology, vllm, estimate = f.obj("topology"), f.obj("vllm"), f.obj_or_none("estimate")
        layout, train = f.obj("layout"), f.obj("train")
        asynchronous = f.obj_or_none("asynchronous")
        return cls(
            file=str(file),
            recipe=f.text_or_none("recipe"),
            gpus_per_host=tuple(len(h.sequence("gpus")) for h in topology.objects("hosts")),
            topology=topology.text("description"),
            roles=tuple(RoleRecord(r.text("host"), r.text("role"), r.text("gpu")) for r in f.objects("roles")),
            vllm_mode=vllm.text("mode"),
            vllm_parallel=tuple(vllm.integer(k) for k in VLLM_SIZES),
            vllm_memory_share=vllm.real_or_none("gpu_memory_utilization"),
            layout={k: layout.integer(k) for k in LAYOUT_KEYS},
            train={k: train.text(k) for k in TRAIN_KEYS},
            prediction=Prediction.read(estimate) if estimate is not None else None,
            startup_s=estimate.real_or_none("startup_s") if estimate is not None else None,
            total=_total(estimate),
            calibration=_calibration(estimate),
            queue_maxsize=asynchronous.integer_or_none("queue_maxsize") if asynchronous is not None else None,
            trainer_values=f.mapping("trainer_values"),
            startup_phases=_startup_phases(estimate),
        )

    def to_json(self) -> dict[str, Any]:
        """The part of plan.json this record reads, in plan.json's shape: ``from_json(to_json())`` is the record."""
        sizes = dict(zip(VLLM_SIZES, self.vllm_parallel, strict=True))
        return {
            "recipe": self.recipe,
            "topology": {"description": self.topology, "hosts": [{"gpus": [{}] * n} for n in self.gpus_per_host]},
            "roles": [{"host": r.host, "role": r.role, "gpu": r.gpu} for r in self.roles],
            "vllm": {"mode": self.vllm_mode, **sizes, "gpu_memory_utilization": self.vllm_memory_share},
            "layout": dict(self.layout),
            "train": dict(self.train),
            "estimate": self._estimate_json(),
            "asynchronous": None if self.queue_maxsize is None else {"queue_maxsize": self.queue_maxsize},
            "trainer_values": dict(self.trainer_values),
        }

    def _estimate_json(self) -> dict[str, Any] | None:
        pred = self.prediction
        if pred is None and self.startup_s is None and self.total is None and self.calibration is None:
            return None
        out: dict[str, Any] = pred.to_json() if pred is not None else {"time_s": None, "workload": None}
        memory = pred.train_memory_gib if pred is not None else None
        out["memory_per_training_gpu_gib"] = {"total": memory} if memory is not None else None
        out["startup_s"] = self.startup_s
        out["startup"] = (
            {"phases": [{"name": n, "seconds": v, "measured": m} for n, v, m in self.startup_phases]}
            if self.startup_phases
            else None
        )
        out["total"] = {"price": self.total[0], "gpu_hours": self.total[1]} if self.total else None
        out["calibration"] = dataclasses.asdict(self.calibration) if self.calibration else None
        return out


LAYOUT_KEYS = ("per_device_train_batch_size", "num_processes", "gradient_accumulation_steps",
               "completions_per_optimizer_step", "num_generations")  # fmt: skip
TRAIN_KEYS = ("backend", "device", "offload", "mixed_precision")
VLLM_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def _total(estimate: Fields | None) -> tuple[float | None, float] | None:
    total = estimate.obj_or_none("total") if estimate is not None else None
    return (total.real_or_none("price"), total.real("gpu_hours")) if total is not None else None


def _startup_phases(estimate: Fields | None) -> tuple[tuple[str, float, bool], ...]:
    """plan.json's estimate.startup.phases (absent in plans written before it was recorded: none)."""
    startup = estimate.obj_or_none("startup") if estimate is not None and "startup" in estimate.data else None
    if startup is None:
        return ()
    return tuple((p.text("name"), p.real("seconds"), p.data.get("measured") is True) for p in startup.objects("phases"))


def _calibration(estimate: Fields | None) -> RecordedCalibration | None:
    recorded = estimate.obj_or_none("calibration") if estimate is not None else None
    return RecordedCalibration.read(recorded) if recorded is not None else None

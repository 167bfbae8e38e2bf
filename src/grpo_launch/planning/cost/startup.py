"""Time to first step, as its phases: what a run pays before its first optimizer step, and again on every restart.
Each phase has the name of the record the run writes when it ends (:class:`grpo_launch.rundir.records.StartupRecord`),
so ``status`` and the report compare them one by one:

- ``start``: the launcher's processes (accelerate launch, torchrun) and each rank's imports of torch, transformers
  and TRL;
- ``model_load``: the weights from disk at the storage's speed, the process groups (and CUDA) and DeepSpeed's
  engine; the dataset is prepared here too (not priced);
- ``vllm_ready``: the vLLM server's start to healthy, beside the trainers' start (a server), or after it inside them
  (colocated engines);
- ``first_sync``: the first weight sync to a server;
- ``first_generation``: the first generation round, with its warm-up (each new kernel shape's set-up).

Each phase is measured by ``grpo-launch calibrate`` where it measured it, else from the sourced constants
(constants.py). Pure."""

from __future__ import annotations

import itertools
import math

from grpo_launch.enums import VllmMode
from grpo_launch.machines.calibrated_speed import MeasuredTerms
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import CONSTANTS
from grpo_launch.rundir.startup_phases import critical_path_s
from grpo_launch.spec import frozen

# (parameters, seconds) the vLLM ready time is interpolated between (log-linear in the parameters)
_READY = ((1.5e9, "vllm_ready_s_1_5b"), (7e9, "vllm_ready_s_7b"), (70e9, "vllm_ready_s_70b"))


def _c(name: str) -> float:
    return CONSTANTS[name].value


def vllm_ready_s(params: float) -> float:
    """Seconds until a vLLM engine of ``params`` parameters answers, from the published start-up times."""
    points = [(math.log(p), _c(k)) for p, k in _READY]
    x = math.log(max(params, 1.0))
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


@frozen
class Phase:
    """One phase of the time to first step: its seconds, how they were found, and whether it runs beside the
    trainers' own start (a vLLM server) rather than after it."""

    name: str
    seconds: float
    why: str
    measured: bool = False
    beside: bool = False


@frozen
class Startup:
    """The time to first step as its phases, and their critical path."""

    phases: tuple[Phase, ...]

    @property
    def first_step_s(self) -> float:
        """Until the first generation round is done: a server's start overlaps the trainers' own."""
        return critical_path_s({p.name: p.seconds for p in self.phases}) or 0.0

    def seconds(self, name: str) -> float | None:
        return next((p.seconds for p in self.phases if p.name == name), None)

    def line(self) -> str:
        parts = ", ".join(f"{p.name} {p.seconds:.1f} s ({'measured' if p.measured else 'table'})" for p in self.phases)
        return f"time to first step ≈ {self.first_step_s:.0f} s: {parts}"


def startup_time(
    model: ModelShape,
    mode: VllmMode,
    *,
    deepspeed: bool,
    machines: int,
    processes: int,
    first_sync_s: float,
    first_generation_s: float,
    first_decode_steps: float,
    measured: MeasuredTerms | None = None,
    gloo: bool = False,
) -> Startup:
    """The time to first step of a plan: the trainers on ``machines`` hosts (``processes`` in all; with DeepSpeed's
    engine when ``deepspeed``), vLLM in ``mode``, the first weight sync (``first_sync_s``: the step model's
    broadcast, between hosts where the server is on another) and the first generation round (``first_generation_s``
    warm, ``first_decode_steps`` decode steps in the trainers without vLLM, whose warm-up is priced per step).
    ``measured``: a calibration's terms replace the constants they cover. ``gloo``: the trainers are on CPUs, whose
    process groups start without NCCL's cost."""
    m = measured
    load = _model_load(model, m, deepspeed=deepspeed, machines=machines, processes=processes, gloo=gloo)
    phases = [_start(m), load]
    if mode != VllmMode.OFF:
        took = m is not None and bool(m.engine_start_s)
        ready = m.engine_start_s if took and m is not None and m.engine_start_s else vllm_ready_s(model.params)
        why = "measured by calibrate" if took else "published start-up times (constants.py vllm_ready_s_*)"
        if mode == VllmMode.SERVER:
            phases.append(Phase("vllm_ready", ready, why, took, beside=True))
        else:  # colocated engines start inside the trainers, as GRPOTrainer is built: part of its load
            phases[1] = Phase(
                "model_load",
                load.seconds + ready,
                f"{load.why} + the colocated engines' start {ready:.0f} s ({why})",
                load.measured,
            )
    if mode == VllmMode.SERVER:
        sync = first_sync_s + _c("nccl_init_s_node")
        phases.append(Phase("first_sync", sync, "the weight-sync group's NCCL start + the first broadcast"))
    phases.append(_first_generation(m, mode, first_generation_s, first_decode_steps))
    return Startup(tuple(phases))


def _start(m: MeasuredTerms | None) -> Phase:
    launcher = _c("launcher_start_s")
    if m is not None and m.imports_s:
        return Phase(
            "start",
            launcher + m.imports_s,
            f"accelerate launch and torchrun {launcher:.1f} s (table) + imports {m.imports_s:.1f} s measured",
            measured=True,
        )
    imports = _c("trainer_imports_s")
    return Phase(
        "start", launcher + imports, f"accelerate launch and torchrun {launcher:.1f} s + imports {imports:.1f} s"
    )


def _model_load(
    model: ModelShape, m: MeasuredTerms | None, *, deepspeed: bool, machines: int, processes: int, gloo: bool
) -> Phase:
    measured_rate = m is not None and m.load_bytes and m.load_s
    rate = (m.load_bytes / m.load_s) if measured_rate and m is not None and m.load_s else _c("load_bytes_per_s")
    load = model.weight_bytes_bf16 / rate
    groups = (
        0.0 if gloo else _c("nccl_init_s_nodes") if machines > 1 else _c("nccl_init_s_node") if processes > 1 else 0.0
    )
    group_why = ""
    if m is not None and m.process_group_s is not None and machines == 1 and processes > 1 and not gloo:
        groups, group_why = m.process_group_s, " measured"  # one host's communicator, as calibrate started one
    cuda = m.cuda_init_s if m is not None and m.cuda_init_s else 0.0
    ds = 0.0
    if deepspeed:
        ds = m.deepspeed_init_s if m is not None and m.deepspeed_init_s else _c("deepspeed_init_s")
    why = (
        f"{model.weight_bytes_bf16 / 1e9:.1f} GB at {rate / 1e9:.1f} GB/s"
        + (" measured" if measured_rate else "")
        + f" = {load:.1f} s"
        + (f" + CUDA's start {cuda:.1f} s measured" if cuda else "")
        + (f" + process groups {groups:.1f} s{group_why}" if groups else "")
        + (f" + DeepSpeed {ds:.0f} s" if ds else "")
    )
    return Phase("model_load", load + cuda + groups + ds, why, measured=bool(measured_rate))


def _first_generation(m: MeasuredTerms | None, mode: VllmMode, warm_s: float, steps: float) -> Phase:
    """The first round: warm, plus the trainers' warm-up per decode step without vLLM (vLLM warms up in its start:
    its CUDA graphs are captured before it answers)."""
    if mode != VllmMode.OFF:
        return Phase("first_generation", warm_s, f"{warm_s:.1f} s (vLLM warmed up in its start)")
    measured = m is not None and m.warmup_decode_s_per_step is not None
    per_step = m.warmup_decode_s_per_step if measured and m is not None else _c("first_generation_warmup_s_per_step")
    assert per_step is not None
    warmup = per_step * steps
    why = (
        f"{warm_s:.1f} s + warm-up {steps:.0f} steps × {per_step * 1e3:.1f} ms"
        + (" measured" if measured else "")
        + f" = {warmup:.1f} s"
    )
    return Phase("first_generation", warm_s + warmup, why, measured=measured)

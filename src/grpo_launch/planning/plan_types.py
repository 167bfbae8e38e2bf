"""The planner's data: the Plan and its parts, the Trace that records every choice, and split Candidates. Frozen
dataclasses and str-valued enums (:mod:`grpo_launch.enums`), so a plan is plain data for render and plan.json."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_launch.enums import Device, DistBackend, GpuUse, Offload, Role, VllmMode
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.checkpoints import SaveInterval
from grpo_launch.planning.cost.memory import TrainMemory, VllmMemory
from grpo_launch.planning.cost.startup import Startup
from grpo_launch.planning.cost.steptime import StepTime, TimeTerm
from grpo_launch.planning.cost.workload import Calibration, Workload
from grpo_launch.planning.parallel_and_batch import Layout, Parallelism
from grpo_launch.recipe import Recipe
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.spec import frozen

__all__ = [
    "Candidate",
    "Decision",
    "Device",
    "DistBackend",
    "Estimate",
    "GpuRole",
    "Offload",
    "Plan",
    "Role",
    "StepTime",
    "Trace",
    "TrainHost",
    "TrainPlan",
    "VllmMode",
    "VllmPlan",
]


@frozen
class Runtime:
    """What a plan needs to know of where it will run, read before planning (the CLI probes it): the run
    directory (None: launch.run_dir, else grpo_runs/NAME), the Python on the hosts, the vLLM version the trainers
    import (some server flags depend on it), the training set's rows when counted locally (for the whole-run
    time), and what reading them warned about (an unknown model)."""

    run_dir: str | None = None
    python: str = "python3"
    vllm_version: str | None = None
    dataset_rows: int | None = None
    dataset_rows_source: str = ""  # where the rows came from, or why they are unknown (when dataset_rows is None)
    warnings: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()  # what the plan should say of where its terms came from (a stored calibration)


@frozen
class Decision:
    """One row of the plan's Why table: what was decided, the value and the reason."""

    what: str
    value: Any
    why: str


@dataclass(eq=False, repr=False)  # a working record: no generated comparison or repr (plan start-up)
class Trace:
    """What the planner decided and why, what it changed in the recipe (notices) and what it doubts (warnings).
    Passed to each planning step instead of three separate lists; frozen into the Plan at the end."""

    decisions: list[Decision] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def decide(self, what: str, value: Any, why: str) -> None:
        self.decisions.append(Decision(what, value, why))

    def notice(self, text: str) -> None:
        self.notices.append(text)

    def warn(self, text: str) -> None:
        self.warnings.append(text)


@frozen
class ServerNode:
    """One more host of a data-parallel vLLM server spread over several (its engines run headless there)."""

    name: str
    address: str
    gpus: tuple[str, ...]


@frozen
class VllmPlan:
    """How vLLM runs: its mode, the server's host, address, GPUs and parallelism, and its memory settings."""

    mode: VllmMode
    host: str | None = None  # the host of the API server (the first data-parallel ranks)
    address: str | None = None
    gpus: tuple[str, ...] = ()  # visible ids on ``host`` (server mode)
    nodes: tuple[ServerNode, ...] = ()  # the server's other hosts (vLLM multi-node data parallel), headless
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1  # server: DP ranks of TP × PP GPUs each (the server holds TP × PP × DP GPUs)
    pipeline_parallel_size: int = 1  # server: pipeline stages of each replica (on consecutive hosts when it spans)
    expert_parallel: bool = False  # server: --enable-expert-parallel (the experts spread over all its GPUs)
    port: int = 8000
    bind_host: str = "127.0.0.1"
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_prompt_length: int | None = None  # prompts longer than this are dropped by the trainers
    sleep_mode: bool = False  # colocate: vLLM sleeps while the trainers train (vllm_enable_sleep_mode)

    def engines(self, trainers: int) -> Parallelism:
        """What generates: the server's TP × PP × DP, or the colocated engines, one per TP group of ``trainers``."""
        if self.mode == VllmMode.COLOCATE:
            return dataclasses.replace(self.parallelism, dp=max(1, trainers // self.tensor_parallel_size))
        return self.parallelism

    @property
    def parallelism(self) -> Parallelism:
        """The engine's (colocate) or server's parallelism as one value. The flat fields stay the stored form:
        plan.json writes them as they are. A colocated plan holds one engine's TP here; its engines are one per TP
        group of trainers (:func:`grpo_launch.planning.vllm_sizing.engines`)."""
        return Parallelism(
            self.tensor_parallel_size, self.pipeline_parallel_size, self.data_parallel_size, self.expert_parallel
        )

    @property
    def base_url(self) -> str | None:
        return f"http://{self.address}:{self.port}" if self.mode == VllmMode.SERVER else None

    @property
    def replica_gpus(self) -> int:
        return self.parallelism.replica_gpus

    @property
    def spans_hosts(self) -> bool:
        """One replica's pipeline stages run on several hosts (vLLM's ``--nnodes`` form)."""
        return bool(self.nodes) and self.replica_gpus > len(self.gpus)

    @property
    def local_data_parallel_size(self) -> int:
        """Data-parallel ranks on each of the server's hosts (1 where a replica spans hosts)."""
        return max(1, len(self.gpus) // self.replica_gpus)

    @property
    def rpc_port(self) -> int:
        """The port the API server's host coordinates the other hosts' engines on (--data-parallel-rpc-port)."""
        return self.port + 1

    @property
    def master_port(self) -> int:
        """The port of the torch.distributed group of a replica over several hosts (--master-port)."""
        return self.port + 2

    @property
    def server_hosts(self) -> tuple[str, ...]:
        return (self.host or "", *(n.name for n in self.nodes)) if self.mode == VllmMode.SERVER else ()

    @property
    def health_url(self) -> str | None:
        return f"{self.base_url}/health" if self.base_url else None

    @property
    def metrics_urls(self) -> tuple[str, ...]:
        """vLLM's own Prometheus endpoint on each API server (one: the other hosts run headless engines). The
        guard lets ``GET /metrics`` through without the token (grpo_launch.node.vllm_guard), so it is scraped as
        it is: grpo-launch serves none of vLLM's metrics again."""
        return (f"{self.base_url}/metrics",) if self.base_url else ()


@frozen
class TrainHost:
    """One host of the training processes: its address, machine rank, GPUs and process count."""

    name: str
    address: str
    machine_rank: int
    gpus: tuple[str, ...]  # visible ids; () on CPU
    processes: int


@frozen
class TrainPlan:
    """How the trainers run: their hosts, distributed backend, offload, main port and precision."""

    device: Device
    hosts: tuple[TrainHost, ...]
    backend: DistBackend
    offload: Offload
    main_process_port: int
    mixed_precision: str  # bf16 | no
    gradient_checkpointing: bool | None = None  # None: as the recipe says (TRL's default is on)

    @property
    def num_processes(self) -> int:
        return sum(h.processes for h in self.hosts)

    @property
    def num_machines(self) -> int:
        return len(self.hosts)

    @property
    def main_process_ip(self) -> str:
        """Where the ranks reach the rendezvous store. On one machine that is 127.0.0.1 (torchrun's
        ``--master-addr`` default, which accelerate keeps for one machine), the one address the store listens on
        there (grpo_launch.node.loopback_store); over several machines it is the first host's address, and torch's
        store listens on every interface of that host (README.md, "Ports")."""
        return self.hosts[0].address if self.num_machines > 1 else "127.0.0.1"


@frozen
class GpuRole:
    """What one GPU does in the plan: training, vLLM, both (colocated) or nothing."""

    host: str
    gpu: str
    name: str
    memory_gib: float | None
    role: GpuUse


@frozen
class AsyncSettings:
    """AsyncGRPOTrainer's pipeline values as planned (launch.mode async), with the predictions behind them."""

    max_inflight_tasks: int
    max_staleness: int
    token_budget: int
    weight_sync_steps: int
    queue_maxsize: int
    dtype: str  # the trainer's model dtype (AsyncGRPOConfig.dtype, float32 unless the recipe sets it)
    predicted_staleness: float  # mean lag of a trained sample, in weight versions
    overlap_bound: float  # (gen + train) / max(gen, train) of the chosen split
    sync_step_s: float | None = None  # the best synchronous plan's step at the same work (None: none plans)
    sync_label: str = ""  # that plan's split
    speedup: float | None = None  # sync_step_s over the async step
    weight_sync_timeout: int = 1800  # seconds before a stuck weight sync raises (AsyncGRPOConfig.weight_sync_timeout)
    lora_rank: int | None = None  # --max-lora-rank of the server when use_peft (adapter-only weight sync)
    max_loras: int | None = None  # --max-loras: max_staleness + 2 (trl async_grpo_trainer.py:899)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@frozen
class Training:
    """One split's training settings (planning/training.py chooses them); ``gradient_checkpointing`` None leaves it
    to the recipe."""

    backend: DistBackend
    offload: Offload
    gradient_checkpointing: bool | None
    memory: TrainMemory | None
    host_memory: float = 0.0  # bytes of host RAM per node that offload needs


@frozen
class Total:
    """The whole run, before launch: optimizer steps (max_steps, or epochs × rows ÷ prompts per step), hours at the
    predicted step time, GPU-hours over every GPU the run holds, and the price when a GPU-hour price is given."""

    steps: int
    hours: float
    gpu_hours: float
    price: float | None
    source: str  # where the step count came from
    # The lower end of the range: every completion at the expected mean length (stated in ``expected_source``).
    hours_expected: float | None = None
    expected_source: str = ""


@frozen
class Estimate:
    """Predicted memory and step time (:mod:`grpo_launch.planning.costmodel`), with the arithmetic behind them."""

    step: StepTime | None  # None where the GPU's speed is unknown (``time_missing`` says why); memory still holds
    train_memory_gib: float | None
    vllm_memory_gib: float | None
    gpu_memory_gib: float
    explain: tuple[str, ...]
    total: Total | None = None  # the whole run: steps, hours, GPU-hours, price
    train_memory: TrainMemory | None = None  # the terms behind train_memory_gib
    vllm_memory: VllmMemory | None = None  # the terms behind the vLLM share
    host_memory_per_node_gib: float = 0.0  # what offload needs on each node
    workload: Workload | None = None  # what the estimate assumed one step processes (and its calibration)
    time_missing: str | None = None
    total_missing: str | None = None  # why there is no whole-run forecast (the step count is unknown)
    startup_s: float | None = None  # time to first step (to the first round generated): paid again on every restart
    startup: Startup | None = None  # the same as its phases, each measured or from the table
    restart_s: float | None = None  # what each start costs beyond its steps: startup_s less its warm generation
    save_interval: SaveInterval | None = None  # the checkpoint interval and what it costs (planning/save_steps.py)
    terms: tuple[TimeTerm, ...] = ()  # each step term's table and measured values (--explain)


@frozen
class Candidate:
    """One split the search considered, planned at the prompts per step every split is compared at: how its GPUs
    are used, its predicted step, or why it could not be planned (``rejected``) or was not planned in full (its
    lower bound already lost: ``bound_s``)."""

    label: str
    mode: VllmMode
    par: Parallelism = Parallelism()
    server_gpus: int = 0
    trainers: int = 0
    idle: int = 0
    step: StepTime | None = None
    prompts_per_step: float = 0.0
    rejected: str | None = None
    chosen: bool = False
    bound_s: float | None = None
    outscored: str | None = None  # a TP × DP variant of its size that lost on generation alone (bounds.best_variant)

    @property
    def tensor_parallel_size(self) -> int:
        return self.par.tp

    @property
    def data_parallel_size(self) -> int:
        return self.par.dp

    @property
    def pipeline_parallel_size(self) -> int:
        return self.par.pp

    @property
    def status(self) -> str:
        """chosen, planned (in full, slower), bounded (its lower bound already lost) or rejected."""
        if self.chosen:
            return "chosen"
        if self.rejected is not None:
            return "rejected"
        if self.outscored is not None:
            return "outscored"
        return "planned" if self.step is not None else "bounded"

    @property
    def per_prompt_s(self) -> float | None:
        if self.step is None or not self.prompts_per_step:
            return None
        return self.step.total_s / self.prompts_per_step

    @property
    def balance(self) -> float | None:
        """Generation over training, as the trainers time them (generation includes the old log-probs and the
        weight sync)."""
        if self.step is None or not self.step.training_s:
            return None
        return self.step.trainer_generation_s / self.step.training_s


@frozen
class Plan:
    """Everything decided for one run. ``run_dir``, ``python`` and ``vllm_version`` are the runtime settings the
    renderers need (from :class:`Runtime`): every path of the run (configs, logs, control dir, the default
    output_dir) derives from ``run_dir``."""

    recipe: Recipe
    topology: Topology
    model: ModelShape | None
    vllm: VllmPlan
    train: TrainPlan
    layout: Layout
    run_dir: str
    trainer_values: Mapping[str, Any]  # the recipe's TRL values as planned; output_dir only when the user set it
    roles: tuple[GpuRole, ...]
    decisions: tuple[Decision, ...] = ()
    notices: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    estimate: Estimate | None = None
    candidates: tuple[Candidate, ...] = ()
    python: str = "python3"
    vllm_version: str | None = None  # the trainers' (and so the server's) vLLM, when known (some flags depend on it)
    runtime: Runtime = Runtime()  # what the plan was made with (a replan after an OOM reuses it)
    split: str = ""  # how the GPUs are split, as the search labels it (a candidate's label)
    asynchronous: AsyncSettings | None = None  # launch.mode async (or auto choosing it): AsyncGRPOTrainer

    @property
    def calibration(self) -> Calibration | None:
        """The calibration the plan was made with (a stored ``grpo-launch calibrate`` file's measured terms, a run's
        scales; None: the plan has no estimate), so a re-plan after a run (out of memory, a Ray node replaced, adapt)
        prices its candidates as this plan did."""
        work = self.estimate.workload if self.estimate is not None else None
        return work.scale if work is not None else None

    @property
    def paths(self) -> RunPaths:
        """Every file of the plan's run directory."""
        return RunPaths(self.run_dir)

    @property
    def output_dir(self) -> str:
        return str(self.trainer_values.get("output_dir") or self.paths.output)

    @property
    def resolved_trainer_values(self) -> dict[str, Any]:
        """The values the training entry reads: the planned values with output_dir filled in."""
        return {**self.trainer_values, "output_dir": self.output_dir}

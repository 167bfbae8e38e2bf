"""What ``grpo-launch calibrate`` measures, in the order a plan needs it, within its budget: this process's own
measurements (:mod:`grpo_launch.probe.bench`: the trainers' imports, the load from disk, decode through the plan's
engine, the training step), then in their own processes vLLM's start-up and decode (:mod:`grpo_launch.probe
.bench_vllm`) when the plan generates with it, the plan's distributed engine (:mod:`grpo_launch.probe.bench_backend`),
the weight sync of a server plan (:mod:`grpo_launch.probe.bench_sync`), TRL's own time per step from a short real run
of the recipe; last what the plan does not use (the other engines, the other distributed engines). A measurement
whose expected cost no longer fits what is left is not started, and is named with the reason. Progress goes to the
``say`` callback the command gives. Imported only by ``calibrate``."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from grpo_launch.analysis.step_means import read_run
from grpo_launch.enums import DistBackend, VllmMode
from grpo_launch.machines.calibrated_speed import MeasuredTerms
from grpo_launch.planning.cost.measured_time import measured_step_time
from grpo_launch.planning.cost.steptime import trainer_decode_batch
from grpo_launch.planning.measured_scales import step_peak_prediction
from grpo_launch.probe import bench_vllm
from grpo_launch.probe.bench import BenchSpec, Budget, decode_batches
from grpo_launch.probe.bench_backend import measure_backend
from grpo_launch.probe.bench_child import json_child
from grpo_launch.probe.bench_phases import measure_other_engine, other_engine_need
from grpo_launch.probe.bench_start import load_model
from grpo_launch.probe.bench_sync import measure_sync
from grpo_launch.probe.calibration_store import calibration_dir, recipe_dtype
from grpo_launch.probe.pythons import vllm_version_here
from grpo_launch.recipe.trl_schema import DEFAULTS
from grpo_launch.rundir.layout import CALIBRATIONS_ENV
from grpo_launch.spec import RunContext

Say = Callable[[str], None]


def _vllm_phase(python: str | None, spec: Any, seconds: float, batches: list[int]) -> tuple[dict[str, Any] | None, str]:
    """vLLM's start-up and decode measured in ``python``; (None, why) when it cannot run."""
    if python is None:
        return None, "vLLM start-up and decode: no vLLM in this Python (give --vllm-python)"
    model = os.path.abspath(spec.model) if os.path.exists(spec.model) else spec.model  # vLLM runs in a temp dir
    job = {
        "model": model,
        "dtype": spec.dtype,
        "prompt_len": spec.prompt_len,
        "completion_len": spec.completion_len,
        "random_weights": spec.random_weights,
        "batches": batches,
        "seconds": seconds / 2,
        "graphs": spec.device == "cuda",
    }
    with tempfile.TemporaryDirectory(prefix="grpo-calibrate-vllm-") as tmp:
        # vLLM leaves socket files in TMPDIR; its engine core and workers are children of their own (json_child
        # stops the whole session on a timeout)
        kv = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "TMPDIR": tmp,
            "VLLM_CACHE_ROOT": f"{tmp}/cache",
            "VLLM_CPU_KVCACHE_SPACE": kv,
        }
        report, why = json_child([python, bench_vllm.__file__, json.dumps(job)], env, seconds, cwd=tmp)
    return report, why and f"vLLM start-up and decode: {why}"


OVERHEAD_STEPS = 4  # the short real run's steps: the first warms up and is left out


def _trainer_overhead(
    args: argparse.Namespace,
    ctx: RunContext,
    terms: Any,
    n: int,
    work: Any,
    vllm: bool,
    seconds: float,
    model: Any = None,
) -> tuple[tuple[float, float, int] | None, str]:
    """TRL's own time per step beyond the measured kernels: a few real steps of the recipe (``grpo-launch run``,
    planned as a run here is), their mean generation and training time less :func:`measured_step_time`'s for the
    same workload. (None, why) when it cannot run."""
    what = "TRL's own time per step (a short real run)"
    if args.random_weights:
        return None, f"{what}: not measured with --random-weights (a real run needs the weights)"
    with tempfile.TemporaryDirectory(prefix="grpo-calibrate-") as tmp:
        # ports of its own: the recipe's (29500, 8000 by default) may be held by a run of the user's on this machine
        ports = [f"launch.main_process_port={_free_port()}", f"launch.vllm_port={_free_port()}"]
        cmd = [
            sys.executable,
            "-m",
            "grpo_launch",
            "run",
            args.recipe,
            *args.overrides,
            *ports,
            f"max_steps={OVERHEAD_STEPS}",
            "save_strategy=no",
            "report_to=none",
            "logging_steps=1",
            "--run-dir",
            f"{tmp}/run",
            "--resume",
            "never",
        ]
        env = {**ctx.environ, CALIBRATIONS_ENV: f"{tmp}/none", "PYTHONUNBUFFERED": "1"}
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=seconds, env=env, cwd=ctx.workdir, start_new_session=True
            )
        except subprocess.TimeoutExpired:
            return None, f"{what}: not done within its {seconds:.0f} s (raise --minutes)"
        if done.returncode:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
            return None, f"{what}: the run failed ({tail})"
        m = read_run(f"{tmp}/run")
    found = measured_step_time(terms, n, work, vllm=vllm, model=model)
    if found is None:
        return None, f"{what}: the kernels it is measured against were not measured"
    kernels, _ = found
    rounds = work.generations_per_step or 1.0
    gen = max(0.0, (m.generation_s - kernels.trainer_generation_s) / rounds)
    train = max(0.0, m.training_s - kernels.training_s)
    return (gen, train, max(0, m.steps - 1)), ""


def _free_port() -> int:
    """A TCP port no process on this machine listens on now (the system's choice of a free one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


RESERVE_S = 3.0  # kept back from --minutes for writing the record and printing it


def bench_spec(plan: Any, recipe: Any, work: Any, args: argparse.Namespace, seconds: float, weights_dir: str) -> Any:
    """What the in-process measurements measure: the plan's sizes, engine, sampling, checkpointing and precision."""
    topo, n = plan.topology, plan.train.num_processes
    host = topo.hosts[0] if topo.hosts else None
    cpus = (host.slots or host.cpus if host else None) or os.cpu_count() or 1
    device = "cpu" if topo.is_cpu else "cuda"
    names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    sampling = tuple((k, recipe.get(k) if recipe.get(k) is not None else DEFAULTS.get(k)) for k in names)
    trainer_dtype = plan.resolved_trainer_values.get("dtype") or "float32"  # TRL's ModelConfig default
    bf16 = plan.train.mixed_precision == "bf16"
    return BenchSpec(
        str(recipe.get("model_name_or_path")),
        work.prompt_len,
        work.completion_len,
        work.per_device,
        recipe_dtype(recipe),
        device,
        max(1, cpus // n) if device == "cpu" else 0,
        args.random_weights,
        seconds,
        generation_batch=trainer_decode_batch(n, work.per_generation()),
        engine="continuous" if work.continuous_batching else "generate",
        sampling=tuple((k, v) for k, v in sampling if v is not None),
        checkpointing=work.gradient_checkpointing,
        train_dtype="float32"
        if (trainer_dtype in ("float32", "auto") and device == "cpu") or trainer_dtype == "float32"
        else "bfloat16",
        autocast=bf16 and trainer_dtype == "float32",
        old_logprobs=work.old_logprobs,
        weights_dir=weights_dir,
    )


class Schedule:
    """One calibrate's measurements: the plan and recipe they measure for, what is left of the budget, where
    progress goes (``say``), and what was not measured and why (``not_measured``)."""

    def __init__(
        self,
        args: argparse.Namespace,
        ctx: RunContext,
        plan: Any,
        recipe: Any,
        work: Any,
        say: Say,
        bench: Callable[[Any], tuple[dict[str, Any], Any]],
        started: float,
    ) -> None:
        """``bench``: runs this process's own measurements (:func:`.bench.run_bench`, under the CLI's progress);
        ``started``: when calibrate began (monotonic), which ``--minutes`` counts from."""
        self.args, self.ctx, self.plan, self.recipe, self.work = args, ctx, plan, recipe, work
        self.say, self.bench = say, bench
        self.budget = Budget(args.minutes * 60 - RESERVE_S - (time.monotonic() - started))
        self.not_measured: list[str] = []

    def skipped(self, name: str, need: float) -> bool:
        """Whether a measurement expected to take ``need`` seconds no longer fits (then it is named as such)."""
        if self.budget.fits(need):
            return False
        self.not_measured.append(f"{name}: the budget is spent (needs ≈ {need:.0f} s; raise --minutes)")
        return True

    def run(self) -> Any:
        """Every measurement in the order the plan needs them; the terms (what was not measured is in
        ``not_measured``)."""
        args, plan, work = self.args, self.plan, self.work
        topo = plan.topology
        measures_vllm = plan.vllm.mode != VllmMode.OFF or bool(args.vllm_python)
        if not topo.is_cpu and topo.num_gpus > 1:
            self.not_measured.append(f"training on all {topo.num_gpus} GPUs: the measurements use one GPU")
        if topo.is_cpu:
            self.not_measured.append(
                "peak memory: this process's resident set (a CPU run's, not the GPU memory model's)"
            )
        # random weights go where calibrations and the hub's cache live (the user's disk), not a temp dir in RAM
        near = calibration_dir(self.ctx.environ).parent
        near.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="weights-", dir=near) as weights:
            # this process's own measurements first: what is left afterwards goes to the subprocesses
            share = 0.45 if measures_vllm or plan.train.backend != DistBackend.DDP else 0.6
            self.spec = spec = bench_spec(
                plan, self.recipe, work, args, self.budget.left() * share, weights if args.random_weights else ""
            )
            result, model = self.bench(spec)
            del model  # the GPU is the subprocesses' now
            _free(spec.device)
            self.not_measured += result["failed"]
            vllm_data = None
            if measures_vllm:
                vllm_data = self.vllm()
            else:
                self.not_measured.append(
                    "vLLM start-up and decode: vLLM is off in this recipe (--vllm-python PYTHON measures it)"
                )
            mine = plan.train.backend
            backends = self.backends([mine] if mine != DistBackend.DDP else [])
            server = plan.vllm.mode == VllmMode.SERVER
            sync = self.sync() if server else None  # a server plan pays it every step
            terms = _with_peak_prediction(_terms(spec, topo, result, sync, vllm_data, backends), plan.model, spec)
            terms = self.overhead(terms)
            # what the plan does not use last: the weight sync of a plan without a server, the other engines
            if not server:
                sync = self.sync()
                terms = dataclasses.replace(
                    terms, sync_s=sync["seconds"] if sync else None, sync_path=sync["path"] if sync else ""
                )
            more = self.backends([b for b in (DistBackend.ZERO3, DistBackend.ZERO2, DistBackend.FSDP) if b != mine])
            if more:
                terms = dataclasses.replace(terms, backend_train=terms.backend_train + _backend_rows(more))
            other = self.other_engine()
        return dataclasses.replace(terms, **other) if other else terms

    def vllm(self) -> dict[str, Any] | None:
        """vLLM's start-up and decode at batches up to an engine's share of a generation round, in vLLM's Python."""
        python = self.args.vllm_python or (sys.executable if _has_vllm() else None)
        python = os.path.abspath(os.path.join(self.ctx.workdir, python)) if python and os.sep in python else python
        engines_ = self.plan.vllm.engines(self.plan.train.num_processes).dp
        per_engine = max(1, self.work.per_generation().completions // max(1, engines_))
        if self.skipped("vLLM start-up and decode", 30.0):
            return None
        self.say(f"vLLM start-up and decode ({python}, at most {self.budget.left():.0f} s)")
        data, why = _vllm_phase(python, self.spec, self.budget.left(), decode_batches(per_engine))
        self.not_measured += [why] if why else []
        return data

    def backends(self, order: list[Any]) -> list[dict[str, Any]]:
        """The training step through each distributed engine of ``order`` (DeepSpeed's, FSDP2's) that this machine
        can run, each in its own process, while the budget holds."""
        out = []
        for backend in order:
            name = f"training step through {backend}"
            if backend.is_deepspeed and importlib.util.find_spec("deepspeed") is None:
                self.not_measured.append(f"{name}: DeepSpeed is not installed here")
                continue
            if self.skipped(name, 30.0 if self.spec.device == "cpu" else 20.0):
                continue
            self.say(f"{name} (its own process, at most {self.budget.left():.0f} s)")
            job = {"backend": str(backend), "spec": spec_json(self.spec), "seconds": 5.0}
            data, why = measure_backend(job, self.budget.left())
            if data is None:
                self.not_measured.append(f"{name}: {why}")
            else:
                out.append(data)
        return out

    def sync(self) -> dict[str, Any] | None:
        """The weight sync trainer → server, between two processes here."""
        if self.skipped("weight sync trainer → vLLM", 15.0):
            return None
        sync, why = _sync_phase(self.spec, self.plan.topology, self.say, self.budget.left())
        self.not_measured += [why] if why else []
        return sync

    def overhead(self, terms: Any) -> Any:
        """``terms`` with TRL's own time per step, from a short real run of the recipe, where the budget holds one."""
        what = "TRL's own time per step (a short real run)"
        need = 2 * (terms.imports_s or 10.0) + (terms.load_s or 0.0) + 10.0
        if self.args.random_weights:
            self.not_measured.append(f"{what}: not measured with --random-weights (a real run needs the weights)")
            return terms
        if self.skipped(what, need):
            return terms
        self.say(f"{what}: {OVERHEAD_STEPS} steps of the recipe, at most {self.budget.left():.0f} s")
        overhead, why = _trainer_overhead(
            self.args,
            self.ctx,
            terms,
            self.plan.train.num_processes,
            self.work,
            self.plan.vllm.mode != VllmMode.OFF,
            self.budget.left(),
            self.plan.model,
        )
        if overhead is None:
            self.not_measured.append(why)
            return terms
        return dataclasses.replace(
            terms, overhead_generation_s=overhead[0], overhead_training_s=overhead[1], overhead_steps=overhead[2]
        )

    def other_engine(self) -> dict[str, Any]:
        """The decode curve of the engine the plan does not use, by a fresh load, last (the plan does not need it)."""
        engine = "continuous" if self.spec.engine == "generate" else "generate"
        other = "continuous batching" if engine == "continuous" else "transformers generate"
        if self.skipped(f"decode ({other})", other_engine_need(engine)):  # before its model is loaded again
            return {}
        self.say(f"decode ({other}), at most {self.budget.left():.0f} s")
        out: dict[str, Any] = {"failed": []}
        spec = self.spec
        model = load_model(
            dataclasses.replace(spec, random_weights=False, model=spec.weights_dir) if spec.weights_dir else spec, out
        )
        measure_other_engine(model, spec, self.budget.left(), out)
        self.not_measured += out["failed"]
        del model
        _free(self.spec.device)
        key = "continuous" if self.spec.engine == "generate" else "decode"
        return {"cb_decode" if key == "continuous" else "decode": tuple(out.get(key, ()))} if out.get(key) else {}


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _backend_rows(backends: list[dict[str, Any]]) -> tuple[tuple[str, bool, float], ...]:
    return tuple((b["backend"], bool(b["checkpointing"]), float(b["tokens_per_s"])) for b in backends)


def spec_json(spec: Any) -> dict[str, Any]:
    """A BenchSpec as JSON for a measurement in its own process (its tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(spec).items()}


def _has_vllm() -> bool:
    return bool(vllm_version_here())


def _sync_phase(spec: Any, topo: Any, say: Say, seconds: float) -> tuple[dict[str, Any] | None, str]:
    """The weight sync trainer → server between two processes here (probe/bench_sync.py); (None, why) where it
    cannot be measured as TRL does it."""
    what = "weight sync trainer → vLLM"
    if spec.device == "cuda" and topo.num_gpus < 2:
        return None, f"{what}: not measured (NCCL needs two GPUs: the trainer and the server are on different ones)"
    say(f"{what} ({'NCCL' if spec.device == 'cuda' else 'gloo'})")
    sync, why = measure_sync(spec.model, spec.dtype, spec.device, seconds)
    return (sync, "") if sync is not None else (None, f"{what}: {why}")


def _terms(
    spec: Any,
    topo: Any,
    result: dict[str, Any],
    sync: dict[str, Any] | None,
    vllm_data: dict[str, Any] | None,
    backends: list[dict[str, Any]],
) -> Any:
    inits = [b["init_s"] for b in backends if b["backend"].startswith("zero")]
    return MeasuredTerms(
        device="cpu" if spec.device == "cpu" else topo.planning_gpu_name,
        decode=tuple(result["decode"]),
        cb_decode=tuple(result["continuous"]),
        vllm_decode=tuple(tuple(p) for p in vllm_data["decode"]) if vllm_data else (),
        prefill_s=result.get("prefill_s") or 0.0,
        prefill_batch=max(1, spec.per_device),
        train_tokens_per_s=result.get("train_tokens_per_s") or 0.0,
        train_tokens_per_s_ckpt=result.get("train_tokens_per_s_ckpt") or 0.0,
        forward_tokens_per_s=result.get("forward_tokens_per_s") or 0.0,
        backend_train=_backend_rows(backends),
        fused_head=True,
        sync_s=sync["seconds"] if sync else None,
        sync_path=sync["path"] if sync else "",
        load_s=result.get("load_s"),
        load_bytes=int(result.get("load_bytes") or 0),
        save_bytes_per_s=result.get("save_bytes_per_s"),
        imports_s=result.get("imports_s"),
        warmup_decode_s_per_step=result.get("warmup_decode_s_per_step"),
        warmup_training_s=result.get("warmup_training_s"),
        deepspeed_init_s=min(inits) if inits else None,
        cuda_init_s=result.get("cuda_init_s"),
        process_group_s=min((b["process_group_s"] for b in backends if "process_group_s" in b), default=None),
        engine_start_s=vllm_data["engine_start_s"] if vllm_data else None,
        peak_memory_bytes=result.get("peak_memory_bytes"),
        peak_memory_bytes_ckpt=result.get("peak_memory_bytes_ckpt"),
        threads=spec.threads,
        activation_peak_bytes=result.get("activation_peak_bytes"),
        activation_peak_bytes_ckpt=result.get("activation_peak_bytes_ckpt"),
        value_bytes=2 if spec.dtype == "bfloat16" else 4,
        step_peak_bytes=result.get("step_peak_bytes"),
        step_peak_bytes_ckpt=result.get("step_peak_bytes_ckpt"),
    )


def _with_peak_prediction(terms: Any, model: Any, spec: Any) -> Any:
    """``terms`` with the memory model's prediction of each measured training-step peak stored beside it."""

    def predicted(measured: int | None, ckpt: bool) -> int | None:
        if not measured:
            return None
        return int(
            step_peak_prediction(
                model,
                terms.value_bytes,
                spec.device != "cpu",
                spec.per_device,
                spec.prompt_len,
                spec.completion_len,
                ckpt,
            )
        )

    return dataclasses.replace(
        terms,
        step_peak_predicted_bytes=predicted(terms.step_peak_bytes, False),
        step_peak_predicted_bytes_ckpt=predicted(terms.step_peak_bytes_ckpt, True),
    )

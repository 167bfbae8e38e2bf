"""``grpo-launch calibrate [RECIPE]``: measure this machine (the first GPU it sees, or the CPU) in minutes and store
what it measured where ``plan`` finds it (probe/calibration.py): model load, decode seconds per step against batch
size at the recipe's completion length, a prompt pass, one optimizer step with and without activation
checkpointing, a forward alone, the peak memory, one micro-batch's activation memory against the memory model's, the
weight sync trainer → server (probe/bench_sync.py); vLLM's start-up and decode in vLLM's Python when the recipe uses
vLLM. Each phase stops at its share of ``--minutes``; what is not measured is said, and stored as such. Without
RECIPE: the shipped recipe of the README's main command on CPU, recipes/qwen1.5b.yaml's model with random weights
on a GPU."""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from grpo_launch.cli.common import add_recipe_args, load, plan_on
from grpo_launch.errors import ConfigError
from grpo_launch.rundir.layout import CALIBRATIONS_ENV
from grpo_launch.spec import RunContext

DEFAULT_RECIPES = {"cpu": "recipes/tiny-cpu.yaml", "gpu": "recipes/qwen1.5b.yaml"}  # in the working directory
DESCRIPTION = f"""\
Measure this machine (the first GPU it sees, or the CPU) for the recipe's model, in minutes: model load; decode
seconds per step at batch 1, the planned micro-batch and twice it, at the recipe's completion length; a prompt
pass; one optimizer step at the planned micro-batch and sequence length, with and without activation
checkpointing; a forward alone; the peak memory; vLLM's start-up and decode (in vLLM's Python) when the recipe uses
vLLM; one micro-batch's activation memory as GRPOTrainer runs it, beside the memory model's; the weight sync, the
model's weights packed and sent from one process to another (NCCL between the first two GPUs, TRL's path within a
node; gloo on CPU); TRL's own time per step from a 4-step run of the recipe (not with --random-weights). Each phase
stops at its share of --minutes. What is not measured (all GPUs of a multi-GPU machine; the sync across nodes) is
said, and stored as such. Without RECIPE: {DEFAULT_RECIPES["cpu"]} on CPU (the README's demo), and
{DEFAULT_RECIPES["gpu"]}'s model with random weights on a GPU. The calibration is stored per device, model shape,
dtype and library versions in $XDG_CACHE_HOME/grpo-launch/calibrations ({CALIBRATIONS_ENV} overrides), and plan uses
a matching one by itself."""
DEFAULT_MINUTES = 5.0
MAX_MINUTES = 60.0


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure this machine's GPU (or CPU) for a recipe's model in minutes; plan then uses it",
        description=DESCRIPTION,
        epilog=epilog,
        formatter_class=formatter,
    )
    add_recipe_args(p, optional=f"{DEFAULT_RECIPES['cpu']} on CPU, {DEFAULT_RECIPES['gpu']} on a GPU")
    p.add_argument("--run-dir", help="also write RUN_DIR/calibration.json (the cache copy is always written)")
    p.add_argument("--gpus", metavar="SPEC",
                   help="refused: calibrate measures the GPUs this machine sees (plan --gpus SPEC then uses a "
                   "calibration stored for that GPU model)")  # fmt: skip
    p.add_argument("--minutes", type=float, default=DEFAULT_MINUTES, metavar="N",
                   help=f"time budget, shared out between the phases (default {DEFAULT_MINUTES:g}, at most "
                   f"{MAX_MINUTES:g})")  # fmt: skip
    p.add_argument("--random-weights", action="store_true",
                   help="the model's config shapes with random weights (transformers from_config; vLLM "
                   "load_format=dummy): no weights needed, nothing downloaded")  # fmt: skip
    p.add_argument("--out", metavar="FILE", help="also write the calibration JSON to FILE")
    p.add_argument("--vllm-python", metavar="PYTHON",
                   help="the Python whose vLLM is measured (default: this one, when it has vLLM)")  # fmt: skip


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.minutes <= MAX_MINUTES:
        raise ConfigError(f"--minutes {args.minutes:g}: the budget must be above 0 and at most {MAX_MINUTES:g}",
                          hint="e.g. --minutes 5")  # fmt: skip
    if args.vllm_python and not (os.access(args.vllm_python, os.X_OK) or shutil.which(args.vllm_python)):
        hint = "Give the Python of the environment vLLM is installed in, e.g. .venv-vllm/bin/python."
        raise ConfigError(f"--vllm-python {args.vllm_python}: no such program", hint=hint)
    if args.gpus is not None:
        raise ConfigError("calibrate measures the GPUs this machine sees; --gpus describes other machines",
                          hint="Run calibrate on a machine with the GPU model to measure (one GPU of the kind is "
                          "enough), without --gpus.")  # fmt: skip


def _with_recipe(args: argparse.Namespace, ctx: RunContext, cpu: bool) -> argparse.Namespace:
    """``args`` with RECIPE given: the shipped default for this device when none is (a first word with "=" that
    names no file is an override). On a GPU the default's model is measured with random weights (its shapes: nothing
    is downloaded, and the weights' values do not change the time)."""
    overrides = list(args.overrides)
    recipe = args.recipe
    if recipe is not None and "=" in recipe and not (Path(ctx.workdir) / recipe).exists():
        overrides.insert(0, recipe)
        recipe = None
    if recipe is not None:
        return argparse.Namespace(**{**vars(args), "overrides": overrides})
    name = DEFAULT_RECIPES["cpu" if cpu else "gpu"]
    if not (Path(ctx.workdir) / name).is_file():
        raise ConfigError(f"calibrate: no RECIPE given, and the default {name} is not in {ctx.workdir}",
                          hint="Give the recipe whose model to measure: grpo-launch calibrate RECIPE, or run it from "
                          "the grpo-launch checkout.")  # fmt: skip
    random = args.random_weights or not cpu
    said = " with random weights (its shapes; nothing is downloaded)" if random and not args.random_weights else ""
    print(f"calibrate: no RECIPE: {name}'s model{said}", file=sys.stderr, flush=True)
    return argparse.Namespace(**{**vars(args), "recipe": name, "overrides": overrides, "random_weights": random})


def _weights(model: str, random_weights: bool) -> None:
    """Refuse a model whose weights are not here (unless --random-weights), before anything is measured."""
    if random_weights:
        return
    path = Path(model)
    if path.is_dir() and not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ConfigError(f"model_name_or_path {model!r} has a config but no weights (*.safetensors, *.bin)",
                          hint="Add --random-weights to measure its shapes with random weights.")  # fmt: skip


def _vllm_phase(python: str | None, spec: Any, seconds: float) -> tuple[dict[str, Any] | None, str]:
    """vLLM's start-up and decode measured in ``python``; (None, why) when it cannot run."""
    import json
    import subprocess

    from grpo_launch.probe import bench_vllm
    from grpo_launch.probe.bench import decode_batches

    if python is None:
        return None, "vLLM start-up and decode: no vLLM in this Python (give --vllm-python)"
    model = os.path.abspath(spec.model) if os.path.exists(spec.model) else spec.model  # vLLM runs in a temp dir
    job = {"model": model, "dtype": spec.dtype, "prompt_len": spec.prompt_len,
           "completion_len": spec.completion_len, "random_weights": spec.random_weights,
           "batches": decode_batches(spec.per_device), "seconds": seconds / 2}  # fmt: skip
    import signal
    import tempfile

    with tempfile.TemporaryDirectory(prefix="grpo-calibrate-vllm-") as tmp:
        # vLLM leaves socket files in TMPDIR; its engine core and workers are children of their own: the whole
        # session is stopped on a timeout
        kv = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "TMPDIR": tmp,
               "VLLM_CACHE_ROOT": f"{tmp}/cache", "VLLM_CPU_KVCACHE_SPACE": kv}  # fmt: skip
        cmd = [python, bench_vllm.__file__, json.dumps(job)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
                                start_new_session=True)  # fmt: skip
        try:
            out, err = proc.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None, f"vLLM start-up and decode: not done within its {seconds:.0f} s (raise --minutes)"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        tail = (err.strip().splitlines() or ["no output"])[-1][:200]
        return None, f"vLLM start-up and decode: vLLM failed here ({tail})"
    return json.loads(lines[-1]), ""


OVERHEAD_STEPS = 4  # the short real run's steps: the first warms up and is left out


def _trainer_overhead(
    args: argparse.Namespace, ctx: RunContext, terms: Any, n: int, work: Any, vllm: bool, seconds: float
) -> tuple[tuple[float, float, int] | None, str]:
    """TRL's own time per step beyond the measured kernels: a few real steps of the recipe (``grpo-launch run``,
    planned as a run here is), their mean generation and training time less :func:`measured_step_time`'s for the
    same workload. (None, why) when it cannot run."""
    import subprocess
    import tempfile

    from grpo_launch.planning.cost.measured_time import measured_step_time
    from grpo_launch.rundir.measured import read_run

    what = "TRL's own time per step (a short real run)"
    if args.random_weights:
        return None, f"{what}: not measured with --random-weights (a real run needs the weights)"
    with tempfile.TemporaryDirectory(prefix="grpo-calibrate-") as tmp:
        cmd = [sys.executable, "-m", "grpo_launch", "run", args.recipe, *args.overrides, f"max_steps={OVERHEAD_STEPS}",
               "save_strategy=no", "report_to=none", "logging_steps=1", "--run-dir", f"{tmp}/run", "--resume",
               "never"]  # fmt: skip
        env = {**ctx.environ, CALIBRATIONS_ENV: f"{tmp}/none", "PYTHONUNBUFFERED": "1"}
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds, env=env, cwd=ctx.workdir)
        except subprocess.TimeoutExpired:
            return None, f"{what}: not done within its {seconds:.0f} s (raise --minutes)"
        if done.returncode:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
            return None, f"{what}: the run failed ({tail})"
        m = read_run(f"{tmp}/run")
    kernels, _ = measured_step_time(terms, n, work, vllm=vllm)
    rounds = work.generations_per_step or 1.0
    gen = max(0.0, (m.generation_s - kernels.trainer_generation_s) / rounds)
    train = max(0.0, m.training_s - kernels.training_s)
    return (gen, train, max(0, m.steps - 1)), ""


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    import dataclasses

    from grpo_launch.planning.estimate import workload
    from grpo_launch.probe.calibration import CalibrationRecord, calibration_key, save_calibration
    from grpo_launch.probe.local import probe_local

    _check(args)
    started = time.monotonic()
    topo = probe_local(ctx.environ)
    args = _with_recipe(args, ctx, topo.is_cpu)
    recipe = load(args)
    if recipe.values.get("use_cpu") is True and topo.is_cpu:
        topo = dataclasses.replace(topo, warnings=())  # a CPU recipe on a machine without GPUs: nothing to warn of
    plan = plan_on(topo, recipe, args, ctx)
    if plan.model is None:
        hint = "Calibrate a local model directory, or one whose config is in the hub cache."
        raise ConfigError(f"model_name_or_path {recipe.get('model_name_or_path')!r}: no config.json here", hint=hint)
    _weights(str(recipe.get("model_name_or_path")), args.random_weights)
    work = workload(recipe, plan.layout)
    terms, not_measured = _phases(args, ctx, plan, recipe, work, started)
    key = calibration_key(topo, plan.model, recipe, plan.vllm_version)
    at = (("per_device_train_batch_size", work.per_device), ("prompt_len", work.prompt_len),
          ("completion_len", work.completion_len), ("processes", plan.train.num_processes))  # fmt: skip
    record = CalibrationRecord(key, terms, tuple(not_measured), tuple((k, float(v)) for k, v in at), args.recipe,
                               datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               round(time.monotonic() - started, 1))  # fmt: skip
    paths = save_calibration(record, ctx.environ, plan.run_dir if args.run_dir else None)
    if args.out:
        import json

        Path(args.out).write_text(json.dumps(record.to_dict(), indent=2) + "\n")
        paths.append(Path(args.out))
    from grpo_launch.cli.calibrate_view import show

    show(record, plan.model, paths)
    return 0


def _phases(
    args: argparse.Namespace, ctx: RunContext, plan: Any, recipe: Any, work: Any, started: float
) -> tuple[Any, list[str]]:
    """Every measurement in turn within ``--minutes``: the benchmarks in this process, the weight sync, vLLM's
    (in its Python), TRL's own time per step; the terms, and what was not measured and why."""
    import dataclasses

    from grpo_launch.enums import VllmMode
    from grpo_launch.probe.bench import PHASES, BenchSpec
    from grpo_launch.probe.calibration import recipe_dtype

    topo, n = plan.topology, plan.train.num_processes
    host = topo.hosts[0] if topo.hosts else None
    cpus = (host.slots or host.cpus if host else None) or os.cpu_count() or 1
    device = "cpu" if topo.is_cpu else "cuda"
    seconds = args.minutes * 60
    uses_vllm = plan.vllm.mode != VllmMode.OFF
    measures_vllm = uses_vllm or bool(args.vllm_python)
    spec = BenchSpec(str(recipe.get("model_name_or_path")), work.prompt_len, work.completion_len, work.per_device,
                     recipe_dtype(recipe), device, max(1, cpus // n) if device == "cpu" else 0, args.random_weights,
                     seconds * (0.2 if measures_vllm else 0.5))  # fmt: skip
    not_measured = []
    if device == "cuda" and topo.num_gpus > 1:  # the short real run below trains on all of them, as planned
        not_measured.append(f"training on all {topo.num_gpus} GPUs: the microbenchmarks use one GPU; all of them, "
                            "under the planned backend, only in the short real run (TRL's own time per step)"
                            + (": not with --random-weights" if args.random_weights else ""))  # fmt: skip
    if device == "cpu":
        not_measured.append("peak memory: this process's resident set (a CPU run's, not the GPU memory model's)")
    result = _measure(spec, PHASES)
    not_measured += result["failed"]
    sync, why = _sync_phase(spec, topo, seconds * 0.1)
    not_measured += [why] if why else []
    vllm_data = None
    if measures_vllm:
        python = args.vllm_python or (sys.executable if _has_vllm() else None)
        python = os.path.abspath(os.path.join(ctx.workdir, python)) if python and os.sep in python else python
        left = max(60.0, (seconds - (time.monotonic() - started)) * 0.7)
        print(f"calibrate: vLLM start-up and decode ({python}, at most {left:.0f} s)", file=sys.stderr, flush=True)
        vllm_data, why = _vllm_phase(python, spec, left)
        not_measured += [why] if why else []
    else:
        not_measured.append("vLLM start-up and decode: vLLM is off in this recipe (the trainers' generate measured; "
                            "--vllm-python PYTHON measures it too)")  # fmt: skip
    terms = _with_peak_prediction(_terms(spec, topo, result, sync, vllm_data), plan.model, spec)
    left = seconds - (time.monotonic() - started)
    if not args.random_weights:
        print(f"calibrate: TRL's own time per step ({OVERHEAD_STEPS} real steps of the recipe)", file=sys.stderr,
              flush=True)  # fmt: skip
    overhead, why = _trainer_overhead(args, ctx, terms, n, work, uses_vllm, max(30.0, left))
    if overhead is None:
        not_measured.append(why)
    else:
        terms = dataclasses.replace(terms, overhead_generation_s=overhead[0], overhead_training_s=overhead[1],
                                    overhead_steps=overhead[2])  # fmt: skip
    return terms, not_measured


def _has_vllm() -> bool:
    from grpo_launch.probe.pythons import vllm_version_here

    return bool(vllm_version_here())


def _sync_phase(spec: Any, topo: Any, seconds: float) -> tuple[dict[str, Any] | None, str]:
    """The weight sync trainer → server between two processes here (probe/bench_sync.py); (None, why) where it
    cannot be measured as TRL does it."""
    from grpo_launch.probe.bench_sync import measure_sync

    what = "weight sync trainer → vLLM"
    if spec.device == "cuda" and topo.num_gpus < 2:
        return None, f"{what}: not measured (NCCL needs two GPUs: the trainer and the server are on different ones)"
    print(f"calibrate: {what} ({'NCCL' if spec.device == 'cuda' else 'gloo'})", file=sys.stderr, flush=True)
    sync, why = measure_sync(spec.model, spec.dtype, spec.device, max(30.0, seconds))
    return (sync, "") if sync is not None else (None, f"{what}: {why}")


def _terms(spec: Any, topo: Any, result: dict[str, Any], sync: dict[str, Any] | None,
           vllm_data: dict[str, Any] | None) -> Any:  # fmt: skip
    from grpo_launch.machines.measured import MeasuredTerms

    return MeasuredTerms(
        device="cpu" if spec.device == "cpu" else topo.planning_gpu_name,
        decode=tuple(result["decode"]),
        vllm_decode=tuple(tuple(p) for p in vllm_data["decode"]) if vllm_data else (),
        prefill_s=result["prefill_s"],
        train_tokens_per_s=result["train_tokens_per_s"],
        train_tokens_per_s_ckpt=result["train_tokens_per_s_ckpt"],
        forward_tokens_per_s=result["forward_tokens_per_s"],
        sync_s=sync["seconds"] if sync else None,
        sync_path=sync["path"] if sync else "",
        load_s=result["load_s"],
        engine_start_s=vllm_data["engine_start_s"] if vllm_data else None,
        peak_memory_bytes=result["peak_memory_bytes"],
        peak_memory_bytes_ckpt=result["peak_memory_bytes_ckpt"],
        threads=spec.threads,
        activation_peak_bytes=result.get("activation_peak_bytes"),
        activation_peak_bytes_ckpt=result.get("activation_peak_bytes_ckpt"),
        value_bytes=2 if spec.dtype == "bfloat16" else 4,
        step_peak_bytes=result.get("step_peak_bytes"),
        step_peak_bytes_ckpt=result.get("step_peak_bytes_ckpt"),
    )


def _with_peak_prediction(terms: Any, model: Any, spec: Any) -> Any:
    """``terms`` with the memory model's prediction of each measured training-step peak stored beside it."""
    import dataclasses

    from grpo_launch.planning.calibration import step_peak_prediction

    def predicted(measured: int | None, ckpt: bool) -> int | None:
        if not measured:
            return None
        return int(step_peak_prediction(model, terms.value_bytes, spec.device != "cpu", spec.per_device,
                                        spec.prompt_len, spec.completion_len, ckpt))  # fmt: skip

    return dataclasses.replace(terms, step_peak_predicted_bytes=predicted(terms.step_peak_bytes, False),
                               step_peak_predicted_bytes_ckpt=predicted(terms.step_peak_bytes_ckpt, True))  # fmt: skip


def _measure(spec: Any, phases: tuple[str, ...]) -> dict[str, Any]:
    """The benchmarks under a progress bar (rich on a terminal; a line per phase elsewhere)."""
    from grpo_launch.probe.bench import run_bench

    if not sys.stderr.isatty():
        return run_bench(spec, lambda phase: print(f"calibrate: {phase}", file=sys.stderr, flush=True))
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("calibrate", total=len(phases))

        def report(phase: str) -> None:
            bar.update(task, description=f"calibrate: {phase}", completed=phases.index(phase))

        out = run_bench(spec, report)
        bar.update(task, completed=len(phases))
    return out

"""``grpo-launch calibrate [RECIPE]``: measure this machine (the first GPU it sees, or the CPU) in minutes and store
what it measured where ``plan`` finds it (probe/calibration_store.py): model load, decode seconds per step against batch
size at the recipe's completion length, a prompt pass, one optimizer step with and without activation
checkpointing, a forward alone, the peak memory, one micro-batch's activation memory against the memory model's, the
weight sync trainer → server (probe/bench_sync.py); vLLM's start-up and decode in vLLM's Python when the recipe uses
vLLM. Each phase stops at its share of ``--minutes``; what is not measured is said, and stored as such. Without
RECIPE: the shipped recipe of the README's main command on CPU, recipes/qwen1.5b.yaml's model with random weights
on a GPU."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from grpo_launch.cli.calibrate_schedule import Schedule
from grpo_launch.cli.calibrate_view import show
from grpo_launch.cli.common import VERB_HELP, add_recipe_args, load, plan_on
from grpo_launch.errors import ConfigError
from grpo_launch.planning.step_work import workload
from grpo_launch.probe.bench_phases import PHASES, run_bench
from grpo_launch.probe.calibration_store import CalibrationRecord, calibration_key, save_calibration
from grpo_launch.probe.local import probe_local
from grpo_launch.rundir.layout import CALIBRATIONS_ENV
from grpo_launch.spec import RunContext

DEFAULT_RECIPES = {"cpu": "recipes/tiny-cpu.yaml", "gpu": "recipes/qwen1.5b.yaml"}  # in the working directory
DESCRIPTION = f"""\
Measure this machine (the first GPU it sees, or the CPU) for the recipe's model, the work its plan runs at its
sizes, within --minutes (a minute means at most 60 s), in the order the plan needs it: the trainers' imports; the
model's load from disk (random weights are written to safetensors first, the write timed with fsync); decode
seconds per step against batch size from 1 up to the trainers' generation batch (or 256), through the plan's engine
(transformers' generate with TRL's generation config, or its continuous batching), the first generation's warm-up;
one training step as GRPOTrainer runs it (TRL's fused LM head, the plan's checkpointing and precision) and its
warm-up; a prompt pass, a forward alone, the activation memory against the memory model's; vLLM's start-up and
decode (in vLLM's Python, CUDA graphs on a GPU) when the plan uses vLLM; the plan's distributed engine (DeepSpeed
ZeRO-2/3, FSDP2) at world size 1; the weight sync of a server plan; TRL's own time per step from a 4-step run of
the recipe (not with --random-weights); last what the plan does not use (the other engines). What does not fit
the budget, or cannot run here, is said, and stored as not measured. Without RECIPE: {DEFAULT_RECIPES["cpu"]} on CPU
(the README's demo), and {DEFAULT_RECIPES["gpu"]}'s model with random weights on a GPU. The calibration is stored
per device, model shape, dtype and library versions in $XDG_CACHE_HOME/grpo-launch/calibrations ({CALIBRATIONS_ENV}
overrides), and plan uses a matching one by itself: each term measured for its case, the table's for the rest."""
DEFAULT_MINUTES = 5.0
MAX_MINUTES = 60.0


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "calibrate",
        help=VERB_HELP["calibrate"],
        description=DESCRIPTION,
        epilog=epilog,
        formatter_class=formatter,
    )
    add_recipe_args(p, optional=f"{DEFAULT_RECIPES['cpu']} on CPU, {DEFAULT_RECIPES['gpu']} on a GPU")
    p.add_argument("--run-dir", help="also write RUN_DIR/calibration.json (the cache copy is always written)")
    p.add_argument(
        "--gpus",
        metavar="SPEC",
        help="refused: calibrate measures the GPUs this machine sees (plan --gpus SPEC then uses a "
        "calibration stored for that GPU model)",
    )
    p.add_argument(
        "--minutes",
        type=float,
        default=DEFAULT_MINUTES,
        metavar="N",
        help=f"time budget, shared out between the phases (default {DEFAULT_MINUTES:g}, at most {MAX_MINUTES:g})",
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="the model's config shapes with random weights (transformers from_config; vLLM "
        "load_format=dummy): no weights needed, nothing downloaded",
    )
    p.add_argument("--out", metavar="FILE", help="also write the calibration JSON to FILE")
    p.add_argument(
        "--vllm-python",
        metavar="PYTHON",
        help="the Python whose vLLM is measured (default: this one, when it has vLLM)",
    )


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.minutes <= MAX_MINUTES:
        raise ConfigError(
            f"--minutes {args.minutes:g}: the budget must be above 0 and at most {MAX_MINUTES:g}",
            hint="e.g. --minutes 5",
        )
    if args.vllm_python and not (os.access(args.vllm_python, os.X_OK) or shutil.which(args.vllm_python)):
        hint = "Give the Python of the environment vLLM is installed in, e.g. .venv-vllm/bin/python."
        raise ConfigError(f"--vllm-python {args.vllm_python}: no such program", hint=hint)
    if args.gpus is not None:
        raise ConfigError(
            "calibrate measures the GPUs this machine sees; --gpus describes other machines",
            hint="Run calibrate on a machine with the GPU model to measure (one GPU of the kind is "
            "enough), without --gpus.",
        )


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
        raise ConfigError(
            f"calibrate: no RECIPE given, and the default {name} is not in {ctx.workdir}",
            hint="Give the recipe whose model to measure: grpo-launch calibrate RECIPE, or run it from "
            "the grpo-launch checkout.",
        )
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
        raise ConfigError(
            f"model_name_or_path {model!r} has a config but no weights (*.safetensors, *.bin)",
            hint="Add --random-weights to measure its shapes with random weights.",
        )


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    _check(args)
    started = _STARTED[0] = time.monotonic()
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
    schedule = Schedule(args, ctx, plan, recipe, work, _say, _measure, started)
    terms = schedule.run()
    not_measured = schedule.not_measured
    key = calibration_key(topo, plan.model, recipe, plan.vllm_version)
    at = (
        ("per_device_train_batch_size", work.per_device),
        ("prompt_len", work.prompt_len),
        ("completion_len", work.completion_len),
        ("processes", plan.train.num_processes),
    )
    record = CalibrationRecord(
        key,
        terms,
        tuple(not_measured),
        tuple((k, float(v)) for k, v in at),
        args.recipe,
        datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        round(time.monotonic() - started, 1),
    )
    paths = save_calibration(record, ctx.environ, plan.run_dir if args.run_dir else None)
    if args.out:
        Path(args.out).write_text(json.dumps(record.to_dict(), indent=2) + "\n")
        paths.append(Path(args.out))
    show(record, plan.model, paths)
    return 0


_STARTED = [time.monotonic()]


def _say(text: str) -> None:
    print(f"calibrate: [{time.monotonic() - _STARTED[0]:4.0f} s] {text}", file=sys.stderr, flush=True)


def _measure(spec: Any) -> tuple[dict[str, Any], Any]:
    """The in-process measurements under a progress bar (rich on a terminal; a line per phase elsewhere)."""
    if not sys.stderr.isatty():
        return run_bench(spec, _say)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("calibrate", total=len(PHASES))

        def report(phase: str) -> None:
            bar.update(task, description=f"calibrate: {phase}", completed=PHASES.index(phase))

        out = run_bench(spec, report)
        bar.update(task, completed=len(PHASES))
    return out

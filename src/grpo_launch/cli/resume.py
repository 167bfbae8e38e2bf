"""``grpo-launch resume RUN_DIR [--force] [--dry-run]``: run again exactly the command that started the run
(RUN_DIR/invocation.json: the recipe, its overrides, every flag, on the backend it ran or was submitted to), from the
working directory it ran in, and say where it continues from.

Refused (exit 2, nothing in the run directory written) when the run directory is missing, is not a run's, holds a
record that does not read or that belongs to another directory or recipe, when the recipe file or overrides would
now change the run's algorithm or model (a diff, key: recorded → now; ``--force`` continues anyway), or when the
checkpoint it would continue from was saved from another model. :func:`check_continuity` is the part ``run`` and
the submitting verbs share: in a run directory that holds a run, it says where the run continues (a dry run too)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpo_launch.analysis.view import RunView
from grpo_launch.backends import job_backend, known, load
from grpo_launch.cli import parse, run_verb
from grpo_launch.cli.common import VERB_HELP, pasteable
from grpo_launch.enums import JobStatus
from grpo_launch.errors import ConfigError, LaunchError
from grpo_launch.probe.model import cached_config
from grpo_launch.render.plan_json import plan_to_dict
from grpo_launch.rundir.checkpoints import max_steps_of
from grpo_launch.rundir.files import in_use, last_holder, lock_holder, run_record
from grpo_launch.rundir.invocation import REDACTED, Invocation, read_invocation
from grpo_launch.rundir.json_fields import RunFileError
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.plan_record import PlanRecord
from grpo_launch.rundir.same_run import (
    Change,
    ResumePoint,
    changes,
    model_mismatches,
    resume_point,
    schedule_change,
)
from grpo_launch.rundir.shown_text import command_line
from grpo_launch.rundir.trusted_files import check_run_dir
from grpo_launch.spec import RunContext, frozen

EXAMPLES = """\
examples:
  grpo-launch resume grpo_runs/tiny-cpu              continue the run as it was started
  grpo-launch resume grpo_runs/tiny-cpu --dry-run    what it would decide, and the commands it would run
  grpo-launch resume grpo_runs/tiny-cpu --force      continue although the recipe now changes the algorithm
"""


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "resume",
        help=VERB_HELP["resume"],
        description="Run again exactly the command that started the run (its recipe, overrides and flags, on the "
        "backend it ran or was submitted to, from its working directory), continuing from its newest complete "
        "checkpoint, or from step 0 when nothing was saved. Refused when the recipe file or the overrides would now "
        "change the run's algorithm or model (it prints what changed), unless --force.",
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    p.add_argument("run_dir", help="the run directory (what `grpo-launch status` names)")
    p.add_argument(
        "--force",
        action="store_true",
        help="resume even when the recipe or its overrides now change the algorithm or the model",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="say where it would continue and print the commands it would run; start nothing",
    )


@frozen
class Resuming:
    """What ``resume`` tells the verb it runs: the record it runs again, and --force."""

    record: Invocation
    force: bool


def command(args: argparse.Namespace, ctx: RunContext) -> Any:
    run_dir = Path(args.run_dir)
    check_run_dir(run_dir)  # before its record is read and run again: another user's directory, a planted link
    record = _record(run_dir)
    _refuse_foreign(record, run_dir)
    _refuse_running(run_dir)
    parsed = _parse(record, run_dir, args.dry_run)
    parsed.resuming, parsed.debug = Resuming(record, args.force), args.debug
    prefix = "# " if args.dry_run else "[grpo-launch] "
    if args.dry_run:  # pasted into a shell: the recorded command's quoted line breaks must not end the comment
        ctx = dataclasses.replace(ctx, emit=pasteable(ctx.emit))
    ctx.emit(f"{prefix}resume {run_dir}: {record.command}")
    with _in(record.workdir):
        return run_verb(parsed, dataclasses.replace(ctx, workdir=record.workdir))


def _record(run_dir: Path) -> Invocation:
    """The run's record of its command; every reason there is none is an error naming the file and the fix."""
    paths = RunPaths(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(
            f"no run directory {str(run_dir)!r}",
            hint="Give the directory a run was started in (grpo-launch status lists the newest run).",
        )
    try:
        record = read_invocation(paths.invocation, to_run=True)  # run again: refused if another could rewrite it
    except RunFileError as exc:
        raise ConfigError(
            exc.message,
            hint=f"Start the run again with its command and {command_line(['--run-dir', run_dir])}: it "
            "continues from the newest complete checkpoint (and records its command anew).",
        ) from None
    if record is None:
        if not paths.plan_json.is_file():
            raise ConfigError(
                f"{run_dir} is not a run directory: it has no invocation.json and no plan.json",
                hint="Give the directory a run was started in (--run-dir of the run, default grpo_runs/NAME).",
            )
        raise ConfigError(
            f"{paths.invocation} is missing: the run was started by a grpo-launch that did not record its command",
            hint=f"Run the command that started it again, with {command_line(['--run-dir', run_dir])}: it continues "
            "from the newest "
            "complete checkpoint.",
        )
    if record.verb != "run" and job_backend(record.verb) is None:
        raise ConfigError(
            f"{paths.invocation}: key 'verb' is {record.verb!r}, not a verb that starts a run",
            hint=f"The file was written by hand or by another program: start the run again with its "
            f"command and {command_line(['--run-dir', run_dir])}.",
        )
    if record.redacted:
        raise ConfigError(
            f"{paths.invocation}: the run's command had secrets on it ({', '.join(record.redacted)}), which are "
            f"never recorded (they read {REDACTED})",
            hint=f"Give them through the environment (HF_TOKEN, WANDB_API_KEY, …; any other variable by its name in "
            f"launch.pass_env) and run the command again with them filled in: {record.command}",
        )
    return record


def _refuse_foreign(record: Invocation, run_dir: Path) -> None:
    """A record that belongs to another run: another run directory (a copy), another recipe than plan.json's."""
    paths = RunPaths(run_dir)
    if os.path.realpath(record.run_dir) != os.path.realpath(run_dir):
        raise ConfigError(
            f"{paths.invocation} records a run in {record.run_dir}, not in {run_dir} (a copied or moved run "
            "directory?)",
            hint=f"Resume it where it runs ({command_line(['grpo-launch', 'resume', record.run_dir])}), or start a "
            f"run here with its command and {command_line(['--run-dir', run_dir])}.",
        )
    plan = _recorded_plan(paths)
    if plan is not None and plan.recipe is not None:
        here, there = (os.path.realpath(os.path.join(record.workdir, r)) for r in (record.recipe, plan.recipe))
        if here != there:
            raise ConfigError(
                f"{paths.invocation} names recipe {record.recipe}, but {paths.plan_json} was planned from "
                f"{plan.recipe}: the two files are not of the same run",
                hint="Restore the run directory's files, or start a new run with --run-dir of its own.",
            )
    if not os.path.isdir(record.workdir):
        raise ConfigError(
            f"{paths.invocation}: key 'workdir' names {record.workdir}, which is not a directory",
            hint="Resume on the machine the run was started on, where its relative paths are.",
        )


def _refuse_running(run_dir: Path) -> None:
    """A launcher holds the run, or its batch job (the one the run's lock names) is queued or running: that job
    continues the run by itself, and a second would race it."""
    if (holder := lock_holder(run_dir)) is not None:
        raise in_use(run_dir, holder)
    job, backend = last_holder(run_dir).get("job_id"), last_holder(run_dir).get("backend")
    if not job or not known(str(backend)):
        return
    state = load(str(backend)).job_state(str(job))
    if state is not None and state.state in (JobStatus.PENDING, JobStatus.RUNNING):
        raise LaunchError(
            f"the run's {backend} job {job} is {state.said}: it continues the run by itself",
            hint=f"Wait for it ({command_line(['grpo-launch', 'status', run_dir])}), or cancel it first (e.g. "
            f"{command_line(['scancel', job])}).",
        )


def _recorded_plan(paths: RunPaths) -> PlanRecord | None:
    try:
        return RunView.load(paths.root).plan
    except RunFileError as exc:
        raise ConfigError(
            exc.message,
            hint=f"Restore it, or move it aside (mv {paths.plan_json} "
            f"{paths.plan_json}.bad): the run then goes on without comparing the recipe with its "
            "record, and writes a new one.",
        ) from None


def _parse(record: Invocation, run_dir: Path, dry_run: bool) -> argparse.Namespace:
    """The recorded command as parsed arguments, in the recorded run directory (absolute: the recipe's own
    launch.run_dir may have changed since)."""
    argv = record.argv
    cut = argv.index("--") if "--" in argv else len(argv)
    head, tail = argv[:cut], argv[cut:]
    head = [a for i, a in enumerate(head) if a != "--run-dir" and (i == 0 or head[i - 1] != "--run-dir")]
    if dry_run:
        head = [a for a in head if a != "--launch"] + ["--dry-run"]  # sky: --launch and --dry-run exclude each other
    try:
        return parse([*head, "--run-dir", os.path.abspath(record.run_dir), *tail])
    except SystemExit:
        raise ConfigError(
            f"{RunPaths(run_dir).invocation}: the recorded command no longer parses: {record.command}",
            hint="This grpo-launch does not take it as it was (a flag renamed or removed): start the run again with "
            f"the command corrected and --run-dir {run_dir}.",
        ) from None


@contextlib.contextmanager
def _in(workdir: str) -> Iterator[None]:
    """In the run's working directory: its recipe, hostfile, dataset and output paths are relative to it, and the
    processes start there."""
    before = os.getcwd()
    os.chdir(workdir)
    try:
        yield
    finally:
        os.chdir(before)


def check_continuity(plan: Any, args: argparse.Namespace, ctx: RunContext, prefix: str) -> None:
    """In a run directory that holds a run (or on ``resume``): say where the run would continue, refuse a
    checkpoint saved from another model, and compare the new plan with the run's plan.json on the values that define
    the algorithm and the model. A change is refused on ``resume`` (unless --force) and a warning on ``run``."""
    resuming: Resuming | None = getattr(args, "resuming", None)
    paths = plan.paths
    if resuming is None and not run_record(paths.root):
        return
    try:
        recorded = _recorded_plan(paths)
    except ConfigError as exc:
        if resuming is not None:
            raise
        recorded = None  # a run starting here rewrites it
        ctx.emit(f"{prefix}warning: {exc.message}")
    if getattr(args, "resume", "auto") == "never":
        ctx.emit(f"{prefix}resume: --resume never: it starts over from step 0 (earlier checkpoints are set aside)")
        return
    point = resume_point(Path(ctx.workdir, plan.output_dir), max_steps_of(plan.trainer_values))
    ctx.emit(f"{prefix}resume: {point.describe()}")
    if recorded is None:
        ctx.emit(f"{prefix}{paths.plan_json} is not there: nothing to compare the recipe with")
    else:
        now = _as_record(plan)
        if diff := changes(recorded, now):
            _say_changes(diff, resuming, paths, plan.recipe.source, prefix, ctx)
        stretched = schedule_change(recorded, now, point.step) if point.step and not point.complete else None
        if stretched is not None:
            ctx.emit(f"{prefix}warning: {stretched}")
    _check_model(plan, point, ctx)  # after the diff: a model changed in the recipe is said as such first


def _say_changes(
    diff: list[Change], resuming: Resuming | None, paths: RunPaths, recipe: str, prefix: str, ctx: RunContext
) -> None:
    """Refuse (``resume`` without --force) or say the values that changed since the run's record."""
    lines = "\n".join(f"  {c}" for c in diff)  # key: recorded → now
    if resuming is not None and not resuming.force:
        raise ConfigError(
            f"resuming {paths.root} would change its algorithm or model ({paths.plan_json} → the recipe "
            f"{recipe} and overrides now):\n{lines}",
            hint="Restore the recipe's values, or continue the run's checkpoints with the new values: "
            f"{command_line(['grpo-launch', 'resume', paths.root, '--force'])}; or start a new run with another "
            "--run-dir.",
        )
    if resuming is not None:
        ctx.emit(f"{prefix}--force: continuing the run with changed values (key: recorded → now):")
    else:
        ctx.emit(
            f"{prefix}warning: the recipe differs from the run recorded in {paths.root}, whose checkpoints this "
            "continues (key: recorded → now; grpo-launch resume refuses it without --force):"
        )
    for c in diff:
        ctx.emit(f"{prefix}  {c}")


def _as_record(plan: Any) -> PlanRecord:
    """The new plan as its plan.json record (JSON and back: lists, not tuples, as the recorded one)."""
    return PlanRecord.from_json(json.loads(json.dumps(plan_to_dict(plan), default=str)), "the new plan")


def _check_model(plan: Any, point: ResumePoint, ctx: RunContext) -> None:
    """Refuse a checkpoint whose config.json describes another model than the one the plan loads."""
    if point.checkpoint is None:
        return
    model = plan.trainer_values.get("model_name_or_path") or ""
    wrong = model_mismatches(point.checkpoint, _model_identity(str(model), plan.model, ctx))
    if wrong:
        said = ", ".join(str(c) for c in wrong)
        raise ConfigError(
            f"{point.checkpoint / 'config.json'} was saved from another model than the plan loads ({model}): "
            f"{said} (key: checkpoint → model)",
            hint="Resume with the model that saved it (model_name_or_path), or set its checkpoints aside and start "
            "over: add --resume never to the run's command (nothing is deleted); or use another output_dir.",
        )


def _model_identity(model: str, shape: Any, ctx: RunContext) -> dict[str, Any]:
    """What identifies the model the plan loads: its config.json (a local directory or the hub cache's copy), else
    what the plan knows of its shape."""
    for config in (Path(ctx.workdir, model, "config.json"), cached_config(model, ctx.environ)):
        if config is not None and config.is_file():
            try:
                data = json.loads(config.read_text())
            except (OSError, ValueError):
                break
            return data if isinstance(data, dict) else {}
    if shape is None:
        return {}
    return {"hidden_size": shape.hidden, "num_hidden_layers": shape.layers, "vocab_size": shape.vocab}

"""Command line: parse, dispatch to one module per verb, and the one error boundary. Every GrpoLaunchError
becomes one message and a code, and every RunResult an exit code; nothing below the CLI exits.

Exit codes: 0 success; 2 the command or the recipe is wrong (bad input, an impossible plan: nothing started); 1 this
machine, its hosts or the run: a check before the start (a port in use, too little disk, an unwritable output_dir,
hosts not ready, a run directory in use) or a run that failed; 128+N after signal N.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence, Set
from typing import Any

from grpo_launch import __version__
from grpo_launch.backends import SUBMIT_VERBS, discover, submit_verbs
from grpo_launch.cli.common import EPILOG, VERB_HELP, examples
from grpo_launch.cli.console import Console, drop, terminal_columns
from grpo_launch.enums import RunState
from grpo_launch.errors import GrpoLaunchError, did_you_mean
from grpo_launch.rundir.shown_text import printable
from grpo_launch.spec import RunContext, RunResult

_AFTER = tuple(VERB_HELP).index("inspect") + 1
# Every verb and its line in `grpo-launch --help`: grpo-launch's own, the backends' submit verbs after inspect.
VERB_LINES = {
    **dict(list(VERB_HELP.items())[:_AFTER]),
    **{verb: entry.help for verb, entry in SUBMIT_VERBS.items()},
    **dict(list(VERB_HELP.items())[_AFTER:]),
}
VERBS = tuple(VERB_LINES)
VALUE_OPTIONS = ("--gpus", "--hostfile", "--run-dir", "--nodes", "--gpus-per-node")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's, sized by :func:`terminal_columns`: argparse would import shutil (and with it bz2 and lzma) to
    build a formatter, which it does for every option added."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, width or terminal_columns() - 2)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help is formatted by :class:`HelpFormatter` unless told otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # `--gpus` must never be read as `--gpus-per-node`
        super().__init__(*args, **kwargs)


def _verb(name: str) -> Any:
    """A verb's module, ``register(sub, formatter, epilog)`` and ``command(args, ctx)``; a backend's submit verb: a
    :class:`~grpo_launch.cli.submit_verb.SubmitCommand`, which has the same two."""
    ours = name in VERB_HELP
    module = importlib.import_module(f"grpo_launch.cli.{name if ours else 'submit_verb'}")
    return module if ours else module.SubmitCommand(name)


def _unknown_word(argv: Sequence[str]) -> str | None:
    """The first word when it is neither a built-in verb nor a file: it may be another package's submit verb."""
    first = next((a for a in argv if not a.startswith("-")), None)
    unknown = first is not None and first not in VERBS and not os.path.exists(first) and "/" not in first
    return first if unknown else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that verb's subparser (the others' modules are then not imported), else every
    verb by its line of :data:`VERB_LINES` (``--help``, ``--version``: no verb's module is imported)."""
    parser = Parser(
        prog="grpo-launch",
        description="Plan and launch GRPO training with TRL: split GPUs between vLLM and trainers, choose a batch "
        "layout TRL accepts, write accelerate/DeepSpeed configs, start and supervise everything.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"grpo-launch {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", metavar="{" + ",".join(VERBS) + "}", parser_class=Parser)
    if only is None:
        for name in VERBS:
            sub.add_parser(name, help=VERB_LINES[name])
    else:
        _verb(only).register(sub, HelpFormatter, examples(only))  # a verb's help shows its own examples
    return parser


def _their_verbs(argv: Sequence[str]) -> set[str]:
    """Other packages' submit verbs, looked for only when the first word is not a built-in verb or a file: only
    then, or for a flag no built-in backend knows (:func:`parse`), are the installed packages' entry points read
    (grpo_launch.backends: that costs about as much as a plan)."""
    if _unknown_word(argv) is None:
        return set()
    return set(submit_verbs(theirs=True)) - set(SUBMIT_VERBS)


def _normalise_argv(argv: Sequence[str], theirs: Set[str] = frozenset()) -> list[str]:
    """``grpo-launch RECIPE …`` means ``grpo-launch run RECIPE …``; ``theirs``: other packages' verbs."""
    # A value that starts with "-" (``--gpus -1xH100``) would be read as an option: keep it with its flag, so the
    # spec's own check explains what is wrong.
    args: list[str] = []
    it = iter(argv)
    for a in it:
        nxt = next(it, None) if a in VALUE_OPTIONS else None
        if nxt is not None and nxt.startswith("-") and nxt not in ("-", "--"):
            args.append(f"{a}={nxt}")
        else:
            args += [a] if nxt is None else [a, nxt]
    for i, a in enumerate(args):
        if a == "--debug":
            continue
        if a in VERBS or a in theirs or a.startswith("-"):
            return args
        return [*args[:i], "run", *args[i:]]
    return args


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line (without the program name) as parsed arguments; ``args.extra``: a submit verb's own
    arguments after ``--``. A usage error exits 2 (argparse's)."""
    theirs = _their_verbs(argv)
    normalised = _normalise_argv(argv, theirs)
    verb = next((a for a in normalised if not a.startswith("-")), None)
    known = verb in VERBS or verb in theirs
    extra: list[str] = []
    if normalised and (normalised[0] in SUBMIT_VERBS or normalised[0] in theirs) and "--" in normalised:
        # a submit verb's own arguments after "--" go to its batch system unchanged
        cut = normalised.index("--")
        normalised, extra = normalised[:cut], normalised[cut + 1 :]
    parser = build_parser(verb if known else None)
    # Overrides may follow options (`RECIPE --nodes 2 max_steps=5`): argparse leaves those unparsed.
    args, unknown = parser.parse_known_args(normalised)
    strays = [u for u in unknown if u.startswith("-") or "=" not in u or not hasattr(args, "overrides")]
    # A flag the built-in backends do not know may be another package's backend's: theirs join the built-in ones
    # (grpo_launch.backends.option_classes).
    if strays and known and discover():
        parser = build_parser(verb)
        args, unknown = parser.parse_known_args(normalised)
        strays = [u for u in unknown if u.startswith("-") or "=" not in u or not hasattr(args, "overrides")]
    if strays:
        parser.error(f"unrecognized arguments: {' '.join(strays)}")
    if unknown:
        args.overrides = [*args.overrides, *unknown]
    args.extra = extra
    return args


def run_verb(args: argparse.Namespace, ctx: Any) -> Any:
    """Run a parsed command's verb (``resume`` runs the recorded one through here, inside this error boundary)."""
    return _verb(args.verb).command(args, ctx)


def _error(text: str) -> None:
    try:
        print(printable(text), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        drop(sys.stderr)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    cut = argv.index("--") if "--" in argv else len(argv)  # a submit verb's own arguments follow "--"
    debug = "--debug" in argv[:cut]  # anywhere before them, not only before the verb
    argv = [a for i, a in enumerate(argv) if i >= cut or a != "--debug"]
    try:  # reading the command line may read other packages' backends (grpo_launch.backends.discover)
        first = _unknown_word(argv)
        if first is not None and first not in _their_verbs(argv):
            near = did_you_mean(first, VERBS)
            if near:
                _error(f"grpo-launch: error: unknown command {first!r}{near}; commands: {', '.join(VERBS)}")
                return 2
        args = parse(argv)
    except GrpoLaunchError as exc:
        if debug:
            raise
        _error(f"grpo-launch: error: {exc.render()}")
        return exc.exit_code
    args.debug = args.debug or debug
    if args.verb is None:
        build_parser().print_help()
        return 2
    console = Console()
    ctx = RunContext.current(environ, console)
    try:
        outcome = run_verb(args, ctx)
    except GrpoLaunchError as exc:
        console.close()
        if args.debug:
            raise
        _error(f"grpo-launch: error: {exc.render(explain=getattr(args, 'explain', False))}")
        return exc.exit_code
    except KeyboardInterrupt:
        console.close()
        _error("grpo-launch: interrupted")
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`plan … | head -2`): what it read was right, so exit 0, quietly, with
        # stdout on /dev/null so that the interpreter's last flush fails no more (Python docs, "Note on SIGPIPE").
        drop(sys.stdout)
        return 0
    console.close()
    if isinstance(outcome, RunResult):
        if outcome.state == RunState.FAILED:
            detail = f"\n{outcome.detail}" if outcome.detail else ""
            _error(f"grpo-launch: error: {outcome.message}{detail}")
        return outcome.exit_code
    return int(outcome)


if __name__ == "__main__":
    raise SystemExit(main())

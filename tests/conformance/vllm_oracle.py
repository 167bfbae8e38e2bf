"""vLLM's and TRL's own code as the judge of a `vllm serve` command line.

Run with the interpreter of an environment that has vLLM and TRL installed::

    .venv-vllm/bin/python tests/conformance/vllm_oracle.py < cases.json > out.json

stdin: a JSON list of cases, each ``{"id": str, "argv": [...], "trl": {...}}``:

- ``argv``: the arguments after ``vllm serve``, starting with the model (optional key).
- ``trl``: keyword arguments of ``trl.scripts.vllm_serve.ScriptArguments`` (optional key).
- ``trl_extra_args``: optional list, forwarded as ``build_command``'s ``extra_args``.
- ``fields``: optional list of further ``AsyncEngineArgs`` attribute names to report in ``parsed``.
- ``parse_trl``: optional; when true, TRL's command is parsed the same way (``trl_parsed``, ``trl_parse_error``).
- ``shard``: optional ``{"tp", "heads", "kv_heads", "intermediate", "vocab"}``: the divisions vLLM's parallel
  layers make while a model is built (``QKVParallelLinear``, ``MergedColumnParallelLinear``,
  ``VocabParallelEmbedding``), done with vLLM's own ``divide`` and ``pad_vocab_size``; ``shard_error`` says which
  one fails.

stdout: a JSON list, one object per case, in input order::

    {"id": str,
     "parsed": {field: value, ...} | null,   # null when argv is absent or parsing failed
     "error": str | null,                    # what `vllm serve` would have said (argparse's stderr, or the exception)
     "trl_argv": [...] | null,               # build_command(...) after "serve"; null when trl is absent or failed
     "trl_error": str | null}

``argv`` goes through what ``vllm serve`` itself does before it builds an engine
(``vllm.entrypoints.cli.main.main``): vLLM's ``FlexibleArgumentParser`` with the ``serve`` subcommand
(``ServeSubcommand.subparser_init`` -> ``make_arg_parser``), ``ServeSubcommand.validate``
(``validate_parsed_serve_args``), the positional model overriding ``--model`` (``ServeSubcommand.cmd``), then
``AsyncEngineArgs.from_cli_args``. No model/vllm config is created, so nothing is fetched; no server or engine is
started.

One deviation, on purpose: the environment is forced offline (``HF_HUB_OFFLINE=1``), and with that set
``EngineArgs.__post_init__`` would replace a hub id by its local snapshot path (and raise when it is not cached).
A real, online ``vllm serve`` keeps the hub id, so ``get_model_path`` is replaced by the identity while the engine
args are built; the hub stays offline throughout.
"""

from __future__ import annotations

import os
import sys

os.environ["VLLM_NO_USAGE_STATS"] = "1"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# vLLM's logger writes to stdout by default; stdout is reserved for the JSON answer.
os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"

# Anything written to fd 1 (Python or native code) goes to stderr until the answer is written.
_ANSWER = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import enum  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402
from unittest import mock  # noqa: E402

warnings.simplefilter("ignore")

import vllm.engine.arg_utils as arg_utils  # noqa: E402
from trl.scripts.vllm_serve import ScriptArguments, build_command  # noqa: E402
from vllm.distributed.utils import divide  # noqa: E402
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.entrypoints.cli.serve import ServeSubcommand  # noqa: E402
from vllm.model_executor.layers.vocab_parallel_embedding import pad_vocab_size  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

ENGINE_FIELDS = (
    "model",
    "tensor_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "trust_remote_code",
    "model_impl",
    "revision",
    "logprobs_mode",
    "max_logprobs",
    "weight_transfer_config",
)
NAMESPACE_FIELDS = ("host", "port", "enable_scale_out")


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return _jsonable(value.model_dump())
    return str(value)


def _serve_parser() -> tuple[FlexibleArgumentParser, ServeSubcommand]:
    """The `vllm` CLI parser as vllm.entrypoints.cli.main builds it, with only the `serve` subcommand."""
    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    return parser, serve


def _offline_identity(model, revision=None):
    return model


def parse_serve(argv: list[str], extra_fields: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    parser, serve = _serve_parser()  # fresh per case: no state carried between cases
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            args = parser.parse_args(["serve", *argv])
            serve.validate(args)
            # ServeSubcommand.cmd: the positional model takes precedence over --model / the default.
            if getattr(args, "model_tag", None) is not None:
                args.model = args.model_tag
            with mock.patch.object(arg_utils, "get_model_path", _offline_identity):
                engine_args = AsyncEngineArgs.from_cli_args(args)
    except SystemExit as exc:
        message = captured.getvalue().strip()
        return None, message or f"SystemExit({exc.code!r})"
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}"
        extra = captured.getvalue().strip()
        return None, f"{message}\n{extra}" if extra else message

    parsed = {name: _jsonable(getattr(engine_args, name, None)) for name in (*ENGINE_FIELDS, *extra_fields)}
    parsed.update({name: _jsonable(getattr(args, name, None)) for name in NAMESPACE_FIELDS})
    return parsed, None


def trl_command(kwargs: dict[str, Any], extra_args: list[str] | None) -> tuple[list[str] | None, str | None]:
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            command = build_command(ScriptArguments(**kwargs), extra_args)
    except BaseException as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return command[command.index("serve") + 1 :], None


def shard_error(tp: int, heads: int, kv_heads: int, intermediate: int, vocab: int) -> str | None:
    """The first division vLLM's layers would assert on, at tensor-parallel size ``tp`` (None: all divide)."""
    steps = [
        ("attention heads", lambda: divide(heads, tp)),
        # QKVParallelLinear: KV heads are split when TP is smaller, replicated (TP / KV heads) when not.
        ("KV heads", lambda: divide(tp, kv_heads) if tp >= kv_heads else divide(kv_heads, tp)),
        ("MLP intermediate size", lambda: divide(intermediate, tp)),
        ("padded vocabulary", lambda: divide(pad_vocab_size(vocab), tp)),
    ]
    for what, step in steps:
        try:
            step()
        except (AssertionError, ValueError, ZeroDivisionError) as exc:
            return f"{what}: {exc}"
    return None


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"id": case.get("id"), "parsed": None, "error": None, "trl_argv": None, "trl_error": None}
    if case.get("shard") is not None:
        result["shard_error"] = shard_error(**case["shard"])
    if case.get("argv") is not None:
        result["parsed"], result["error"] = parse_serve([str(a) for a in case["argv"]], list(case.get("fields") or []))
    if case.get("trl") is not None:
        result["trl_argv"], result["trl_error"] = trl_command(case["trl"], case.get("trl_extra_args"))
        if case.get("parse_trl") and result["trl_argv"] is not None:
            result["trl_parsed"], result["trl_parse_error"] = parse_serve(
                result["trl_argv"], list(case.get("fields") or [])
            )
    return result


def main() -> int:
    cases = json.load(sys.stdin)
    results = [run_case(case) for case in cases]
    json.dump(results, _ANSWER, indent=1)
    _ANSWER.write("\n")
    _ANSWER.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

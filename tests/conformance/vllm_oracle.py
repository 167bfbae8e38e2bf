"""vLLM's and TRL's own code as the judge of a `vllm serve` command line.

Run with the interpreter of an environment that has vLLM and TRL installed::

    .venv-vllm/bin/python tests/conformance/vllm_oracle.py < cases.json > out.json

stdin: a JSON list of cases, each ``{"id": str, "argv": [...], "trl": {...}}``:

- ``argv``: the arguments after ``vllm serve``, starting with the model (optional key).
- ``trl``: keyword arguments of ``trl.scripts.vllm_serve.ScriptArguments`` (optional key).
- ``trl_extra_args``: optional list, forwarded as ``build_command``'s ``extra_args``.
- ``fields``: optional list of further ``AsyncEngineArgs`` attribute names to report in ``parsed``.
- ``parse_trl``: optional; when true, TRL's command is parsed the same way (``trl_parsed``, ``trl_parse_error``).
- ``shard``: optional ``{"tp", "heads", "kv_heads", "intermediate", "vocab"}`` (plus ``expert_intermediate`` and
  ``expert_parallel`` for a mixture of experts): the divisions vLLM's parallel
  layers make while a model is built (``QKVParallelLinear``, ``MergedColumnParallelLinear``,
  ``VocabParallelEmbedding``), done with vLLM's own ``divide`` and ``pad_vocab_size``; ``shard_error`` says which
  one fails.
- ``kv``: optional ``{"config": {...config.json...}, "tp": int}``: the KV-cache bytes one token takes on one GPU
  (``kv_bytes_per_token_per_gpu``, ``kv_error``), see "KV cache" below.
- ``engine``: optional ``{"config": {...config.json...}}``: the ``argv`` is also built into vLLM's engine config
  (``AsyncEngineArgs.create_engine_config(headless=...)``, what `vllm serve` and `vllm serve --headless` do before
  they start anything) with the model replaced by a directory holding that config.json; ``engine_parallel`` reports
  its ``ParallelConfig`` (world size, inferred data-parallel rank and local size, the node's rank within its
  replica, the addresses), ``engine_error`` what vLLM raised. This is where vLLM checks a multi-node command
  (``--nnodes``, ``--node-rank``: vllm/engine/arg_utils.py).
- ``pp_layers``: optional ``{"layers": int, "pp": int}``: the layers of each pipeline stage, by vLLM's own
  ``vllm.distributed.utils.get_pp_indices`` (``stage_layers``).

stdout: a JSON list, one object per case, in input order::

    {"id": str,
     "parsed": {field: value, ...} | null,   # null when argv is absent or parsing failed
     "error": str | null,                    # what `vllm serve` would have said (argparse's stderr, or the exception)
     "trl_argv": [...] | null,               # build_command(...) after "serve"; null when trl is absent or failed
     "trl_error": str | null}

plus ``shard_error`` for a ``shard`` case, ``trl_parsed``/``trl_parse_error`` for ``parse_trl``, and
``kv_bytes_per_token_per_gpu`` (int | null) / ``kv_error`` (str | null) for a ``kv`` case.

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

KV cache (``kv``): the config dict is written as ``config.json`` into a temporary directory (nothing else is
needed: no tokenizer, no weights) and ``vllm.config.ModelConfig(model=dir, dtype="bfloat16",
skip_tokenizer_init=True)`` is built from it (once per distinct config), with ``ParallelConfig(tensor_parallel_size=
tp)`` (pipeline parallel size 1). The per-token, per-layer size is then what vLLM itself computes for "one token of
one attention layer" (``attn_page_size_1_token`` in ``vllm/platforms/interface.py``, the KV/Mamba page unification),
with ``kv_cache_dtype="auto"``:

- dtype: ``vllm.utils.torch_utils.kv_cache_dtype_str_to_dtype("auto", model_config)`` (the model dtype, bf16);
- ``model_config.use_mla`` false: ``vllm.v1.kv_cache_interface.FullAttentionSpec(block_size=1,
  num_kv_heads=model_config.get_num_kv_heads(parallel_config), head_size=model_config.get_head_size(), dtype=...,
  kv_quant_mode=get_kv_quant_mode("auto")).page_size_bytes`` -- K and V, ``max(1, kv_heads // tp)`` heads,
  ``head_dim`` from the config when it has one;
- ``model_config.use_mla`` true (DeepSeek-V2/V3 style, ``kv_lora_rank``): ``MLAAttentionSpec(...)`` with the same
  arguments plus ``cache_dtype_str="auto"``: one latent of ``kv_lora_rank + qk_rope_head_dim`` per token and layer,
  ``get_num_kv_heads`` = 1 (the latent is replicated on every TP rank, not split). MTP layers
  (``num_nextn_predict_layers``) are not counted: they exist only with speculative decoding;
- times ``model_config.get_num_layers_by_block_type(parallel_config, "attention")`` (pure transformers: all
  layers; hybrid/no-op models: vLLM's own count of attention layers). A checkpoint whose layers differ
  (``model_arch_config.per_layer_overrides``) is summed layer by layer with ``get_num_kv_heads(parallel_config,
  model_arch_config[i])`` and that layer's ``head_size``, over ``get_layers_start_end_indices``.

Not included: the attention backend's ``customize_spec`` (it only repacks quantized KV caches -- per-token-head
scales, NVFP4 -- and returns the spec unchanged for "auto"); the padding of attention pages to the Mamba page size
that hybrid models get; sliding-window layers are counted like full-attention ones (same bytes per token, though
vLLM's hybrid allocator bounds what they hold). A config vLLM cannot build a ModelConfig for gives ``kv_error``
(vLLM's exception; an unknown ``model_type`` costs vLLM's own 2 s retry in ``get_config``).

One substitution, for run time: on a cache miss vLLM's model registry inspects the model class
(``_LazyRegisteredModel.inspect_model_cls``) in a fresh Python subprocess (``registry._run_in_subprocess``, there
only to avoid initialising CUDA in the parent), ~12 s per architecture on a 2-core box, since the child imports
vLLM afresh. Here the same ``_ModelInfo.from_model_cls(load_model_cls())`` runs in this process (no CUDA on the
machine this runs on); the result is identical (checked: same modelinfos JSON) and is still written to vLLM's
modelinfos cache as vLLM does.
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

import atexit  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import enum  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
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

# vllm.config.ModelConfig & co. are imported on the first ``kv`` case (kv_bytes_per_token).

ENGINE_FIELDS = (
    "model",
    "tensor_parallel_size",
    "pipeline_parallel_size",
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
NAMESPACE_FIELDS = ("host", "port", "enable_scale_out", "headless")


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


PARALLEL_FIELDS = (
    "world_size",
    "pipeline_parallel_size",
    "tensor_parallel_size",
    "data_parallel_size",
    "data_parallel_size_local",
    "data_parallel_rank",
    "nnodes",
    "node_rank",
    "node_rank_within_dp",
    "nnodes_within_dp",
    "master_addr",
    "master_port",
    "data_parallel_master_ip",
    "data_parallel_rpc_port",
)


def engine_parallel(argv: list[str], config: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """vLLM's ParallelConfig for ``argv`` (the model replaced by a directory with ``config``), as `vllm serve`
    builds it before starting anything (headless when the command says so)."""
    import vllm.model_executor.models.registry as registry

    model_config = _kv_model_config(config)  # the directory, once per config
    if isinstance(model_config, str):
        return None, model_config
    parser, serve = _serve_parser()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            args = parser.parse_args(["serve", *argv])
            serve.validate(args)
            args.model = model_config.model
            args.model_tag = None
            args.skip_tokenizer_init = True  # no tokenizer in the directory: the engine config only
            engine_args = AsyncEngineArgs.from_cli_args(args)
            with mock.patch.object(registry, "_run_in_subprocess", _in_process):
                vllm_config = engine_args.create_engine_config(headless=bool(args.headless))
    except SystemExit as exc:
        return None, captured.getvalue().strip() or f"SystemExit({exc.code!r})"
    except BaseException as exc:
        return None, f"{type(exc).__name__}: {exc}"
    p = vllm_config.parallel_config
    return {name: _jsonable(getattr(p, name, None)) for name in PARALLEL_FIELDS}, None


def stage_layers(layers: int, pp: int) -> list[int]:
    from vllm.distributed.utils import get_pp_indices

    return [end - start for start, end in (get_pp_indices(layers, rank, pp) for rank in range(pp))]


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

    # Every field of the engine arguments (not only ENGINE_FIELDS, which other checks read by name), so that two
    # commands compared here differ nowhere unseen: dtype, kv_cache_dtype, prefix caching, enforce_eager, executor…
    every = [f.name for f in dataclasses.fields(engine_args)]
    parsed = {name: _jsonable(getattr(engine_args, name, None)) for name in (*ENGINE_FIELDS, *every, *extra_fields)}
    parsed.update({name: _jsonable(getattr(args, name, None)) for name in NAMESPACE_FIELDS})
    return parsed, None


def trl_command(kwargs: dict[str, Any], extra_args: list[str] | None) -> tuple[list[str] | None, str | None]:
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            command = build_command(ScriptArguments(**kwargs), extra_args)
    except BaseException as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return command[command.index("serve") + 1 :], None


def shard_error(
    tp: int,
    heads: int,
    kv_heads: int,
    intermediate: int | None,
    vocab: int,
    expert_intermediate: int | None = None,
    expert_parallel: bool = False,
) -> str | None:
    """The first division vLLM's layers would assert on, at tensor-parallel size ``tp`` (None: all divide). A model
    with only MoE layers has no dense MLP (``intermediate`` None); without expert parallelism FusedMoE splits each
    expert's intermediate size over TP, with it each GPU holds whole experts."""
    steps = [
        ("attention heads", lambda: divide(heads, tp)),
        # QKVParallelLinear: KV heads are split when TP is smaller, replicated (TP / KV heads) when not.
        ("KV heads", lambda: divide(tp, kv_heads) if tp >= kv_heads else divide(kv_heads, tp)),
        ("padded vocabulary", lambda: divide(pad_vocab_size(vocab), tp)),
    ]
    if intermediate:
        steps.append(("MLP intermediate size", lambda: divide(intermediate, tp)))
    if expert_intermediate and not expert_parallel:
        steps.append(("expert intermediate size", lambda: divide(expert_intermediate, tp)))
    for what, step in steps:
        try:
            step()
        except (AssertionError, ValueError, ZeroDivisionError) as exc:
            return f"{what}: {exc}"
    return None


_KV_ROOT: str | None = None
_KV_MODEL_CONFIGS: dict[str, Any] = {}  # canonical config JSON -> ModelConfig, or the error string


def _in_process(fn):
    """Stands in for vllm.model_executor.models.registry._run_in_subprocess (see the module docstring)."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what the subprocess (registry._run) does before calling fn
    return fn()


def _kv_model_config(config: dict[str, Any]) -> Any:
    """vLLM's ModelConfig for a config.json dict, built once per distinct dict; an error string if vLLM refuses."""
    global _KV_ROOT
    key = json.dumps(config, sort_keys=True)
    if key in _KV_MODEL_CONFIGS:
        return _KV_MODEL_CONFIGS[key]
    import vllm.model_executor.models.registry as registry
    from vllm.config import ModelConfig

    if _KV_ROOT is None:
        _KV_ROOT = tempfile.mkdtemp(prefix="vllm-oracle-kv-")
        atexit.register(shutil.rmtree, _KV_ROOT, True)
    # Kept until exit: vLLM may re-read config.json from the model path later (e.g. _get_qk_rope_head_dim).
    model_dir = tempfile.mkdtemp(dir=_KV_ROOT)
    with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    try:  # (stdout already goes to stderr, see the top of this file)
        with mock.patch.object(registry, "_run_in_subprocess", _in_process):
            value: Any = ModelConfig(model=model_dir, dtype="bfloat16", skip_tokenizer_init=True)
    except Exception as exc:  # the oracle reports whatever vLLM raises
        value = f"{type(exc).__name__}: {exc}"
    _KV_MODEL_CONFIGS[key] = value
    return value


def kv_bytes_per_token(config: dict[str, Any], tp: int) -> tuple[int | None, str | None]:
    """KV-cache bytes one token occupies on one GPU at TP ``tp``, over all attention layers (see docstring)."""
    model_config = _kv_model_config(config)
    if isinstance(model_config, str):
        return None, model_config
    try:
        from vllm.config import ParallelConfig
        from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, get_kv_quant_mode

        cache_dtype = "auto"
        parallel_config = ParallelConfig(tensor_parallel_size=tp)
        dtype = kv_cache_dtype_str_to_dtype(cache_dtype, model_config)
        kv_quant_mode = get_kv_quant_mode(cache_dtype)

        def page_1_token(num_kv_heads: int, head_size: int) -> int:
            # vllm/platforms/interface.py, attn_page_size_1_token
            if model_config.use_mla:
                spec = MLAAttentionSpec(
                    block_size=1,
                    num_kv_heads=num_kv_heads,
                    head_size=head_size,
                    dtype=dtype,
                    cache_dtype_str=cache_dtype,
                    kv_quant_mode=kv_quant_mode,
                )
            else:
                spec = FullAttentionSpec(
                    block_size=1,
                    num_kv_heads=num_kv_heads,
                    head_size=head_size,
                    dtype=dtype,
                    kv_quant_mode=kv_quant_mode,
                )
            return spec.page_size_bytes

        arch = model_config.model_arch_config
        if arch.per_layer_overrides is None:
            per_layer = page_1_token(model_config.get_num_kv_heads(parallel_config), model_config.get_head_size())
            return per_layer * model_config.get_num_layers_by_block_type(parallel_config, "attention"), None
        if model_config.is_hybrid or model_config.has_noops or model_config.is_attention_free:
            return None, "per-layer (heterogeneous) config of a hybrid/no-op model: not modelled by this oracle"
        start, end = model_config.get_layers_start_end_indices(parallel_config)
        total = sum(
            page_1_token(model_config.get_num_kv_heads(parallel_config, arch[i]), arch[i].head_size)
            for i in range(start, end)
        )
        return total, None
    except Exception as exc:  # the oracle reports whatever vLLM raises
        return None, f"{type(exc).__name__}: {exc}"


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"id": case.get("id"), "parsed": None, "error": None, "trl_argv": None, "trl_error": None}
    if case.get("shard") is not None:
        result["shard_error"] = shard_error(**case["shard"])
    if case.get("kv") is not None:
        result["kv_bytes_per_token_per_gpu"], result["kv_error"] = kv_bytes_per_token(
            case["kv"]["config"], int(case["kv"]["tp"])
        )
    if case.get("argv") is not None:
        result["parsed"], result["error"] = parse_serve([str(a) for a in case["argv"]], list(case.get("fields") or []))
        if case.get("engine") is not None:
            result["engine_parallel"], result["engine_error"] = engine_parallel(
                [str(a) for a in case["argv"]], case["engine"]["config"]
            )
    if case.get("pp_layers") is not None:
        result["stage_layers"] = stage_layers(int(case["pp_layers"]["layers"]), int(case["pp_layers"]["pp"]))
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

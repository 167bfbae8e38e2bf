"""The consuming libraries as judges of grpo-launch's rendered files.

Each function pushes a rendered file through the code of the library that reads it at run time (accelerate 1.15,
transformers 5.x, TRL 1.16, DeepSpeed 0.19) and returns what that library made of it. Nothing here re-implements
their logic; the only substitutes are the few probes of the *local* machine (a free port, bf16 support, the
process group's size) that would otherwise make a CPU-only CI box answer for the GPU cluster a plan is for, and the
launcher functions that would start processes. Each substitute is named in the docstring of the function that makes
it, with the library line that forced it. No process is ever started.

    accelerate_launch_env(trainer.argv, trainer.env)    -> what `accelerate launch` would hand torchrun
    deepspeed_filled(ds_json, grpo_kwargs, world_size)  -> the DeepSpeed config after transformers' "auto" fill
    deepspeed_accepts(filled, world_size)               -> deepspeed.runtime.config.DeepSpeedConfig (or it raises)
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
import types
import warnings
from collections.abc import Iterator, Mapping
from typing import Any
from unittest import mock

__all__ = ["accelerate_launch_env", "deepspeed_accepts", "deepspeed_filled"]

_OUT = tempfile.mkdtemp(prefix="grpo-conformance-")

# The launchers `accelerate.commands.launch.launch_command` dispatches to. Each one's first statement is the pure
# preparation (prepare_* in accelerate/utils/launch.py); everything after it starts processes.
_LAUNCHERS = (
    "multi_gpu_launcher",
    "deepspeed_launcher",
    "simple_launcher",
    "tpu_launcher",
    "tpu_pod_launcher",
    "sagemaker_launcher",
)


def accelerate_launch_env(argv: list[str] | tuple[str, ...], env: Mapping[str, str]) -> dict[str, Any]:
    """What ``accelerate launch`` makes of a trainer command grpo-launch renders, without starting anything.

    ``argv`` is ``[python, "-m", "accelerate.commands.launch", *launch_args]``; ``env`` is the environment the
    launcher process gets on top of this one (the ProcessSpec's env, e.g. ``ACCELERATE_USE_CPU``), applied with
    ``mock.patch.dict(os.environ, env)`` for the duration of the call.

    Steps, all accelerate's own code:

    1. ``launch_command_parser().parse_args(argv[3:])``.
    2. ``launch_command(args)`` itself, so that accelerate's own dispatch picks the launcher (and, for DeepSpeed,
       computes ``args.deepspeed_fields_from_accelerate_config`` as it does) -- with the six launcher functions it
       can dispatch to (``multi_gpu_launcher``, ``deepspeed_launcher``, ``simple_launcher``, ``tpu_*``,
       ``sagemaker_launcher``) replaced by recorders. ``launch_command`` runs ``_validate_launch_command`` (which
       merges the config file into ``args``) before dispatching.
    3. The preparation the chosen launcher starts with: ``prepare_multi_gpu_env(args)`` (MULTI_GPU, FSDP),
       ``prepare_deepspeed_cmd_env(args)`` (DEEPSPEED) or ``prepare_simple_launcher_cmd_env(args)`` (NO,
       MULTI_CPU, ``--cpu``). For the torchrun launchers, the launcher's next step too: accelerate's
       ``_filter_args(args, torch.distributed.run.get_args_parser(), [...])`` (the namespace handed to
       ``torch.distributed.run.run``) and torch's ``config_from_args`` on it (the elastic ``LaunchConfig``).

    Substituted, and why:

    * The launcher functions (step 2): after their prepare_* call they start processes -- ``torchrun``'s elastic
      agent, ``subprocess.Popen`` -- and ``multi_gpu_launcher``/``deepspeed_launcher`` first call
      ``check_cuda_p2p_ib_support()``, which runs ``nvidia-smi``; the multi-node non-"standard" DeepSpeed branch also
      appends to ``.deepspeed_env`` in the working directory (accelerate/commands/launch.py, deepspeed_launcher).
    * ``accelerate.utils.launch.is_port_in_use`` -> False. prepare_multi_gpu_env / prepare_deepspeed_cmd_env probe
      the *local* port: on one machine a busy port flips ``args.standalone`` (torchrun then picks a random port), on
      machine_rank 0 of several it raises ConnectionError. Whether port 29500 is free on the CI box says nothing
      about the rendered files.
    * Not substituted: ``torch.cuda``. With a ``--config_file`` (grpo-launch always passes one),
      ``_validate_launch_command`` takes num_processes/num_machines from the command line and the config file and
      never looks at the local GPU count; only its no-config branch does (``args.num_processes =
      torch.cuda.device_count()`` and the "More than one GPU was found" multi_gpu switch). ``is_bf16_available`` is
      consulted only for a ``--mixed_precision`` given on the command line, which grpo-launch does not pass. So a
      plan for 8 H100s resolves to 8 processes on this CPU box as it would on the cluster.
    * torch's ``run()`` prelude (``args.standalone`` -> c10d on localhost:0; static rendezvous without endpoint or
      master_port -> c10d) is not executed; it cannot fire: standalone stays False (port probe above) and
      accelerate always sets ``master_port`` (one machine) or ``master_addr``+``master_port`` / ``rdzv_endpoint``
      (several).

    Returns a dict:

    * ``distributed_type``: the config file's, as accelerate loaded it (``DistributedType`` value, e.g.
      ``"MULTI_GPU"``, ``"DEEPSPEED"``, ``"FSDP"``, ``"NO"``, ``"MULTI_CPU"``).
    * ``launcher``: the function launch_command dispatched to (``"multi_gpu_launcher"``, ``"deepspeed_launcher"``,
      ``"simple_launcher"``, ...).
    * ``num_processes``, ``num_machines``, ``machine_rank``, ``main_process_ip``, ``main_process_port``,
      ``mixed_precision``, ``use_cpu`` (``args.cpu or args.use_cpu``: the launcher-level flag; the child's own
      decision also reads ``env["ACCELERATE_USE_CPU"]``), ``use_deepspeed``, ``use_fsdp``, ``multi_gpu``,
      ``gpu_ids``, ``rdzv_backend``, ``same_network``, ``deepspeed_multinode_launcher``, ``zero_stage``,
      ``deepspeed_config_file``: the merged launch arguments after validation and preparation.
    * ``torchrun``: for the torchrun launchers, the attributes prepare_* set for torchrun (``nproc_per_node``,
      ``nnodes``, ``node_rank``, ``master_addr``, ``master_port``, ``rdzv_endpoint``, ``rdzv_backend``,
      ``standalone``; only those present) plus ``launch_config``: torch's LaunchConfig fields ``min_nodes``,
      ``max_nodes``, ``nproc_per_node``, ``rdzv_backend``, ``rdzv_endpoint``, ``rdzv_configs`` (``{"rank":
      node_rank}`` for static), and ``entrypoint``/``entry_args`` (the per-rank command). None for the simple launcher.
    * ``cmd``: the command list prepare_* returned (the simple launcher's command; DeepSpeed's ``deepspeed ...``
      command for a non-"standard" multi-node launcher), else None.
    * ``env``: the full environment prepare_* produced (``os.environ.copy()`` plus its variables).
    * ``launch_env``: only the entries of ``env`` that differ from this process's environment outside the call:
      ``env`` given here plus what accelerate added (ACCELERATE_MIXED_PRECISION, ACCELERATE_USE_DEEPSPEED,
      ACCELERATE_DEEPSPEED_CONFIG_FILE, ACCELERATE_CONFIG_DS_FIELDS, FSDP_*, MASTER_ADDR/PORT, OMP_NUM_THREADS ...).
    """
    import accelerate.commands.launch as acc_launch
    import accelerate.utils.launch as acc_launch_utils
    from accelerate.commands.config.config_args import load_config_from_file

    argv = [str(a) for a in argv]
    if argv[1:3] == ["-m", "grpo_launch.node.loopback_store"]:  # one machine: the same launch, its stores on 127.0.0.1
        argv = [argv[0], *argv[4:]]
    if argv[1:3] != ["-m", "accelerate.commands.launch"]:
        raise ValueError(f"not an `accelerate launch` command: {argv[:3]}")
    ambient = dict(os.environ)
    called: list[tuple[str, Any]] = []

    def recorder(name: str):
        def record(*a: Any) -> None:
            called.append((name, a))

        return record

    parser = acc_launch.launch_command_parser()
    args = parser.parse_args(argv[3:])
    with (
        mock.patch.dict(os.environ, dict(env)),
        mock.patch.object(acc_launch_utils, "is_port_in_use", return_value=False),
        warnings.catch_warnings(),
        mock.patch.multiple(acc_launch, **{n: recorder(n) for n in _LAUNCHERS}),
    ):
        warnings.simplefilter("ignore")
        acc_launch.launch_command(args)
        if len(called) != 1:
            raise AssertionError(f"launch_command dispatched to {called!r}")
        launcher, call_args = called[0]
        # launch_command validated `args` in place and hands that same namespace to the launcher (last argument).
        assert call_args[-1] is args
        cmd: list[str] | None = None
        torchrun: dict[str, Any] | None = None
        if launcher == "multi_gpu_launcher":
            current_env = acc_launch.prepare_multi_gpu_env(args)
            torchrun = _torchrun(args, current_env)
        elif launcher == "deepspeed_launcher":
            cmd, current_env = acc_launch.prepare_deepspeed_cmd_env(args)
            # deepspeed_launcher: only the "standard" multi-node launcher and single-machine runs go to torchrun.
            if cmd is None:
                torchrun = _torchrun(args, current_env)
        elif launcher == "simple_launcher":
            cmd, current_env = acc_launch.prepare_simple_launcher_cmd_env(args)
        else:
            raise NotImplementedError(f"accelerate chose {launcher}: not a launcher grpo-launch plans for")

    config = load_config_from_file(args.config_file)

    def arg(name: str) -> Any:
        return getattr(args, name, None)

    return {
        "distributed_type": str(getattr(config.distributed_type, "value", config.distributed_type)),
        "launcher": launcher,
        "num_processes": arg("num_processes"),
        "num_machines": arg("num_machines"),
        "machine_rank": arg("machine_rank"),
        "main_process_ip": arg("main_process_ip"),
        "main_process_port": arg("main_process_port"),
        "mixed_precision": arg("mixed_precision"),
        "use_cpu": bool(arg("cpu") or arg("use_cpu")),
        "use_deepspeed": bool(arg("use_deepspeed")),
        "use_fsdp": bool(arg("use_fsdp")),
        "multi_gpu": bool(arg("multi_gpu")),
        "gpu_ids": arg("gpu_ids"),
        "rdzv_backend": arg("rdzv_backend"),
        "same_network": arg("same_network"),
        "deepspeed_multinode_launcher": arg("deepspeed_multinode_launcher"),
        "zero_stage": arg("zero_stage"),
        "deepspeed_config_file": arg("deepspeed_config_file"),
        "torchrun": torchrun,
        "cmd": cmd,
        "env": current_env,
        "launch_env": {k: v for k, v in current_env.items() if ambient.get(k) != v},
    }


def _torchrun(args: Any, current_env: dict[str, str]) -> dict[str, Any]:
    """The torchrun side of multi_gpu_launcher / deepspeed_launcher: the namespace they pass to
    ``torch.distributed.run.run`` (built with accelerate's own ``_filter_args``, exactly as those launchers do) and
    torch's ``config_from_args`` of it, evaluated in the environment the launcher applies (``patch_environment``)."""
    import torch.distributed.run as distrib_run
    from accelerate.utils.launch import _filter_args

    ns = _filter_args(
        args,
        distrib_run.get_args_parser(),
        ["--training_script", args.training_script, "--training_script_args", args.training_script_args],
    )
    out: dict[str, Any] = {
        k: getattr(ns, k)
        for k in (
            "nproc_per_node",
            "nnodes",
            "node_rank",
            "master_addr",
            "master_port",
            "rdzv_endpoint",
            "rdzv_backend",
            "standalone",
        )
        if hasattr(ns, k)
    }
    # config_from_args logs a warning and sets OMP_NUM_THREADS=1 when the environment has none (the DeepSpeed
    # preparation sets none); both stay inside this call.
    with mock.patch.dict(os.environ, current_env), mock.patch.object(distrib_run.logger, "disabled", True):
        config, entrypoint, entry_args = distrib_run.config_from_args(ns)
    out["launch_config"] = {
        "min_nodes": config.min_nodes,
        "max_nodes": config.max_nodes,
        "nproc_per_node": config.nproc_per_node,
        "rdzv_backend": config.rdzv_backend,
        "rdzv_endpoint": config.rdzv_endpoint,
        "rdzv_configs": dict(config.rdzv_configs),
        "entrypoint": entrypoint,
        "entry_args": list(entry_args),
    }
    return out


@contextlib.contextmanager
def _as_world(world_size: int) -> Iterator[None]:
    """While active, TRL's GRPOConfig (and so TrainingArguments) behaves as on ``world_size`` bf16-capable GPUs.

    Substituted, and why:

    * ``GRPOConfig.world_size`` -> ``world_size`` (PropertyMock): TrainingArguments.world_size asks the live
      ``distributed_state`` (1 here). GRPOConfig.__post_init__ sizes the generation batch with it, and
      HfTrainerDeepSpeedConfig.trainer_config_process reads it again later (``train_batch_size = args.world_size *
      per_device_train_batch_size * gradient_accumulation_steps``), so the patch must cover that call too, not only
      the construction.
    * ``transformers.training_args.is_torch_bf16_gpu_available`` -> True: TrainingArguments.__post_init__ raises
      "Your setup doesn't support bf16/gpu" for ``bf16=True`` without ``use_cpu`` when the *local* GPU lacks bf16
      (training_args.py: ``if not self.use_cpu and not is_torch_bf16_gpu_available() ...``), and TRL defaults bf16
      to True (trl/trainer/base_config.py: ``self.bf16 = not (self.fp16) if self.bf16 is None``). The plans judged
      here are for bf16-capable GPUs, and keeping ``bf16`` and ``use_cpu`` exactly as the recipe says is the point:
      ``bf16.enabled`` is filled from them. TrainingArguments consults the function nowhere else.
    """
    from trl import GRPOConfig

    with (
        warnings.catch_warnings(),
        mock.patch.object(GRPOConfig, "world_size", new_callable=mock.PropertyMock, return_value=world_size),
        mock.patch("transformers.training_args.is_torch_bf16_gpu_available", return_value=True),
    ):
        warnings.simplefilter("ignore")
        yield


# GRPOConfig keys left out when the oracle builds one, and why:
# * ddp_backend: it only picks PartialState's torch.distributed backend. GRPOConfig.__post_init__ reads
#   ``self.device`` (pad_to_multiple_of="auto"), which builds ``PartialState(backend=ddp_backend)``; outside a
#   launched process (no LOCAL_RANK) accelerate then still asks the never-initialised default group for its size
#   (accelerate/state.py, PartialState.__init__: ``self.num_processes = torch.distributed.get_world_size()``) and
#   raises "Default process group has not been initialized". grpo-launch sets ddp_backend="gloo" for DeepSpeed on
#   CPU. Nothing of the DeepSpeed fill reads it.
# * deepspeed: the config judged is the ``ds_config`` argument.
_NOT_PASSED = ("ddp_backend", "deepspeed")


def _grpo_config(grpo_kwargs: Mapping[str, Any]):
    """TRL's GRPOConfig(**grpo_kwargs) less ``_NOT_PASSED``; call inside :func:`_as_world`. ``output_dir`` defaults
    to a scratch directory, ``report_to`` is "none" (no logging integration is imported)."""
    from trl import GRPOConfig

    kwargs = {k: v for k, v in grpo_kwargs.items() if k not in _NOT_PASSED}
    kwargs.setdefault("output_dir", _OUT)
    kwargs["report_to"] = "none"
    return GRPOConfig(**kwargs)


def deepspeed_filled(
    ds_config: Mapping[str, Any],
    grpo_kwargs: Mapping[str, Any],
    world_size: int,
    hidden_size: int = 1536,
    *,
    num_training_steps: int = 1000,
    launch_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The DeepSpeed config after transformers has filled its ``"auto"`` values, as at trainer setup.

    ``grpo_kwargs`` are GRPOConfig keyword arguments (the plan's trainer values filtered to
    ``trl_schema.GRPO_CONFIG``); ``world_size`` is the number of training processes; ``hidden_size`` stands in for
    the model's ``config.hidden_size`` (the bucket sizes); ``num_training_steps`` only matters for a ``scheduler``
    block (grpo-launch renders none). ``deepspeed`` and ``ddp_backend`` in ``grpo_kwargs`` are not passed on (see
    ``_NOT_PASSED``).

    Two paths, both the libraries' own:

    * ``launch_env=None`` (transformers' ``TrainingArguments(deepspeed=...)`` route): build GRPOConfig (see
      ``_as_world`` for the two substitutes, active for the whole fill), then
      ``HfTrainerDeepSpeedConfig(ds_config).trainer_config_process(args)`` (batch sizes, gradient clipping,
      optimizer/scheduler params, fp16/bf16 from the args) and ``trainer_config_finalize(args, model,
      num_training_steps)`` (hidden-size based ``reduce_bucket_size`` / ``stage3_prefetch_bucket_size`` /
      ``stage3_param_persistence_threshold``; raises on any non-"auto" value that contradicts the args). ``model``
      is a stand-in exposing ``config.hidden_size`` -- all finalize reads of it.
    * ``launch_env`` = the ``env`` from :func:`accelerate_launch_env` (the route grpo-launch's trainers really take:
      ``accelerate launch`` with a DeepSpeed config file, no ``deepspeed=`` argument). Under that environment, with
      ``ACCELERATE_DEEPSPEED_CONFIG_FILE`` pointed at ``ds_config`` (as inline JSON, which accelerate's
      HfDeepSpeedConfig reads like a file), GRPOConfig's ``__post_init__`` builds accelerate's ``DeepSpeedPlugin()``
      from the ACCELERATE_* variables (``_deepspeed_config_checks``, ZeRO stage/offload, gradient clipping) and calls
      ``set_mixed_precision(args.mixed_precision)`` (AcceleratorState.__init__ repeats that call with the Trainer's
      ``mixed_precision=args.mixed_precision``; so does this); then transformers' ``propagate_args_to_deepspeed`` (what
      ``Trainer.create_accelerator_and_postprocess`` calls, here with a stand-in accelerator carrying that plugin)
      runs ``trainer_config_process``; then ``trainer_config_finalize``. The result also carries accelerate's
      additions (``steps_per_print: inf``, an explicit ``fp16: {"enabled": false}``).

    Returns the filled config dict (``hf_ds_config.config``), a copy. Global state the libraries set on the way
    (transformers' HfDeepSpeedConfig weakref, accelerate's PartialState) is cleared before returning.
    """
    from accelerate.state import AcceleratorState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    kwargs = dict(grpo_kwargs)
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=hidden_size))
    try:
        filled = _fill(ds_config, kwargs, world_size, model, num_training_steps, launch_env)
    finally:
        # Leave no global state behind: HfDeepSpeedConfig registers a module-level weakref that makes
        # transformers' is_deepspeed_zero3_enabled() answer for every later from_pretrained in this process while the
        # object lives, and building TrainingArguments initialises accelerate's PartialState.
        unset_hf_deepspeed_config()
        AcceleratorState._reset_state(reset_partial_state=True)
    return filled


def _fill(ds_config, kwargs, world_size, model, num_training_steps, launch_env) -> dict[str, Any]:
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, propagate_args_to_deepspeed

    with _as_world(world_size):
        if launch_env is None:
            args = _grpo_config(kwargs)
            hf = HfTrainerDeepSpeedConfig(copy.deepcopy(dict(ds_config)))
            hf.trainer_config_process(args)
        else:
            launched = {
                **{k: v for k, v in launch_env.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")},
                "ACCELERATE_DEEPSPEED_CONFIG_FILE": json.dumps(dict(ds_config)),
            }
            if str(launched.get("ACCELERATE_USE_DEEPSPEED", "")).lower() != "true":
                raise ValueError("launch_env is not a DeepSpeed launch (ACCELERATE_USE_DEEPSPEED is not true)")
            with mock.patch.dict(os.environ, launched):
                args = _grpo_config(kwargs)
                plugin = args.deepspeed_plugin
                if plugin is None:
                    raise AssertionError("TrainingArguments built no DeepSpeedPlugin under ACCELERATE_USE_DEEPSPEED")
                # Trainer builds Accelerator(mixed_precision=args.mixed_precision,
                # deepspeed_plugin=args.deepspeed_plugin); AcceleratorState.__init__ then calls
                # plugin.set_mixed_precision(mixed_precision) (accelerate/state.py).
                plugin.set_mixed_precision(args.mixed_precision)
                accelerator = types.SimpleNamespace(state=types.SimpleNamespace(deepspeed_plugin=plugin))
                propagate_args_to_deepspeed(accelerator, args)
                hf = plugin.hf_ds_config
        hf.trainer_config_finalize(args, model, num_training_steps)
    return copy.deepcopy(hf.config)


def deepspeed_accepts(filled: Mapping[str, Any], world_size: int):
    """``deepspeed.runtime.config.DeepSpeedConfig(filled)`` as ``world_size`` data-parallel ranks would build it.

    DeepSpeedConfig takes its world size from the process group: ``self.global_rank = dist.get_rank()`` and, with no
    ``mpu``/``mesh_device`` (how accelerate's ``deepspeed.initialize`` builds it), ``self.world_size =
    dist.get_world_size()`` (``dist`` is ``deepspeed.comm``). Without an initialised group both raise and
    DeepSpeedConfig silently falls back to rank 0 of a world of 1 (``except (RuntimeError, AssertionError,
    AttributeError)``), which would judge every multi-process config wrong. So ``deepspeed.comm.get_rank`` -> 0 and
    ``deepspeed.comm.get_world_size`` -> ``world_size`` for the duration of the call; nothing else is substituted.
    Then DeepSpeed's own ``_configure_train_batch_size`` asserts ``train_batch_size == micro * accum *
    world_size`` and ``_do_sanity_check`` runs its error checks.

    Returns the DeepSpeedConfig; raises (AssertionError / ValueError / pydantic ValidationError) on a config DeepSpeed
    rejects. ``filled`` is not modified.
    """
    import deepspeed.runtime.config as ds_config

    with (
        mock.patch.object(ds_config.dist, "get_rank", return_value=0),
        mock.patch.object(ds_config.dist, "get_world_size", return_value=world_size),
    ):
        return ds_config.DeepSpeedConfig(copy.deepcopy(dict(filled)))

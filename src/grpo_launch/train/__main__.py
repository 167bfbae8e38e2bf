"""Training entry: ``python -m grpo_launch.train --recipe trainer_recipe.yaml``, run under ``accelerate launch``.

Reads the resolved recipe and the job's environment (:class:`~grpo_launch.train.environment.JobEnvironment`, read
once here and passed down), then trains with TRL's GRPOTrainer (here) or, for launch.mode async, AsyncGRPOTrainer
(:mod:`.async_entry`). The model, tokenizer (with the recipe's chat_template), datasets, rewards, resume decision and
completion marker are built by :mod:`.core` for both. (Not ``trl grpo``: that validates the layout once in the
launcher with world size 1.)

What is the sync entry's own: the model is loaded as TRL's own ``trl grpo`` script loads it: GRPOTrainer gets the
model path with ``model_init_kwargs`` (revision, trust_remote_code, attn_implementation, dtype, then the recipe's
own model_init_kwargs), the quantization config (load_in_4bit / load_in_8bit) and the PEFT config; a
``reward_model_name_or_path`` becomes the first reward; GRPOConfig applies reward_weights; the eval dataset when
eval_strategy is not "no". The one deliberate difference from ``trl grpo`` is planned, not made here: under DDP and
FSDP the planner writes ``dtype: float32`` (see grpo_launch.planning.trainer_values).
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import logging
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from grpo_launch.recipe.parse import yaml_load
from grpo_launch.rundir.trusted_files import open_nofollow
from grpo_launch.train import async_entry, console
from grpo_launch.train.callbacks import make_callbacks
from grpo_launch.train.core import build_inputs, config_kwargs, train_and_finish
from grpo_launch.train.data import split_values
from grpo_launch.train.environment import JobEnvironment
from grpo_launch.train.server_auth import guard_clients
from grpo_launch.train.server_restart import keep_server
from grpo_launch.train.startup import record_startup, started_at
from grpo_launch.train.tracking import tracking_defaults

_KEEP: list[Any] = []  # the stack-dump file stays open for faulthandler


def model_init_kwargs(config: Any, model_args: Any) -> dict[str, Any]:
    """GRPOConfig.model_init_kwargs as TRL's ``trl grpo`` script builds them (trl/scripts/grpo.py)."""
    kwargs: dict[str, Any] = dict(
        revision=model_args.model_revision,
        trust_remote_code=config.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    if config.model_init_kwargs is not None:
        kwargs.update(config.model_init_kwargs)
    return kwargs


class TiedHeadFilter(logging.Filter):
    """transformers' "There were missing keys in the checkpoint model loaded: ['lm_head.weight']" at every resume of a
    model whose LM head is its embedding (tie_word_embeddings): a checkpoint stores the tied weight once, and the
    head is tied again on load. Only that exact list is dropped; any other missing key is still said."""

    MESSAGE = "There were missing keys in the checkpoint model loaded: ['lm_head.weight']"

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.MESSAGE)


def prepare_process(job: JobEnvironment) -> None:
    """What every rank sets up before the recipe is read: warnings, loggers' directories, how often W&B writes its
    file, and the hang dump."""
    # TRL 1.16 reads model.is_gradient_checkpointing, which transformers 5 deprecated: a warning at every save that
    # no setting of the recipe can avoid. This one message only; every other warning stays.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)

    # W&B's file written often, so that a rank ended by a signal keeps its history (grpo_launch.train.tracking).
    tracking_defaults(os.environ)

    # grpo-launch's watchdog asks for every rank's stack when no step finishes in time (a hang): each rank writes it
    # to RUN_DIR/control/stacks/rank-R.txt (on stderr when grpo-launch did not start it).
    paths = job.paths
    if paths:
        # report_to's loggers write under the run directory unless told otherwise (TensorBoard, W&B).
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(paths.tensorboard))
        os.environ.setdefault("WANDB_DIR", str(paths.root))
        paths.stacks.mkdir(parents=True, exist_ok=True)
        _KEEP.append(open_nofollow(paths.rank_stack(job.rank), "w"))
        faulthandler.register(signal.SIGUSR1, file=_KEEP[-1], all_threads=True)
    else:
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def read_recipe(argv: list[str] | None) -> dict[str, Any]:
    """The resolved trainer recipe named on the command line."""
    ap = argparse.ArgumentParser(prog="python -m grpo_launch.train", description=__doc__)
    ap.add_argument("--recipe", required=True, help="resolved trainer recipe written by grpo-launch")
    args = ap.parse_args(argv)
    return yaml_load(Path(args.recipe).read_text())


def set_logger_defaults(script: dict[str, Any]) -> None:
    """The recipe's W&B settings, as defaults of the environment W&B reads (what is set there already wins)."""
    for key, env in (
        ("wandb_entity", "WANDB_ENTITY"),
        ("wandb_project", "WANDB_PROJECT"),
        ("wandb_run_group", "WANDB_RUN_GROUP"),
    ):
        if script.get(key):
            os.environ.setdefault(env, str(script[key]))


def build_trainer(config: Any, model_kwargs: dict[str, Any], script: dict[str, Any], callbacks: list[Any]) -> Any:
    """GRPOTrainer as ``trl grpo`` builds it, from the shared inputs (:func:`~grpo_launch.train.core.build_inputs`)."""
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    inputs = build_inputs(config, model_kwargs, script, with_eval=config.eval_strategy != "no")
    config.model_init_kwargs = model_init_kwargs(config, inputs.model_args)
    rewards = list(inputs.rewards)
    if script.get("reward_model_name_or_path"):
        rewards.insert(0, script["reward_model_name_or_path"])  # as trl grpo: GRPOTrainer loads the reward model
    return GRPOTrainer(
        model=inputs.path,
        reward_funcs=rewards,
        args=config,
        train_dataset=inputs.train,
        eval_dataset=inputs.eval,
        processing_class=inputs.tokenizer,
        quantization_config=get_quantization_config(inputs.model_args),
        peft_config=get_peft_config(inputs.model_args),
        callbacks=callbacks,
    )


def fit_console(trainer: Any, step_log: Any) -> None:
    """grpo-launch's step line in place of transformers' printed dicts and progress bar; the generation timed; the
    tied head's warning dropped."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for noisy in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(noisy)
    if hasattr(trainer, "_generate_and_score_completions"):
        trainer._generate_and_score_completions = step_log.timed(trainer._generate_and_score_completions)
    if getattr(getattr(trainer.model, "config", None), "tie_word_embeddings", False):
        logging.getLogger("transformers.trainer").addFilter(TiedHeadFilter())


def main(argv: list[str] | None = None, job: JobEnvironment | None = None) -> int:
    """Train as the recipe says. ``job``: the environment read once by the process's entry (read here if None)."""
    began = started_at(os.environ)
    job = job or JobEnvironment.from_environ(os.environ)
    prepare_process(job)
    values = read_recipe(argv)
    # Before any TRL client exists: the sync client calls the server in its constructor.
    guard_clients(values.get("vllm_server_base_url"), job.vllm_token, asynchronous=async_entry.is_async(values))
    if async_entry.is_async(values):  # launch.mode async: TRL's AsyncGRPOTrainer
        return async_entry.main(values, job)
    grpo_kwargs, model_kwargs, script = split_values(values)
    set_logger_defaults(script)

    from trl import GRPOConfig, GRPOTrainer  # noqa: F401  (the trainer's import is part of the start)

    imported = time.time()
    config = GRPOConfig(**config_kwargs(grpo_kwargs, GRPOConfig))
    rank, world = config.process_index, config.world_size
    print(
        f"[grpo-launch] trainer process {rank}/{world} world_size={world} device={config.device} "
        f"node_rank={job.node_rank} local_rank={job.local_rank} node={job.node} pid={os.getpid()}",
        flush=True,
    )
    is_main = rank == 0
    step_log, stop = make_callbacks(job, is_main)
    trainer = build_trainer(config, model_kwargs, script, [step_log, *([stop] if stop else [])])
    fit_console(trainer, step_log)
    record_startup(trainer, job.paths, is_main, (began, imported))
    # A lost vLLM server is replaced by the launcher: wait for it as long as it may take to start (TRL's own
    # vllm_server_timeout, which the plan sets to launch.vllm_health_timeout_s), and then some for the stop.
    keep_server(trainer, str(job.paths.root) if job.paths else None, 2 * float(config.vllm_server_timeout), print)
    acc = trainer.accelerator
    stage = acc.state.deepspeed_plugin.zero_stage if acc.state.deepspeed_plugin else None
    print(
        f"[grpo-launch] rank {rank}: distributed_type={acc.distributed_type.value} zero_stage={stage} "
        f"num_processes={acc.num_processes}",
        flush=True,
    )
    train_and_finish(trainer, stop, job)
    _close_process_group(trainer)
    return 0


def _close_process_group(trainer: Any) -> None:
    """Every rank waits for the others, then the process group closes before the interpreter exits. Left to
    interpreter shutdown, a rank that finishes first tears the group down under a peer still in its last
    collective, and the peer aborts ("terminate called without an active exception", SIGABRT) after a good run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        trainer.accelerator.wait_for_everyone()
        dist.destroy_process_group()


def _exit(code: int) -> None:
    """Exit after Python's own exit handlers (W&B, TensorBoard and logging flush there), skipping the C++ static
    destructors: a library thread still joinable in them aborts a finished rank ("terminate called without an
    active exception", SIGABRT), which torchrun reports as a failed run after a good one."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _entry() -> int:
    """Rank 0 on the console, the other ranks in their own log files (errors as one console line each)."""
    console.quiet_progress_bars()
    job = JobEnvironment.from_environ(os.environ)
    own = console.to_own_log(job)
    try:
        return main(job=job)
    except BaseException as exc:
        console.report_error(exc, own, job.rank)
        raise
    finally:
        console.flush_own_log()


if __name__ == "__main__":
    _exit(_entry())

"""Training entry: ``python -m grpo_launch.train --recipe trainer_recipe.yaml``, run under ``accelerate launch``.

Loads the tokenizer, dataset and rewards from the resolved recipe and runs TRL's GRPOTrainer; resumes from the
newest checkpoint in ``output_dir`` and saves the final model there. (Not ``trl grpo``: that validates the layout
once in the launcher with world size 1.)

The model is loaded as TRL's own ``trl grpo`` script loads it: GRPOTrainer gets the model path with
``model_init_kwargs`` (revision, trust_remote_code, attn_implementation, dtype, then the recipe's own
model_init_kwargs), the quantization config (load_in_4bit / load_in_8bit) and the PEFT config; a
``reward_model_name_or_path`` becomes the first reward. The one deliberate difference is planned, not made here:
under DDP and FSDP the planner writes ``dtype: float32`` (see grpo_launch.planning.trainer_values).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from grpo_launch.recipe.keys import OPEN_R1_REWARD_KEYS
from grpo_launch.recipe.parse import yaml_load
from grpo_launch.rundir.control import mark_stopped
from grpo_launch.rundir.layout import COMPLETE_MARKER, NO_RESUME, RESUME_ENV, RunPaths
from grpo_launch.train import async_entry, console
from grpo_launch.train.callbacks import make_callbacks
from grpo_launch.train.data import load_dataset_split, load_tokenizer, prepare_dataset, split_values
from grpo_launch.train.rewards import load_reward

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


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    import faulthandler
    import signal
    import warnings

    # TRL 1.16 reads model.is_gradient_checkpointing, which transformers 5 deprecated: a warning at every save that
    # no setting of the recipe can avoid. This one message only; every other warning stays.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)

    # grpo-launch's watchdog asks for every rank's stack when no step finishes in time (a hang): each rank writes it
    # to RUN_DIR/control/stacks/rank-R.txt (on stderr when grpo-launch did not start it).
    paths = RunPaths.from_environ(os.environ)
    if paths:
        # report_to's loggers write under the run directory unless told otherwise (TensorBoard, W&B).
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(paths.tensorboard))
        os.environ.setdefault("WANDB_DIR", str(paths.root))
        paths.stacks.mkdir(parents=True, exist_ok=True)
        _KEEP.append(open(paths.rank_stack(os.environ.get("RANK", "0")), "w"))  # noqa: SIM115
        faulthandler.register(signal.SIGUSR1, file=_KEEP[-1], all_threads=True)
    else:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    ap = argparse.ArgumentParser(prog="python -m grpo_launch.train", description=__doc__)
    ap.add_argument("--recipe", required=True, help="resolved trainer recipe written by grpo-launch")
    args = ap.parse_args(argv)
    values = yaml_load(Path(args.recipe).read_text())
    if async_entry.is_async(values):  # launch.mode async: TRL's AsyncGRPOTrainer
        return async_entry.main(values, paths)
    grpo_kwargs, model_kwargs, script = split_values(values)
    for key, env in (
        ("wandb_entity", "WANDB_ENTITY"),
        ("wandb_project", "WANDB_PROJECT"),
        ("wandb_run_group", "WANDB_RUN_GROUP"),
    ):
        if script.get(key):
            os.environ.setdefault(env, str(script[key]))

    # transformers 5.2x renamed gradient_checkpointing to activation_checkpointing and warns on the old name, which
    # TRL 1.16's config sets by default: give the new name the value (the recipe's, else TRL's default, on). Earlier
    # transformers (5.17 has only the old name) keep it.
    import dataclasses

    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOConfig, GRPOTrainer, ModelConfig, get_peft_config, get_quantization_config

    renamed = "activation_checkpointing" in {f.name for f in dataclasses.fields(GRPOConfig)}
    if renamed and "activation_checkpointing" not in grpo_kwargs:
        grpo_kwargs["activation_checkpointing"] = grpo_kwargs.pop("gradient_checkpointing", True)
        if "gradient_checkpointing_kwargs" in grpo_kwargs:
            grpo_kwargs["activation_checkpointing_kwargs"] = grpo_kwargs.pop("gradient_checkpointing_kwargs")
    config = GRPOConfig(**grpo_kwargs)
    rank, world = config.process_index, config.world_size
    print(
        f"[grpo-launch] trainer process {rank}/{world} world_size={world} device={config.device} "
        f"node_rank={os.environ.get('GROUP_RANK', '0')} local_rank={os.environ.get('LOCAL_RANK', '0')} "
        f"node={os.environ.get('SLURMD_NODENAME') or os.uname().nodename} pid={os.getpid()}",
        flush=True,
    )
    is_main = rank == 0

    model_args = ModelConfig(**model_kwargs)
    path = model_args.model_name_or_path
    if not path:
        raise ValueError("the recipe has no model_name_or_path")
    tokenizer = load_tokenizer(path, model_args.model_revision, trust_remote_code=config.trust_remote_code)
    config.model_init_kwargs = model_init_kwargs(config, model_args)
    template_kwargs = config.chat_template_kwargs if isinstance(config.chat_template_kwargs, dict) else None

    dataset_name = script.get("dataset_name")
    if not dataset_name:
        raise ValueError("the recipe has no dataset_name")
    train_split = script.get("dataset_train_split", "train")
    train = load_dataset_split(
        dataset_name,
        script.get("dataset_config"),
        train_split,
        bool(script.get("dataset_streaming")),
        train_split=train_split,
    )
    train = prepare_dataset(train, script, tokenizer, is_main, template_kwargs)
    eval_ds = None
    if config.eval_strategy != "no":
        eval_ds = load_dataset_split(
            dataset_name,
            script.get("dataset_config"),
            script.get("dataset_test_split", "test"),
            train_split=train_split,
        )
        eval_ds = prepare_dataset(eval_ds, script, tokenizer, is_main, template_kwargs)

    reward_cfg = {k: script[k] for k in OPEN_R1_REWARD_KEYS if script.get(k) is not None}
    reward_cfg.update(max_completion_length=config.max_completion_length, **(script.get("reward_kwargs") or {}))
    names = script.get("reward_funcs") or ["accuracy", "format"]
    rewards: list[Any] = [load_reward(n, reward_cfg) for n in names]
    if script.get("reward_model_name_or_path"):
        rewards.insert(0, script["reward_model_name_or_path"])  # as trl grpo: GRPOTrainer loads the reward model

    step_log, stop = make_callbacks(paths, is_main)
    trainer = GRPOTrainer(
        model=path,
        reward_funcs=rewards,
        args=config,
        train_dataset=train,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
        callbacks=[step_log, *([stop] if stop else [])],
    )
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for noisy in (PrinterCallback, ProgressCallback):  # grpo-launch's step line replaces the dicts and the bar
        trainer.remove_callback(noisy)
    if hasattr(trainer, "_generate_and_score_completions"):
        trainer._generate_and_score_completions = step_log.timed(  # type: ignore[method-assign]
            trainer._generate_and_score_completions
        )
    if getattr(getattr(trainer.model, "config", None), "tie_word_embeddings", False):
        logging.getLogger("transformers.trainer").addFilter(TiedHeadFilter())
    from grpo_launch.train.startup import record_startup

    record_startup(trainer, paths, is_main, started)
    acc = trainer.accelerator
    stage = acc.state.deepspeed_plugin.zero_stage if acc.state.deepspeed_plugin else None
    print(
        f"[grpo-launch] rank {rank}: distributed_type={acc.distributed_type.value} zero_stage={stage} "
        f"num_processes={acc.num_processes}",
        flush=True,
    )
    output_dir = config.output_dir or "trainer_output"
    decided = os.environ.get(RESUME_ENV)  # grpo-launch decided (the same for every rank); else the Trainer's way
    if decided is not None:
        checkpoint = None if decided == NO_RESUME else decided
    else:
        checkpoint = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if is_main:
        print(f"[grpo-launch] {'resuming from ' + checkpoint if checkpoint else 'starting fresh'}", flush=True)
    trainer.train(resume_from_checkpoint=checkpoint)
    if stop is not None and stop.stopped_at is not None:
        if is_main and paths:
            mark_stopped(paths.root, stop.stopped_at)
            print(
                f"[grpo-launch] stopped on request after step {stop.stopped_at}; checkpoint saved in "
                f"{output_dir}/checkpoint-{stop.stopped_at}",
                flush=True,
            )
    else:
        trainer.save_model(output_dir)
        if is_main:
            record = {"step": trainer.state.global_step, "max_steps": trainer.state.max_steps, "time": time.time()}
            Path(output_dir, COMPLETE_MARKER).write_text(json.dumps(record) + "\n")
            print(f"[grpo-launch] training done; model saved to {output_dir}", flush=True)
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
    import atexit
    import logging

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _entry() -> int:
    """Rank 0 on the console, the other ranks in their own log files (errors as one console line each)."""
    console.quiet_progress_bars()
    paths = RunPaths.from_environ(os.environ)
    own = console.to_own_log(paths.logs) if paths else None
    try:
        return main()
    except BaseException as exc:
        console.report_error(exc, own)
        raise
    finally:
        console.flush_own_log()


if __name__ == "__main__":
    _exit(_entry())

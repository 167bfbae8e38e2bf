"""The training entry's core, shared by its two trainers: TRL's GRPOTrainer (``__main__``, the sync entry) and
AsyncGRPOTrainer (``async_entry``, launch.mode async). What both build from the resolved trainer recipe is built
here, once, so the two cannot drift:

* the config's checkpointing names (:func:`config_kwargs`), for either config class;
* the model's ModelConfig and path (:func:`build_inputs`);
* the tokenizer, left-padded, with the recipe's ``chat_template`` when it sets one (:func:`build_tokenizer`), as
  open-r1's grpo.py does (open_r1/utils/model_utils.py, ``get_tokenizer``: ``tokenizer.chat_template =
  training_args.chat_template``); TRL's ``trl grpo`` has no such key;
* the train dataset (and the eval dataset when the entry evaluates), prompts made and filtered by length;
* the reward functions by name (:func:`build_rewards`);
* the resume decision (:func:`resume_checkpoint`): grpo-launch's (GRPO_LAUNCH_RESUME, the same for every rank), else
  the Trainer's own way (the newest checkpoint in output_dir);
* the end (:func:`train_and_finish`): train, then either the stop-on-request answer or the final save and the
  completion marker (COMPLETE_MARKER: a finished run is not trained again).

What differs stays in each entry, said there: the trainer and config classes, the model_init_kwargs (the sync entry
builds TRL's ``trl grpo`` ones; AsyncGRPOTrainer sets attention and dtype itself), the eval dataset, quantization and
a reward model (sync only), reward_weights (GRPOConfig applies them; the async trainer sums its rewards, so they are
applied by :class:`~grpo_launch.train.rewards.Weighted`), and what each adds around its trainer.

Importing this module is cheap: transformers, trl and datasets are imported by the functions that need them.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from grpo_launch.recipe.keys import OPEN_R1_REWARD_KEYS
from grpo_launch.rundir.checkpoints import mark_complete
from grpo_launch.rundir.control import mark_stopped
from grpo_launch.rundir.layout import NO_RESUME
from grpo_launch.rundir.records import CompletionRecord
from grpo_launch.rundir.trusted_files import check_trusted
from grpo_launch.train.data import load_dataset_split, load_tokenizer, prepare_dataset
from grpo_launch.train.environment import JobEnvironment
from grpo_launch.train.rewards import load_reward


def config_kwargs(kwargs: dict[str, Any], config_class: type) -> dict[str, Any]:
    """The config's keyword arguments under the names ``config_class`` has.

    transformers 5.2x renamed gradient_checkpointing to activation_checkpointing and warns on the old name, which
    TRL 1.16's configs set by default: the new name gets the value (the recipe's, else TRL's default, on). Earlier
    transformers (5.17 has only the old name) keep it."""
    out = dict(kwargs)
    renamed = "activation_checkpointing" in {f.name for f in dataclasses.fields(config_class)}
    if renamed and "activation_checkpointing" not in out:
        out["activation_checkpointing"] = out.pop("gradient_checkpointing", True)
        if "gradient_checkpointing_kwargs" in out:
            out["activation_checkpointing_kwargs"] = out.pop("gradient_checkpointing_kwargs")
    return out


def build_tokenizer(path: str, revision: str | None, script: dict[str, Any], *, trust_remote_code: bool) -> Any:
    """The model's tokenizer (left-padded, :func:`~grpo_launch.train.data.load_tokenizer`), with the recipe's
    ``chat_template`` in place of its own when the recipe sets one: the template every prompt is rendered with, by
    the length filter here and by the trainer."""
    tokenizer = load_tokenizer(path, revision, trust_remote_code=trust_remote_code)
    if script.get("chat_template"):
        tokenizer.chat_template = script["chat_template"]
    return tokenizer


def build_datasets(script: dict[str, Any], tokenizer: Any, config: Any, *, with_eval: bool) -> tuple[Any, Any | None]:
    """(the train dataset, the eval dataset or None): loaded from the recipe's dataset_name and prepared
    (:func:`~grpo_launch.train.data.prepare_dataset`); the eval split only ``with_eval``."""
    dataset_name = script.get("dataset_name")
    if not dataset_name:
        raise ValueError("the recipe has no dataset_name")
    is_main = config.process_index == 0
    template_kwargs = config.chat_template_kwargs if isinstance(config.chat_template_kwargs, dict) else None
    split = script.get("dataset_train_split", "train")
    subset = script.get("dataset_config")
    train = load_dataset_split(dataset_name, subset, split, bool(script.get("dataset_streaming")), train_split=split)
    train = prepare_dataset(train, script, tokenizer, is_main, template_kwargs)
    if not with_eval:
        return train, None
    eval_ds = load_dataset_split(dataset_name, subset, script.get("dataset_test_split", "test"), train_split=split)
    return train, prepare_dataset(eval_ds, script, tokenizer, is_main, template_kwargs)


def build_rewards(script: dict[str, Any], max_completion_length: int | None) -> list[Any]:
    """The recipe's reward functions by name (default: accuracy and format), with open-r1's reward settings and the
    recipe's reward_kwargs; unweighted (each entry applies reward_weights its trainer's way)."""
    cfg = {k: script[k] for k in OPEN_R1_REWARD_KEYS if script.get(k) is not None}
    cfg.update(max_completion_length=max_completion_length, **(script.get("reward_kwargs") or {}))
    names = script.get("reward_funcs") or ["accuracy", "format"]
    return [load_reward(n, cfg) for n in ([names] if isinstance(names, str) else names)]


@dataclasses.dataclass
class TrainingInputs:
    """What both trainers are built from: the model (its ModelConfig and path; the trainer loads it), the tokenizer,
    the datasets and the rewards."""

    model_args: Any
    path: str
    tokenizer: Any
    train: Any
    eval: Any | None
    rewards: list[Any]


def build_inputs(
    config: Any, model_kwargs: dict[str, Any], script: dict[str, Any], *, with_eval: bool
) -> TrainingInputs:
    """The model, tokenizer (with the recipe's chat_template), datasets and rewards for ``config`` (GRPOConfig or
    AsyncGRPOConfig: the trust_remote_code, chat_template_kwargs, max_completion_length and process index read)."""
    from trl import ModelConfig

    model_args = ModelConfig(**model_kwargs)
    path = model_args.model_name_or_path
    if not path:
        raise ValueError("the recipe has no model_name_or_path")
    tokenizer = build_tokenizer(path, model_args.model_revision, script, trust_remote_code=config.trust_remote_code)
    train, eval_ds = build_datasets(script, tokenizer, config, with_eval=with_eval)
    rewards = build_rewards(script, config.max_completion_length)
    return TrainingInputs(model_args, path, tokenizer, train, eval_ds, rewards)


def resume_checkpoint(job: JobEnvironment, output_dir: str) -> str | None:
    """The checkpoint to resume from: grpo-launch's decision when it made one (the same for every rank, so no
    rank reads a checkpoint another is still writing), else the newest checkpoint in ``output_dir`` (the Trainer's
    ``get_last_checkpoint``), else None (a fresh start)."""
    if job.resume is not None:
        chosen = None if job.resume == NO_RESUME else job.resume
    else:
        from transformers.trainer_utils import get_last_checkpoint

        chosen = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if chosen is not None:  # on this host, just before it loads (DeepSpeed and the Trainer unpickle it)
        check_trusted(output_dir, "output_dir", flag="output_dir=DIR")
        check_trusted(chosen, "checkpoint", flag="--resume never, or output_dir=DIR")
    return chosen


def write_complete_marker(output_dir: str, step: int, max_steps: int) -> None:
    """output_dir/COMPLETE_MARKER: the run trained to its end (the launcher does not train it again), as the
    run directory's one writer of it writes the record."""
    mark_complete(output_dir, CompletionRecord(step=step, max_steps=max_steps, time=time.time()))


def train_and_finish(trainer: Any, stop: Any, job: JobEnvironment) -> None:
    """Train from :func:`resume_checkpoint`, then end as asked: stopped on request (``stop.stopped_at``: a
    checkpoint was saved; rank 0 answers in the run's control directory), or finished (the final model saved in
    output_dir by every rank, as saving is collective; rank 0 writes the completion marker)."""
    is_main = trainer.args.process_index == 0
    output_dir = trainer.args.output_dir or "trainer_output"
    checkpoint = resume_checkpoint(job, output_dir)
    if is_main:
        print(f"[grpo-launch] {'resuming from ' + checkpoint if checkpoint else 'starting fresh'}", flush=True)
    trainer.train(resume_from_checkpoint=checkpoint)
    if stop is not None and stop.stopped_at is not None:
        if is_main and job.paths:
            mark_stopped(job.paths.root, stop.stopped_at)
            print(
                f"[grpo-launch] stopped on request after step {stop.stopped_at}; checkpoint saved in "
                f"{output_dir}/checkpoint-{stop.stopped_at}",
                flush=True,
            )
        return
    trainer.save_model(output_dir)
    if is_main:
        write_complete_marker(output_dir, trainer.state.global_step, trainer.state.max_steps)
        print(f"[grpo-launch] training done; model saved to {output_dir}", flush=True)

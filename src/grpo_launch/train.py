"""Training entry: ``python -m grpo_launch.train --recipe trainer_recipe.yaml``, run under ``accelerate launch``.

Loads the model, tokenizer, dataset and rewards from the resolved recipe and runs TRL's GRPOTrainer; resumes from
the newest checkpoint in ``output_dir`` and saves the final model there. (Not ``trl grpo``: that validates the
layout once in the launcher with world size 1.)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_launch import trl_schema
from grpo_launch.control import CONTROL_DIR_ENV, STOP_REQUEST, STOPPED_MARKER
from grpo_launch.recipe import LOCAL_DATA_SUFFIXES, yaml_load

log = logging.getLogger("grpo_launch.train")


def split_values(values: Mapping[str, Any]) -> tuple[dict, dict, dict]:
    """(GRPOConfig kwargs, ModelConfig kwargs, script settings)."""
    grpo = {k: v for k, v in values.items() if k in trl_schema.GRPO_CONFIG}
    model = {k: v for k, v in values.items() if k in trl_schema.MODEL_CONFIG}
    script = {k: v for k, v in values.items() if k not in grpo and k not in model}
    return grpo, model, script


def load_tokenizer(path: str, revision: str | None = None):
    """The tokenizer, left-padded. A tokenizer saved as PreTrainedTokenizerFast is loaded as that class:
    AutoTokenizer would pick the model type's tokenizer (e.g. Qwen2Tokenizer) and a different pre-tokenizer."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cls: Any = AutoTokenizer
    cfg = Path(path) / "tokenizer_config.json"
    if cfg.is_file() and json.loads(cfg.read_text()).get("tokenizer_class") in (
        "PreTrainedTokenizerFast",
        "TokenizersBackend",
    ):
        cls = PreTrainedTokenizerFast
    tok = cls.from_pretrained(path, revision=revision)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_dataset_split(name: str, config: str | None, split: str, streaming: bool = False):
    from datasets import load_dataset, load_from_disk

    p = Path(name)
    if p.suffix in LOCAL_DATA_SUFFIXES:
        if not p.is_file():
            raise FileNotFoundError(f"dataset file {name!r} not found")
        return load_dataset(LOCAL_DATA_SUFFIXES[p.suffix], data_files=str(p), split="train")
    if p.is_dir() and (p / "dataset_info.json").is_file():
        ds = load_from_disk(str(p))
        return ds[split] if hasattr(ds, "keys") else ds
    return load_dataset(name, name=config, split=split, streaming=streaming)


def prepare_dataset(ds, script: Mapping[str, Any], tokenizer, is_main: bool):
    """Make TRL's ``prompt`` column (conversational, with the system prompt) and the ``answer`` column; drop
    prompts longer than max_prompt_length (TRL 0.26 removed that option; truncating chat prompts would cut off
    their template, so they are filtered and counted)."""
    column = script.get("dataset_prompt_column") or "prompt"
    if column not in ds.column_names:
        raise ValueError(f"dataset has no column {column!r} (columns: {ds.column_names}); set dataset_prompt_column")
    answer_col = script.get("dataset_answer_column")
    if answer_col and answer_col not in ds.column_names:
        raise ValueError(f"dataset has no answer column {answer_col!r} (columns: {ds.column_names})")
    system = script.get("system_prompt")

    def to_prompt(row: dict) -> dict:
        value = row[column]
        # A list is already conversational.
        messages = list(value) if isinstance(value, list) else [{"role": "user", "content": str(value)}]
        if system and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": system}, *messages]
        out: dict[str, Any] = {"prompt": messages}
        if answer_col:
            out["answer"] = str(row[answer_col])
        return out

    ds = ds.map(to_prompt, remove_columns=[column] if column != "prompt" else [])
    limit = script.get("max_prompt_length")
    if limit:
        before = len(ds)

        def short_enough(row: dict) -> bool:
            ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, Mapping) else ids
            return len(ids) <= limit

        ds = ds.filter(short_enough)
        dropped = before - len(ds)
        if is_main:
            print(f"[grpo-launch] max_prompt_length={limit}: dropped {dropped} of {before} prompts", flush=True)
        if len(ds) == 0:
            raise ValueError(f"every prompt is longer than max_prompt_length={limit}; raise it")
    return ds


def make_callbacks(control_dir: str | None, is_main: bool) -> tuple[Any, Any]:
    """(the step log, the stop-on-request callback or None). Imports transformers: call inside the trainer only."""
    import time

    import torch
    from transformers import TrainerCallback

    class StepLog(TrainerCallback):
        """One line per optimizer step on the main process: wall time, and how much of it went to generating
        (and scoring) completions, to compare with ``grpo-launch plan``'s estimate. Generation happens in the
        first micro-step of a generation round, so a step's split can include the round's whole generation."""

        def __init__(self) -> None:
            self.t0 = time.monotonic()
            self.generation_s = 0.0

        def timed(self, fn):
            def wrapper(*a, **kw):
                t = time.monotonic()
                try:
                    return fn(*a, **kw)
                finally:
                    self.generation_s += time.monotonic() - t

            return wrapper

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            dt = time.monotonic() - self.t0
            gen, self.generation_s = self.generation_s, 0.0
            if is_main:
                print(
                    f"[grpo-launch] step {state.global_step}/{state.max_steps} done in {dt:.2f} s "
                    f"(generation {gen:.2f} s, training {max(0.0, dt - gen):.2f} s)",
                    flush=True,
                )

    class StopOnRequest(TrainerCallback):
        """Save a checkpoint and stop at the end of the step in which ``CONTROL_DIR/stop-requested`` appears.

        Every rank must stop at the same step (saving is collective), so the flag is all-reduced each step.
        """

        def __init__(self, directory: str) -> None:
            self.request = Path(directory) / STOP_REQUEST
            self.stopped_at: int | None = None

        def on_step_end(self, args, state, control, **kwargs):
            flag = self.request.exists()
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                t = torch.tensor([1 if flag else 0], device=args.device)
                torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
                flag = bool(t.item())
            if flag and state.global_step < state.max_steps:
                control.should_save = True
                control.should_training_stop = True
                self.stopped_at = state.global_step
            return control

    return StepLog(), (StopOnRequest(control_dir) if control_dir else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpo_launch.train", description=__doc__)
    ap.add_argument("--recipe", required=True, help="resolved trainer recipe written by grpo-launch")
    args = ap.parse_args(argv)
    values = yaml_load(Path(args.recipe).read_text())
    grpo_kwargs, model_kwargs, script = split_values(values)
    for key, env in (
        ("wandb_entity", "WANDB_ENTITY"),
        ("wandb_project", "WANDB_PROJECT"),
        ("wandb_run_group", "WANDB_RUN_GROUP"),
    ):
        if script.get(key):
            os.environ.setdefault(env, str(script[key]))

    from transformers import AutoModelForCausalLM
    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOConfig, GRPOTrainer, ModelConfig, get_peft_config

    from grpo_launch.rewards import load_reward

    config = GRPOConfig(**grpo_kwargs)
    rank, world = config.process_index, config.world_size
    print(
        f"[grpo-launch] trainer process {rank}/{world} world_size={world} device={config.device} "
        f"node_rank={os.environ.get('GROUP_RANK', '0')} local_rank={os.environ.get('LOCAL_RANK', '0')} "
        f"node={os.environ.get('SLURMD_NODENAME') or os.environ.get('GRPO_LAUNCH_HOST') or os.uname().nodename} "
        f"pid={os.getpid()}",
        flush=True,
    )
    is_main = rank == 0

    model_args = ModelConfig(**model_kwargs)
    path = model_args.model_name_or_path
    if not path:
        raise ValueError("the recipe has no model_name_or_path")
    tokenizer = load_tokenizer(path, model_args.model_revision)
    dtype = model_args.dtype if model_args.dtype not in (None, "auto") else "auto"
    model = AutoModelForCausalLM.from_pretrained(
        path, revision=model_args.model_revision, dtype=dtype, attn_implementation=model_args.attn_implementation
    )

    dataset_name = script.get("dataset_name")
    if not dataset_name:
        raise ValueError("the recipe has no dataset_name")
    train = load_dataset_split(
        dataset_name,
        script.get("dataset_config"),
        script.get("dataset_train_split", "train"),
        bool(script.get("dataset_streaming")),
    )
    train = prepare_dataset(train, script, tokenizer, is_main)
    eval_ds = None
    if config.eval_strategy != "no":
        eval_ds = load_dataset_split(
            dataset_name, script.get("dataset_config"), script.get("dataset_test_split", "test")
        )
        eval_ds = prepare_dataset(eval_ds, script, tokenizer, is_main)

    reward_cfg = {"max_completion_length": config.max_completion_length, **(script.get("reward_kwargs") or {})}
    names = script.get("reward_funcs") or ["accuracy", "format"]
    rewards: list[Any] = [load_reward(n, reward_cfg) for n in names]

    control_dir = os.environ.get(CONTROL_DIR_ENV)
    step_log, stop = make_callbacks(control_dir, is_main)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=rewards,
        args=config,
        train_dataset=train,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[step_log, *([stop] if stop else [])],
    )
    if hasattr(trainer, "_generate_and_score_completions"):
        trainer._generate_and_score_completions = step_log.timed(  # type: ignore[method-assign]
            trainer._generate_and_score_completions
        )
    acc = trainer.accelerator
    stage = acc.state.deepspeed_plugin.zero_stage if acc.state.deepspeed_plugin else None
    print(
        f"[grpo-launch] rank {rank}: distributed_type={acc.distributed_type.value} zero_stage={stage} "
        f"num_processes={acc.num_processes}",
        flush=True,
    )
    output_dir = config.output_dir or "trainer_output"
    checkpoint = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if is_main:
        print(f"[grpo-launch] {'resuming from ' + checkpoint if checkpoint else 'starting fresh'}", flush=True)
    trainer.train(resume_from_checkpoint=checkpoint)
    if stop is not None and stop.stopped_at is not None:
        if is_main and control_dir:
            marker = Path(control_dir) / STOPPED_MARKER
            marker.write_text(f"{stop.stopped_at}\n")
            print(
                f"[grpo-launch] stopped on request after step {stop.stopped_at}; checkpoint saved in "
                f"{output_dir}/checkpoint-{stop.stopped_at}",
                flush=True,
            )
        return 0
    trainer.save_model(output_dir)
    if is_main:
        print(f"[grpo-launch] training done; model saved to {output_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The training entry's async half (launch.mode async): TRL 1.16's AsyncGRPOTrainer (trl/experimental/async_grpo)
built from the same recipe keys as the sync entry where they mean the same thing: model, tokenizer, dataset, system
prompt, max_prompt_length (longer prompts dropped: the rollout worker does not truncate, and vLLM answers a prompt
over max_model_len − max_tokens with HTTP 400), rewards (reward_weights applied by :class:`Weighted`, since the async
trainer sums its rewards) and PEFT; the planner wrote AsyncGRPOConfig's own values. Its signals reach metrics.jsonl
through the same callbacks (rundir/async_signals.py reads them).

Not from the recipe, by TRL's design: ``attn_implementation`` (the trainer forces its tree attention,
async_grpo_trainer.py:1083-1088) and ``dtype`` through model_init_kwargs (AsyncGRPOConfig.dtype is the planned one).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from grpo_launch.recipe import trl_schema
from grpo_launch.recipe.keys import OPEN_R1_REWARD_KEYS
from grpo_launch.rundir.control import mark_stopped
from grpo_launch.rundir.layout import COMPLETE_MARKER, NO_RESUME, RESUME_ENV, RunPaths
from grpo_launch.train.data import load_dataset_split, load_tokenizer, prepare_dataset
from grpo_launch.train.rewards import Weighted, load_reward

MARKER = "max_inflight_tasks"  # the planner writes it into every async trainer recipe, and only there


def is_async(values: dict[str, Any]) -> bool:
    return MARKER in values


def split_async_values(values: dict[str, Any]) -> tuple[dict, dict, dict]:
    """(AsyncGRPOConfig kwargs, ModelConfig kwargs, the entry's own settings)."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    fields = {f.name for f in dataclasses.fields(AsyncGRPOConfig)}
    config = {k: v for k, v in values.items() if k in fields}
    model = {k: v for k, v in values.items() if k in trl_schema.MODEL_CONFIG and k not in fields}
    script = {k: v for k, v in values.items() if k not in config and k not in model}
    return config, model, script


def build_async_trainer(values: dict[str, Any], callbacks: list[Any] | None = None) -> Any:
    """The AsyncGRPOTrainer the resolved trainer recipe describes (nothing connects to the server before train())."""
    from trl import ModelConfig, get_peft_config
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    kwargs, model_kwargs, script = split_async_values(values)
    renamed = {f.name for f in dataclasses.fields(AsyncGRPOConfig)} >= {"activation_checkpointing"}
    if renamed and "activation_checkpointing" not in kwargs:  # the newer transformers' name (as the sync entry)
        kwargs["activation_checkpointing"] = kwargs.pop("gradient_checkpointing", True)
        if "gradient_checkpointing_kwargs" in kwargs:
            kwargs["activation_checkpointing_kwargs"] = kwargs.pop("gradient_checkpointing_kwargs")
    config = AsyncGRPOConfig(**kwargs)
    model_args = ModelConfig(**model_kwargs)
    path = model_args.model_name_or_path
    if not path:
        raise ValueError("the recipe has no model_name_or_path")
    tokenizer = load_tokenizer(path, model_args.model_revision, trust_remote_code=config.trust_remote_code)
    if script.get("chat_template"):
        tokenizer.chat_template = script["chat_template"]
    init = dict(config.model_init_kwargs) if isinstance(config.model_init_kwargs, dict) else {}
    if model_args.model_revision and model_args.model_revision != "main":
        init.setdefault("revision", model_args.model_revision)
    config.model_init_kwargs = init or None
    template_kwargs = config.chat_template_kwargs if isinstance(config.chat_template_kwargs, dict) else None
    dataset_name = script.get("dataset_name")
    if not dataset_name:
        raise ValueError("the recipe has no dataset_name")
    split = script.get("dataset_train_split", "train")
    train = load_dataset_split(dataset_name, script.get("dataset_config"), split, bool(script.get("dataset_streaming")),
                               train_split=split)  # fmt: skip
    train = prepare_dataset(train, script, tokenizer, config.process_index == 0, template_kwargs)
    reward_cfg = {k: script[k] for k in OPEN_R1_REWARD_KEYS if script.get(k) is not None}
    reward_cfg.update(max_completion_length=config.max_completion_length, **(script.get("reward_kwargs") or {}))
    names = script.get("reward_funcs") or ["accuracy", "format"]
    rewards: list[Any] = [load_reward(n, reward_cfg) for n in ([names] if isinstance(names, str) else names)]
    weights = script.get("reward_weights")
    if weights:
        if len(weights) != len(rewards):
            raise ValueError(f"reward_weights has {len(weights)} weight(s) for {len(rewards)} reward function(s)")
        rewards = [r if float(w) == 1.0 else Weighted(r, w) for r, w in zip(rewards, weights, strict=True)]
    return AsyncGRPOTrainer(
        model=path,
        reward_funcs=rewards,
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )


def main(values: dict[str, Any], paths: RunPaths | None) -> int:
    """Train with AsyncGRPOTrainer: resume from the newest checkpoint, save the final model (as the sync entry)."""
    from transformers.trainer_utils import get_last_checkpoint

    from grpo_launch.train.callbacks import make_callbacks

    rank = int(os.environ.get("RANK", "0"))
    step_log, stop = make_callbacks(paths, rank == 0)
    trainer = build_async_trainer(values, [step_log, *([stop] if stop else [])])
    config = trainer.args
    print(f"[grpo-launch] async trainer process {config.process_index}/{config.world_size}: "
          f"max_inflight_tasks={config.max_inflight_tasks} max_staleness={config.max_staleness} "
          f"server {config.vllm_server_base_url}", flush=True)  # fmt: skip
    output_dir = config.output_dir or "trainer_output"
    decided = os.environ.get(RESUME_ENV)
    if decided is not None:
        checkpoint = None if decided == NO_RESUME else decided
    else:
        checkpoint = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    trainer.train(resume_from_checkpoint=checkpoint)
    if stop is not None and stop.stopped_at is not None:
        if rank == 0 and paths:
            mark_stopped(paths.root, stop.stopped_at)
    else:
        trainer.save_model(output_dir)
        if rank == 0:
            record = {"step": trainer.state.global_step, "max_steps": trainer.state.max_steps, "time": time.time()}
            Path(output_dir, COMPLETE_MARKER).write_text(json.dumps(record) + "\n")
    return 0

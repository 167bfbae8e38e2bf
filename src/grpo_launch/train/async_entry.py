"""The training entry's async half (launch.mode async): TRL 1.16's AsyncGRPOTrainer (trl/experimental/async_grpo)
built from the same recipe keys as the sync entry where they mean the same thing, by the same code
(:mod:`grpo_launch.train.core`): model, tokenizer with the recipe's chat_template, dataset, system prompt,
max_prompt_length (longer prompts dropped: the rollout worker does not truncate, and vLLM answers a prompt over
max_model_len − max_tokens with HTTP 400), rewards, the resume decision and the completion marker. Its signals reach
metrics.jsonl through the same callbacks (rundir/async_signals.py reads them).

What is the async entry's own, by TRL's design:

* the config is AsyncGRPOConfig (the planner wrote its own values: max_inflight_tasks, max_staleness, the server);
* ``attn_implementation`` and ``dtype`` are not passed through model_init_kwargs (the trainer forces its tree
  attention, async_grpo_trainer.py:1083-1088, and AsyncGRPOConfig.dtype is the planned one): only the recipe's own
  model_init_kwargs and a model_revision other than "main";
* reward_weights are applied by :class:`~grpo_launch.train.rewards.Weighted` (the async trainer sums its rewards);
* no eval dataset, no quantization config, no reward model (AsyncGRPOTrainer takes none of them);
* the sync entry's console fitting, start-up records and process-group close are not made here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from grpo_launch.recipe import trl_schema
from grpo_launch.train.callbacks import make_callbacks
from grpo_launch.train.core import build_inputs, config_kwargs, train_and_finish
from grpo_launch.train.environment import JobEnvironment
from grpo_launch.train.rewards import Weighted

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


def async_model_init_kwargs(config: Any, model_args: Any) -> dict[str, Any] | None:
    """AsyncGRPOConfig.model_init_kwargs: the recipe's own, and its model_revision when not the default."""
    init = dict(config.model_init_kwargs) if isinstance(config.model_init_kwargs, dict) else {}
    if model_args.model_revision and model_args.model_revision != "main":
        init.setdefault("revision", model_args.model_revision)
    return init or None


def weighted(rewards: list[Any], weights: list[float] | None) -> list[Any]:
    """The rewards scaled by the recipe's reward_weights (one per reward; a weight of 1 leaves its reward as is)."""
    if not weights:
        return rewards
    if len(weights) != len(rewards):
        raise ValueError(f"reward_weights has {len(weights)} weight(s) for {len(rewards)} reward function(s)")
    return [r if float(w) == 1.0 else Weighted(r, w) for r, w in zip(rewards, weights, strict=True)]


def build_async_trainer(values: dict[str, Any], callbacks: list[Any] | None = None) -> Any:
    """The AsyncGRPOTrainer the resolved trainer recipe describes (nothing connects to the server before train())."""
    from trl import get_peft_config
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    kwargs, model_kwargs, script = split_async_values(values)
    config = AsyncGRPOConfig(**config_kwargs(kwargs, AsyncGRPOConfig))
    inputs = build_inputs(config, model_kwargs, script, with_eval=False)
    config.model_init_kwargs = async_model_init_kwargs(config, inputs.model_args)
    return AsyncGRPOTrainer(
        model=inputs.path,
        reward_funcs=weighted(inputs.rewards, script.get("reward_weights")),
        args=config,
        train_dataset=inputs.train,
        processing_class=inputs.tokenizer,
        peft_config=get_peft_config(inputs.model_args),
        callbacks=callbacks,
    )


def main(values: dict[str, Any], job: JobEnvironment) -> int:
    """Train with AsyncGRPOTrainer: resume, train, save and mark the run complete as the sync entry does."""
    step_log, stop = make_callbacks(job, job.is_rank_zero)
    trainer = build_async_trainer(values, [step_log, *([stop] if stop else [])])
    config = trainer.args
    print(
        f"[grpo-launch] async trainer process {config.process_index}/{config.world_size}: "
        f"max_inflight_tasks={config.max_inflight_tasks} max_staleness={config.max_staleness} "
        f"server {config.vllm_server_base_url}",
        flush=True,
    )
    train_and_finish(trainer, stop, job)
    return 0

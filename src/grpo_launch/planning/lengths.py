"""Lengths: the longest prompt a run accepts and the vLLM max length, from the recipe (TRL's defaults where
unset). vLLM rejects a prompt longer than max_model_len − max_tokens (HTTP 400, which ends TRL's run), so every
vLLM run gets both bounds. Pure."""

from __future__ import annotations

from grpo_launch.errors import Fix, PlanError
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import DEFAULT_PROMPT_LEN, TRL_COMPLETION_LEN
from grpo_launch.recipe import Recipe


def completion_len(recipe: Recipe) -> int:
    return int(recipe.get("max_completion_length") or TRL_COMPLETION_LEN)


def explicit_max_model_len(recipe: Recipe) -> int | None:
    """A vLLM max length the recipe sets (launch.vllm_max_model_len or TRL's vllm_max_model_length)."""
    if recipe.launch.vllm_max_model_len:
        return recipe.launch.vllm_max_model_len
    if recipe.is_set("vllm_max_model_length"):
        return int(recipe.values["vllm_max_model_length"])
    return None


def _length_fixes(recipe: Recipe, prompt: int, explicit: int) -> list[Fix]:
    """What makes max_prompt_length + max_completion_length fit the vLLM max length: a longer one (through the key
    the recipe set it with: launch.vllm_max_model_len wins over TRL's key), or a shorter prompt or completion."""
    completion = completion_len(recipe)
    key = "launch.vllm_max_model_len" if recipe.launch.vllm_max_model_len else "vllm_max_model_length"
    fixes = [Fix(key, prompt + completion, "room for both", rank=0)]
    if explicit > completion:
        fixes.append(Fix("max_prompt_length", explicit - completion, "drop longer prompts", rank=1))
    if explicit > prompt:
        fixes.append(Fix("max_completion_length", explicit - prompt, "shorter completions", rank=1))
    return fixes


def prompt_bound(recipe: Recipe) -> int:
    """The longest prompt the run accepts, in tokens (the trainers drop longer ones before generating).

    vLLM rejects a prompt longer than max_model_len − max_tokens (HTTP 400, which ends TRL's run), and without a
    max_model_len it reserves the model's whole context. So a vLLM run always gets both bounds: the recipe's
    max_prompt_length; else what its vLLM max length leaves after the completion; else the default the estimates
    assume.
    """
    explicit = explicit_max_model_len(recipe)
    if recipe.get("max_prompt_length"):
        prompt = int(recipe.get("max_prompt_length"))
        if explicit is not None and prompt + completion_len(recipe) > explicit:
            raise PlanError(
                f"max_prompt_length={prompt} + max_completion_length={completion_len(recipe)} exceed the vLLM max "
                f"length {explicit}: vLLM would reject the longest prompts (HTTP 400), which ends TRL's run",
                fixes=_length_fixes(recipe, prompt, explicit),
            )
        return prompt
    if explicit is not None:
        left = explicit - completion_len(recipe)
        if left < 1:
            raise PlanError(
                f"a vLLM max length of {explicit} tokens leaves no room for a prompt before the "
                f"{completion_len(recipe)}-token completion",
                hint="Raise vllm_max_model_length (launch.vllm_max_model_len) or lower max_completion_length.",
            )
        return left
    return DEFAULT_PROMPT_LEN


def max_model_len(recipe: Recipe) -> int:
    return explicit_max_model_len(recipe) or prompt_bound(recipe) + completion_len(recipe)


def check_positions(recipe: Recipe, model: ModelShape | None) -> None:
    """vLLM refuses a --max-model-len beyond the model's max_position_embeddings (its ModelConfig raises, the server
    never starts): refuse the plan instead, with the lengths that fit."""
    if model is None or model.max_positions is None:
        return
    length, limit = max_model_len(recipe), model.max_positions
    if length <= limit:
        return
    completion = completion_len(recipe)
    fixes = []
    if limit - completion >= 1:
        fixes.append(Fix("max_prompt_length", limit - completion, "drop longer prompts", rank=0))
    if limit - prompt_bound(recipe) >= 1:
        fixes.append(Fix("max_completion_length", limit - prompt_bound(recipe), "shorter completions", rank=1))
    raise PlanError(
        f"the vLLM max length of {length} tokens (prompt {prompt_bound(recipe)} + completion {completion}) exceeds "
        f"{model.name}'s {limit} positions (max_position_embeddings): vLLM refuses to start with it",
        fixes=fixes,
        hint=None if fixes else "Use a model with a longer context, or shorter prompts and completions.",
    )

"""The training entry, ``python -m grpo_launch.train --recipe trainer_recipe.yaml``, run under ``accelerate launch``.

* ``__main__``: orchestration (read the recipe, build GRPOConfig/ModelConfig, train, save).
* ``data``: tokenizer and dataset loading, prompt preparation.
* ``callbacks``: the per-step log and the stop-on-request callback.
* ``rewards``: reward functions by name or import path.

Importing this package or ``grpo_launch.train.rewards`` is cheap (the planner checks reward names with it): only
the functions that need torch, transformers, trl or datasets import them, when called.
"""

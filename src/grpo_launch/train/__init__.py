"""The training entry, ``python -m grpo_launch.train --recipe trainer_recipe.yaml``, run under ``accelerate launch``.

* ``__main__``: the entry (read the recipe and the job's environment), the sync trainer (TRL's GRPOTrainer).
* ``async_entry``: the async trainer (launch.mode async: AsyncGRPOTrainer), its differences from the sync one.
* ``core``: what both trainers share: model, tokenizer with the recipe's chat_template, datasets, rewards, resume,
  the final save and completion marker.
* ``environment``: ``JobEnvironment``, what a rank reads from its environment (ranks, node, devices, resume), once.
* ``data``: tokenizer and dataset loading, prompt preparation.
* ``callbacks``: the per-step log and the stop-on-request callback.
* ``rewards``: reward functions by name or import path.

Importing this package or ``grpo_launch.train.rewards`` is cheap (the planner checks reward names with it): only
the functions that need torch, transformers, trl or datasets import them, when called.
"""

"""TRL 1.16's AsyncGRPOConfig and AsyncGRPOTrainer as the judge of a planned async trainer recipe.

Run with the interpreter of an environment that has TRL, vLLM and requests (the trainers' environment, as async
runs need: weight_transfer.py imports vLLM)::

    .venv-vllm/bin/python tests/async_trainer_oracle.py < cases.json > out.json

stdin: a JSON list of ``{"id", "values", "world_size", "model"}``: ``values`` the plan's trainer values,
``world_size`` its trainer processes, ``model`` a local model directory the trainer is built on (the tiny model:
the checks read its config and parameters, not its size).

For each case:

1. ``AsyncGRPOConfig(**kwargs)`` with ``world_size`` patched to the plan's processes (TRL's own ``__post_init__``
   checks), ``kwargs`` the values that are AsyncGRPOConfig fields; ``dropped`` lists the others (the training entry
   reads those itself);
2. ``AsyncGRPOTrainer(model, reward_funcs, args, train_dataset)``: the trainer's own argument checks
   (async_grpo_trainer.py:1048-1403: liger, layer types, attention sinks, PEFT, max_inflight_tasks), with its real
   VLLMClient, WeightTransferClient and AsyncRolloutWorker objects built (nothing connects before train()).

One fake, because it needs a GPU: ``get_peak_flops_per_device`` (async_grpo_trainer.py:1240) asks
``torch.cuda.get_device_name``, which a CPU build of torch cannot answer; it is replaced by ``None`` (MFU unknown).
The CPU flags (``use_cpu``, ``bf16: false``) and ``output_dir``/``report_to`` are set for this machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
import tempfile
import traceback
import warnings
from unittest import mock

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def reward(completions, **_):
    return [0.0] * len(completions)


def judge(case: dict) -> dict:
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    from trl.experimental.async_grpo import async_grpo_trainer as trainer_module

    fields = {f.name for f in dataclasses.fields(AsyncGRPOConfig)}
    values = case["values"]
    kwargs = {k: v for k, v in values.items() if k in fields}
    kwargs.update(output_dir=tempfile.mkdtemp(prefix="async-oracle-"), use_cpu=True, bf16=False, fp16=False,
                  report_to="none")  # fmt: skip
    out: dict = {"id": case["id"], "dropped": sorted(set(values) - fields), "config_error": None, "trainer_error": None}
    try:
        with (
            warnings.catch_warnings(),
            mock.patch.object(AsyncGRPOConfig, "world_size", new_callable=mock.PropertyMock,
                              return_value=case["world_size"]),
        ):  # fmt: skip
            warnings.simplefilter("ignore")
            args = AsyncGRPOConfig(**kwargs)
    except Exception as exc:
        out["config_error"] = f"{type(exc).__name__}: {exc}"
        return out
    out["accelerator_config"] = {"split_batches": args.accelerator_config.split_batches,
                                 "dispatch_batches": args.accelerator_config.dispatch_batches}  # fmt: skip
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": "2 + 2 ="}]] * 16})
    try:
        with mock.patch.object(trainer_module, "get_peak_flops_per_device", return_value=None):
            trainer = AsyncGRPOTrainer(model=case["model"], reward_funcs=reward, args=args, train_dataset=data)
    except Exception as exc:
        out["trainer_error"] = f"{type(exc).__name__}: {exc}"
        out["trace"] = traceback.format_exc()[-2000:]
        return out
    a = trainer.args
    out["trainer"] = {
        "max_inflight_tasks": a.max_inflight_tasks,
        "max_staleness": a.max_staleness,
        "token_budget": a.token_budget,
        "weight_sync_steps": a.weight_sync_steps,
        "queue_maxsize": a.queue_maxsize,
        "dtype": str(trainer.model.dtype).removeprefix("torch."),
        "rollout_worker": type(trainer.rollout_worker).__name__,
        "weight_transfer": type(trainer.weight_transfer).__name__,
        "worker_url": trainer.rollout_worker._loop_kwargs["vllm_server_url"],
        "worker_max_inflight_tasks": trainer.rollout_worker._loop_kwargs["max_inflight_tasks"],
        "worker_max_tokens": trainer.rollout_worker._loop_kwargs["max_tokens"],
    }
    # What AsyncRolloutWorker.start() checks first (async_rollout_worker.py:1209): everything the child gets pickles.
    try:
        pickle.dumps(trainer.rollout_worker._loop_kwargs)
        out["pickles"] = None
    except Exception as exc:
        out["pickles"] = f"{type(exc).__name__}: {exc}"
    return out


def main() -> None:
    cases = json.load(sys.stdin)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # TRL's and transformers' prints stay off the JSON
    results = [judge(c) for c in cases]
    sys.stdout = real_stdout
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()

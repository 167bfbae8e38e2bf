"""Model loading: the training entry must load the model exactly as TRL's own `trl grpo` script does for the same
resolved recipe. Both are run with `trl.GRPOTrainer` intercepted (nothing big is loaded): the model argument, the
model_init_kwargs (which TRL passes to from_pretrained), the quantization config, the PEFT config and the reward
model must be equal. The one planned difference (dtype float32 under DDP/FSDP) is in the resolved recipe both read,
and is a decision in plan.json (tests/test_gpu_conformance_defects.py)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import yaml

from ..helpers import ensure_tiny_assets

pytestmark = pytest.mark.conformance


class _Stop(Exception):
    pass


def _intercept(run) -> dict:
    captured: dict = {}

    def fake(*args, **kwargs):
        captured.update(kwargs)
        raise _Stop

    with mock.patch("trl.GRPOTrainer", fake), pytest.raises(_Stop):
        run()
    return captured


def _ours(recipe: Path) -> dict:
    from grpo_launch.train.__main__ import main

    return _intercept(lambda: main(["--recipe", str(recipe)]))


def _trl_script(values: dict) -> dict:
    """TRL's `trl grpo` main() on the same values, parsed by TRL's own parser (its dataset load is stubbed)."""
    from datasets import Dataset
    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig, TrlParser
    from trl.scripts.grpo import GRPOScriptArguments, main

    parser = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig))
    args = parser.parse_dict(values, allow_extra_keys=True)
    rows = Dataset.from_dict({"prompt": ["hi"]})
    with mock.patch("datasets.load_dataset", lambda *a, **k: {"train": rows, "test": rows}):
        return _intercept(lambda: main(*args))


def _summary(kwargs: dict) -> dict:
    q, p = kwargs.get("quantization_config"), kwargs.get("peft_config")
    rewards = kwargs["reward_funcs"]
    return {
        "model": kwargs["model"],
        "model_init_kwargs": kwargs["args"].model_init_kwargs,
        "quantization": q.to_dict() if q is not None else None,
        "peft": {k: v for k, v in p.to_dict().items() if k != "runtime_config"} if p is not None else None,
        "reward_model": rewards[0] if rewards and isinstance(rewards[0], str) else None,
    }


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"trust_remote_code": True, "attn_implementation": "eager", "model_revision": "v1"},
        {"model_init_kwargs": {"low_cpu_mem_usage": True, "use_cache": False}, "dtype": "bfloat16"},
        {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
        {"load_in_8bit": True},
        {"use_peft": True, "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ["q_proj", "v_proj"]},
        {"reward_model_name_or_path": "org/some-reward-model"},
    ],
    ids=["plain", "remote-code", "init-kwargs", "4bit", "8bit", "lora", "reward-model"],
)
def test_model_loads_as_trl_grpo_loads_it(tmp_path, extra):
    tiny = ensure_tiny_assets()
    values = {
        "model_name_or_path": str(tiny / "model"),
        "dataset_name": str(tiny / "data" / "train.jsonl"),
        "dataset_prompt_column": "prompt",
        "reward_funcs": ["format"],
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        **extra,
    }
    recipe = tmp_path / "trainer_recipe.yaml"
    recipe.write_text(yaml.safe_dump(values))
    ours, theirs = _summary(_ours(recipe)), _summary(_trl_script({**values, "reward_funcs": []}))
    assert ours == theirs
    assert ours["model"] == str(tiny / "model")

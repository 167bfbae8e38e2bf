"""The shipped recipes' settings train for real: a recipe that loads bfloat16 (as recipes/qwen1.5b.yaml and open-r1
do) at its small learning rate (3e-6) must still change the weights. Under DDP there is no fp32 master copy, so the
planner loads the weights in float32; the contrast run loads bfloat16 by hand and shows the updates rounding away,
so the first assertion could fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .helpers import ROOT, ensure_tiny_assets

pytestmark = pytest.mark.slow
RECIPE = str(ROOT / "recipes" / "tiny-cpu.yaml")
# Rewards that differ between completions (the tiny model's completions all score 0 on the built-in accuracy and
# format rewards, and GRPO's advantages, hence the gradients, are then zero).
VARIED = "def distinct_chars(prompts, completions, **kw):\n    return [float(len(set(str(c)))) for c in completions]\n"


def _overrides(tmp_path: Path) -> list[str]:
    tiny = ensure_tiny_assets()
    (tmp_path / "varied_reward.py").write_text(VARIED)
    return [
        f"model_name_or_path={tiny / 'model'}",
        f"dataset_name={tiny / 'data' / 'train.jsonl'}",
        "reward_funcs=[varied_reward:distinct_chars]",
        "dtype=bfloat16",
        "learning_rate=3.0e-06",
        "max_steps=3",
        "save_strategy=no",
    ]


def _changed_fraction(before: Path, after: Path) -> float:
    """Fraction of the 2-D weight entries that moved (biases start at 0, where even bf16 resolves tiny steps).
    The initial weights are cast to the saved dtype first: loading in bfloat16 rounds them, which is no update."""
    from safetensors.torch import load_file

    a, b = load_file(str(before)), load_file(str(after))
    moved = total = 0
    for name, w in a.items():
        if w.dim() == 2 and name in b:
            moved += int((w.to(b[name].dtype) != b[name]).sum())
            total += w.numel()
    return moved / total


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_bf16_recipe_updates_fp32_weights_and_bf16_weights_would_not(tmp_path):
    tiny = ensure_tiny_assets()
    run = tmp_path / "run"
    args = [sys.executable, "-m", "grpo_launch", RECIPE, *_overrides(tmp_path), "--run-dir", str(run)]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300, env=_env(tmp_path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert yaml.safe_load((run / "trainer_recipe.yaml").read_text())["dtype"] == "float32"
    fp32 = _changed_fraction(tiny / "model" / "model.safetensors", run / "output" / "model.safetensors")
    assert fp32 > 0.5, f"only {fp32:.1%} of the weights moved"

    # The contrast: the same trainer recipe with the weights loaded in bfloat16, started by hand.
    recipe = yaml.safe_load((run / "trainer_recipe.yaml").read_text())
    recipe.update(dtype="bfloat16", output_dir=str(tmp_path / "bf16"))
    (run / "trainer_recipe.yaml").write_text(yaml.safe_dump(recipe))
    command = json.loads((run / "plan.json").read_text())["train"]["commands"][0]
    done = subprocess.run(
        command["argv"], capture_output=True, text=True, cwd=ROOT, timeout=300, env={**_env(tmp_path), **command["env"]}
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    bf16 = _changed_fraction(tiny / "model" / "model.safetensors", tmp_path / "bf16" / "model.safetensors")
    assert bf16 < 0.1 < fp32, f"bf16 weights moved {bf16:.1%}, fp32 {fp32:.1%}"


@pytest.mark.extended
def test_lora_run_trains_an_adapter(tmp_path):
    """use_peft: true (the planner's LoRA memory fix) runs: peft is in the train extra, TRL wraps the model with the
    recipe's LoRA settings, and the saved adapter's B matrices (initialised to zero) have moved."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    lora = ["use_peft=true", "lora_r=4", "lora_alpha=8", "lora_target_modules=[q_proj,v_proj]", "learning_rate=1e-3"]
    args = [sys.executable, "-m", "grpo_launch", RECIPE, *_overrides(tmp_path), *lora, "--run-dir", str(run)]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300, env=_env(tmp_path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    adapter = load_file(str(run / "output" / "adapter_model.safetensors"))
    b = [w for name, w in adapter.items() if "lora_B" in name]
    assert b and all(float(w.abs().max()) > 0 for w in b)
    assert json.loads((run / "output" / "adapter_config.json").read_text())["r"] == 4

"""A mixture-of-experts model trains for real: the tiny Qwen3-MoE (scripts/make_tiny_assets.py: 4 experts, top-2,
every layer sparse) runs GRPO through `grpo-launch` on 2 CPU processes with DeepSpeed ZeRO-3 (gloo). Every expert's
weights and the routers move (transformers 5 trains the experts fused, and saves them per expert as the published
checkpoints are), and TRL logs the router's load-balancing loss. (vLLM's CPU build serving the same model:
tests/test_vllm_server.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .helpers import ROOT, ensure_tiny_assets

pytestmark = pytest.mark.slow
VARIED = "def distinct_chars(prompts, completions, **kw):\n    return [float(len(set(str(c)))) for c in completions]\n"


@pytest.mark.extended
def test_tiny_moe_trains_with_zero3(tmp_path):
    from safetensors.torch import load_file

    tiny = ensure_tiny_assets()
    (tmp_path / "varied_reward.py").write_text(VARIED)
    run = tmp_path / "run"
    args = [sys.executable, "-m", "grpo_launch", str(ROOT / "recipes" / "tiny-cpu.yaml"),
            f"model_name_or_path={tiny / 'moe-model'}", f"dataset_name={tiny / 'data' / 'train.jsonl'}",
            "reward_funcs=[varied_reward:distinct_chars]", "launch.backend=zero3", "max_steps=3",
            "save_strategy=no", "--run-dir", str(run)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    every = out + "".join(p.read_text() for p in (run / "logs").glob("train-rank*.log"))  # ranks > 0 log to files
    assert every.count("distributed_type=DEEPSPEED zero_stage=3 num_processes=2") == 2
    plan = json.loads((run / "plan.json").read_text())
    assert plan["model"]["experts"] == 4 and plan["model"]["experts_per_token"] == 2
    logged = [json.loads(x).get("log") or {} for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("aux_loss" in g for g in logged)  # the router's load-balancing loss (output_router_logits) is logged
    before = load_file(str(tiny / "moe-model" / "model.safetensors"))
    after = load_file(str(run / "output" / "model.safetensors"))
    experts = [n for n in before if ".mlp.experts." in n]  # saved per expert, as the published checkpoints are
    assert len(experts) == 2 * 4 * 3, experts
    for name in experts:
        moved = (before[name].to(after[name].dtype) != after[name]).float().mean().item()
        assert moved > 0.5, f"{name}: {moved:.0%} of the entries moved"
    router = [n for n in before if n.endswith("mlp.gate.weight")]
    assert router and all(not (before[n] == after[n]).all() for n in router)
